from typing import Any, AsyncIterator, Callable, Dict, Iterable, Iterator, List, Literal, Mapping, Optional, Union, overload

from . import auth as auth
from .errors import (
    BudgetError as BudgetError,
    BusyError as BusyError,
    ConflictError as ConflictError,
    ForbiddenError as ForbiddenError,
    NotFoundError as NotFoundError,
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

Event = Dict[str, Any]
Seconds = Union[int, float, str]

class Usage:
    input_tokens: int
    output_tokens: int
    cache_read_tokens: int
    cache_write_tokens: int
    cost_usd: Optional[float]

class Turn:
    result: str
    status: str
    turn: int
    usage: Usage
    duration_ms: int
    exit_code: int
    session_id: str
    resume_handle: str
    events: List[Event]
    name: Optional[str]
    provider: str
    priced: bool
    egress: Optional[Dict[str, Any]]
    @property
    def ok(self) -> bool: ...

class Trajectory:
    session_id: str
    turns: List[Dict[str, Any]]
    usage: Usage
    cost_usd: Optional[float]
    duration_ms: int
    num_turns: int

class RunningTurn:
    target: str
    def __init__(self, target: str) -> None: ...
    def wait(self) -> Turn: ...
    def stop(self) -> None: ...
    def follow(self) -> Iterator[Event]: ...

class TurnStream(Iterator[Event]):
    turn: Optional[Turn]
    def __next__(self) -> Event: ...

class Session:
    @property
    def id(self) -> str: ...
    @property
    def resume_handle(self) -> str: ...
    @overload
    def send(self, prompt: str, *, on_event: Optional[Callable[[Event], Any]] = ..., timeout: Optional[float] = ...,
             check: bool = ..., detach: Literal[False] = ...) -> Turn: ...
    @overload
    def send(self, prompt: str, *, on_event: Optional[Callable[[Event], Any]] = ..., timeout: Optional[float] = ...,
             check: bool = ..., detach: Literal[True]) -> RunningTurn: ...
    def fork(self, at: Optional[int] = ..., n: int = ..., name: Optional[str] = ...,
             group: Optional[str] = ..., prompt: Optional[str] = ...,
             provider: Optional[str] = ...) -> List["Session"]: ...
    def stream(self, prompt: str, *, timeout: Optional[float] = ...) -> TurnStream: ...
    async def asend(self, prompt: str, *, on_event: Optional[Callable[[Event], Any]] = ...,
                    timeout: Optional[float] = ..., check: bool = ...) -> Turn: ...
    def astream(self, prompt: str, *, timeout: Optional[float] = ...) -> AsyncIterator[Event]: ...
    def end(self) -> Trajectory: ...
    def __enter__(self) -> "Session": ...
    def __exit__(self, *exc: Any) -> None: ...

class Agent:
    provider: Optional[str]
    def __init__(
        self,
        provider: Optional[str] = ...,
        *,
        model: Optional[str] = ...,
        endpoint: Optional[str] = ...,
        network: Optional[str] = ...,
        env: Union[Mapping[str, str], Iterable[str], None] = ...,
        workspace: Optional[str] = ...,
        workspace_mode: Optional[str] = ...,
        system_prompt: Optional[str] = ...,
        append_system_prompt: Optional[str] = ...,
        effort: Optional[str] = ...,
        tools: Union[str, Iterable[str], None] = ...,
        mcp: Union[str, Iterable[str], Mapping[str, str], None] = ...,
        allow_host: Union[str, Iterable[str], None] = ...,
        timeout: Optional[Seconds] = ...,
        credentials: Optional[str] = ...,
        backend: Optional[str] = ...,
        namespace: Optional[str] = ...,
        name: Optional[str] = ...,
        group: Optional[str] = ...,
        image: Optional[str] = ...,
        keep_warm: Union[Seconds, bool, None] = ...,
        max_cost: Optional[float] = ...,
        egress: Optional[Literal["balanced", "locked", "open"]] = ...,
        on_limit: Optional[Literal["park", "fail"]] = ...,
    ) -> None: ...
    def start_session(self) -> Session: ...
    # On the class: `Agent.resume_session(handle, env=..., credentials=..., timeout=...)`;
    # on an agent: `agent.resume_session(handle)` with that agent's env.
    def resume_session(self, handle_or_target: str, **kwargs: Any) -> Session: ...

def binary() -> str: ...
def connect(
    *,
    backend: Optional[str] = ...,
    namespace: Optional[str] = ...,
    context: Optional[str] = ...,
    docker_host: Optional[str] = ...,
    image_repo: Optional[str] = ...,
) -> None: ...
def sessions(group: Optional[str] = ...) -> List[Dict[str, Any]]: ...
def wait(target: str) -> Turn: ...
def stop(target: str) -> None: ...
