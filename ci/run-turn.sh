#!/usr/bin/env bash
# shellcheck disable=SC2016 # the backquotes of the job summary are Markdown
# ci/run-turn.sh: the logic of caw-box's CI templates (action.yml, ci/gitlab/caw-box.gitlab-ci.yml),
# in one place so that a test runs exactly what a runner runs. Three steps, run in order:
#
#   run-turn.sh install   put caw-box on PATH: CAW_BOX_BIN (a binary already here), else the
#                         release archive of CAW_BOX_VERSION (checksum checked), else
#                         `cargo install` from CAW_BOX_SRC (a checkout) or CAW_BOX_GIT
#   run-turn.sh images    CAW_BOX_IMAGES=build (default): `caw-box image build` (skips images
#                         that are up to date); pull: `caw-box image pull` from
#                         CAW_BOX_IMAGE_REPO; skip: nothing
#   run-turn.sh turn      one turn (`run`, or `resume` of CAW_BOX_RESUME), `-o json`; writes
#                         result.json, handle.json and caw-box.patch to CAW_BOX_OUT, and the
#                         outputs to $GITHUB_OUTPUT / $GITHUB_STEP_SUMMARY when set and to
#                         caw-box.env (a GitLab dotenv report) always. Exits with caw-box's code.
#
# Inputs are variables (empty = unset): CAW_BOX_PROVIDER, CAW_BOX_PROMPT or
# CAW_BOX_PROMPT_FILE, CAW_BOX_MODEL, CAW_BOX_ALLOW_HOSTS (comma or newline separated),
# CAW_BOX_TIMEOUT, CAW_BOX_KEY_VAR (the NAME of the variable holding the API key, e.g.
# OPENAI_API_KEY: its value never appears on a command line), CAW_BOX_ENDPOINT,
# CAW_BOX_NETWORK, CAW_BOX_WORKSPACE, CAW_BOX_WORKSPACE_MODE, CAW_BOX_NAME, CAW_BOX_EXTRA_ARGS,
# CAW_BOX_BASE_IMAGE and CAW_BOX_CA_CERT (for `image build`).
set -euo pipefail

say() { printf 'caw-box ci: %s\n' "$*" >&2; }
die() { say "error: $*"; exit 2; }

out_dir() {
    local d=${CAW_BOX_OUT:-${RUNNER_TEMP:-${TMPDIR:-/tmp}}/caw-box-out}
    mkdir -p "$d"
    (cd "$d" && pwd)
}

bin_dir() {
    local d=${CAW_BOX_INSTALL_DIR:-${RUNNER_TEMP:-${TMPDIR:-/tmp}}/caw-box-bin}
    mkdir -p "$d"
    (cd "$d" && pwd)
}

# The caw-box this job uses: the installed one, else whatever is on PATH.
caw() {
    local b
    b="$(bin_dir)/caw-box"
    [ -x "$b" ] || b=caw-box
    "$b" "$@"
}

# Appends NAME=VALUE to a GitHub output file (multi-line safe) when that file is set.
gh_output() {
    [ -n "${GITHUB_OUTPUT:-}" ] || return 0
    local delim="caw_box_$RANDOM$RANDOM$RANDOM"
    printf '%s<<%s\n%s\n%s\n' "$1" "$delim" "$2" "$delim" >>"$GITHUB_OUTPUT"
}

target_triple() {
    local arch os
    arch=$(uname -m)
    os=$(uname -s)
    case "$arch" in arm64) arch=aarch64 ;; esac
    case "$os" in
        Linux) echo "$arch-unknown-linux-musl" ;;
        Darwin) echo "$arch-apple-darwin" ;;
        *) return 1 ;;
    esac
}

