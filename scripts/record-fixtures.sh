#!/usr/bin/env bash
# Records real vendor CLI output for the parser tests: drives each provider through caw-box
# against the stub model (on an internal network made here) and copies the raw stdout that
# caw-box keeps per turn in the state volume (.caw-box/turns/N.raw.jsonl) to
# tests/fixtures/<provider>/. Re-run when the pinned CLI versions move.
set -euo pipefail
cd "$(dirname "$0")/.."
run_id=fixtures-$$
net=caw-box-fixtures-$$
stub=caw-box-fixtures-stub-$$
export CAW_BOX_LABELS=io.caw-box.test-run=$run_id
export CAW_BOX_DATA_DIR=$(mktemp -d)
root=$PWD
trap 'docker rm -f "$stub" >/dev/null 2>&1; "$root/scripts/cleanup.sh"; rm -rf "$CAW_BOX_DATA_DIR"' EXIT
docker network create --internal --label io.caw-box.test-run=$run_id "$net" >/dev/null
docker run -d --name "$stub" --network "$net" --label io.caw-box.test-run=$run_id \
    -e STUB_EXPECT_KEY=fixture-key caw-box-test/stub-model:latest >/dev/null
ws=$(mktemp -d); chmod 777 "$ws"; cd "$ws"
caw=$OLDPWD/target/debug/caw-box
fixtures=$OLDPWD/tests/fixtures

record() { # provider key_var model
    local p=$1 key=$2 model=$3 id
    local m=(); [ -n "$model" ] && m=(--model "$model")
    id=$("$caw" run -q --provider "$p" --network "$net" --endpoint "http://$stub:8080" "${m[@]}" \
        --env "$key=fixture-key" -o json "Please REMEMBER:papaya for later." \
        | python3 -c 'import json,sys; print(json.load(sys.stdin)["session_id"])')
    "$caw" resume -q "$id" --env "$key=fixture-key" -o json "RUN:echo fixture-tool-output" >/dev/null || true
    "$caw" resume -q "$id" --env "$key=fixture-key" -o json "RECALL" >/dev/null || true
    "$caw" resume -q "$id" --env "$key=fixture-key" --timeout 20s -o json "FAIL:429" >/dev/null || true
    "$caw" resume -q "$id" --env "$key=wrong-key" --timeout 20s -o json "REMEMBER:x" >/dev/null || true
    mkdir -p "$fixtures/$p"
    local n name
    for n in 1 2 3 4 5; do
        case $n in 1) name=turn1;; 2) name=tool-call;; 3) name=resume;; 4) name=error-429;; 5) name=error-401;; esac
        docker run --rm --network none --user 1000 -v "caw-box-$id:/h:ro" --entrypoint cat \
            caw-box-test/stub-model:latest "/h/.caw-box/turns/$n.raw.jsonl" >"$fixtures/$p/$name.jsonl"
    done
    echo "recorded $p: $(wc -l "$fixtures/$p"/{turn1,tool-call,resume,error-429,error-401}.jsonl | tail -1)"
}
record claude_code ANTHROPIC_API_KEY ""
record codex OPENAI_API_KEY gpt-5.5
record opencode OPENAI_API_KEY stub-model
record gemini GEMINI_API_KEY gemini-2.5-flash
