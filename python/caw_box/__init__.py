"""caw-box for Python: coding-agent CLIs in containers, from `import caw_box`."""

import os
import sys
import sysconfig
from pathlib import Path

from . import _native

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


from .errors import (  # noqa: E402
    CawBoxError,
    CredentialsError,
    EnvironmentError,
    InterruptedError,
    TimeoutError,
    TurnFailedError,
    UsageError,
    UsageLimitError,
)


def connect(*, backend=None, namespace=None, context=None, docker_host=None, image_repo=None) -> None:
    """Makes these settings this process's (each `None` left to its `CAW_BOX_*` variable and
    the config files, as the CLI resolves them) and connects to the backend. Raises the
    error family's exception when the backend cannot be reached."""
    try:
        _native.connect(backend=backend, namespace=namespace, context=context,
                        docker_host=docker_host, image_repo=image_repo)
    except RuntimeError as e:
        raise errors.from_report(str(e.args[0])) from None


from . import errors  # noqa: E402
