/* A library whose RUNPATH ($ORIGIN/sub) is the only way to find libdep.so:
 * dlopen must resolve "libdep.so" with the RUNPATH of this calling library,
 * also when gpuproxy's dlopen wrapper stands in between (tests/test_dlopen.py). */
#include <dlfcn.h>
#include <stdio.h>

int caller_load_dep(void)
{
    void *h = dlopen("libdep.so", RTLD_NOW);
    if (!h) {
        printf("dlopen libdep.so failed: %s\n", dlerror());
        return -1;
    }
    int (*f)(void) = (int (*)(void))dlsym(h, "runpath_dep_value");
    return f ? f() : -2;
}
