/* dlopen/dlmopen wrappers: whatever name a program loads the CUDA libraries
 * by, it gets the shim.
 *
 * LD_PRELOAD puts the shim in the process under the sonames libcuda.so.1 and
 * libcudart.so.13, so a plain dlopen("libcuda.so.1") already finds it (the
 * loader matches already-loaded objects by soname). Frameworks do not always
 * ask that way: CuPy and cuda-pathfinder dlopen NVIDIA's runtime by absolute
 * path (".../nvidia/cu13/lib/libcudart.so.13"), numba asks for "libcuda.so",
 * and others another soname version. Those requests would load the real
 * library next to the shim: the real libcuda.so would talk to the GPU behind
 * gpuproxy's back, and the real libcudart.so would keep its own registrations
 * beside the shim's runtime. So dlopen of any libcuda.so[.*] /
 * libcudart.so[.*] name or path answers a handle of the shim's own library
 * instead, and the real ones are never loaded, except NVIDIA's runtimes of
 * older majors (libcudart.so.12, .11.0), which run on the shim's driver API
 * (older_runtime_major below). The libraries' stand-ins answer by major:
 * libcublas.so.12 gets the shim's libcublas.so.12, and a major the shim has
 * no stand-in for (libcudnn.so.8) is refused with one line (major_path).
 * (NVIDIA's runtime linked
 * statically into a program or library cannot be replaced this way; it
 * runs on the shim's driver API and private tables: export_tables.c.)
 *
 * Every other name goes to the next dlopen (libc's) as a tail call: glibc's
 * dlopen resolves relative names with the *caller's* RUNPATH and $ORIGIN,
 * which it finds from its return address (dlopen(3), "the calling object").
 * A tail call leaves the original caller's return address in place; a normal
 * call would make the shim the caller. tests/test_dlopen.py checks this with
 * a library whose RUNPATH finds its dependency.
 *
 * Flags pass through unchanged: RTLD_NOLOAD on a CUDA name answers the shim's
 * handle (the shim is loaded: it is what stands for that library here).
 * dlmopen into the base namespace behaves like dlopen; into another
 * namespace it loads the shim's file there (LD_PRELOAD applies to the base
 * namespace only, so the real library would otherwise load in it). */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "gp_shim.h"

/* The runtime major the shim stands in for (libcudart.so.13). */
#define GP_CUDART_MAJOR 13

typedef void *(*dlopen_fn)(const char *, int);
typedef void *(*dlmopen_fn)(Lmid_t, const char *, int);

/* Loaded in place of a refused library major, so that dlopen answers NULL
 * and dlerror() names the reason (no such file exists). */
#define GP_REFUSED_NAME "/gpuproxy: this CUDA library major has no stand-in (not supported)/lib.so"

static dlopen_fn next_dlopen;
static dlmopen_fn next_dlmopen;
static char shim_dir[PATH_MAX];

/* An older runtime major (libcudart.so.12, libcudart.so.11.0, their full
 * versions) is not the shim's: its functions keep that version's structure
 * layouts (cudaDeviceProp of 12.x has fields 13 dropped, so 12.x code reading
 * 13's layout gets wrong values without an error) and its symbols carry that
 * version's node (cudaMalloc@libcudart.so.12). So NVIDIA's runtime of that
 * major is loaded as asked, and runs on the shim's driver API: libcuda.so.1,
 * which it dlopens, is the shim (docs/compatibility.md, "Programs built for
 * CUDA 11 and 12" says why this and not a converting stand-in). `rest` is
 * what follows "libcudart.so": "", ".13", ".13.0.96", ".12", ... */
static int older_runtime_major(const char *rest)
{
    if (rest[0] != '.' || rest[1] < '0' || rest[1] > '9')
        return 0;
    return atoi(rest + 1) < GP_CUDART_MAJOR;
}

/* The library stand-ins (docs/libraries.md) are redirected the same way:
 * PyTorch loads libcublas.so.13 through its RUNPATH (nvidia/cu13/lib), CuPy
 * by absolute path, PyTorch's c10 and nvidia-smi-like tools dlopen
 * libnvidia-ml.so.1: all of them get the stand-in, never NVIDIA's library in
 * the app (only the worker loads that).
 *
 * The library a name stands for: an index into shim_files (1 libcuda, 2
 * libcudart, 3 libcublas, 4 libcublasLt, 5 libnvidia-ml, 6 libcudnn, 7
 * libcufft, 8 libcurand, 9 libcusparse, 10 libcusolver, 11 libnccl), 0 none.
 * cuDNN 9's sub-libraries (libcudnn_graph.so.9, libcudnn_ops.so.9, ...)
 * are dlopened by NVIDIA's libcudnn.so.9 only, which the app never loads;
 * their names do not match "libcudnn.so" and pass through. Matches
 * the file name part only: "libcuda.so", "libcuda.so.1", "libcuda.so.580.95",
 * "/opt/x/libcudart.so.13" -- and not "libcudadebugger.so.1" or
 * "libcudart_static.a". */
static int cuda_lib_kind(const char *file)
{
    if (!file)
        return 0;
    const char *base = strrchr(file, '/');
    base = base ? base + 1 : file;
    static const struct { const char *stem; int kind; } names[] = {
        {"libcuda.so", 1},
        {"libcudart.so", 2},
        {"libcublas.so", 3},
        {"libcublasLt.so", 4},
        {"libnvidia-ml.so", 5},
        {"libcudnn.so", 6},
        {"libcufft.so", 7},
        {"libcurand.so", 8},
        {"libcusparse.so", 9},
        {"libcusolver.so", 10},
        {"libnccl.so", 11},
    };
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        size_t n = strlen(names[i].stem);
        if (strncmp(base, names[i].stem, n) == 0 && (base[n] == '\0' || base[n] == '.')) {
            if (names[i].kind == 2 && older_runtime_major(base + n))
                return 0;
            return names[i].kind;
        }
    }
    return 0;
}

