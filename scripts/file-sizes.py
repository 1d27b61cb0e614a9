#!/usr/bin/env python3
"""Source files too long to read as one piece: each .rs file under ROOT with more than LIMIT
lines that are not its tests. Its tests are its test modules (scripts/rust_source.py): a
`#[cfg(test)]` `mod` item, inline from its attribute to its closing brace, or a file of its
own, whose lines are all tests; every other line counts, wherever it stands (after a test
module too), and a `#[cfg(test)]` on anything else is code like any other.
Prints each, exit 1 if any. Usage: scripts/file-sizes.py [ROOT] [LIMIT]"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from rust_source import Tree, test_modules  # noqa: E402

root = sys.argv[1] if len(sys.argv) > 1 else "src"
limit = int(sys.argv[2]) if len(sys.argv) > 2 else 700
tree = Tree(root)
over = []
for _, path in tree.production():
    text = tree.text(path)
    n = text.count("\n")
    for start, end, _, _, _ in test_modules(text):
        # The lines from the attribute's to the closing brace's (or `;`'s), both whole.
        n -= text.count("\n", start, end) + 1
    if n > limit:
        over.append((n, path))
for n, path in sorted(over, reverse=True):
    print(f"{path}: {n} lines but its tests (at most {limit}): split it along a seam")
sys.exit(1 if over else 0)
