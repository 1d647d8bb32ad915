"""The consistent cut and NCCL collectives captured into CUDA graphs
(proxyd/families/nccl_cut.py, "Graph launches"): the hold counts a
cuGraphLaunch as the collectives its executable graph runs (its enabled
captured ones, and those of graphs it launches in turn), a launch of the
driver's executable graph counts them on their communicators, and an
executable graph instantiated for device launch that holds collectives
refuses the cut. Focused on the worker's bookkeeping, with the objects as
graphs.py and graph_libcapture.py make them; the job end to end on the
emulated backend is tests/test_nccl_cut.py -k captured."""
from __future__ import annotations

from gpuproxy.proxyd._generated import FUNCTIONS
from gpuproxy.proxyd.core import protocol as P
from gpuproxy.proxyd.core.session import Obj
from gpuproxy.proxyd.families import nccl_cut
from gpuproxy.proxyd.families.graph_libcapture import LibCapture
from gpuproxy.proxyd.families.nccl import Comm

FID = {fn.name: fid for fid, fn in FUNCTIONS.items()}
WORLD = P.make_handle(P.K_NCCL_COMM, 0x80000001)
SUB = P.make_handle(P.K_NCCL_COMM, 0x80000002)


class _Sess:
    def __init__(self):
        self.objects, self.queued, self.nccl_comms = {}, [], {}
        for h, ident in ((WORLD, "w" * 32), (SUB, "s" * 32)):
            c = self.nccl_comms[h] = Comm(h, 2, 0, 0, True)
            c.ident, c.busy, c.code, c.seq = ident, False, 0, 5

    def of_kind(self, kind):
        return [o for (k, _), o in sorted(self.objects.items()) if k == kind]

    def add_exec(self, ident: int, nodes: list, **info) -> int:
        o = self.objects[(P.K_GRAPH_EXEC, ident)] = Obj(P.K_GRAPH_EXEC, ident, None, 0,
                                                        {"nodes": nodes, "index": {}, **info})
        return o.handle


def _captured(comm: int) -> tuple:
    """A node as graph_libcapture.capture leaves an all-reduce on comm."""
    fid = FID["ncclAllReduce"]
    args = [0x1000, 0x1000, 64, 7, 0, comm, 0]
    return (fid, 0, LibCapture(None, fid, 0, args, 0, []))


def _launch(exec_handle: int) -> list:
    return [FID["cuGraphLaunch"], 0, exec_handle, 0]


def test_a_graph_launch_is_held_like_the_collectives_it_captured():
    s = _Sess()
    e = s.add_exec(1, [(FID["cuMemsetD32_v2"], 0, [0x1000, 1, 4]), _captured(WORLD)])
    assert nccl_cut.graph_collectives(s, e) == [("ncclAllReduce", WORLD)]
    h = nccl_cut.Hold(s)                       # targets: the current seq, 5
    assert h(s, [_launch(e)]) is True and h.waiting_on == "w" * 32
    h.targets["w" * 32] = 6                    # one more collective allowed: the launch runs
    assert h(s, [_launch(e)]) is False
    # a message with the launch and a direct collective needs both
    direct = [FID["ncclAllReduce"], 0, 0x1000, 0x1000, 64, 7, 0, WORLD, 0]
    assert h(s, [_launch(e), direct]) is True


def test_graphs_launched_from_graphs_and_disabled_nodes():
    s = _Sess()
    inner = s.add_exec(1, [_captured(WORLD), _captured(SUB)])
    # a captured cuGraphLaunch is a node (fid, ctxh, args) like any captured call (graphs.py)
    outer = s.add_exec(2, [_captured(WORLD), (FID["cuGraphLaunch"], 0, [inner, 0])])
    outer_o = s.objects[(P.K_GRAPH_EXEC, 2)]
    assert nccl_cut.graph_collectives(s, outer) == [("ncclAllReduce", WORLD), ("ncclAllReduce", WORLD),
                                                    ("ncclAllReduce", SUB)]
    h = nccl_cut.Hold(s)
    h.targets["w" * 32] = 7
    assert h(s, [_launch(outer)]) is True and h.waiting_on == "s" * 32      # the sub's target is 5
    h.targets["s" * 32] = 6
    assert h(s, [_launch(outer)]) is False
    # a node disabled with cuGraphNodeSetEnabled does not run: not counted
    outer_o.info["disabled"], outer_o.info["index"] = [9], {9: [1]}
    assert nccl_cut.graph_collectives(s, outer) == [("ncclAllReduce", WORLD)]
    # an unknown executable graph runs nothing (its launch fails as usual)
    assert nccl_cut.graph_collectives(s, P.make_handle(P.K_GRAPH_EXEC, 99)) == []


def test_a_launch_of_the_drivers_graph_counts_on_the_communicator():
    s = _Sess()
    fid, _c, lc = _captured(SUB)
    nccl_cut.launched(s, fid, lc.args)
    nccl_cut.launched(s, fid, lc.args)
    assert s.nccl_comms[SUB].seq == 7 and s.nccl_comms[WORLD].seq == 5
    assert nccl_cut.needs_communicator(fid) and not nccl_cut.needs_communicator(FID["cuMemsetD32_v2"])


def test_a_device_launched_graph_with_collectives_refuses_the_cut():
    s = _Sess()
    s.add_exec(1, [_captured(WORLD)], flags=nccl_cut.CUDA_GRAPH_INSTANTIATE_FLAG_DEVICE_LAUNCH)
    s.add_exec(2, [(FID["cuMemsetD32_v2"], 0, [0x1000, 1, 4])],
               flags=nccl_cut.CUDA_GRAPH_INSTANTIATE_FLAG_DEVICE_LAUNCH)
    why = nccl_cut.uncountable(s)
    assert len(why) == 1 and "executable graph 1" in why[0] and "device launch" in why[0], why
    assert "ncclAllReduce" in why[0], why
    del s.objects[(P.K_GRAPH_EXEC, 1)]
    assert nccl_cut.uncountable(s) == []
