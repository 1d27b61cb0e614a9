#!/usr/bin/env bash
# `make test`'s stage `dist`: what a release publishes, built as `make dist` builds it, and
# used as a user uses it.
#
#   1. `make dist` (scripts/dist.sh: the static musl release binary, its hot-function list
#      checked, the archive, the wheel, SHA256SUMS)
#   2. file and ldd: the binary is static (no dynamic libc); the archive holds it, the man
#      pages and the completions; SHA256SUMS and the .sha256 verify
#   3. the hot-function list check fails on a stale list (the names of another build: the
#      debug binary's), and says the command that remakes the list
#   4. that binary alone in an image (FROM scratch: no libc, no shell, nothing else), the
#      host's Docker socket mounted: `caw-box --version`, then a codex run and a resume that
#      recalls, against the stub model on an internal network of this stage's own
#   5. the wheel in a fresh virtualenv of Debian's own python3, no cargo or rustc on PATH:
#      `import caw_box`, a turn through the session API, and `caw-box` on PATH is the
#      archive's binary, byte for byte
#
# Every Docker object it makes carries io.caw-box.test=dist and its own io.caw-box.test-run,
# and is removed by that label at the end, pass or fail.
set -euo pipefail
cd "$(dirname "$0")/.."

step() { printf -- '-- %s\n' "$*"; }
fail() { printf 'dist: %s\n' "$*" >&2; exit 1; }
KEY=sk-test-caw-box-dist-0123456789
run=dist-$$
labels=(--label io.caw-box.test=dist --label "io.caw-box.test-run=$run")
image=caw-box-test-dist/scratch:$run
work=$(mktemp -d)
cleanup() {
    local filter=label=io.caw-box.test-run=$run
    docker ps -aq --filter "$filter" | xargs -r docker rm -f -v >/dev/null
    docker volume ls -q --filter "$filter" | xargs -r docker volume rm -f >/dev/null
    docker network ls -q --filter "$filter" | xargs -r docker network rm >/dev/null
    docker image rm -f "$image" >/dev/null 2>&1 || true
    rm -rf "$work"
}
trap cleanup EXIT

step "make dist"
# The wheel's extension module with the dev profile, which the python stage has compiled
# already: a second whole-program-LTO build of the library (about 300 s on 2 cores) would
# check nothing the release workflow's own build does not. The wheel is otherwise made as
# published (the same pyproject, maturin, manylinux tag, and the release musl binary as its
# `caw-box`); release.yml runs `make dist` without this, so its wheel is the release build.
export CAW_BOX_WHEEL_PROFILE=${CAW_BOX_WHEEL_PROFILE:-dev}
t0=$SECONDS
make --no-print-directory dist
echo "make dist: $((SECONDS - t0)) s"
target=x86_64-unknown-linux-musl
bin=${CARGO_TARGET_DIR:-$PWD/target}/$target/release/caw-box
version=$(sed -n 's/^version = "\(.*\)"$/\1/p' Cargo.toml | head -n 1)
archive=caw-box-$version-$target.tar.gz
wheels=(dist/caw_box-*.whl)
for f in "dist/$archive" "dist/$archive.sha256" dist/SHA256SUMS "${wheels[0]}"; do
    [ -f "$f" ] || fail "make dist made no $f: $(ls dist)"
done

step "the binary is static; the archive holds it, the man pages and completions; the sums verify"
file "$bin"
file "$bin" | grep -qE 'statically linked|static-pie linked' || fail "$bin is not static: $(file "$bin")"
lddout=$(ldd "$bin" 2>&1 || true)
echo "ldd: $lddout"
grep -qE 'statically linked|not a dynamic executable' <<<"$lddout" || fail "ldd finds libraries in $bin"
! grep -q 'libc\.so' <<<"$lddout" || fail "$bin links libc dynamically"
(cd dist && sha256sum -c SHA256SUMS && sha256sum -c "$archive.sha256")
mkdir "$work/archive"
tar -C "$work/archive" -xzf "dist/$archive"
root=$work/archive/caw-box-$version-$target
cmp "$root/caw-box" "$bin" || fail "the archive's caw-box is not the binary built"
for f in man/caw-box.1 completions/caw-box.bash completions/_caw-box README.md CHANGELOG.md docs/configuration.md; do
    [ -s "$root/$f" ] || fail "the archive lacks $f"
done
echo "archive: $(tar -tzf "dist/$archive" | wc -l) entries; SHA256SUMS: $(wc -l <dist/SHA256SUMS) files"

step "the hot-function list check fails on a stale list (another build's names)"
# Another build: the gnu one the earlier stages made (debug), else a release one.
other=${CARGO_TARGET_DIR:-$PWD/target}/debug/caw-box
[ -x "$other" ] || other=${CARGO_TARGET_DIR:-$PWD/target}/release/caw-box
[ -x "$other" ] || { cargo build --quiet --bin caw-box; other=${CARGO_TARGET_DIR:-$PWD/target}/debug/caw-box; }
{ echo "# planted: the names of $other"; nm --defined-only "$other" | awk '$2 ~ /^[tT]$/ && n++ < 1400 {print $3}'; } >"$work/stale.txt"
if scripts/hot-functions.sh --check "$bin" "$work/stale.txt" 2>"$work/check.err"; then
    cat "$work/check.err"; fail "the check passed a stale list"
