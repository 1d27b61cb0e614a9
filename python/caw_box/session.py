"""`Agent`, `Session`, `Turn`: sessions in the shape coding-agent-wrapper users know, each
turn in a container. The settings are `caw-box run`'s flags as keyword arguments, resolved
by the library exactly as the CLI resolves them (config files, `CAW_BOX_*` variables)."""

import asyncio
import functools
import json
import queue
import subprocess
import threading
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, List, Mapping, Optional, Union

from . import _native, _native_call, _ensure_connected, binary, errors


@dataclass
class Usage:
    """A turn's (or a session's) tokens and cost; `cost_usd` is None when unknown."""

    input_tokens: int = 0
    output_tokens: int = 0
    cache_read_tokens: int = 0
    cache_write_tokens: int = 0
    cost_usd: Optional[float] = None

    @classmethod
    def _of(cls, d: Mapping[str, Any]) -> "Usage":
        return cls(**{k: d.get(k, getattr(cls, k)) for k in cls.__dataclass_fields__})


@dataclass
class Turn:
    """One turn's outcome, as `-o json` prints it, and the events it streamed."""

    result: str
    status: str
    turn: int
    usage: Usage
    duration_ms: int
    exit_code: int
    session_id: str
    resume_handle: str
    events: List[dict] = field(default_factory=list)
    name: Optional[str] = None
    provider: str = ""
    #: Whether `usage.cost_usd` is known (False: a model no price table or config prices).
    priced: bool = True
    #: What the agent reached and was refused through its egress proxy:
    #: `{"policy", "allowed": [{"host", "port", "connections", "bytes_out", "bytes_in"}], "refused": [...]}`.
    egress: Optional[dict] = None

    @property
    def ok(self) -> bool:
        return self.status == "success"

    @classmethod
    def _from_native(cls, out, events) -> "Turn":
        result_json, _error = out
        r = json.loads(result_json)
        return cls(result=r["result"], status=r["status"], turn=r["turn"], usage=Usage._of(r.get("usage") or {}),
                   duration_ms=r["duration_ms"], exit_code=r["exit_code"], session_id=r["session_id"],
                   resume_handle=r["resume_handle"], events=events, name=r.get("name"), provider=r["provider"],
                   priced=r.get("priced", True), egress=r.get("egress"))


@dataclass
class Trajectory:
    """What `Session.end()` returns: the session's turns and their sums."""

    session_id: str
    turns: List[dict]
    usage: Usage
    cost_usd: Optional[float]
    duration_ms: int
    num_turns: int


def _duration(seconds: Union[int, float, str]) -> str:
    if isinstance(seconds, str):
        return seconds
    return f"{max(1, int(round(seconds * 1000)))}ms"


def _many(value) -> List[str]:
    if value is None:
        return []
    if isinstance(value, str):
        return [value]
    return list(value)


def _env_flags(env) -> List[str]:
    if env is None:
        return []
    if isinstance(env, Mapping):
        return [f"--env={k}={v}" for k, v in env.items()]
    return [f"--env={k}" for k in _many(env)]


class _agent_or_class:
    """A method callable on the class (`Agent.resume_session(handle, env=...)`) or on an
    agent (`agent.resume_session(handle)`: that agent's env and credentials)."""

    def __init__(self, f):
        self.f = f
        functools.update_wrapper(self, f)

    def __get__(self, obj, cls):
        return functools.partial(self.f, obj, cls)


