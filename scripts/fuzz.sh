#!/usr/bin/env bash
# `make fuzz`: the property tests of tests/fuzz.rs (every parser of untrusted input) with
# 1,000,000 inputs per parser, in an optimised build with overflow checks (profile `fuzz`).
# Prints how many inputs each parser got. No Docker needed.
#   CAW_BOX_FUZZ_CASES=N   inputs per parser (default 1000000)
#   CAW_BOX_FUZZ_SEED=S    replay a run (a failure prints its seed)
# Extra arguments go to nextest, e.g. `scripts/fuzz.sh -E 'test(handle)'`.
set -euo pipefail
cd "$(dirname "$0")/.."
export CAW_BOX_FUZZ_CASES=${CAW_BOX_FUZZ_CASES:-1000000}
report=$(mktemp)
trap 'rm -f "$report"' EXIT
export CAW_BOX_FUZZ_REPORT=$report

nice cargo build --profile fuzz --test fuzz --quiet
start=$(date +%s)
status=0
nice cargo nextest run --cargo-profile fuzz --test fuzz --no-fail-fast \
    --test-threads "$(nproc)" --status-level fail "$@" || status=$?
took=$(($(date +%s) - start))

echo "== inputs per parser (CAW_BOX_FUZZ_CASES=$CAW_BOX_FUZZ_CASES, profile fuzz, $(nproc) cores)"
printf '%-28s %12s %9s %13s\n' parser inputs seconds slowest-ms
sort "$report" | awk -F'\t' '{printf "%-28s %12d %9.1f %13.3f\n", $1, $2, $3, $4}'
echo "== ${took}s in all; $([ $status = 0 ] && echo 'no panic, no hang, every property held' || echo FAILED)"
exit $status
