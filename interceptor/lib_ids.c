/* Handles of library objects that the shim names itself (spec `ids: shim`,
 * docs/libraries.md "Asynchronous creates"). PyTorch creates and destroys a
 * cuBLASLt matmul descriptor, four layouts and a preference around every
 * matmul; if proxyd had to answer each create with the new handle, each
 * would cost a round trip. Instead the shim picks the handle, sends the
 * create with it asynchronously, and proxyd registers the real object under
 * that handle.
 *
 * A handle is (kind << 32) | id as proxyd's own (proxyd/core/protocol.py), with
 * bit 31 of the id set so that it never meets an id proxyd hands out (those
 * count up from 1). Ids of destroyed objects are reused (LIFO), so a program
 * that creates millions of descriptors keeps a handful of ids and never runs
 * out; reuse is safe because ops reach proxyd in order, so the destroy of an
 * id is executed before the create that reuses it.
 *
 * Locking: gp_lock (callers of the generated bodies hold it already; it is
 * recursive). Process ownership: the counters live in the app process; a
 * whole-process restore brings them back with it, and a GPU-only restore
 * rebuilds the objects under the same handles, so no id is ever live twice. */
#include <stdlib.h>

#include "gp_lib.h"

#define SHIM_ID_BIT 0x80000000u

static uint32_t next_id = 1;
static uint32_t *free_ids;
static size_t nfree, cap;

uint64_t gp_lib_new_handle(uint32_t kind)
{
    uint32_t id;
    gp_lock();
    if (nfree)
        id = free_ids[--nfree];
    else
        id = SHIM_ID_BIT | next_id++;
    gp_unlock();
    return ((uint64_t)kind << 32) | id;
}

int gp_lib_is_shim_handle(const void *h)
{
    return ((uint64_t)(uintptr_t)h & SHIM_ID_BIT) != 0 && ((uint64_t)(uintptr_t)h >> 32) != 0;
}

void gp_lib_free_handle(const void *h)
{
    if (!gp_lib_is_shim_handle(h))
        return;
    gp_lock();
    if (nfree == cap) {
        size_t ncap = cap ? 2 * cap : 64;
        uint32_t *n = realloc(free_ids, ncap * sizeof *n);
        if (!n) {               /* the id is simply not reused */
            gp_unlock();
            return;
        }
        free_ids = n;
        cap = ncap;
    }
    free_ids[nfree++] = (uint32_t)(uintptr_t)h;
    gp_unlock();
}
