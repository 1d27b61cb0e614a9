"""A hostile orchestrator against `caw-box mcp`'s walls, with the official MCP Python SDK: the
e2e test tests/e2e/mcp.rs (`a_hostile_orchestrator_cannot_widen_the_servers_walls`) runs it.

Usage: walls.py CAW_BOX NETWORK ENDPOINT KEY OTHER_HOST ROOT OUTSIDE PERSON_SESSION
- OTHER_HOST: a second server on the test's network that the server allows and a call drops;
- ROOT: the server's directory (its default workspace root), holding `repo/`, `evil-repo/`
  (whose .caw-box.toml asks for more than the server allows), `prompt.md`, and `out` (a
  symlink to OUTSIDE, the root's parent, where `secret.txt` lies);
- PERSON_SESSION: a session a person started with `caw-box run`, which no server may touch.
Every sub-agent runs codex on the test's internal network against the stub model. Prints one
line per check; exits non-zero (an AssertionError) at the first that fails.
"""
import asyncio
import json
import os
import subprocess
import sys
import time

for var in ["http_proxy", "https_proxy", "all_proxy", "HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY"]:
    os.environ.pop(var, None)

from mcp import ClientSession, StdioServerParameters  # noqa: E402
from mcp.client.stdio import stdio_client  # noqa: E402

CAW, NETWORK, ENDPOINT, KEY, OTHER, ROOT, OUTSIDE, PERSON = sys.argv[1:9]
RUN = os.urandom(3).hex()
SCOPE, OTHER_SCOPE = f"walls-{RUN}", f"elsewhere-{RUN}"
STUB = ENDPOINT.split("//", 1)[1].split(":", 1)[0]
# Through the turn's egress proxy, to the model's host and to the other host: the first line
# of each answer (200 from an allowed host, 403 from the proxy for a refused one).
PROBE = ("RUN:p=${{HTTPS_PROXY#http://}}; p=${{p%:*}}; for h in {hosts}; do exec 3<>/dev/tcp/$p/3128; "
         "printf 'GET http://%s:8080/_stub/health HTTP/1.0\\r\\n\\r\\n' $h >&3; "
         "echo \"$h: $(head -1 <&3 | tr -d '\\r')\"; exec 3<&-; done")


def check(name):
    print(f"walls check: {name}", flush=True)


def server(*extra):
    return StdioServerParameters(
        command=CAW,
        args=["mcp", "--network", NETWORK, "--endpoint", ENDPOINT, "--model", "gpt-5.5",
              "--env", f"OPENAI_API_KEY={KEY}", *extra],
        env=dict(os.environ),
        cwd=ROOT,
    )


async def call(s, tool, args, ok=True):
    r = await s.call_tool(tool, args)
    text = r.content[0].text if r.content else ""
    assert bool(r.isError) != ok, f"{tool} {args}: isError={r.isError}: {text}"
    return json.loads(text)


def objects(label):
    """The volumes and containers carrying `label` (`key=value`)."""
    out = []
    for kind in ["volume", "container"]:
        args = ["docker", kind, "ls", "-q", "--filter", f"label={label}"]
        if kind == "container":
            args.insert(3, "-a")
        out += subprocess.run(args, capture_output=True, text=True, check=True).stdout.split()
    return out


async def forbidden(s, args, names, tool="start"):
    """`tool` with `args` is refused as `forbidden`, naming `names`, and makes nothing."""
    before = objects(f"io.caw-box.scope={SCOPE}")
    e = await call(s, tool, args, ok=False)
    assert e["error"]["kind"] == "forbidden" and e["exit_code"] == 2, e
    said = e["error"]["message"] + " " + (e["error"]["hint"] or "")
    assert names in said, (names, e)
    assert objects(f"io.caw-box.scope={SCOPE}") == before, f"{args} left objects behind"
    return said


