/*
 * gpuproxy's CRIU plugin: a CRIU dump of a gpuproxy client (by criu itself,
 * or by podman/runc, CRI-O and the kubelet's checkpoint API, which all run
 * criu) also saves the client's GPU state, which lives in proxyd, beside
 * CRIU's images; a CRIU restore puts it back into this node's proxyd before
 * the app goes on. Built at install time (autogen/build.py) into
 * gpuproxy/proxyd/checkpoint/gpuproxy_criu_plugin.so; CRIU loads it from its
 * plugin folder (criu --libdir DIR, or `libdir` in a CRIU configuration file
 * such as /etc/criu/runc.conf for runc), docs/cluster.md.
 *
 * The hooks, as CRIU 4.2 calls them (criu/seize.c, criu/cr-restore.c; the
 * interface is CRIU's criu-plugin.h, restated below):
 *   PAUSE_DEVICES(pid)        before CRIU stops a task (with a freezer cgroup:
 *                             once, for the tree's root): the gpuproxy
 *                             clients of the tree are parked (their shims
 *                             close their sockets and shared memory, their
 *                             CUDA calls wait);
 *   CHECKPOINT_DEVICES(pid)   each task, frozen: a parked client's GPU state
 *                             is dumped by proxyd into IMAGES/gpuproxy/<pid>;
 *   fini(DUMP, ret)           the parked clients are resumed (those CRIU
 *                             ended are gone and proxyd ends their sessions;
 *                             with --leave-running they go on); a failed dump
 *                             leaves no gpuproxy part behind;
 *   init(RESTORE)             before CRIU forks the tree: every GPU image
 *                             of IMAGES/gpuproxy is restored into this
 *                             node's proxyd (it must not find the pid taken);
 *   RESUME_DEVICES_LATE(pid)  after the restore, each task: its shim is
 *                             resumed with its session's token (it
 *                             reconnects to this node's proxyd);
 *   fini(RESTORE, ret != 0)   a failed restore: one line in CRIU's log.
 * The work is done by `python -m gpuproxy.proxyd.checkpoint.orchestrate.criu_hooks`
 * (proxyd's control interface is ZeroMQ + msgpack, spoken by the Python
 * client): this file only finds the images folder and runs it, so a failure
 * is reported in CRIU's log through the helper's stderr and its exit status.
 * PYTHON is the interpreter gpuproxy was installed with (GP_PYTHON, set at
 * build time; $GPUPROXY_PYTHON overrides it).
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#ifndef GP_PYTHON
#define GP_PYTHON "python3"
#endif

/* CRIU's plugin interface (criu/include/criu-plugin.h, plugin version 0.2.0),
 * restated: the hook numbers, the descriptor CRIU looks up by the name
 * CR_PLUGIN_DESC, and the one function CRIU exports to plugins. */
#define GP_CRIU_PLUGIN_VERSION ((0 << 16) + (2 << 8) + 0)
enum {
    GP_HOOK_RESUME_DEVICES_LATE = 9,
    GP_HOOK_PAUSE_DEVICES = 10,
    GP_HOOK_CHECKPOINT_DEVICES = 11,
    GP_HOOK_COUNT = 13,               /* CR_PLUGIN_HOOK__MAX of CRIU 4.2 */
};
enum { GP_STAGE_DUMP = 0, GP_STAGE_PRE_DUMP = 1, GP_STAGE_RESTORE = 2 };

typedef struct {
    const char *name;
    int (*init)(int stage);
    void (*exit)(int stage, int ret);
    unsigned int version;
    unsigned int max_hooks;
    void *hooks[GP_HOOK_COUNT];
} gp_criu_plugin_desc_t;

extern int criu_get_image_dir(void);
/* CRIU's logger (criu/include/log.h; what its own plugins' pr_err uses):
 * lines go into CRIU's log file, which is all a caller such as runc keeps
 * (under runc, criu's stderr goes nowhere anyone reads). Weak: a CRIU
 * without it gets the lines on stderr. */
extern void print_on_level(unsigned int loglevel, const char *format, ...) __attribute__((weak));
#define GP_LOG_ERROR 1
#define GP_LOG_INFO 3

static int gp_stage = -1;

/* the folder that holds the gpuproxy package: this library is
 * <root>/gpuproxy/proxyd/checkpoint/gpuproxy_criu_plugin.so */
static int package_root(char *out, size_t n)
{
    Dl_info info;
    if (!dladdr((void *)package_root, &info) || !info.dli_fname)
        return -1;
    char path[PATH_MAX];
    if (!realpath(info.dli_fname, path))
        return -1;
    for (int up = 0; up < 4; up++) {
        char *slash = strrchr(path, '/');
        if (!slash)
            return -1;
        *slash = '\0';
    }
    if (strlen(path) + 1 > n)
        return -1;
    strcpy(out, path);
    return 0;
}

