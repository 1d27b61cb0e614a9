#!/usr/bin/env bash
# Builds what the tests and the demo run on: the local base (no registry here), the four
# provider images through `caw-box image build`, and the stub model's image.
# `image build` skips an image whose inputs did not change: a second run takes a second.
# It builds every target (tests included) in the one configuration the tests use, so the
# test run that follows compiles nothing more.
set -euo pipefail
cd "$(dirname "$0")/.."
CA_BUNDLE=${CA_BUNDLE:-/etc/ssl/certs/ca-certificates.crt}
ca=()
[ -f "$CA_BUNDLE" ] && ca=(--ca-cert "$CA_BUNDLE")

scripts/rig.sh base
cargo build --workspace --all-targets --quiet
"${CARGO_TARGET_DIR:-target}"/debug/caw-box image build --all --base caw-box-local/node:20-bookworm "${ca[@]}"
scripts/stub-image.sh
