/* Host memory that the shim shares with proxyd, and what the client knows of
 * device address ranges.
 *
 * When proxyd runs on the same host (it says so in its HELLO answer, after
 * opening the staging segment by name), bulk data travels through POSIX shared
 * memory instead of the socket:
 *  - segment 0 is a staging area for copies from/to pageable memory;
 *  - every cudaMallocHost / cuMemHostAlloc allocation is a segment of its own,
 *    which proxyd maps and page-locks (cuMemHostRegister), so copies from and
 *    to it are DMA without any extra copy, as with real pinned memory.
 * Segments are named /gpuproxy-<public id>-<n> (under /dev/shm; a hash of the
 * session token, shm_name.c, so the name gives the token away to nobody); the shim
 * unlinks them when they are freed and at exit.
 *
 * HELLO's client map and the worker's answer are this file's too: transport.c
 * calls them through gp_transport_hooks, which this file's constructor sets.
 *
 * Locking: all under gp_lock. */
#define _GNU_SOURCE
#include "gp_memory.h"
#include "gp_wire.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <sys/file.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#define GP_MAX_SEGS 4096

typedef struct gp_seg {
    uint32_t id;
    void *base;
    size_t size;
    char name[96];
    int kind;           /* GP_HM_*: 0 for staging and unmapped pinned memory */
    unsigned flags;     /* the flags the application passed */
    void *user;         /* the application's pointer (cuMemHostRegister: not page-aligned) */
    size_t user_size;
} gp_seg;

static gp_seg segs[GP_MAX_SEGS];
static int nsegs;
static uint32_t next_seg_id;
static int shm_ok;              /* proxyd can open our segments */
static int atexit_set;

static uint64_t arena_base, arena_size;

/* Device ranges outside the arena: module variables, noted when the app gets
 * their address (cuModuleGetGlobal, cudaGetSymbolAddress, the runtime's
 * symbol copies). Sorted by base, grown as needed: XLA keeps its constants
 * in module variables, so a JAX process notes thousands; a fixed table
 * dropped the later ones and a copy then took such an address for host
 * memory. Variables do not overlap, so the range holding an address is the
 * one with the greatest base not above it. Owned by this file, under gp_lock
 * (recursive: callers already hold it). */
typedef struct { uint64_t base, size; } gp_range;
static gp_range *ranges;
static size_t nranges, ranges_cap;

static int driver_version = 13000;   /* the worker's, from its HELLO answer */

int gp_driver_version(void) { return driver_version; }

/* The fast channel's name (channel.c names it the same way): removed here
 * too, so that it goes at exit even when no daemon ever answered. */
static void unlink_chan_name(void)
{
    char name[96];
    snprintf(name, sizeof name, "/gpuproxy-%s-chan", gp_shm_id());
    shm_unlink(name);
}

static void unlink_all(void)
{
    for (int i = 0; i < nsegs; i++)
        if (segs[i].name[0])
            shm_unlink(segs[i].name);
    unlink_chan_name();
}

/* Proof of life for the segments of this process: a shared flock(2) on the
 * staging segment, held by an open descriptor until the process ends (the
 * kernel drops it however the process dies, or when it execs: O_CLOEXEC).
 * A proxyd that starts later removes the segments of a token whose lock it
 * can take exclusively: nobody holds them any more, in whatever pid
 * namespace (docs/protocol.md, "Shared memory"). */
static int life_fd = -1;

static void hold_life_lock(const char *name)
{
    if (life_fd >= 0)
        return;
    int fd = shm_open(name, O_RDONLY | O_CLOEXEC, 0);
    if (fd < 0)
        return;
    if (flock(fd, LOCK_SH) < 0) {
        close(fd);
        return;
    }
    life_fd = fd;
}



