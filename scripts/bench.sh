#!/usr/bin/env bash
# `make bench`: builds release binaries and runs the benchmark program (benches/bench.rs),
# then the Python part (python/bench.py; `--only python` runs just that) and the MCP part
# (tests/mcp/bench.py: `caw-box mcp` start + wait against run -d + wait; `--only mcp`).
# The peak RSS of a turn: of the static musl binary a release ships and of the gnu release
# build, side by side (the first holds the 10 MiB target).
# `scripts/bench.sh --smoke` is the short run that `make test` does, so it cannot rot: it runs
# the debug build the tests already made (its numbers are not held to the targets, and a
# fat-LTO release build would cost CI minutes for nothing it checks).
set -euo pipefail
cd "$(dirname "$0")/.."
target=${CARGO_TARGET_DIR:-$PWD/target}
# The peak RSS of a turn is measured of the binary users install, the static musl one
# (`make dist`), beside this bench's gnu build: the smoke run takes it when the stage dist
# built it before (`make test`), the full run builds it.
shipped=$target/x86_64-unknown-linux-musl/release/caw-box
if [[ " $* " == *" --smoke "* ]]; then
    [ ! -x "$shipped" ] || export CAW_BOX_BENCH_SHIPPED=$shipped
    exec cargo bench --workspace --profile dev --quiet --bench bench -- "$@"
fi
cargo build --release --quiet --bin caw-box
if [[ " $* " != *" --only "* ]] || [[ " $* " == *" --only turns "* ]]; then
    CAW_BOX_BENCH_SHIPPED=$(scripts/dist.sh binary)
    export CAW_BOX_BENCH_SHIPPED
fi
if [[ " $* " == *" --only mcp "* ]]; then
    exec "$(scripts/mcp-venv.sh)" tests/mcp/bench.py "$target/release/caw-box"
fi
if [[ " $* " != *" --only "* ]] || [[ " $* " == *" --only python "* ]]; then
    # A missed target fails the run, after the Python part has measured too.
    rust=0
    if [[ " $* " != *" --only python "* ]]; then
        cargo bench --quiet --bench bench -- "$@" || rust=$?
    fi
    # The Python part (python/bench.py): `Session.send` against the CLI's turn, with the
    # wheel built as published (release profile) into a virtualenv of its own.
    venv=$target/bench-python-venv
    [ -x "$venv/bin/python" ] || python3 -m venv "$venv"
    # bench.py takes the tests' rig (python/tests/conftest.py), which imports pytest.
    "$venv/bin/pip" install --quiet --disable-pip-version-check pytest
    CARGO_TARGET_DIR=$target CAW_BOX_WHEEL_PROFILE=release \
        "$venv/bin/pip" install --quiet --disable-pip-version-check --force-reinstall ./python
    "$venv/bin/python" python/bench.py
    mcp=0
    if [[ " $* " != *" --only python "* ]]; then
        "$(scripts/mcp-venv.sh)" tests/mcp/bench.py "$target/release/caw-box" || mcp=$?
    fi
    [ "$rust" = 0 ] || exit "$rust"
    exit "$mcp"
else
    cargo bench --quiet --bench bench -- "$@"
fi
