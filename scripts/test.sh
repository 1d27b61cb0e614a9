#!/usr/bin/env bash
# `make test`: lint, unit tests, then the end-to-end suite against real Docker, real vendor
# CLIs and the stub model. Cleans up every test object by label, also after a failure.
set -euo pipefail
cd "$(dirname "$0")/.."
# The Kubernetes tests (tests/e2e/kubernetes.rs) bring ../shared/k8s-lab up and take it
# down themselves; a run killed mid-test still takes the lab down here.
lab_down() {
    if [ -x ../shared/k8s-lab/k8s-lab ]; then ../shared/k8s-lab/k8s-lab down >/dev/null 2>&1 || true; fi
}
trap 'scripts/cleanup.sh; lab_down' EXIT

echo "== lint"
cargo fmt --all -- --check
cargo clippy --workspace --all-targets --quiet -- -D warnings

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
