/* cuGraphAddNode / cuGraphAddNode_v2 (cuda.h, "Graph Management", CUDA
 * 12.2+): the generic form of adding a node, which hands each node type to
 * its own add function: graph_build.c's for kernel, memcpy, memset, host,
 * child graph, empty and event nodes, graph_mem.c's for memory nodes. It
 * sits above both (graph_mem.c uses graph_build.c; interceptor/LAYERS).
 *
 * Locking: the add functions take gp_lock; nothing here touches shim state. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gp_gen.h"
#include "gp_shim.h"

static CUresult refuse(const char *fn, const char *why)
{
    char msg[256];
    snprintf(msg, sizeof msg, "%s (%s)", fn, why);
    gp_warn_unsupported(msg);
    return CUDA_ERROR_NOT_SUPPORTED;
}

/* graph_cond.c */
CUresult gp_graph_add_conditional(CUgraphNode *out, CUgraph g, const CUgraphNode *deps, size_t ndeps,
                                  CUgraphNodeParams *np);

static CUresult add_by_type(CUgraphNode *phGraphNode, CUgraph hGraph, const CUgraphNode *dependencies,
                            size_t numDependencies, CUgraphNodeParams *np);

/* The generic form, by node type. With edge data other than the default
 * (all zero: a full dependency) the node is added without dependencies and
 * its edges then by cuGraphAddDependencies_v2, which carries the data
 * (proxyd checks it: proxyd/families/graph_edges.py); if that fails the node
 * is destroyed again and the call fails with its error, the graph as before. */
CUresult gpo_cuGraphAddNode_v2(CUgraphNode *phGraphNode, CUgraph hGraph, const CUgraphNode *dependencies,
                               const CUgraphEdgeData *dependencyData, size_t numDependencies,
                               CUgraphNodeParams *np)
{
    if (!np || !phGraphNode || (numDependencies && !dependencies))
        return CUDA_ERROR_INVALID_VALUE;
    int plain = 1;
    if (dependencyData) {
        static const CUgraphEdgeData zero;
        for (size_t i = 0; i < numDependencies && plain; i++)
            plain = memcmp(&dependencyData[i], &zero, sizeof zero) == 0;
    }
    if (plain)
        return add_by_type(phGraphNode, hGraph, dependencies, numDependencies, np);
    CUgraphNode node = NULL;
    CUresult rc = add_by_type(&node, hGraph, NULL, 0, np);
    if (rc != CUDA_SUCCESS)
        return rc;
    CUgraphNode *to = malloc(numDependencies * sizeof *to);
    if (!to) {
        cuGraphDestroyNode(node);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    for (size_t i = 0; i < numDependencies; i++)
        to[i] = node;
    rc = cuGraphAddDependencies_v2(hGraph, dependencies, to, dependencyData, numDependencies);
    free(to);
    if (rc != CUDA_SUCCESS) {
        cuGraphDestroyNode(node);
        return rc;
    }
    *phGraphNode = node;
    return CUDA_SUCCESS;
}

static CUresult add_by_type(CUgraphNode *phGraphNode, CUgraph hGraph, const CUgraphNode *dependencies,
                            size_t numDependencies, CUgraphNodeParams *np)
{
    switch (np->type) {
    case CU_GRAPH_NODE_TYPE_KERNEL: {
        CUDA_KERNEL_NODE_PARAMS kp;
        _Static_assert(sizeof kp == sizeof np->kernel, "CUDA_KERNEL_NODE_PARAMS_v3 has v2's layout");
        memcpy(&kp, &np->kernel, sizeof kp);
        return gpo_cuGraphAddKernelNode_v2(phGraphNode, hGraph, dependencies, numDependencies, &kp);
    }
    case CU_GRAPH_NODE_TYPE_MEMCPY:
        return gpo_cuGraphAddMemcpyNode(phGraphNode, hGraph, dependencies, numDependencies,
                                        &np->memcpy.copyParams, np->memcpy.copyCtx);
    case CU_GRAPH_NODE_TYPE_MEMSET: {
        CUDA_MEMSET_NODE_PARAMS m = { np->memset.dst, np->memset.pitch, np->memset.value, np->memset.elementSize,
                                      np->memset.width, np->memset.height };
        return gpo_cuGraphAddMemsetNode(phGraphNode, hGraph, dependencies, numDependencies, &m, np->memset.ctx);
    }
    case CU_GRAPH_NODE_TYPE_HOST: {
        CUDA_HOST_NODE_PARAMS h = { np->host.fn, np->host.userData };
        return gpo_cuGraphAddHostNode(phGraphNode, hGraph, dependencies, numDependencies, &h);
    }
    case CU_GRAPH_NODE_TYPE_GRAPH:
        return gpo_cuGraphAddChildGraphNode(phGraphNode, hGraph, dependencies, numDependencies, np->graph.graph);
    case CU_GRAPH_NODE_TYPE_EMPTY:
        return gpo_cuGraphAddEmptyNode(phGraphNode, hGraph, dependencies, numDependencies);
    case CU_GRAPH_NODE_TYPE_WAIT_EVENT:
        return gpo_cuGraphAddEventWaitNode(phGraphNode, hGraph, dependencies, numDependencies, np->eventWait.event);
    case CU_GRAPH_NODE_TYPE_EVENT_RECORD:
        return gpo_cuGraphAddEventRecordNode(phGraphNode, hGraph, dependencies, numDependencies,
                                             np->eventRecord.event);
    case CU_GRAPH_NODE_TYPE_MEM_ALLOC: {
        /* v2 has v1's layout; dptr is an out field (cuda.h) */
        CUDA_MEM_ALLOC_NODE_PARAMS a;
        _Static_assert(sizeof a == sizeof np->alloc, "CUDA_MEM_ALLOC_NODE_PARAMS_v2 has v1's layout");
        memcpy(&a, &np->alloc, sizeof a);
        CUresult rc = gpo_cuGraphAddMemAllocNode(phGraphNode, hGraph, dependencies, numDependencies, &a);
        if (rc == CUDA_SUCCESS)
            np->alloc.dptr = a.dptr;
        return rc;
    }
    case CU_GRAPH_NODE_TYPE_MEM_FREE:
        return gpo_cuGraphAddMemFreeNode(phGraphNode, hGraph, dependencies, numDependencies, np->free.dptr);
    case CU_GRAPH_NODE_TYPE_CONDITIONAL:
        return gp_graph_add_conditional(phGraphNode, hGraph, dependencies, numDependencies, np);
    default: {
        char why[96];
        snprintf(why, sizeof why, "node type %d is not supported", (int)np->type);
        return refuse("cuGraphAddNode", why);
    }
    }
}

CUresult gpo_cuGraphAddNode(CUgraphNode *phGraphNode, CUgraph hGraph, const CUgraphNode *dependencies,
                            size_t numDependencies, CUgraphNodeParams *nodeParams)
{
    return gpo_cuGraphAddNode_v2(phGraphNode, hGraph, dependencies, NULL, numDependencies, nodeParams);
}
