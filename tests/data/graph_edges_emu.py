"""Emulated kernel of tests/test_graph_edges.py: gp_edge_step(int *p,
unsigned n, int a) makes p[i] = p[i] * 10 + a, so the order in which two
such kernels run shows in the result."""
import numpy as np

from gpuproxy.emu import kernel


@kernel("gp_edge_step")
def gp_edge_step(k):
    n = k.param(1, "I")
    a = k.param(2, "i")
    m = min(n, k.grid[0] * k.block[0])
    if m <= 0:
        return
    data = k.array(k.param(0, "P"), m, "i4")
    data[:] = (data.astype(np.int64) * 10 + a).astype(np.int32)