cmd_install() {
    local dir
    dir=$(bin_dir)
    if [ -n "${CAW_BOX_BIN:-}" ]; then
        [ -x "$CAW_BOX_BIN" ] || die "CAW_BOX_BIN '$CAW_BOX_BIN' is not an executable"
        ln -sf "$(cd "$(dirname "$CAW_BOX_BIN")" && pwd)/$(basename "$CAW_BOX_BIN")" "$dir/caw-box"
        say "using $CAW_BOX_BIN"
    elif [ -n "${CAW_BOX_VERSION:-}" ] && [ -n "${CAW_BOX_RELEASES:-}" ] && triple=$(target_triple); then
        # A release archive and its checksum (see .github/workflows/release.yml).
        local name="caw-box-${CAW_BOX_VERSION}-$triple" tmp
        tmp=$(mktemp -d)
        curl -fsSL -o "$tmp/$name.tar.gz" "$CAW_BOX_RELEASES/v${CAW_BOX_VERSION}/$name.tar.gz"
        curl -fsSL -o "$tmp/$name.tar.gz.sha256" "$CAW_BOX_RELEASES/v${CAW_BOX_VERSION}/$name.tar.gz.sha256"
        (cd "$tmp" && sha256sum -c "$name.tar.gz.sha256" >&2)
        tar -xzf "$tmp/$name.tar.gz" -C "$tmp"
        install -m 0755 "$tmp/$name/caw-box" "$dir/caw-box"
        rm -rf "$tmp"
        say "installed caw-box $CAW_BOX_VERSION ($triple)"
    elif [ -n "${CAW_BOX_SRC:-}" ]; then
        cargo install --locked --path "$CAW_BOX_SRC" --root "$dir/.." --bin caw-box >&2
        [ "$(bin_dir)/caw-box" -ef "$dir/../bin/caw-box" ] || ln -sf "$(cd "$dir/../bin" && pwd)/caw-box" "$dir/caw-box"
    else
        cargo install --locked --git "${CAW_BOX_GIT:?set CAW_BOX_BIN, CAW_BOX_VERSION or CAW_BOX_SRC}" \
            ${CAW_BOX_REF:+--rev "$CAW_BOX_REF"} --root "$dir/.." --bin caw-box >&2
        ln -sf "$(cd "$dir/../bin" && pwd)/caw-box" "$dir/caw-box"
    fi
    [ -z "${GITHUB_PATH:-}" ] || echo "$dir" >>"$GITHUB_PATH"
    caw --version >&2
}

cmd_images() {
    local provider=${CAW_BOX_PROVIDER:?CAW_BOX_PROVIDER is required}
    case "${CAW_BOX_IMAGES:-build}" in
        build)
            local args=(image build --provider "$provider")
            [ -z "${CAW_BOX_BASE_IMAGE:-}" ] || args+=(--base "$CAW_BOX_BASE_IMAGE")
            [ -z "${CAW_BOX_CA_CERT:-}" ] || args+=(--ca-cert "$CAW_BOX_CA_CERT")
            caw "${args[@]}"
            ;;
        pull)
            [ -n "${CAW_BOX_IMAGE_REPO:-}" ] || die "CAW_BOX_IMAGES=pull needs CAW_BOX_IMAGE_REPO"
            caw image pull --provider "$provider"
            ;;
        skip) say "images: skipped" ;;
        *) die "CAW_BOX_IMAGES must be build, pull or skip, not '$CAW_BOX_IMAGES'" ;;
    esac
}

# The value of "key":"string" in one line of compact JSON (caw-box's -o json), unescaped
# enough for ids, statuses and names.
json_str() {
    sed -n "s/.*\"$1\":\"\\([^\"]*\\)\".*/\\1/p" <<<"$2" | head -n 1
}

