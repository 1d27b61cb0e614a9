#!/usr/bin/env bash
# `make bench`: builds release binaries and runs the benchmark program (benches/bench.rs).
# `scripts/bench.sh --smoke` is the short run that `make test` does, so it cannot rot: it runs
# the debug build the tests already made (its numbers are not held to the targets, and a
# fat-LTO release build would cost CI minutes for nothing it checks).
set -euo pipefail
cd "$(dirname "$0")/.."
if [[ " $* " == *" --smoke "* ]]; then
    exec cargo bench --workspace --profile dev --quiet --bench bench -- "$@"
fi
cargo build --release --quiet --bin caw-box
cargo bench --quiet --bench bench -- "$@"
