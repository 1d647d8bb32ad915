// Pitched device memory through the runtime (cudaMallocPitch), 2D copies in
// and out of it, a kernel that walks rows by the pitch, and
// cudaCtxResetPersistingL2Cache (a no-op for the results). Checks every
// element against a CPU reference; prints the pitch's alignment, not its
// value (that is the device's choice).
#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>
#include <vector>

#define CHECK(e) do { cudaError_t r_ = (e); if (r_ != cudaSuccess) { \
    printf("FAIL %s: %s\n", #e, cudaGetErrorString(r_)); return 1; } } while (0)

__global__ void add_row(float *p, size_t pitch, int w, int h)
{
    int x = blockIdx.x * blockDim.x + threadIdx.x, y = blockIdx.y;
    if (x < w && y < h) {
        float *row = (float *)((char *)p + y * pitch);
        row[x] += (float)y;
    }
}

int main()
{
    const int w = 300, h = 37;
    std::vector<float> in(w * h), out(w * h);
    for (int i = 0; i < w * h; i++)
        in[i] = (float)(i % 1013) * 0.5f;
    float *d = nullptr;
    size_t pitch = 0;
    CHECK(cudaMallocPitch((void **)&d, &pitch, w * sizeof(float), h));
    printf("pitch >= row: %s, multiple of 32: %s\n", pitch >= w * sizeof(float) ? "yes" : "no",
           pitch % 32 == 0 ? "yes" : "no");
    CHECK(cudaMemcpy2D(d, pitch, in.data(), w * sizeof(float), w * sizeof(float), h, cudaMemcpyHostToDevice));
    add_row<<<dim3((w + 127) / 128, h), 128>>>(d, pitch, w, h);
    CHECK(cudaGetLastError());
    CHECK(cudaCtxResetPersistingL2Cache());
    CHECK(cudaMemcpy2D(out.data(), w * sizeof(float), d, pitch, w * sizeof(float), h, cudaMemcpyDeviceToHost));
    int bad = 0;
    for (int y = 0; y < h; y++)
        for (int x = 0; x < w; x++)
            if (out[y * w + x] != in[y * w + x] + (float)y)
                bad++;
    printf("rows %d, wrong elements %d\n", h, bad);
    CHECK(cudaFree(d));
    printf("%s pitched\n", bad ? "FAIL" : "PASS");
    return bad != 0;
}
