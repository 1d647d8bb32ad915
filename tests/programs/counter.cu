// counter: the example program of NVIDIA's cuda-checkpoint documentation
// (https://github.com/NVIDIA/cuda-checkpoint, README "Example"), reproduced as
// written there. Every UDP datagram received on 127.0.0.1:PORT increments a
// __device__ counter (initially 100) on the GPU and the new value is sent back
// as "<value>\n". The program never exits on its own.
//
// Additions (and nothing else): argv[1] optionally overrides the port (tests
// run in parallel), and the return codes of the calls are checked minimally:
// a failure prints a message on stderr and exits 1 instead of being ignored.
#include <stdio.h>
#include <stdlib.h>
#include <sys/types.h>
#include <sys/socket.h>
#include <netinet/in.h>
#include <arpa/inet.h>

#define PORT 10000

__device__ int counter = 100;

__global__ void increment()
{
    counter++;
}

static void check(cudaError_t err, const char *what)
{
    if (err != cudaSuccess) {
        fprintf(stderr, "counter: %s failed: %s (%s)\n", what, cudaGetErrorName(err), cudaGetErrorString(err));
        exit(1);
    }
}

int main(int argc, char **argv)
{
    int port = (argc > 1) ? atoi(argv[1]) : PORT;

    check(cudaFree(0), "cudaFree(0)");

    int sock = socket(PF_INET, SOCK_DGRAM, IPPROTO_UDP);
    if (sock < 0) { perror("counter: socket"); return 1; }
    sockaddr_in addr = {AF_INET, htons(port), inet_addr("127.0.0.1")};
    if (bind(sock, (sockaddr *)&addr, sizeof addr) != 0) { perror("counter: bind"); return 1; }

    while (true) {
        char buffer[16] = {0};
        sockaddr_in peer = {0};
        socklen_t inetSize = sizeof peer;
        int hCounter = 0;

        recvfrom(sock, buffer, sizeof buffer, 0, (sockaddr *)&peer, &inetSize);

        increment<<<1,1>>>();
        check(cudaGetLastError(), "increment<<<1,1>>>()");
        check(cudaMemcpyFromSymbol(&hCounter, counter, sizeof counter), "cudaMemcpyFromSymbol");

        size_t bytes = sprintf(buffer, "%d\n", hCounter);
        sendto(sock, buffer, bytes, 0, (sockaddr *)&peer, inetSize);
    }

    return 0;
}
