#!/usr/bin/env bash
# The Docker rig: makes sure a Docker daemon answers, and builds the local base image that
# the caw-box images are built from on a machine without a registry.
#
#   scripts/rig.sh up          reuse a running daemon, or install docker.io and start dockerd;
#                              either way with gVisor's runsc registered (`--runtime runsc`)
#   scripts/rig.sh down        stop the daemon that `up` started (by its PID), nothing else
#   scripts/rig.sh restart     stop and start the daemon that `up` started (tests use this)
#   scripts/rig.sh base        build the local base image (debootstrap + node), cached by tag
#   scripts/rig.sh tools       install the tools the end-to-end tests drive (tmux; openssl; sshd and
#                              ssh for the ssh:// DOCKER_HOST test, which starts its own sshd;
#                              valgrind for scripts/hot-functions.sh)
#   scripts/rig.sh build-deps  install what building caw-box needs besides Rust (Python's venv,
#                              for the Python package's stage; TLS is rustls, no C library;
#                              for `make dist`'s static binary: rustup's musl target and
#                              musl-tools, whose musl-gcc compiles ring's C code; for `make
#                              lint`'s dependency check: cargo-deny, from crates.io)
#   scripts/rig.sh with CMD…   `up`, run CMD, then `down` if `up` started the daemon
#
# Quiet on success; every failure says what failed. State lives in $RIG_DIR.
set -euo pipefail

RIG_DIR=${CAW_BOX_RIG_DIR:-/var/tmp/caw-box-rig}
PID_FILE=$RIG_DIR/dockerd.pid
LOG_FILE=$RIG_DIR/dockerd.log
LOCAL_BASE=${CAW_BOX_LOCAL_BASE:-caw-box-local/node:20-bookworm}
# deny.toml is written for it; bump both together.
CARGO_DENY_VERSION=0.20.2

say() { printf 'rig: %s\n' "$*" >&2; }
die() { say "$*"; exit 1; }

as_root() {
    if [ "$(id -u)" = 0 ]; then "$@"; else sudo "$@"; fi
}

daemon_answers() { docker info >/dev/null 2>&1; }

our_pid() {
    [ -f "$PID_FILE" ] || return 1
    local pid
    pid=$(cat "$PID_FILE")
    [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null && echo "$pid"
}

apt_install() {
    export DEBIAN_FRONTEND=noninteractive
    as_root apt-get update -qq >/dev/null || die "apt-get update failed"
    as_root apt-get install -y -qq --no-install-recommends "$@" >/dev/null \
        || die "apt-get install $* failed"
}

# gVisor (`--runtime runsc`): Debian's runsc, registered in the daemon's config file as
# `runtimes.runsc`. Its 2022 build refuses to start a sandbox with its own network stack
# on this kind of machine ("cannot run with network enabled in root network namespace",
# a misfiring check): `--network=host` makes it use the network namespace Docker gives
# the container (the container keeps its own namespace and Docker networks).
RUNSC_ARGS='["--network=host"]'

daemon_has_runsc() {
    docker info --format '{{json .Runtimes}}' 2>/dev/null | grep -q '"runsc"'
}

# The config file a running dockerd reads (again on SIGHUP): its --config-file, else the
# default.
config_file_of() {
    local arg next=
    while IFS= read -r -d '' arg; do
        if [ -n "$next" ]; then printf '%s\n' "$arg"; return; fi
        case $arg in
            --config-file=*) printf '%s\n' "${arg#--config-file=}"; return ;;
            --config-file) next=1 ;;
        esac
    done <"/proc/$1/cmdline"
    echo /etc/docker/daemon.json
}

# Adds runsc to the dockerd config file $1 (made if missing), keeping all else in it.
register_runsc() {
    command -v runsc >/dev/null 2>&1 || apt_install runsc
    command -v python3 >/dev/null 2>&1 || apt_install python3
    as_root mkdir -p "$(dirname "$1")"
    as_root python3 - "$1" "$(command -v runsc)" "$RUNSC_ARGS" <<'PY' \
        || die "could not add runsc to $1"
import json, os, sys
path, runsc, args = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
conf = {}
if os.path.exists(path) and os.path.getsize(path) > 0:
    with open(path) as f:
        conf = json.load(f)
conf.setdefault("runtimes", {})["runsc"] = {"path": runsc, "runtimeArgs": args}
with open(path + ".rig-new", "w") as f:
    json.dump(conf, f, indent=2)
    f.write("\n")
os.replace(path + ".rig-new", path)
PY
}

