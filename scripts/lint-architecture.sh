#!/usr/bin/env bash
# The architecture part of `make lint`: no import cycle between src/'s modules
# (scripts/module-cycles.py) and no source file over 700 lines before its test module
# (scripts/file-sizes.py). Both checks first prove on planted trees that they fail when they
# should, so a broken check cannot pass a broken tree.
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
if scripts/module-cycles.py "$plant/cycle" >/dev/null; then
    echo "lint-architecture: module-cycles.py missed a planted cycle" >&2
    exit 1
fi
if [ "$(scripts/file-sizes.py "$plant/long" | cut -d: -f1 | xargs -n1 basename | sort | xargs)" != "big.rs hidden.rs" ]; then
    echo "lint-architecture: file-sizes.py did not flag exactly the two planted long files" >&2
    exit 1
fi

scripts/module-cycles.py src
scripts/file-sizes.py src 700
echo "lint-architecture: no module cycle, no file over 700 lines"
