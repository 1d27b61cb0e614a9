"""`caw-box mcp --on-limit park` (issue 55), driven over stdio by the official MCP Python SDK:
the e2e test tests/e2e/park.rs (`an_mcp_servers_sessions_park_at_a_usage_limit`) runs it.

Usage: park.py CAW_BOX NETWORK ENDPOINT HOST_DIR
The stub acts as an account of 2 requests per 15 s that refuses past them with codex's usage
limit. The server starts 4 codex sessions (the collected key, brokered: one account): `status`
of some says `parked` with `resumes_at` and their account; `wait` returns all 4 `success` after
the reset, each with its own answer; `list` and `status` carry the account and its windows
(2 requests a window, as the stub's headers say). Prints one line per check; exits non-zero (an
AssertionError) at the first that fails.
"""
import asyncio
import json
import os
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
    print(f"mcp park check: {name}", flush=True)


async def call(s, tool, args, ok=True):
    r = await s.call_tool(tool, args)
    text = r.content[0].text if r.content else ""
    assert bool(r.isError) != ok, f"{tool} {args}: isError={r.isError}: {text}"
    return json.loads(text)


async def main():
    server = StdioServerParameters(
        command=CAW,
        args=["mcp", "--scope", f"park-{RUN}", "--network", NETWORK, "--endpoint", ENDPOINT,
              "--model", "gpt-5.5", "--on-limit", "park"],
        env=dict(os.environ), cwd=HOST_DIR)
    async with AsyncExitStack() as stack:
        r, w = await stack.enter_async_context(stdio_client(server))
        s = await stack.enter_async_context(ClientSession(r, w))
        await s.initialize()

        check("4 sessions of one account started")
        word = {}
        for n in range(4):
            st = await call(s, "start", {"provider": "codex", "prompt": f"REMEMBER:w{n}"})
            [one] = st["sessions"]
            word[one["session_id"]] = f"w{n}"

        check("some are parked, with resumes_at and their account")
        deadline = time.monotonic() + 60
        while True:
            statuses = [await call(s, "status", {"session": sid}) for sid in word]
            parked = [x for x in statuses if x["status"] == "parked"]
            if parked:
                break
            assert time.monotonic() < deadline, f"none parked: {statuses}"
            await asyncio.sleep(0.3)
        now = time.time()
        for x in parked:
            assert now < x["resumes_at"] <= now + 20, x
            assert x["account"].startswith("codex-"), x

        check("all 4 end success after the reset, each with its own answer")
        w = await call(s, "wait", {"sessions": list(word), "timeout_s": 120})
        assert not w["timed_out"], w
        for x in w["sessions"]:
            assert x["status"] == "success", x
        done = [x["session_id"] for x in w["sessions"]]
        assert sorted(done) == sorted(word), (done, word)

        check("list and status carry the account and what it has left")
        ls = await call(s, "list", {})
        rows = [x for x in ls["sessions"] if x["session_id"] in word]
        assert len(rows) == 4, ls
        account = rows[0]["account"]
        for x in rows:
            assert x["account"] == account and account.startswith("codex-"), x
            requests = [v for v in x["account_windows"]["windows"] if v["name"] == "requests"]
            assert requests and requests[0]["limit"] == 2, x
        st = await call(s, "status", {"session": rows[0]["session_id"]})
        assert st["account"] == account, st
        assert st["account_windows"] == rows[0]["account_windows"], (st, rows[0])
    print("mcp park checks passed", flush=True)


asyncio.run(main())