async def answer_of(s, args):
    st = await call(s, "start", {"provider": "codex", **args})
    sid = st["sessions"][0]["session_id"]
    w = await call(s, "wait", {"sessions": [sid], "timeout_s": 240})
    assert not w["timed_out"] and w["sessions"][0]["status"] == "success", w
    return sid, await call(s, "result", {"session": sid})


async def walls(s):
    check("the schema says the server's ceilings")
    tools = {t.name: t for t in (await s.list_tools()).tools}
    props = tools["start"].inputSchema["properties"]
    assert props["workspace_mode"]["enum"] == ["copy", "none"], props["workspace_mode"]
    assert OTHER in props["allow_host"]["description"], props["allow_host"]
    assert "nothing warm" in props["keep_warm"]["description"], props["keep_warm"]
    assert props["n"]["minimum"] == 1 and props["n"]["maximum"] == 8, props["n"]
    assert tools["wait"].inputSchema["properties"]["sessions"]["maxItems"] == 64
    assert tools["wait"].inputSchema["properties"]["mode"]["enum"] == ["all", "any"]
    assert props["effort"]["enum"] == ["low", "medium", "high"], props["effort"]

    check("another host, a place outside the root, @/etc/hostname, bind mode: forbidden, nothing made")
    hi = {"provider": "codex", "prompt": "hi"}
    await forbidden(s, {**hi, "allow_host": ["anything.example"]}, "--allow-host anything.example")
    await forbidden(s, {**hi, "allow_host": ["@provider", f"{OTHER}:9999"]}, f"'{OTHER}:9999'")
    assert props["egress"]["enum"] == ["balanced", "locked"], props["egress"]
    await forbidden(s, {**hi, "egress": "open"}, "--egress open")
    for place in ["/", OUTSIDE, os.path.join(ROOT, ".."), os.path.join(ROOT, "out"),
                  os.path.join(ROOT, "out", "inner")]:
        await forbidden(s, {**hi, "workspace": place}, "--workspace-root")
    with open("/etc/hostname") as f:
        hostname = f.read().strip()
    for arg in ["system_prompt", "append_system_prompt"]:
        for leak in ["@/etc/hostname", "@" + os.path.join(ROOT, "out", "secret.txt")]:
            said = await forbidden(s, {**hi, arg: leak}, "--workspace-root")
            assert hostname not in said and "the-secret" not in said, said
    await forbidden(s, {**hi, "workspace_mode": "bind"}, "--allow-bind")
    await forbidden(s, {**hi, "keep_warm": "5m"}, "--keep-warm")
    check("a repository's .caw-box.toml cannot widen the box either")
    await forbidden(s, {**hi, "workspace": os.path.join(ROOT, "evil-repo")}, "image")

    check("a narrower call runs: a host the server allows and the call dropped is unreachable")
    probe = PROBE.format(hosts=f"{STUB} {OTHER}")
    sid, r = await answer_of(s, {"prompt": probe, "allow_host": ["@provider"],
                                 "workspace": os.path.join(ROOT, "repo"),
                                 "system_prompt": "@" + os.path.join(ROOT, "prompt.md")})
    said = r["result"]
    assert f"{STUB}: HTTP/1.1 200" in said, said
    assert f"{OTHER}: HTTP/1.1 403" in said, said
    assert r["priced"] is True, r
    check("the same call keeping the other host reaches it (the control); an unpriced model says so")
    _, r = await answer_of(s, {"prompt": probe, "allow_host": ["@provider", f"{OTHER}:8080"],
                               "model": "stub-model-unpriced"})
    assert f"{OTHER}: HTTP/1.1 200" in r["result"], r
    assert r["priced"] is False and r["cost_usd"] is None, r

    check("a session `caw-box run` started is not found (a fork of it too, nothing made), and left alone")
    before = objects(f"io.caw-box.scope={SCOPE}")
    for tool, args in [("remove", {"session": PERSON, "force": True}),
                       ("reply", {"session": PERSON, "prompt": "RECALL"}),
                       ("cancel", {"session": PERSON}), ("status", {"session": PERSON}),
                       ("result", {"session": PERSON}), ("diff", {"session": PERSON}),
                       ("apply", {"session": PERSON}), ("events", {"session": PERSON}),
                       ("remove", {"session": PERSON[:8], "force": True}),
                       ("wait", {"sessions": [PERSON]}),
                       ("fork", {"session": PERSON, "n": 8, "prompt": "RECALL"}),
                       ("fork", {"session": PERSON[:8]})]:
        e = await call(s, tool, args, ok=False)
        assert e["error"]["kind"] == "not_found" and e["exit_code"] == 2, (tool, e)
    assert objects(f"io.caw-box.scope={SCOPE}") == before, "a refused call made something"
    handle = subprocess.run([CAW, "handle", PERSON], capture_output=True, text=True,
                            check=True).stdout.strip()
    e = await call(s, "remove", {"session": handle, "force": True}, ok=False)
    assert e["error"]["kind"] == "not_found", e
    listed = [x["session_id"] for x in (await call(s, "list", {}))["sessions"]]
    assert PERSON not in listed and sid in listed, listed
    return sid


