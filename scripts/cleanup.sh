#!/usr/bin/env bash
# Removes every Docker object the test suite created (label io.caw-box.test), and the
# sessions it ran (their containers and volumes carry io.caw-box.test-run as well).
set -uo pipefail
docker info >/dev/null 2>&1 || exit 0
ids=$(docker ps -aq --filter label=io.caw-box.test)
[ -n "$ids" ] && docker rm -f $ids >/dev/null
for l in io.caw-box.test io.caw-box.test-run; do
    ids=$(docker ps -aq --filter label=$l)
    [ -n "$ids" ] && docker rm -f $ids >/dev/null
    vols=$(docker volume ls -q --filter label=$l)
    [ -n "$vols" ] && docker volume rm -f $vols >/dev/null
    nets=$(docker network ls -q --filter label=$l)
    [ -n "$nets" ] && docker network rm $nets >/dev/null
done
exit 0
