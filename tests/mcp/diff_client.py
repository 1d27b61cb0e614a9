"""`diff`, `apply`, `result` and `events` of `caw-box mcp` made exact and bounded (issue 51),
driven over stdio by the official MCP Python SDK: the e2e test tests/e2e/mcp.rs
(`mcp_diff_is_what_apply_applies_byte_for_byte`) runs it.

Usage: diff_client.py CAW_BOX NETWORK ENDPOINT KEY HOST_DIR
A codex sub-agent in copy mode (on the test's internal network, against the stub model)
writes a file that is not UTF-8, a binary file, `é b/x.txt`, and changes HOST_DIR's keep.txt.
The checks: the patch `diff` returns as text is what `caw-box diff --patch` writes, and `git
apply --binary` of that text on a fresh copy of HOST_DIR gives the agent's tree byte for byte;
`apply` gives the same bytes in HOST_DIR; `files_changed` names exactly the files; a small
`max_bytes` cuts the patch where a file begins and says so; `events` pages one at a time to the
end. Prints one line per check; exits non-zero (an AssertionError) at the first that fails.
"""
import asyncio
import json
import os
import shutil
import subprocess
import sys
import tempfile

for var in ["http_proxy", "https_proxy", "all_proxy", "HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY"]:
    os.environ.pop(var, None)

from mcp import ClientSession, StdioServerParameters  # noqa: E402
from mcp.client.stdio import stdio_client  # noqa: E402

CAW, NETWORK, ENDPOINT, KEY, HOST_DIR = sys.argv[1:6]
WEIRD = "é b/x.txt"
# What the agent's files hold after its turn (its command below writes them).
AGENT_FILES = {
    "keep.txt": "original\nchanged: café 日本\n".encode(),
    "latin1.txt": b"\xff\xfe latin-1 caf\xe9\n",
    "blob.bin": b"bin\x00\x01\x02",
    WEIRD: b"x\n",
}
COMMAND = (r"printf '\377\376 latin-1 caf\351\n' > latin1.txt"
           r" && printf 'bin\000\001\002' > blob.bin"
           r" && mkdir -p 'é b' && echo x > 'é b/x.txt'"
           r" && echo 'changed: café 日本' >> keep.txt")


def check(name):
    print(f"mcp diff check: {name}", flush=True)


async def call(s, tool, args, ok=True):
    r = await s.call_tool(tool, args)
    text = r.content[0].text if r.content else ""
    assert bool(r.isError) != ok, f"{tool} {args}: isError={r.isError}: {text}"
    return r


async def answer(s, tool, args, ok=True):
    return json.loads((await call(s, tool, args, ok)).content[0].text)


def tree(root):
    """Every file under root (relative path -> bytes)."""
    files = {}
    for dirpath, _, names in os.walk(root):
        for n in names:
            path = os.path.join(dirpath, n)
            with open(path, "rb") as f:
                files[os.path.relpath(path, root)] = f.read()
    return files


