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
 * and points the field at it, and keeps it in a table of its own (`owned`,
 * keyed by the node and the graph holding it) for exactly that long: it is
 * freed when the node is destroyed (cuGraphDestroyNode) or its graph is
 * (cuGraphDestroy), and with it the arrays of the conditional nodes inside
 * its bodies, which the driver destroys with the node (the bodies are
 * "CUDA-owned"). Before the destroy succeeds nothing is freed, so a
 * refused destroy leaves the array readable.
 *
 * The conditional handle (cuGraphConditionalHandleCreate) is generated code:
 * proxyd answers the value the kernels pass to cudaGraphSetConditional.
 *
 * Locking: takes gp_lock for the op (GP_ENTER); the table of arrays has a
 * mutex of its own (owned_mu), taken after the op's reply and never held
 * across a call to proxyd. */
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "gp_gen.h"
#include "gp_shim.h"

/* The phGraph_out arrays the shim has handed out and still owns. */
struct owned {
    CUgraph graph;              /* the graph holding the node */
    CUgraphNode node;
    CUgraph *bodies;            /* what phGraph_out points at */
    unsigned n;
    struct owned *next;
};
static struct owned *owned_head;
static size_t owned_count;
static pthread_mutex_t owned_mu = PTHREAD_MUTEX_INITIALIZER;

static void own(CUgraph g, CUgraphNode node, CUgraph *bodies, unsigned n)
{
    struct owned *o = malloc(sizeof *o);
    if (!o) {
        /* the node exists and its bodies are handed out: keep the array
         * (it must stay valid) rather than fail a call that succeeded */
        return;
    }
    o->graph = g;
    o->node = node;
    o->bodies = bodies;
    o->n = n;
    pthread_mutex_lock(&owned_mu);
    o->next = owned_head;
    owned_head = o;
    owned_count++;
    pthread_mutex_unlock(&owned_mu);
}

/* Frees the entries for which (graph == g or node == node), then, since the
 * driver destroys a node's body graphs with it, those of every graph among
 * their bodies, depth first. Called with owned_mu held. */
static void forget_locked(CUgraph g, CUgraphNode node)
{
    struct owned **pp = &owned_head;
    while (*pp) {
        struct owned *o = *pp;
        if ((g && o->graph == g) || (node && o->node == node)) {
            *pp = o->next;
            owned_count--;
            for (unsigned i = 0; i < o->n; i++)
                if (o->bodies[i])
                    forget_locked(o->bodies[i], NULL);
            free(o->bodies);
            free(o);
            pp = &owned_head;           /* the recursion may have unlinked anything */
        } else {
            pp = &o->next;
        }
    }
}

static void forget(CUgraph g, CUgraphNode node)
{
    pthread_mutex_lock(&owned_mu);
    forget_locked(g, node);
    pthread_mutex_unlock(&owned_mu);
}

/* How many phGraph_out arrays the shim holds now (tests: a process that
 * makes and destroys conditional nodes must come back to where it was;
 * tests/programs/graph_cond_churn.cu looks it up with dlsym). */
GP_EXPORT size_t gp_debug_cond_arrays(void)
{
    pthread_mutex_lock(&owned_mu);
    size_t n = owned_count;
    pthread_mutex_unlock(&owned_mu);
    return n;
}

/* cuGraphDestroy and cuGraphDestroyNode (specs: shim override): the generic
 * call, then the arrays that lived as long as the graph or node. */
CUresult gpo_cuGraphDestroy(CUgraph hGraph)
{
    CUresult rc = gpg_cuGraphDestroy(hGraph);
    if (rc == CUDA_SUCCESS && hGraph)
        forget(hGraph, NULL);
    return rc;
}

CUresult gpo_cuGraphDestroyNode(CUgraphNode hNode)
{
    CUresult rc = gpg_cuGraphDestroyNode(hNode);
    if (rc == CUDA_SUCCESS && hNode)
        forget(NULL, hNode);
    return rc;
}

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
            own(g, *out, bodies, c->size);
        }
    } else if (rc == CUDA_SUCCESS) {
        rc = CUDA_ERROR_UNKNOWN;
    }
    gp_reply_done(&r);
    GP_LEAVE(rc);
}
