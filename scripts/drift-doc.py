#!/usr/bin/env python3
"""Writes a `make drift` result (target/drift.json) into docs/compatibility.md.

usage: scripts/drift-doc.py DRIFT_JSON DOC

The page's table between `<!-- drift:begin -->` and `<!-- drift:end -->` has one row per
provider and CLI version drift checked: a run replaces the rows of the versions it checked
and keeps the others, so the page is the record of every version checked, and the weekly
workflow's result and the docs are one source. Exit 2 when the page has no such markers.
"""

import json
import re
import sys

BEGIN, END = "<!-- drift:begin -->", "<!-- drift:end -->"
CHECKS = ["run", "tool call", "resume recall", "usage", "interactive", "features"]
HEADER = ["provider", "version", "checked", "build", *CHECKS, "failed features"]
MARK = {"pass": "pass", "fail": "FAIL", "not run": "-"}


def version_key(version):
    return [int(p) if p.isdigit() else 0 for p in re.split(r"[.+-]", version)]


def rows_of(table):
    """The table's rows as lists of cells (the header and its rule left out)."""
    rows = []
    for line in table.splitlines():
        if not line.startswith("|"):
            continue
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if cells[0] in ("provider",) or set(cells[0]) <= set("-: "):
            continue
        rows.append(cells)
    return rows


def main():
    if len(sys.argv) != 3:
        print(__doc__.strip().splitlines()[2], file=sys.stderr)
        return 2
    report = json.load(open(sys.argv[1]))
    doc = open(sys.argv[2]).read()
    if BEGIN not in doc or END not in doc:
        print(f"drift-doc: {sys.argv[2]} has no {BEGIN} ... {END} table", file=sys.stderr)
        return 2
    head, rest = doc.split(BEGIN, 1)
    table, tail = rest.split(END, 1)
    rows = {(r[0], r[1]): r for r in rows_of(table)}
    checked = report["date"][:10]
    for p in report["providers"]:
        if not p.get("newest"):
            continue
        marks = [MARK.get(p["checks"].get(c, "not run"), "-") for c in CHECKS]
        failed = " ".join(f"`{t}`" for t in p.get("failed_features", [])) or ""
        build = "pass" if p["build"] == "pass" else "FAIL"
        rows[(p["provider"], p["newest"])] = [
            p["provider"], p["newest"], checked, build, *marks, failed
        ]
    order = ["claude_code", "codex", "opencode", "gemini"]
    ranked = sorted(
        rows.values(),
        key=lambda r: (order.index(r[0]) if r[0] in order else 9, version_key(r[1])),
    )
    lines = ["| " + " | ".join(HEADER) + " |", "|" + "---|" * len(HEADER)]
    lines += ["| " + " | ".join(r) + " |" for r in ranked]
    open(sys.argv[2], "w").write(head + BEGIN + "\n" + "\n".join(lines) + "\n" + END + tail)
    return 0


if __name__ == "__main__":
    sys.exit(main())
