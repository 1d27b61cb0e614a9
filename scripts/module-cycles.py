#!/usr/bin/env python3
"""Import cycles between caw-box's modules, file by file: each file (a module of its own,
a folder's `mod.rs` the folder's) is a node, and a set of files that refer to each other
round a circle is printed as `cycle: agent_config <-> provider <-> provider::codex`, followed
by the references that close it (`file:line -> file`: one of them has to go); exit 1 if any.

A reference is a path into the crate in code: `crate::`, `super::`, `self::`, a child
module's name (`codex::Codex` in `provider/mod.rs`), each path of a `use` tree; not in a
comment, a string or a test module, wherever in the file it stands (scripts/rust_source.py).
A file's reference to a module above it (`use super::*` in a child) is no edge: a module and
the modules it declares are built as one; the parent's reference down to a child is one.

Usage: scripts/module-cycles.py [src]"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from rust_source import Tree  # noqa: E402

root = sys.argv[1] if len(sys.argv) > 1 else "src"
tree = Tree(root)
# main.rs is a crate of its own (the binary's): its `crate::` is not the library's.
files = {tree.scope(m): f for m, f in tree.production() if m != ("main",)}

# Each file's references: target module -> the first line naming it, to neither itself nor
# a module above it.
refs = {m: {} for m in files}
for m, f in files.items():
    for line, target in tree.imports(tree.files[f], f):
        target = tree.scope(target)
        if target in files and m[: len(target)] != target:
            refs[m][target] = min(line, refs[m].get(target, line))


def strongly_connected(edges):
    """Tarjan's strongly connected components of more than one node, each sorted."""
    index, low, stack, on, out = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(edges[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    sys.setrecursionlimit(10000)
    for v in sorted(edges):
        if v not in index:
            visit(v)
    return sorted(out)


cycles = strongly_connected(refs)
for comp in cycles:
    print("cycle:", " <-> ".join("::".join(m) or "crate" for m in comp))
    for a in comp:
        for b in sorted(refs[a]):
            if b in comp:
                print(f"  {files[a]}:{refs[a][b]} -> {files[b]}")
sys.exit(1 if cycles else 0)
