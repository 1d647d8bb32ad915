// Kernels of globals_table.cu: NG __device__ variables per module, a kernel
// that stores their addresses into a table in device memory, one that adds
// to all of them, and one that sums what the table's pointers point at.
// Loaded several times with cuModuleLoadData (each load: its own variables).
// extern "C": the names are not mangled.
#define NG 128

#define D1(i) __device__ int g##i = i;
#define D8(i) D1(i##0) D1(i##1) D1(i##2) D1(i##3) D1(i##4) D1(i##5) D1(i##6) D1(i##7)
// g00 .. g157 (octal-like names, 128 of them)
D8(0) D8(1) D8(2) D8(3) D8(4) D8(5) D8(6) D8(7) D8(10) D8(11) D8(12) D8(13) D8(14) D8(15) D8(16) D8(17)

#define A1(i) &g##i,
#define A8(i) A1(i##0) A1(i##1) A1(i##2) A1(i##3) A1(i##4) A1(i##5) A1(i##6) A1(i##7)

// table[base + j] = address of the j-th variable
extern "C" __global__ void gt_publish(unsigned long long *table, int base)
{
    int *const all[NG] = { A8(0) A8(1) A8(2) A8(3) A8(4) A8(5) A8(6) A8(7)
                           A8(10) A8(11) A8(12) A8(13) A8(14) A8(15) A8(16) A8(17) };
    int j = threadIdx.x;
    if (j < NG)
        table[base + j] = (unsigned long long)all[j];
}

// every variable += add
extern "C" __global__ void gt_bump(int add)
{
    int *const all[NG] = { A8(0) A8(1) A8(2) A8(3) A8(4) A8(5) A8(6) A8(7)
                           A8(10) A8(11) A8(12) A8(13) A8(14) A8(15) A8(16) A8(17) };
    int j = threadIdx.x;
    if (j < NG)
        *all[j] += add;
}

// out[0] = sum of *(int *)table[j], j < n: reads through the stored pointers
extern "C" __global__ void gt_gather(const unsigned long long *table, int n, long long *out)
{
    if (threadIdx.x == 0 && blockIdx.x == 0) {
        long long s = 0;
        for (int j = 0; j < n; j++)
            s += *(const int *)table[j];
        out[0] = s;
    }
}
