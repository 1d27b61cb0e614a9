#!/usr/bin/env python3
"""Words a layer keeps out of its code: where it would name what lies behind a seam. Each
rule is a folder and a pattern; every match in a .rs file under it, outside comments (line,
block and doc comments; string literals are code), is printed as `file:line: 'word' (why)`;
exit 1 if any.

- src/session plans a turn in caw-box's terms only: what a turn needs, not where. No pod,
  sidecar, network name or loopback address: the backend decides those (`Backend::
  broker_route`, `egress_route`).
- src/commands reaches Docker and Kubernetes only through the backend seam: no backend type
  and no branch on the backend's kind (`backend::images`, `backend::doctor`).

Usage: scripts/seam-words.py [ROOT]   (ROOT: the tree holding src/, default .)"""
import os
import re
import sys

RULES = [
    (
        "src/session",
        re.compile(r'pod|in_pod|POD_|SIDECAR|"bridge"|127\.0\.0\.1|localhost'),
        "the session layer says what a turn needs, the backend where",
    ),
    (
        "src/commands",
        re.compile(r"DockerBackend|KubeBackend|BackendKind|backend::docker|backend::kubernetes"),
        "commands reach a backend through its seam only",
    ),
]


def code_only(text):
    """`text` with every comment blanked (newlines kept, so lines still count)."""
    out = []
    i, n = 0, len(text)
    depth = 0  # block comment nesting
    while i < n:
        c = text[i]
        if depth:
            if text.startswith("/*", i):
                depth += 1
                out.append("  ")
                i += 2
            elif text.startswith("*/", i):
                depth -= 1
                out.append("  ")
                i += 2
            else:
                out.append("\n" if c == "\n" else " ")
                i += 1
        elif text.startswith("//", i):
            j = text.find("\n", i)
            j = n if j < 0 else j
            out.append(" " * (j - i))
            i = j
        elif text.startswith("/*", i):
            depth = 1
            out.append("  ")
            i += 2
        else:
            raw = re.match(r'b?r(#*)"', text[i:])
            if raw and (i == 0 or not (text[i - 1].isalnum() or text[i - 1] == "_")):
                end = '"' + raw.group(1)
                j = text.find(end, i + raw.end())
                j = n if j < 0 else j + len(end)
                out.append(text[i:j])
                i = j
            elif c == '"':
                j = i + 1
                while j < n and text[j] != '"':
                    j += 2 if text[j] == "\\" else 1
                out.append(text[i : j + 1])
                i = j + 1
            elif c == "'":
                # A char literal ('x', '\n', '\u{..}'), else a lifetime.
                lit = re.match(r"'(?:\\.[^']*|[^'\\])'", text[i:])
                j = i + (lit.end() if lit else 1)
                out.append(text[i:j])
                i = j
            else:
                out.append(c)
                i += 1
    return "".join(out)


def main():
    root = sys.argv[1] if len(sys.argv) > 1 else "."
    problems = []
    for folder, pattern, why in RULES:
        for dp, _, fs in os.walk(os.path.join(root, folder)):
            for f in sorted(fs):
                if not f.endswith(".rs"):
                    continue
                path = os.path.join(dp, f)
                code = code_only(open(path, encoding="utf-8").read())
                for no, line in enumerate(code.split("\n"), 1):
                    for m in pattern.finditer(line):
                        problems.append(f"{os.path.relpath(path, root)}:{no}: '{m.group(0)}' ({why})")
    for p in problems:
        print(p)
    sys.exit(1 if problems else 0)


if __name__ == "__main__":
    main()
