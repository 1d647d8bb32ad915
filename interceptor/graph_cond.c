/* Conditional graph nodes (cuda.h, CU_GRAPH_NODE_TYPE_CONDITIONAL and
 * CUDA_CONDITIONAL_NODE_PARAMS, CUDA 12.3+): the conditional case of
 * cuGraphAddNode / cuGraphAddNode_v2 (graph_add_node.c hands it here).
 *
 * The node travels as cuGraphAddNode's op [out, graph, [deps], count,
 * CUgraphNodeParams bytes]; proxyd (proxyd/families/graph_cond.py) checks
 * the handle, type and size, makes the body graphs and answers [node,
 * body graph handles packed as little-endian u64]. Those handles are
 * ordinary graph handles of the session: the application fills the bodies
 * with the usual add calls or a capture into them (cuStreamBeginCaptureToGraph).
 * phGraph_out is an out field: cuda.h calls it a "CUDA-owned array populated
 * with conditional node child graphs during creation of the node. Valid for
 * the lifetime of the conditional node", and NVIDIA's samples read it after
 * the call with the field left NULL before. The shim allocates that array
 * and points the field at it; it is never freed (a node's lifetime ends with
 * its graph's, which the shim does not track; `size` pointers per node).
 *
 * The conditional handle (cuGraphConditionalHandleCreate) is generated code:
 * proxyd answers the value the kernels pass to cudaGraphSetConditional.
 *
 * Locking: takes gp_lock for the op (GP_ENTER); no shim state of its own. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "gp_gen.h"
#include "gp_shim.h"

CUresult gp_graph_add_conditional(CUgraphNode *out, CUgraph g, const CUgraphNode *deps, size_t ndeps,
                                  CUgraphNodeParams *np)
{
    CUDA_CONDITIONAL_NODE_PARAMS *c = &np->conditional;
    if (!out || !g || (ndeps && !deps) || c->size == 0)
        return CUDA_ERROR_INVALID_VALUE;
    GP_ENTER();
    gp_buf *b = gp_op_begin(GP_FID_cuGraphAddNode, 5);
    mp_bool(b, 1);
    gp_put_handle(b, g);
    mp_array(b, (uint32_t)ndeps);
    for (size_t i = 0; i < ndeps; i++)
        gp_put_handle(b, deps[i]);
    mp_uint(b, ndeps);
    gp_put_data(b, np, sizeof *np, 0);
    gp_reply r;
    CUresult rc = gp_op_sync(&r);
    if (rc == CUDA_SUCCESS && r.have_outs && r.nouts >= 2) {
        gp_out_handle(&r, (void **)out);
        size_t n = 0;
        const uint8_t *p = gp_out_bytes(&r, &n);
        CUgraph *bodies = p && n == 8u * c->size ? calloc(c->size, sizeof *bodies) : NULL;
        if (!bodies) {
            rc = p && n == 8u * c->size ? CUDA_ERROR_OUT_OF_MEMORY : CUDA_ERROR_UNKNOWN;
        } else {
            for (unsigned i = 0; i < c->size; i++) {
                uint64_t v;
                memcpy(&v, p + 8u * i, 8);
                bodies[i] = (CUgraph)(uintptr_t)v;
            }
            c->phGraph_out = bodies;
        }
    } else if (rc == CUDA_SUCCESS) {
        rc = CUDA_ERROR_UNKNOWN;
    }
    gp_reply_done(&r);
    GP_LEAVE(rc);
}
