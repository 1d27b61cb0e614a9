#!/usr/bin/env python3
"""Layers that hold: every import between caw-box's source files goes from a layer to the
same one or one below it, as ARCHITECTURE.md's layer table says (its rows, top to bottom,
are the layers; the `src/` links in a row's "Where" cell are its files and folders). Prints
each import from a lower layer to a higher one (`file:line: a (Layer) imports b (Layer)`)
and each source file the table does not place; exit 1 if any.

Imports are paths into the crate (`crate::`, `super::`, `self::`, a child module's name, each
path of a `use` tree) in code, wherever in a file they stand: not in a comment, a string or
test code (a `#[cfg(test)]` module, inline or a file of its own: scripts/rust_source.py).
Usage: scripts/layers.py [ARCHITECTURE.md] [src]"""
import os
import re
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from rust_source import Tree  # noqa: E402

table_file = sys.argv[1] if len(sys.argv) > 1 else "ARCHITECTURE.md"
root = sys.argv[2] if len(sys.argv) > 2 else "src"

# The layer table: the first table under "## Layers" whose header starts with "| Layer".
layers = []  # (name, [path prefixes relative to root])
text = open(table_file).read()
section = text.split("## Layers", 1)
if len(section) < 2:
    sys.exit(f"layers: {table_file} has no '## Layers' section")
rows = [l for l in section[1].splitlines() if l.startswith("|")]
for row in rows:
    cells = [c.strip() for c in row.strip("|").split("|")]
    if len(cells) < 2 or cells[0] in ("Layer",) or set(cells[0]) <= set("-: "):
        continue
    paths = re.findall(r"\]\(([^)]+)\)", cells[1])
    prefixes = []
    for p in paths:
        if not p.startswith(root + "/"):
            continue
        p = p[len(root) + 1:]
        if p.endswith("/mod.rs"):
            p = p[: -len("/mod.rs")]
        elif p.endswith(".rs"):
            p = p[:-3]
        prefixes.append(tuple(p.strip("/").split("/")))
    if prefixes:
        layers.append((cells[0], prefixes))
if not layers:
    sys.exit(f"layers: no layer table with src/ links found in {table_file}")

tree = Tree(root)


def layer_of(m):
    best = None
    for i, (_, prefixes) in enumerate(layers):
        for p in prefixes:
            if m[: len(p)] == p and (best is None or len(p) > best[1]):
                best = (i, len(p))
    return best[0] if best else None


problems = []
for m, f in tree.production():
    if m == ("lib",):
        continue
    mine = layer_of(m)
    if mine is None:
        problems.append(f"{f}: not in {table_file}'s layer table: add it to the layer it belongs to")
        continue
    for no, target in tree.imports(m, f):
        if target == m or m[: len(target)] == target:
            continue
        theirs = layer_of(target)
        if theirs is not None and theirs < mine:
            problems.append(
                f"{f}:{no}: {'::'.join(m)} ({layers[mine][0]}) imports "
                f"{'::'.join(target)} ({layers[theirs][0]}), a layer above it"
            )

for p in sorted(set(problems)):
    print(p)
sys.exit(1 if problems else 0)
