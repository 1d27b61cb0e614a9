#!/usr/bin/env bash
# `make drift`: are the vendor CLIs' newest releases still working with caw-box?
#
# Builds the four provider images at the newest versions npm offers (`--cli-version`) under
# their own repository (caw-box-drift/*, so the pinned caw-box/* images stay as they are),
# runs the core end-to-end checks against them, and prints a table: CLI, pinned, newest,
# pass/fail per check. Also writes target/drift.json and the checked versions' rows of the
# table in docs/compatibility.md (scripts/drift-doc.py); logs go to target/drift/.
# Exit 1 when a build or a check failed. Not part of `make test` (it takes the network and
# ~15 minutes); its planning step is:
#
#   scripts/drift.sh --plan             no network, no Docker: the pins and npm packages (read
#                                       from `caw-box --version --json`, the one place they
#                                       live), the commands a run would take, and a check that
#                                       every e2e test it names exists. Exit 2 when one is missing.
#   scripts/drift.sh --provider P ...   only these providers (repeatable), e.g. to bump one pin
#   scripts/drift.sh --provider P --cli-version V
#                                       that version instead of the newest (a candidate for a
#                                       pin when the newest fails); one provider only
#
# Checks and the tests that make them (tests/e2e; CAW_BOX_E2E_IMAGE_REPO points the rig at
# the drift images):
#   run, tool call, resume recall, usage   sessions::<p>_runs_a_tool_and_recalls_after_resume
#                                          (one test, in that order; its `e2e check:` marks
#                                          name the check that failed, later ones show `-`)
#   interactive                            the provider's TUI test in interactive.rs
#   features                               every other e2e test that names the provider
#                                          (agent config and MCP, cost and its default
#                                          model, usage limits, hardening, logins): a CLI
#                                          can pass the core and still break one of these
#                                          (claude 2.1.332 did: MCP tools, system prompt,
#                                          default model). Not the Kubernetes and gVisor
#                                          tests (a lab, runsc) nor images:: (the pinned
#                                          caw-box/* images)
# shellcheck disable=SC2016 # backquotes in messages are Markdown; xargs' sh -c expands its own
set -uo pipefail
cd "$(dirname "$0")/.." || exit 2

REPO=caw-box-drift
LOCAL_BASE=${CAW_BOX_LOCAL_BASE:-caw-box-local/node:20-bookworm}
CA_BUNDLE=${CA_BUNDLE:-/etc/ssl/certs/ca-certificates.crt}
OUT=target/drift
JSON=target/drift.json
DOC=docs/compatibility.md
PROVIDERS=(claude_code codex opencode gemini)
ALL_PROVIDERS=("${PROVIDERS[@]}")
CHECKS=("run" "tool call" "resume recall" "usage" "interactive" "features")
JOBS=${DRIFT_JOBS:-3}

die() { printf 'drift: %s\n' "$*" >&2; exit 2; }

plan=0
only=()
asked=
while [ $# -gt 0 ]; do
    case $1 in
        --plan) plan=1 ;;
        --provider)
            [ $# -ge 2 ] || die "--provider needs a provider, e.g. --provider claude_code"
            only+=("$2")
            shift
            ;;
        --cli-version)
            [ $# -ge 2 ] || die "--cli-version needs a version, e.g. --cli-version 2.1.300"
            asked=$2
            shift
            ;;
        *) die "unknown argument '$1'; usage: scripts/drift.sh [--plan] [--provider P]... [--cli-version V]" ;;
    esac
    shift
