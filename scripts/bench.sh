#!/usr/bin/env bash
# `make bench`: builds release binaries and runs the benchmark program (benches/bench.rs).
# `scripts/bench.sh --smoke` is the short run that `make test` does, so it cannot rot.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release --quiet --bin caw-box
cargo bench --quiet --bench bench -- "$@"
