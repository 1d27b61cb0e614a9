from typing import Optional

from .errors import (
    CawBoxError as CawBoxError,
    CredentialsError as CredentialsError,
    EnvironmentError as EnvironmentError,
    InterruptedError as InterruptedError,
    TimeoutError as TimeoutError,
    TurnFailedError as TurnFailedError,
    UsageError as UsageError,
    UsageLimitError as UsageLimitError,
)

__version__: str

def binary() -> str: ...
def connect(
    *,
    backend: Optional[str] = ...,
    namespace: Optional[str] = ...,
    context: Optional[str] = ...,
    docker_host: Optional[str] = ...,
    image_repo: Optional[str] = ...,
) -> None: ...
