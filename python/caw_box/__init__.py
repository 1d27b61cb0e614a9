"""caw-box for Python: coding-agent CLIs in containers, from `import caw_box`.

    agent = caw_box.Agent("codex", model="gpt-5.5", env={"OPENAI_API_KEY": key})
    with agent.start_session() as session:
        turn = session.send("fix the failing test")
        handle = session.resume_handle
    # later, in any process on the same Docker daemon:
    session = caw_box.Agent.resume_session(handle, env={"OPENAI_API_KEY": key})
"""

import os
import sys
import sysconfig
from pathlib import Path

from . import _native
from . import errors
from .errors import (
    CawBoxError,
    CredentialsError,
    EnvironmentError,
    InterruptedError,
    TimeoutError,
    TurnFailedError,
    UsageError,
    UsageLimitError,
    BudgetError,
    BusyError,
    ConflictError,
    ForbiddenError,
    NotFoundError,
)

__version__ = _native.version()


def binary() -> str:
    """The `caw-box` executable this package installed (the detached driver of turns), or
    `$CAW_BOX_BINARY` when set."""
    env = os.environ.get("CAW_BOX_BINARY")
    if env:
        return env
    for d in (sysconfig.get_path("scripts"), str(Path(sys.executable).parent)):
        p = Path(d) / "caw-box"
        if p.is_file():
            return str(p)
    raise FileNotFoundError("the caw-box command is not installed next to this Python; set CAW_BOX_BINARY")


def _native_call(f, *args, **kwargs):
    try:
        return f(*args, **kwargs)
    except _native.NativeError as e:
        raise errors.from_report(str(e.args[0])) from None


# The settings this process connected with (one backend and daemon per process).
_connected = None


def connect(*, backend=None, namespace=None, context=None, docker_host=None, image_repo=None) -> None:
    """Makes these settings this process's (each `None` left to its `CAW_BOX_*` variable and
    the config files, as the CLI resolves them) and connects to the backend. Raises the
    error family's exception when the backend cannot be reached. `Agent`s connect by
    themselves; call this first only to choose the daemon."""
    global _connected
    try:
        driver = binary()
    except FileNotFoundError:
        driver = None
    _native_call(_native.connect, backend=backend, namespace=namespace, context=context,
                 docker_host=docker_host, image_repo=image_repo, driver=driver)
    _connected = dict(backend=backend, namespace=namespace, context=context, docker_host=docker_host,
                      image_repo=image_repo)


def _ensure_connected(backend=None, namespace=None):
    if _connected is None or backend is not None or namespace is not None:
        base = dict(_connected or {})
        if backend is not None:
            base["backend"] = backend
        if namespace is not None:
            base["namespace"] = namespace
        connect(**base)


from .session import Agent, RunningTurn, Session, Turn, Usage  # noqa: E402


def sessions(group=None) -> list:
    """The sessions, as `caw-box ls --json` lists them (one dict per session: `session_id`,
    `name`, `group`, `provider`, `turns`, `status`, `created_at`, `last_activity`,
    `resume_handle`, `cost_usd`, ...), newest activity first."""
    import json

    _ensure_connected()
    return json.loads(_native_call(_native.sessions, group))


def wait(target: str) -> "Turn":
    """Waits for the running turn (a detached one, any process's) of the session `target`
    names (a handle, id, prefix or name) to end, and returns its latest turn."""
    _ensure_connected()
    return Turn._from_native(_native_call(_native.wait, target), [])


def stop(target: str) -> None:
    """Stops the running turn of the session `target` names; it stays resumable."""
    _ensure_connected()
    _native_call(_native.stop, target)


from . import auth  # noqa: E402

__all__ = [
    "Agent", "Session", "Turn", "Usage", "RunningTurn", "sessions", "wait", "stop", "connect", "binary",
    "auth", "CawBoxError", "UsageError", "EnvironmentError", "CredentialsError", "UsageLimitError", "BudgetError",
    "TimeoutError", "InterruptedError", "TurnFailedError", "NotFoundError", "BusyError", "ConflictError",
    "ForbiddenError",
]
