"""The wheel as a user gets it: `pip install ./python` into a fresh virtualenv (done by
scripts/test-python.sh, which runs this file with that virtualenv's Python)."""

import os
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

import caw_box


def test_the_wheel_puts_the_real_caw_box_binary_on_the_virtualenvs_path():
    scripts = Path(sysconfig.get_path("scripts"))
    exe = scripts / "caw-box"
    # The real executable (the detached driver), not a Python entry-point shim.
    assert exe.read_bytes()[:4] == b"\x7fELF"
    assert caw_box.binary() == str(exe)
    out = subprocess.run(["caw-box", "--version"], capture_output=True, text=True, check=True,
                         env={**os.environ, "PATH": f"{scripts}:{os.environ['PATH']}"})
    assert out.stdout.startswith(f"caw-box {caw_box.__version__}"), out.stdout


def _connect_in_child(code: str, env: dict) -> subprocess.CompletedProcess:
    # Each case in its own process: a process keeps the settings it connected with.
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env={**os.environ, **env})


def test_errors_raise_their_kind_with_the_clis_exit_code():
    # A bad backend: usage (2), and no variable was set for it.
    with pytest.raises(caw_box.UsageError) as e:
        caw_box.connect(backend="nomad")
    assert (e.value.kind, e.value.exit_code) == ("usage", 2)
    assert "nomad" in e.value.message and "CAW_BOX_BACKEND" not in os.environ
    # No daemon at the address given as a value (the variables name a working one):
    # environment (3).
    code = (
        "import caw_box\n"
        "try:\n"
        "    caw_box.connect(backend='docker', docker_host='unix:///nonexistent/docker.sock')\n"
        "except caw_box.EnvironmentError as e:\n"
        "    print(e.kind, e.exit_code)\n"
    )
    out = _connect_in_child(code, {})
    assert out.stdout.split() == ["environment", "3"], out.stdout + out.stderr
