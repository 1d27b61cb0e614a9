#!/usr/bin/env bash
# The architecture part of `make lint`: no import from a layer to one above it
# (scripts/layers.py, the layers of ARCHITECTURE.md's table), no word of what lies behind a
# seam where a layer must not know it (scripts/seam-words.py: no pod, sidecar, network name or
# loopback in src/session; no backend type or backend-kind branch in src/commands or src/mcp),
# no import cycle between src/'s files (scripts/module-cycles.py) and no source file over 700
# lines but its tests (scripts/file-sizes.py). Each reads every line of every file but
# comments and test modules, inline or files of their own (scripts/rust_source.py), and reads
# on after a test module. Each check first proves on planted trees that it fails when it
# should, after a test module too, and passes what it should (test code among it), so a
# broken check cannot pass a broken tree.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts=$PWD/scripts

plant=$(mktemp -d)
trap 'rm -rf "$plant"' EXIT

# expect pass|fail WHY COMMAND...: the check on a planted tree passes or fails, as it should;
# else WHY is what went wrong.
expect() {
    local want=$1 why=$2 got=fail
    shift 2
    if "$@" >/dev/null; then got=pass; fi
    if [ "$got" != "$want" ]; then
        echo "lint-architecture: $why" >&2
        exit 1
    fi
}

# A test module whose body has braces in a comment, a string, a raw string and a char, and
# code of its own ($1) that the checks must not read: the test code of each plant below.
tricky_tests() {
    printf '#[cfg(test)]\n#[allow(dead_code)]\nmod tests {\n'
    printf '    // } a brace in a comment /* { */\n'
    printf "    fn braces() -> (&'static str, &'static str, char) { (\"}\", r#\"}\"#, '}') }\n"
    printf '    fn test_code() { %s }\n}\n' "$1"
}

# Layers: a backend that imports the session layer above it.
mkdir -p "$plant/layers/src/backend" "$plant/layers/src/session"
printf '## Layers\n\n| Layer | Where | What |\n|---|---|---|\n| Session | [s](src/session/mod.rs) | x |\n| Backend | [b](src/backend/mod.rs) | x |\n' \
    >"$plant/layers/ARCHITECTURE.md"
printf 'pub mod backend;\npub mod session;\n' >"$plant/layers/src/lib.rs"
printf 'pub fn s() { crate::backend::b() }\n' >"$plant/layers/src/session/mod.rs"
layers() { (cd "$plant/layers" && "$scripts/layers.py"); }
up='crate::session::s()'
printf 'pub fn b() {}\n' >"$plant/layers/src/backend/mod.rs"
expect pass "layers.py refused a downward import" layers
# Upward imports in test code only: an inline test module and a test module file.
{ printf 'pub fn b() {}\n#[cfg(test)]\nmod tests;\n'; tricky_tests "$up"; } >"$plant/layers/src/backend/mod.rs"
printf 'fn test_code() { %s }\n' "$up" >"$plant/layers/src/backend/tests.rs"
expect pass "layers.py took an upward import in test code for code" layers
rm "$plant/layers/src/backend/tests.rs"
{ printf '#[cfg(test)]\nmod tests;\npub fn b() { %s }\n' "$up"; } >"$plant/layers/src/backend/mod.rs"
expect fail "layers.py missed a planted upward import after a 'mod tests;' line" layers
{ tricky_tests '()'; printf 'pub fn b() { %s }\n' "$up"; } >"$plant/layers/src/backend/mod.rs"
expect fail "layers.py missed a planted upward import after an inline test module" layers
printf 'pub fn b() { %s }\n' "$up" >"$plant/layers/src/backend/mod.rs"
expect fail "layers.py missed a planted upward import" layers

# Words behind a seam: none in comments (nor `//` in a string) or test code passes; one in the
# session layer's code, or a backend type in a command or the MCP server, fails, after a test
# module too.
mkdir -p "$plant/words/src/session/tested" "$plant/words/src/commands" "$plant/words/src/mcp"
words() { "$scripts/seam-words.py" "$plant/words"; }
printf '// a pod, 127.0.0.1\n/* SIDECAR /* nested */ "bridge" */\n/// in_pod\nfn f() -> &str { "http://x" } // localhost\n' \
    >"$plant/words/src/session/ok.rs"
printf 'fn g() -> u8 { 0 } // DockerBackend\n' >"$plant/words/src/commands/ok.rs"
printf 'fn g() -> u8 { 0 } // KubeBackend\n' >"$plant/words/src/mcp/ok.rs"
{ printf 'pub fn f() {}\n#[cfg(test)]\nmod tests;\n'; tricky_tests 'let pod = "127.0.0.1";'; } \
    >"$plant/words/src/session/tested.rs"
