"""Drives `caw-box mcp --http` under load and hostile clients, with the official MCP Python SDK
as the real client: the e2e test tests/e2e/mcp_http.rs runs it (scripts/mcp-venv.sh makes its
Python).

Usage: http_server.py CAW_BOX NETWORK ENDPOINT KEY STUB_CONTAINER TOKEN_FILE
The caw-box environment (data dir, labels) is this process's; TOKEN_FILE holds the token (mode
0600). Every sub-agent runs codex on the test's internal network against the stub model; all
HTTP goes to the servers this script starts on 127.0.0.1. Prints one line per check; exits
non-zero (an AssertionError) at the first that fails.
"""
import asyncio
import http.client
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time

# Test traffic goes to loopback only: never through a proxy the environment names.
for var in ["http_proxy", "https_proxy", "all_proxy", "HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY"]:
    os.environ.pop(var, None)

from mcp import ClientSession  # noqa: E402
from mcp.client.streamable_http import streamablehttp_client  # noqa: E402

CAW, NETWORK, ENDPOINT, KEY, STUB, TOKEN_FILE = sys.argv[1:7]
with open(TOKEN_FILE) as f:
    TOKEN = f.read().strip()
AUTH = {"Authorization": f"Bearer {TOKEN}"}
RUN = os.urandom(3).hex()
HOLD = f"stop-{RUN}"
STALLED = 300
PARALLEL = 100
MAX_THREADS = 64


def check(name):
    print(f"mcp-http check: {name}", flush=True)


class Server:
    """A `caw-box mcp --http` in a process group of its own (as a service manager starts one),
    its stderr collected."""

    def __init__(self):
        self.proc = subprocess.Popen(
            [CAW, "mcp", "--http", "127.0.0.1:0", "--token-file", TOKEN_FILE,
             "--network", NETWORK, "--endpoint", ENDPOINT, "--model", "gpt-5.5",
             "--env", f"OPENAI_API_KEY={KEY}"],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
            text=True, process_group=0)
        first = self.proc.stderr.readline()
        self.stderr = [first]
        m = re.search(r"http://(127\.0\.0\.1):(\d+)/mcp", first)
        assert m, first
        self.host, self.port = m.group(1), int(m.group(2))
        self.url = f"http://{self.host}:{self.port}/mcp"
        threading.Thread(target=self._drain, daemon=True).start()

    def _drain(self):
        for line in self.proc.stderr:
            self.stderr.append(line)

    def threads(self):
        with open(f"/proc/{self.proc.pid}/status") as f:
            return int(re.search(r"^Threads:\s+(\d+)", f.read(), re.M).group(1))

    def drivers(self):
        """The `caw-box __drive` processes this server started."""
        found = []
        for pid in filter(str.isdigit, os.listdir("/proc")):
            try:
                if ppid_of(int(pid)) == self.proc.pid and b"__drive" in cmdline_of(int(pid)):
                    found.append(int(pid))
            except OSError:
                continue
        return found

    def terminate_group(self):
        """SIGTERM to the server's whole process group, as a service manager or a terminal's
        Ctrl-C would send it; the time it took to exit and its exit code."""
        t0 = time.monotonic()
        os.killpg(self.proc.pid, signal.SIGTERM)
        code = self.proc.wait(timeout=15)
        return time.monotonic() - t0, code

    def kill(self):
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


class Peak:
    """The server's thread count (/proc's `Threads:`) at its highest while the block runs, and
    just after it (idle threads of a pool linger)."""

    def __init__(self, server):
        self.server = server
        self.threads = server.threads()
        self.done = threading.Event()

    def _sample(self):
        while not self.done.is_set():
            self.threads = max(self.threads, self.server.threads())
            self.done.wait(0.01)

    def __enter__(self):
        self.sampler = threading.Thread(target=self._sample, daemon=True)
        self.sampler.start()
        return self

    def __exit__(self, *exc):
        self.done.set()
        self.sampler.join()
        self.threads = max(self.threads, self.server.threads())
        print(f"server threads: at most {self.threads}", flush=True)


def stat_of(pid):
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()


def ppid_of(pid):
    return int(stat_of(pid)[1])


def alive(pid):
    try:
        return stat_of(pid)[0] not in ("Z", "X")
    except OSError:
        return False


def cmdline_of(pid):
    with open(f"/proc/{pid}/cmdline", "rb") as f:
        return f.read()


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
    return json.loads(text)


def initialize_body():
    return json.dumps({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-06-18", "capabilities": {},
        "clientInfo": {"name": "mcp-http-test", "version": "1"}}}).encode()


def post(server, headers, body):
    """A POST to /mcp on a connection of its own: status and headers (the body not read)."""
    c = http.client.HTTPConnection(server.host, server.port, timeout=30)
    try:
        c.putrequest("POST", "/mcp", skip_host="Host" in headers, skip_accept_encoding=True)
        for name, value in headers.items():
            c.putheader(name, value)  # names as given: a lower-case one stays lower-case
        c.putheader("content-length", str(len(body)))
        c.endheaders(body)
        r = c.getresponse()
        return r.status, {k.lower(): v for k, v in r.getheaders()}
    finally:
        c.close()


