#!/usr/bin/env bash
# The architecture part of `make lint`: no import from a layer to one above it
# (scripts/layers.py, the layers of ARCHITECTURE.md's table), no word of what lies behind a
# seam where a layer must not know it (scripts/seam-words.py: no pod, sidecar, network name or
# loopback in src/session; no backend type or backend-kind branch in src/commands), no import
# cycle between src/'s modules (scripts/module-cycles.py) and no source file over 700 lines
# before its test module (scripts/file-sizes.py). Each check first proves on planted trees
# that it fails when it should, so a broken check cannot pass a broken tree.
set -euo pipefail
cd "$(dirname "$0")/.."

plant=$(mktemp -d)
trap 'rm -rf "$plant"' EXIT
mkdir -p "$plant/cycle" "$plant/long"
printf 'pub fn a() { crate::b::b() }\n' >"$plant/cycle/a.rs"
printf 'pub fn b() { crate::a::a() }\n' >"$plant/cycle/b.rs"
printf 'pub mod a;\npub mod b;\n' >"$plant/cycle/lib.rs"
for _ in $(seq 701); do echo '// line'; done >"$plant/long/big.rs"
{ for _ in $(seq 700); do echo '// line'; done; echo '#[cfg(test)]'; echo 'mod tests {}'; } \
    >"$plant/long/fits.rs"
# A `#[cfg(test)]` on something other than the test module does not end the count.
{ for _ in $(seq 690); do echo '// line'; done; printf '#[cfg(test)]\npub(crate) use x::y;\n'
    for _ in $(seq 20); do echo '// line'; done; } >"$plant/long/hidden.rs"
# A planted upward import: a backend that imports the session layer above it.
mkdir -p "$plant/layers/src/backend" "$plant/layers/src/session"
printf '## Layers\n\n| Layer | Where | What |\n|---|---|---|\n| Session | [s](src/session/mod.rs) | x |\n| Backend | [b](src/backend/mod.rs) | x |\n' \
    >"$plant/layers/ARCHITECTURE.md"
printf 'pub mod backend;\npub mod session;\n' >"$plant/layers/src/lib.rs"
printf 'pub fn s() { crate::backend::b() }\n' >"$plant/layers/src/session/mod.rs"
printf 'pub fn b() {}\n' >"$plant/layers/src/backend/mod.rs"
if ! (cd "$plant/layers" && "$OLDPWD/scripts/layers.py" >/dev/null); then
    echo "lint-architecture: layers.py refused a downward import" >&2
    exit 1
fi
printf 'pub fn b() { crate::session::s() }\n' >"$plant/layers/src/backend/mod.rs"
if (cd "$plant/layers" && "$OLDPWD/scripts/layers.py" >/dev/null); then
    echo "lint-architecture: layers.py missed a planted upward import" >&2
    exit 1
fi
# Planted words behind a seam: none in comments (nor `//` in a string) passes; one in the
# session layer's code, or a backend type in a command, fails.
mkdir -p "$plant/words/src/session" "$plant/words/src/commands"
printf '// a pod, 127.0.0.1\n/* SIDECAR /* nested */ "bridge" */\n/// in_pod\nfn f() -> &str { "http://x" } // localhost\n' \
    >"$plant/words/src/session/ok.rs"
printf 'fn g() -> u8 { 0 } // DockerBackend\n' >"$plant/words/src/commands/ok.rs"
if ! scripts/seam-words.py "$plant/words" >/dev/null; then
    echo "lint-architecture: seam-words.py refused words in comments" >&2
    exit 1
fi
printf 'fn f() -> &str { "127.0.0.1" }\n' >"$plant/words/src/session/loopback.rs"
if scripts/seam-words.py "$plant/words" >/dev/null; then
    echo "lint-architecture: seam-words.py missed a planted loopback address in src/session" >&2
    exit 1
fi
rm "$plant/words/src/session/loopback.rs"
printf 'fn f(pod: &str) {}\n' >"$plant/words/src/session/pod.rs"
if scripts/seam-words.py "$plant/words" >/dev/null; then
    echo "lint-architecture: seam-words.py missed a planted pod in src/session" >&2
    exit 1
fi
rm "$plant/words/src/session/pod.rs"
printf 'use crate::backend::DockerBackend;\n' >"$plant/words/src/commands/docker.rs"
if scripts/seam-words.py "$plant/words" >/dev/null; then
    echo "lint-architecture: seam-words.py missed a planted DockerBackend in src/commands" >&2
    exit 1
fi
# A planted function with a 101-line body, in a crate of the lint's own clippy.toml and attribute:
# clippy (make lint's, -D warnings) refuses it, and takes one of 100.
mkdir -p "$plant/long-fn/src"
cp clippy.toml "$plant/long-fn/"
printf '[package]\nname = "planted"\nversion = "0.0.0"\nedition = "2021"\n[workspace]\n' \
    >"$plant/long-fn/Cargo.toml"
long_fn() { # $1: lines of the body, as clippy counts them
    printf '#![warn(clippy::too_many_lines)]\npub fn f(x: &mut u64) {\n'
    for _ in $(seq "$1"); do printf '    *x += 1;\n'; done
    printf '}\n'
}
long_fn 100 >"$plant/long-fn/src/lib.rs"
if ! (cd "$plant/long-fn" && CARGO_TARGET_DIR=$plant/long-fn/target cargo clippy --quiet -- -D warnings 2>/dev/null); then
    echo "lint-architecture: clippy refused a 100-line function" >&2
    exit 1
fi
long_fn 101 >"$plant/long-fn/src/lib.rs"
if (cd "$plant/long-fn" && CARGO_TARGET_DIR=$plant/long-fn/target cargo clippy --quiet -- -D warnings 2>/dev/null); then
    echo "lint-architecture: clippy missed a planted 101-line function" >&2
    exit 1
fi
if scripts/module-cycles.py "$plant/cycle" >/dev/null; then
    echo "lint-architecture: module-cycles.py missed a planted cycle" >&2
    exit 1
fi
if [ "$(scripts/file-sizes.py "$plant/long" | cut -d: -f1 | xargs -n1 basename | sort | xargs)" != "big.rs hidden.rs" ]; then
    echo "lint-architecture: file-sizes.py did not flag exactly the two planted long files" >&2
    exit 1
fi

scripts/layers.py ARCHITECTURE.md src
scripts/seam-words.py .
scripts/module-cycles.py src
scripts/file-sizes.py src 700
echo "lint-architecture: layers hold, no word behind a seam, no module cycle, no file over 700 lines (clippy: no function over 100)"
