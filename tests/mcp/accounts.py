"""One account, many boxes (issue 55), through two `caw-box mcp --per-account 2` servers side by
side, driven over stdio by the official MCP Python SDK: the e2e test tests/e2e/accounts.rs
(`two_mcp_servers_share_one_accounts_cap`) runs it.

Usage: accounts.py CAW_BOX NETWORK ENDPOINT STUB HOST_DIR
Each server starts 4 codex sessions (`start` with `n: 4`) whose model requests hold at the
stub (`HOLD:m<i>`); the key is the collected one (brokered), so all 8 spend one account. The
stub never holds more than 2 at once across both servers; `status` of a waiting one says
`queued` with its place and account; released one at a time, every one ends `success` with
its own answer. Prints one line per check; exits non-zero (an AssertionError) at the first
that fails.
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

CAW, NETWORK, ENDPOINT, STUB, HOST_DIR = sys.argv[1:6]
RUN = uuid.uuid4().hex[:8]


def check(name):
    print(f"mcp accounts check: {name}", flush=True)


def stub(path, method="GET"):
    """The stub's own endpoint, from inside its container (its network is internal)."""
    js = ("const [m, p] = process.argv.slice(1); fetch('http://127.0.0.1:8080' + p, {method: m})"
          ".then(async r => console.log(await r.text()))")
    out = subprocess.run(["docker", "exec", STUB, "node", "-e", js, method, path],
                         capture_output=True, text=True, timeout=120, check=True)
    return json.loads(out.stdout)


def held():
    """The hold names with requests held on them now."""
    return {k: n for k, n in stub("/_stub/holds")["waiting"].items() if n > 0}


async def call(s, tool, args, ok=True):
    r = await s.call_tool(tool, args)
    text = r.content[0].text if r.content else ""
    assert bool(r.isError) != ok, f"{tool} {args}: isError={r.isError}: {text}"
    return json.loads(text)


def server():
    # Both servers in one scope: each sees the other's sessions as its own (a shared queue
    # is the point), none of other tests'.
    return StdioServerParameters(
        command=CAW,
        args=["mcp", "--scope", f"acct-{RUN}", "--network", NETWORK, "--endpoint", ENDPOINT,
              "--model", "gpt-5.5", "--per-account", "2"],
        env=dict(os.environ), cwd=HOST_DIR)


async def main():
    async with AsyncExitStack() as stack:
        servers = []
        for _ in range(2):
            r, w = await stack.enter_async_context(stdio_client(server()))
            s = await stack.enter_async_context(ClientSession(r, w))
            await s.initialize()
            servers.append(s)

        check("8 sessions, 4 started by each server, one account")
        owner = {}
        prompts = {}
        for k, s in enumerate(servers):
            for i in range(4):
                n = 4 * k + i
                st = await call(s, "start", {"provider": "codex",
                                             "prompt": f"HOLD:m{n} REMEMBER:w{n}"})
                [one] = st["sessions"]
                sid = one["session_id"]
                owner[sid] = s
                prompts[sid] = n
        assert len(owner) == 8, owner

        check("never more than 2 held at the stub; the others queued, with their place")
        released = set()
        saw_queued = False
        deadline = time.monotonic() + 300
        while len(released) < 8:
            now = held()
            assert sum(now.values()) <= 2, f"more than 2 turns of the account in flight: {now}"
            want = min(2, 8 - len(released))
            if len(now) < want:
                assert time.monotonic() < deadline, f"the queue stalled: {now}, {released}"
                await asyncio.sleep(0.2)
                continue
            if not saw_queued:
                statuses = {sid: await call(s, "status", {"session": sid})
                            for sid, s in owner.items()}
                queued = [x for x in statuses.values() if x["status"] == "queued"]
                assert len(queued) == 6, statuses
                assert all(x["queue_position"] >= 1 for x in queued), queued
                assert all(x["account"].startswith("codex-") for x in queued), queued
                saw_queued = True
            name = sorted(now)[0]
            stub(f"/_stub/release/{name}", "POST")
            released.add(name)

        check("all 8 end success, each with its own answer")
        for s in servers:
            ids = [sid for sid, o in owner.items() if o is s]
            w = await call(s, "wait", {"sessions": ids, "timeout_s": 240})
            assert not w["timed_out"], w
            for x in w["sessions"]:
                assert x["status"] == "success", x
                r = await call(s, "result", {"session": x["session_id"]})
                n = prompts[x["session_id"]]
                assert r["result"] == f"Noted: w{n}.", r
        inflight = stub("/_stub/inflight")
        assert inflight["max"] <= 2, inflight
    print("mcp accounts checks passed", flush=True)


asyncio.run(main())