def oversized(server, chunked):
    """20 MiB sent to /mcp (its length declared, or chunked): the status line of the answer,
    read while the body is still being sent."""
    s = socket.create_connection((server.host, server.port), timeout=30)
    framing = "Transfer-Encoding: chunked" if chunked else f"Content-Length: {20 << 20}"
    s.sendall((f"POST /mcp HTTP/1.1\r\nHost: {server.host}:{server.port}\r\n"
               f"Authorization: Bearer {TOKEN}\r\nContent-Type: application/json\r\n"
               f"Accept: application/json, text/event-stream\r\n{framing}\r\n\r\n").encode())

    def send_body():
        piece = b" " * (1 << 20)
        try:
            for _ in range(20):
                s.sendall(b"100000\r\n" + piece + b"\r\n" if chunked else piece)
            if chunked:
                s.sendall(b"0\r\n\r\n")
        except OSError:
            pass  # answered and closed: the rest is not read, as it should be

    sender = threading.Thread(target=send_body, daemon=True)
    sender.start()
    answer = b""
    while b"\r\n" not in answer:
        got = s.recv(256)
        assert got, f"closed without an answer: {answer!r}"
        answer += got
    s.close()
    sender.join(timeout=30)
    return answer.split(b"\r\n")[0].decode()


def stall(server, n):
    """n connections that send half a request head and stop there."""
    conns = []
    for _ in range(n):
        c = socket.create_connection((server.host, server.port), timeout=10)
        c.sendall(b"POST /mcp HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Le")
        conns.append(c)
    return conns


def still_open(conn):
    conn.setblocking(False)
    try:
        return conn.recv(1) != b""
    except BlockingIOError:
        return True
    except ConnectionError:
        return False
    finally:
        conn.setblocking(True)


def closed_by_server(conn, deadline):
    conn.settimeout(max(0.1, deadline - time.monotonic()))
    try:
        return conn.recv(1) == b""
    except ConnectionError:
        return True
    except socket.timeout:
        return False


async def hostile_and_heavy(server):
    """Wrong and lower-case bearers, oversized bodies, 300 stalled connections beside a real
    client's first call, then 100 parallel calls; the server's peak thread count."""
    check("a wrong token is 401 with WWW-Authenticate; `authorization: bearer` in lower case is served")
    json_headers = {"content-type": "application/json",
                    "accept": "application/json, text/event-stream"}
    status, headers = post(server, {**json_headers, "Authorization": f"Bearer {'0' * len(TOKEN)}"},
                           initialize_body())
    assert status == 401 and headers.get("www-authenticate") == "Bearer", (status, headers)
    status, headers = post(server, {**json_headers, "authorization": f"bearer {TOKEN}"},
                           initialize_body())
    assert status == 200 and headers.get("mcp-session-id"), (status, headers)

    check("a Host that is not loopback is refused on a loopback server (DNS rebinding)")
    status, headers = post(server, {**json_headers, **AUTH,
                                    "Host": f"rebound.example:{server.port}"}, initialize_body())
    assert status == 403, (status, headers)

    check("a 20 MiB body is 413, its length declared or not")
    for chunked in (False, True):
        line = oversized(server, chunked)
        assert line.startswith("HTTP/1.1 413"), (chunked, line)

    check(f"{STALLED} connections stall mid-head; a real client's first call comes within 3 s")
    stalled = stall(server, STALLED)
    stalled_at = time.monotonic()
    t0 = time.monotonic()
    async with streamablehttp_client(server.url, headers=AUTH) as (r, w, _):
        async with ClientSession(r, w) as s:
            await s.initialize()
            tools = {t.name for t in (await s.list_tools()).tools}
            assert {"start", "wait", "list", "status"} <= tools, tools
            await call(s, "list", {})
            first = time.monotonic() - t0
            print(f"first call after {first:.2f}s", flush=True)
            assert first < 3, first
            # The stalled connections held their slots all along.
            assert all(still_open(c) for c in stalled), "a stalled connection was dropped early"

            check(f"{PARALLEL} parallel calls from one client complete")
            t0 = time.monotonic()
            with Peak(server) as peak:
                outcomes = await asyncio.gather(*[
                    call(s, "list", {}) if i % 2 == 0
                    else call(s, "status", {"session": f"no-such-{RUN}-{i}"}, ok=False)
                    for i in range(PARALLEL)])
            print(f"{PARALLEL} calls in {time.monotonic() - t0:.1f}s", flush=True)
            for i, o in enumerate(outcomes):
                if i % 2 == 0:
                    assert isinstance(o["sessions"], list), o
                else:
                    assert o["error"]["kind"] == "not_found", o

    check("the stalled connections are closed by the server at its header-read deadline")
    deadline = stalled_at + 30
    assert all(closed_by_server(c, deadline) for c in stalled), "a stalled connection stayed open"
    print(f"closed after {time.monotonic() - stalled_at:.1f}s", flush=True)
    for c in stalled:
        c.close()
    return peak.threads