cmd_turn() {
    local out args=() code=0
    out=$(out_dir)
    if [ -n "${CAW_BOX_RESUME:-}" ]; then
        args=(resume "$CAW_BOX_RESUME")
    else
        args=(run --provider "${CAW_BOX_PROVIDER:?CAW_BOX_PROVIDER is required}")
        [ -z "${CAW_BOX_MODEL:-}" ] || args+=(--model "$CAW_BOX_MODEL")
        [ -z "${CAW_BOX_ENDPOINT:-}" ] || args+=(--endpoint "$CAW_BOX_ENDPOINT")
        [ -z "${CAW_BOX_NETWORK:-}" ] || args+=(--network "$CAW_BOX_NETWORK")
        [ -z "${CAW_BOX_NAME:-}" ] || args+=(--name "$CAW_BOX_NAME")
        [ -z "${CAW_BOX_WORKSPACE_MODE:-}" ] || args+=(--workspace-mode "$CAW_BOX_WORKSPACE_MODE")
        local h
        for h in $(tr ',\n' '  ' <<<"${CAW_BOX_ALLOW_HOSTS:-}"); do
            args+=(--allow-host "$h")
        done
    fi
    [ -z "${CAW_BOX_WORKSPACE:-}" ] || args+=(--workspace "$CAW_BOX_WORKSPACE")
    [ -z "${CAW_BOX_TIMEOUT:-}" ] || args+=(--timeout "$CAW_BOX_TIMEOUT")
    if [ -n "${CAW_BOX_KEY_VAR:-}" ]; then
        [ -n "${!CAW_BOX_KEY_VAR:-}" ] || die "the key variable $CAW_BOX_KEY_VAR is empty: map the CI secret to it"
        # By name: caw-box reads the value from its environment, no command line shows it.
        args+=(--env "$CAW_BOX_KEY_VAR")
    fi
    # shellcheck disable=SC2206 # word splitting of extra flags is the point
    [ -z "${CAW_BOX_EXTRA_ARGS:-}" ] || args+=($CAW_BOX_EXTRA_ARGS)
    args+=(-o json)
    if [ -n "${CAW_BOX_PROMPT_FILE:-}" ]; then
        args+=(--prompt-file "$CAW_BOX_PROMPT_FILE")
    else
        args+=(-- "${CAW_BOX_PROMPT:?set CAW_BOX_PROMPT or CAW_BOX_PROMPT_FILE}")
    fi

    caw "${args[@]}" >"$out/result.json" || code=$?
    local result id status handle="" patch=""
    result=$(tail -n 1 "$out/result.json")
    id=$(json_str session_id "$result")
    status=$(json_str status "$result")
    if [ -n "$id" ]; then
        handle=$(caw handle "$id")
        printf '%s\n' "$handle" >"$out/handle.json"
        if caw diff "$id" --patch "$out/caw-box.patch"; then
            patch="$out/caw-box.patch"
        else
            say "no patch for session $id (see the message above)"
        fi
    fi

    gh_output result "$result"
    gh_output result-file "$out/result.json"
    gh_output session-id "$id"
    gh_output status "$status"
    gh_output exit-code "$code"
    gh_output handle "$handle"
    gh_output patch "$patch"
    {
        printf 'CAW_BOX_SESSION_ID=%s\n' "$id"
        printf 'CAW_BOX_STATUS=%s\n' "$status"
        printf 'CAW_BOX_EXIT_CODE=%s\n' "$code"
        printf 'CAW_BOX_HANDLE=%s\n' "$(tr -d '\n' <<<"$handle")"
    } >"$out/caw-box.env"

    if [ -n "${GITHUB_STEP_SUMMARY:-}" ]; then
        {
            printf '### caw-box: %s turn, %s (exit %s)\n\n' "${CAW_BOX_PROVIDER:-resumed}" "${status:-no result}" "$code"
            [ -z "$id" ] || printf 'Session `%s`; resume on this runner with `caw-box resume %s`.\n\n' "$id" "$id"
            if [ -n "$patch" ]; then
                printf '<details><summary>Change (%s)</summary>\n\n```\n' "$(git apply --stat "$patch" 2>/dev/null | tail -n 1 || echo patch)"
                git apply --stat "$patch" 2>/dev/null || true
                printf '```\n</details>\n\n'
            fi
            printf '<details><summary>Result (-o json)</summary>\n\n```json\n%s\n```\n</details>\n' "$result"
        } >>"$GITHUB_STEP_SUMMARY"
    fi
    say "session ${id:-none}: ${status:-no result}, exit $code; outputs in $out"
    return "$code"
}

case "${1:-}" in
    install) cmd_install ;;
    images) cmd_images ;;
    turn) cmd_turn ;;
    *) die "usage: $0 install|images|turn" ;;
esac
