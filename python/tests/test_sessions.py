"""The session API against real containers: the vendor CLIs in the caw-box images, the stub
model on the rig's internal network (conftest.py). Codex for most points, one claude case;
sessions are reused across assertions to keep the stage's cost small."""

import functools
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time

import pytest

import caw_box

from conftest import STUB_IMAGE, TEST_KEY, TEST_LABEL

PROCESS_1 = """
import json, caw_box
agent = caw_box.Agent({provider!r}, **{kwargs!r})
with agent.start_session() as session:
    try:
        session.resume_handle
        early = None
    except caw_box.UsageError as e:
        early = [e.kind, e.exit_code]
    turn = session.send("REMEMBER:kiwi")
    print(json.dumps(dict(early=early, handle=session.resume_handle, status=turn.status, result=turn.result,
                          cost=turn.usage.cost_usd, priced=turn.priced, tokens=turn.usage.input_tokens,
                          types=[e["type"] for e in turn.events])))
"""

PROCESS_2 = """
import json, caw_box
session = caw_box.Agent.resume_session({handle!r}, env={env!r})
turn = session.send("RECALL")
trajectory = session.end()
print(json.dumps(dict(status=turn.status, result=turn.result, turn=turn.turn, num_turns=trajectory.num_turns)))
"""


def cross_process_resume(rig, provider: str) -> str:
    kwargs = rig.agent_kwargs(provider)
    first = rig.python(PROCESS_1.format(provider=provider, kwargs=kwargs))
    # No handle before the first turn, as coding-agent-wrapper has it.
    assert first["early"] == ["usage", 2], first
    assert first["status"] == "success", first
    assert "kiwi" in first["result"] and first["tokens"] > 0, first
    assert first["priced"] is True, first
    assert first["types"][-1] == "result", first
    # The host knows nothing of the session any more: the handle alone resumes it.
    shutil.rmtree(rig.data_dir)
    rig.data_dir.mkdir()
    second = rig.python(PROCESS_2.format(handle=first["handle"], env=kwargs["env"]))
    assert second["status"] == "success", second
    assert "You told me to remember kiwi" in second["result"], second
    assert second["turn"] == 2, second
    return first["handle"]


def test_codex_across_processes_stream_on_event_gil_and_timeout(rig):
    handle = cross_process_resume(rig, "codex")

    # In this process: the same session by its handle. A thread runs Python during a turn
    # (the GIL is free): the turn's tool command waits for a file that only that thread
    # makes, once the turn's first event came (so events come while the turn runs) and it
    # counted. With the GIL held by the turn, it could not: the command would give up after
    # codex's 10 s without the file. `on_event` sees what the Turn records.
    session = caw_box.Agent.resume_session(handle, env={"OPENAI_API_KEY": TEST_KEY})
    seen = []
    counted = []
    running = threading.Event()

    def on_event(e):
        seen.append(e)
        running.set()

    def count_then_release():
        running.wait(120)
        n = 0
        for _ in range(200_000):
            n += 1
        counted.append((n, time.monotonic()))
        (rig.workspace / "gil").touch()

    counter = threading.Thread(target=count_then_release)
    counter.start()
    turn = session.send("RUN:while [ ! -e /workspace/gil ]; do sleep 0.1; done; echo gil-free", on_event=on_event)
    returned = time.monotonic()
    counter.join()
    # The thread counted all the way while send ran: before the turn, which waited for the
    # thread's file, returned.
    assert len(counted) == 1 and counted[0][0] == 200_000 and counted[0][1] < returned, counted
    assert turn.status == "success" and "gil-free" in turn.result, turn
    assert seen == turn.events and seen[-1]["type"] == "result"
    assert turn.usage.input_tokens > 0 and turn.duration_ms > 0 and turn.exit_code == 0

    # `stream` yields the events as they come: text ones before the result, the ones its
    # Turn records.
    stream = session.stream("RECALL")
    streamed = list(stream)
    types = [e["type"] for e in streamed]
    assert "text" in types and types.index("text") < types.index("result"), types
    assert stream.turn.status == "success" and "kiwi" in stream.turn.result and stream.turn.events == streamed

    # A timeout: the Turn says so, check=True raises TimeoutError (exit 124), also the
    # builtin TimeoutError; the session stays resumable.
    with pytest.raises(caw_box.TimeoutError) as e:
        session.send("HOLD:never-released", timeout=2, check=True)
    assert (e.value.exit_code, e.value.kind, e.value.turn.status) == (124, "timeout", "timeout")
    assert isinstance(e.value, TimeoutError)
    # A prompt over the 1 MiB cap, in this process or detached: UsageError before its turn
    # makes anything (no turn is recorded below).
    for detach in (False, True):
        with pytest.raises(caw_box.UsageError) as e:
            session.send("x" * (1024 * 1024 + 1), detach=detach)
        assert e.value.exit_code == 2 and "1048577 bytes" in e.value.message, e.value
    trajectory = session.end()
    # The session's five turns: kiwi, its recall in another process, the GIL turn, the
    # streamed recall, the timeout.
    assert trajectory.num_turns == 5 and trajectory.duration_ms > 0, trajectory
    assert [t["status"] for t in trajectory.turns] == ["success"] * 4 + ["timeout"], trajectory.turns
    with pytest.raises(caw_box.UsageError):
        session.send("RECALL")


