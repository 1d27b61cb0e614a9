#!/usr/bin/env bash
# The official MCP Python SDK (PyPI `mcp`) in a virtualenv of its own, for the e2e tests
# that drive `caw-box mcp` as a real MCP client does (tests/e2e/mcp.rs). Made once and
# reused (`--fresh` makes it anew); prints the virtualenv's python on stdout. pytest too:
# the MCP benchmark (tests/mcp/bench.py) takes the Python tests' rig, which imports it.
set -euo pipefail
cd "$(dirname "$0")/.."
MCP_VERSION=${MCP_VERSION:-1.30.0}
venv=${CAW_BOX_MCP_VENV:-${CARGO_TARGET_DIR:-$PWD/target}/mcp-venv}
mkdir -p "$(dirname "$venv")"
# Tests run side by side call this at once: one makes the virtualenv, the others wait for it
# (two making it at once removed it under each other's pip).
exec 9>"$venv.lock"
flock 9
if [ "${1:-}" = --fresh ]; then rm -rf "$venv"; fi
if ! "$venv/bin/python" -c "import mcp, pytest, sys; from importlib.metadata import version; sys.exit(version('mcp') != '$MCP_VERSION')" >/dev/null 2>&1; then
    rm -rf "$venv"
    python3 -m venv "$venv" >&2
    "$venv/bin/pip" install --quiet --disable-pip-version-check "mcp==$MCP_VERSION" pytest >&2
fi
echo "$venv/bin/python"
