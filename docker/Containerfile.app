# A gpuproxy job image: the app runs under `proxy-cli run --checkpoint-dir` (docs/cluster.md):
# SIGTERM (podman stop, a Kubernetes eviction) checkpoints it into $GPUPROXY_CKPT_DIR and
# exits 143; the next container started on a folder holding an image restores the app
# instead of starting it afresh, on this node or another.
#
# Built from a staged root file system, so it needs no registry (docs/cluster.md, "Containers"):
#   scripts/stage-rootfs CTX --extra /path/to/app      (this machine's gpuproxy, Python, CRIU)
#   podman build -f docker/Containerfile.app -t gpuproxy-app CTX
# The node's proxyd writes and reads the GPU part of the image itself, so the checkpoint
# folder must have the same path in the container as on the node (-v D:D); the node's
# proxyd socket folder is mounted too (not its key folder: proxyd seals the image
# itself, the record-criu command). The container keeps its own pid namespace (proxyd
# knows its client by the socket's credentials) and its own IPC namespace (proxyd reaches
# its /dev/shm through /proc; --ipc host only lets the shim share memory with proxyd, which
# is faster) and needs no node /tmp (docs/cluster.md):
#   podman run --privileged -v /run/gpuproxy:/run/gpuproxy \
#       -e GPUPROXY_ENDPOINT=ipc:///run/gpuproxy/proxyd.sock \
#       -v /shared/ckpt/job1:/shared/ckpt/job1 -e GPUPROXY_CKPT_DIR=/shared/ckpt/job1 \
#       gpuproxy-app /path/to/app args
FROM scratch
COPY rootfs/ /
ENV PATH=/usr/local/bin:/usr/bin:/bin \
    PYTHONDONTWRITEBYTECODE=1 \
    GPUPROXY_CRIU=/opt/gpuproxy/criu/bin/criu \
    GPUPROXY_CKPT_DIR=/ckpt
ENTRYPOINT ["/bin/sh", "-c", "exec proxy-cli run --checkpoint-dir \"$GPUPROXY_CKPT_DIR\" -- \"$@\"", "--"]
