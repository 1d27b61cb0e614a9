#!/usr/bin/env bash
# `make drift`: are the vendor CLIs' newest releases still working with caw-box?
#
# Builds the four provider images at the newest versions npm offers (`--cli-version`) under
# their own repository (caw-box-drift/*, so the pinned caw-box/* images stay as they are),
# runs the core end-to-end checks against them, and prints a table: CLI, pinned, newest,
# pass/fail per check. Also writes target/drift.json; logs go to target/drift/.
# Exit 1 when a build or a check failed. Not part of `make test`.
#
# Checks and the tests that make them (tests/e2e; CAW_BOX_E2E_IMAGE_REPO points the rig at
# the drift images):
#   run, tool call, resume recall, usage   sessions::<p>_runs_a_tool_and_recalls_after_resume
#                                          (one test, in that order; its `e2e check:` marks
#                                          name the check that failed, later ones show `-`)
#   interactive                            the provider's TUI test in interactive.rs
set -uo pipefail
cd "$(dirname "$0")/.."

REPO=caw-box-drift
LOCAL_BASE=${CAW_BOX_LOCAL_BASE:-caw-box-local/node:20-bookworm}
CA_BUNDLE=${CA_BUNDLE:-/etc/ssl/certs/ca-certificates.crt}
OUT=target/drift
JSON=target/drift.json
PROVIDERS=(claude_code codex opencode gemini)
CHECKS=("run" "tool call" "resume recall" "usage" "interactive")
JOBS=${DRIFT_JOBS:-3}

die() { printf 'drift: %s\n' "$*" >&2; exit 2; }

ca=()
[ -f "$CA_BUNDLE" ] && ca=(--ca-cert "$CA_BUNDLE")

variant() {
    case $1 in
        claude_code) echo ClaudeCode ;; codex) echo Codex ;;
        opencode) echo Opencode ;; gemini) echo Gemini ;;
    esac
}

# The value of provider $2's arm in function $1 of src/provider/mod.rs (the pins live there).
provider_fn() {
    awk -v fn="fn $1(" -v arm="ProviderKind::$(variant "$2") =>" '
        index($0, fn) { inside = 1 }
        inside && index($0, arm) { split($0, q, "\""); print q[2]; exit }
        inside && /^    }/ { inside = 0 }
    ' src/provider/mod.rs
}

tests_of() {
    echo "sessions::$1_runs_a_tool_and_recalls_after_resume"
    case $1 in
        claude_code) echo interactive::claude_tui_resumes_a_headless_session_and_hands_it_back ;;
        codex) echo interactive::codex_tui_session_resumes_headless_and_back ;;
        opencode) echo interactive::opencode_tui_session_resumes_headless ;;
        gemini) echo interactive::gemini_tui_session_resumes_headless ;;
    esac
}

rm -rf "$OUT" "$JSON"
mkdir -p "$OUT"
scripts/rig.sh base || die "no local base image"
scripts/rig.sh tools || die "the e2e tools (tmux) are missing"
cargo build --workspace --quiet || die "cargo build failed"
docker image inspect caw-box-test/stub-model:latest >/dev/null 2>&1 || scripts/stub-image.sh \
    || die "the stub model image could not be built"

declare -A pinned newest built
for p in "${PROVIDERS[@]}"; do
    pkg=$(provider_fn npm_package "$p")
    pinned[$p]=$(provider_fn default_cli_version "$p")
    [ -n "$pkg" ] && [ -n "${pinned[$p]}" ] || die "no npm package or pin for $p in src/provider/mod.rs"
    newest[$p]=$(npm view "$pkg" version 2>"$OUT/npm-$p.log" | tail -n 1)
    if [ -z "${newest[$p]}" ]; then
        built[$p]=fail
        printf 'drift: npm view %s failed (%s)\n' "$pkg" "$OUT/npm-$p.log" >&2
        continue
    fi
    printf 'drift: building %s %s\n' "$p" "${newest[$p]}" >&2
    if CAW_BOX_IMAGE_REPO=$REPO nice target/debug/caw-box image build --provider "$p" \
        --cli-version "${newest[$p]}" --base "$LOCAL_BASE" "${ca[@]}" -q >"$OUT/build-$p.log" 2>&1; then
        built[$p]=pass
    else
        built[$p]=fail
        printf 'drift: building %s %s failed:\n' "$p" "${newest[$p]}" >&2
        tail -n 5 "$OUT/build-$p.log" >&2
    fi
done

