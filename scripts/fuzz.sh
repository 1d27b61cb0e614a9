#!/usr/bin/env bash
# `make fuzz`: the property tests of tests/fuzz.rs (every parser of untrusted input) with
# 1,000,000 inputs per parser, in an optimised build with overflow checks (profile `fuzz`).
# Prints how many inputs each parser got. No Docker needed.
#   CAW_BOX_FUZZ_CASES=N   inputs per parser (default 1000000)
#   CAW_BOX_FUZZ_SEED=S    replay a run (a failure prints its seed)
# Extra arguments go to nextest, e.g. `scripts/fuzz.sh -E 'test(handle)'`.
#   scripts/fuzz.sh --smoke   what `make test` runs so this cannot rot: the same commands on
#                             the debug build the tests made (profile dev: the fuzz profile's
#                             optimised build of every dependency costs minutes) and 1,000
#                             inputs per parser, a few seconds
set -euo pipefail
cd "$(dirname "$0")/.."
profile=fuzz
cases=1000000
build=(--profile fuzz --test fuzz)
scope=()
if [ "${1:-}" = --smoke ]; then
    shift
    profile=dev
    cases=1000
    # --workspace: features resolve as in the tests' build, so nothing compiles again.
    build=(--workspace --tests)
    scope=(--workspace)
fi
export CAW_BOX_FUZZ_CASES=${CAW_BOX_FUZZ_CASES:-$cases}
report=$(mktemp)
trap 'rm -f "$report"' EXIT
export CAW_BOX_FUZZ_REPORT=$report

nice cargo build "${build[@]}" --quiet
start=$(date +%s)
status=0
nice cargo nextest run --cargo-profile "$profile" "${scope[@]}" --test fuzz --no-fail-fast \
    --test-threads "$(nproc)" --status-level fail "$@" || status=$?
took=$(($(date +%s) - start))

echo "== inputs per parser (CAW_BOX_FUZZ_CASES=$CAW_BOX_FUZZ_CASES, profile $profile, $(nproc) cores)"
printf '%-28s %12s %9s %13s\n' parser inputs seconds slowest-ms
sort "$report" | awk -F'\t' '{printf "%-28s %12d %9.1f %13.3f\n", $1, $2, $3, $4}'
echo "== ${took}s in all; $([ $status = 0 ] && echo 'no panic, no hang, every property held' || echo FAILED)"
exit $status
