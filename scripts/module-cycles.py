#!/usr/bin/env python3
"""Import cycles between caw-box's source files: prints each cycle (a strongly connected
set of files that reference each other through `crate::` / `super::` paths), exit 1 if any.
Test modules (a `#[cfg(test)]` `mod` item and what follows it) are ignored. Usage: scripts/module-cycles.py [src]"""
import os, re, sys

TEST_MODULE = re.compile(r"^#\[cfg\(test\)\]\s*\n(?:\s*#\[.*\]\s*\n)*\s*(?:pub(?:\([^)]*\))?\s+)?mod\s", re.M)

root = sys.argv[1] if len(sys.argv) > 1 else "src"
mods = {}  # module path tuple -> file
for dp, _, fs in os.walk(root):
    for f in fs:
        if not f.endswith(".rs") or f in ("main.rs",):
            continue
        rel = os.path.relpath(os.path.join(dp, f), root)[:-3].split(os.sep)
        if rel[-1] in ("mod", "lib"):
            rel = rel[:-1]
        mods[tuple(rel)] = os.path.join(dp, f)

def resolve(path):
    """Longest module prefix of a path."""
    for n in range(len(path), 0, -1):
        if tuple(path[:n]) in mods:
            return tuple(path[:n])
    return None

edges = {m: set() for m in mods}
for m, f in mods.items():
    text = open(f).read()
    test_module = TEST_MODULE.search(text)
    text = text[: test_module.start()] if test_module else text
    text = re.sub(r"//.*", "", text)  # comments and doc links are no imports
    for cap in re.finditer(r"\b(crate|super)((?:::\w+)+)", text):
        parts = cap.group(2).strip(":").split("::")
        if cap.group(1) == "crate":
            base = []
        else:
            base = list(m[:-1])
        target = resolve(base + parts)
        if target and target != m and not (target == m[: len(target)]):
            edges[m].add(target)
    for cap in re.finditer(r"use crate::\{([^;]*)\};", text, re.S):
        for item in re.findall(r"(\w+(?:::\w+)*)", cap.group(1)):
            target = resolve(item.split("::"))
            if target and target != m and not (target == m[: len(target)]):
                edges[m].add(target)

# Tarjan's strongly connected components
index, low, stack, on, out, i = {}, {}, [], set(), [], [0]
def visit(v):
    index[v] = low[v] = i[0]; i[0] += 1; stack.append(v); on.add(v)
    for w in edges[v]:
        if w not in index:
            visit(w); low[v] = min(low[v], low[w])
        elif w in on:
            low[v] = min(low[v], index[w])
    if low[v] == index[v]:
        comp = []
        while True:
            w = stack.pop(); on.discard(w); comp.append(w)
            if w == v: break
        if len(comp) > 1:
            out.append(comp)
sys.setrecursionlimit(10000)
for v in edges:
    if v not in index:
        visit(v)
for comp in out:
    print("cycle:", " <-> ".join("::".join(c) or "crate" for c in sorted(comp)))
sys.exit(1 if out else 0)