def test_claude_across_processes(rig):
    cross_process_resume(rig, "claude_code")


ERRORS = """
import json, caw_box
out = {{}}
def kind(name, f):
    try:
        f()
        out[name] = None
    except caw_box.CawBoxError as e:
        out[name] = [type(e).__name__, e.kind, e.exit_code]
{body}
print(json.dumps(out))
"""


def test_a_turn_on_a_model_nothing_prices_says_so_and_its_egress_is_recorded(rig):
    kwargs = dict(rig.agent_kwargs("codex"), model="stub-model-unpriced", egress="locked")
    out = rig.python("""
import json, caw_box
turn = caw_box.Agent("codex", **{kw!r}).start_session().send("hi")
print(json.dumps(dict(status=turn.status, priced=turn.priced, cost=turn.usage.cost_usd,
                      egress=turn.egress["policy"], hosts=[h["host"] for h in turn.egress["allowed"]])))
""".format(kw=kwargs))
    stub = kwargs["endpoint"].split("//", 1)[1].split(":", 1)[0]
    assert out == {"status": "success", "priced": False, "cost": None, "egress": "locked",
                   "hosts": [stub]}, out


def test_each_error_kind_raises_its_exception_with_its_exit_code(rig):
    body = """
kind("bad_provider", lambda: caw_box.Agent("nomad").start_session())
kind("unknown_target", lambda: caw_box.Agent.resume_session("no-such-session-anywhere"))
kw = dict({kw!r})
kw.pop("env")
kind("no_credentials", lambda: caw_box.Agent("codex", **kw).start_session().send("hi"))
""".format(kw=rig.agent_kwargs("codex"))
    out = rig.python(ERRORS.format(body=body))
    assert out == {
        "bad_provider": ["UsageError", "usage", 2],
        "unknown_target": ["NotFoundError", "not_found", 2],
        "no_credentials": ["CredentialsError", "credentials", 4],
    }, out
    # No daemon where DOCKER_HOST points: environment (3), an OSError too.
    env = rig.env()
    env["DOCKER_HOST"] = "unix:///nonexistent/docker.sock"
    out = rig.python(ERRORS.format(body='kind("no_daemon", lambda: caw_box.sessions())\n'
                                        'out["oserror"] = issubclass(caw_box.EnvironmentError, OSError)'), env=env)
    assert out == {"no_daemon": ["EnvironmentError", "environment", 3], "oserror": True}, out


def test_the_cross_process_resume_example_with_settings_from_caw_box_variables(rig):
    # The example names no setting: provider, model, endpoint and network come from the
    # CAW_BOX_* variables, as the CLI takes them; the key from the host's variable.
    example = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "examples",
                           "cross_process_resume.py")
    env = dict(rig.env(), CAW_BOX_PROVIDER="codex", CAW_BOX_MODEL="gpt-5.5", CAW_BOX_ENDPOINT=rig.endpoint,
               CAW_BOX_NETWORK=rig.network, OPENAI_API_KEY=TEST_KEY)
    run = functools.partial(subprocess.run, capture_output=True, text=True, env=env, cwd=str(rig.workspace),
                            timeout=300)
    first = run([sys.executable, example, "start", "REMEMBER:fig"])
    assert first.returncode == 0, first.stderr
    assert "Noted: fig." in first.stderr
    handle = first.stdout.strip()
    second = run([sys.executable, example, "resume", "RECALL"], input=handle)
    assert second.returncode == 0, second.stderr
    assert second.stdout.strip() == "You told me to remember fig."
    # A variable's bad value is refused as the CLI refuses it (exit 2).
    bad = run([sys.executable, example, "start", "hi"], env=dict(env, CAW_BOX_NETWORK="none"))
    assert bad.returncode == 2 and "CAW_BOX_NETWORK" in bad.stderr, bad.stderr


def test_max_cost_ends_the_crossing_turn_refuses_the_next_and_a_higher_one_resumes(rig):
    # A limit far below one stub turn's price: the first turn crosses it (codex reports
    # its usage at the turn's end, so the answer is kept), the next is refused before
    # anything starts, and a resume with a higher limit goes on with the conversation.
    body = """
kw = dict({kw!r})
agent = caw_box.Agent("codex", max_cost=1e-9, **kw)
session = agent.start_session()
turn = session.send("REMEMBER:plum")
out["first"] = [turn.status, turn.ok, "plum" in turn.result, turn.usage.cost_usd > 1e-9]
handle = session.resume_handle
kind("spent", lambda: session.send("RECALL"))
again = caw_box.Agent.resume_session(handle, env=kw["env"], max_cost=10.0).send("RECALL")
out["raised"] = [again.status, again.result]
""".format(kw=rig.agent_kwargs("codex"))
    out = rig.python(ERRORS.format(body=body))
    assert out == {
        "first": ["budget", False, True, True],
        "spent": ["BudgetError", "budget", 6],
        "raised": ["success", "You told me to remember plum."],
    }, out


