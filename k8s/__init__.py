"""gpuproxy.k8s: gpuproxy on Kubernetes (docs/kubernetes.md).

Pure logic, importable without kopf or the kubernetes client (so CI tests it
on real Kubernetes JSON objects with no API server):

    config       names (label, annotations), paths and policies, from the environment
    admission    the mutating webhook's decision: AdmissionReview in, JSONPatch out
    nodes        drain / spot-notice detection on Node objects, opted-in pods of a node
    checkpoints  GPUCheckpoint names, status, schedule due times, keep-N selection
    images       checkpoint images found in a pod's checkpoint folder
    agent        the node agent (HTTP, in the DaemonSet): asks a pod's wrapper for a checkpoint
    webhook      the HTTPS server that serves `admission` (stdlib only)

On top, needing the `[k8s]` extra (kopf, kubernetes):

    controller   thin kopf handlers: CRs, node watch, schedules, garbage collection
"""
