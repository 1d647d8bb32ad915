"""Why restored `__device__` variables moved: the restore's account of each
one that the driver placed elsewhere than in the dumped process (issue 23,
target 5), from the pattern of the moves.

What decides the addresses (families/modrestore.py): the driver puts
module variables, and with lazy loading kernels' code, one after another in
device memory of its own; a worker that repeats the app's loads and lookups
in order gets the same addresses, unless something else took that memory
in between in one process and not the other. The pattern says which:

* every variable moved by one offset: that memory starts elsewhere, so the
  difference came before the first load (context creation, the worker's
  address-space layout, something the worker loaded itself);
* the variables of the first modules stayed and later ones moved: between
  two loads the app's driver placed something the restore did not repeat
  (a library's own kernels, such as cuBLAS's at its first handle, a graph,
  a kernel looked up in an image without placement numbers);
* the modules were loaded in no fixed order (GPUPROXY_RESTORE_MODULES=
  unordered, for measuring).

Pure functions on the manifest and the moved list; no locking.
"""
from __future__ import annotations


def explain(moved: list[dict], modules: list[dict], mode: str | None) -> list[str]:
    """One line per cause for the moved variables (empty when none moved).
    moved: [{"name", "old", "new", "size", "module"}]; modules: the
    manifest's modules."""
    if not moved:
        return []
    why = []
    if mode == "unordered":
        why.append("modules were loaded on several threads in no fixed order (GPUPROXY_RESTORE_MODULES="
                   "unordered, a measuring mode): the driver placed their variables in the order the loads won")
    if modules and any(not md.get("seq") for md in modules):
        why.append("the image has no placement order (made before placement numbers): kernels were looked up "
                   "after all modules were loaded, not between them as the app did")
    deltas = {g["new"] - g["old"] for g in moved}
    total = sum(len(md["globals"]) for md in modules)
    if len(deltas) == 1 and len(moved) == total:
        d = deltas.pop()
        why.append(f"all {total} variables moved by the same offset ({d:+#x}): the driver's memory for module "
                   f"code and variables starts elsewhere in this worker, so the difference lies before the first "
                   f"module load (how the context was made, the worker's address-space layout "
                   f"(GPUPROXY_WORKER_ASLR), CUDA_MODULE_LOADING, something loaded by the worker itself)")
        return why
    order = sorted(modules, key=lambda md: (md.get("seq") or 0, md["id"]))
    moved_mods = {g.get("module") for g in moved}
    first = next((i for i, md in enumerate(order) if md["id"] in moved_mods), None)
    if first is not None:
        md = order[first]
        stayed = sum(len(m["globals"]) for m in order[:first])
        why.append(f"the variables of the {first} modules loaded before module {md['id']} stayed ({stayed}) and "
                   f"from module {md['id']} on {len(moved)} moved: between the app's load of it and the one "
                   f"before, its driver placed something this restore did not repeat (a library's own kernels, "
                   f"e.g. at the first cuBLAS or cuDNN handle, a graph, memory outside the arena)")
    return why
