#!/usr/bin/env bash
# After a failed `make drift` (.github/workflows/drift.yml): opens an issue holding the drift
# table, or comments on the one still open, so a drift that lasts weeks is one issue with a
# comment a week, not one issue a week. Uses the gh CLI (GH_TOKEN, GITHUB_REPOSITORY);
# DRIFT_RUN_URL, when set, links the run whose artifact holds the logs. `make test` runs it
# against a stand-in gh (scripts/test-targets.sh).
# shellcheck disable=SC2016 # the backquotes are Markdown
set -euo pipefail
cd "$(dirname "$0")/.."
TITLE="Vendor drift: a newest CLI fails"
repo=${GITHUB_REPOSITORY:?GITHUB_REPOSITORY names the repository, e.g. owner/caw-box}
table=${DRIFT_TABLE:-target/drift/table.txt}

body=$(mktemp)
trap 'rm -f "$body"' EXIT
{
    printf '`make drift` on %s: a newest vendor CLI fails a core check against caw-box.\n\n' \
        "$(date -u +%Y-%m-%d)"
    if [ -s "$table" ]; then
        printf '```\n%s\n```\n\n' "$(cat "$table")"
    else
        printf 'No table: `make drift` stopped before it (drift itself is broken: see the log).\n\n'
    fi
    [ -z "${DRIFT_RUN_URL:-}" ] || printf 'Logs: %s (artifact `drift`).\n\n' "$DRIFT_RUN_URL"
    printf 'Keep the pins until the failing check is understood; CONTRIBUTING.md, "Vendor drift", says how a pin is bumped.\n'
} >"$body"

number=$(gh issue list --repo "$repo" --state open --search "\"$TITLE\" in:title" \
    --json number,title --jq ".[] | select(.title == \"$TITLE\") | .number" | head -n 1)
if [ -n "$number" ]; then
    gh issue comment "$number" --repo "$repo" --body-file "$body"
    echo "drift-issue: commented on #$number"
else
    gh issue create --repo "$repo" --title "$TITLE" --body-file "$body"
    echo "drift-issue: opened an issue"
fi
