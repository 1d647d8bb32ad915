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
//   map_shm / register_shm_seg / unregister_shm_seg / restore_shm_pipelined
//                  the same file mapped (with and without MAP_POPULATE: "populate"),
//                  registered READ_ONLY in segments ("seg_mb", $PIN_SHM_SEG_MB, default 64)
//                  from 1/4/8/16 threads, and the restore it decides (proxyd's
//                  checkpoint/direct_upload.py): those threads register, the main
//                  thread queues each segment's H2D copy the moment it is registered
//                  (two streams), wall time until all copies are done
//   touch_register_copy_seg
//                  the first dump's pool (pinned_pool.py): THREADS threads touch and
//                  register fresh 256 MiB (or $PIN_POOL_SEG_MB) segments while the main
//                  thread queues a D2H copy into each segment as soon as it is ready;
//                  "call_s"/"call_max_s": time spent inside cudaMemcpyAsync (if the
//                  driver serialises copies behind registrations, it shows here)
// Rates are GB/s (1e9 bytes per second); times are seconds.
#include <cuda_runtime.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
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

static void report_x(const char *what, size_t bytes, double s, int threads, const char *extra)
{
    printf("{\"bench\": \"%s\", \"bytes\": %zu, \"seconds\": %.6f, \"gbps\": %.3f, \"threads\": %d, %s}\n",
           what, bytes, s, bytes / s / 1e9, threads, extra);
    fflush(stdout);
}

static size_t env_mb(const char *name, size_t dflt)
{
    const char *v = getenv(name);
    return ((v && atol(v) > 0) ? (size_t)atol(v) : dflt) << 20;
}

