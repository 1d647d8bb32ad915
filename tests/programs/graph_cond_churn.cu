// graph_cond_churn: conditional nodes made and destroyed many times (issue
// 26). cuda.h calls a conditional node's phGraph_out a "CUDA-owned array
// populated with conditional node child graphs during creation of the node.
// Valid for the lifetime of the conditional node": under the proxy the
// shim owns that array (interceptor/graph_cond.c) and must free it when the
// node or its graph goes, not before.
//
// Each round: a graph with an IF node (its body memsets data[0] = round)
// and three SWITCH nodes of 64 bodies each (handle default round % 64: the
// chosen body memsets data[1 + k]), then SWITCH 0 destroyed with
// cudaGraphDestroyNode, the graph instantiated, launched and checked,
// everything destroyed. The body arrays are read only after later nodes
// were added and another node destroyed (they must still be valid then).
// With the argument "nested" the IF's body also holds an IF node of its own
// (a handle made on the body graph) whose body memsets data[0] = round +
// 1000: destroying the graph must free the nested node's array too.
//
// Memory: after some rounds to warm up, 150 more must not grow the heap
// (mallinfo2's in-use bytes) by more than 96 KiB; the shim's old code
// leaked about 1.6 KiB a round. Under the shim, its own count of the arrays
// it holds (gp_debug_cond_arrays, looked up with dlsym; absent natively)
// must follow every add and destroy exactly and come back to zero
// (CHURN_REQUIRE_COUNT=1: fail where it is absent).
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <dlfcn.h>
#include <malloc.h>
#include <cuda_runtime.h>

#define NAME "graph_cond_churn"
#define CHECK(call)                                                             \
    do {                                                                        \
        cudaError_t err_ = (call);                                              \
        if (err_ != cudaSuccess) {                                              \
            printf("FAIL " NAME ": %s -> %s at %s:%d\n", #call,                 \
                   cudaGetErrorName(err_), __FILE__, __LINE__);                 \
            fflush(stdout);                                                     \
            exit(1);                                                            \
        }                                                                       \
    } while (0)
#define EXPECT(cond, ...)                                                       \
    do {                                                                        \
        if (!(cond)) {                                                          \
            printf("FAIL " NAME ": " __VA_ARGS__);                              \
            printf("\n");                                                       \
            fflush(stdout);                                                     \
            exit(1);                                                            \
        }                                                                       \
    } while (0)

static const int NSW = 3;          // SWITCH nodes a round
static const unsigned SW = 64;     // bodies of each
static const int WARM = 10, ROUNDS = 150;
static const size_t MAX_GROWTH = 96 * 1024;

static size_t (*live_arrays)(void);   // the shim's count, when under it

static void expect_live(size_t want, const char *when, int round)
{
    if (live_arrays)
        EXPECT(live_arrays() == want, "round %d, %s: the shim holds %zu body arrays, expected %zu", round, when,
               live_arrays(), want);
}

static cudaGraph_t *add_cond(cudaGraphNode_t *node, cudaGraph_t g, const cudaGraphNode_t *dep,
                             cudaGraphConditionalHandle h, cudaGraphConditionalNodeType type, unsigned size)
{
    cudaGraphNodeParams p = {};
    p.type = cudaGraphNodeTypeConditional;
    p.conditional.handle = h;
    p.conditional.type = type;
    p.conditional.size = size;
    CHECK(cudaGraphAddNode(node, g, dep, NULL, dep ? 1 : 0, &p));
    EXPECT(p.conditional.phGraph_out != NULL, "phGraph_out is NULL after cudaGraphAddNode");
    return p.conditional.phGraph_out;
}

static void memset_node(cudaGraph_t g, const cudaGraphNode_t *dep, int *dst, int value, cudaGraphNode_t *out)
{
    cudaMemsetParams mp;
    memset(&mp, 0, sizeof mp);
    mp.dst = dst;
    mp.value = (unsigned)value;
    mp.elementSize = 4;
    mp.width = 1;
    mp.height = 1;
    CHECK(cudaGraphAddMemsetNode(out, g, dep, dep ? 1 : 0, &mp));
}

