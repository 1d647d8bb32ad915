// What page-locking host memory costs on this machine (issue 13, target 2),
// run natively (the driver's cost, not gpuproxy's):
//   pin_cost GIB [THREADS]
// prints one JSON line per measurement:
//   touch          first touch of fresh anonymous memory (THP advised), 1 and THREADS threads
//   touch_again    the same memory written again (already faulted in)
//   register       cudaHostRegister of the touched memory, one call for all of it
//   register_seg   the same in 256 MiB segments from THREADS threads at once
//   unregister     cudaHostUnregister
//   host_alloc     cudaHostAlloc (the driver allocates and pins)
//   d2h_pinned / d2h_pageable / h2d_pinned   1 GiB copies into/out of that memory
//   register_shm   cudaHostRegister(READ_ONLY) of a resident /dev/shm file's mapping
//                  (what restoring straight from an image in host memory would pay)
// Rates are GB/s (1e9 bytes per second); times are seconds.
#include <cuda_runtime.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <vector>

#define CHECK(x)                                                                          \
    do {                                                                                  \
        cudaError_t e_ = (x);                                                             \
        if (e_ != cudaSuccess) {                                                          \
            fprintf(stderr, "%s: %s\n", #x, cudaGetErrorString(e_));                    \
            exit(1);                                                                      \
        }                                                                                 \
    } while (0)

static double now()
{
    return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

static void report(const char *what, size_t bytes, double s, int threads)
{
    printf("{\"bench\": \"%s\", \"bytes\": %zu, \"seconds\": %.6f, \"gbps\": %.3f, \"threads\": %d}\n", what, bytes,
           s, bytes / s / 1e9, threads);
    fflush(stdout);
}

static void *fresh(size_t n)
{
    void *p = mmap(nullptr, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) {
        perror("mmap");
        exit(1);
    }
    madvise(p, n, MADV_HUGEPAGE);
    return p;
}

static double touch(void *p, size_t n, int threads, int value)
{
    double t0 = now();
    std::vector<std::thread> ts;
    size_t per = (n / threads + 4095) & ~(size_t)4095;
    for (int i = 0; i < threads; i++)
        ts.emplace_back([=] {
            size_t lo = per * i;
            if (lo < n)
                memset((char *)p + lo, value, lo + per > n ? n - lo : per);
        });
    for (auto &t : ts)
        t.join();
    return now() - t0;
}

int main(int argc, char **argv)
{
    double gib = argc > 1 ? atof(argv[1]) : 1.0;
    int threads = argc > 2 ? atoi(argv[2]) : 8;
    size_t n = (size_t)(gib * (1 << 30));
    const size_t G = (size_t)1 << 30;
    CHECK(cudaFree(0));
    void *dev;
    CHECK(cudaMalloc(&dev, G));

    // first touch: one thread, then several (fresh memory each time)
    void *a = fresh(n);
    report("touch", n, touch(a, n, 1, 1), 1);
    munmap(a, n);
    void *p = fresh(n);
    report("touch", n, touch(p, n, threads, 1), threads);
    report("touch_again", n, touch(p, n, threads, 2), threads);

    double t0 = now();
    CHECK(cudaHostRegister(p, n, cudaHostRegisterPortable));
    report("register", n, now() - t0, 1);
    size_t m = n < G ? n : G;
    t0 = now();
    CHECK(cudaMemcpy(p, dev, m, cudaMemcpyDeviceToHost));
    report("d2h_pinned", m, now() - t0, 1);
    t0 = now();
    CHECK(cudaMemcpy(dev, p, m, cudaMemcpyHostToDevice));
    report("h2d_pinned", m, now() - t0, 1);
    t0 = now();
    CHECK(cudaHostUnregister(p));
    report("unregister", n, now() - t0, 1);
    t0 = now();
    CHECK(cudaMemcpy(p, dev, m, cudaMemcpyDeviceToHost));
    report("d2h_pageable", m, now() - t0, 1);

    // segments of 256 MiB registered from several threads at once (pinned_pool.py's way)
    const size_t seg = (size_t)256 << 20;
    size_t nseg = (n + seg - 1) / seg;
    t0 = now();
    {
        std::vector<std::thread> ts;
        for (int i = 0; i < threads; i++)
            ts.emplace_back([=] {
                for (size_t k = i; k < nseg; k += threads) {
                    size_t lo = k * seg, len = lo + seg > n ? n - lo : seg;
                    CHECK(cudaHostRegister((char *)p + lo, len, cudaHostRegisterPortable));
                }
            });
        for (auto &t : ts)
            t.join();
    }
    report("register_seg", n, now() - t0, threads);
    for (size_t k = 0; k < nseg; k++)
        CHECK(cudaHostUnregister((char *)p + k * seg));
    munmap(p, n);

    // fresh memory, touched and registered segment by segment by several threads
    p = fresh(n);
    t0 = now();
    {
        std::vector<std::thread> ts;
        for (int i = 0; i < threads; i++)
            ts.emplace_back([=] {
                for (size_t k = i; k < nseg; k += threads) {
                    size_t lo = k * seg, len = lo + seg > n ? n - lo : seg;
                    memset((char *)p + lo, 0, len);
                    CHECK(cudaHostRegister((char *)p + lo, len, cudaHostRegisterPortable));
                }
            });
        for (auto &t : ts)
            t.join();
    }
    report("touch_register_seg", n, now() - t0, threads);
    for (size_t k = 0; k < nseg; k++)
        CHECK(cudaHostUnregister((char *)p + k * seg));
    munmap(p, n);

    void *h;
    t0 = now();
    CHECK(cudaHostAlloc(&h, n, cudaHostAllocPortable));
    report("host_alloc", n, now() - t0, 1);
    CHECK(cudaFreeHost(h));

    // a resident /dev/shm file, mapped read-only and registered
    char path[] = "/dev/shm/gpx-pin-XXXXXX";
    int fd = mkstemp(path);
    if (fd >= 0 && ftruncate(fd, n) == 0) {
        void *w = mmap(nullptr, n, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
        touch(w, n, threads, 3);
        munmap(w, n);
        void *r = mmap(nullptr, n, PROT_READ, MAP_SHARED, fd, 0);
        t0 = now();
        cudaError_t e = cudaHostRegister(r, n, cudaHostRegisterPortable | cudaHostRegisterReadOnly);
        double s = now() - t0;
        if (e == cudaSuccess) {
            report("register_shm", n, s, 1);
            t0 = now();
            CHECK(cudaMemcpy(dev, r, m, cudaMemcpyHostToDevice));
            report("h2d_from_registered_shm", m, now() - t0, 1);
            CHECK(cudaHostUnregister(r));
        } else {
            printf("{\"bench\": \"register_shm\", \"error\": \"%s\"}\n", cudaGetErrorString(e));
        }
        munmap(r, n);
    }
    if (fd >= 0) {
        close(fd);
        unlink(path);
    }
    return 0;
}
