#!/usr/bin/env bash
# The Podman rig: Debian's podman serving its Docker-compatible API (`podman system service`)
# on a socket of its own, with the images the tests need copied in from the Docker daemon
# (no registry here). `make test` runs the core end-to-end tests against it a second time.
#
#   scripts/podman.sh up          install podman (+ netavark, aardvark-dns), start the service,
#                                 load the caw-box and stub images; prints the DOCKER_HOST
#   scripts/podman.sh down        stop the service `up` started; remove the test objects
#   scripts/podman.sh with CMD…   `up`, run CMD with DOCKER_HOST at the service, then `down`
#
# State lives in $CAW_BOX_PODMAN_DIR (/var/tmp/caw-box-podman); images stay in Podman's own storage between runs.
set -euo pipefail
cd "$(dirname "$0")/.."

DIR=${CAW_BOX_PODMAN_DIR:-/var/tmp/caw-box-podman}
SOCK=$DIR/podman.sock
PID_FILE=$DIR/service.pid
LOG_FILE=$DIR/service.log
CONF=$DIR/containers.conf
IMAGES=(caw-box/claude-code:latest caw-box/codex:latest caw-box/opencode:latest
    caw-box/gemini:latest caw-box-test/stub-model:latest)
TEST_LABEL=io.caw-box.test-run

say() { printf 'podman-rig: %s\n' "$*" >&2; }
die() { say "$*"; exit 1; }

as_root() {
    if [ "$(id -u)" = 0 ]; then "$@"; else sudo "$@"; fi
}

pm() { as_root env CONTAINERS_CONF="$CONF" podman "$@"; }

answers() { curl -sf --unix-socket "$SOCK" http://d/_ping >/dev/null 2>&1; }

# The service processes serving this rig's socket (found by their command line: sudo and
# setsid may stand between this shell and the service).
service_pids() { pgrep -f "podman system service --time=0 unix://$SOCK" || true; }

install() {
    local missing=()
    command -v podman >/dev/null 2>&1 || missing+=(podman)
    [ -x /usr/lib/podman/netavark ] || missing+=(netavark)
    [ -x /usr/lib/podman/aardvark-dns ] || missing+=(aardvark-dns)
    [ ${#missing[@]} -eq 0 ] && return 0
    say "installing ${missing[*]}"
    export DEBIAN_FRONTEND=noninteractive
    as_root apt-get update -qq >/dev/null || die "apt-get update failed"
    as_root apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null \
        || die "apt-get install ${missing[*]} failed"
}

write_conf() {
    mkdir -p "$DIR"
    # netavark + aardvark-dns: containers on a network reach each other by name, as on
    # Docker (Debian's podman 4.3 defaults to CNI, which has no name resolution).
    # Rootful podman raises every container's nofile/nproc limits to its own defaults
    # (1048576 and 4194304); where this process's hard limits are lower (this kind of
    # machine: 20000 open files), runc cannot set them and every start fails with
    # "error setting rlimit". Docker keeps the daemon's own limits; so does this.
    {
        echo '[network]'
        echo 'network_backend = "netavark"'
        echo '[containers]'
        echo "default_ulimits = [\"nofile=$(ulimit -Hn):$(ulimit -Hn)\", \"nproc=32768:32768\"]"
    } >"$CONF"
}

start_service() {
    rm -f "$PID_FILE" "$SOCK"
    # setsid: the service outlives this shell and ignores its Ctrl-C. A plain command (no
    # shell function) so no waiting subshell is left behind.
    local sudo=()
    [ "$(id -u)" = 0 ] || sudo=(sudo)
    "${sudo[@]}" setsid env CONTAINERS_CONF="$CONF" podman system service --time=0 \
        "unix://$SOCK" >"$LOG_FILE" 2>&1 </dev/null &
    for _ in $(seq 1 60); do
        if answers; then
            service_pids >"$PID_FILE"
            # As Docker's socket: the docker group may use it (a test runs caw-box as
            # another user in that group).
            getent group docker >/dev/null && as_root chgrp docker "$SOCK" && as_root chmod 660 "$SOCK"
            return 0
        fi
        sleep 0.5
    done
    tail -n 20 "$LOG_FILE" >&2 || true
    die "podman system service did not come up (log: $LOG_FILE)"
}

# Docker sets the FORWARD policy to DROP and loads br_netfilter, so frames between two
# containers on one Podman bridge go through iptables and are dropped: containers on a
# Podman network could not reach each other while Docker runs on the same host. One rule
# admits exactly that traffic (bridged, same bridge: --physdev-is-bridged); `down` removes it.
FORWARD_RULE=(FORWARD -i podman+ -o podman+ -m physdev --physdev-is-bridged
    -m comment --comment caw-box-podman-rig -j ACCEPT)

admit_bridged() {
    as_root iptables -C "${FORWARD_RULE[@]}" 2>/dev/null && return 0
    as_root iptables -I "${FORWARD_RULE[@]}" || die "could not add the FORWARD rule for Podman's bridges"
}

# Copies an image from the Docker daemon unless Podman holds the same image (same id).
load_image() {
    local image=$1 want have
    want=$(docker image inspect -f '{{.Id}}' "$image" 2>/dev/null) \
        || die "image $image is missing in Docker: run scripts/images.sh first"
    have=$(pm image inspect --format '{{.Id}}' "$image" 2>/dev/null || true)
    [ "sha256:$have" = "$want" ] && return 0
    say "loading $image"
    docker save "$image" | pm load -q >/dev/null || die "podman load of $image failed"
}

# Every object the tests made carries the test-run label (as scripts/cleanup.sh for Docker).
remove_test_objects() {
    answers || return 0
    local kind ids
    ids=$(pm ps -aq --filter "label=$TEST_LABEL" 2>/dev/null || true)
    # shellcheck disable=SC2086
    [ -n "$ids" ] && pm rm -f -v $ids >/dev/null 2>&1
    for kind in volume network; do
        ids=$(pm $kind ls -q --filter "label=$TEST_LABEL" 2>/dev/null || true)
        # shellcheck disable=SC2086
        [ -n "$ids" ] && pm $kind rm -f $ids >/dev/null 2>&1
    done
    return 0
}

cmd_up() {
    install
    write_conf
    admit_bridged
    answers || start_service
    local image
    for image in "${IMAGES[@]}"; do load_image "$image"; done
    echo "export DOCKER_HOST=unix://$SOCK"
}

cmd_down() {
    remove_test_objects
    while as_root iptables -D "${FORWARD_RULE[@]}" 2>/dev/null; do :; done
    local pids
    pids=$(service_pids)
    if [ -n "$pids" ]; then
        # shellcheck disable=SC2086
        as_root kill -TERM $pids 2>/dev/null || true
        for _ in $(seq 1 20); do
            [ -z "$(service_pids)" ] && break
            sleep 0.5
        done
        pids=$(service_pids)
        # shellcheck disable=SC2086
        [ -n "$pids" ] && as_root kill -KILL $pids 2>/dev/null
    fi
    rm -f "$PID_FILE" "$SOCK"
    return 0
}

cmd_with() {
    cmd_up >/dev/null
    trap cmd_down EXIT
    DOCKER_HOST=unix://$SOCK "$@"
}

case ${1:-} in
up) cmd_up ;;
down) cmd_down ;;
with) shift; cmd_with "$@" ;;
*) die "usage: scripts/podman.sh up|down|with CMD..." ;;
esac