static void resolve_next(void)
{
    /* Racing threads store the same values. */
    if (!next_dlopen)
        next_dlopen = (dlopen_fn)dlsym(RTLD_NEXT, "dlopen");
    if (!next_dlmopen)
        next_dlmopen = (dlmopen_fn)dlsym(RTLD_NEXT, "dlmopen");
}

/* Full path of the shim library standing for `kind`, or NULL. Both shim
 * libraries live in one folder (gpuproxy/interceptor/lib); this file is in
 * libcuda.so.1, so dladdr on one of its functions names that folder. */
static const char *shim_path(int kind, char *buf, size_t cap)
{
    if (!shim_dir[0]) {
        Dl_info info;
        if (!dladdr((void *)&cuda_lib_kind, &info) || !info.dli_fname)
            return NULL;
        char tmp[PATH_MAX];
        snprintf(tmp, sizeof tmp, "%s", info.dli_fname);
        char *slash = strrchr(tmp, '/');
        if (!slash)
            return NULL;
        *slash = '\0';
        snprintf(shim_dir, sizeof shim_dir, "%s", tmp);
    }
    static const char *const shim_files[] = {NULL, "libcuda.so.1", "libcudart.so.13", "libcublas.so.13",
                                             "libcublasLt.so.13", "libnvidia-ml.so.1", "libcudnn.so.9",
                                             "libcufft.so.12", "libcurand.so.10", "libcusparse.so.12",
                                             "libcusolver.so.12", "libnccl.so.2"};
    if (kind < 1 || kind > (int)(sizeof shim_files / sizeof shim_files[0]) - 1)
        return NULL;
    snprintf(buf, cap, "%s/%s", shim_dir, shim_files[kind]);
    return buf;
}

/* Library majors (specs/abi/library_majors.yaml, issue 24): a name with a
 * major ("libcublas.so.12", ".../libcufft.so.11.2.1.3") gets the stand-in of
 * that soname when the shim has one (libcublas.so.12, built from the 13 spec:
 * the same ABI, checked per major by tests/test_oldcuda_libs.py), else it is
 * refused: a stand-in of another major would take that ABI's calls with no
 * error (cuDNN 8 is not cuDNN 9). Unversioned names ("libcublas.so") and
 * the driver, runtime, NVML and NCCL keep the mapping of shim_path. Returns
 * 1 with buf set, 0 for "use shim_path", -1 for "refuse". */
static int major_path(int kind, const char *file, char *buf, size_t cap)
{
    if (kind < 3 || kind == 5 || kind > 10 || !shim_path(kind, buf, cap))
        return 0;
    const char *base = strrchr(file, '/');
    base = base ? base + 1 : file;
    const char *so = strstr(base, ".so.");
    if (!so || so[4] < '0' || so[4] > '9')
        return 0;
    int major = atoi(so + 4);
    char *slash = strrchr(buf, '/');
    snprintf(slash + 1, cap - (size_t)(slash + 1 - buf), "%.*s.so.%d", (int)(so - base), base, major);
    return access(buf, R_OK) == 0 ? 1 : -1;
}

static void note_redirect(const char *file, const char *to)
{
    if (getenv("GPUPROXY_DEBUG"))
        fprintf(stderr, "gpuproxy: dlopen(\"%s\") -> %s\n", file, to);
}

GP_EXPORT void *dlopen(const char *file, int mode)
{
    resolve_next();
    int kind = cuda_lib_kind(file);
    if (kind) {
        char path[PATH_MAX];
        int m = major_path(kind, file, path, sizeof path);
        if (m < 0) {
            if (!(mode & RTLD_NOLOAD))     /* a probe whether it is loaded: it is not, quietly */
                fprintf(stderr, "gpuproxy: dlopen(\"%s\"): no stand-in for this library major: not supported "
                        "(docs/compatibility.md, library majors)\n", file);
            return next_dlopen(GP_REFUSED_NAME, mode);  /* NULL, and dlerror() says why */
        }
        if (m > 0 || shim_path(kind, path, sizeof path)) {
            note_redirect(file, path);
            return next_dlopen(path, mode);
        }
    }
    return next_dlopen(file, mode);  /* tail call: see the file comment */
}

GP_EXPORT void *dlmopen(Lmid_t lmid, const char *file, int mode)
{
    resolve_next();
    int kind = cuda_lib_kind(file);
    if (kind) {
        char path[PATH_MAX];
        int m = major_path(kind, file, path, sizeof path);
        if (m < 0) {
            if (!(mode & RTLD_NOLOAD))     /* a probe whether it is loaded: it is not, quietly */
                fprintf(stderr, "gpuproxy: dlmopen(\"%s\"): no stand-in for this library major: not supported "
                        "(docs/compatibility.md, library majors)\n", file);
            return next_dlmopen(lmid, GP_REFUSED_NAME, mode);  /* NULL, and dlerror() says why */
        }
        if (m > 0 || shim_path(kind, path, sizeof path)) {
            note_redirect(file, path);
            return next_dlmopen(lmid, path, mode);
        }
    }
    return next_dlmopen(lmid, file, mode);
}
