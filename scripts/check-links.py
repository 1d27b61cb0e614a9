#!/usr/bin/env python3
"""Every relative link in the given Markdown files resolves: the file or directory it names
exists (relative to the linking file), and a `#anchor` names a heading of the target
Markdown file (or of the linking file, for a bare `#anchor`) by GitHub's slug rules:
lowercase, punctuation dropped except `-` and `_`, each space a `-`, a repeated heading
suffixed `-1`, `-2`, ... Links with a scheme (https:, mailto:, ...) are not followed: no
network. Links in fenced code blocks and in code spans are not links.

Usage: scripts/check-links.py FILE.md...   Prints one line per broken link
(`links: FILE:LINE: broken link TARGET: why`) and exits 1 if there is one.
"""
import os
import re
import sys

FENCE = re.compile(r"^\s*(```|~~~)")
HEADING = re.compile(r"^ {0,3}(#{1,6})\s+(.*?)\s*#*\s*$")
# [text](target "title") or ![alt](target); text may hold one level of brackets.
LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^)\s>]*)>?(?:\s+\"[^\"]*\")?\s*\)")
CODE_SPAN = re.compile(r"(`+).*?\1")
SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*:")


def lines_outside_code(path):
    """(line number, text) of each line not in a fenced code block, code spans blanked."""
    fenced = False
    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            if FENCE.match(line):
                fenced = not fenced
                continue
            if not fenced:
                yield n, line.rstrip("\n")


def slug(text):
    """GitHub's anchor for a heading's text."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", text)  # a link's text only
    text = text.lower()
    text = re.sub(r"[^\w\- ]", "", text)  # \w keeps letters, digits and `_`
    return text.replace(" ", "-")


_anchors = {}


def anchors(path):
    if path not in _anchors:
        seen = {}
        found = set()
        for _, line in lines_outside_code(path):
            m = HEADING.match(line)
            if not m:
                continue
            base = slug(m.group(2))
            k = seen.get(base, 0)
            seen[base] = k + 1
            found.add(base if k == 0 else f"{base}-{k}")
        _anchors[path] = found
    return _anchors[path]


def check(path):
    broken = []
    here = os.path.dirname(path)
    for n, line in lines_outside_code(path):
        for m in LINK.finditer(CODE_SPAN.sub(lambda c: " " * len(c.group(0)), line)):
            target = m.group(1)
            if not target or SCHEME.match(target) or target.startswith("//"):
                continue
            file_part, _, anchor = target.partition("#")
            dest = os.path.normpath(os.path.join(here, file_part)) if file_part else path
            why = None
            if not os.path.exists(dest):
                why = f"it resolves to {dest}, which does not exist"
            elif anchor and dest.endswith(".md") and anchor not in anchors(dest):
                why = f"no heading of {dest} has the anchor #{anchor}"
            if why:
                broken.append(f"links: {path}:{n}: broken link {target}: {why}")
    return broken


def main(paths):
    if not paths:
        print("usage: scripts/check-links.py FILE.md...", file=sys.stderr)
        return 2
    broken = [b for p in paths for b in check(p)]
    for b in broken:
        print(b, file=sys.stderr)
    return 1 if broken else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
