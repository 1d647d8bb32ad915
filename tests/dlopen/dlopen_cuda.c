/* Loads the CUDA libraries the way frameworks do (CuPy and cuda-pathfinder:
 * the runtime by absolute path; numba: "libcuda.so"; others: another soname
 * version) and uses them. Under gpuproxy's LD_PRELOAD every one of these
 * must resolve to the shim (tests/test_dlopen.py).
 *
 *   dlopen_cuda /path/to/real/libcudart.so.13
 *
 * Prints, one per line: where each handle's symbols come from (dladdr), and
 * the results of a device count, an allocation, a copy round trip and a
 * driver-API device count. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef int (*count_fn)(int *);
typedef int (*malloc_fn)(void **, size_t);
typedef int (*free_fn)(void *);
typedef int (*memcpy_fn)(void *, const void *, size_t, int);
typedef int (*memset_fn)(void *, int, size_t);
typedef int (*cuinit_fn)(unsigned);

static const char *origin(void *sym)
{
    Dl_info info;
    if (!sym || !dladdr(sym, &info) || !info.dli_fname)
        return "?";
    return info.dli_fname;
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        fprintf(stderr, "usage: %s /path/to/libcudart.so.13\n", argv[0]);
        return 2;
    }
    void *rt = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
    if (!rt) {
        printf("dlopen runtime failed: %s\n", dlerror());
        return 1;
    }
    count_fn get_count = (count_fn)dlsym(rt, "cudaGetDeviceCount");
    printf("runtime from %s\n", origin((void *)get_count));
    int n = -1;
    int err = get_count(&n);
    printf("cudaGetDeviceCount err=%d count=%d\n", err, n);
    if (err == 0) {
        malloc_fn cmalloc = (malloc_fn)dlsym(rt, "cudaMalloc");
        free_fn cfree = (free_fn)dlsym(rt, "cudaFree");
        memcpy_fn cmemcpy = (memcpy_fn)dlsym(rt, "cudaMemcpy");
        memset_fn cmemset = (memset_fn)dlsym(rt, "cudaMemset");
        enum { N = 1 << 16 };
        unsigned char *h = malloc(N), *back = malloc(N);
        for (int i = 0; i < N; i++)
            h[i] = (unsigned char)(i * 7 + 3);
        void *d = NULL;
        int e1 = cmalloc(&d, N);
        int e2 = cmemcpy(d, h, N, 1 /* cudaMemcpyHostToDevice */);
        int e3 = cmemcpy(back, d, N, 2 /* cudaMemcpyDeviceToHost */);
        int same = memcmp(h, back, N) == 0;
        int e4 = cmemset(d, 0x5a, 16);
        int e5 = cmemcpy(back, d, 16, 2);
        printf("alloc=%d h2d=%d d2h=%d roundtrip=%s memset=%d/%d byte=0x%02x free=%d\n", e1, e2, e3,
               same ? "same" : "DIFFERENT", e4, e5, back[15], cfree(d));
        free(h);
        free(back);
    }
    /* numba's way: the unversioned development name */
    void *drv = dlopen("libcuda.so", RTLD_NOW);
    if (drv) {
        cuinit_fn cu_init = (cuinit_fn)dlsym(drv, "cuInit");
        count_fn cu_count = (count_fn)dlsym(drv, "cuDeviceGetCount");
        printf("driver from %s\n", origin((void *)cu_count));
        int m = -1;
        int ei = cu_init(0);
        int ec = cu_count(&m);
        printf("cuInit=%d cuDeviceGetCount=%d count=%d\n", ei, ec, m);
    } else {
        printf("dlopen libcuda.so failed\n");
    }
    /* another soname version, asked for only if already loaded */
    void *old = dlopen("libcudart.so.12", RTLD_NOW | RTLD_NOLOAD);
    printf("noload libcudart.so.12: %s\n", old ? origin(dlsym(old, "cudaGetDeviceCount")) : "not loaded");
    /* dlmopen into the base namespace: the same library as dlopen */
    void *base = dlmopen(LM_ID_BASE, argv[1], RTLD_NOW);
    printf("dlmopen base: %s\n", base ? origin(dlsym(base, "cudaGetDeviceCount")) : dlerror());
    return 0;
}
