#!/usr/bin/env bash
# Writes scripts/hot-functions.txt: the functions of the shipped caw-box (the static musl
# release binary `make dist` builds) that real turns run, which build.rs has the linker put
# first and together (why: build.rs). The names are mangled symbols, whose hashes change with
# the rustc version (rust-toolchain.toml), caw-box's version and Cargo.lock: `make dist` and
# its test stage check the list against the binary (--check) and fail with the command that
# remakes it.
#
#   scripts/hot-functions.sh            the musl release build, a profile of real turns, the
#                                       list written
#   scripts/hot-functions.sh --smoke    one turn of the debug build profiled, the list checked
#                                       and thrown away (`make test`'s stage targets: so this
#                                       script cannot rot unseen)
#   scripts/hot-functions.sh --check BIN [LIST]
#                                       at least 90% of LIST's names (default: the committed
#                                       list) are functions of BIN, else exit 1 saying how to
#                                       remake the list. No Docker, under a second.
#
# The turns: a run and a resume of each of the four CLIs (brokered: keys collected), a codex
# session kept warm (a warm resume), `ls` and `show`, each caw-box under valgrind's
# callgrind, which records every instruction run. Against the stub model on an internal
# network of its own, on the images `make images` built. Needs the Docker rig
# (`scripts/rig.sh with scripts/hot-functions.sh`). About 8 minutes (the release build).
set -euo pipefail
cd "$(dirname "$0")/.."

smoke=false
[ "${1:-}" = --smoke ] && smoke=true
say() { printf 'hot-functions: %s\n' "$*" >&2; }

if [ "${1:-}" = --check ]; then
    bin=${2:?usage: scripts/hot-functions.sh --check BIN [LIST]}
    list=${3:-scripts/hot-functions.txt}
    exec python3 - "$bin" "$list" <<'EOF'
import subprocess, sys
binary, path = sys.argv[1], sys.argv[2]
names = [l.strip() for l in open(path) if l.strip() and not l.startswith("#")]
nm = subprocess.run(["nm", "--defined-only", binary], capture_output=True, text=True, check=True)
have = {f[2] for f in (l.split() for l in nm.stdout.splitlines()) if len(f) == 3}
found = sum(n in have for n in names)
share = found / len(names) if names else 0.0
print(f"hot-functions: {found} of the {len(names)} names of {path} are in {binary} ({share:.0%})",
      file=sys.stderr)
if share < 0.9:
    sys.exit(f"hot-functions: {path} is stale for {binary} (under 90% of its names are there: "
             "rustc, Cargo.lock or caw-box's version changed since it was made), so the binary "
             "is not laid out by use. Remake the list (about 8 minutes, needs `make images`):\n"
             "    scripts/rig.sh with scripts/hot-functions.sh")
EOF
fi

command -v valgrind >/dev/null || scripts/rig.sh tools
target=${CARGO_TARGET_DIR:-$PWD/target}
if $smoke; then
    cargo build --quiet --bin caw-box
    bin=$(realpath "$target/debug/caw-box")
    providers=(codex)
else
    # The binary a release ships (its names are the ones build.rs orders).
    bin=$(realpath "$(scripts/dist.sh binary)")
    providers=(claude-code codex opencode gemini)
fi
for image in caw-box-test/stub-model:latest "${providers[@]/#/caw-box/}"; do
    docker image inspect "${image%:latest}:latest" >/dev/null 2>&1 ||
        { say "image ${image%:latest}:latest is missing: run make images first"; exit 3; }
done

run=hot-functions-$$
work=$(mktemp -d)
# This run's objects only, by its label (sessions carry it through CAW_BOX_LABELS).
cleanup() {
    local filter=label=io.caw-box.test-run=$run
    docker ps -aq --filter "$filter" | xargs -r docker rm -f -v >/dev/null
    docker volume ls -q --filter "$filter" | xargs -r docker volume rm -f >/dev/null
    docker network ls -q --filter "$filter" | xargs -r docker network rm >/dev/null
    rm -rf "$work"
}
trap cleanup EXIT
label=(--label io.caw-box.test=hot-functions --label "io.caw-box.test-run=$run")
docker network create --internal "${label[@]}" "$run" >/dev/null
docker run -d --name "$run-stub" --network "$run" "${label[@]}" -e STUB_EXPECT_KEY=hot-key \
    caw-box-test/stub-model:latest >/dev/null