async def main():
    t0 = time.monotonic()
    async with stdio_client(server("--scope", SCOPE, "--allow-host", "@provider",
                                   "--allow-host", f"{OTHER}:8080")) as (r, w):
        async with ClientSession(r, w) as s:
            await s.initialize()
            mine = await walls(s)

    check("a server of another scope neither lists, removes nor forks the first one's sessions")
    async with stdio_client(server("--scope", OTHER_SCOPE)) as (r, w):
        async with ClientSession(r, w) as s:
            await s.initialize()
            listed = [x["session_id"] for x in (await call(s, "list", {}))["sessions"]]
            assert mine not in listed and PERSON not in listed, listed
            e = await call(s, "remove", {"session": mine, "force": True}, ok=False)
            assert e["error"]["kind"] == "not_found", e
            e = await call(s, "fork", {"session": mine, "n": 2}, ok=False)
            assert e["error"]["kind"] == "not_found", e
            listed = [x["session_id"] for x in (await call(s, "list", {}))["sessions"]]
            assert listed == [], f"a refused fork made sessions in {OTHER_SCOPE}: {listed}"

    check("--runtime runsc: a call asking for runc (or the default) is forbidden")
    async with stdio_client(server("--scope", SCOPE, "--runtime", "runsc")) as (r, w):
        async with ClientSession(r, w) as s:
            await s.initialize()
            tools = {t.name: t for t in (await s.list_tools()).tools}
            assert tools["start"].inputSchema["properties"]["runtime"]["enum"] == ["runsc"]
            for asked in ["runc", "default"]:
                await forbidden(s, {"provider": "codex", "prompt": "hi", "runtime": asked},
                                "--runtime runsc")
            check("a new server of the same scope still sees its sessions")
            st = await call(s, "status", {"session": mine})
            assert st["status"] == "success", st
            check("a fork of a runc session, in its CLI or another's: forbidden, nothing made")
            for args in [{"session": mine}, {"session": mine, "provider": "gemini"},
                         {"session": mine, "n": 2, "prompt": "RECALL"}]:
                await forbidden(s, args, "--runtime runsc", tool="fork")

    check("--image: a fork in another vendor's CLI (whose image is another) is forbidden")
    shown = subprocess.run([CAW, "show", mine, "--json"], capture_output=True, text=True,
                           check=True).stdout
    image = json.loads(shown)["settings"]["image"]
    async with stdio_client(server("--scope", SCOPE, "--image", image)) as (r, w):
        async with ClientSession(r, w) as s:
            await s.initialize()
            for args in [{"session": mine, "provider": "gemini"},
                         {"session": mine, "provider": "claude", "prompt": "RECALL"}]:
                await forbidden(s, args, "image", tool="fork")

    for still in [PERSON, mine]:
        subprocess.run(["docker", "volume", "inspect", f"caw-box-{still}"], check=True,
                       capture_output=True)
    print(f"walls checks passed in {time.monotonic() - t0:.1f}s", flush=True)


asyncio.run(main())
