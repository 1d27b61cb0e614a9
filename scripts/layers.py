#!/usr/bin/env python3
"""Layers that hold: every import between caw-box's source files goes from a layer to the
same one or one below it, as ARCHITECTURE.md's layer table says (its rows, top to bottom,
are the layers; the `src/` links in a row's "Where" cell are its files and folders). Prints
each import from a lower layer to a higher one (`file:line: a (Layer) imports b (Layer)`)
and each source file the table does not place; exit 1 if any.

Imports are `crate::`/`super::` paths and `use crate::{...}` groups, outside comments and
test code (a `#[cfg(test)]` module, in a file or as a file of its own).
Usage: scripts/layers.py [ARCHITECTURE.md] [src]"""
import os
import re
import sys

table_file = sys.argv[1] if len(sys.argv) > 1 else "ARCHITECTURE.md"
root = sys.argv[2] if len(sys.argv) > 2 else "src"

TEST_MODULE = re.compile(r"^#\[cfg\(test\)\]\s*\n(?:\s*#\[.*\]\s*\n)*\s*(?:pub(?:\([^)]*\))?\s+)?mod\s", re.M)
TEST_FILE_DECL = re.compile(r"#\[cfg\(test\)\]\s*\n(?:\s*#\[.*\]\s*\n)*\s*(?:pub(?:\([^)]*\))?\s+)?mod\s+(\w+)\s*;")

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

mods = {}  # module path -> file
for dp, _, fs in os.walk(root):
    for f in fs:
        if not f.endswith(".rs"):
            continue
        rel = os.path.relpath(os.path.join(dp, f), root)[:-3].split(os.sep)
        if rel[-1] == "mod":
            rel = rel[:-1]
        mods[tuple(rel)] = os.path.join(dp, f)

# Files that are test modules of their own (`#[cfg(test)] mod tests;` in their parent).
test_files = set()
for m, f in mods.items():
    parent = m if (f.endswith("mod.rs") or m == ("lib",) or m == ("main",)) else m[:-1]
    if m in (("lib",), ("main",)):
        parent = ()
    for name in TEST_FILE_DECL.findall(open(f).read()):
        test_files.add(parent + (name,))


def layer_of(m):
    best = None
    for i, (_, prefixes) in enumerate(layers):
        for p in prefixes:
            if m[: len(p)] == p and (best is None or len(p) > best[1]):
                best = (i, len(p))
    return best[0] if best else None


def resolve(path):
    for n in range(len(path), 0, -1):
        if tuple(path[:n]) in mods:
            return tuple(path[:n])
    return None


problems = []
for m, f in sorted(mods.items()):
    if m == ("lib",) or any(m[: len(t)] == t for t in test_files):
        continue
    mine = layer_of(m)
    if mine is None:
        problems.append(f"{f}: not in {table_file}'s layer table: add it to the layer it belongs to")
        continue
    src = open(f).read()
    t = TEST_MODULE.search(src)
    src = src[: t.start()] if t else src

    def check(no, target):
        """An import of `target` at line `no`: a problem when it is of a layer above."""
        if not target or target == m or m[: len(target)] == target:
            return
        theirs = layer_of(target)
        if theirs is not None and theirs < mine:
            problems.append(
                f"{f}:{no}: {'::'.join(m)} ({layers[mine][0]}) imports "
                f"{'::'.join(target)} ({layers[theirs][0]}), a layer above it"
            )

    for no, line in enumerate(src.split("\n"), 1):
        line = re.sub(r"//.*", "", line)
        for cap in re.finditer(r"\b(crate|super)((?:::\w+)+)", line):
            parts = cap.group(2).strip(":").split("::")
            # `super` of a file's module is its parent (of a mod.rs, the folder's parent).
            base = [] if cap.group(1) == "crate" else list(m[:-1])
            check(no, resolve(base + parts))
    for cap in re.finditer(r"use crate::\{([^;]*)\};", src, re.S):
        no = src[: cap.start()].count("\n") + 1
        for item in re.findall(r"(\w+(?:::\w+)*)", cap.group(1)):
            check(no, resolve(item.split("::")))

for p in sorted(set(problems)):
    print(p)
sys.exit(1 if problems else 0)
