#!/usr/bin/env bash
# `make test`: lint, unit tests, then the end-to-end suite against real Docker, real vendor
# CLIs and the stub model. Cleans up every test object by label, also after a failure.
set -euo pipefail
cd "$(dirname "$0")/.."
trap 'scripts/cleanup.sh' EXIT

echo "== lint"
cargo fmt --all -- --check
cargo clippy --workspace --all-targets --quiet -- -D warnings
scripts/lint-workflows.sh

echo "== images"
scripts/images.sh
scripts/rig.sh tools

echo "== tests"
export CAW_BOX_RIG_PID_FILE=${CAW_BOX_RIG_DIR:-/var/tmp/caw-box-rig}/dockerd.pid
# The daemon-restart test restarts the Docker daemon under every other test: it runs alone.
cargo nextest run --workspace --no-fail-fast --test-threads 3 \
    -E 'not test(daemon_restart) & not binary(keyring)' "$@"
# The OS keyring tests run against a real Secret Service of their own.
scripts/with-keyring.sh cargo nextest run --no-fail-fast --test keyring "$@"
cargo nextest run --workspace --no-fail-fast -E 'test(daemon_restart)' "$@"

echo "== bench (smoke)"
scripts/bench.sh --smoke
