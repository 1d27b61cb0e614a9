"""PEP 517 backend: build the `caw-box` binary with cargo, put it in the wheel's
`caw_box.data/scripts/` (pip installs it on PATH, next to the interpreter), then let maturin
build the extension and the wheel. The binary is the detached driver of turns started from
Python, so it must be the real executable, not a Python shim.

CARGO_TARGET_DIR is honoured (CI reuses its build); CAW_BOX_WHEEL_PROFILE picks the cargo
profile of both the binary and the extension (default `dev`; `release` for a published
wheel); CAW_BOX_WHEEL_BINARY names a `caw-box` already built (`make dist`: the static musl
release binary, which runs on any x86_64 Linux) to put in the wheel instead of building one.
"""

import os
import shutil
import subprocess
from pathlib import Path

import maturin

HERE = Path(__file__).resolve().parent.parent
ROOT = HERE.parent
SCRIPTS = HERE / "caw_box.data" / "scripts"


def _build_binary():
    profile = os.environ.get("CAW_BOX_WHEEL_PROFILE", "dev")
    if profile != "dev" and "--profile" not in os.environ.get("MATURIN_PEP517_ARGS", ""):
        # The extension in the same profile (pyproject.toml's is `dev`).
        os.environ["MATURIN_PEP517_ARGS"] = (
            os.environ.get("MATURIN_PEP517_ARGS", "") + f" --profile {profile}").strip()
    prebuilt = os.environ.get("CAW_BOX_WHEEL_BINARY")
    if prebuilt:
        out = Path(prebuilt)
    else:
        target = Path(os.environ.get("CARGO_TARGET_DIR", ROOT / "target"))
        subprocess.run(
            ["cargo", "build", "--locked", "--profile", profile, "--bin", "caw-box",
             "--manifest-path", str(ROOT / "Cargo.toml")],
            check=True,
        )
        out = target / ("debug" if profile == "dev" else profile) / "caw-box"
    SCRIPTS.mkdir(parents=True, exist_ok=True)
    shutil.copy2(out, SCRIPTS / "caw-box")
    # A dev build's debug info is most of its size; the wheel does without it. A prebuilt
    # binary goes in as it is (the release profile strips debug info; byte for byte the
    # archive's).
    if not prebuilt and shutil.which("strip"):
        subprocess.run(["strip", "--strip-debug", str(SCRIPTS / "caw-box")], check=True)


def prepare_metadata_for_build_wheel(metadata_directory, config_settings=None):
    # maturin wants the data directory to exist (a fresh checkout has none yet).
    SCRIPTS.mkdir(parents=True, exist_ok=True)
    return maturin.prepare_metadata_for_build_wheel(metadata_directory, config_settings)


def prepare_metadata_for_build_editable(metadata_directory, config_settings=None):
    SCRIPTS.mkdir(parents=True, exist_ok=True)
    return maturin.prepare_metadata_for_build_editable(metadata_directory, config_settings)


def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    _build_binary()
    return maturin.build_wheel(wheel_directory, config_settings, metadata_directory)


def build_editable(wheel_directory, config_settings=None, metadata_directory=None):
    _build_binary()
    return maturin.build_editable(wheel_directory, config_settings, metadata_directory)


def __getattr__(name):
    return getattr(maturin, name)
