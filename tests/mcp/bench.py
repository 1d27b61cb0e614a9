"""`make bench`, the MCP part: a codex turn delegated through `caw-box mcp` (`start`, then
`wait`, over stdio with the official MCP Python SDK) against the same turn by the CLI
(`caw-box run -d`, then `caw-box wait`), both new copy-mode sessions of the same directory,
against the stub model on an internal network of its own (the Python tests' rig). Paired,
the order alternating; the median of the ratios; the target is 1.05x. Also reported, with no
target: the server's threads and resident memory at idle, and at their peak under 100
parallel tool calls from one client (and after them). Run with the virtualenv of
scripts/mcp-venv.sh (scripts/bench.sh does): bench.py CAW_BOX. BENCH_REPS sets the pairs
(default 7)."""

import asyncio
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path[0] = str(Path(__file__).resolve().parents[2] / "python" / "tests")
from conftest import TEST_KEY, Rig  # noqa: E402

from mcp import ClientSession, StdioServerParameters  # noqa: E402
from mcp.client.stdio import stdio_client  # noqa: E402

TARGET = 1.05
CAW = os.path.abspath(sys.argv[1])


def server_pid() -> int:
    """The `caw-box mcp` this process started."""
    me = os.getpid()
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmd = f.read().split(b"\0")
        except OSError:
            continue
        if ppid == me and b"mcp" in cmd:
            return int(pid)
    raise AssertionError("the server process was not found")


def threads_and_rss(pid: int) -> tuple[int, int]:
    """The process's threads and resident set (KiB), from /proc."""
    fields = {}
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            k, _, v = line.partition(":")
            fields[k] = v.split()
    return int(fields["Threads"][0]), int(fields["VmRSS"][0])


async def footprint(s) -> str:
    """Threads and RSS at idle, at the peak of 100 parallel calls, and after them."""
    pid = server_pid()
    idle = threads_and_rss(pid)
    peak = list(idle)
    done = False

    def sample():
        while not done:
            t, r = threads_and_rss(pid)
            peak[0], peak[1] = max(peak[0], t), max(peak[1], r)
            time.sleep(0.01)

    sampler = asyncio.get_running_loop().run_in_executor(None, sample)
    t0 = time.perf_counter()
    calls = [s.call_tool("list", {}) if i % 2 else s.call_tool("status", {"session": "no-such"})
             for i in range(100)]
    results = await asyncio.gather(*calls)
    took = time.perf_counter() - t0
    done = True
    await sampler
    assert sum(1 for r in results if not r.isError) == 50, results[:2]
    after = threads_and_rss(pid)
    return (f"mcp server footprint: idle {idle[0]} threads, {idle[1] / 1024:.1f} MiB RSS; "
            f"100 parallel calls in {took:.2f}s: peak {peak[0]} threads, {peak[1] / 1024:.1f} MiB; "
            f"after {after[0]} threads, {after[1] / 1024:.1f} MiB")


async def bench(rig: Rig, env: dict, reps: int) -> int:
    settings = ["--network", rig.network, "--endpoint", rig.endpoint, "--model", "gpt-5.5",
                "--env", f"OPENAI_API_KEY={TEST_KEY}"]
    ws = str(rig.workspace)
    params = StdioServerParameters(command=CAW, args=["mcp", *settings], env=env, cwd=ws)
    async with stdio_client(params) as (r, w):
        async with ClientSession(r, w) as s:
            await s.initialize()
            print(await footprint(s), flush=True)

            async def mcp_turn() -> float:
                t = time.perf_counter()
                started = await s.call_tool("start", {"provider": "codex", "prompt": "hi",
                                                      "workspace": ws})
                assert not started.isError, started
                sid = json.loads(started.content[0].text)["sessions"][0]["session_id"]
                done = await s.call_tool("wait", {"sessions": [sid]})
                assert json.loads(done.content[0].text)["sessions"][0]["status"] == "success"
                return time.perf_counter() - t

            def cli_turn() -> float:
                t = time.perf_counter()
                out = subprocess.run([CAW, "run", "-d", "-q", "--provider", "codex",
                                      "--workspace-mode", "copy", "--workspace", ws, *settings,
                                      "hi"], env=env, cwd=ws, check=True, capture_output=True,
                                     text=True)
                waited = subprocess.run([CAW, "wait", out.stdout.strip(), "-o", "json"], env=env,
                                        cwd=ws, check=True, capture_output=True, text=True)
                assert json.loads(waited.stdout)["status"] == "success"
                return time.perf_counter() - t

            await mcp_turn()  # the first of each warms the daemon's caches
            cli_turn()
            ratios, mcp_times, cli_times = [], [], []
            for i in range(reps):
                if i % 2:
                    c = cli_turn()
                    m = await mcp_turn()
                else:
                    m = await mcp_turn()
                    c = cli_turn()
                mcp_times.append(m)
                cli_times.append(c)
                ratios.append(m / c)
    ratio = statistics.median(ratios)
    verdict = "ok" if ratio <= TARGET else f"MISSED (target {TARGET}x)"
    print(f"mcp start+wait (codex, copy mode): {statistics.median(mcp_times):.3f}s vs CLI run -d + "
          f"wait {statistics.median(cli_times):.3f}s: {ratio:.3f}x of the CLI's, median of {reps} "
          f"pairs: {verdict}")
    return 0 if ratio <= TARGET else 1


def main() -> int:
    reps = int(os.environ.get("BENCH_REPS", "7"))
    rig = Rig()
    try:
        return asyncio.run(bench(rig, rig.env(), reps))
    finally:
        rig.remove()


if __name__ == "__main__":
    sys.exit(main())
