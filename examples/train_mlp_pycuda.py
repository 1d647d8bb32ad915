"""A small MLP trained with pycuda and its own CUDA kernels.

Synthetic 10-class data (Gaussian clusters from a fixed seed, no download),
one hidden ReLU layer, softmax cross-entropy, plain mini-batch SGD. Every
step of the math runs in the SourceModule kernels below (matmul, bias+ReLU,
ReLU backward, softmax cross-entropy, column sums, SGD); the host only
shuffles nothing, copies the data once and reads back per-row losses.

    python examples/train_mlp_pycuda.py                      # native
    env LD_PRELOAD=$(proxy-cli preload) python examples/train_mlp_pycuda.py   # under gpuproxy

Prints one line per epoch: "epoch E loss L" with L to 9 significant digits
(float32 math, so runs on the same GPU print identical curves). The kernels
are compiled with --fmad=false so that every multiply and add is rounded
separately: tests/train_mlp_emu.py emulates them operation by operation.

--wait-at-epoch K: after epoch K, print "waiting" and wait for a line on
stdin (a test checkpoints the process there). --time: also print seconds
per epoch (docs/benchmarks.md).
"""
from __future__ import annotations

import argparse
import sys
import time

import numpy as np

import pycuda.autoinit  # noqa: F401  (creates the context)
import pycuda.driver as cuda
from pycuda.compiler import SourceModule

KERNELS = r"""
// C[M,N] = op(A)[M,K] * op(B)[K,N]; op transposes when ta/tb is set
// (A stored [K,M] / B stored [N,K]). One thread per output element; the sum
// runs over k in order.
__global__ void matmul(const float *A, const float *B, float *C, int M, int N, int K, int ta, int tb)
{
    int i = blockIdx.y * blockDim.y + threadIdx.y;
    int j = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= M || j >= N) return;
    float acc = 0.0f;
    for (int k = 0; k < K; k++) {
        float a = ta ? A[k * M + i] : A[i * K + k];
        float b = tb ? B[j * K + k] : B[k * N + j];
        acc += a * b;
    }
    C[i * N + j] = acc;
}

// Z[i,j] += b[j], then ReLU when relu != 0.
__global__ void bias_act(float *Z, const float *b, int M, int N, int relu)
{
    int t = blockIdx.x * blockDim.x + threadIdx.x;
    if (t >= M * N) return;
    float v = Z[t] + b[t % N];
    Z[t] = (relu && v < 0.0f) ? 0.0f : v;
}

// dH = H > 0 ? dH : 0 (H is the ReLU output).
__global__ void relu_backward(float *dH, const float *H, int n)
{
    int t = blockIdx.x * blockDim.x + threadIdx.x;
    if (t >= n) return;
    if (!(H[t] > 0.0f)) dH[t] = 0.0f;
}

// Per row of logits [M,C]: loss[i] = log(sum exp(z - max)) - (z[y] - max);
// dZ = (softmax - onehot(y)) / M.
__global__ void softmax_xent(const float *Z, const int *y, float *dZ, float *loss, int M, int C)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= M) return;
    const float *z = Z + i * C;
    float m = z[0];
    for (int c = 1; c < C; c++) m = fmaxf(m, z[c]);
    float s = 0.0f;
    for (int c = 0; c < C; c++) s += expf(z[c] - m);
    loss[i] = logf(s) - (z[y[i]] - m);
    float inv = 1.0f / (float)M;
    for (int c = 0; c < C; c++) {
        float p = expf(z[c] - m) / s;
        dZ[i * C + c] = (p - (c == y[i] ? 1.0f : 0.0f)) * inv;
    }
}

// db[j] = sum over i of dZ[i,j], in order.
__global__ void col_sum(const float *dZ, float *db, int M, int N)
{
    int j = blockIdx.x * blockDim.x + threadIdx.x;
    if (j >= N) return;
    float s = 0.0f;
    for (int i = 0; i < M; i++) s += dZ[i * N + j];
    db[j] = s;
}

// w -= lr * g
__global__ void sgd(float *w, const float *g, float lr, int n)
{
    int t = blockIdx.x * blockDim.x + threadIdx.x;
    if (t >= n) return;
    w[t] = w[t] - lr * g[t];
}
"""

# Problem size and hyper-parameters (tests/train_mlp_reference.py repeats them).
SEED = 1234
N_SAMPLES, N_FEATURES, N_HIDDEN, N_CLASSES = 1024, 32, 64, 10
BATCH = 256
LR = 0.5
EPOCHS = 12


def make_data(seed: int = SEED):
    """Gaussian clusters around random class centres; float32 inputs, int32 labels."""
    rng = np.random.default_rng(seed)
    centres = rng.normal(0.0, 1.0, (N_CLASSES, N_FEATURES))
    y = rng.integers(0, N_CLASSES, N_SAMPLES).astype(np.int32)
    x = (centres[y] + rng.normal(0.0, 1.5, (N_SAMPLES, N_FEATURES))).astype(np.float32)
    return x, y


