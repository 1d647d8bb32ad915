"""The worker loop's adaptive spin (server.SpinBudget): never above the
configured bound, never below the floor, shrinking while spins catch
nothing and growing back with requests. No timing."""
from gpuproxy.proxyd.worker.server import SpinBudget


def test_spin_budget_stays_within_bounds_and_adapts():
    b = SpinBudget(200e-6)
    assert b.hit() == 200e-6                       # starts at the bound
    for _ in range(20):
        b.miss()
    assert b.cur == SpinBudget.FLOOR_S             # halved down to the floor, not below
    seen = [b.hit() for _ in range(10)]
    assert seen[0] == 2 * SpinBudget.FLOOR_S       # each request doubles it back
    assert max(seen) == 200e-6 and seen[-1] == 200e-6
    assert all(x <= 200e-6 for x in seen)


def test_spin_budget_below_the_floor_keeps_its_bound():
    b = SpinBudget(5e-6)                           # --spin-us 5
    b.miss()
    assert b.cur == 5e-6
    assert b.hit() == 5e-6
    z = SpinBudget(0.0)                            # --spin-us 0: never spins
    z.miss()
    assert z.hit() == 0.0
