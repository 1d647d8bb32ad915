"""Strongly connected components of a directed graph (Tarjan's algorithm,
iterative so that deep graphs do not reach Python's recursion limit).

Shared by the two layering checks: the shim's C files (scripts/
shim_layers.py) and the Python packages (tests/layering.py). Plain
functions on plain data; no import of gpuproxy.
"""
from __future__ import annotations


def strongly_connected(nodes, edges) -> list[list[str]]:
    """The cycles of the graph: each component of more than one node, and
    each single node with an arrow to itself, as a sorted list; largest
    first. nodes: any iterable of names; edges: (from, to) pairs (a set,
    or a dict keyed by them); an edge may name a node not in nodes."""
    succ: dict[str, list[str]] = {n: [] for n in nodes}
    for a, b in edges:
        succ.setdefault(a, []).append(b)
        succ.setdefault(b, [])
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    out: list[list[str]] = []
    counter = 0
    for root in sorted(succ):
        if root in index:
            continue
        # iterative DFS: (node, iterator over its successors)
        work = [(root, iter(sorted(set(succ[root]))))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            v, it = work[-1]
            advanced = False
            for w in it:
                if w not in index:
                    index[w] = low[w] = counter
                    counter += 1
                    stack.append(w)
                    on_stack.add(w)
                    work.append((w, iter(sorted(set(succ[w])))))
                    advanced = True
                    break
                if w in on_stack:
                    low[v] = min(low[v], index[w])
            if advanced:
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = []
                while True:
                    w = stack.pop()
                    on_stack.discard(w)
                    comp.append(w)
                    if w == v:
                        break
                if len(comp) > 1 or (v, v) in edges:
                    out.append(sorted(comp))
    return sorted(out, key=lambda c: (-len(c), c))