class Agent:
    """A provider's agent and the settings its sessions start with: the keyword arguments
    are `caw-box run`'s flags (`None` leaves a setting to the `CAW_BOX_*` variables and the
    config files, as on the command line). `env` (a dict, or names of host variables) goes
    with every turn and is never remembered; `timeout` is seconds or a duration such as
    "30m"; `keep_warm` (seconds or a duration, `False`: off) keeps a session's container
    idle after each turn for its next one (`--keep-warm`); `max_cost` (USD) is what the
    session may spend over all its turns (`--max-cost`: a turn that crosses it raises
    `BudgetError`, and so does the next; a resumed session given a higher one goes on);
    `egress` is `"balanced"` (the default), `"locked"` or `"open"` (`--egress`);
    `on_limit="park"`: a turn stopped by its account's usage limit waits for the reset and
    goes on in its conversation (`send` returns the turn that went on; `--on-limit park`).
    `backend` and `namespace` are the process's connection."""

    def __init__(self, provider: Optional[str] = None, *, model=None, endpoint=None, network=None, env=None,
                 workspace=None, workspace_mode=None, system_prompt=None, append_system_prompt=None, effort=None,
                 tools=None, mcp=None, allow_host=None, timeout=None, credentials=None, backend=None,
                 namespace=None, name=None, group=None, image=None, keep_warm=None, max_cost=None,
                 egress=None, on_limit=None):
        self.provider = provider
        self.backend = backend
        self.namespace = namespace
        self.name = name
        self._turn_flags = _env_flags(env)
        if credentials is not None:
            self._turn_flags.append(f"--credentials={credentials}")
        if timeout is not None:
            self._turn_flags.append(f"--timeout={_duration(timeout)}")
        if keep_warm is not None:
            warm = "off" if keep_warm is False else _duration(keep_warm)
            self._turn_flags.append(f"--keep-warm={warm}")
        if on_limit is not None:
            self._turn_flags.append(f"--on-limit={on_limit}")
        if max_cost is not None:
            # With every turn's flags: a resume's limit replaces the remembered one.
            self._turn_flags.append(f"--max-cost={float(max_cost)!r}")
        flags = [] if provider is None else [f"--provider={provider}"]
        for flag, value in (("model", model), ("endpoint", endpoint), ("network", network),
                            ("workspace", workspace), ("workspace-mode", workspace_mode),
                            ("system-prompt", system_prompt), ("append-system-prompt", append_system_prompt),
                            ("effort", effort), ("name", name), ("group", group), ("image", image),
                            ("egress", egress)):
            if value is not None:
                flags.append(f"--{flag}={value}")
        if tools is not None:
            flags.append(f"--tools={','.join(_many(tools))}")
        if isinstance(mcp, Mapping):
            mcp = [f"{k}={v}" for k, v in mcp.items()]
        flags += [f"--mcp={m}" for m in _many(mcp)]
        flags += [f"--allow-host={h}" for h in _many(allow_host)]
        self._run_flags = flags

    def start_session(self) -> "Session":
        """A new session (its state volume made, nothing run yet)."""
        _ensure_connected(self.backend, self.namespace)
        return Session(_native_call(_native.start, self._run_flags + self._turn_flags), self._turn_flags)

    @_agent_or_class
    def resume_session(agent, cls, handle_or_target: str, **kwargs) -> "Session":
        """The session a handle, id, unique prefix or name gives, for more turns (a handle
        alone is enough, on any host of the same daemon). On the class, the keyword
        arguments are those of `Agent` for its turns (`env`, `credentials`, `timeout`,
        `max_cost`)."""
        if agent is None:
            agent = cls(None, **kwargs)
        elif kwargs:
            raise TypeError("resume_session on an agent takes its settings from the agent")
        backend, namespace = agent.backend, agent.namespace
        # A handle names where its session lives (as on the command line): its backend and
        # namespace apply where the agent says nothing.
        try:
            handle = json.loads(handle_or_target)
        except ValueError:
            handle = None
        if isinstance(handle, dict) and backend is None and handle.get("backend"):
            backend = handle["backend"]
            namespace = namespace if namespace is not None else handle.get("namespace")
        _ensure_connected(backend, namespace)
        return Session(_native_call(_native.resume, handle_or_target, agent._turn_flags), agent._turn_flags)


