#!/usr/bin/env bash
# `make dist`: builds here what a release publishes, into dist/ (release.yml runs the same
# steps: one definition, run locally and in the workflow).
#
#   scripts/dist.sh                      everything below, for x86_64 Linux: the static musl
#                                        binary (its hot-function list checked), its archive
#                                        and .sha256, the Python wheel, SHA256SUMS
#   scripts/dist.sh binary               the static x86_64-unknown-linux-musl release binary
#                                        alone (prints its path; `make bench` measures it)
#   scripts/dist.sh docs DIR BIN         man pages (DIR/man) and completions (DIR/completions),
#                                        made by BIN (a binary that runs here)
#   scripts/dist.sh archive TARGET BIN DOCS
#                                        dist/caw-box-VERSION-TARGET.tar.gz and its .sha256:
#                                        BIN, DOCS/man, DOCS/completions, README.md, docs/*.md
#   scripts/dist.sh wheel BIN            the Python wheel (release profile, abi3), BIN as its
#                                        `caw-box` command, into dist/
#   scripts/dist.sh sums                 dist/SHA256SUMS over every archive and wheel in dist/
#
# The binary: rustls (no OpenSSL), musl libc linked in (no dynamic libc: it runs in an image
# holding nothing else), laid out by scripts/hot-functions.txt (build.rs), which is checked
# against it (scripts/hot-functions.sh --check: at least 90% of the list's names in it).
# Needs rustup's musl target and Debian's musl-tools (ring's C code): `scripts/rig.sh
# build-deps` installs both. VERSION is Cargo.toml's; a tag in $TAG (vX.Y.Z) must match it.
set -euo pipefail
cd "$(dirname "$0")/.."

TARGET=x86_64-unknown-linux-musl
target_dir=${CARGO_TARGET_DIR:-$PWD/target}
say() { printf 'dist: %s\n' "$*" >&2; }
die() { say "$*"; exit 1; }

version() {
    local v
    v=$(sed -n 's/^version = "\(.*\)"$/\1/p' Cargo.toml | head -n 1)
    [ -n "$v" ] || die "no version in Cargo.toml"
    if [ -n "${TAG:-}" ] && [ "$TAG" != "v$v" ]; then
        die "tag $TAG does not match Cargo.toml's version $v"
    fi
    echo "$v"
}

build_binary() {
    rustup target list --installed 2>/dev/null | grep -qx "$TARGET" || rustup target add "$TARGET" >&2
    command -v musl-gcc >/dev/null || die "musl-gcc not found (ring's C code): scripts/rig.sh build-deps installs musl-tools"
    cargo build --locked --release --quiet --target "$TARGET" --bin caw-box >&2
    local bin=$target_dir/$TARGET/release/caw-box
    [ -x "$bin" ] || die "cargo built no $bin"
    echo "$bin"
}

make_docs() {
    local dir=$1 bin=$2
    mkdir -p "$dir/man" "$dir/completions"
    "$bin" man --dir "$dir/man"
    "$bin" completions bash >"$dir/completions/caw-box.bash"
    "$bin" completions zsh >"$dir/completions/_caw-box"
    "$bin" completions fish >"$dir/completions/caw-box.fish"
    "$bin" completions elvish >"$dir/completions/caw-box.elv"
    "$bin" completions powershell >"$dir/completions/_caw-box.ps1"
}

# sha256 FILE: the checksum line of FILE (in dist/), also on macOS (no sha256sum there).
sha256() {
    if command -v sha256sum >/dev/null; then sha256sum "$1"; else shasum -a 256 "$1"; fi
}

make_archive() {
    local target=$1 bin=$2 docs=$3 name
    name="caw-box-$(version)-$target"
    rm -rf "dist/$name"
    mkdir -p "dist/$name/docs"
    cp "$bin" "dist/$name/caw-box"
    cp -R "$docs/man" "$docs/completions" README.md CHANGELOG.md "dist/$name/"
    # The guide's pages, which README.md links to.
    cp docs/*.md "dist/$name/docs/"
    tar -C dist -czf "dist/$name.tar.gz" "$name"
    rm -rf "dist/$name"
    (cd dist && sha256 "$name.tar.gz" >"$name.tar.gz.sha256")
    say "built dist/$name.tar.gz"
}

make_wheel() {
    local bin=$1
    mkdir -p dist
    rm -f dist/caw_box-*.whl
    # _build/backend.py puts BIN in the wheel as its `caw-box` and has maturin build the
    # extension with the release profile ($CAW_BOX_WHEEL_PROFILE may name another: `make
    # test`'s dist stage). pip fetches maturin into an isolated build env.
    # The platform tag: manylinux_2_34, which maturin checks the extension's glibc symbol
    # versions against (2.34 at most when built on Debian 12), and which pip takes on glibc
    # 2.34 or newer: Debian 12 (2.36), python:3.x-slim, Ubuntu 22.04. (pip's own build leaves
    # it at linux_x86_64, which an index refuses.) BIN is static: it runs on any of them.
    CARGO_TARGET_DIR=$target_dir CAW_BOX_WHEEL_PROFILE=${CAW_BOX_WHEEL_PROFILE:-release} \
        CAW_BOX_WHEEL_BINARY=$bin \
        MATURIN_PEP517_ARGS="--compatibility manylinux_2_34" \
        python3 -m pip wheel --quiet --disable-pip-version-check --no-deps -w dist ./python >&2
    ls dist/caw_box-*.whl >/dev/null 2>&1 || die "pip wheel built no dist/caw_box-*.whl"
    say "built $(ls dist/caw_box-*.whl)"
}

make_sums() {
    (
        cd dist
        shopt -s nullglob
        files=(*.tar.gz *.whl)
        [ ${#files[@]} -gt 0 ] || { say "nothing in dist/ to sum"; exit 1; }
        for f in "${files[@]}"; do sha256 "$f"; done >SHA256SUMS
    )
    say "wrote dist/SHA256SUMS"
}

case "${1:-all}" in
    all)
        bin=$(build_binary)
        scripts/hot-functions.sh --check "$bin"
        rm -rf dist && mkdir -p dist
        docs=$(mktemp -d)
        trap 'rm -rf "$docs"' EXIT
        make_docs "$docs" "$bin"
        make_archive "$TARGET" "$bin" "$docs"
        make_wheel "$bin"
        make_sums
        ls -l dist >&2
        ;;
    binary) build_binary ;;
    docs) make_docs "$2" "$3" ;;
    archive) mkdir -p dist && make_archive "$2" "$3" "$4" ;;
    wheel) make_wheel "$2" ;;
    sums) make_sums ;;
    *) die "usage: scripts/dist.sh [binary | docs DIR BIN | archive TARGET BIN DOCS | wheel BIN | sums]" ;;
esac