static void round_trip(int r, bool nested, int *d, cudaStream_t s, size_t base)
{
    cudaGraph_t g;
    CHECK(cudaGraphCreate(&g, 0));
    cudaGraphConditionalHandle hi, hs[NSW];
    CHECK(cudaGraphConditionalHandleCreate(&hi, g, 1, cudaGraphCondAssignDefault));
    cudaGraphNode_t nif, nsw[NSW];
    cudaGraph_t *if_bodies = add_cond(&nif, g, NULL, hi, cudaGraphCondTypeIf, 1);
    cudaGraph_t *sw_bodies[NSW];
    for (int k = 0; k < NSW; k++) {
        CHECK(cudaGraphConditionalHandleCreate(&hs[k], g, (unsigned)r % SW, cudaGraphCondAssignDefault));
        sw_bodies[k] = add_cond(&nsw[k], g, &nif, hs[k], cudaGraphCondTypeSwitch, SW);
    }
    size_t held = base + 1 + NSW;
    if (nested) {
        cudaGraphConditionalHandle hn;
        CHECK(cudaGraphConditionalHandleCreate(&hn, if_bodies[0], 1, cudaGraphCondAssignDefault));
        cudaGraphNode_t m, nn;
        memset_node(if_bodies[0], NULL, d, r, &m);
        cudaGraph_t *inner = add_cond(&nn, if_bodies[0], &m, hn, cudaGraphCondTypeIf, 1);
        memset_node(inner[0], NULL, d, r + 1000, &m);
        held++;
    } else {
        cudaGraphNode_t m;
        memset_node(if_bodies[0], NULL, d, r, &m);
    }
    expect_live(held, "after the adds", r);
    // every SWITCH's array read after the other nodes were added
    for (int k = 0; k < NSW; k++) {
        for (unsigned b = 0; b < SW; b++)
            EXPECT(sw_bodies[k][b] != NULL, "round %d: SWITCH %d body %u is NULL", r, k, b);
        cudaGraphNode_t m;
        memset_node(sw_bodies[k][(unsigned)r % SW], NULL, d + 1 + k, r * 10 + k, &m);
    }
    CHECK(cudaGraphDestroyNode(nsw[0]));
    held--;
    expect_live(held, "after cudaGraphDestroyNode", r);
    // hs[0] needs a node again: a handle no node uses fails instantiation
    // (cuda.h, cudaGraphConditionalHandleCreate; driver 580 refuses it). Its
    // one body stays empty, so nothing it does shows in got[1].
    cudaGraphNode_t again;
    add_cond(&again, g, &nif, hs[0], cudaGraphCondTypeSwitch, 1);
    held++;
    // the remaining arrays are still the node's (read after a destroy)
    EXPECT(if_bodies[0] != NULL && sw_bodies[NSW - 1][SW - 1] != NULL, "round %d: a body array changed", r);

    int init[1 + NSW];
    for (int k = 0; k < 1 + NSW; k++)
        init[k] = -1;
    CHECK(cudaMemcpy(d, init, sizeof init, cudaMemcpyHostToDevice));
    cudaGraphExec_t e;
    CHECK(cudaGraphInstantiate(&e, g, 0));
    CHECK(cudaGraphLaunch(e, s));
    CHECK(cudaStreamSynchronize(s));
    int got[1 + NSW];
    CHECK(cudaMemcpy(got, d, sizeof got, cudaMemcpyDeviceToHost));
    EXPECT(got[0] == (nested ? r + 1000 : r), "round %d: IF body left %d", r, got[0]);
    EXPECT(got[1] == -1, "round %d: the destroyed SWITCH ran (%d)", r, got[1]);
    for (int k = 1; k < NSW; k++)
        EXPECT(got[1 + k] == r * 10 + k, "round %d: SWITCH %d left %d, expected %d", r, k, got[1 + k], r * 10 + k);
    CHECK(cudaGraphExecDestroy(e));
    expect_live(held, "after cudaGraphExecDestroy", r);
    CHECK(cudaGraphDestroy(g));
    expect_live(base, "after cudaGraphDestroy", r);
}

int main(int argc, char **argv)
{
    bool nested = argc > 1 && strcmp(argv[1], "nested") == 0;
    live_arrays = (size_t(*)(void))dlsym(RTLD_DEFAULT, "gp_debug_cond_arrays");
    const char *req = getenv("CHURN_REQUIRE_COUNT");     // tests/test_graph_cond.py: under the shim
    EXPECT(live_arrays || !req || strcmp(req, "1") != 0, "no gp_debug_cond_arrays in this process");
    int *d;
    CHECK(cudaMalloc(&d, (1 + NSW) * sizeof(int)));
    cudaStream_t s;
    CHECK(cudaStreamCreate(&s));
    size_t base = live_arrays ? live_arrays() : 0;
    for (int r = 0; r < WARM; r++)
        round_trip(r, nested, d, s, base);
    struct mallinfo2 m0 = mallinfo2();
    for (int r = WARM; r < WARM + ROUNDS; r++)
        round_trip(r, nested, d, s, base);
    struct mallinfo2 m1 = mallinfo2();
    size_t growth = m1.uordblks > m0.uordblks ? m1.uordblks - m0.uordblks : 0;
    EXPECT(growth <= MAX_GROWTH, "the heap grew by %zu bytes over %d rounds (at most %zu)", growth, ROUNDS,
           MAX_GROWTH);
    printf("%d rounds of %d conditional nodes (%u bodies each for SWITCH)%s: checked\n", WARM + ROUNDS, 1 + NSW,
           SW, nested ? ", nested IF" : "");
    printf("heap growth over the last %d rounds within %zu KiB\n", ROUNDS, MAX_GROWTH / 1024);
    CHECK(cudaStreamDestroy(s));
    CHECK(cudaFree(d));
    printf("PASS " NAME "\n");
    return 0;
}
