"""`make bench`, the MCP part: a codex turn delegated through `caw-box mcp` (`start`, then
`wait`, over stdio with the official MCP Python SDK) against the same turn by the CLI
(`caw-box run -d`, then `caw-box wait`), both new copy-mode sessions of the same directory,
against the stub model on an internal network of its own (the Python tests' rig). Paired,
the order alternating; the median of the ratios; the target is 1.05x. Run with the
virtualenv of scripts/mcp-venv.sh (scripts/bench.sh does): bench.py CAW_BOX. BENCH_REPS sets
the pairs (default 7)."""

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


async def bench(rig: Rig, env: dict, reps: int) -> int:
    settings = ["--network", rig.network, "--endpoint", rig.endpoint, "--model", "gpt-5.5",
                "--env", f"OPENAI_API_KEY={TEST_KEY}"]
    ws = str(rig.workspace)
    params = StdioServerParameters(command=CAW, args=["mcp", *settings], env=env, cwd=ws)
    async with stdio_client(params) as (r, w):
        async with ClientSession(r, w) as s:
            await s.initialize()

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
