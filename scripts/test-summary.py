#!/usr/bin/env python3
"""Where a `make test` run's time went: each stage's wall time (target/test-timings/stages.tsv,
written by scripts/test.sh) and the slowest tests of every nextest run it kept
(target/test-timings/*.xml, nextest's JUnit output).
Usage: scripts/test-summary.py [DIR] [--top N]"""
import glob, os, sys
import xml.etree.ElementTree as ET

args = [a for a in sys.argv[1:] if not a.startswith("--top")]
top = 20
for i, a in enumerate(sys.argv):
    if a == "--top" and i + 1 < len(sys.argv):
        top = int(sys.argv[i + 1])
        args = [x for x in args if x != sys.argv[i + 1]]
root = args[0] if args else "target/test-timings"

print(f"== timings ({root})")
stages_file = os.path.join(root, "stages.tsv")
if os.path.exists(stages_file):
    total = 0
    for line in open(stages_file):
        name, secs, status, beside = (line.rstrip("\n").split("\t") + ["", "", ""])[:4]
        if beside:
            # It ran beside other stages: its time is in theirs.
            status += " (beside the stages after it)"
        else:
            total += int(secs)
        print(f"  {name:<22} {int(secs):>5} s  {status}")
    print(f"  {'all stages':<22} {total:>5} s")

tests = []
for xml in sorted(glob.glob(os.path.join(root, "*.xml"))):
    stage = os.path.basename(xml)[:-4]
    for case in ET.parse(xml).getroot().iter("testcase"):
        failed = any(c.tag in ("failure", "error") for c in case)
        tests.append((float(case.get("time", 0)), stage, case.get("name"), failed))
tests.sort(reverse=True)
if tests:
    print(f"  {len(tests)} tests, {sum(t[0] for t in tests):.0f} s of test time; the {min(top, len(tests))} slowest:")
    for secs, stage, name, failed in tests[:top]:
        print(f"  {secs:>7.1f} s  {stage:<10} {name}{'  FAILED' if failed else ''}")
