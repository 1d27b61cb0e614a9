"""Turns side by side and in the background: four sessions from one asyncio loop, a turn
detached from Python (driven by the wheel's own caw-box binary) waited for from a second
process by name, Ctrl-C during `send`, and a warm session's turns (`keep_warm`). Codex
against the stub; holds (`HOLD:`) rather than sleeps decide when a turn may end."""

import asyncio
import json
import os
import signal
import subprocess
import sys
import threading
import time

import caw_box

from conftest import TEST_KEY, docker


def wait_held(rig, name: str, at_least: int):
    status = rig.stub_control("GET", f"/_stub/holds/{name}?min={at_least}&wait=120")
    assert status["waiting"] >= at_least, status


def test_four_sessions_in_parallel_from_one_loop(rig):
    agent = caw_box.Agent("codex", **rig.agent_kwargs("codex"))
    sessions = [agent.start_session() for _ in range(4)]

    async def main():
        # All four turns are held at the stub at once (so they run together), then let go.
        release = threading.Thread(target=lambda: (wait_held(rig, "par", 4),
                                                   rig.stub_control("POST", "/_stub/release/par")))
        release.start()
        sends = [s.asend(f"HOLD:par REMEMBER:w{i}") for i, s in enumerate(sessions[:3])]

        async def streamed():
            return [e async for e in sessions[3].astream("HOLD:par REMEMBER:w3")]

        *turns, events = await asyncio.gather(*sends, streamed())
        release.join()
        return turns, events

    turns, events = asyncio.run(main())
    assert [t.status for t in turns] == ["success"] * 3
    assert [t.result for t in turns] == [f"Noted: w{i}." for i in range(3)]
    assert events[-1]["type"] == "result" and events[-1]["result"] == "Noted: w3."
    assert len({s.id for s in sessions}) == 4


WAITER = """
import json, caw_box
turn = caw_box.wait({name!r})
print(json.dumps(dict(status=turn.status, result=turn.result, turn=turn.turn)))
"""


def test_detached_turn_waited_for_by_name_from_another_process(rig):
    agent = caw_box.Agent("codex", name="py-detached", group="py-bg", **rig.agent_kwargs("codex"))
    session = agent.start_session()
    running = session.send("HOLD:bg REMEMBER:late", detach=True)
    assert isinstance(running, caw_box.RunningTurn)
    wait_held(rig, "bg", 1)
    # The turn's driver is the wheel's caw-box binary, not this Python.
    pid = docker("inspect", "-f", '{{index .Config.Labels "io.caw-box.driver-pid"}}', f"caw-box-{session.id}")
    assert os.path.realpath(f"/proc/{pid}/exe") == os.path.realpath(caw_box.binary())
    rows = caw_box.sessions(group="py-bg")
    assert [(r["name"], r["status"]) for r in rows] == [("py-detached", "running")], rows
    # A second process waits for it by name; the hold goes once that process is waiting.
    waiter = subprocess.Popen([sys.executable, "-c", WAITER.format(name="py-detached")], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True, env=rig.env())
    rig.stub_control("POST", "/_stub/release/bg")
    out, err = waiter.communicate(timeout=300)
    assert waiter.returncode == 0, err
    assert json.loads(out.strip().splitlines()[-1]) == {"status": "success", "result": "Noted: late.", "turn": 1}
    assert running.wait().result == "Noted: late."
    # The Session object goes on after its detached turn (which another process recorded).
    after = session.send("RECALL")
    assert (after.status, after.turn, after.result) == ("success", 2, "You told me to remember late."), after
    # A detached turn followed to its end: `follow()` yields its events as they come.
    other = caw_box.Agent("codex", **rig.agent_kwargs("codex")).start_session()
    running = other.send("HOLD:bg2 REMEMBER:followed", detach=True)
    wait_held(rig, "bg2", 1)
    followed = []
    follower = threading.Thread(target=lambda: followed.extend(running.follow()))
    follower.start()
    rig.stub_control("POST", "/_stub/release/bg2")
    follower.join(120)
    assert not follower.is_alive()
    assert followed and followed[-1]["type"] == "result" and followed[-1]["result"] == "Noted: followed.", followed
    # And one stopped: it no longer runs.
    third = caw_box.Agent("codex", **rig.agent_kwargs("codex")).start_session()
    running = third.send("HOLD:bg3 REMEMBER:stopped", detach=True)
    wait_held(rig, "bg3", 1)
    running.stop()
    rows = [r for r in caw_box.sessions() if r["session_id"] == third.id]
    assert [r["status"] for r in rows] == ["interrupted"], rows


