"""Drives `caw-box mcp` over stdio with the official MCP Python SDK, as an orchestrating
agent would: the e2e test tests/e2e/mcp.rs runs it (scripts/mcp-venv.sh makes its Python).

Usage: client.py CAW_BOX NETWORK ENDPOINT KEY STUB_CONTAINER HOST_DIR
The caw-box environment (data dir, labels) is this process's. Every sub-agent runs codex on
the test's internal network against the stub model. Prints one line per check; exits
non-zero (an AssertionError) at the first that fails.
"""
import asyncio
import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request

# Test traffic goes to loopback only: never through a proxy the environment names.
for var in ["http_proxy", "https_proxy", "all_proxy", "HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY"]:
    os.environ.pop(var, None)

from mcp import ClientSession, StdioServerParameters  # noqa: E402
from mcp.client.stdio import stdio_client  # noqa: E402
from mcp.client.streamable_http import streamablehttp_client  # noqa: E402

CAW, NETWORK, ENDPOINT, KEY, STUB, HOST_DIR = sys.argv[1:7]
# Names are the daemon's, shared with other tests and runs: made unique.
RUN = os.urandom(3).hex()
WRITER, SURVIVOR, PLANNER = f"writer-{RUN}", f"survivor-{RUN}", f"planner-{RUN}"
TOOLS = {"start", "reply", "fork", "wait", "status", "events", "result", "diff", "apply",
         "cancel", "list", "remove"}


def check(name):
    print(f"mcp check: {name}", flush=True)


def server_args(*extra):
    # A scope of this run's own: the daemon is shared with other tests' servers, and with the
    # default scope their sessions would come and go in this one's `list`.
    return ["mcp", "--scope", f"mcp-{RUN}", "--network", NETWORK, "--endpoint", ENDPOINT,
            "--model", "gpt-5.5", "--env", f"OPENAI_API_KEY={KEY}", *extra]


def server(*extra):
    return StdioServerParameters(
        command=CAW,
        args=server_args(*extra),
        env=dict(os.environ),
        cwd=HOST_DIR,
    )


def stub(path, method="GET"):
    """The stub's own endpoint, from inside its container (its network is internal)."""
    js = ("const [m, p] = process.argv.slice(1); fetch('http://127.0.0.1:8080' + p, {method: m})"
          ".then(async r => console.log(await r.text()))")
    out = subprocess.run(["docker", "exec", STUB, "node", "-e", js, method, path],
                         capture_output=True, text=True, timeout=120, check=True)
    return json.loads(out.stdout)


def held(name):
    for _ in range(6):
        if stub(f"/_stub/holds/{name}?wait=30")["waiting"] >= 1:
            return
    raise AssertionError(f"no request held on {name}")


async def call(s, tool, args, ok=True, **kw):
    r = await s.call_tool(tool, args, **kw)
    text = r.content[0].text if r.content else ""
    assert bool(r.isError) != ok, f"{tool} {args}: isError={r.isError}: {text}"
    if tool == "diff" and ok:
        return text
    return json.loads(text)


async def wait_done(s, ids, **kw):
    w = await call(s, "wait", {"sessions": ids, "timeout_s": 240}, **kw)
    assert not w["timed_out"], w
    return {x["session_id"]: x for x in w["sessions"]}


