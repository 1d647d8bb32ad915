/* runpath_main /abs/path/libcaller.so: calls caller_load_dep() and prints it. */
#include <dlfcn.h>
#include <stdio.h>

int main(int argc, char **argv)
{
    void *h = dlopen(argv[1], RTLD_NOW);
    if (!h) {
        printf("dlopen caller failed: %s\n", dlerror());
        return 1;
    }
    int (*f)(void) = (int (*)(void))dlsym(h, "caller_load_dep");
    printf("dep value %d\n", f());
    return 0;
}