# A daemon the rig started without runsc (an older rig): registered and reloaded in place
# (dockerd re-reads `runtimes` on SIGHUP; its containers keep running). A daemon the rig
# did not start is only told about.
ensure_runsc() {
    daemon_has_runsc && return 0
    local pid
    if ! pid=$(our_pid); then
        say "note: this Docker daemon has no runsc runtime (gVisor), and the rig did not start it: the --runtime runsc tests fail; \`caw-box doctor\` says how to add it"
        return 0
    fi
    local conf
    conf=$(config_file_of "$pid")
    register_runsc "$conf"
    as_root kill -HUP "$pid"
    local i
    for i in $(seq 1 40); do
        daemon_has_runsc && return 0
        sleep 0.25
    done
    die "dockerd (pid $pid) did not take runsc from $conf after SIGHUP; see $LOG_FILE"
}

start_daemon() {
    command -v dockerd >/dev/null 2>&1 || apt_install docker.io
    mkdir -p "$RIG_DIR"
    rm -f "$PID_FILE"
    register_runsc /etc/docker/daemon.json
    # setsid: the daemon must outlive the shell that started it and ignore its Ctrl-C.
    # dockerd writes its own PID, so `down` stops exactly the process that runs.
    # A plain command (no shell function) so no waiting subshell is left behind.
    local sudo=()
    [ "$(id -u)" = 0 ] || sudo=(sudo)
    "${sudo[@]}" setsid dockerd --pidfile "$PID_FILE" >"$LOG_FILE" 2>&1 </dev/null &
    local i
    for i in $(seq 1 120); do
        daemon_answers && return 0
        sleep 0.5
    done
    tail -n 20 "$LOG_FILE" >&2 || true
    die "dockerd did not come up (log: $LOG_FILE)"
}

stop_daemon() {
    local pid
    pid=$(our_pid) || return 0
    as_root kill -TERM "$pid" 2>/dev/null || true
    local i
    for i in $(seq 1 60); do
        kill -0 "$pid" 2>/dev/null || break
        sleep 0.5
    done
    if kill -0 "$pid" 2>/dev/null; then
        say "dockerd (pid $pid) ignored SIGTERM for 30 s; killing it"
        as_root kill -KILL "$pid" 2>/dev/null || true
    fi
    rm -f "$PID_FILE"
}

cmd_up() {
    if daemon_answers; then ensure_runsc >&2; return 0; fi
    if our_pid >/dev/null; then
        die "dockerd (pid $(our_pid)) runs but does not answer; see $LOG_FILE"
    fi
    start_daemon
    # Marks that this invocation started it, for `with`.
    echo started
}

cmd_restart() {
    local pid
    pid=$(our_pid) || die "no daemon started by the rig is running ($PID_FILE); refusing to restart one it did not start"
    stop_daemon
    start_daemon
}