async def main_server(s):
    check("tools/list and schemas")
    tools = {t.name: t for t in (await s.list_tools()).tools}
    assert set(tools) == TOOLS, sorted(tools)
    for t in tools.values():
        assert t.description, t.name
        for prop, schema in t.inputSchema.get("properties", {}).items():
            assert schema.get("description"), f"{t.name}.{prop} has no description"
    start_props = tools["start"].inputSchema["properties"]
    for arg in ["provider", "prompt", "workspace", "workspace_mode", "name", "group", "model",
                "effort", "system_prompt", "append_system_prompt", "tools", "allow_host",
                "runtime", "keep_warm", "timeout", "max_cost_usd", "n"]:
        assert arg in start_props, arg
    assert set(tools["start"].inputSchema["required"]) == {"provider", "prompt"}
    fork_props = tools["fork"].inputSchema["properties"]
    for arg in ["session", "at_turn", "n", "name", "group", "prompt", "model", "max_cost_usd"]:
        assert arg in fork_props, arg
    assert "provider" in fork_props, fork_props
    assert fork_props["n"]["minimum"] == 1 and fork_props["n"]["maximum"] == 8, fork_props["n"]
    assert set(tools["fork"].inputSchema["required"]) == {"session"}

    check("bad provider, missing workspace, unknown session: isError, and the server serves on")
    e = await call(s, "start", {"provider": "nope", "prompt": "hi"}, ok=False)
    assert e["error"]["kind"] == "usage" and "nope" in e["error"]["message"], e
    e = await call(s, "start", {"provider": "codex", "prompt": "hi",
                                "workspace": "/no/such/dir"}, ok=False)
    assert "/no/such/dir" in e["error"]["message"], e
    e = await call(s, "status", {"session": "no-such-session"}, ok=False)
    assert e["exit_code"] == 2 and e["error"]["kind"] == "not_found", e
    e = await call(s, "start", {"provider": "codex", "prompt": "hi", "n": 9}, ok=False)
    assert "n must be 1 to 8" in e["error"]["message"], e
    e = await call(s, "start", {"provider": "codex", "prompt": "hi", "effort": "extreme"}, ok=False)
    assert "effort" in e["error"]["message"], e
    r = await s.call_tool("start", {"provider": "codex", "prompt": "hi", "n": "three"})
    assert r.isError, r
    e = await call(s, "wait", {"sessions": ["no-such-session"]}, ok=False)
    assert "no-such-session" in e["error"]["message"], e
    await call(s, "list", {})

    check("start codex in copy mode: returns at once, running")
    t0 = time.monotonic()
    st = await call(s, "start", {
        "provider": "codex", "name": WRITER,
        "prompt": "REMEMBER:walrus HOLD:first\nRUN:echo hello from the box > hello.txt",
    })
    [one] = st["sessions"]
    sid = one["session_id"]
    assert one["status"] == "running" and one["name"] == WRITER, one
    assert time.monotonic() - t0 < 60
    assert not os.path.exists(os.path.join(HOST_DIR, "hello.txt")), "copy mode touched the dir"

    check("wait: progress notifications, then the outcome")
    notes = []

    async def on_progress(progress, total, message):
        notes.append(message)
        if len(notes) == 1:
            await asyncio.to_thread(stub, "/_stub/release/first", "POST")

    done = await wait_done(s, [sid], progress_callback=on_progress)
    assert done[sid]["status"] == "success", done
    handle = done[sid]["handle"]
    assert json.loads(handle)["session_id"] == sid, done
    assert notes and all(isinstance(n, str) and n for n in notes), notes
    print(f"progress: {notes}", flush=True)

    check("status, events")
    st = await call(s, "status", {"session": WRITER})
    assert st["status"] == "success" and st["turn"] == 1, st
    assert (await call(s, "status", {"session": handle}))["session_id"] == sid
    assert (await call(s, "status", {"session": sid[:8]}))["session_id"] == sid
    ev = await call(s, "events", {"session": sid})
    assert any(e["type"] == "tool_call" for e in ev["events"]), ev
    more = await call(s, "events", {"session": sid, "cursor": ev["next_cursor"]})
    assert more["events"] == [], more

    check("result names the file")
    r = await call(s, "result", {"session": sid})
    assert r["status"] == "success" and r["exit_code"] == 0 and r["exit_kind"] is None, r
    assert [f["path"] for f in r["files_changed"]] == ["hello.txt"], r
    assert r["files_changed"][0]["added"] == 1, r
    assert r["usage"]["output_tokens"] > 0 and r["resume_handle"], r

    check("diff is the patch of `caw-box diff --patch`")
    patch = await call(s, "diff", {"session": sid})
    cli = subprocess.run([CAW, "diff", sid, "--patch"], capture_output=True, text=True,
                         check=True).stdout
    assert patch == cli and "+hello from the box" in patch, patch

    check("apply writes it into the host directory")
    a = await call(s, "apply", {"session": sid, "check": True})
    assert not os.path.exists(os.path.join(HOST_DIR, "hello.txt")), "check wrote"
    a = await call(s, "apply", {"session": sid})
    assert a["applied"], a
    with open(os.path.join(HOST_DIR, "hello.txt")) as f:
        assert f.read() == "hello from the box\n"
    e = await call(s, "apply", {"session": sid}, ok=False)
    assert e["error"]["kind"] == "conflict" and "nothing was written" in e["error"]["message"], e

    check("reply recalls the first turn")
    rp = await call(s, "reply", {"session": WRITER, "prompt": "RECALL"})
    assert rp["turn"] == 2 and rp["status"] == "running", rp
    await wait_done(s, [sid])
    r = await call(s, "result", {"session": sid})
    assert "walrus" in r["result"], r

    check("status: a running turn's egress refusal, from its proxy's log, is its latest event")
    # The stub has codex's shell ask a host no policy lists, through the proxy (curl honours
    # http_proxy; the proxy refuses by name: nothing leaves the test's network), a second
    # after the tool started (its start is an event of its own, said just before).
    await call(s, "reply", {"session": sid, "prompt":
                            "RUN:sleep 1; curl -s http://refused.invalid/ >/dev/null; sleep 6; echo done"})
    deadline = time.monotonic() + 60
    while True:
        st = await call(s, "status", {"session": sid})
        if st.get("latest") == "egress refused: refused.invalid:80":
            break
        assert st["status"] in ("running", "queued") and time.monotonic() < deadline, st
        await asyncio.sleep(0.3)
    assert st["status"] == "running" and st["turn"] == 3, st
    await wait_done(s, [sid])

    check("a busy session's reply is refused; cancel of a held turn returns in < 10 s")
    await call(s, "reply", {"session": sid, "prompt": "HOLD:cancelme hi"})
    await asyncio.to_thread(held, "cancelme")
    st = await call(s, "status", {"session": sid})
    assert st["status"] == "running" and st["turn"] == 4 and "latest" in st, st
    ev = await call(s, "events", {"session": sid})
    assert ev["running"] and ev["turn"] == 4, ev
    e = await call(s, "reply", {"session": sid, "prompt": "hi"}, ok=False)
    assert e["error"]["kind"] == "busy" and e["exit_code"] == 2, e
    t0 = time.monotonic()
    c = await call(s, "cancel", {"session": sid})
    took = time.monotonic() - t0
    assert took < 10, took
    print(f"cancel took {took:.1f}s: {c}", flush=True)
    if c["status"] == "stopping":
        await wait_done(s, [sid])
    r = await call(s, "result", {"session": sid})
    assert r["status"] == "interrupted" and r["turn"] == 4, r
    assert r["exit_code"] == 130 and r["exit_kind"] == "interrupted", r
    await call(s, "reply", {"session": sid, "prompt": "RECALL"})
    await wait_done(s, [sid])
    r = await call(s, "result", {"session": sid})
    assert r["status"] == "success" and "walrus" in r["result"], r

    check("max_cost_usd: the crossing turn ends `budget`, the next reply is refused, a higher one goes on")
    st = await call(s, "start", {"provider": "codex", "prompt": "REMEMBER:fig", "max_cost_usd": 1e-9})
    spender = st["sessions"][0]["session_id"]
    done = await wait_done(s, [spender])
    assert done[spender]["status"] == "budget", done
    r = await call(s, "result", {"session": spender})
    # codex reports its usage with its answer: the answer is kept, and the spend is over.
    assert r["status"] == "budget" and r["exit_code"] == 6 and "fig" in r["result"], r
    assert r["cost_usd"] > 1e-9, r
    e = await call(s, "reply", {"session": spender, "prompt": "RECALL"}, ok=False)
    assert e["error"]["kind"] == "budget" and e["exit_code"] == 6, e
    assert "has spent" in e["error"]["message"], e
    await call(s, "reply", {"session": spender, "prompt": "RECALL", "max_cost_usd": 10})
    await wait_done(s, [spender])
    r = await call(s, "result", {"session": spender})
    assert r["status"] == "success" and "fig" in r["result"], r
    await call(s, "remove", {"session": spender})

    check("n: 3 gives three sessions of one group; --max-parallel 1 queues the others, in order")
    st = await call(s, "start", {"provider": "codex", "prompt": "HOLD:first3 hi", "n": 3})
    ids = [x["session_id"] for x in st["sessions"]]
    assert len(set(ids)) == 3 and st["group"], st
    assert all(x["group"] == st["group"] for x in st["sessions"]), st
    assert sorted(x["status"] for x in st["sessions"]) == ["queued", "queued", "running"], st
    first = next(x["session_id"] for x in st["sessions"] if x["status"] == "running")
    queued = [i for i in ids if i != first]
    q = await call(s, "status", {"session": queued[0]})
    assert q["status"] == "queued", q
    ls = await call(s, "list", {"group": st["group"], "status": "queued"})
    assert sorted(x["session_id"] for x in ls["sessions"]) == sorted(queued), ls
    e = await call(s, "reply", {"session": queued[0], "prompt": "hi"}, ok=False)
    assert "queued" in e["error"]["message"], e
    await asyncio.to_thread(stub, "/_stub/release/first3", "POST")
    w = await call(s, "wait", {"sessions": ids, "mode": "any", "timeout_s": 240})
    ended = [x["session_id"] for x in w["sessions"] if x["status"] not in ("running", "queued")]
    assert ended == [first], w
    done = await wait_done(s, ids)
    assert all(d["status"] == "success" for d in done.values()), done
    ls = await call(s, "list", {"group": st["group"]})
    assert sorted(x["session_id"] for x in ls["sessions"]) == sorted(ids), ls
    for i in ids:
        assert (await call(s, "remove", {"session": i}))["removed"] == i
    return sid