def test_a_fork_recalls_its_sources_turn_and_not_the_later_one(rig):
    # Issue 53's Python side: `Session.fork` over the library's fork. Two turns tell the
    # source two words; a fork at turn 1 recalls the first only; forks of the latest turn
    # with a prompt run their first turn detached. The refusals make nothing. Cost: five
    # codex turns (the two detached ones side by side).
    agent = caw_box.Agent("codex", **rig.agent_kwargs("codex"))
    source = agent.start_session()
    assert source.send("REMEMBER:quince").ok
    assert source.send("REMEMBER:medlar").ok
    before = sorted(s["session_id"] for s in caw_box.sessions())
    for bad in (dict(n=0), dict(n=9), dict(at=0), dict(name="not a name"), dict(prompt="x" * (1024 * 1024 + 1)),
                dict(provider="nope")):
        with pytest.raises(caw_box.UsageError) as e:
            source.fork(**bad)
        assert e.value.exit_code == 2, (bad, e.value)
    with pytest.raises(caw_box.NotFoundError):
        source.fork(at=3)
    assert sorted(s["session_id"] for s in caw_box.sessions()) == before, "a refused fork made a session"

    [fork] = source.fork(at=1)
    assert fork.id != source.id and fork.id not in before
    turn = fork.send("RECALL")
    assert turn.ok and turn.turn == 2, turn
    assert "remember quince" in turn.result and "medlar" not in turn.result, turn.result
    assert "forked_from" in fork.resume_handle

    # In another vendor's CLI: a gemini session (its first turn would get the handoff).
    [handed] = source.fork(at=1, provider="gemini")
    rows = {s["session_id"]: s for s in caw_box.sessions()}
    assert rows[handed.id]["provider"] == "gemini", rows[handed.id]
    assert rows[handed.id]["forked_from"] == {"session": source.id, "turn": 1}, rows[handed.id]

    group = f"forks-{rig.run_id}"
    detached = source.fork(n=2, group=group, prompt="RECALL")
    assert len({f.id for f in detached}) == 2
    for f in detached:
        t = caw_box.wait(f.id)
        assert t.ok and "remember medlar" in t.result, t
    assert sorted(s["session_id"] for s in caw_box.sessions(group=group)) == sorted(f.id for f in detached)
    # The source goes on where it was.
    assert "remember medlar" in source.send("RECALL").result


PARK = """
import json, os, time, caw_box
caw_box.auth.collect("codex")
del os.environ["OPENAI_API_KEY"]
agent = caw_box.Agent("codex", on_limit="park", **{kwargs!r})
first = agent.start_session().send("REMEMBER:fig")
began = time.monotonic()
second = agent.start_session()
turn = second.send("REMEMBER:yew")
waited = time.monotonic() - began
listed = [s for s in caw_box.sessions() if s["session_id"] == second.id]
print(json.dumps(dict(first=[first.status, first.result], second=[turn.status, turn.turn],
                      waited=waited, listed=[[s["status"], s["turns"]] for s in listed])))
"""


def test_a_session_that_parks_at_its_accounts_usage_limit_goes_on_at_the_reset(rig):
    # Issue 55's Python side: `Agent(on_limit="park")`. Its own stub, an account of one
    # request per 8 s that refuses past it with codex's usage limit (brokered: a collected
    # key, in a data directory of this test's own). The second session's turn meets the
    # limit, parks until the window ends, and goes on in its conversation: `send` returns
    # that turn (turn 2). Cost: three codex turns and one 8 s window.
    stub = f"stub-park-{rig.run_id}"
    subprocess.run(["docker", "run", "-d", "--name", stub, "--label", f"{TEST_LABEL}={rig.run_id}",
                    "--network", rig.network, "-e", "STUB_ACCOUNT_REQUESTS=1", "-e", "STUB_ACCOUNT_WINDOW=8",
                    "-e", "STUB_ACCOUNT_ENFORCE=1", STUB_IMAGE], check=True, capture_output=True)
    data = tempfile.mkdtemp(prefix="caw-py-park-")
    kwargs = dict(rig.agent_kwargs("codex"), endpoint=f"http://{stub}:8080")
    del kwargs["env"]
    env = dict(rig.env(), CAW_BOX_DATA_DIR=data, OPENAI_API_KEY=TEST_KEY)
    try:
        out = rig.python(PARK.format(kwargs=kwargs), env=env)
    finally:
        shutil.rmtree(data, ignore_errors=True)
    assert out["first"] == ["success", "Noted: fig."], out
    assert out["second"] == ["success", 2], out
    assert out["waited"] > 2, out
    assert out["listed"] == [["success", 2]], out
