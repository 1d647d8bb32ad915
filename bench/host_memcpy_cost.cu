// Host copy rates that bound a restore's reads (issue 13, target 1): from a
// populated 4 GiB /dev/shm file mapping, in 4 MiB pieces taken by 1, 4, 8 or
// 16 threads, into (a) plain memory, (b) the same memory page-locked with
// cuMemHostRegister; the destination either as large as the source or a
// 96 MiB ring reused (the restore ring's size). One JSON line per case.
// Build: nvcc -O2 -o host_memcpy_cost bench/host_memcpy_cost.cu -lcuda -lpthread
#include <cuda.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>
static double now(void){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec+t.tv_nsec*1e-9;}
static char *src,*dst; static size_t N=4ull<<30, P=4<<20; static int nth; static size_t next_piece; static pthread_mutex_t mu=PTHREAD_MUTEX_INITIALIZER;
static size_t dst_size;
static void *worker(void *a){(void)a;for(;;){pthread_mutex_lock(&mu);size_t o=next_piece;next_piece+=P;pthread_mutex_unlock(&mu);if(o>=N)return NULL;memcpy(dst+(o%dst_size),src+o,P);}}
static double run(int t){nth=t;next_piece=0;pthread_t th[64];double t0=now();for(int i=0;i<t;i++)pthread_create(&th[i],0,worker,0);for(int i=0;i<t;i++)pthread_join(th[i],0);return N/(now()-t0)/1e9;}
int main(){
  int fd=open("/dev/shm/gpx-memcpy-probe",O_RDWR|O_CREAT|O_TRUNC,0600); ftruncate(fd,N);
  src=(char*)mmap(0,N,PROT_READ|PROT_WRITE,MAP_SHARED|MAP_POPULATE,fd,0); memset(src,1,N);
  munmap(src,N); src=(char*)mmap(0,N,PROT_READ,MAP_SHARED|MAP_POPULATE,fd,0);
  int ts[]={1,4,8,16};
  for(int ring=0;ring<2;ring++){
    dst_size= ring? (96u<<20) : N;   // whole-size destination, or a 96 MiB ring reused (the restore's)
    dst=(char*)aligned_alloc(4096,dst_size); memset(dst,0,dst_size);
    for(int i=0;i<4;i++) printf("{\"dst\":\"malloc\",\"dst_mb\":%zu,\"threads\":%d,\"gbps\":%.2f}\n",dst_size>>20,ts[i],run(ts[i]));
    cuInit(0); CUcontext c; CUdevice d; cuDeviceGet(&d,0); cuDevicePrimaryCtxRetain(&c,d); cuCtxSetCurrent(c);
    CUresult r=cuMemHostRegister(dst,dst_size,0);
    for(int i=0;i<4;i++) printf("{\"dst\":\"registered(%d)\",\"dst_mb\":%zu,\"threads\":%d,\"gbps\":%.2f}\n",r,dst_size>>20,ts[i],run(ts[i]));
    cuMemHostUnregister(dst); free(dst);
  }
  unlink("/dev/shm/gpx-memcpy-probe"); return 0;}
