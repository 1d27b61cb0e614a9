"""`caw-box --backend kubernetes mcp` on the k8s lab, driven by the official MCP Python SDK:
tests/e2e/kubernetes/mcp.rs runs it. A codex sub-agent as a pod: start, wait (with progress),
result, diff, apply, cancel of a held turn, and a second server's wait on a turn the first
one started.

Usage: cluster.py CAW_BOX ENDPOINT KEY HOST_DIR
The caw-box environment (kubeconfig, data dir) is this process's; ENDPOINT is the stub pod's
`http://IP:8080`, which this host reaches (the lab's pod network).
"""
import asyncio
import json
import os
import sys
import time
import urllib.request

for var in ["http_proxy", "https_proxy", "all_proxy", "HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY"]:
    os.environ.pop(var, None)

from mcp import ClientSession, StdioServerParameters  # noqa: E402
from mcp.client.stdio import stdio_client  # noqa: E402

CAW, ENDPOINT, KEY, HOST_DIR = sys.argv[1:5]
SCOPE = f"cluster-{os.urandom(3).hex()}"


def check(name):
    print(f"cluster check: {name}", flush=True)


def server():
    return StdioServerParameters(
        command=CAW,
        args=["--backend", "kubernetes", "--namespace", "default", "mcp", "--scope", SCOPE,
              "--endpoint", ENDPOINT, "--model", "gpt-5.5", "--env", f"OPENAI_API_KEY={KEY}"],
        env=dict(os.environ),
        cwd=HOST_DIR,
    )


def stub(path, method="GET"):
    req = urllib.request.Request(ENDPOINT + path, method=method)
    with urllib.request.urlopen(req, timeout=60) as r:
        return json.loads(r.read())


def held(name):
    for _ in range(8):
        if stub(f"/_stub/holds/{name}?wait=30")["waiting"] >= 1:
            return
    raise AssertionError(f"no request held on {name}")


async def call(s, tool, args, ok=True, **kw):
    r = await s.call_tool(tool, args, **kw)
    text = r.content[0].text if r.content else ""
    assert bool(r.isError) != ok, f"{tool} {args}: isError={r.isError}: {text}"
    return text if tool == "diff" and ok else json.loads(text)


async def wait_done(s, ids, **kw):
    w = await call(s, "wait", {"sessions": ids, "timeout_s": 300}, **kw)
    assert not w["timed_out"], w
    return {x["session_id"]: x for x in w["sessions"]}


async def first_server(s):
    check("start: a codex pod in copy mode")
    st = await call(s, "start", {"provider": "codex", "prompt":
                                 "REMEMBER:walrus HOLD:k8sfirst\nRUN:echo hello from the pod > hello.txt"})
    sid = st["sessions"][0]["session_id"]
    assert st["sessions"][0]["status"] == "running", st

    check("wait: progress notifications, then the outcome")
    notes = []

    async def on_progress(progress, total, message):
        notes.append(message)
        if len(notes) == 1:
            await asyncio.to_thread(stub, "/_stub/release/k8sfirst", "POST")

    done = await wait_done(s, [sid], progress_callback=on_progress)
    assert done[sid]["status"] == "success", done
    assert notes and all(n for n in notes), notes
    print(f"progress: {notes}", flush=True)

    check("result, diff, apply")
    r = await call(s, "result", {"session": sid})
    assert r["status"] == "success", r
    assert [f["path"] for f in r["files_changed"]] == ["hello.txt"], r
    patch = await call(s, "diff", {"session": sid})
    assert "+hello from the pod" in patch, patch
    assert not os.path.exists(os.path.join(HOST_DIR, "hello.txt")), "copy mode touched the dir"
    a = await call(s, "apply", {"session": sid})
    assert a["applied"], a
    with open(os.path.join(HOST_DIR, "hello.txt")) as f:
        assert f.read() == "hello from the pod\n"

    check("cancel of a held turn answers within 10 s; the session stays resumable")
    await call(s, "reply", {"session": sid, "prompt": "HOLD:k8scancel hi"})
    await asyncio.to_thread(held, "k8scancel")
    t0 = time.monotonic()
    c = await call(s, "cancel", {"session": sid})
    assert time.monotonic() - t0 < 10, c
    if c["status"] == "stopping":
        await wait_done(s, [sid])
    r = await call(s, "result", {"session": sid})
    assert r["status"] == "interrupted" and r["exit_code"] == 130, r

    check("a turn left running for the next server")
    await call(s, "reply", {"session": sid, "prompt": "RECALL HOLD:k8snext"})
    await asyncio.to_thread(held, "k8snext")
    return sid


async def main():
    t0 = time.monotonic()
    async with stdio_client(server()) as (r, w):
        async with ClientSession(r, w) as s:
            await s.initialize()
            sid = await first_server(s)

    check("a second server's wait gives the turn the first one started")
    async with stdio_client(server()) as (r, w):
        async with ClientSession(r, w) as s:
            await s.initialize()
            listed = [x["session_id"] for x in (await call(s, "list", {}))["sessions"]]
            assert sid in listed, listed
            st = await call(s, "status", {"session": sid})
            assert st["status"] == "running", st

            async def release(progress, total, message):
                await asyncio.to_thread(stub, "/_stub/release/k8snext", "POST")

            done = await wait_done(s, [sid], progress_callback=release)
            assert done[sid]["status"] == "success", done
            r = await call(s, "result", {"session": sid})
            assert "walrus" in r["result"], r
            await call(s, "remove", {"session": sid})
    print(f"cluster checks passed in {time.monotonic() - t0:.1f}s", flush=True)


asyncio.run(main())
