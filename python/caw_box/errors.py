"""The exception family: each carries the JSON error object's `kind`, `message`, `hint` and
`exit_code` (SPEC.md's exit codes), as `caw-box -o json` prints it."""

import builtins
import json
from typing import Optional


class CawBoxError(Exception):
    """Any caw-box error."""

    kind = "error"

    def __init__(self, message: str, *, hint: Optional[str] = None, exit_code: int = 1, kind: Optional[str] = None,
                 turn: "Optional[object]" = None):
        Exception.__init__(self, message if hint is None else f"{message} (hint: {hint})")
        #: The `Turn` of a turn that ran and failed (`send(..., check=True)`), else None.
        self.turn = turn
        self.message = message
        self.hint = hint
        self.exit_code = exit_code
        if kind is not None:
            self.kind = kind


class TurnFailedError(CawBoxError):
    kind = "turn"


class UsageError(CawBoxError):
    kind = "usage"


class NotFoundError(UsageError):
    """No session of that id, name or handle (exit 2, a usage error's code)."""

    kind = "not_found"


class BusyError(UsageError):
    """The session is running (or has queued) a turn: a second one is refused (exit 2)."""

    kind = "busy"


class ConflictError(UsageError):
    """What was asked no longer fits what is there, e.g. a patch that does not apply (exit 2)."""

    kind = "conflict"


class ForbiddenError(UsageError):
    """A setting wider than the caller may grant (exit 2)."""

    kind = "forbidden"


class EnvironmentError(CawBoxError, OSError):  # noqa: A001 - the error kind's own name
    """Docker (or the cluster) cannot be reached or did not do what was asked (exit 3);
    also an `OSError`, as the builtin of that name is."""

    kind = "environment"


class CredentialsError(CawBoxError):
    kind = "credentials"


class UsageLimitError(CawBoxError):
    kind = "usage_limit"


class BudgetError(CawBoxError):
    """The session's spend reached its `max_cost` (exit 6): a turn that crossed it, or a
    turn refused because it had."""

    kind = "budget"


class TimeoutError(CawBoxError, builtins.TimeoutError):  # noqa: A001
    """The turn ran out of time (exit 124); also the builtin `TimeoutError`, so
    `except TimeoutError` catches it either way."""

    kind = "timeout"


class InterruptedError(CawBoxError, builtins.InterruptedError):  # noqa: A001
    """The turn was interrupted (exit 130); also the builtin `InterruptedError`."""

    kind = "interrupted"


_BY_KIND = {c.kind: c for c in (TurnFailedError, UsageError, NotFoundError, BusyError, ConflictError,
                                 ForbiddenError, EnvironmentError, CredentialsError, UsageLimitError,
                                 BudgetError, TimeoutError, InterruptedError)}


def from_report(text: str, turn=None) -> CawBoxError:
    """The exception for the library's error object (`{"status":"error","error":{...},
    "exit_code":N}`)."""
    report = json.loads(text)
    detail = report["error"]
    cls = _BY_KIND.get(detail["kind"], CawBoxError)
    return cls(detail["message"], hint=detail.get("hint"), exit_code=report["exit_code"], kind=detail["kind"],
               turn=turn)