// Segments [k*seg, ...) of p handed out to `threads` threads, each running
// prep(lo, len) (touch and/or register); the calling thread receives each
// segment index as soon as it is prepared (in completion order) and runs
// use(k, lo, len). Returns the summed and the longest time spent in use().
template <class Prep, class Use>
static void pipeline(size_t n, size_t seg, int threads, Prep prep, Use use, double *use_s, double *use_max)
{
    size_t nseg = (n + seg - 1) / seg;
    std::mutex mu;
    std::condition_variable cv;
    std::vector<size_t> ready;
    std::atomic<size_t> next{0};
    std::vector<std::thread> ts;
    for (int i = 0; i < threads; i++)
        ts.emplace_back([&] {
            for (size_t k; (k = next++) < nseg;) {
                size_t lo = k * seg, len = lo + seg > n ? n - lo : seg;
                prep(lo, len);
                std::lock_guard<std::mutex> g(mu);
                ready.push_back(k);
                cv.notify_one();
            }
        });
    *use_s = *use_max = 0;
    for (size_t got = 0; got < nseg;) {
        std::vector<size_t> mine;
        {
            std::unique_lock<std::mutex> g(mu);
            cv.wait(g, [&] { return !ready.empty(); });
            mine.swap(ready);
        }
        for (size_t k : mine) {
            size_t lo = k * seg, len = lo + seg > n ? n - lo : seg;
            double t = now();
            use(k, lo, len);
            t = now() - t;
            *use_s += t;
            if (t > *use_max)
                *use_max = t;
            got++;
        }
    }
    for (auto &t : ts)
        t.join();
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

// Restoring straight from an image in /dev/shm (issue 13, target 1): what
// registering the file's mapping in segments costs and how fast a restore
// that queues each segment's copy as soon as it is registered runs.
static void shm_segments(int fd, size_t n)
{
    size_t seg = env_mb("PIN_SHM_SEG_MB", 64);
    size_t nseg = (n + seg - 1) / seg;
    void *dev;
    if (cudaMalloc(&dev, n) != cudaSuccess) {
        printf("{\"bench\": \"restore_shm_pipelined\", \"error\": \"no %zu bytes of device memory\"}\n", n);
        return;
    }
    cudaStream_t st[2];
    CHECK(cudaStreamCreateWithFlags(&st[0], cudaStreamNonBlocking));
    CHECK(cudaStreamCreateWithFlags(&st[1], cudaStreamNonBlocking));
    char extra[160];
    for (int populate = 0; populate < 2; populate++) {
        for (int threads : {1, 4, 8, 16}) {
            for (int pass = 0; pass < 2; pass++) {   // 0: register alone, 1: the pipelined restore
                double t0 = now();
                void *r = mmap(nullptr, n, PROT_READ, MAP_SHARED | (populate ? MAP_POPULATE : 0), fd, 0);
                if (r == MAP_FAILED) {
                    perror("mmap");
                    return;
                }
                double t_map = now() - t0;
                std::atomic<int> failed{0};
                auto reg = [&](size_t lo, size_t len) {
                    if (cudaHostRegister((char *)r + lo, len, cudaHostRegisterPortable | cudaHostRegisterReadOnly) !=
                        cudaSuccess)
                        failed++;
                };
                double use_s, use_max;
                t0 = now();
                if (pass == 0) {
                    pipeline(n, seg, threads, reg, [](size_t, size_t, size_t) {}, &use_s, &use_max);
                } else {
                    pipeline(n, seg, threads, reg,
                             [&](size_t k, size_t lo, size_t len) {
                                 CHECK(cudaMemcpyAsync((char *)dev + lo, (char *)r + lo, len, cudaMemcpyHostToDevice,
                                                       st[k % 2]));
                             },
                             &use_s, &use_max);
                    CHECK(cudaStreamSynchronize(st[0]));
                    CHECK(cudaStreamSynchronize(st[1]));
                }
                double s = now() - t0;
                if (failed) {
                    printf("{\"bench\": \"register_shm_seg\", \"error\": \"%d of %zu segments refused\"}\n",
                           (int)failed, nseg);
                    cudaGetLastError();
                } else {
                    snprintf(extra, sizeof extra,
                             "\"seg_mb\": %zu, \"populate\": %d, \"map_s\": %.6f, \"call_s\": %.6f, \"call_max_s\": %.6f",
                             seg >> 20, populate, t_map, use_s, use_max);
                    report_x(pass ? "restore_shm_pipelined" : "register_shm_seg", n, s, threads, extra);
                }
                t0 = now();
                for (size_t k = 0; k < nseg; k++)
                    cudaHostUnregister((char *)r + k * seg);
                cudaGetLastError();
                if (!failed) {
                    snprintf(extra, sizeof extra, "\"seg_mb\": %zu, \"populate\": %d", seg >> 20, populate);
                    report_x("unregister_shm_seg", n, now() - t0, 1, extra);
                }
                munmap(r, n);
            }
        }
    }
    cudaStreamDestroy(st[0]);
    cudaStreamDestroy(st[1]);
    cudaFree(dev);
}

// The first dump's pool (issue 13, target 2): threads touch and register
// fresh segments while the main thread queues a device-to-host copy into
// each one as soon as it is pinned, as proxyd's pinned_pool + _read_runs do.
// If queueing a copy waits for the registrations in flight, call_s is large.
static void first_dump_pool(size_t n)
{
    void *dev;
    if (cudaMalloc(&dev, n) != cudaSuccess) {
        printf("{\"bench\": \"touch_register_copy_seg\", \"error\": \"no %zu bytes of device memory\"}\n", n);
        return;
    }
    cudaStream_t st[2];
    CHECK(cudaStreamCreateWithFlags(&st[0], cudaStreamNonBlocking));
    CHECK(cudaStreamCreateWithFlags(&st[1], cudaStreamNonBlocking));
    char extra[160];
    size_t segs[] = {env_mb("PIN_POOL_SEG_MB", 256), (size_t)64 << 20};
    for (size_t seg : segs) {
        for (int threads : {8, 16}) {
            for (int copy = 0; copy < 2; copy++) {
                void *p = fresh(n);
                size_t nseg = (n + seg - 1) / seg;
                double use_s, use_max;
                double t0 = now();
                pipeline(n, seg, threads,
                         [&](size_t lo, size_t len) {
                             memset((char *)p + lo, 0, len);
                             CHECK(cudaHostRegister((char *)p + lo, len, cudaHostRegisterPortable));
                         },
                         [&](size_t k, size_t lo, size_t len) {
                             if (copy)
                                 CHECK(cudaMemcpyAsync((char *)p + lo, (char *)dev + lo, len, cudaMemcpyDeviceToHost,
                                                       st[k % 2]));
                         },
                         &use_s, &use_max);
                CHECK(cudaStreamSynchronize(st[0]));
                CHECK(cudaStreamSynchronize(st[1]));
                double s = now() - t0;
                snprintf(extra, sizeof extra, "\"seg_mb\": %zu, \"copies\": %d, \"call_s\": %.6f, \"call_max_s\": %.6f",
                         seg >> 20, copy, use_s, use_max);
                report_x(copy ? "touch_register_copy_seg" : "touch_register_seg_ready", n, s, threads, extra);
                for (size_t k = 0; k < nseg; k++)
                    CHECK(cudaHostUnregister((char *)p + k * seg));
                munmap(p, n);
            }
        }
    }
    cudaStreamDestroy(st[0]);
    cudaStreamDestroy(st[1]);
    cudaFree(dev);
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
        // the file stays resident: the same in segments, 1/4/8/16 threads, with and without MAP_POPULATE
        shm_segments(fd, n);
        close(fd);
        unlink(path);
    }
    first_dump_pool(n);
    return 0;
}