mkdir -p "$work/ws" "$work/data"
echo "profiled" >"$work/ws/README.md"
export CAW_BOX_DATA_DIR=$work/data CAW_BOX_LABELS=io.caw-box.test=hot-functions,io.caw-box.test-run=$run

# caw-box ARGS… under callgrind (a profile per process); its stdout is the command's.
profiled() {
    (cd "$work/ws" && valgrind -q --tool=callgrind --dump-instr=yes --compress-pos=no \
        --compress-strings=no --callgrind-out-file="$work/cg.%p" "$bin" "$@")
}
key_var() { case $1 in claude-code) echo ANTHROPIC_API_KEY ;; gemini) echo GEMINI_API_KEY ;; *) echo OPENAI_API_KEY ;; esac; }
model() { case $1 in codex) echo gpt-5.5 ;; opencode) echo stub-model ;; gemini) echo gemini-2.5-flash ;; esac; }
# Keys collected, as users do: turns are brokered (the default); one codex turn brings its
# key itself (`--env`).
for p in "${providers[@]}"; do
    env "$(key_var "$p")=hot-key" HOME="$work/data" "$bin" auth collect --provider "$p" >/dev/null 2>&1
done
for p in "${providers[@]}"; do
    say "profiling $p turns"
    env=()
    [ "$p" = codex ] && env=(--env "$(key_var "$p")=hot-key")
    m=$(model "$p")
    out=$(profiled run --provider "$p" --network "$run" --endpoint "http://$run-stub:8080" \
        ${m:+--model "$m"} "${env[@]}" -q -o json "REMEMBER:layout")
    id=$(python3 -c 'import json,sys; print(json.loads(sys.argv[1])["session_id"])' "$out")
    $smoke && break
    profiled resume "$id" -q -o json "what did I ask you to remember" >/dev/null
    if [ "$p" = codex ]; then
        profiled resume "$id" --keep-warm 60s -q -o json "hello" >/dev/null
        profiled resume "$id" -q -o json "hello" >/dev/null
        profiled ls >/dev/null
        profiled show "$id" >/dev/null
        "$bin" rm --force "$id" >/dev/null
    fi
done

out=scripts/hot-functions.txt
$smoke && out=$work/hot-functions.txt
python3 - "$bin" "$out" "$work"/cg.* <<'EOF'
# Every instruction address callgrind saw run in the binary, to the function (symbol) it is in.
import bisect, subprocess, sys
binary, out, profiles = sys.argv[1], sys.argv[2], sys.argv[3:]
ran = set()
for path in profiles:
    ob = None
    for line in open(path):
        if line.startswith("ob="):
            ob = line[3:].strip()
        elif line.startswith("0x") and ob == binary:
            ran.add(int(line.split()[0], 16))
symbols = []
nm = subprocess.run(["nm", "-S", "--defined-only", binary], capture_output=True, text=True, check=True)
for line in nm.stdout.splitlines():
    f = line.split()
    if len(f) == 4 and f[2] in "tTwW":
        symbols.append((int(f[0], 16), int(f[1], 16), f[3]))
symbols.sort()
starts = [s[0] for s in symbols]
hot = {}
for a in ran:
    i = bisect.bisect_right(starts, a) - 1
    if i >= 0 and a < symbols[i][0] + symbols[i][1]:
        hot[symbols[i][2]] = symbols[i][0]
if len(hot) < 100 or not any("7caw_box4main" in s for s in hot):
    sys.exit(f"hot-functions: only {len(hot)} functions found in {len(profiles)} profiles of {binary}")
with open(out, "w") as f:
    f.write("# The functions real turns run, in the order of the binary they were profiled in:\n")
    f.write("# build.rs has the linker put them first. Made by scripts/hot-functions.sh.\n")
    f.writelines(s + "\n" for s in sorted(hot, key=hot.get))
print(f"hot-functions: {len(hot)} functions ({sum(s for _, s, n in symbols if n in hot) // 1024} KiB) "
      f"from {len(profiles)} profiled commands: {out}", file=sys.stderr)
EOF
