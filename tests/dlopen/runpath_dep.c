/* Found only through the RUNPATH of libcaller.so (tests/test_dlopen.py). */
int runpath_dep_value(void) { return 4242; }