printf 'fn in_pod() -> &'"'"'static str { "localhost" }\n' >"$plant/words/src/session/tested/tests.rs"
expect pass "seam-words.py refused words in comments or test code" words
printf 'fn f() -> &str { "127.0.0.1" }\n' >"$plant/words/src/session/loopback.rs"
expect fail "seam-words.py missed a planted loopback address in src/session" words
rm "$plant/words/src/session/loopback.rs"
printf 'fn f(pod: &str) {}\n' >"$plant/words/src/session/pod.rs"
expect fail "seam-words.py missed a planted pod in src/session" words
rm "$plant/words/src/session/pod.rs"
printf '#[cfg(test)]\nmod tests;\nfn f(pod: &str) {}\n' >"$plant/words/src/session/after.rs"
expect fail "seam-words.py missed a planted pod after a 'mod tests;' line" words
{ tricky_tests '()'; printf 'fn f() -> &str { "localhost" }\n'; } >"$plant/words/src/session/after.rs"
expect fail "seam-words.py missed a planted localhost after an inline test module" words
rm "$plant/words/src/session/after.rs"
printf 'use crate::backend::DockerBackend;\n' >"$plant/words/src/commands/docker.rs"
expect fail "seam-words.py missed a planted DockerBackend in src/commands" words
rm "$plant/words/src/commands/docker.rs"
{ tricky_tests '()'; printf 'use crate::backend::BackendKind;\n'; } >"$plant/words/src/mcp/kind.rs"
expect fail "seam-words.py missed a planted BackendKind in src/mcp after an inline test module" words

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

# Cycles: two modules that import each other, in code (after a test module too), not in test
# code; and a circle of files through a folder module's child, named by its files.
mkdir -p "$plant/cycle/b"
cycles() { "$scripts/module-cycles.py" "$plant/cycle"; }
printf 'pub mod a;\npub mod b;\n' >"$plant/cycle/lib.rs"
printf 'pub fn a() { crate::b::b() }\n' >"$plant/cycle/a.rs"
back='crate::a::a()'
{ printf 'pub fn b() {}\n#[cfg(test)]\nmod more;\n'; tricky_tests "$back"; } >"$plant/cycle/b.rs"
printf 'fn test_code() { %s }\n' "$back" >"$plant/cycle/b/more.rs"
expect pass "module-cycles.py took an import in test code for a cycle" cycles
rm "$plant/cycle/b/more.rs"
printf '#[cfg(test)]\nmod more;\npub fn b() { %s }\n' "$back" >"$plant/cycle/b.rs"
expect fail "module-cycles.py missed a planted cycle after a 'mod tests;' line" cycles
{ tricky_tests '()'; printf 'pub fn b() { %s }\n' "$back"; } >"$plant/cycle/b.rs"
expect fail "module-cycles.py missed a planted cycle after an inline test module" cycles
printf 'pub fn b() { %s }\n' "$back" >"$plant/cycle/b.rs"
expect fail "module-cycles.py missed a planted cycle" cycles
mkdir -p "$plant/files/p"
files() { "$scripts/module-cycles.py" "$plant/files"; }
printf 'pub mod p;\npub mod s;\n' >"$plant/files/lib.rs"
printf 'mod c;\npub fn f() { c::g() }\n' >"$plant/files/p/mod.rs"
printf 'pub fn h() { crate::p::f() }\n' >"$plant/files/s.rs"
# A child that uses its parent's items is no cycle with the parent that calls it.
printf 'use super::*;\npub fn g() {}\n' >"$plant/files/p/c.rs"
expect pass "module-cycles.py took a child using its parent for a cycle" files
printf 'pub fn g() { crate::s::h() }\n' >"$plant/files/p/c.rs"
expect fail "module-cycles.py missed a planted cycle of files (s -> p -> p::c -> s)" files
if ! { files || true; } | grep -F "$plant/files/p/c.rs" >/dev/null; then
    echo "lint-architecture: module-cycles.py did not name the files of a planted cycle" >&2
    exit 1
fi

# Sizes: lines but the tests count, wherever they stand; a test module file is all tests.
mkdir -p "$plant/long/tested"
lines() { for _ in $(seq "$1"); do echo '// line'; done; }
lines 701 >"$plant/long/big.rs"
{ lines 700; echo '#[cfg(test)]'; echo 'mod tests {}'; } >"$plant/long/fits.rs"
# A `#[cfg(test)]` on something other than the test module does not end the count.
{ lines 690; printf '#[cfg(test)]\npub(crate) use x::y;\n'; lines 20; } >"$plant/long/hidden.rs"
{ lines 690; printf '#[cfg(test)]\nmod tests;\n'; lines 20; } >"$plant/long/after.rs"
{ lines 600; tricky_tests '()'; lines 101; } >"$plant/long/inline.rs"
{ lines 10; printf '#[cfg(test)]\nmod tests;\n'; } >"$plant/long/tested.rs"
lines 800 >"$plant/long/tested/tests.rs"
if [ "$("$scripts/file-sizes.py" "$plant/long" | cut -d: -f1 | xargs -n1 basename | sort | xargs)" != "after.rs big.rs hidden.rs inline.rs" ]; then
    echo "lint-architecture: file-sizes.py did not flag exactly the four planted long files" >&2
    exit 1
fi

scripts/layers.py ARCHITECTURE.md src
scripts/seam-words.py .
scripts/module-cycles.py src
scripts/file-sizes.py src 700
echo "lint-architecture: layers hold, no word behind a seam, no import cycle, no file over 700 lines (clippy: no function over 100)"
