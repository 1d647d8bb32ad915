"""A worker process (one per client session): the serving loop, dispatch,
the C fast path's glue, control commands served in the worker.
`python -m gpuproxy.proxyd.worker` starts one (entry.py)."""
