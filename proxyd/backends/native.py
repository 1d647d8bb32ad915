"""proxyd's native helper library (proxyd/native/gpxd.c, built at install
time as libgpxd.so next to this module), loaded with cffi in ABI mode.

Used only by the cuda backend: runs of kernel launches in a message execute
in C (dispatch.Dispatcher.run_ops), and a worker's hot messages are served
by the C loop (native_serve.py). Absent library: everything stays in Python.
"""
from __future__ import annotations

import os

from cffi import FFI

CDEF = """
int gpx_init(const char *libcuda);
void gpx_add_launch_fid(uint32_t fid);
void gpx_note_current(uintptr_t ctx);
uintptr_t gpx_current(void);
int gpx_set(int slot, int kind, uint32_t id, uintptr_t value);
void gpx_clear_slot(int slot);
long gpx_ops_start(const uint8_t *buf, size_t len, uint32_t *nops);
long gpx_skip(const uint8_t *buf, size_t len, size_t off);
int gpx_run_launches(int slot, const uint8_t *buf, size_t len, size_t *off, int max_ops, int *err, int *err_index);
typedef struct gpx_serve_state {
    uint8_t *chan; int slot; int capture; uint64_t spin_ns; uint64_t max_ns;
    uint64_t taken; uint64_t last_seq; int may_print;
    uint64_t calls; uint64_t served; int reply_state;
    const uint8_t *msg; size_t msg_len;
    int done_ops; int fail_code; int fail_setctx;
    uint32_t nrecorded; uint64_t recorded[64];
    int code; const uint8_t *outs; size_t outs_len; const uint8_t *printed; size_t printed_len;
} gpx_serve_state;
int gpx_serve_ready(void);
size_t gpx_serve_state_size(void);
int gpx_add_fid_class(uint32_t fid, int cls);
void gpx_range_clear(int slot);
void gpx_range_add(int slot, uint64_t lo, uint64_t hi);
void gpx_seg_add(int slot, uint32_t seg, uint64_t base, uint64_t len);
void gpx_out_init(int fd, const uint8_t *pending, size_t n);
void gpx_out_drain(void);
size_t gpx_out_take(const uint8_t **p);
int gpx_serve(gpx_serve_state *st);
size_t gpx_last_reply(const uint8_t **p, uint64_t *seq);
"""

LIB = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "libgpxd.so")   # gpuproxy/proxyd/ (autogen/build.py)


class Native:
    def __init__(self, libcuda: str, launch_fids):
        self.ffi = FFI()
        self.ffi.cdef(CDEF)
        self.lib = self.ffi.dlopen(LIB)
        if self.lib.gpx_init(libcuda.encode()) != 0:
            raise OSError(f"libgpxd cannot resolve the driver in {libcuda}")
        for fid in launch_fids:
            self.lib.gpx_add_launch_fid(fid)
        self._off = self.ffi.new("size_t *")
        self._n = self.ffi.new("uint32_t *")
        self._err = self.ffi.new("int *")
        self._erri = self.ffi.new("int *")

    def observer(self, slot: int):
        lib = self.lib

        def obs(kind, ident, real):
            lib.gpx_set(slot, kind, ident, int(real) if isinstance(real, int) else 0)
        return obs

    def clear(self, slot: int):
        self.lib.gpx_clear_slot(slot)

    def ops_start(self, buf) -> tuple[int, int]:
        off = self.lib.gpx_ops_start(self.ffi.from_buffer(buf), len(buf), self._n)
        return off, self._n[0]

    def skip(self, buf, off: int) -> int:
        return self.lib.gpx_skip(self.ffi.from_buffer(buf), len(buf), off)

    def run_launches(self, slot: int, buf, off: int, max_ops: int) -> tuple[int, int, int, int]:
        """-> (ops done, new offset, CUresult of a failed launch or 0, its index)"""
        self._off[0] = off
        n = self.lib.gpx_run_launches(slot, self.ffi.from_buffer(buf), len(buf), self._off, max_ops,
                                      self._err, self._erri)
        return n, self._off[0], self._err[0], self._erri[0]


def load(libcuda: str, launch_fids) -> Native | None:
    if not os.path.exists(LIB) or os.environ.get("GPUPROXY_NATIVE", "1") == "0":
        return None
    try:
        return Native(libcuda, launch_fids)
    except OSError:
        return None
