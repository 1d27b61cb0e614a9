#!/usr/bin/env bash
# `make demo`: the main job, end to end, with no vendor account: a Codex session runs a
# turn, then is resumed and recalls what it was told. The model behind the CLI is the
# project's stub model, on an internal Docker network made for the demo (no way out).
# It removes only what it made (its own run label), so it can run beside a test run:
# `make test` runs it on the images it built (CAW_BOX_DEMO_SKIP_IMAGES=1: they are built).
set -euo pipefail
cd "$(dirname "$0")/.."
[ -n "${CAW_BOX_DEMO_SKIP_IMAGES:-}" ] || scripts/images.sh

root=$PWD
run_id=demo-$$
net=caw-box-demo-$$
stub=caw-box-demo-stub-$$
export CAW_BOX_LABELS=io.caw-box.test=demo,io.caw-box.test-run=$run_id
cleanup() {
    docker rm -f "$stub" >/dev/null 2>&1 || true
    "$root/scripts/cleanup.sh" "$run_id"
}
trap cleanup EXIT
docker network create --internal --label io.caw-box.test=demo --label io.caw-box.test-run=$run_id "$net" >/dev/null
docker run -d --name "$stub" --network "$net" --label io.caw-box.test=demo \
    --label io.caw-box.test-run=$run_id -e STUB_EXPECT_KEY=demo-key \
    caw-box-test/stub-model:latest >/dev/null

workspace=$(mktemp -d)
chmod 777 "$workspace"
cd "$workspace"
caw=${CARGO_TARGET_DIR:-$root/target}/debug/caw-box
common=(--env OPENAI_API_KEY=demo-key)

echo "\$ caw-box run --provider codex --network $net --endpoint http://$stub:8080 --model gpt-5.5 \"REMEMBER:marmalade\""
out=$("$caw" run --provider codex --network "$net" --endpoint "http://$stub:8080" --model gpt-5.5 \
    "${common[@]}" -o json "Please REMEMBER:marmalade")
echo "$out"
session=$(printf '%s' "$out" | python3 -c 'import json,sys; print(json.load(sys.stdin)["session_id"])')

echo
echo "\$ caw-box resume $session \"RECALL\""
"$caw" resume "$session" "${common[@]}" "RECALL what I asked you to remember"
