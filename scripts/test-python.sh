#!/usr/bin/env bash
# `make test`'s python stage: the Python package as a user gets it. A fresh virtualenv,
# `pip install ./python` (the wheel: extension + the real caw-box binary, built with the dev
# profile into $CARGO_TARGET_DIR, so the dependencies the other stages built are reused),
# then pytest over python/tests with that virtualenv's Python.
set -euo pipefail
cd "$(dirname "$0")/.."
target=${CARGO_TARGET_DIR:-$PWD/target}
export CARGO_TARGET_DIR=$target
venv=$target/python-venv
rm -rf "$venv"
python3 -m venv "$venv"
"$venv/bin/pip" install --quiet --disable-pip-version-check pytest
"$venv/bin/pip" install --quiet --disable-pip-version-check ./python
# From outside the checkout: the installed package, not python/caw_box, is imported.
cd /
exec "$venv/bin/python" -m pytest -q -p no:cacheprovider "$OLDPWD/python/tests" "$@"