static int images_dir(char *out, size_t n)
{
    int fd = criu_get_image_dir();
    char link[64];
    snprintf(link, sizeof link, "/proc/self/fd/%d", fd);
    ssize_t len = readlink(link, out, n - 1);
    if (fd < 0 || len <= 0)
        return -1;
    out[len] = '\0';
    return 0;
}

static void log_line(int failed, const char *action, const char *line)
{
    if (print_on_level)
        print_on_level(failed ? GP_LOG_ERROR : GP_LOG_INFO, "gpuproxy plugin (%s): %s\n", action, line);
    else
        fprintf(stderr, "gpuproxy plugin (%s): %s\n", action, line);
}

/* Runs the helper: 0 when it succeeded, -1 otherwise. Its stderr (one line
 * saying why, when it fails) is read through a pipe and put into CRIU's
 * log. */
static int helper(const char *action, long arg)
{
    char root[PATH_MAX], imgs[PATH_MAX], argbuf[32];
    if (package_root(root, sizeof root) || images_dir(imgs, sizeof imgs)) {
        fprintf(stderr, "gpuproxy criu plugin: cannot find the gpuproxy package or CRIU's images folder\n");
        return -1;
    }
    snprintf(argbuf, sizeof argbuf, "%ld", arg);
    const char *py = getenv("GPUPROXY_PYTHON");
    if (!py || !*py)
        py = GP_PYTHON;
    int pfd[2];
    if (pipe(pfd))
        return -1;
    pid_t child = fork();
    if (child < 0) {
        close(pfd[0]);
        close(pfd[1]);
        return -1;
    }
    if (child == 0) {
        /* criu's own descriptors 0 and 1 can be anything (under runc's
         * swrk mode one is a directory, which Python cannot start with):
         * the helper gets /dev/null there and the pipe as stderr */
        close(pfd[0]);
        int null = open("/dev/null", O_RDWR);
        if (null >= 0) {
            dup2(null, 0);
            dup2(null, 1);
            if (null > 2)
                close(null);
        }
        dup2(pfd[1], 2);
        if (pfd[1] != 2)
            close(pfd[1]);
        setenv("PYTHONPATH", root, 1);
        unsetenv("LD_PRELOAD");
        execlp(py, py, "-m", "gpuproxy.proxyd.checkpoint.orchestrate.criu_hooks", action, argbuf, imgs, (char *)NULL);
        fprintf(stderr, "gpuproxy criu plugin: cannot run %s: %s\n", py, strerror(errno));
        _exit(127);
    }
    close(pfd[1]);
    /* the helper's whole stderr (bounded; the rest is drained unread so the
     * helper never blocks on a full pipe) */
    char err[4096];
    size_t used = 0;
    for (;;) {
        char buf[1024];
        ssize_t k = read(pfd[0], buf, sizeof buf);
        if (k < 0 && errno == EINTR)
            continue;
        if (k <= 0)
            break;
        size_t take = (size_t)k < sizeof err - 1 - used ? (size_t)k : sizeof err - 1 - used;
        memcpy(err + used, buf, take);
        used += take;
    }
    close(pfd[0]);
    err[used] = '\0';
    int status;
    while (waitpid(child, &status, 0) < 0) {
        if (errno != EINTR)
            return -1;
    }
    int ok = WIFEXITED(status) && WEXITSTATUS(status) == 0;
    for (char *line = strtok(err, "\n"); line; line = strtok(NULL, "\n"))
        log_line(!ok, action, line);
    if (!ok && !used) {
        char why[64];
        snprintf(why, sizeof why, "the helper failed (status 0x%x)", status);
        log_line(1, action, why);
    }
    return ok ? 0 : -1;
}

static int gp_init(int stage)
{
    gp_stage = stage;
    /* proxyd restores a session before its process exists (it refuses a
     * pid that already belongs to a process started after the dump), so the
     * GPU state goes back before CRIU forks the tree */
    if (stage == GP_STAGE_RESTORE)
        return helper("prepare", 0);
    return 0;
}

static void gp_fini(int stage, int ret)
{
    if (stage == GP_STAGE_DUMP)
        helper("finish", ret);
    else if (stage == GP_STAGE_RESTORE && ret != 0)
        helper("abandon", ret);
}

static int gp_pause_devices(int pid)
{
    return helper("pause", pid);
}

static int gp_checkpoint_devices(int pid)
{
    return helper("checkpoint", pid);
}

static int gp_resume_devices_late(int pid)
{
    return helper("restore", pid);
}

__attribute__((visibility("default"))) gp_criu_plugin_desc_t CR_PLUGIN_DESC = {
    .name = "gpuproxy",
    .init = gp_init,
    .exit = gp_fini,
    .version = GP_CRIU_PLUGIN_VERSION,
    .max_hooks = GP_HOOK_COUNT,
    .hooks = {
        [GP_HOOK_RESUME_DEVICES_LATE] = (void *)gp_resume_devices_late,
        [GP_HOOK_PAUSE_DEVICES] = (void *)gp_pause_devices,
        [GP_HOOK_CHECKPOINT_DEVICES] = (void *)gp_checkpoint_devices,
    },
};
