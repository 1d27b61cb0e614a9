#!/usr/bin/env bash
# The dependency part of `make lint`: `cargo deny check` (advisories, licences, bans of
# duplicate and deprecated crates, sources; deny.toml) on this workspace and on python/'s (the
# wheel's extension, a workspace of its own), against the project's snapshot of the RustSec
# database (deny/advisory-db, scripts/advisory-db.py), never a fetched one: GitHub is not
# reachable from every machine this runs on. cargo-deny comes from scripts/rig.sh build-deps.
#
# It first proves on planted input that the check fails when it should, so a broken check
# cannot pass a broken tree: an advisory planted for a crate of Cargo.lock (serde_json) in a
# copy of the snapshot, and a crate named serde_yaml (banned) planted in a throwaway workspace.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo deny --version >/dev/null 2>&1 || { echo "deny: cargo-deny is missing; run scripts/rig.sh build-deps" >&2; exit 1; }

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
# cargo-deny runs `cargo metadata` offline (so it fetches no database): the crates of both
# lock files must be downloaded first, which is a no-op once a build has.
cargo fetch --locked --quiet
cargo fetch --locked --quiet --manifest-path python/Cargo.toml
scripts/advisory-db.py covers

# The database goes where cargo-deny looks for the one deny.toml's db-urls names: a directory
# under db-path named after the URL and its hash, which cargo-deny's debug log says (a run
# against an empty db-path, which fails after saying so).
db_dir() { # $1: db-path
    { CAW_BOX_ADVISORY_DBS=$1 cargo deny --offline --locked -L debug check advisories 2>&1 || true; } \
        | sed -n "s/.*Opening advisory database at '\([^']*\)'.*/\1/p"
}
deny() { # $1: db-path, then cargo-deny's arguments
    local dbs=$1
    shift
    CAW_BOX_ADVISORY_DBS=$dbs cargo deny --offline --locked --color never "$@"
}

name=$(db_dir "$tmp/probe")
if [ -z "$name" ]; then
    CAW_BOX_ADVISORY_DBS=$tmp/probe cargo deny --offline --locked check advisories >&2 || true
    echo "deny: could not tell where cargo-deny opens its advisory database (above: what it said)" >&2
    exit 1
fi
name=$(basename "${name%%$'\n'*}")
dir=$tmp/planted/$name
scripts/advisory-db.py assemble "$dir"
mkdir -p "$dir/crates/serde_json"
cat >"$dir/crates/serde_json/RUSTSEC-2099-0001.md" <<'EOF'
```toml
[advisory]
id = "RUSTSEC-2099-0001"
package = "serde_json"
date = "2099-01-01"
categories = ["memory-corruption"]

[versions]
patched = []
```

# Planted by scripts/deny.sh

Every version of serde_json is affected: `cargo deny check advisories` must fail.
EOF
(cd "$dir" && git add -A && git -c user.name=caw-box -c user.email=caw-box@localhost commit -q --no-gpg-sign -m planted)
if deny "$tmp/planted" check advisories >"$tmp/planted.log" 2>&1; then
    echo "deny: cargo deny check advisories passed with an advisory planted for serde_json" >&2
    exit 1
fi
grep -q 'RUSTSEC-2099-0001' "$tmp/planted.log" || {
    cat "$tmp/planted.log" >&2
    echo "deny: cargo deny check advisories failed, but not on the planted advisory" >&2
    exit 1
}

# A throwaway workspace whose one dependency is a (local, empty) crate named serde_yaml.
mkdir -p "$tmp/banned/src" "$tmp/banned/serde_yaml/src"
printf '[package]\nname = "planted"\nversion = "0.0.0"\nedition = "2021"\npublish = false\nlicense = "MIT"\n[dependencies]\nserde_yaml = { path = "serde_yaml" }\n[workspace]\n' \
    >"$tmp/banned/Cargo.toml"
printf '[package]\nname = "serde_yaml"\nversion = "0.9.34"\nedition = "2021"\nlicense = "MIT"\n' \
    >"$tmp/banned/serde_yaml/Cargo.toml"
touch "$tmp/banned/src/lib.rs" "$tmp/banned/serde_yaml/src/lib.rs"
(cd "$tmp/banned" && cargo generate-lockfile --offline --quiet)
if deny "$tmp/planted" --manifest-path "$tmp/banned/Cargo.toml" --config deny.toml check bans \
    >"$tmp/banned.log" 2>&1; then
    echo "deny: cargo deny check bans passed a crate named serde_yaml" >&2
    exit 1
fi
grep -q 'crate .serde_yaml.* is explicitly banned' "$tmp/banned.log" || {
    cat "$tmp/banned.log" >&2
    echo "deny: cargo deny check bans failed, but not on the planted serde_yaml" >&2
    exit 1
}

# The real checks, against the snapshot as it is.
dbs=$tmp/dbs
scripts/advisory-db.py assemble "$dbs/$name"
deny "$dbs" --workspace check
deny "$dbs" --manifest-path python/Cargo.toml --config deny.toml check
echo "deny: advisories, licences, bans and sources ok (caw-box and python/); planted advisory and banned crate refused"