async def main(s, scratch):
    check("the schemas carry max_bytes and limit with their bounds")
    tools = {t.name: t for t in (await s.list_tools()).tools}
    max_bytes = tools["diff"].inputSchema["properties"]["max_bytes"]
    assert (max_bytes["minimum"], max_bytes["maximum"]) == (1, 16 << 20), max_bytes
    limit = tools["events"].inputSchema["properties"]["limit"]
    assert (limit["minimum"], limit["maximum"]) == (1, 1000), limit

    # The directory as the session starts from it, for a fresh copy to apply the patch to.
    start = os.path.join(scratch, "start")
    shutil.copytree(HOST_DIR, start, symlinks=True)

    check("a codex sub-agent writes text that is not UTF-8, a binary file, and é b/x.txt")
    st = await answer(s, "start", {"provider": "codex", "workspace": HOST_DIR,
                                   "prompt": f"RUN:{COMMAND}"})
    sid = st["sessions"][0]["session_id"]
    w = await answer(s, "wait", {"sessions": [sid], "timeout_s": 240})
    assert not w["timed_out"] and w["sessions"][0]["status"] == "success", w

    check("result: files_changed names exactly those files, é b/x.txt spelled right")
    r = await answer(s, "result", {"session": sid})
    files = {f["path"]: f for f in r["files_changed"]}
    assert set(files) == set(AGENT_FILES), r["files_changed"]
    for binary in ["latin1.txt", "blob.bin"]:
        assert files[binary]["binary"] and files[binary]["added"] is None, files[binary]
    assert files["keep.txt"] == {"path": "keep.txt", "added": 1, "removed": 0,
                                 "binary": False}, files["keep.txt"]
    assert files[WEIRD]["added"] == 1 and not files[WEIRD]["binary"], files[WEIRD]
    for tool in ["result", "events"]:
        e = await answer(s, tool, {"session": sid, "turn": 99}, ok=False)
        assert e["error"]["kind"] == "not_found", (tool, e)

    check("diff: the first block is the patch, the structured content says what it is")
    d = await call(s, "diff", {"session": sid})
    patch = d.content[0].text
    meta = d.structuredContent
    assert len(d.content) == 1, d.content
    assert meta["bytes"] == meta["returned_bytes"] == len(patch.encode()), meta
    assert meta["truncated"] is False, meta
    assert meta["files_changed"] == r["files_changed"], meta
    assert "GIT binary patch" in patch and "+changed: café 日本" in patch, patch
    print(f"patch: {len(patch.encode())} bytes", flush=True)

    check("caw-box diff --patch writes the same bytes")
    cli = subprocess.run([CAW, "diff", sid, "--patch"], capture_output=True, check=True)
    assert cli.stdout == patch.encode(), (cli.stdout, patch)

    check("git apply --binary of the text on a fresh copy gives the agent's files byte for byte")
    patch_file = os.path.join(scratch, "tool.patch")
    with open(patch_file, "w", encoding="utf-8", newline="") as f:
        f.write(patch)
    subprocess.run(["git", "apply", "--binary", patch_file], cwd=start, check=True)
    exported = os.path.join(scratch, "exported")
    subprocess.run([CAW, "export", sid, exported], capture_output=True, check=True)
    agents = tree(exported)
    for path, content in AGENT_FILES.items():
        assert agents[path] == content, (path, agents[path])
    assert tree(start) == agents, (sorted(tree(start)), sorted(agents))

    check("a small max_bytes: the head up to a file boundary, truncated, how to get the rest")
    first_file_end = patch.encode().index(b"\ndiff --git ", 1) + 1
    # A bound that falls inside the second file's section (past its `é`): the cut goes back
    # to where that file begins.
    small = patch.encode().index("é".encode(), first_file_end) + 1
    t = await call(s, "diff", {"session": sid, "max_bytes": small})
    head = t.content[0].text
    assert t.structuredContent["truncated"] is True, t.structuredContent
    assert t.structuredContent["bytes"] == len(patch.encode()), t.structuredContent
    assert len(head.encode()) <= small and patch.startswith(head), (small, head)
    assert head.encode() == patch.encode()[:first_file_end], head
    assert t.structuredContent["returned_bytes"] == len(head.encode())
    assert len(t.content) == 2 and "max_bytes" in t.content[1].text, t.content
    e = await answer(s, "diff", {"session": sid, "max_bytes": 0}, ok=False)
    assert e["error"]["kind"] == "usage", e

    check("apply: the same bytes in the directory itself")
    a = await answer(s, "apply", {"session": sid})
    assert a["applied"] and a["files_changed"] == r["files_changed"], a
    applied = tree(HOST_DIR)
    for path, content in AGENT_FILES.items():
        assert applied[path] == content, (path, applied[path])

    check("events: limit 1 pages one event at a time to the end")
    whole = await answer(s, "events", {"session": sid})
    assert whole["more"] is False and whole["next_cursor"] == len(whole["events"]), whole
    assert len(whole["events"]) >= 3, whole
    paged, cursor = [], 0
    while True:
        page = await answer(s, "events", {"session": sid, "cursor": cursor, "limit": 1})
        assert len(page["events"]) == 1 and page["next_cursor"] == cursor + 1, page
        paged += page["events"]
        cursor = page["next_cursor"]
        if not page["more"]:
            break
    assert paged == whole["events"], (paged, whole["events"])
    end = await answer(s, "events", {"session": sid, "cursor": cursor, "limit": 1})
    assert end["events"] == [] and not end["more"] and end["next_cursor"] == cursor, end
    e = await answer(s, "events", {"session": sid, "limit": 1001}, ok=False)
    assert e["error"]["kind"] == "usage", e
    await answer(s, "remove", {"session": sid})


async def run():
    params = StdioServerParameters(
        command=CAW,
        args=["mcp", "--network", NETWORK, "--endpoint", ENDPOINT, "--model", "gpt-5.5",
              "--env", f"OPENAI_API_KEY={KEY}"],
        env=dict(os.environ), cwd=HOST_DIR)
    with tempfile.TemporaryDirectory() as scratch:
        async with stdio_client(params) as (r, w):
            async with ClientSession(r, w) as s:
                await s.initialize()
                await main(s, scratch)
    print("mcp diff checks passed", flush=True)


asyncio.run(run())
