// What page-locked host memory shared between processes costs (issue 13,
// targets 1 and 2): could a worker restore from, or dump into, host memory
// that another process page-locked long before, without paying the pinning
// again?
//
// A holder process creates GIB GiB of page-locked host memory with the VMM
// API (cuMemCreate, location CU_MEM_LOCATION_TYPE_HOST_NUMA, id 0, exportable
// as a POSIX file descriptor: cuda.h, cuMemCreate), maps it for the device
// and the CPU, fills it, and exports it. A second process (this program run
// again with the descriptor inherited across exec: no CUDA state crosses)
// imports it (cuMemImportFromShareableHandle), maps it and copies it to the
// device and back. With "orphan" the holder has destroyed its context and
// exited before the import: does the descriptor alone keep the memory?
//
//   host_share_cost GIB [alive|orphan]      -> one JSON line per process
//
// Timing is reported, never checked; the data is checked (a pattern the
// holder wrote, read back by the device in the importer).
#include <cuda.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define CK(x)                                                                       \
    do {                                                                            \
        CUresult r_ = (x);                                                          \
        if (r_ != CUDA_SUCCESS) {                                                   \
            const char *s_ = "?";                                                   \
            cuGetErrorName(r_, &s_);                                                \
            fprintf(stderr, "%s: %s (line %d)\n", #x, s_, __LINE__);                \
            exit(1);                                                                \
        }                                                                           \
    } while (0)

static double now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

static void map_both(CUdeviceptr *va, CUmemGenericAllocationHandle h, size_t n)
{
    CK(cuMemAddressReserve(va, n, 0, 0, 0));
    CK(cuMemMap(*va, n, 0, h, 0));
    CUmemAccessDesc acc[2];
    memset(acc, 0, sizeof acc);
    acc[0].location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    acc[0].location.id = 0;
    acc[0].flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    acc[1].location.type = CU_MEM_LOCATION_TYPE_HOST_NUMA;
    acc[1].location.id = 0;
    acc[1].flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    CK(cuMemSetAccess(*va, n, acc, 2));
}

// word i of the buffer holds i * 2654435761 (sampled, every 1 MiB)
static const size_t STEP = 1 << 20;

static int importer(int fd, size_t n, const char *mode)
{
    CUcontext ctx;
    CK(cuInit(0));
    CK(cuCtxCreate(&ctx, NULL, 0, 0));
    double t0 = now();
    CUmemGenericAllocationHandle h;
    CK(cuMemImportFromShareableHandle(&h, (void *)(uintptr_t)fd, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR));
    CUdeviceptr va;
    map_both(&va, h, n);
    double t1 = now();
    CUdeviceptr dev;
    CK(cuMemAlloc(&dev, n));
    CK(cuMemcpyHtoD(dev, (void *)va, n));       // warm (first touch of the device's page tables)
    CK(cuCtxSynchronize());
    double t2 = now();
    CK(cuMemcpyHtoD(dev, (void *)va, n));
    CK(cuCtxSynchronize());
    double t3 = now();
    int bad = 0;
    for (size_t off = 0; off + 8 <= n; off += STEP) {
        unsigned long long w = 0;
        CK(cuMemcpyDtoH(&w, dev + off, 8));
        if (w != (off / 8) * 2654435761ull)
            bad++;
    }
    double t4 = now();
    CK(cuMemcpyDtoH((void *)va, dev, n));
    CK(cuCtxSynchronize());
    double t5 = now();
    printf("{\"process\": \"importer\", \"mode\": \"%s\", \"gib\": %.2f, \"import_map_s\": %.4f, "
           "\"h2d_first_s\": %.4f, \"h2d_s\": %.4f, \"h2d_gbps\": %.2f, \"d2h_s\": %.4f, \"d2h_gbps\": %.2f, "
           "\"pattern_mismatches\": %d}\n",
           mode, n / 1073741824.0, t1 - t0, t2 - t1, t3 - t2, n / (t3 - t2) / 1e9, t5 - t4, n / (t5 - t4) / 1e9,
           bad);
    CK(cuMemUnmap(va, n));
    CK(cuMemAddressFree(va, n));
    CK(cuMemRelease(h));
    return bad ? 1 : 0;
}

int main(int argc, char **argv)
{
    if (argc >= 5 && !strcmp(argv[1], "--import"))
        return importer(atoi(argv[2]), strtoull(argv[3], NULL, 10), argv[4]);
    if (argc < 2) {
        fprintf(stderr, "usage: host_share_cost GIB [alive|orphan]\n");
        return 2;
    }
    const char *mode = argc > 2 ? argv[2] : "alive";
    CUcontext ctx;
    CK(cuInit(0));
    CK(cuCtxCreate(&ctx, NULL, 0, 0));
    CUmemAllocationProp prop;
    memset(&prop, 0, sizeof prop);
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type = CU_MEM_LOCATION_TYPE_HOST_NUMA;
    prop.location.id = 0;
    prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
    size_t gran = 0;
    CK(cuMemGetAllocationGranularity(&gran, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM));
    size_t n = (size_t)(atof(argv[1]) * 1073741824.0);
    n = (n + gran - 1) / gran * gran;
    double t0 = now();
    CUmemGenericAllocationHandle h;
    CK(cuMemCreate(&h, n, &prop, 0));
    double t1 = now();
    CUdeviceptr va;
    map_both(&va, h, n);
    double t2 = now();
    CK(cuMemsetD8(va, 0, n));                  // the device writes it all (populates nothing on the CPU side)
    CK(cuCtxSynchronize());
    double t3 = now();
    unsigned long long *p = (unsigned long long *)va;
    for (size_t off = 0; off + 8 <= n; off += STEP)
        p[off / 8] = (off / 8) * 2654435761ull;    // the CPU writes through the same address
    int fd = -1;
    CK(cuMemExportToShareableHandle(&fd, h, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0));
    double t4 = now();
    printf("{\"process\": \"holder\", \"gib\": %.2f, \"granularity\": %zu, \"create_s\": %.4f, \"map_s\": %.4f, "
           "\"device_memset_s\": %.4f, \"export_s\": %.6f}\n",
           n / 1073741824.0, gran, t1 - t0, t2 - t1, t3 - t2, t4 - t3);
    fflush(stdout);
    fcntl(fd, F_SETFD, 0);                      // inherited across exec
    char sfd[16], sn[32];
    snprintf(sfd, sizeof sfd, "%d", fd);
    snprintf(sn, sizeof sn, "%zu", n);
    pid_t child = fork();
    if (child == 0) {
        if (!strcmp(mode, "orphan"))
            usleep(1500 * 1000);                // the holder is gone by then
        execl("/proc/self/exe", argv[0], "--import", sfd, sn, mode, (char *)NULL);
        _exit(127);
    }
    if (!strcmp(mode, "orphan")) {
        CK(cuMemUnmap(va, n));
        CK(cuMemRelease(h));
        CK(cuCtxDestroy(ctx));
        return 0;                               // the importer's descriptor is all that is left
    }
    int st = 0;
    waitpid(child, &st, 0);
    return WIFEXITED(st) ? WEXITSTATUS(st) : 1;
}
