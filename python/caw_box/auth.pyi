from typing import Any, Callable, Dict, Iterable, List, Optional, Union

def collect(provider: Union[str, Iterable[str], None] = ..., *, keyring: bool = ...) -> Dict[str, Any]: ...
def status() -> List[Dict[str, Any]]: ...
def login(
    provider: str,
    *,
    on_prompt: Optional[Callable[[Dict[str, Any]], None]] = ...,
    api_key: Optional[str] = ...,
    network: Optional[str] = ...,
    ca_cert: Optional[str] = ...,
    image: Optional[str] = ...,
    timeout: Optional[str] = ...,
) -> List[Dict[str, Any]]: ...
