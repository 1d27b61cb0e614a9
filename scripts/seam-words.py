#!/usr/bin/env python3
"""Words a layer keeps out of its code: where it would name what lies behind a seam. Each
rule is a set of folders and a pattern; every match in a .rs file under them, in code (not in
a comment, line, block or doc; string literals are code) and outside test modules, wherever
in the file it stands (scripts/rust_source.py), is printed as `file:line: 'word' (why)`;
exit 1 if any.

- src/session plans a turn in caw-box's terms only: what a turn needs, not where. No pod,
  sidecar, network name or loopback address: the backend decides those (`Backend::
  broker_route`, `egress_route`).
- src/commands and src/mcp (the Commands layer) reach Docker and Kubernetes only through the
  backend seam: no backend type and no branch on the backend's kind (`backend::images`,
  `backend::doctor`).

Usage: scripts/seam-words.py [ROOT]   (ROOT: the tree holding src/, default .)"""
import os
import re
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from rust_source import Tree  # noqa: E402

RULES = [
    (
        ("src/session",),
        re.compile(r'pod|in_pod|POD_|SIDECAR|"bridge"|127\.0\.0\.1|localhost'),
        "the session layer says what a turn needs, the backend where",
    ),
    (
        ("src/commands", "src/mcp"),
        re.compile(r"DockerBackend|KubeBackend|BackendKind|backend::docker|backend::kubernetes"),
        "commands reach a backend through its seam only",
    ),
]


def main():
    root = sys.argv[1] if len(sys.argv) > 1 else "."
    tree = Tree(os.path.join(root, "src"))
    problems = []
    for _, path in tree.production():
        rel = os.path.relpath(path, root)
        for folders, pattern, why in RULES:
            if not any(rel.startswith(folder + os.sep) for folder in folders):
                continue
            for no, line in enumerate(tree.code(path).split("\n"), 1):
                for m in pattern.finditer(line):
                    problems.append(f"{rel}:{no}: '{m.group(0)}' ({why})")
    for p in problems:
        print(p)
    sys.exit(1 if problems else 0)


if __name__ == "__main__":
    main()
