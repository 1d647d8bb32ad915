/* Diagnostics of the shim: one stderr line per event, prefixed "gpuproxy:".
 *
 * Locking: none needed; the debug flag is an int written by transport.c
 * (under gp_lock) when a session starts, read racily by design (a late
 * reader sees the old value: one debug line more or less). */
#include "gp_base.h"

#include <stdarg.h>
#include <stdio.h>

static int debug;

int gp_debug_enabled(void) { return debug; }

void gp_set_debug(int on) { debug = on; }

void gp_log(const char *fmt, ...)
{
    char line[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    fprintf(stderr, "gpuproxy: %s\n", line);
}

void gp_warn_unsupported(const char *fn)
{
    /* One line per call, naming the function (the project's rule for every
     * unsupported entry point). */
    fprintf(stderr, "gpuproxy: %s is not supported by gpuproxy; returning not-supported\n", fn);
}
