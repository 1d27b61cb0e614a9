"""The credential store, as values: what `caw-box auth collect` and `caw-box auth status
--json` do, returned rather than printed."""

import json
from typing import Iterable, Optional, Union

from . import _native, _native_call


def collect(provider: Optional[Union[str, Iterable[str]]] = None, *, keyring: bool = False) -> dict:
    """Collects the host's credentials of `provider` (a name or several; all when None) into
    caw-box's store (the OS keyring with `keyring=True`). Returns, per provider, what was
    `found` (items: `kind`, `target`, `source`, ...; never a secret), `kept_newer` and
    `warnings`, and `stored_in`."""
    names = [] if provider is None else [provider] if isinstance(provider, str) else list(provider)
    return json.loads(_native_call(_native.auth_collect, names, keyring))


def status() -> list:
    """`caw-box auth status --json`: per provider, `present` and its `items` with `state`."""
    return json.loads(_native_call(_native.auth_status))
