/* Memory pool attributes (cuMemPoolSetAttribute / cuMemPoolGetAttribute):
 * the value's size depends on the attribute (cuda.h, CUmemPool_attribute:
 * the reuse policies are int, the threshold and the memory figures
 * cuuint64_t), which the generic stubs cannot know. Everything else of the
 * stream-ordered allocator is generic on the shim's side; proxyd keeps the
 * pools (proxyd/families/mempool.py).
 *
 * Locking: GP_ENTER/GP_LEAVE take gp_lock around each call. */
#include <string.h>

#include "gp_gen.h"
#include "gp_shim.h"


static size_t attr_size(CUmemPool_attribute attr)
{
    switch (attr) {
    case CU_MEMPOOL_ATTR_REUSE_FOLLOW_EVENT_DEPENDENCIES:
    case CU_MEMPOOL_ATTR_REUSE_ALLOW_OPPORTUNISTIC:
    case CU_MEMPOOL_ATTR_REUSE_ALLOW_INTERNAL_DEPENDENCIES:
        return sizeof(int);
    case CU_MEMPOOL_ATTR_RELEASE_THRESHOLD:
    case CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT:
    case CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH:
    case CU_MEMPOOL_ATTR_USED_MEM_CURRENT:
    case CU_MEMPOOL_ATTR_USED_MEM_HIGH:
        return sizeof(cuuint64_t);
    default:
        return 0;
    }
}

/* op: [pool, attr, value as 8 little-endian bytes] */
CUresult gpo_cuMemPoolSetAttribute(CUmemoryPool pool, CUmemPool_attribute attr, void *value)
{
    size_t n = attr_size(attr);
    if (!value || n == 0)
        return CUDA_ERROR_INVALID_VALUE;
    uint64_t v = 0;
    if (n == sizeof(int)) {
        int i;
        memcpy(&i, value, sizeof i);
        v = (uint64_t)(int64_t)i;
    } else {
        memcpy(&v, value, sizeof v);
    }
    GP_ENTER();
    gp_buf *b = gp_op_begin(GP_FID_cuMemPoolSetAttribute, 3);
    gp_put_handle(b, pool);
    mp_uint(b, (uint64_t)attr);
    mp_bin(b, &v, sizeof v);
    gp_reply r;
    CUresult rc = gp_op_sync(&r);
    gp_reply_done(&r);
    GP_LEAVE(rc);
}

/* op: [pool, attr, 8 (the out buffer's size)]; the answer is an integer */
CUresult gpo_cuMemPoolGetAttribute(CUmemoryPool pool, CUmemPool_attribute attr, void *value)
{
    size_t n = attr_size(attr);
    if (!value || n == 0)
        return CUDA_ERROR_INVALID_VALUE;
    GP_ENTER();
    gp_buf *b = gp_op_begin(GP_FID_cuMemPoolGetAttribute, 3);
    gp_put_handle(b, pool);
    mp_uint(b, (uint64_t)attr);
    mp_uint(b, 8);
    gp_reply r;
    CUresult rc = gp_op_sync(&r);
    if (rc == CUDA_SUCCESS && r.have_outs && r.nouts >= 1) {
        uint64_t v = (uint64_t)gp_out_int(&r);
        if (n == sizeof(int)) {
            int i = (int)v;
            memcpy(value, &i, sizeof i);
        } else {
            memcpy(value, &v, sizeof v);
        }
    }
    gp_reply_done(&r);
    GP_LEAVE(rc);
}