def stub_got(text):
    """Whether a model request the stub recorded carried `text` whole, in one string."""
    def strings(v):
        if isinstance(v, str):
            yield v
        elif isinstance(v, (list, dict)):
            for x in (v.values() if isinstance(v, dict) else v):
                yield from strings(x)
    logs = subprocess.run(["docker", "logs", STUB], capture_output=True, text=True,
                          timeout=120, check=True).stdout
    records = (json.loads(line) for line in logs.splitlines() if line.startswith('{"stub":"request"'))
    return any(text in x for r in records for x in strings(r["body"]))


async def large_prompts(s):
    check("start with a 512 KiB prompt: the stub gets all of it; over the 1 MiB cap: isError, nothing made")
    big = f"BEGIN-{RUN}\n" + "keep every line of this prompt\n" * (512 * 1024 // 31)
    big = (big + "x" * 512 * 1024)[:512 * 1024 - len(f"END-{RUN}")] + f"END-{RUN}"
    st = await call(s, "start", {"provider": "codex", "prompt": big})
    sid = st["sessions"][0]["session_id"]
    done = await wait_done(s, [sid])
    assert done[sid]["status"] == "success", done
    assert stub_got(big), "no request carried the whole 512 KiB prompt"
    before = await call(s, "list", {})
    over = "y" * (1024 * 1024 + 1)
    for tool, args in [("start", {"provider": "codex", "prompt": over}),
                       ("reply", {"session": sid, "prompt": over})]:
        e = await call(s, tool, args, ok=False)
        assert e["error"]["kind"] == "usage" and e["exit_code"] == 2, e
        assert "1048577 bytes" in e["error"]["message"], e
    after = await call(s, "list", {})
    assert after == before, f"a session was made or changed:\nbefore: {before}\nafter:  {after}"
    await call(s, "remove", {"session": sid})


async def session_ids(s):
    return sorted(x["session_id"] for x in (await call(s, "list", {}))["sessions"])


async def forks(s):
    """`fork` (issue 53): one session writes the plan; three forks of it each write their own
    file, behind --max-parallel 1; their diffs hold the plan and differ; one is applied.
    Cost: four codex turns, one after another."""
    check("fork: an unknown session, n: 0, n: 9, a turn it lacks, settings without a prompt: "
          "isError, nothing made")
    st = await call(s, "start", {"provider": "codex", "name": PLANNER,
                                 "prompt": "RUN:echo the plan > plan.txt"})
    src = st["sessions"][0]["session_id"]
    done = await wait_done(s, [src])
    assert done[src]["status"] == "success", done
    before = await session_ids(s)
    for args, kind, says in [
            ({"session": "no-such-session", "n": 2}, "not_found", "no-such-session"),
            ({"session": PLANNER, "n": 0}, "usage", "n must be 1 to 8, not 0"),
            ({"session": PLANNER, "n": 9, "prompt": "hi"}, "usage", "n must be 1 to 8, not 9"),
            ({"session": PLANNER, "at_turn": 2}, "not_found", "no turn 2"),
            ({"session": PLANNER, "model": "gpt-5.5"}, "usage", "prompt"),
            ({"session": PLANNER, "provider": "nope"}, "usage", "nope")]:
        e = await call(s, "fork", args, ok=False)
        assert e["error"]["kind"] == kind and says in e["error"]["message"], (args, e)
    assert await session_ids(s) == before, "a refused fork made a session"

    check("fork in another vendor's CLI: a gemini session from the plan, with the handoff")
    fk = await call(s, "fork", {"session": PLANNER, "provider": "gemini"})
    (g,) = fk["sessions"]
    assert g["provider"] == "gemini" and g["forked_from"] == {"session": src, "turn": 1}, fk
    ls = {x["session_id"]: x for x in (await call(s, "list", {}))["sessions"]}
    assert ls[g["session_id"]]["provider"] == "gemini", ls
    await call(s, "remove", {"session": g["session_id"]})
    after = await session_ids(s)
    assert after == before, f"removing the gemini fork {g['session_id']}: {before} -> {after}"

    check("fork n: 3 with a prompt: three sessions from the plan, each its own way; diff, apply")
    fk = await call(s, "fork", {"session": PLANNER, "n": 3,
                                "prompt": "RUN:cat /proc/sys/kernel/random/uuid > impl.txt"})
    ids = [x["session_id"] for x in fk["sessions"]]
    assert len(set(ids)) == 3 and src not in ids and fk["group"], fk
    for x in fk["sessions"]:
        assert x["forked_from"] == {"session": src, "turn": 1}, fk
        assert x["group"] == fk["group"] and x["turn"] == 2, fk
        assert json.loads(x["handle"])["session_id"] == x["session_id"], fk
    assert sorted(x["status"] for x in fk["sessions"]) == ["queued", "queued", "running"], fk
    ls = await call(s, "list", {"group": fk["group"]})
    assert sorted(x["session_id"] for x in ls["sessions"]) == sorted(ids), ls
    done = await wait_done(s, ids)
    assert all(d["status"] == "success" for d in done.values()), done
    patches = [await call(s, "diff", {"session": i}) for i in ids]
    assert all("+the plan" in p and "impl.txt" in p for p in patches), patches
    assert len(set(patches)) == 3, f"the forks' diffs are alike: {patches}"
    a = await call(s, "apply", {"session": ids[1]})
    assert a["applied"], a
    with open(os.path.join(HOST_DIR, "plan.txt")) as f:
        assert f.read() == "the plan\n"
    with open(os.path.join(HOST_DIR, "impl.txt")) as f:
        assert "+" + f.read() in patches[1], patches[1]
    st = await call(s, "status", {"session": src})
    assert st["turn"] == 1, "the source ran a turn of a fork's"
    for i in [src, *ids]:
        await call(s, "remove", {"session": i})


def kill_child_server():
    """SIGKILL the `caw-box mcp` this process started (the crash of an orchestrator's server)."""
    me = os.getpid()
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmd = f.read().split(b"\0")
        except OSError:
            continue
        if ppid == me and b"mcp" in cmd:
            os.kill(int(pid), signal.SIGKILL)
            return int(pid)
    raise AssertionError("the server process was not found")


class Killed(Exception):
    pass


async def main():
    t0 = time.monotonic()
    async with stdio_client(server("--max-parallel", "1")) as (r, w):
        async with ClientSession(r, w) as s:
            init = await s.initialize()
            assert "start" in (init.instructions or "") and "wait" in init.instructions
            await main_server(s)
            await large_prompts(s)
            await forks(s)
            check("the server killed mid-turn")
            st = await call(s, "start", {"provider": "codex", "name": SURVIVOR,
                                         "prompt": "HOLD:crash REMEMBER:otter"})
            survivor = st["sessions"][0]["session_id"]
            await asyncio.to_thread(held, "crash")
            kill_child_server()
    stub("/_stub/release/crash", "POST")

    check("--http off loopback without a token exits 2")
    refused = subprocess.run([CAW, *server_args("--http", "0.0.0.0:0")], capture_output=True,
                             text=True, timeout=60)
    assert refused.returncode == 2 and "--token-file" in refused.stderr, refused

    check("a new server (Streamable HTTP, a bearer token) gives the killed turn's outcome")
    token = os.urandom(16).hex()
    token_file = os.path.join(os.environ["CAW_BOX_DATA_DIR"], "mcp-token")
    # Its owner's only, or the server refuses it (as ssh a private key).
    with open(os.open(token_file, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "w") as f:
        f.write(token + "\n")
    # A server budget far below one turn: its first turn takes it all.
    http = subprocess.Popen([CAW, *server_args("--http", "127.0.0.1:0", "--token-file", token_file,
                                               "--max-cost-usd", "0.000001")],
                            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True, cwd=HOST_DIR)
    try:
        line = http.stderr.readline()
        m = re.search(r"http://(127\.0\.0\.1:\d+)/mcp", line)
        assert m, line
        url = f"http://{m.group(1)}/mcp"
        request = urllib.request.Request(url, method="POST", data=b"{}",
                                         headers={"content-type": "application/json"})
        try:
            urllib.request.urlopen(request, timeout=30)
            raise AssertionError("a request without the token was served")
        except urllib.error.HTTPError as e:
            assert e.code == 401, e
        async with streamablehttp_client(url, headers={"Authorization": f"Bearer {token}"}) as (r, w, _):
            async with ClientSession(r, w) as s:
                await s.initialize()
                ls = await call(s, "list", {})
                assert survivor in [x["session_id"] for x in ls["sessions"]], ls
                done = await wait_done(s, [survivor])
                assert done[survivor]["status"] == "success", done
                r = await call(s, "result", {"session": SURVIVOR})
                assert r["status"] == "success" and "otter" in r["result"], r

                check("--max-cost-usd: a turn gets at most what the server has left; then it refuses")
                st = await call(s, "start", {"provider": "codex", "prompt": "REMEMBER:plum",
                                             "max_cost_usd": 5})
                spent = st["sessions"][0]["session_id"]
                done = await wait_done(s, [spent])
                assert done[spent]["status"] == "budget", done
                before = await session_ids(s)
                for tool, args in [("reply", {"session": spent, "prompt": "RECALL", "max_cost_usd": 5}),
                                   ("start", {"provider": "codex", "prompt": "hi"}),
                                   ("fork", {"session": spent, "n": 2, "prompt": "RECALL"})]:
                    e = await call(s, tool, args, ok=False)
                    assert e["error"]["kind"] == "budget", e
                    assert "this server's --max-cost-usd $0.0000 is spent" in e["error"]["message"], e
                assert await session_ids(s) == before, "a refused call made a session"
                await call(s, "remove", {"session": spent})
    finally:
        http.kill()
        http.wait()
    print(f"mcp checks passed in {time.monotonic() - t0:.1f}s", flush=True)


asyncio.run(main())