async def stop_mid_turn(server):
    """SIGTERM while a turn runs and a `wait` on it is in flight; returns the session."""
    check("SIGTERM: the wait in flight is answered, the server exits 0 within 10 s, the turn goes on")
    checked = {}
    try:
        await stop_mid_turn_checks(server, checked)
    except BaseException:
        # The client's own teardown meets a server that is gone: not a failure once the
        # checks passed.
        if "sid" not in checked:
            raise
    return checked["sid"], checked["peaks"]


async def stop_mid_turn_checks(server, checked):
    async with streamablehttp_client(server.url, headers=AUTH) as (r, w, _):
        async with ClientSession(r, w) as s:
            await s.initialize()
            st = await call(s, "start", {"provider": "codex", "workspace_mode": "none",
                                         "prompt": f"HOLD:{HOLD} REMEMBER:heron"})
            sid = st["sessions"][0]["session_id"]
            await asyncio.to_thread(held, HOLD)
            [driver] = server.drivers()
            # Its own process group: a signal to the server's group does not reach it.
            assert os.getpgid(driver) == driver != os.getpgid(server.proc.pid), driver
            check(f"{PARALLEL} parallel waits on the running turn, all in flight at once, complete")
            with Peak(server) as peak:
                outcomes = await asyncio.gather(*[
                    call(s, "wait", {"sessions": [sid], "timeout_s": 5}) for _ in range(PARALLEL)])
            assert all(o["timed_out"] for o in outcomes), outcomes
            checked["peaks"] = [peak.threads]
            progressed = asyncio.Event()

            async def on_progress(progress, total, message):
                progressed.set()

            waiting = asyncio.create_task(s.call_tool(
                "wait", {"sessions": [sid], "timeout_s": 600}, progress_callback=on_progress))
            # In flight for sure: it has reported progress.
            await asyncio.wait_for(progressed.wait(), 60)
            t0 = time.monotonic()
            stopping = asyncio.create_task(asyncio.to_thread(server.terminate_group))
            answer = await asyncio.wait_for(waiting, 8)
            answered = time.monotonic() - t0
            took, code = await stopping
            text = answer.content[0].text
            print(f"wait answered after {answered:.1f}s: {text}", flush=True)
            print(f"server exited {code} after {took:.1f}s", flush=True)
            assert answer.isError and "stopping" in text and "turns go on" in text, text
            assert code == 0 and took < 10, (code, took)
            assert alive(driver), "the turn's driver died with the server"
            checked["sid"] = sid


async def after_restart(sid):
    check("a new server gives the turn's outcome once the stub answers it")
    stub(f"/_stub/release/{HOLD}", "POST")
    server = Server()
    try:
        async with streamablehttp_client(server.url, headers=AUTH) as (r, w, _):
            async with ClientSession(r, w) as s:
                await s.initialize()
                done = await call(s, "wait", {"sessions": [sid], "timeout_s": 240})
                assert not done["timed_out"], done
                [one] = done["sessions"]
                assert one["status"] == "success", done
                r = await call(s, "result", {"session": sid})
                assert r["status"] == "success" and "heron" in r["result"], r
                await call(s, "remove", {"session": sid})
        took, code = server.terminate_group()
        assert code == 0 and took < 10, (code, took)
        return server
    finally:
        server.kill()


def stdio_stops_on_sigterm():
    check("stdio: SIGTERM with the client's stdin still open ends the server at once, exit 0")
    p = subprocess.Popen([CAW, "mcp"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                         stderr=subprocess.DEVNULL, process_group=0)
    try:
        p.stdin.write(initialize_body() + b"\n")
        p.stdin.flush()
        assert b'"result"' in p.stdout.readline()
        p.stdin.write(b'{"jsonrpc":"2.0","method":"notifications/initialized"}\n')
        p.stdin.flush()
        t0 = time.monotonic()
        os.killpg(p.pid, signal.SIGTERM)
        code = p.wait(timeout=15)
        took = time.monotonic() - t0
        assert code == 0 and took < 10, (code, took)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()


async def main():
    t0 = time.monotonic()
    servers = [Server()]
    try:
        peaks = [await hostile_and_heavy(servers[0])]
        sid, more = await stop_mid_turn(servers[0])
        peaks += more
        servers.append(await after_restart(sid))
        stdio_stops_on_sigterm()
        check("the token is in no line the servers wrote")
        for server in servers:
            assert not any(TOKEN in line for line in server.stderr), server.stderr
        print("".join(servers[0].stderr), end="", flush=True)
        check(f"the server ran at most {MAX_THREADS} threads through {PARALLEL} parallel calls")
        assert max(peaks) <= MAX_THREADS, peaks
    finally:
        for server in servers:
            server.kill()
        try:
            stub(f"/_stub/release/{HOLD}", "POST")
        except Exception:
            pass
    print(f"mcp-http checks passed in {time.monotonic() - t0:.1f}s", flush=True)


asyncio.run(main())
