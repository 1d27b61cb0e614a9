#!/usr/bin/env bash
# `make soak`: tests/e2e/soak.rs, the one ignored test, against the daemon scripts/rig.sh
# started (it restarts that daemon). $1: how many sessions (default 16). Builds the images
# first, as `make test` does.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/images.sh
export CAW_BOX_RIG_PID_FILE=${CAW_BOX_RIG_DIR:-/var/tmp/caw-box-rig}/dockerd.pid
export CAW_BOX_SOAK_SESSIONS=${1:-16}
exec cargo nextest run --workspace --test e2e --run-ignored only --no-capture \
    -E 'test(=soak::soak_killed_drivers_and_a_daemon_restart_lose_no_turn)'