static gp_seg *seg_create(size_t size)
{
    if (nsegs == GP_MAX_SEGS)
        return NULL;
    gp_seg *s = &segs[nsegs];
    memset(s, 0, sizeof *s);
    s->id = next_seg_id++;
    snprintf(s->name, sizeof s->name, "/gpuproxy-%s-%u", gp_shm_id(), s->id);
    int fd = shm_open(s->name, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    if (fd < 0)
        return NULL;
    if (ftruncate(fd, (off_t)size) < 0) {
        close(fd);
        shm_unlink(s->name);
        return NULL;
    }
    void *p = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    if (p == MAP_FAILED) {
        shm_unlink(s->name);
        return NULL;
    }
    s->base = p;
    s->size = size;
    nsegs++;
    if (!atexit_set) {
        atexit(unlink_all);
        atexit_set = 1;
    }
    return s;
}

static gp_seg *staging;

/* proxyd never answered the HELLO: no daemon maps these segments, so their
 * names go now, and a process killed later leaves nothing behind. A later
 * HELLO (a daemon that came up) then uses the socket for data. */
static void hostmem_unreachable(void)
{
    if (staging && staging->name[0]) {
        shm_unlink(staging->name);
        staging->name[0] = 0;
    }
    unlink_chan_name();
}

size_t gp_staging_size(void) { return (staging && shm_ok) ? staging->size : 0; }
void *gp_staging_base(void) { return staging ? staging->base : NULL; }
uint32_t gp_staging_id(void) { return staging ? staging->id : 0; }
int gp_shm_ok(void) { return shm_ok; }

/* Called while building HELLO: a map describing this client. hello_attach:
 * the HELLO re-attaches an existing session (after a restore or after
 * parking): proxyd maps our shared memory again. */
static void hello_info(gp_buf *b, int hello_attach)
{
    long mb = 64;
    const char *e = getenv("GPUPROXY_STAGING_MB");
    if (e && *e)
        mb = atol(e);
    int use_shm = !(getenv("GPUPROXY_SHM") && strcmp(getenv("GPUPROXY_SHM"), "0") == 0);
    if (use_shm && !staging && mb > 0) {
        staging = seg_create((size_t)mb << 20);
        if (staging)
            hold_life_lock(staging->name);
    }
    if (!atexit_set) {
        atexit(unlink_all);      /* also removes a channel that no daemon enabled */
        atexit_set = 1;
    }
    char exe[512] = "";
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    exe[n > 0 ? n : 0] = 0;
    size_t chan_size = 0;
    const char *chan = use_shm ? gp_chan_create(gp_session_token(), &chan_size) : NULL;
    char pidns[128] = "";
    ssize_t k = readlink("/proc/self/ns/pid", pidns, sizeof pidns - 1);
    pidns[k > 0 ? k : 0] = 0;
    mp_map(b, hello_attach ? 8 : 7);
    if (hello_attach) {
        mp_str(b, "attach");
        mp_bool(b, 1);
    }
    mp_str(b, "pidns");
    mp_str(b, pidns);
    mp_str(b, "pid");
    mp_int(b, gp_session_pid());
    mp_str(b, "token");
    mp_str(b, gp_session_token());
    mp_str(b, "version");
    mp_str(b, GP_VERSION);
    mp_str(b, "exe");
    mp_str(b, exe);
    mp_str(b, "channel");
    if (chan) {
        mp_array(b, 2);
        mp_str(b, chan);
        mp_uint(b, chan_size);
    } else {
        mp_nil(b);
    }
    mp_str(b, "staging");
    if (staging) {
        mp_array(b, 3);
        mp_uint(b, staging->id);
        mp_str(b, staging->name);
        mp_uint(b, staging->size);
    } else {
        mp_nil(b);
    }
}

/* Called with the HELLO answer's first out: {"arena": [base, size], "shm": bool, ...}. */
static void hello_reply(gp_rd *rd)
{
    int chan_ok = 0;
    uint32_t n = mp_get_map(rd);
    for (uint32_t i = 0; i < n && !rd->err; i++) {
        size_t klen;
        const uint8_t *k = mp_get_bytes(rd, &klen);
        if (k && klen == 5 && !memcmp(k, "arena", 5)) {
            uint32_t m = mp_get_array(rd);
            arena_base = m > 0 ? mp_get_uint(rd) : 0;
            arena_size = m > 1 ? mp_get_uint(rd) : 0;
            for (uint32_t j = 2; j < m; j++)
                mp_skip(rd);
        } else if (k && klen == 3 && !memcmp(k, "shm", 3)) {
            shm_ok = (int)mp_get_int(rd);
        } else if (k && klen == 7 && !memcmp(k, "channel", 7)) {
            chan_ok = (int)mp_get_int(rd);
        } else if (k && klen == 14 && !memcmp(k, "driver_version", 14)) {
            int v = (int)mp_get_int(rd);
            if (v > 0)
                driver_version = v;
        } else {
            mp_skip(rd);
        }
    }
    gp_chan_enable(chan_ok);
    if (!shm_ok && staging) {
        /* proxyd cannot see our shared memory (other host or namespace):
         * everything goes through the socket. */
        shm_unlink(staging->name);
        staging->name[0] = 0;
    }
}

__attribute__((constructor)) static void register_hello_hooks(void)
{
    gp_transport_hooks.hello_info = hello_info;
    gp_transport_hooks.hello_reply = hello_reply;
    gp_transport_hooks.unreachable = hostmem_unreachable;
}

/* Parking (park.c): every named segment becomes private memory with the same
 * bytes at the same address; going on shares it again under its name. */
void gp_hostmem_unshare(void)
{
    for (int i = 0; i < nsegs; i++)
        if (segs[i].name[0] && gp_shm_to_private(segs[i].base, segs[i].size, segs[i].name) < 0)
            gp_log("cannot make segment %s private before a checkpoint", segs[i].name);
    /* the proof-of-life descriptor names the (now unlinked) staging segment:
     * CRIU would have to save it as a deleted file. Taken again on resharing. */
    if (life_fd >= 0) {
        close(life_fd);
        life_fd = -1;
    }
}

int gp_hostmem_reshare(void)
{
    int bad = 0;
    for (int i = 0; i < nsegs; i++)
        if (segs[i].name[0] && gp_shm_from_private(segs[i].base, segs[i].size, segs[i].name) < 0) {
            gp_log("cannot share segment %s again after a checkpoint", segs[i].name);
            bad = 1;
        }
    if (staging && staging->name[0])
        hold_life_lock(staging->name);
    return bad;
}

void *gp_host_alloc(size_t size)
{
    if (size == 0)
        size = 1;
    if (!shm_ok) {
        void *p = NULL;
        if (posix_memalign(&p, 4096, size) != 0)
            return NULL;
        /* remember it as a segment without a name so gp_host_free finds it */
        if (nsegs == GP_MAX_SEGS) {
            free(p);
            return NULL;
        }
        gp_seg *s = &segs[nsegs++];
        memset(s, 0, sizeof *s);
        s->id = next_seg_id++;
        s->base = p;
        s->size = size;
        s->name[0] = 0;
        return p;
    }
    size_t rounded = (size + 4095) & ~(size_t)4095;
    gp_seg *s = seg_create(rounded);
    return s ? s->base : NULL;
}

static int seg_find(const void *p)
{
    uintptr_t a = (uintptr_t)p;
    for (int i = 0; i < nsegs; i++)
        if (a >= (uintptr_t)segs[i].base && a < (uintptr_t)segs[i].base + segs[i].size)
            return i;
    return -1;
}

int gp_host_segment(const void *p, uint32_t *id, const char **name, size_t *size)
{
    int i = seg_find(p);
    if (i < 0 || segs[i].base != p)
        return -1;
    *id = segs[i].id;
    *name = segs[i].name;
    *size = segs[i].size;
    return 0;
}

int gp_host_free(void *p)
{
    int i = seg_find(p);
    if (i < 0 || segs[i].base != p)
        return -1;
    if (segs[i].kind == GP_HM_REGISTERED) {
        /* the application's own memory: it stays, private again */
        if (gp_shm_to_private(segs[i].base, segs[i].size, segs[i].name) < 0)
            gp_log("cannot make registered memory at %p private again", segs[i].base);
    } else if (segs[i].name[0]) {
        munmap(segs[i].base, segs[i].size);
        shm_unlink(segs[i].name);
    } else {
        free(segs[i].base);
    }
    segs[i] = segs[--nsegs];
    return 0;
}

/* Finds the shared segment holding p (never the staging segment): segment
 * id, offset of p inside it, and bytes available from p to the segment end. */
int gp_host_lookup(const void *p, uint32_t *seg, uint64_t *off, uint64_t *avail)
{
    if (!shm_ok)
        return -1;
    int i = seg_find(p);
    if (i < 0 || !segs[i].name[0] || &segs[i] == staging)
        return -1;
    *seg = segs[i].id;
    *off = (uint64_t)((uintptr_t)p - (uintptr_t)segs[i].base);
    *avail = segs[i].size - *off;
    return 0;
}

#ifndef MAP_FIXED_NOREPLACE
#define MAP_FIXED_NOREPLACE 0x100000      /* linux/mman.h (4.17) */
#endif

/* Holds the pages of ranges[i] in this process as inaccessible, unbacked
 * memory. With unified addressing natively the host and the device share
 * one address space, so no host memory is ever at a device address; here
 * the addresses come from the worker's driver (its context zone lies where
 * that process's mmaps go, as this process's do), and a host buffer that
 * later landed on a variable's page would be taken for device memory by
 * gp_is_device_ptr. Reserved, nothing of this process lands there. Pages
 * shared with the neighbouring ranges were held when those were noted.
 * Something of this process already there (a mapping made before the
 * variable's address was known) is said once: a pointer into it is
 * ambiguous, and the shim takes it for the device's, the address the
 * application was given. */
static void reserve_range(size_t i)
{
    static int said;
    uint64_t pg = (uint64_t)sysconf(_SC_PAGESIZE);
    uint64_t lo = ranges[i].base & ~(pg - 1);
    uint64_t hi = (ranges[i].base + ranges[i].size + pg - 1) & ~(pg - 1);
    if (i > 0 && ((ranges[i - 1].base + ranges[i - 1].size - 1) & ~(pg - 1)) == lo)
        lo += pg;
    if (i + 1 < nranges && (ranges[i + 1].base & ~(pg - 1)) < hi)
        hi = ranges[i + 1].base & ~(pg - 1);
    if (lo >= hi)
        return;
    void *p = mmap((void *)(uintptr_t)lo, hi - lo, PROT_NONE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED_NOREPLACE, -1, 0);
    if (p == MAP_FAILED) {
        if (errno == EEXIST && !said) {
            said = 1;
            fprintf(stderr, "gpuproxy: the device address 0x%llx (a module variable's) lies in memory this "
                    "process had already mapped; pointers into that memory are taken for device memory\n",
                    (unsigned long long)ranges[i].base);
        }
        return;
    }
    if ((uint64_t)(uintptr_t)p != lo)       /* a kernel before 4.17 took the address as a hint */
        munmap(p, hi - lo);
}

/* The number of ranges whose base is at most a (binary search). */
static size_t ranges_upto(uint64_t a)
{
    size_t lo = 0, hi = nranges;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (ranges[mid].base <= a)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

void gp_note_device_range(uint64_t base, uint64_t size)
{
    size_t i = ranges_upto(base);
    if (i > 0 && ranges[i - 1].base == base) {
        ranges[i - 1].size = size;
        return;
    }
    if (nranges == ranges_cap) {
        size_t cap = ranges_cap ? 2 * ranges_cap : 256;
        gp_range *r = realloc(ranges, cap * sizeof *r);
        if (!r) {       /* out of memory: the address is taken for device memory only
                         * where it is not mapped in this process (gp_copy_any) */
            fprintf(stderr, "gpuproxy: out of memory noting the device range at 0x%llx\n",
                    (unsigned long long)base);
            return;
        }
        ranges = r;
        ranges_cap = cap;
    }
    memmove(&ranges[i + 1], &ranges[i], (nranges - i) * sizeof *ranges);
    ranges[i].base = base;
    ranges[i].size = size;
    nranges++;
    if (size)
        reserve_range(i);
}

int gp_is_device_ptr(const void *p)
{
    uint64_t a = (uint64_t)(uintptr_t)p;
    if (arena_size && a >= arena_base && a < arena_base + arena_size)
        return 1;
    size_t i = ranges_upto(a);
    return i > 0 && a - ranges[i - 1].base < ranges[i - 1].size;
}

/* ------------------------------------------------ memory the GPU reaches
 *
 * Host memory that kernels read and write directly (docs/host-memory.md):
 * page-locked allocations (cuMemHostAlloc and cuMemAllocHost: with unified
 * addressing every one of them is mapped, CUDA Driver API, "Unified
 * Addressing"), managed allocations (cuMemAllocManaged) and the
 * application's own memory registered with cuMemHostRegister. Each is a
 * shared segment mapped at the same virtual address in the application and
 * in its worker, which registers it with the driver there: the device
 * pointer the driver gives it is that same address (unified addressing), so
 * a pointer the application holds is valid in kernels, and both processes
 * see the same bytes.
 *
 * New allocations take addresses in a window of their own, far from where
 * the kernel puts mmap()s and heaps and from proxyd's arena slots
 * (0x2000_0000_0000 up), so that the worker finds the range free too:
 * GPUPROXY_HOSTMAP_BASE (hex) moves it. Addresses are taken first fit, in
 * 64 KiB steps. Locking: all under gp_lock. */

#define GP_HM_WINDOW_DEFAULT 0x100000000000ull      /* 16 TiB */
#define GP_HM_WINDOW_SIZE    0x100000000000ull
#define GP_HM_ALIGN          (64u << 10)

static uint64_t window_base(void)
{
    static uint64_t base;
    if (!base) {
        const char *e = getenv("GPUPROXY_HOSTMAP_BASE");
        base = (e && *e) ? strtoull(e, NULL, 16) : GP_HM_WINDOW_DEFAULT;
        base &= ~(uint64_t)(GP_HM_ALIGN - 1);
    }
    return base;
}

/* Lowest address >= from in the window where size bytes overlap no segment. */
static uint64_t window_fit(uint64_t from, size_t size)
{
    uint64_t a = from;
    for (int pass = 0; pass < nsegs + 1; pass++) {
        int moved = 0;
        for (int i = 0; i < nsegs; i++) {
            uint64_t b = (uint64_t)(uintptr_t)segs[i].base, e = b + segs[i].size;
            if (a < e && b < a + size) {
                a = (e + GP_HM_ALIGN - 1) & ~(uint64_t)(GP_HM_ALIGN - 1);
                moved = 1;
            }
        }
        if (!moved)
            break;
    }
    return a;
}

static int open_new_seg(gp_seg *s, size_t size)
{
    snprintf(s->name, sizeof s->name, "/gpuproxy-%s-%u", gp_shm_id(), s->id);
    int fd = shm_open(s->name, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    if (fd < 0)
        return -1;
    if (ftruncate(fd, (off_t)size) < 0) {
        close(fd);
        shm_unlink(s->name);
        return -1;
    }
    return fd;
}

static gp_seg *new_slot(void)
{
    if (nsegs == GP_MAX_SEGS)
        return NULL;
    gp_seg *s = &segs[nsegs];
    memset(s, 0, sizeof *s);
    s->id = next_seg_id++;
    return s;
}

static void remember(gp_seg *s)
{
    (void)s;     /* s is segs[nsegs], filled in */
    nsegs++;
    if (!atexit_set) {
        atexit(unlink_all);
        atexit_set = 1;
    }
}

/* A new segment of size bytes (zero-filled, as cuMemHostAlloc's memory is
 * not, but cuMemAllocManaged's is not promised either) at a window address. */
void *gp_hostmap_alloc(size_t size, int kind, unsigned flags)
{
    if (!shm_ok)
        return NULL;
    if (size == 0)
        size = 1;
    size_t len = (size + 4095) & ~(size_t)4095;
    gp_seg *s = new_slot();
    if (!s)
        return NULL;
    int fd = open_new_seg(s, len);
    if (fd < 0)
        return NULL;
    uint64_t end = window_base() + GP_HM_WINDOW_SIZE;
    uint64_t a = window_base();
    void *p = MAP_FAILED;
    /* something of the application's may sit in the window: skip it */
    for (int tries = 0; tries < 64 && p == MAP_FAILED; tries++) {
        a = window_fit(a, len);
        if (a + len > end)
            break;
        p = mmap((void *)(uintptr_t)a, len, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED_NOREPLACE, fd, 0);
        if (p != MAP_FAILED && p != (void *)(uintptr_t)a) {
            munmap(p, len);      /* a kernel older than 4.17 took the address as a hint */
            p = MAP_FAILED;
        }
        if (p == MAP_FAILED)
            a += (len + GP_HM_ALIGN - 1) & ~(uint64_t)(GP_HM_ALIGN - 1);
    }
    close(fd);
    if (p == MAP_FAILED) {
        shm_unlink(s->name);
        return NULL;
    }
    s->base = p;
    s->size = len;
    s->kind = kind;
    s->flags = flags;
    s->user = p;
    s->user_size = size;
    remember(s);
    return p;
}

/* cuMemHostRegister: the application's pages [p, p + size), rounded out to
 * whole pages, become a shared segment holding the same bytes at the same
 * address (the mapping is replaced in place with MAP_FIXED). Returns 0, or a
 * CUresult: CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED when the pages overlap
 * memory already shared, CUDA_ERROR_INVALID_VALUE when they are not all
 * mapped. Other threads must not write the range meanwhile (a write between
 * the copy and the remapping would be lost): registering memory that another
 * thread is filling is a race natively too. */
int gp_hostmap_adopt(void *p, size_t size, unsigned flags)
{
    if (!shm_ok)
        return CUDA_ERROR_NOT_SUPPORTED;
    uintptr_t b = (uintptr_t)p & ~(uintptr_t)4095;
    uintptr_t e = ((uintptr_t)p + size + 4095) & ~(uintptr_t)4095;
    size_t len = e - b;
    for (int i = 0; i < nsegs; i++) {
        uintptr_t sb = (uintptr_t)segs[i].base, se = sb + segs[i].size;
        if (b < se && sb < e)
            return CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED;
    }
    gp_seg *s = new_slot();
    if (!s)
        return CUDA_ERROR_OUT_OF_MEMORY;
    int fd = open_new_seg(s, len);
    if (fd < 0)
        return CUDA_ERROR_OUT_OF_MEMORY;
    size_t off = 0;
    while (off < len) {
        ssize_t w = pwrite(fd, (char *)b + off, len - off, (off_t)off);
        if (w <= 0) {      /* EFAULT: part of the range is not mapped */
            close(fd);
            shm_unlink(s->name);
            return CUDA_ERROR_INVALID_VALUE;
        }
        off += (size_t)w;
    }
    void *q = mmap((void *)b, len, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED, fd, 0);
    close(fd);
    if (q == MAP_FAILED) {
        shm_unlink(s->name);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    s->base = q;
    s->size = len;
    s->kind = GP_HM_REGISTERED;
    s->flags = flags;
    s->user = p;
    s->user_size = size;
    remember(s);
    return 0;
}

/* The GPU-visible segment holding p (any kind but staging/unmapped pinned):
 * its index, or -1. */
static int hostmap_find(const void *p)
{
    int i = seg_find(p);
    if (i < 0 || segs[i].kind == 0)
        return -1;
    return i;
}

int gp_hostmap_info(const void *p, int *kind, unsigned *flags, void **user, size_t *user_size,
                    uint32_t *id, void **base, size_t *size)
{
    int i = hostmap_find(p);
    if (i < 0)
        return -1;
    if (kind) *kind = segs[i].kind;
    if (flags) *flags = segs[i].flags;
    if (user) *user = segs[i].user;
    if (user_size) *user_size = segs[i].user_size;
    if (id) *id = segs[i].id;
    if (base) *base = segs[i].base;
    if (size) *size = segs[i].size;
    return 0;
}

/* The registered segment whose application pointer is exactly p. */
int gp_hostmap_registered(const void *p)
{
    for (int i = 0; i < nsegs; i++)
        if (segs[i].kind == GP_HM_REGISTERED && segs[i].user == p)
            return 0;
    return -1;
}

/* Frees a segment by its base (gp_host_free does the work). */
int gp_hostmap_free(void *base) { return gp_host_free(base); }

/* cuMemFreeHost of memory from the socket-only path (never a named segment). */
int gp_host_free_plain(void *p)
{
    int i = seg_find(p);
    if (i < 0 || segs[i].base != p || segs[i].name[0])
        return -1;
    return gp_host_free(p);
}
