"""`make bench`, the Python part: a codex turn sent from Python (`Session.send`) against the
same turn by the CLI (`caw-box resume SESSION PROMPT -o json`, the wheel's binary), on one
session, against the stub model on an internal network of its own (the tests' rig). Paired
like the Rust bench: each Python turn against the CLI turn next to it (the order
alternates), the median of the ratios; the target is 1.05x. Run with the virtualenv that
has the wheel (scripts/bench.sh does). BENCH_REPS sets the pairs (default 11)."""

import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

# The tests' rig, and not this checkout's caw_box/ (the installed one, with its extension).
sys.path[0] = str(Path(__file__).resolve().parent / "tests")
from conftest import TEST_KEY, Rig  # noqa: E402

TARGET = 1.05


def main() -> int:
    reps = int(os.environ.get("BENCH_REPS", "11"))
    rig = Rig()
    try:
        env = rig.env()
        os.environ.clear()
        os.environ.update(env)
        import caw_box

        session = caw_box.Agent("codex", **rig.agent_kwargs("codex")).start_session()
        assert session.send("REMEMBER:bench").ok
        cli = [caw_box.binary(), "resume", session.id, "--env", f"OPENAI_API_KEY={TEST_KEY}", "-q", "-o", "json",
               "RECALL"]

        def python_turn() -> float:
            t = time.perf_counter()
            assert session.send("RECALL").ok
            return time.perf_counter() - t

        def cli_turn() -> float:
            t = time.perf_counter()
            subprocess.run(cli, env=env, cwd=str(rig.workspace), check=True, capture_output=True)
            return time.perf_counter() - t

        ratios, py_times, cli_times = [], [], []
        for i in range(reps):
            if i % 2:
                c, p = cli_turn(), python_turn()
            else:
                p, c = python_turn(), cli_turn()
            py_times.append(p)
            cli_times.append(c)
            ratios.append(p / c)
        ratio = statistics.median(ratios)
        verdict = "ok" if ratio <= TARGET else f"MISSED (target {TARGET}x)"
        print(f"python send turn (codex, resume): {statistics.median(py_times):.3f}s vs CLI "
              f"{statistics.median(cli_times):.3f}s: {ratio:.3f}x of the CLI's, median of {reps} pairs: {verdict}")
        return 0
    finally:
        rig.remove()


if __name__ == "__main__":
    sys.exit(main())