cmd_base() {
    daemon_answers || die "Docker daemon not reachable; run: scripts/rig.sh up"
    if docker image inspect "$LOCAL_BASE" >/dev/null 2>&1; then return 0; fi
    command -v debootstrap >/dev/null 2>&1 || apt_install debootstrap
    local mirror
    # The machine's own Debian mirror (the one apt uses), not a third-party repository.
    mirror=$(cat /etc/apt/sources.list /etc/apt/sources.list.d/*.list /etc/apt/sources.list.d/*.sources 2>/dev/null \
        | grep -oE 'https?://[^ ]+/debian/?( |$)' | grep -v security | head -n 1 | tr -d ' ' || true)
    [ -n "$mirror" ] || mirror=http://deb.debian.org/debian
    local root
    root=$(mktemp -d "${TMPDIR:-/tmp}/caw-box-base.XXXXXX")
    trap 'as_root rm -rf "$root"' RETURN
    say "building $LOCAL_BASE (debootstrap from $mirror, about 30 s)"
    as_root debootstrap --variant=minbase bookworm "$root" "$mirror" >"$RIG_DIR/debootstrap.log" 2>&1 \
        || { tail -n 20 "$RIG_DIR/debootstrap.log" >&2; die "debootstrap failed (log: $RIG_DIR/debootstrap.log)"; }
    # node >= 20 for Gemini CLI: the host's node is a single binary that links only libc and
    # libstdc++, so it runs in a bookworm root as it is. Real users build on an official node
    # image instead (the base image is a build argument).
    local node npm_dir
    node=$(command -v node) || die "node not found on the host"
    npm_dir=$(dirname "$(dirname "$(readlink -f "$(command -v npm)")")")
    as_root cp "$node" "$root/usr/bin/node"
    as_root mkdir -p "$root/usr/lib/node_modules"
    as_root cp -a "$npm_dir" "$root/usr/lib/node_modules/npm"
    as_root ln -sf ../lib/node_modules/npm/bin/npm-cli.js "$root/usr/bin/npm"
    as_root ln -sf ../lib/node_modules/npm/bin/npx-cli.js "$root/usr/bin/npx"
    as_root rm -rf "$root/var/cache/apt/archives/"*.deb "$root/var/lib/apt/lists/"*
    as_root tar -C "$root" -c . | docker import \
        -c 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
        -c 'CMD ["bash"]' - "$LOCAL_BASE" >/dev/null || die "docker import of $LOCAL_BASE failed"
}

cmd_with() {
    local started
    started=$(cmd_up)
    local rc=0
    "$@" || rc=$?
    if [ "$started" = started ]; then stop_daemon; fi
    return $rc
}

case "${1:-}" in
    up) mkdir -p "$RIG_DIR"; cmd_up >/dev/null ;;
    down) stop_daemon ;;
    restart) cmd_restart ;;
    base) mkdir -p "$RIG_DIR"; cmd_base ;;
    tools)
        command -v tmux >/dev/null 2>&1 || apt_install tmux
        # The TLS endpoint test makes its certificates with it.
        command -v openssl >/dev/null 2>&1 || apt_install openssl
        { [ -x /usr/sbin/sshd ] && command -v ssh >/dev/null 2>&1; } \
            || apt_install openssh-server openssh-client
        # scripts/hot-functions.sh profiles turns under its callgrind.
        command -v valgrind >/dev/null 2>&1 || apt_install valgrind
        ;;
    build-deps)
        # TLS is rustls (no OpenSSL to link). The Python package's stage makes a virtualenv,
        # which Debian's python3 leaves to the python3-venv package.
        python3 -c 'import venv, ensurepip' >/dev/null 2>&1 || apt_install python3-venv
        # `make dist`: the static x86_64-unknown-linux-musl binary (rust-toolchain.toml lists
        # the target too; an older rustup does not add it by itself).
        if command -v rustup >/dev/null 2>&1 \
            && ! rustup target list --installed 2>/dev/null | grep -qx x86_64-unknown-linux-musl; then
            rustup target add x86_64-unknown-linux-musl >/dev/null || die "rustup target add x86_64-unknown-linux-musl failed"
        fi
        command -v musl-gcc >/dev/null 2>&1 || apt_install musl-tools
        # The checkpoint scripts' unit tests pack HOME's layer with zstd, as the images do.
        command -v zstd >/dev/null 2>&1 || apt_install zstd
        # `make lint`'s dependency check (scripts/deny.sh, deny.toml): cargo-deny at the version
        # deny.toml is written for, compiled from crates.io (some 10 minutes on 2 cores, once;
        # skipped when that version is there).
        if ! cargo deny --version 2>/dev/null | grep -qx "cargo-deny $CARGO_DENY_VERSION"; then
            say "installing cargo-deny $CARGO_DENY_VERSION (cargo install, once)"
            cargo install --quiet --locked cargo-deny --version "$CARGO_DENY_VERSION" \
                || die "cargo install cargo-deny $CARGO_DENY_VERSION failed"
        fi
        ;;
    pid) our_pid || die "no daemon started by the rig is running" ;;
    with) shift; mkdir -p "$RIG_DIR"; cmd_with "$@" ;;
    *) die "usage: scripts/rig.sh up|down|restart|base|tools|build-deps|pid|with CMD..." ;;
esac