done
if [ ${#only[@]} -gt 0 ]; then
    for p in "${only[@]}"; do
        [[ " ${PROVIDERS[*]} " == *" $p "* ]] || die "unknown provider '$p'; valid: ${PROVIDERS[*]}"
    done
    PROVIDERS=("${only[@]}")
fi
[ -z "$asked" ] || [ ${#only[@]} = 1 ] \
    || die "--cli-version needs exactly one --provider, e.g. --provider claude_code --cli-version $asked"
CAW=${CARGO_TARGET_DIR:-target}/debug/caw-box

ca=()
[ -f "$CA_BUNDLE" ] && ca=(--ca-cert "$CA_BUNDLE")

# Field $1 (npm_package, cli_version) of provider $2 in `caw-box --version --json`: the pins
# live in the code (src/provider_kind.rs), and the binary says what they are.
pins_json=
pin() {
    python3 -c '
import json, sys
report = json.loads(sys.argv[1])
for p in report["providers"]:
    if p["provider"] == sys.argv[2]:
        print(p.get(sys.argv[3], ""))
' "$pins_json" "$2" "$1"
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

# The provider's other e2e tests (`features`), from the suite's list ($listed).
features_of() {
    local name=${1%_code} core
    core=$(tests_of "$1")
    awk '{print $2}' <<<"$listed" | grep -F "$name" \
        | grep -vE '^(kubernetes|runtime|images)::' | grep -vxF "$core" || true
}

cargo build --workspace --quiet || die "cargo build failed"
pins_json=$("$CAW" --version --json) || die "$CAW --version --json failed"
declare -A package pinned newest built
for p in "${PROVIDERS[@]}"; do
    package[$p]=$(pin npm_package "$p") || die "cannot read the pins from \`caw-box --version --json\`"
    pinned[$p]=$(pin cli_version "$p")
    { [ -n "${package[$p]}" ] && [ -n "${pinned[$p]}" ]; } \
        || die "no npm package or pin for $p in \`caw-box --version --json\`: $pins_json"
done

cargo build --workspace --tests --quiet || die "the tests do not build"
listed=$(cargo nextest list --workspace --test e2e --message-format oneline 2>/dev/null) \
    || die "cargo nextest list --test e2e failed"

if [ "$plan" = 1 ]; then
    # Every test a run names must exist, or its check would read as a vendor failure.
    missing=0
    for p in "${PROVIDERS[@]}"; do
        printf '%-12s %-28s pinned %s\n' "$p" "${package[$p]}" "${pinned[$p]}"
        printf '  npm view %s version\n' "${package[$p]}"
        printf '  CAW_BOX_IMAGE_REPO=%s caw-box image build --provider %s --cli-version NEWEST --base %s%s -q\n' \
            "$REPO" "$p" "$LOCAL_BASE" "$([ ${#ca[@]} -gt 0 ] && echo " --ca-cert $CA_BUNDLE")"
        while read -r t; do
            printf '  CAW_BOX_E2E_IMAGE_REPO=%s cargo nextest run --workspace --test e2e -E "test(=%s)"\n' "$REPO" "$t"
            if ! grep -qx ".* $t" <<<"$listed"; then
                printf 'drift: the e2e test %s is not in the suite (renamed?): fix tests_of in %s\n' \
                    "$t" "$0" >&2
                missing=1
            fi
        done < <(tests_of "$p")
        mapfile -t fs < <(features_of "$p")
        [ ${#fs[@]} -gt 0 ] || { printf 'drift: no feature test names %s\n' "$p" >&2; missing=1; }
        printf '  features: %d more tests, each so: %s\n' "${#fs[@]}" "${fs[*]}"
    done
    [ "$missing" = 0 ] || exit 2
    printf 'drift: plan ok: %d providers, pins from `caw-box --version --json`\n' "${#PROVIDERS[@]}" >&2
    exit 0
fi

rm -rf "$OUT" "$JSON"
mkdir -p "$OUT"
scripts/rig.sh base || die "no local base image"
scripts/rig.sh tools || die "the e2e tools (tmux) are missing"
docker image inspect caw-box-test/stub-model:latest >/dev/null 2>&1 || scripts/stub-image.sh \
    || die "the stub model image could not be built"

for p in "${PROVIDERS[@]}"; do
    pkg=${package[$p]}
    if [ -n "$asked" ]; then
        newest[$p]=$asked
        printf 'drift: %s %s as asked (the "newest" column), not npm'"'"'s newest\n' "$p" "$asked" >&2
    else
        newest[$p]=$(npm view "$pkg" version 2>"$OUT/npm-$p.log" | tail -n 1)
    fi
    if [ -z "${newest[$p]}" ]; then
        built[$p]=fail
        printf 'drift: npm view %s failed (%s)\n' "$pkg" "$OUT/npm-$p.log" >&2
        continue
    fi
    printf 'drift: building %s %s\n' "$p" "${newest[$p]}" >&2
    if CAW_BOX_IMAGE_REPO=$REPO nice "$CAW" image build --provider "$p" \
        --cli-version "${newest[$p]}" --base "$LOCAL_BASE" "${ca[@]}" -q >"$OUT/build-$p.log" 2>&1; then
        built[$p]=pass
    else
        built[$p]=fail
        printf 'drift: building %s %s failed:\n' "$p" "${newest[$p]}" >&2
        tail -n 5 "$OUT/build-$p.log" >&2
    fi
done

# A test may use another provider too (a fallback from codex to claude): with --provider, the
# others run at their pins: their caw-box/* images are tagged into $REPO.
for p in "${ALL_PROVIDERS[@]}"; do
    [[ " ${PROVIDERS[*]} " == *" $p "* ]] && continue
    image=$(pin image "$p")
    if docker tag "caw-box/$image:latest" "$REPO/$image:latest" 2>/dev/null; then
        printf 'drift: %s at its pin: caw-box/%s:latest as %s/%s:latest\n' "$p" "$image" "$REPO" "$image" >&2
    fi
done

# Each test in a nextest run of its own (its log then is its own, with a passing test's output
# too: its `drift warning` lines), $JOBS at a time.
tests=()
for p in "${PROVIDERS[@]}"; do
    [ "${built[$p]}" = pass ] && while read -r t; do tests+=("$t"); done < <(tests_of "$p"; features_of "$p")
done
printf 'drift: running %d e2e tests against %s/* images\n' "${#tests[@]}" "$REPO" >&2
export CAW_BOX_E2E_IMAGE_REPO=$REPO
printf '%s\n' "${tests[@]}" | xargs -P "$JOBS" -I{} sh -c \
    'cargo nextest run --workspace --test e2e --no-fail-fast --success-output immediate -E "test(={})" >"$1/{}.log" 2>&1; echo $? >"$1/{}.rc"' \
    _ "$OUT"

# Per check: pass, FAIL, or - (not run: the build failed, or an earlier check of the same
# test failed).
declare -A result broken
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
    result[$p,features]=pass
    broken[$p]=
    while read -r t; do
        [ "$(cat "$OUT/$t.rc" 2>/dev/null)" = 0 ] && continue
        result[$p,features]=FAIL
        broken[$p]+=" $t"
        failed=1
    done < <(features_of "$p")
done

# What a passing test noted for the person bumping a pin, not a failure: `e2e check: drift
# warning: …` lines (a newest CLI whose default model no price list has yet: its turns are
# `priced: false` until the table or a config `[prices]` entry has it).
mapfile -t warnings < <(cat "$OUT"/*.log 2>/dev/null | grep -o 'e2e check: drift warning: .*' \
    | sed 's/^e2e check: drift warning: //' | sort -u)

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
    for p in "${PROVIDERS[@]}"; do
        [ -z "${broken[$p]:-}" ] || printf '%s features failed:%s\n' "$p" "${broken[$p]}"
    done
    for w in "${warnings[@]}"; do printf 'warning: %s\n' "$w"; done
} | sed "s/ *$//" | tee "$OUT/table.txt"

{
    printf '{\n  "date": "%s",\n  "image_repo": "%s",\n  "providers": [\n' \
        "$(date -u +%Y-%m-%dT%H:%M:%SZ)" "$REPO"
    n=0
    for p in "${PROVIDERS[@]}"; do
        n=$((n + 1))
        printf '    {"provider": "%s", "package": "%s", "pinned": "%s", "newest": "%s", "build": "%s", "checks": {' \
            "$p" "${package[$p]}" "${pinned[$p]}" "${newest[$p]:-}" "${built[$p]}"
        m=0
        for c in "${CHECKS[@]}"; do
            m=$((m + 1))
            case ${result[$p,$c]} in pass) r=pass ;; FAIL) r=fail ;; *) r="not run" ;; esac
            printf '"%s": "%s"%s' "$c" "$r" \
                "$([ $m -lt ${#CHECKS[@]} ] && echo ', ')"
        done
        printf '}, "failed_features": ['
        m=0
        for t in ${broken[$p]:-}; do
            [ $m = 0 ] || printf ', '
            printf '"%s"' "$t"
            m=1
        done
        printf ']}%s\n' "$([ $n -lt ${#PROVIDERS[@]} ] && echo ,)"
    done
    printf '  ],\n  "warnings": ['
    m=0
    for w in "${warnings[@]}"; do
        [ $m = 0 ] || printf ', '
        printf '"%s"' "${w//\"/\\\"}"
        m=1
    done
    printf ']\n}\n'
} >"$JSON"
# The compatibility page's table of every version checked: this run's rows replace those of
# the same versions (docs and the weekly workflow's result are one source).
scripts/drift-doc.py "$JSON" "$DOC" || printf 'drift: could not update %s\n' "$DOC" >&2

if [ "$failed" = 1 ]; then
    printf '\ndrift: failures; logs in %s/:\n' "$OUT" >&2
    for p in "${PROVIDERS[@]}"; do
        [ "${built[$p]}" = pass ] || { printf '  %s\n' "$OUT/build-$p.log" >&2; continue; }
        while read -r t; do
            [ "$(cat "$OUT/$t.rc" 2>/dev/null)" = 0 ] || printf '  %s\n' "$OUT/$t.log" >&2
        done < <(tests_of "$p"; features_of "$p")
    done
    exit 1
fi
printf '\ndrift: every newest CLI passes; bump a pin with evidence: %s\n' "$JSON" >&2
