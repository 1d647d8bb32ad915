"""Emulated kernels of globals_table_kernels.cu (loaded by globals_table.cu
with cuModuleLoadData; extern "C" names)."""
from gpuproxy.emu import kernel

# the variables' names in declaration order: g00..g07, g10..g17, ..., g170..g177
NAMES = [f"g{p}{d}" for p in ("0", "1", "2", "3", "4", "5", "6", "7",
                               "10", "11", "12", "13", "14", "15", "16", "17") for d in range(8)]


@kernel("gt_publish")
def gt_publish(k):
    # (unsigned long long *table, int base): table[base + j] = &var j
    table, base = k.param(0, "P"), k.param(1, "i")
    t = k.array(table + 8 * base, len(NAMES), "u8")
    for j, name in enumerate(NAMES[:min(len(NAMES), k.block[0])]):
        t[j] = k.global_address(name)


@kernel("gt_bump")
def gt_bump(k):
    add = k.param(0, "i")
    for name in NAMES[:min(len(NAMES), k.block[0])]:
        k.global_array(name, 1, "i4")[0] += add


@kernel("gt_gather")
def gt_gather(k):
    # (const unsigned long long *table, int n, long long *out): reads through the pointers
    table, n, out = k.param(0, "P"), k.param(1, "i"), k.param(2, "P")
    ptrs = k.array(table, n, "u8")
    k.array(out, 1, "i8")[0] = sum(int(k.array(int(p), 1, "i4")[0]) for p in ptrs)
