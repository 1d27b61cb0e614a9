#!/usr/bin/env bash
# Removes every Docker object the test suite and the demo created: they all carry the label
# io.caw-box.test-run (the e2e rig sets it on its networks and stubs, and passes it to
# caw-box through CAW_BOX_LABELS, so sessions carry it too). Nothing else is touched.
#   scripts/cleanup.sh [RUN]   only the objects of that run (io.caw-box.test-run=RUN): what
#                              the demo does, so it leaves a test run beside it alone
set -uo pipefail
docker info >/dev/null 2>&1 || exit 0
label=io.caw-box.test-run${1:+=$1}
ids=$(docker ps -aq --filter label=$label)
# -v: their anonymous volumes too (a turn's runtime scratch carries no label of its own).
[ -n "$ids" ] && docker rm -f -v $ids >/dev/null
vols=$(docker volume ls -q --filter label=$label)
[ -n "$vols" ] && docker volume rm -f $vols >/dev/null
nets=$(docker network ls -q --filter label=$label)
[ -n "$nets" ] && docker network rm $nets >/dev/null
exit 0
