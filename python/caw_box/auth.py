"""The credential store, as values: what `caw-box auth collect`, `caw-box auth login` and
`caw-box auth status --json` do, returned rather than printed."""

import json
from typing import Any, Callable, Dict, Iterable, Optional, Union

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


def login(
    provider: str,
    *,
    on_prompt: Optional[Callable[[Dict[str, Any]], Optional[str]]] = None,
    api_key: Optional[str] = None,
    network: Optional[str] = None,
    ca_cert: Optional[str] = None,
    image: Optional[str] = None,
    timeout: Optional[str] = None,
) -> list:
    """`caw-box auth login --provider <provider>`: the vendor CLI's own headless login in a
    short-lived container, its result in caw-box's store (never the host's vendor
    directories). `on_prompt` gets `{"provider", "url", "code"}` once the CLI printed them
    (show them to the person who logs in; nothing goes to the terminal); in a paste-code
    flow (claude) it gets `{"provider", "url", "needs": "code"}` and returns the code the
    page shows after approval (`code#state`; `None` ends the login with nothing stored). With `api_key`,
    that key is stored instead (the `--with-api-key` of the command line). `network`,
    `ca_cert`, `image` and `timeout` (e.g. "15m") are the command's flags. Returns the items
    stored (`kind`, `target`, `source` "login", ...; never a secret). Raises the error
    family's exception (`CredentialsError` for a denied or failed flow); Ctrl-C ends the
    flow with nothing stored."""
    flags = ["--provider", provider]
    for flag, value in (("--network", network), ("--ca-cert", ca_cert), ("--image", image), ("--timeout", timeout)):
        if value is not None:
            flags += [flag, str(value)]
    callback = None
    if on_prompt is not None:
        callback = lambda text: on_prompt(json.loads(text))
    return json.loads(_native_call(_native.auth_login, flags, api_key, callback))