def init_params(seed: int = SEED):
    rng = np.random.default_rng(seed + 1)
    w1 = (rng.normal(0.0, 1.0, (N_FEATURES, N_HIDDEN)) * np.sqrt(2.0 / N_FEATURES)).astype(np.float32)
    b1 = np.zeros(N_HIDDEN, np.float32)
    w2 = (rng.normal(0.0, 1.0, (N_HIDDEN, N_CLASSES)) * np.sqrt(1.0 / N_HIDDEN)).astype(np.float32)
    b2 = np.zeros(N_CLASSES, np.float32)
    return w1, b1, w2, b2


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--epochs", type=int, default=EPOCHS)
    ap.add_argument("--wait-at-epoch", type=int, default=0)
    ap.add_argument("--time", action="store_true", help="print seconds per epoch")
    ap.add_argument("--pause", type=float, default=0.0,
                    help="seconds of host-side pause after each epoch (as data loading would take; "
                         "leaves room for an external checkpoint)")
    a = ap.parse_args(argv)

    mod = SourceModule(KERNELS, options=["--fmad=false"])
    matmul, bias_act, relu_bw, xent, col_sum, sgd = (
        mod.get_function(n) for n in ("matmul", "bias_act", "relu_backward", "softmax_xent", "col_sum", "sgd"))

    x, y = make_data()
    params = [cuda.to_device(p) for p in init_params()]
    w1, b1, w2, b2 = params
    sizes = [N_FEATURES * N_HIDDEN, N_HIDDEN, N_HIDDEN * N_CLASSES, N_CLASSES]
    nb = N_SAMPLES // BATCH
    xb = [cuda.to_device(x[i * BATCH:(i + 1) * BATCH]) for i in range(nb)]
    yb = [cuda.to_device(y[i * BATCH:(i + 1) * BATCH]) for i in range(nb)]
    f4 = 4
    h = cuda.mem_alloc(BATCH * N_HIDDEN * f4)
    z = cuda.mem_alloc(BATCH * N_CLASSES * f4)
    dz = cuda.mem_alloc(BATCH * N_CLASSES * f4)
    dh = cuda.mem_alloc(BATCH * N_HIDDEN * f4)
    grads = [cuda.mem_alloc(s * f4) for s in sizes]
    gw1, gb1, gw2, gb2 = grads
    loss_rows = cuda.mem_alloc(BATCH * f4)
    host_loss = cuda.pagelocked_empty(BATCH, np.float32)   # page-locked host memory
    stream = cuda.Stream()
    i32, f32 = np.int32, np.float32
    T = 16

    def mm(A, B, C, M, N, K, ta, tb):
        matmul(A, B, C, i32(M), i32(N), i32(K), i32(ta), i32(tb),
               block=(T, T, 1), grid=((N + T - 1) // T, (M + T - 1) // T), stream=stream)

    def lin(fn, n, *args):
        fn(*args, block=(128, 1, 1), grid=((n + 127) // 128, 1), stream=stream)

    for epoch in range(1, a.epochs + 1):
        t0 = time.perf_counter()
        total = 0.0
        for bi in range(nb):
            X, Y = xb[bi], yb[bi]
            # forward
            mm(X, w1, h, BATCH, N_HIDDEN, N_FEATURES, 0, 0)
            lin(bias_act, BATCH * N_HIDDEN, h, b1, i32(BATCH), i32(N_HIDDEN), i32(1))
            mm(h, w2, z, BATCH, N_CLASSES, N_HIDDEN, 0, 0)
            lin(bias_act, BATCH * N_CLASSES, z, b2, i32(BATCH), i32(N_CLASSES), i32(0))
            lin(xent, BATCH, z, Y, dz, loss_rows, i32(BATCH), i32(N_CLASSES))
            # backward
            mm(h, dz, gw2, N_HIDDEN, N_CLASSES, BATCH, 1, 0)
            lin(col_sum, N_CLASSES, dz, gb2, i32(BATCH), i32(N_CLASSES))
            mm(dz, w2, dh, BATCH, N_HIDDEN, N_CLASSES, 0, 1)
            lin(relu_bw, BATCH * N_HIDDEN, dh, h, i32(BATCH * N_HIDDEN))
            mm(X, dh, gw1, N_FEATURES, N_HIDDEN, BATCH, 1, 0)
            lin(col_sum, N_HIDDEN, dh, gb1, i32(BATCH), i32(N_HIDDEN))
            # update
            for p, g, s in zip(params, grads, sizes):
                lin(sgd, s, p, g, f32(LR), i32(s))
            cuda.memcpy_dtoh_async(host_loss, loss_rows, stream)
            stream.synchronize()
            total += float(np.sum(host_loss, dtype=np.float64)) / BATCH
        line = f"epoch {epoch} loss {total / nb:.9g}"
        if a.time:
            line += f" time {time.perf_counter() - t0:.4f}"
        print(line, flush=True)
        if a.pause:
            time.sleep(a.pause)
        if epoch == a.wait_at_epoch:
            print("waiting", flush=True)
            sys.stdin.readline()
    return 0


if __name__ == "__main__":
    sys.exit(main())
