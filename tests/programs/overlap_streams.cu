// overlap_streams: a 16 MiB array processed in 16 chunks on two streams in
// turn; each chunk is uploaded from pinned memory, transformed by a kernel and
// downloaded, so the copies of one stream overlap the kernels of the other.
// Two rounds, the second one with the streams swapped and the previous round's
// output as input. Every chunk is checked.
#include <cstdio>
#include <cstdlib>
#include <cuda_runtime.h>

#define NAME "overlap_streams"
#define CHECK(call)                                                             \
    do {                                                                        \
        cudaError_t err_ = (call);                                              \
        if (err_ != cudaSuccess) {                                              \
            printf("FAIL " NAME ": %s -> %s (%s) at %s:%d\n", #call,            \
                   cudaGetErrorName(err_), cudaGetErrorString(err_),            \
                   __FILE__, __LINE__);                                         \
            fflush(stdout);                                                     \
            exit(1);                                                            \
        }                                                                       \
    } while (0)

static const int kN = 1 << 22;
static const int kChunks = 16;
static const int kChunk = kN / kChunks;

// out[i] = in[i] * 2654435761 + (chunk * 0x9E3779B9 ^ round), unsigned wrap-around
__global__ void mix_chunk(const unsigned *in, unsigned *out, int n, unsigned chunk, unsigned round)
{
    unsigned add = (chunk * 0x9E3779B9u) ^ round;
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += blockDim.x * gridDim.x)
        out[i] = in[i] * 2654435761u + add;
}

static unsigned host_mix(unsigned v, unsigned chunk, unsigned round)
{
    return v * 2654435761u + ((chunk * 0x9E3779B9u) ^ round);
}

int main(void)
{
    const size_t bytes = (size_t)kN * sizeof(unsigned);
    const size_t cbytes = (size_t)kChunk * sizeof(unsigned);
    unsigned *h_in, *h_out;
    CHECK(cudaMallocHost(&h_in, bytes));
    CHECK(cudaMallocHost(&h_out, bytes));
    unsigned *ref = (unsigned *)malloc(bytes);
    for (int i = 0; i < kN; ++i) h_in[i] = (unsigned)i ^ 0x5555u;
    unsigned *d_in, *d_out;
    CHECK(cudaMalloc(&d_in, bytes));
    CHECK(cudaMalloc(&d_out, bytes));
    cudaStream_t streams[2];
    CHECK(cudaStreamCreate(&streams[0]));
    CHECK(cudaStreamCreate(&streams[1]));

    for (unsigned round = 0; round < 2; ++round) {
        for (int i = 0; i < kN; ++i) ref[i] = host_mix(h_in[i], (unsigned)(i / kChunk), round);
        for (int c = 0; c < kChunks; ++c) {
            cudaStream_t s = streams[(c + round) % 2];
            size_t off = (size_t)c * kChunk;
            CHECK(cudaMemcpyAsync(d_in + off, h_in + off, cbytes, cudaMemcpyHostToDevice, s));
            mix_chunk<<<128, 256, 0, s>>>(d_in + off, d_out + off, kChunk, (unsigned)c, round);
            CHECK(cudaGetLastError());
            CHECK(cudaMemcpyAsync(h_out + off, d_out + off, cbytes, cudaMemcpyDeviceToHost, s));
        }
        CHECK(cudaDeviceSynchronize());
        int bad = 0;
        unsigned long long sum = 0;
        for (int c = 0; c < kChunks; ++c) {
            for (int i = c * kChunk; i < (c + 1) * kChunk; ++i) {
                if (h_out[i] != ref[i]) {
                    if (!bad) printf("FAIL " NAME ": round %u chunk %d element %d: got %u want %u\n", round, c, i, h_out[i], ref[i]);
                    bad = 1;
                }
                sum += h_out[i];
            }
        }
        if (bad) return 1;
        printf("round %u: %d chunks ok, checksum %llu\n", round, kChunks, sum);
        // the output becomes the next round's input
        for (int i = 0; i < kN; ++i) h_in[i] = h_out[i];
    }

    CHECK(cudaStreamDestroy(streams[0]));
    CHECK(cudaStreamDestroy(streams[1]));
    CHECK(cudaFree(d_in));
    CHECK(cudaFree(d_out));
    CHECK(cudaFreeHost(h_in));
    CHECK(cudaFreeHost(h_out));
    free(ref);
    printf("PASS " NAME "\n");
    return 0;
}
