#!/usr/bin/env bash
# `make test`'s stage `targets`: the documented targets and scripts that no other stage runs,
# run cheaply so that none of them rots unseen (issue 32: `make drift` died at once, unseen,
# because nothing ran it). About 15 s on the 2-core machine (13 s on 2026-11-26).
#
#   1. every target `make help` names has a row in CONTRIBUTING.md's table "What `make test`
#      runs of each target" (which says how it is run here, or why not), and every script or
#      file a target's recipe names (`make -n`) exists
#   2. every relative link in README.md, CONTRIBUTING.md and docs/*.md resolves: the file
#      exists, and an #anchor names one of its headings (scripts/check-links.py; no network,
#      well under a second)
#   3. `make drift`'s planning step (scripts/drift.sh --plan): the pins and npm packages, read
#      from `caw-box --version --json`, the commands a run would take, the e2e tests it names
#      exist. No network, no Docker.
#   4. `make fuzz`'s script with --smoke: the same commands on the debug build, 1,000 inputs
#      per parser
#   5. drift.yml's issue step (scripts/drift-issue.sh) against a stand-in gh: it opens an
#      issue with the table, or comments on the open one
#   6. `make demo`'s script on the images the run built: a codex run and a resume that recalls,
#      against the stub model on an internal network of its own
#   7. scripts/hot-functions.sh --smoke (what makes the list build.rs lays the release binary
#      out by, scripts/hot-functions.txt): one codex turn of the debug build under callgrind,
#      the list made and checked, then thrown away (about 11 s)
#
# Not here, because other stages run them: `make lint` (stage lint runs its commands),
# `make images` (stage images), `make bench` (stage bench-smoke, scripts/bench.sh --smoke),
# scripts/podman.sh (stage podman), ci/run-turn.sh and both CI templates (tests/e2e/ci_action.rs,
# stage main), the GitHub workflows (actionlint in stage lint).
set -euo pipefail
cd "$(dirname "$0")/.."

step() { printf -- '-- %s\n' "$*"; }
fail() { printf 'targets: %s\n' "$*" >&2; exit 1; }

step "every target of make help is in CONTRIBUTING.md's table; every file its recipe names exists"
targets=$(make --no-print-directory help | awk '/^make /{print $2}')
[ -n "$targets" ] || fail "make help names no target"
for t in $targets; do
    grep -q "^| \`make $t\` |" CONTRIBUTING.md \
        || fail "make $t is not in CONTRIBUTING.md's table \"What \`make test\` runs of each target\": add a row saying how make test runs it, or why not"
    # The recipe as make would run it (prerequisites included), without running it.
    recipe=$(make --no-print-directory -n "$t" CARGO=cargo) || fail "make -n $t failed"
    while read -r f; do
        [ -z "$f" ] || [ -e "$f" ] || fail "make $t runs $f, which does not exist"
    done < <(grep -oE '(scripts|ci)/[A-Za-z0-9_./-]+' <<<"$recipe" | sort -u)
done
echo "targets: $(wc -w <<<"$targets") targets, each in CONTRIBUTING.md"

step "every relative link in README.md, CONTRIBUTING.md, ARCHITECTURE.md and docs/*.md resolves"
scripts/check-links.py README.md CONTRIBUTING.md ARCHITECTURE.md docs/*.md \
    || fail "a relative link is broken (named above): fix the link, or the heading it points to"
echo "links: $(cat README.md CONTRIBUTING.md ARCHITECTURE.md docs/*.md | grep -c '](') lines with links, none broken"

step "make drift, its planning step (scripts/drift.sh --plan)"
scripts/drift.sh --plan

step "make fuzz, its script (scripts/fuzz.sh --smoke)"
scripts/fuzz.sh --smoke

step "drift.yml's issue step (scripts/drift-issue.sh) against a stand-in gh"
fake=$(mktemp -d)
trap 'rm -rf "$fake"' EXIT
cat >"$fake/gh" <<'GH'
#!/usr/bin/env bash
# A stand-in gh: records its arguments and the body it is given; `issue list` answers
# $FAKE_GH_OPEN (the number of an open drift issue, or nothing).
printf '%s\n' "$*" >>"$FAKE_GH_DIR/calls"
[ "$1 $2" != "issue list" ] || printf '%s' "${FAKE_GH_OPEN:-}"
while [ $# -gt 0 ]; do
    [ "$1" != --body-file ] || cp "$2" "$FAKE_GH_DIR/body"
    shift
done
GH
chmod +x "$fake/gh"
printf 'CLI          pinned    newest\nclaude_code  1.0.0     2.0.0     FAIL\n' >"$fake/table.txt"
issue() {
    rm -f "$fake/calls" "$fake/body"
    PATH="$fake:$PATH" FAKE_GH_DIR=$fake FAKE_GH_OPEN=$1 GITHUB_REPOSITORY=owner/caw-box \
        DRIFT_TABLE=$fake/table.txt DRIFT_RUN_URL=https://github.invalid/run/1 scripts/drift-issue.sh
}
issue ""
grep -q '^issue create --repo owner/caw-box --title Vendor drift: a newest CLI fails --body-file' "$fake/calls" \
    || fail "no open drift issue, but drift-issue.sh did not open one: $(cat "$fake/calls")"
grep -q 'claude_code  1.0.0     2.0.0     FAIL' "$fake/body" || fail "the issue lacks the table"
grep -q 'https://github.invalid/run/1' "$fake/body" || fail "the issue lacks the run's link"
issue 42
grep -q '^issue comment 42 --repo owner/caw-box --body-file' "$fake/calls" \
    || fail "an open drift issue (#42), but drift-issue.sh did not comment on it: $(cat "$fake/calls")"
! grep -q '^issue create' "$fake/calls" || fail "drift-issue.sh opened a second issue"

step "make demo, its script on the images this run built (scripts/demo.sh)"
out=$(CAW_BOX_DEMO_SKIP_IMAGES=1 scripts/demo.sh 2>&1) || { printf '%s\n' "$out"; fail "the demo failed"; }
printf '%s\n' "$out"
# The resumed turn's answer recalls what the first turn was told.
grep -q marmalade <<<"$(sed -n '/caw-box resume/,$p' <<<"$out")" \
    || fail "the demo's resume did not recall 'marmalade'"

step "the release layout's profiler, one debug turn (scripts/hot-functions.sh --smoke)"
scripts/hot-functions.sh --smoke
