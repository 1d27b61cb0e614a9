"""`caw-box mcp --pool 2` (issue 56), driven over stdio by the official MCP Python SDK: the e2e
test tests/e2e/pool.rs (`an_mcp_servers_starts_claim_its_pools_boxes`) runs it.

Usage: pool.py CAW_BOX NETWORK ENDPOINT HOST_DIR
The server's first codex `start` makes its pool (2 boxes, made in the background); a `start`
that narrows its settings (egress locked, less memory) takes neither box; a `start`
with `n: 2` then claims both boxes (its sessions' ids are the boxes'), and `wait` returns both
`success`, each with its own answer; when the server stops, its pool goes (no box stays).
Prints one line per check; exits non-zero (an AssertionError) at the first that fails.
"""
import asyncio
import json
import os
import subprocess
import sys
import time
import uuid
from contextlib import AsyncExitStack

for var in ["http_proxy", "https_proxy", "all_proxy", "HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY"]:
    os.environ.pop(var, None)

from mcp import ClientSession, StdioServerParameters  # noqa: E402
from mcp.client.stdio import stdio_client  # noqa: E402

CAW, NETWORK, ENDPOINT, HOST_DIR = sys.argv[1:5]
RUN = uuid.uuid4().hex[:8]


def check(name):
    print(f"mcp pool check: {name}", flush=True)


async def call(s, tool, args, ok=True):
    r = await s.call_tool(tool, args)
    text = r.content[0].text if r.content else ""
    assert bool(r.isError) != ok, f"{tool} {args}: isError={r.isError}: {text}"
    return json.loads(text)


def pools():
    out = subprocess.run([CAW, "pool", "ls", "--json"], capture_output=True, text=True,
                         env=os.environ, cwd=HOST_DIR, check=True)
    return json.loads(out.stdout)


def ready_boxes():
    ls = pools()
    if not ls:
        return []
    return [b["session_id"] for b in ls[0]["boxes"] if b["state"] == "ready"]


async def until_ready(n):
    deadline = time.monotonic() + 90
    while len(ready_boxes()) < n:
        assert time.monotonic() < deadline, pools()
        await asyncio.sleep(0.5)
    return ready_boxes()


def show(sid):
    out = subprocess.run([CAW, "show", sid, "--json"], capture_output=True, text=True,
                         env=os.environ, cwd=HOST_DIR, check=True)
    return json.loads(out.stdout)


def until_ready_now(boxes):
    """The server's first pool still holds exactly `boxes`, ready."""
    return sorted(ready_boxes()) == sorted(boxes)


def box_exists(sid):
    out = subprocess.run(["docker", "ps", "-aq", "--filter", f"name=caw-box-pool-{sid}"],
                         capture_output=True, text=True, check=True)
    return out.stdout.strip() != ""


async def main():
    server = StdioServerParameters(
        command=CAW,
        args=["mcp", "--scope", f"pool-{RUN}", "--network", NETWORK, "--endpoint", ENDPOINT,
              "--model", "gpt-5.5", "--pool", "2"],
        env=dict(os.environ), cwd=HOST_DIR)
    async with AsyncExitStack() as stack:
        r, w = await stack.enter_async_context(stdio_client(server))
        s = await stack.enter_async_context(ClientSession(r, w))
        await s.initialize()

        check("the first start makes the server's pool")
        assert pools() == [], pools()
        st = await call(s, "start", {"provider": "codex", "prompt": "REMEMBER:pool-w0"})
        [first] = st["sessions"]
        boxes = await until_ready(2)
        assert first["session_id"] not in boxes, (first, boxes)

        check("a start that narrows its settings takes no box made for the server's")
        # A call may narrow a wall (here: egress locked, a smaller memory limit); a box made
        # for the server's own settings holds the wider ones, so it must not be claimed.
        st = await call(s, "start", {"provider": "codex", "prompt": "REMEMBER:pool-narrow",
                                     "egress": "locked", "memory": "512m"})
        [narrow] = st["sessions"]
        assert narrow["session_id"] not in boxes, (narrow, boxes)
        assert until_ready_now(boxes), (boxes, pools())
        for sid in boxes:
            assert box_exists(sid), sid
        shown = show(narrow["session_id"])
        assert shown["settings"]["egress"] == "locked", shown["settings"]
        w = await call(s, "wait", {"sessions": [narrow["session_id"]], "timeout_s": 120})
        assert w["sessions"][0]["status"] == "success", w
        assert until_ready_now(boxes), (boxes, pools())

        check("start with n: 2 claims both boxes")
        st = await call(s, "start", {"provider": "codex", "prompt": "REMEMBER:pool-w1", "n": 2})
        ids = [x["session_id"] for x in st["sessions"]]
        assert sorted(ids) == sorted(boxes), (ids, boxes)
        print(f"first {first['session_id']}, claimed {ids}", flush=True)
        w = await call(s, "wait", {"sessions": ids + [first["session_id"]], "timeout_s": 120})
        assert not w["timed_out"], w
        for x in w["sessions"]:
            assert x["status"] == "success", (x, subprocess.run(
                ["docker", "ps", "-a"], capture_output=True, text=True).stdout)

        check("each claimed session is the server's and recalls")
        for sid in ids:
            await call(s, "reply", {"session": sid, "prompt": "RECALL"})
        w = await call(s, "wait", {"sessions": ids, "timeout_s": 120})
        for x in w["sessions"]:
            assert x["status"] == "success" and "pool-w1" in x["result"], x
        refilled = await until_ready(2)
    check("the server's pool goes with it")
    assert pools() == [], pools()
    for sid in refilled:
        assert not box_exists(sid), sid
    print("mcp pool checks passed", flush=True)


asyncio.run(main())
