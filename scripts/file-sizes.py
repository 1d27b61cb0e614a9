#!/usr/bin/env python3
"""Source files too long to read as one piece: each .rs file under ROOT with more than LIMIT
lines before its test module (a `#[cfg(test)]` line followed by a `mod` item: a
`#[cfg(test)]` on anything else is code like any other; a file without one counts whole).
Prints each, exit 1 if any. Usage: scripts/file-sizes.py [ROOT] [LIMIT]"""
import os, re, sys

TEST_MODULE = re.compile(r"^#\[cfg\(test\)\]\s*\n(?:\s*#\[.*\]\s*\n)*\s*(?:pub(?:\([^)]*\))?\s+)?mod\s", re.M)

root = sys.argv[1] if len(sys.argv) > 1 else "src"
limit = int(sys.argv[2]) if len(sys.argv) > 2 else 700
over = []
for dp, _, fs in os.walk(root):
    for f in sorted(fs):
        if not f.endswith(".rs"):
            continue
        path = os.path.join(dp, f)
        text = open(path, encoding="utf-8").read()
        m = TEST_MODULE.search(text)
        n = (text[: m.start()] if m else text).count("\n")
        if n > limit:
            over.append((n, path))
for n, path in sorted(over, reverse=True):
    print(f"{path}: {n} lines before its tests (at most {limit}): split it along a seam")
sys.exit(1 if over else 0)