class Session:
    """An open session; a context manager (`end()` on exit). One turn at a time."""

    def __init__(self, native, turn_flags=()):
        self._native = native
        self._ended = False
        # The agent's per-turn flags (env, credentials, timeout, max_cost): a fork's turns
        # get them too.
        self._turn_flags = list(turn_flags)

    @property
    def id(self) -> str:
        return self._native.id

    @property
    def resume_handle(self) -> str:
        """The handle that resumes this session from anywhere; raises before the first turn
        (no conversation exists yet)."""
        handle = _native_call(self._native.handle)
        if handle is None:
            raise errors.UsageError(f"session {self.id} has no resume handle yet: send a first turn",
                                    hint="call send() first", exit_code=2)
        return handle

    def _check_open(self):
        if self._ended:
            raise errors.UsageError(f"session {self.id} was ended in this process",
                                    hint="resume it with Agent.resume_session(handle)", exit_code=2)

    def send(self, prompt: str, *, on_event: Optional[Callable[[dict], Any]] = None, timeout=None,
             check: bool = False, detach: bool = False) -> Union["Turn", "RunningTurn"]:
        """Runs one turn and returns its `Turn` (the GIL is released meanwhile). `on_event`
        sees each event (the dicts of `-o stream-json`) as it happens. A turn that ran and
        failed is returned with its status unless `check=True` (then its exception, with
        `.turn`). Ctrl-C stops the turn (the session stays resumable) and raises
        `KeyboardInterrupt`. `detach=True` starts it in the background: a `RunningTurn`."""
        self._check_open()
        t = None if timeout is None else float(timeout)
        if detach:
            _native_call(self._native.detach, prompt, t)
            return RunningTurn(self.id)
        events: List[dict] = []

        def seen(line: str):
            e = json.loads(line)
            events.append(e)
            if on_event is not None:
                on_event(e)

        out = _native_call(self._native.send, prompt, t, seen)
        turn = Turn._from_native(out, events)
        if check and out[1] is not None:
            raise errors.from_report(out[1], turn=turn)
        return turn

    def fork(self, at: Optional[int] = None, n: int = 1, name: Optional[str] = None,
             group: Optional[str] = None, prompt: Optional[str] = None,
             provider: Optional[str] = None) -> List["Session"]:
        """`caw-box fork`: `n` (1 to 8) new sessions whose conversation and workspace are this
        session's as they were at the end of turn `at` (default: its latest), in a list; each
        is a whole session (its own `resume_handle`, resumable anywhere), with this session's
        agent settings for its turns. `name` names one fork (`name-1` ... `name-n` for more),
        `group` tags them. With `prompt`, each fork's first turn starts in the background
        (`caw_box.wait(fork.id)` waits for it), as `send(prompt, detach=True)`. This session
        is only read; one running a turn is refused (`BusyError`), as is a turn it does not
        have (`NotFoundError`); nothing is made then, nor for a bad `n`, name or prompt
        (`UsageError`). `provider` makes the forks in another vendor's CLI: the workspace is
        the turn's, and each fork's first turn gets a handoff (this session's prompts and
        answers up to the turn, the files it changed) ahead of its prompt, as
        `caw-box fork --provider`."""
        self._check_open()
        natives = _native_call(self._native.fork, self._turn_flags, at, n, name, group, prompt,
                               provider)
        return [Session(native, self._turn_flags) for native in natives]

    def stream(self, prompt: str, *, timeout=None) -> "TurnStream":
        """The turn's events as they come (an iterator of dicts); its `Turn` is the
        iterator's `.turn` once it is exhausted."""
        self._check_open()
        return TurnStream(self, prompt, timeout)

    async def asend(self, prompt: str, **kwargs) -> "Turn":
        """`send` for asyncio: the turn runs on a worker thread; the loop goes on."""
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(None, functools.partial(self.send, prompt, **kwargs))

    async def astream(self, prompt: str, *, timeout=None):
        """`stream` for asyncio: an async iterator of the turn's events."""
        loop = asyncio.get_running_loop()
        q: asyncio.Queue = asyncio.Queue()
        done = object()

        def put(e):
            loop.call_soon_threadsafe(q.put_nowait, e)

        fut = loop.run_in_executor(None, functools.partial(self.send, prompt, on_event=put, timeout=timeout))
        fut.add_done_callback(lambda _: loop.call_soon_threadsafe(q.put_nowait, done))
        while True:
            e = await q.get()
            if e is done:
                break
            yield e
        await fut

    def end(self) -> Trajectory:
        """Ends the session's use in this process and returns its trajectory. The session
        itself stays (resumable; `caw-box rm` removes it)."""
        record = json.loads(_native_call(self._native.record))
        self._ended = True
        turns = record.get("turns", [])
        usage = Usage()
        costs = []
        for t in turns:
            u = Usage._of(t.get("usage") or {})
            usage.input_tokens += u.input_tokens
            usage.output_tokens += u.output_tokens
            usage.cache_read_tokens += u.cache_read_tokens
            usage.cache_write_tokens += u.cache_write_tokens
            if u.cost_usd is not None:
                costs.append(u.cost_usd)
        usage.cost_usd = sum(costs) if costs else None
        return Trajectory(session_id=self.id, turns=turns, usage=usage, cost_usd=usage.cost_usd,
                          duration_ms=sum(t.get("duration_ms", 0) for t in turns), num_turns=len(turns))

    def __enter__(self) -> "Session":
        return self

    def __exit__(self, *exc) -> None:
        if not self._ended:
            self.end()


class TurnStream:
    """`Session.stream`'s iterator: the turn runs on a thread, its events come through a
    queue; Ctrl-C while iterating stops the turn and raises `KeyboardInterrupt`."""

    def __init__(self, session: Session, prompt: str, timeout):
        self.turn: Optional[Turn] = None
        self._q: "queue.Queue" = queue.Queue()
        self._error: Optional[BaseException] = None
        self._session = session

        def run():
            try:
                self.turn = session.send(prompt, on_event=self._q.put, timeout=timeout)
            except BaseException as e:  # handed to the iterating thread
                self._error = e
            finally:
                self._q.put(self)

        self._thread = threading.Thread(target=run, daemon=True)
        self._thread.start()

    def __iter__(self) -> Iterator[dict]:
        return self

    def __next__(self) -> dict:
        try:
            while True:
                try:
                    e = self._q.get(timeout=0.1)
                    break
                except queue.Empty:
                    continue
        except KeyboardInterrupt:
            while self._thread.is_alive():
                try:
                    _native.stop(self._session.id)
                except Exception:
                    pass
                self._thread.join(0.3)
            raise
        if e is self:
            self._thread.join()
            if self._error is not None:
                raise self._error
            raise StopIteration
        return e


class RunningTurn:
    """A turn running in the background (`send(..., detach=True)`), or the running turn of
    the session a handle, id, prefix or name gives (`RunningTurn("fixer")`, any process)."""

    def __init__(self, target: str):
        self.target = target

    def wait(self) -> Turn:
        """Waits for it to end (and be recorded) and returns the session's latest turn."""
        _ensure_connected()
        return Turn._from_native(_native_call(_native.wait, self.target), [])

    def stop(self) -> None:
        """Stops it; the session stays resumable."""
        _ensure_connected()
        _native_call(_native.stop, self.target)

    def follow(self) -> Iterator[dict]:
        """Its events as they come, to its end (`caw-box logs TARGET -f`)."""
        with subprocess.Popen([binary(), "logs", self.target, "-f"], stdout=subprocess.PIPE, text=True) as p:
            assert p.stdout is not None
            for line in p.stdout:
                line = line.strip()
                if line:
                    yield json.loads(line)
