"""An independent numpy implementation of the training that
examples/train_mlp_pycuda.py runs on the GPU: same data, initial weights,
model, loss and SGD, written with whole-matrix numpy operations in float64
(no kernel emulation), so a test can compare the example's loss curve under
gpuproxy with it within float tolerance.
"""
from __future__ import annotations

import numpy as np

SEED = 1234
N_SAMPLES, N_FEATURES, N_HIDDEN, N_CLASSES = 1024, 32, 64, 10
BATCH = 256
LR = 0.5


def data(seed=SEED):
    rng = np.random.default_rng(seed)
    centres = rng.normal(0.0, 1.0, (N_CLASSES, N_FEATURES))
    y = rng.integers(0, N_CLASSES, N_SAMPLES)
    x = (centres[y] + rng.normal(0.0, 1.5, (N_SAMPLES, N_FEATURES))).astype(np.float32)
    return x, y


def weights(seed=SEED):
    rng = np.random.default_rng(seed + 1)
    w1 = (rng.normal(0.0, 1.0, (N_FEATURES, N_HIDDEN)) * np.sqrt(2.0 / N_FEATURES)).astype(np.float32)
    w2 = (rng.normal(0.0, 1.0, (N_HIDDEN, N_CLASSES)) * np.sqrt(1.0 / N_HIDDEN)).astype(np.float32)
    return [w1.astype(np.float64), np.zeros(N_HIDDEN), w2.astype(np.float64), np.zeros(N_CLASSES)]


def train(epochs: int) -> list[float]:
    x, y = data()
    x = x.astype(np.float64)
    w1, b1, w2, b2 = weights()
    curve = []
    for _ in range(epochs):
        losses = []
        for s in range(0, N_SAMPLES, BATCH):
            X, Y = x[s:s + BATCH], y[s:s + BATCH]
            h = np.maximum(X @ w1 + b1, 0.0)
            z = h @ w2 + b2
            z = z - z.max(axis=1, keepdims=True)
            logp = z - np.log(np.exp(z).sum(axis=1, keepdims=True))
            losses.append(-logp[np.arange(len(Y)), Y].mean())
            dz = np.exp(logp)
            dz[np.arange(len(Y)), Y] -= 1.0
            dz /= len(Y)
            dh = (dz @ w2.T) * (h > 0)
            grads = [X.T @ dh, dh.sum(axis=0), h.T @ dz, dz.sum(axis=0)]
            w1, b1, w2, b2 = (p - LR * g for p, g in zip((w1, b1, w2, b2), grads))
        curve.append(float(np.mean(losses)))
    return curve


if __name__ == "__main__":
    for i, v in enumerate(train(12), 1):
        print(f"epoch {i} loss {v:.9g}")