# Each test in a nextest run of its own (its log then is its own), $JOBS at a time.
tests=()
for p in "${PROVIDERS[@]}"; do
    [ "${built[$p]}" = pass ] && while read -r t; do tests+=("$t"); done < <(tests_of "$p")
done
cargo build --test e2e --quiet || die "the e2e tests do not build"
printf 'drift: running %d e2e tests against %s/* images\n' "${#tests[@]}" "$REPO" >&2
export CAW_BOX_E2E_IMAGE_REPO=$REPO
printf '%s\n' "${tests[@]}" | xargs -P "$JOBS" -I{} sh -c \
    'cargo nextest run --test e2e --no-fail-fast -E "test(={})" >"$1/{}.log" 2>&1; echo $? >"$1/{}.rc"' \
    _ "$OUT"

# Per check: pass, FAIL, or - (not run: the build failed, or an earlier check of the same
# test failed).
declare -A result
failed=0
for p in "${PROVIDERS[@]}"; do
    for c in "${CHECKS[@]}"; do result[$p,$c]=-; done
    [ "${built[$p]}" = pass ] || { failed=1; continue; }
    mapfile -t ts < <(tests_of "$p")
    # The sessions test: run, tool call, resume recall, usage.
    log=$OUT/${ts[0]}.log
    if [ "$(cat "$OUT/${ts[0]}.rc" 2>/dev/null)" = 0 ]; then
        for c in "run" "tool call" "resume recall" "usage"; do result[$p,$c]=pass; done
    else
        failed=1
        last=$(grep -o 'e2e check: .*' "$log" | tail -n 1 | sed 's/^e2e check: //')
        [ -n "$last" ] || last=run
        for c in "run" "tool call" "resume recall" "usage"; do
            if [ "$c" = "$last" ]; then result[$p,$c]=FAIL; break; fi
            result[$p,$c]=pass
        done
    fi
    if [ "$(cat "$OUT/${ts[1]}.rc" 2>/dev/null)" = 0 ]; then
        result[$p,interactive]=pass
    else
        result[$p,interactive]=FAIL
        failed=1
    fi
done

{
    printf '%-12s %-9s %-9s %-6s' CLI pinned newest build
    for c in "${CHECKS[@]}"; do printf ' %-*s' "${#c}" "$c"; done
    printf '\n'
    for p in "${PROVIDERS[@]}"; do
        printf '%-12s %-9s %-9s %-6s' "$p" "${pinned[$p]}" "${newest[$p]:--}" "${built[$p]}"
        for c in "${CHECKS[@]}"; do
            w=${#c}; [ "$w" -lt 4 ] && w=4
            printf ' %-*s' "$w" "${result[$p,$c]}"
        done
        printf '\n'
    done
} | sed "s/ *$//" | tee "$OUT/table.txt"

{
    printf '{\n  "date": "%s",\n  "image_repo": "%s",\n  "providers": [\n' \
        "$(date -u +%Y-%m-%dT%H:%M:%SZ)" "$REPO"
    n=0
    for p in "${PROVIDERS[@]}"; do
        n=$((n + 1))
        printf '    {"provider": "%s", "package": "%s", "pinned": "%s", "newest": "%s", "build": "%s", "checks": {' \
            "$p" "$(provider_fn npm_package "$p")" "${pinned[$p]}" "${newest[$p]:-}" "${built[$p]}"
        m=0
        for c in "${CHECKS[@]}"; do
            m=$((m + 1))
            case ${result[$p,$c]} in pass) r=pass ;; FAIL) r=fail ;; *) r="not run" ;; esac
            printf '"%s": "%s"%s' "$c" "$r" \
                "$([ $m -lt ${#CHECKS[@]} ] && echo ', ')"
        done
        printf '}}%s\n' "$([ $n -lt ${#PROVIDERS[@]} ] && echo ,)"
    done
    printf '  ]\n}\n'
} >"$JSON"

if [ "$failed" = 1 ]; then
    printf '\ndrift: failures; logs in %s/:\n' "$OUT" >&2
    for p in "${PROVIDERS[@]}"; do
        [ "${built[$p]}" = pass ] || { printf '  %s\n' "$OUT/build-$p.log" >&2; continue; }
        while read -r t; do
            [ "$(cat "$OUT/$t.rc" 2>/dev/null)" = 0 ] || printf '  %s\n' "$OUT/$t.log" >&2
        done < <(tests_of "$p")
    done
    exit 1
fi
printf '\ndrift: every newest CLI passes; bump a pin with evidence: %s\n' "$JSON" >&2
