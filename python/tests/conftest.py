"""The rig of the session tests, as tests/e2e/common.rs has it: an internal Docker network of
the test run's own (no way out), the stub model as a container on it, a private caw-box
data directory, and a label on everything, removed by label at the end, also on failure.
The vendor CLIs under test run only on that network, with the stub as their model."""

import json
import os
import shutil
import subprocess
import sys
import tempfile
import uuid
from pathlib import Path

import pytest

TEST_KEY = "sk-test-caw-box-0123456789"
TEST_LABEL = "io.caw-box.test-run"
STUB_IMAGE = os.environ.get("CAW_BOX_TEST_STUB_IMAGE") or "caw-box-test/stub-model:latest"
KEY_VARS = ["ANTHROPIC_API_KEY", "ANTHROPIC_AUTH_TOKEN", "CLAUDE_CODE_OAUTH_TOKEN", "OPENAI_API_KEY",
            "CODEX_API_KEY", "OPENCODE_AUTH_CONTENT", "GEMINI_API_KEY", "GOOGLE_API_KEY", "CAW_BOX_CREDENTIALS",
            "CLAUDE_CONFIG_DIR", "CODEX_HOME", "XDG_DATA_HOME", "GEMINI_CLI_HOME", "XDG_CONFIG_HOME"]


def docker(*args, check=True) -> str:
    return subprocess.run(["docker", *args], capture_output=True, text=True, check=check).stdout.strip()


class Rig:
    def __init__(self):
        self.run_id = f"py-{uuid.uuid4().hex[:8]}"
        self.network = f"cbt-{self.run_id}"
        self.stub = f"stub-{self.run_id}"
        self.data_dir = Path(tempfile.mkdtemp(prefix="caw-py-data-"))
        self.workspace = Path(tempfile.mkdtemp(prefix="caw-py-ws-"))
        # The images' user's, as a user's checkout (caw-box runs the agent as its owner).
        os.chown(self.workspace, 1000, 1000)
        label = f"{TEST_LABEL}={self.run_id}"
        docker("network", "create", "--internal", "--label", label, self.network)
        docker("run", "-d", "--name", self.stub, "--label", label, "--network", self.network,
               "-e", f"STUB_EXPECT_KEY={TEST_KEY}", STUB_IMAGE)
        self.endpoint = f"http://{self.stub}:8080"

    def env(self) -> dict:  # noqa: D401
        """The environment caw-box gets in a test: this rig's data dir and labels, no key, no
        user config file or CAW_BOX_* setting."""
        env = {k: v for k, v in os.environ.items()
               if k not in KEY_VARS and not (k.startswith("CAW_BOX_") and k != "CAW_BOX_E2E_IMAGE_REPO")}
        env.update(CAW_BOX_DATA_DIR=str(self.data_dir), CAW_BOX_LABELS=f"{TEST_LABEL}={self.run_id}",
                   CAW_BOX_CONFIG=str(self.data_dir / "no-user-config.toml"))
        if os.environ.get("CAW_BOX_E2E_IMAGE_REPO"):
            env["CAW_BOX_IMAGE_REPO"] = os.environ["CAW_BOX_E2E_IMAGE_REPO"]
        return env

    def agent_kwargs(self, provider: str) -> dict:
        key_var, model = {"codex": ("OPENAI_API_KEY", "gpt-5.5"), "claude_code": ("ANTHROPIC_API_KEY", None)}[provider]
        kw = dict(endpoint=self.endpoint, network=self.network, workspace=str(self.workspace),
                  env={key_var: TEST_KEY})
        if model:
            kw["model"] = model
        return kw

    def python(self, code: str, env=None) -> dict:
        """Runs `code` in a new Python process of this virtualenv; its last stdout line is JSON."""
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                             env=env or self.env(), cwd=str(self.workspace), timeout=600)
        assert out.returncode == 0, out.stdout + out.stderr
        return json.loads(out.stdout.strip().splitlines()[-1])

    def stub_control(self, method: str, path: str) -> dict:
        fetch = ("const [m, p] = process.argv.slice(1); fetch('http://127.0.0.1:8080' + p, {method: m})"
                 ".then(async r => console.log(await r.text()))")
        return json.loads(docker("exec", self.stub, "node", "-e", fetch, method, path))

    def remove(self):
        label = f"label={TEST_LABEL}={self.run_id}"
        for kind, ls in (("container", ["ps", "-aq"]), ("volume", ["volume", "ls", "-q"]),
                         ("network", ["network", "ls", "-q"])):
            ids = docker(*ls, "--filter", label, check=False).split()
            if ids:
                rm = ["rm", "-f"] if kind == "container" else [kind, "rm"]
                if kind == "volume":
                    rm = ["volume", "rm", "-f"]
                docker(*rm, *ids, check=False)
        shutil.rmtree(self.data_dir, ignore_errors=True)
        shutil.rmtree(self.workspace, ignore_errors=True)


@pytest.fixture(scope="session")
def rig():
    r = Rig()
    # This process's own caw-box calls (in-process tests) see the rig's settings too.
    saved = dict(os.environ)
    env = r.env()
    os.environ.clear()
    os.environ.update(env)
    try:
        yield r
    finally:
        os.environ.clear()
        os.environ.update(saved)
        r.remove()