CTRL_C = """
import json, signal, caw_box
# As in a terminal's Python: a test run started in the background (nohup, `cmd &`) hands its
# children SIGINT ignored, and Python then leaves it so (no KeyboardInterrupt at all).
signal.signal(signal.SIGINT, signal.default_int_handler)
session = caw_box.Agent.resume_session({handle!r}, env={env!r})
print("sending", flush=True)
try:
    session.send("HOLD:ctrl-c REMEMBER:never", timeout=60)
    out = dict(interrupted=False)
except KeyboardInterrupt:
    out = dict(interrupted=True)
again = session.send("RECALL")
out.update(again=again.status, turns=[t["status"] for t in session.end().turns][-2:])
print(json.dumps(out))
"""


def test_ctrl_c_during_send_stops_the_turn_and_raises_keyboard_interrupt(rig):
    agent = caw_box.Agent("codex", **rig.agent_kwargs("codex"))
    session = agent.start_session()
    assert session.send("REMEMBER:plum").status == "success"
    child = subprocess.Popen([sys.executable, "-c", CTRL_C.format(handle=session.resume_handle,
                                                                    env={"OPENAI_API_KEY": TEST_KEY})],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=rig.env())
    assert child.stdout.readline().strip() == "sending"
    wait_held(rig, "ctrl-c", 1)
    child.send_signal(signal.SIGINT)
    out, err = child.communicate(timeout=300)
    assert child.returncode == 0, err
    # The turn was stopped and recorded as interrupted; the session went on.
    assert json.loads(out.strip().splitlines()[-1]) == {"interrupted": True, "again": "success",
                                                         "turns": ["interrupted", "success"]}, out + err


AUTH = """
import json, caw_box
before = [r["present"] for r in caw_box.auth.status()]
got = caw_box.auth.collect("codex")
after = {r["provider"]: r for r in caw_box.auth.status()}
print(json.dumps(dict(before=before, got=got, after=after)))
"""


def test_auth_collect_and_status_are_values(rig, tmp_path):
    # A store of its own (the other tests' has no credentials, by design).
    env = dict(rig.env(), CAW_BOX_DATA_DIR=str(tmp_path), OPENAI_API_KEY=TEST_KEY)
    out = rig.python(AUTH, env=env)
    assert out["before"] == [False] * 4, out
    found = out["got"]["codex"]["found"]
    assert {"kind": "env", "target": "OPENAI_API_KEY", "source": "env:OPENAI_API_KEY"}.items() <= found[0].items(), found
    assert out["after"]["codex"]["present"] and out["after"]["codex"]["items"][0]["state"] == "ok", out
    assert out["got"]["stored_in"].startswith(str(tmp_path))
    # Values about the secret, never the secret.
    assert TEST_KEY not in json.dumps(out)


def test_keep_warm_runs_the_next_send_in_the_same_container(rig):
    session = caw_box.Agent("codex", keep_warm=60, **rig.agent_kwargs("codex")).start_session()
    assert session.send("REMEMBER:py-warm-3").status == "success"
    warm = f"caw-box-{session.id}-warm"
    container = docker("inspect", "-f", "{{.Id}}", warm)
    since = f"{time.time():.3f}"
    turn = session.send("RECALL")
    assert "py-warm-3" in turn.result, turn.result
    # The turn claimed the idle container (a rename to the session's lock name) and gave
    # it back (renamed again): it ran there.
    renames = docker("events", "--since", since, "--until", f"{time.time():.3f}", "--filter",
                     f"container={container}", "--filter", "event=rename", "--format", "{{.Action}}")
    assert len(renames.split()) == 2, renames
    assert docker("inspect", "-f", "{{.Id}}", warm) == container