fi
cat "$work/check.err"
grep -q 'scripts/rig.sh with scripts/hot-functions.sh' "$work/check.err" \
    || fail "the check failed without the command that remakes the list"

step "the binary alone in an image (FROM scratch), the host's Docker socket mounted"
mkdir "$work/ctx"
cp "$bin" "$work/ctx/caw-box"
printf 'FROM scratch\nCOPY caw-box /caw-box\nENTRYPOINT ["/caw-box"]\n' >"$work/ctx/Dockerfile"
docker build -q "${labels[@]}" -t "$image" "$work/ctx" >/dev/null 2>"$work/build.err" \
    || { cat "$work/build.err" >&2; fail "docker build of the scratch image failed"; }
docker run --rm "${labels[@]}" "$image" --version | tee "$work/version"
grep -q "^caw-box $version" "$work/version" || fail "--version in the scratch image: $(cat "$work/version")"
net=cbt-$run
stub=stub-$run
docker network create --internal "${labels[@]}" "$net" >/dev/null
docker run -d --name "$stub" --network "$net" "${labels[@]}" -e "STUB_EXPECT_KEY=$KEY" \
    caw-box-test/stub-model:latest >/dev/null
# The workspace and the data directory at the same paths inside as outside: the daemon
# resolves the bind mounts caw-box asks for on the host. /tmp: a tmpfs (the image has none).
mkdir -p "$work/ws" "$work/data" "$work/home"
chown 1000:1000 "$work/ws"
sock=${DOCKER_HOST:-unix:///var/run/docker.sock}
sock=${sock#unix://}
scratch() {
    docker run --rm "${labels[@]}" -v "$sock:/var/run/docker.sock" -v "$work:$work" -w "$work/ws" \
        --tmpfs /tmp -e "HOME=$work/home" -e "CAW_BOX_DATA_DIR=$work/data" \
        -e "CAW_BOX_LABELS=io.caw-box.test=dist,io.caw-box.test-run=$run" \
        -e "CAW_BOX_CONFIG=$work/no-config.toml" "$image" "$@"
}
out=$(scratch run --provider codex --network "$net" --endpoint "http://$stub:8080" --model gpt-5.5 \
    --env "OPENAI_API_KEY=$KEY" -q -o json "REMEMBER:scratch-binary")
echo "$out"
id=$(python3 -c 'import json,sys; r=json.loads(sys.argv[1]); assert r["status"]=="success", r; print(r["session_id"])' "$out")
out=$(scratch resume "$id" --env "OPENAI_API_KEY=$KEY" -q -o json "RECALL")
echo "$out"
python3 -c 'import json,sys; r=json.loads(sys.argv[1]); assert r["status"]=="success" and "scratch-binary" in r["result"], r' "$out" \
    || fail "the resumed turn in the scratch image did not recall"

step "the wheel in a fresh virtualenv, no cargo or rustc on PATH: import, a turn, caw-box on PATH"
python=/usr/bin/python3
[ -x "$python" ] || python=$(command -v python3)
"$python" -m venv "$work/venv"
clean_path=$work/venv/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
for tool in cargo rustc; do
    ! PATH=$clean_path command -v "$tool" >/dev/null || fail "$tool is on $clean_path"
done
PATH=$clean_path "$work/venv/bin/pip" install --quiet --disable-pip-version-check --no-index "${wheels[0]}"
found=$(PATH=$clean_path command -v caw-box) || fail "no caw-box on PATH after pip install"
[ "$found" = "$work/venv/bin/caw-box" ] || fail "caw-box on PATH is $found, not the wheel's"
cmp "$found" "$bin" || fail "the wheel's caw-box is not the release binary of the archive"
cd "$work/ws"
PATH=$clean_path CAW_BOX_DATA_DIR=$work/data CAW_BOX_CONFIG=$work/no-config.toml \
    CAW_BOX_LABELS=io.caw-box.test=dist,io.caw-box.test-run=$run \
    "$work/venv/bin/python" - "$net" "http://$stub:8080" "$KEY" "$work/ws" <<'EOF'
import json, os, shutil, subprocess, sys
import caw_box
net, endpoint, key, ws = sys.argv[1:]
assert shutil.which("cargo") is None and shutil.which("rustc") is None
assert caw_box.binary() == shutil.which("caw-box"), (caw_box.binary(), shutil.which("caw-box"))
version = subprocess.run(["caw-box", "--version"], capture_output=True, text=True, check=True).stdout
assert version.startswith(f"caw-box {caw_box.__version__}"), version
agent = caw_box.Agent("codex", model="gpt-5.5", endpoint=endpoint, network=net, workspace=ws,
                      env={"OPENAI_API_KEY": key})
with agent.start_session() as session:
    turn = session.send("REMEMBER:wheel")
    assert turn.status == "success" and "wheel" in turn.result, (turn.status, turn.result)
print(json.dumps(dict(native=caw_box._native.__file__, binary=caw_box.binary(), status=turn.status)))
EOF
cd - >/dev/null
echo "dist: all checks passed"
