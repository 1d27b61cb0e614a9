#!/usr/bin/env bash
# scripts/with-keyring.sh CMD...
#
# Runs CMD inside a private D-Bus session bus with a throwaway, unlocked gnome-keyring Secret
# Service, for tests of the OS keyring code (tests/keyring.rs). Works headless (no X display)
# and as root in CI. The keyring lives in a temporary directory, so the user's own keyrings
# are never read or written, and every run starts empty.
#
# Installs gnome-keyring, libsecret-tools (secret-tool) and dbus-x11 when missing. Quiet on
# success; exits with CMD's status; leaves no daemon behind (the bus ends with CMD, and the
# keyring daemon is stopped by the PID this script started).
#
# CMD sees DBUS_SESSION_BUS_ADDRESS (the private bus) and CAW_BOX_TEST_KEYRING (the temporary
# directory: tests that write to the keyring insist on it, so they never touch a real one).
set -euo pipefail

say() { printf 'with-keyring: %s\n' "$*" >&2; }
die() { say "$*"; exit 1; }

as_root() {
    if [ "$(id -u)" = 0 ]; then "$@"; else sudo -n "$@"; fi
}

# A background job of a script starts with SIGINT/SIGQUIT ignored; CMD and the inner script
# run as such jobs (so signals can be forwarded) and get the defaults back through this,
# so Ctrl-C still reaches CMD directly.
defaults=()
if env --default-signal=INT,QUIT true 2>/dev/null; then defaults=(env --default-signal=INT,QUIT); fi

# --- inside the private bus (re-invoked by dbus-run-session below) -------------------------
if [ "${1:-}" = "--inside-bus" ]; then
    shift
    dir=${CAW_BOX_TEST_KEYRING:?}
    mkdir -m 700 "$dir/run" "$dir/data"
    pid=
    stop_daemon() {
        [ -n "$pid" ] || return 0
        kill -TERM "$pid" 2>/dev/null || true
        local i
        for i in $(seq 1 50); do
            kill -0 "$pid" 2>/dev/null || break
            sleep 0.1
        done
        kill -KILL "$pid" 2>/dev/null || true
        wait "$pid" 2>/dev/null || true
        pid=
    }
    trap stop_daemon EXIT
    trap 'exit 130' INT
    trap 'exit 143' TERM HUP

    # --foreground: no fork, so $! is the daemon itself and we can stop exactly it.
    # XDG_DATA_HOME/XDG_RUNTIME_DIR only for the daemon: the keyring files and its control
    # socket go to the temporary directory. --unlock reads the password from stdin and creates
    # the login keyring with it (unlocked) when there is none.
    printf 'caw-box-test' | XDG_DATA_HOME="$dir/data" XDG_RUNTIME_DIR="$dir/run" \
        gnome-keyring-daemon --foreground --unlock --components=secrets \
        >"$dir/gnome-keyring.log" 2>&1 &
    pid=$!

    # Wait until our daemon owns the Secret Service name. (Asking the name itself earlier
    # would let D-Bus activation start a second, locked daemon.)
    ready=
    for _ in $(seq 1 100); do
        if ! kill -0 "$pid" 2>/dev/null; then break; fi
        if dbus-send --session --print-reply --dest=org.freedesktop.DBus / \
            org.freedesktop.DBus.NameHasOwner string:org.freedesktop.secrets 2>/dev/null \
            | grep -q 'boolean true'; then
            ready=1
            break
        fi
        sleep 0.1
    done
    if [ -z "$ready" ]; then
        cat "$dir/gnome-keyring.log" >&2 || true
        die "gnome-keyring-daemon did not start a Secret Service on the private bus"
    fi

    # CMD runs as a child we can signal (stdin passed on explicitly: a background job's would
    # be /dev/null); a TERM/INT/HUP forwarded from the outer script stops it, then the EXIT
    # trap stops the daemon.
    "${defaults[@]}" "$@" <&0 &
    cmd=$!
    echo $$ >"$dir/inner.pid"
    trap 'kill -TERM "$cmd" 2>/dev/null || true' INT TERM HUP
    rc=0
    while :; do
        wait "$cmd" && rc=0 || rc=$?
        kill -0 "$cmd" 2>/dev/null || break
    done
    exit "$rc"
fi

# --- outside: make sure the tools exist, then start the private bus ------------------------
[ $# -gt 0 ] || die "usage: scripts/with-keyring.sh CMD [ARG...]"

missing=()
command -v dbus-run-session >/dev/null 2>&1 || missing+=(dbus)
command -v dbus-send >/dev/null 2>&1 || missing+=(dbus)
command -v gnome-keyring-daemon >/dev/null 2>&1 || missing+=(gnome-keyring)
command -v secret-tool >/dev/null 2>&1 || missing+=(libsecret-tools)
command -v dbus-launch >/dev/null 2>&1 || missing+=(dbus-x11)
if [ ${#missing[@]} -gt 0 ]; then
    command -v apt-get >/dev/null 2>&1 \
        || die "missing tools and no apt-get: install ${missing[*]} (gnome-keyring, libsecret-tools, dbus-x11)"
    export DEBIAN_FRONTEND=noninteractive
    log=$(mktemp "${TMPDIR:-/tmp}/caw-box-apt.XXXXXX")
    if ! { as_root apt-get update -qq && as_root apt-get install -y -qq --no-install-recommends \
        gnome-keyring libsecret-tools dbus-x11 dbus; } >"$log" 2>&1; then
        tail -n 20 "$log" >&2
        rm -f "$log"
        die "installing gnome-keyring libsecret-tools dbus-x11 failed (needs root or passwordless sudo)"
    fi
    rm -f "$log"
fi

CAW_BOX_TEST_KEYRING=$(mktemp -d "${TMPDIR:-/tmp}/caw-box-keyring.XXXXXX")
export CAW_BOX_TEST_KEYRING
trap 'rm -rf "$CAW_BOX_TEST_KEYRING"' EXIT

# dbus-daemon as root warns on every start that it cannot raise its fd limit in a container:
# a one-line shim sends the bus daemon's own output to a log, so success stays quiet.
cat >"$CAW_BOX_TEST_KEYRING/dbus-daemon" <<EOF
#!/bin/sh
exec $(command -v dbus-daemon) "\$@" 2>>"$CAW_BOX_TEST_KEYRING/dbus-daemon.log"
EOF
chmod +x "$CAW_BOX_TEST_KEYRING/dbus-daemon"

# Not exec: the EXIT trap removes the temporary keyring afterwards. In the background, so a
# TERM/INT/HUP sent to this script alone is passed on to the inner script (which stops CMD
# and the daemon; the bus ends with it) instead of leaving them running.
"${defaults[@]}" dbus-run-session --dbus-daemon="$CAW_BOX_TEST_KEYRING/dbus-daemon" -- \
    "$(cd "$(dirname "$0")" && pwd)/$(basename "$0")" --inside-bus "$@" <&0 &
session=$!
forward() {
    local inner
    inner=$(cat "$CAW_BOX_TEST_KEYRING/inner.pid" 2>/dev/null) && kill -TERM "$inner" 2>/dev/null
    return 0
}
trap forward INT TERM HUP
rc=0
while :; do
    wait "$session" && rc=0 || rc=$?
    kill -0 "$session" 2>/dev/null || break
done
exit "$rc"
