// The egress proxy (images/base/caw-box-proxy.js), run the ways caw-box runs it: through the
// broker's loader (`node -e LOADER`, the script and config as the first stdin line), from
// the environment (`node caw-box-proxy.js`, and `require`d from `node -e` as the Kubernetes
// sidecar does), and called in this process. Its upstreams are local servers on 127.0.0.1;
// a proxy under the loader also resolves every name to 127.0.0.1 (names under .test only)
// and may connect nowhere else, so no byte of these tests leaves the loopback interface.
//
// Run: node --test tests/proxy/
'use strict';
const { test, after } = require('node:test');
const assert = require('node:assert');
const fs = require('node:fs');
const http = require('node:http');
const net = require('node:net');
const path = require('node:path');
const { spawn } = require('node:child_process');

const ROOT = path.join(__dirname, '..', '..');
const PROXY = path.join(ROOT, 'images', 'base', 'caw-box-proxy.js');
const SCRIPT = fs.readFileSync(PROXY, 'utf8');

// A copy of LOADER in src/backend/plan.rs (a test below holds them equal).
const LOADER = "const c=[];const on=(d)=>{c.push(d);const b=Buffer.concat(c);const i=b.indexOf(10);if(i<0)return;process.stdin.off('data',on);process.stdin.pause();const j=JSON.parse(b.subarray(0,i).toString());c.length=0;const m={exports:{}};new Function('module','require',j.script)(m,require);m.exports(j.config,b.subarray(i+1));};process.stdin.on('data',on);";

// Loopback only, in the proxy's process: a name resolves to 127.0.0.1 if it ends in .test
// (or is localhost), to nothing else (ENOTFOUND, without asking DNS), and a connection to an
// address other than 127.0.0.1 or ::1 throws before it is made.
const LOOPBACK_ONLY = `(() => {
  const dns = require('dns');
  const net = require('net');
  dns.lookup = function (host, opts, cb) {
    if (typeof opts === 'function') { cb = opts; opts = {}; }
    opts = typeof opts === 'object' && opts ? opts : {};
    const ok = /\\.test$/i.test(host) || host === 'localhost' || host === '127.0.0.1';
    process.nextTick(() => {
      if (!ok) return cb(Object.assign(new Error('not a test name'), { code: 'ENOTFOUND' }));
      if (opts.all) return cb(null, [{ address: '127.0.0.1', family: 4 }]);
      return cb(null, '127.0.0.1', 4);
    });
  };
  const connect = net.Socket.prototype.connect;
  net.Socket.prototype.connect = function (...args) {
    const a = Array.isArray(args[0]) ? args[0][0] : args[0];
    const host = a && typeof a === 'object' ? a.host : args[1];
    if (net.isIP(host || '') && !/^(127\\.0\\.0\\.1|::1)$/.test(host)) {
      throw new Error('test guard: connection to ' + host + ' refused');
    }
    return connect.apply(this, args);
  };
})();`;

// Every stdout line of every proxy run here, for the check that none holds a path.
const allLines = [];
const children = new Set();
after(() => {
  for (const c of children) c.kill('SIGKILL');
});

// A running proxy child: its stdout lines, parsed JSON lines, and waits on both.
function watch(child) {
  children.add(child);
  const p = { child, lines: [], stderr: '', waiters: [] };
  let buf = '';
  child.stdout.on('data', (d) => {
    buf += d.toString();
    let i;
    while ((i = buf.indexOf('\n')) >= 0) {
      const line = buf.slice(0, i);
      buf = buf.slice(i + 1);
      p.lines.push(line);
      allLines.push(line);
      for (const w of [...p.waiters]) w();
    }
  });
  child.stderr.on('data', (d) => {
    p.stderr += d.toString();
  });
  child.stdin.on('error', () => {});
  p.exited = new Promise((resolve) => {
    child.on('exit', (code, signal) => {
      children.delete(child);
      for (const w of [...p.waiters]) w();
      resolve({ code, signal, at: Date.now() });
    });
  });
  p.json = () => p.lines.filter((l) => l.startsWith('{')).map((l) => JSON.parse(l));
  // The first line (a parsed JSON line, if `pred` takes objects) for which `pred` holds.
  p.waitFor = (pred, ms = 5000, what = 'a line') =>
    new Promise((resolve, reject) => {
      const check = () => {
        for (const l of p.lines) {
          let v = l;
          if (l.startsWith('{')) v = JSON.parse(l);
          if (pred(v)) {
            done();
            resolve(v);
            return true;
          }
        }
        if (child.exitCode !== null || child.signalCode !== null) {
          done();
          reject(new Error(`proxy exited before ${what}; stdout:\n${p.lines.join('\n')}\nstderr:\n${p.stderr}`));
          return true;
        }
        return false;
      };
      const timer = setTimeout(() => {
        done();
        reject(new Error(`no ${what} within ${ms} ms; stdout:\n${p.lines.join('\n')}\nstderr:\n${p.stderr}`));
      }, ms);
      const done = () => {
        clearTimeout(timer);
        p.waiters = p.waiters.filter((w) => w !== check);
      };
      if (!check()) p.waiters.push(check);
    });
  p.ready = async () => {
    const l = await p.waitFor((v) => typeof v === 'object' && v.event === 'listening', 5000, 'listening line');
    await p.waitFor((v) => v === 'caw-box-proxy ready', 5000, 'ready line');
    p.port = l.port;
    return p;
  };
  p.stop = async () => {
    if (child.exitCode === null && child.signalCode === null) child.kill('SIGTERM');
    return p.exited;
  };
  return p;
}

// Under the loader, as caw-box starts it. `exitLater` delays process.exit by 600 ms (and
// says "exit-called <code>" when it is called), to see what the proxy does once it left.
function viaLoader(config, { exitLater = false } = {}) {
  const delay = exitLater
    ? "const realExit=process.exit.bind(process);process.exit=(c)=>{process.stdout.write('exit-called '+c+'\\n');setTimeout(()=>realExit(c),600);};"
    : '';
  const child = spawn(process.execPath, ['-e', LOOPBACK_ONLY + delay + LOADER], {
    stdio: ['pipe', 'pipe', 'pipe'],
  });
  child.stdin.write(JSON.stringify({ script: SCRIPT, config }) + '\n');
  return watch(child);
}

// From the environment; `argv` [PROXY] runs it as node's main module.
function viaEnv(vars, argv = [PROXY]) {
  const env = { ...process.env };
  delete env.CAW_BOX_EGRESS_POLICY;
  delete env.CAW_BOX_ALLOW;
  const child = spawn(process.execPath, argv, {
    stdio: ['pipe', 'pipe', 'pipe'],
    env: { ...env, CAW_BOX_PROXY_PORT: '0', CAW_BOX_PROXY_HOST: '127.0.0.1', ...vars },
  });
  return watch(child);
}

// An HTTP upstream on 127.0.0.1 that keeps what it received and answers `reply`.
async function httpUpstream(reply = 'hello from upstream\n') {
  const seen = [];
  const server = http.createServer((req, res) => {
    const body = [];
    req.on('data', (c) => body.push(c));
    req.on('end', () => {
      seen.push({ method: req.method, url: req.url, headers: req.headers, body: Buffer.concat(body).toString() });
      res.writeHead(200, { 'content-type': 'text/plain', 'content-length': Buffer.byteLength(reply) });
      res.end(reply);
    });
  });
  await new Promise((r) => server.listen(0, '127.0.0.1', r));
  return { server, seen, port: server.address().port, close: () => closeServer(server) };
}

// A TCP upstream on 127.0.0.1: keeps every byte it receives; once the client ends, it sends
// `reply` and ends too.
async function tcpUpstream(reply) {
  const got = [];
  const server = net.createServer((s) => {
    s.on('data', (c) => got.push(c));
    s.on('end', () => s.end(reply));
    s.on('error', () => {});
  });
  await new Promise((r) => server.listen(0, '127.0.0.1', r));
  return { server, got: () => Buffer.concat(got), port: server.address().port, close: () => closeServer(server) };
}

function closeServer(server) {
  if (server.closeAllConnections) server.closeAllConnections();
  return new Promise((r) => server.close(() => r()));
}

// A port on 127.0.0.1 that nobody listens on (listened on once, then closed).
async function freePort() {
  const s = net.createServer();
  await new Promise((r) => s.listen(0, '127.0.0.1', r));
  const { port } = s.address();
  await new Promise((r) => s.close(r));
  return port;
}

// One plain-HTTP request through the proxy: {status, headers, body}.
function viaProxy(proxyPort, url, { method = 'GET', body, agent, headers } = {}) {
  return new Promise((resolve, reject) => {
    const u = new URL(url);
    const req = http.request(
      { host: '127.0.0.1', port: proxyPort, method, path: url, agent, headers: { host: u.host, ...headers } },
      (res) => {
        const chunks = [];
        res.on('data', (c) => chunks.push(c));
        res.on('end', () => resolve({ status: res.statusCode, headers: res.headers, body: Buffer.concat(chunks).toString() }));
      }
    );
    req.on('error', reject);
    req.end(body);
  });
}

// A raw CONNECT: writes `CONNECT target` (and `extra` in the same write), and gives back
// the socket and everything it reads, until it ends.
function rawConnect(proxyPort, target, extra = '') {
  const socket = net.connect(proxyPort, '127.0.0.1');
  const chunks = [];
  const ended = new Promise((resolve) => {
    socket.on('data', (c) => chunks.push(c));
    socket.on('close', () => resolve(Buffer.concat(chunks).toString('latin1')));
    socket.on('error', () => {});
  });
  socket.write(`CONNECT ${target} HTTP/1.1\r\nhost: ${target}\r\n\r\n${extra}`);
  const text = () => Buffer.concat(chunks).toString('latin1');
  const until = (s, ms = 2000) =>
    new Promise((resolve, reject) => {
      const t0 = Date.now();
      const tick = () => {
        if (text().includes(s)) return resolve(text());
        if (Date.now() - t0 > ms) return reject(new Error(`no ${JSON.stringify(s)} within ${ms} ms: ${JSON.stringify(text())}`));
        return setTimeout(tick, 10);
      };
      tick();
    });
  return { socket, ended, text, until };
}

function split(raw) {
  const i = raw.indexOf('\r\n\r\n');
  const [status, ...fields] = raw.slice(0, i).split('\r\n');
  const headers = {};
  for (const f of fields) {
    const j = f.indexOf(':');
    headers[f.slice(0, j).trim().toLowerCase()] = f.slice(j + 1).trim();
  }
  return { status, headers, body: raw.slice(i + 4) };
}

const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

test('the loader here is the one in src/backend/plan.rs', () => {
  const rust = fs.readFileSync(path.join(ROOT, 'src', 'backend', 'plan.rs'), 'utf8');
  const m = /const LOADER: &str = "((?:[^"\\]|\\.)*)";/.exec(rust);
  assert.ok(m, 'LOADER not found in plan.rs');
  assert.strictEqual(m[1].replace(/\\(.)/g, '$1'), LOADER);
});

test('an allowed plain-HTTP request is forwarded; the log holds no path, query or body', async () => {
  const up = await httpUpstream('hello from upstream\n');
  const p = await viaLoader({ policy: 'locked', allow: [`127.0.0.1:${up.port}`], port: 0, host: '127.0.0.1' }).ready();
  try {
    const r = await viaProxy(p.port, `http://127.0.0.1:${up.port}/secret-path?token=MARKER123`, {
      headers: { 'x-note': 'HEADERMARK456', 'proxy-authorization': 'Basic Zm9vOmJhcg==', 'proxy-connection': 'keep-alive' },
    });
    assert.strictEqual(r.status, 200);
    assert.strictEqual(r.body, 'hello from upstream\n');
    // Positive control: the upstream did get the path, the query and the header.
    assert.strictEqual(up.seen[0].url, '/secret-path?token=MARKER123');
    assert.strictEqual(up.seen[0].headers['x-note'], 'HEADERMARK456');
    assert.strictEqual(up.seen[0].headers['proxy-authorization'], undefined, 'hop-by-hop header passed');
    assert.strictEqual(up.seen[0].headers['proxy-connection'], undefined, 'hop-by-hop header passed');

    const post = await viaProxy(p.port, `http://127.0.0.1:${up.port}/upload?token=MARKER123`, {
      method: 'POST',
      body: 'BODYMARK789-twenty-six-by',
    });
    assert.strictEqual(post.status, 200);
    assert.strictEqual(up.seen[1].body, 'BODYMARK789-twenty-six-by');

    const target = `127.0.0.1:${up.port}`;
    const closes = await p.waitFor((v) => typeof v === 'object' && v.closed && v.method === 'POST', 3000, 'close line of the POST');
    const get = p.json().find((v) => v.closed && v.method === 'GET');
    assert.deepStrictEqual({ up: get.up, down: get.down, target: get.target }, { up: 0, down: 20, target });
    assert.deepStrictEqual({ up: closes.up, down: closes.down }, { up: 25, down: 20 });
    const decisions = p.json().filter((v) => v.decision === 'allowed');
    assert.strictEqual(decisions.length, 2);
    for (const d of decisions) {
      assert.strictEqual(d.target, target);
      assert.strictEqual(d.from, '127.0.0.1');
      assert.strictEqual(typeof d.conn, 'number');
      assert.strictEqual(d.proxy, 'caw-box');
      assert.strictEqual(typeof d.ts, 'number');
    }
    for (const l of p.lines) {
      for (const mark of ['MARKER123', 'secret-path', 'upload', 'HEADERMARK456', 'BODYMARK789', 'Zm9v']) {
        assert.ok(!l.includes(mark), `log line holds ${mark}: ${l}`);
      }
    }
  } finally {
    await p.stop();
    await up.close();
  }
});

test('keep-alive: each request on one client connection is decided on its own', async () => {
  const up = await httpUpstream('ok\n');
  const p = await viaLoader({ policy: 'balanced', allow: [`127.0.0.1:${up.port}`], port: 0, host: '127.0.0.1' }).ready();
  const agent = new http.Agent({ keepAlive: true, maxSockets: 1 });
  try {
    const a = await viaProxy(p.port, `http://127.0.0.1:${up.port}/one`, { agent });
    const b = await viaProxy(p.port, 'http://decoy/two', { agent });
    const c = await viaProxy(p.port, `http://127.0.0.1:${up.port}/three`, { agent });
    assert.deepStrictEqual([a.status, b.status, c.status], [200, 403, 200]);
    await p.waitFor((v) => typeof v === 'object' && v.closed && p.json().filter((x) => x.closed).length === 2, 3000, 'two close lines');
    const decisions = p.json().filter((v) => v.decision === 'allowed' || v.decision === 'refused');
    assert.deepStrictEqual(decisions.map((d) => d.decision), ['allowed', 'refused', 'allowed']);
    assert.deepStrictEqual(decisions.map((d) => d.target), [`127.0.0.1:${up.port}`, 'decoy:80', `127.0.0.1:${up.port}`]);
    assert.strictEqual(new Set(decisions.map((d) => d.conn)).size, 1, 'not one connection');
  } finally {
    agent.destroy();
    await p.stop();
    await up.close();
  }
});

test('a refused plain-HTTP host gets a 403 that says what to do', async () => {
  for (const [policy, scope] of [
    ['balanced', "(only the model's API and common package and source hosts are reachable)"],
    ['locked', "(only the model's API is reachable)"],
  ]) {
    const p = await viaLoader({ policy, allow: ['example.test'], port: 0, host: '127.0.0.1' }).ready();
    try {
      const r = await viaProxy(p.port, 'http://Decoy/anything?x=1');
      assert.strictEqual(r.status, 403);
      assert.match(r.headers['content-type'], /^text\/plain/);
      assert.strictEqual(Number(r.headers['content-length']), Buffer.byteLength(r.body));
      assert.strictEqual(r.headers['x-caw-box-egress'], 'refused');
      assert.ok(r.body.includes(`egress to decoy:80 is refused by the egress policy "${policy}" ${scope}`), r.body);
      assert.ok(r.body.includes('--allow-host decoy:80'), r.body);
      assert.ok(r.body.includes('--egress open'), r.body);
      assert.ok(r.body.trim().split('\n').length <= 2, r.body);
      const d = await p.waitFor((v) => typeof v === 'object' && v.decision === 'refused', 2000, 'refused line');
      assert.deepStrictEqual(
        { target: d.target, method: d.method, from: d.from, conn: typeof d.conn },
        { target: 'decoy:80', method: 'GET', from: '127.0.0.1', conn: 'number' }
      );
      assert.ok(!p.json().some((v) => v.closed), 'a refusal has no close line');
    } finally {
      await p.stop();
    }
  }
});

test('a refused CONNECT gets its 403 and body within 1 s, then the socket ends', async () => {
  const p = await viaLoader({ policy: 'balanced', allow: [], port: 0, host: '127.0.0.1' }).ready();
  try {
    const t0 = Date.now();
    const c = rawConnect(p.port, 'decoy:443');
    const raw = await Promise.race([c.ended, sleep(1000).then(() => null)]);
    assert.ok(raw !== null, `no end within 1 s: ${JSON.stringify(c.text())}`);
    assert.ok(Date.now() - t0 < 1000);
    const r = split(raw);
    assert.strictEqual(r.status, 'HTTP/1.1 403 Forbidden');
    assert.strictEqual(r.headers['content-type'], 'text/plain');
    assert.strictEqual(r.headers['x-caw-box-egress'], 'refused');
    assert.strictEqual(Number(r.headers['content-length']), Buffer.byteLength(r.body));
    assert.ok(r.body.includes('egress to decoy:443 is refused by the egress policy "balanced"'), r.body);
    assert.ok(r.body.includes('--allow-host decoy:443'), r.body);
    const d = await p.waitFor((v) => typeof v === 'object' && v.decision === 'refused', 2000, 'refused line');
    assert.deepStrictEqual([d.target, d.method], ['decoy:443', 'CONNECT']);
  } finally {
    await p.stop();
  }
});

test('an allowed CONNECT tunnels bytes both ways, and its close line counts them', async () => {
  const reply = 'R'.repeat(3000) + '-the-end';
  const up = await tcpUpstream(reply);
  const p = await viaLoader({ policy: 'locked', allow: [`127.0.0.1:${up.port}`], port: 0, host: '127.0.0.1' }).ready();
  try {
    const first = 'sent-with-the-connect:'; // arrives as the CONNECT's `head`
    const second = 'x'.repeat(70000);
    const c = rawConnect(p.port, `127.0.0.1:${up.port}`, first);
    await c.until('\r\n\r\n');
    assert.ok(c.text().startsWith('HTTP/1.1 200 Connection Established\r\n\r\n'), c.text());
    c.socket.write(second);
    c.socket.end();
    const raw = await c.ended;
    assert.strictEqual(split(raw).body, reply);
    assert.strictEqual(up.got().toString(), first + second);
    const closed = await p.waitFor((v) => typeof v === 'object' && v.closed === true, 3000, 'close line');
    const allowed = p.json().find((v) => v.decision === 'allowed');
    assert.deepStrictEqual(
      { target: closed.target, conn: closed.conn, from: closed.from, up: closed.up, down: closed.down },
      { target: `127.0.0.1:${up.port}`, conn: allowed.conn, from: '127.0.0.1', up: first.length + second.length, down: reply.length }
    );
    assert.strictEqual(allowed.method, 'CONNECT');
  } finally {
    await p.stop();
    await up.close();
  }
});

test('policy open admits any host and port', async () => {
  const up = await httpUpstream('open\n');
  const tcp = await tcpUpstream('pong');
  const p = await viaLoader({ policy: 'open', port: 0, host: '127.0.0.1' }).ready();
  try {
    const r = await viaProxy(p.port, `http://127.0.0.1:${up.port}/x`);
    assert.strictEqual(r.status, 200);
    assert.strictEqual(r.body, 'open\n');
    const c = rawConnect(p.port, `127.0.0.1:${tcp.port}`);
    await c.until('\r\n\r\n');
    c.socket.end('ping');
    assert.strictEqual(split(await c.ended).body, 'pong');
    const listening = p.json().find((v) => v.event === 'listening');
    assert.deepStrictEqual([listening.policy, listening.allow], ['open', []]);
    assert.deepStrictEqual(
      p.json().filter((v) => v.decision === 'allowed').map((v) => v.method),
      ['GET', 'CONNECT']
    );
    // The loopback guard holds here too: a real name is admitted, and goes nowhere.
    const g = await viaProxy(p.port, 'http://example.com/');
    assert.strictEqual(g.status, 502);
    const f = await p.waitFor((v) => typeof v === 'object' && v.decision === 'failed', 2000, 'failed line');
    assert.deepStrictEqual([f.target, f.error], ['example.com:80', 'ENOTFOUND']);
  } finally {
    await p.stop();
    await up.close();
    await tcp.close();
  }
});

test('wildcard rules admit subdomains only, in any case; rule ports hold', async () => {
  const up = await httpUpstream('wild\n');
  const other = await freePort();
  const p = await viaLoader({
    policy: 'balanced',
    allow: [`*.Example.test:${up.port}`, `[::1]:${up.port}`, ' Exact.test '],
    port: 0,
    host: '127.0.0.1',
  }).ready();
  try {
    const status = async (url) => (await viaProxy(p.port, url)).status;
    assert.strictEqual(await status(`http://api.example.test:${up.port}/`), 200);
    assert.strictEqual(await status(`http://A.B.EXAMPLE.TEST:${up.port}/`), 200);
    assert.strictEqual(await status(`http://example.test:${up.port}/`), 403, 'the apex matched *.');
    assert.strictEqual(await status(`http://badexample.test:${up.port}/`), 403);
    assert.strictEqual(await status(`http://api.example.test:${other}/`), 403, 'another port matched');
    assert.strictEqual(await status(`http://exact.test:${up.port}/`), 200, 'a rule without port');
    const listening = p.json().find((v) => v.event === 'listening');
    assert.deepStrictEqual(listening.allow, [`*.example.test:${up.port}`, `[::1]:${up.port}`, 'exact.test']);
    // IPv6 brackets: decided as ::1 (whether ::1 answers here or not).
    const c = rawConnect(p.port, `[::1]:${up.port}`);
    await c.until('HTTP/1.1 ');
    c.socket.destroy();
    const d = await p.waitFor((v) => typeof v === 'object' && v.method === 'CONNECT' && v.decision, 2000, 'CONNECT decision');
    assert.deepStrictEqual([d.decision, d.target], ['allowed', `[::1]:${up.port}`]);
  } finally {
    await p.stop();
    await up.close();
  }
});

test('an upstream that cannot be reached: 502, a failed line with its code, and a close line', async () => {
  const port = await freePort();
  const p = await viaLoader({ policy: 'locked', allow: [`127.0.0.1:${port}`, 'nowhere.invalid'], port: 0, host: '127.0.0.1' }).ready();
  try {
    const r = await viaProxy(p.port, `http://127.0.0.1:${port}/secret-path`);
    assert.strictEqual(r.status, 502);
    assert.ok(r.body.includes(`127.0.0.1:${port}`) && r.body.includes('ECONNREFUSED'), r.body);
    const c = rawConnect(p.port, `127.0.0.1:${port}`);
    const raw = await c.ended;
    assert.ok(raw.startsWith('HTTP/1.1 502 Bad Gateway'), raw);
    // A name that does not resolve (the guard answers ENOTFOUND; no DNS is asked).
    const n = await viaProxy(p.port, 'http://nowhere.invalid/');
    assert.strictEqual(n.status, 502);
    await p.waitFor((v) => typeof v === 'object' && p.json().filter((x) => x.closed).length === 3, 3000, 'three close lines');
    const failed = p.json().filter((v) => v.decision === 'failed');
    assert.deepStrictEqual(failed.map((f) => [f.method, f.error]), [['GET', 'ECONNREFUSED'], ['CONNECT', 'ECONNREFUSED'], ['GET', 'ENOTFOUND']]);
    for (const f of failed) assert.deepStrictEqual(Object.keys(f).sort(), ['conn', 'decision', 'error', 'from', 'method', 'proxy', 'target', 'ts']);
    assert.ok(!p.lines.some((l) => l.includes('secret-path')));
  } finally {
    await p.stop();
  }
});

test('a request that is not for a proxy gets a 400 that says so', async () => {
  const p = await viaLoader({ policy: 'open', port: 0, host: '127.0.0.1' }).ready();
  try {
    const r = await new Promise((resolve, reject) => {
      http.get({ host: '127.0.0.1', port: p.port, path: '/just-a-path' }, (res) => {
        let body = '';
        res.on('data', (c) => { body += c; });
        res.on('end', () => resolve({ status: res.statusCode, body }));
      }).on('error', reject);
    });
    assert.strictEqual(r.status, 400);
    assert.match(r.body, /HTTP proxy/);
    const bad = rawConnect(p.port, 'no-port-here');
    assert.match(await bad.ended, /^HTTP\/1\.1 400 Bad Request/);
    // No more in the host than a name: nothing of a path reaches the log that way either.
    const smuggled = rawConnect(p.port, 'decoy.test/secret-path:443');
    assert.match(await smuggled.ended, /^HTTP\/1\.1 400 Bad Request/);
    const star = await viaProxy(p.port, 'http://a*secret-path.test/');
    assert.strictEqual(star.status, 400);
    assert.ok(!p.json().some((v) => v.decision === 'allowed' || v.decision === 'refused'));
  } finally {
    await p.stop();
  }
});

test('from the environment, as the main module: the policy, the rules, the old listening line', async () => {
  const up = await httpUpstream('env\n');
  const p = await viaEnv({ CAW_BOX_EGRESS_POLICY: 'balanced', CAW_BOX_ALLOW: ` 127.0.0.1:${up.port} ,*.example.test,` }).ready();
  try {
    const l = p.json().find((v) => v.event === 'listening');
    assert.deepStrictEqual(
      [l.decision, l.policy, l.allow, l.shared, l.host],
      ['listening', 'balanced', [`127.0.0.1:${up.port}`, '*.example.test'], false, '127.0.0.1']
    );
    assert.strictEqual((await viaProxy(p.port, `http://127.0.0.1:${up.port}/x`)).status, 200);
    const r = await viaProxy(p.port, 'http://decoy:8080/');
    assert.strictEqual(r.status, 403);
    assert.ok(r.body.includes('"balanced"') && r.body.includes('--allow-host decoy:8080'), r.body);
    // SIGTERM: exit 0.
    const end = await p.stop();
    assert.deepStrictEqual([end.code, end.signal], [0, null]);
  } finally {
    await p.stop();
    await up.close();
  }
});

test('from the environment without a policy (older callers): locked', async () => {
  const p = await viaEnv({ CAW_BOX_ALLOW: '' }).ready();
  try {
    assert.strictEqual(p.json().find((v) => v.event === 'listening').policy, 'locked');
    const r = await viaProxy(p.port, 'http://decoy/');
    assert.strictEqual(r.status, 403);
    assert.ok(r.body.includes(`egress policy "locked" (only the model's API is reachable)`), r.body);
  } finally {
    await p.stop();
  }
});

test('from the environment, required from node -e (the Kubernetes sidecar)', async () => {
  const script = `setInterval(() => {}, 1000); require(${JSON.stringify(PROXY)});`;
  const p = await viaEnv({ CAW_BOX_ALLOW: 'a.test', CAW_BOX_EGRESS_POLICY: 'locked' }, ['-e', script]).ready();
  try {
    assert.deepStrictEqual(p.json().find((v) => v.event === 'listening').allow, ['a.test']);
    const end = await p.stop();
    assert.strictEqual(end.code, 0);
  } finally {
    await p.stop();
  }
});

test('an unknown policy: no proxy, exit 2', async () => {
  const p = viaLoader({ policy: 'wide-open', port: 0, host: '127.0.0.1' });
  const end = await p.exited;
  assert.strictEqual(end.code, 2);
  assert.match(p.stderr, /unknown egress policy "wide-open"/);
});

test('called in this process: the module gives back its server', async () => {
  const proxy = require(PROXY);
  assert.strictEqual(typeof proxy, 'function');
  // Its log goes to this process's stdout; keep it out of the test report.
  const write = process.stdout.write;
  const logged = [];
  process.stdout.write = (s, ...rest) => (String(s).includes('caw-box') ? (logged.push(String(s)), true) : write.call(process.stdout, s, ...rest));
  let server;
  try {
    server = proxy({ policy: 'locked', allow: ['a.test'], port: 0, host: '127.0.0.1' });
    await new Promise((r) => (server.listening ? r() : server.once('listening', r)));
    const r = await viaProxy(server.address().port, 'http://decoy/');
    assert.strictEqual(r.status, 403);
    assert.ok(logged.some((l) => l.includes('"decision":"refused"')));
    assert.ok(logged.includes('caw-box-proxy ready\n'));
  } finally {
    process.stdout.write = write;
    if (server) {
      server.closeAllConnections();
      await new Promise((r) => server.close(r));
    }
    process.removeAllListeners('SIGTERM');
    process.removeAllListeners('SIGINT');
  }
});

test('shared: leases are answered, released, and the proxy leaves when idle', async () => {
  const p = await viaLoader({ policy: 'locked', allow: [], port: 0, host: '127.0.0.1', shared: true, idle_ms: 300 }).ready();
  p.child.stdin.write('lease turn-1 5000\nlease turn-2 200\n');
  await p.waitFor((v) => v === 'caw-box-proxy ok turn-1', 2000, 'ok turn-1');
  await p.waitFor((v) => v === 'caw-box-proxy ok turn-2', 2000, 'ok turn-2');
  // turn-2 expires by itself; turn-1 holds the proxy until it is released.
  await sleep(1500);
  assert.strictEqual(p.child.exitCode, null, 'left while a lease held');
  const released = Date.now();
  p.child.stdin.write('release turn-1\n');
  const end = await Promise.race([p.exited, sleep(4000).then(() => null)]);
  assert.ok(end, 'still running 4 s after the last lease');
  assert.strictEqual(end.code, 0);
  assert.ok(end.at - released >= 300, 'left before idle_ms');
});

test('shared: an open client connection holds it; it leaves after the connection', async () => {
  const p = await viaLoader({ policy: 'locked', allow: [], port: 0, host: '127.0.0.1', shared: true, idle_ms: 300 }).ready();
  const socket = net.connect(p.port, '127.0.0.1');
  socket.on('error', () => {});
  await new Promise((r) => socket.once('connect', r));
  await sleep(1800);
  assert.strictEqual(p.child.exitCode, null, 'left with a client connected');
  socket.destroy();
  const end = await Promise.race([p.exited, sleep(4000).then(() => null)]);
  assert.ok(end, 'still running 4 s after the connection closed');
  assert.strictEqual(end.code, 0);
});

test('shared: once it decided to leave, it answers no lease', async () => {
  const p = await viaLoader(
    { policy: 'locked', allow: [], port: 0, host: '127.0.0.1', shared: true, idle_ms: 300 },
    { exitLater: true }
  ).ready();
  p.child.stdin.write('lease early 200\n');
  await p.waitFor((v) => v === 'caw-box-proxy ok early', 2000, 'ok early');
  await p.waitFor((v) => v === 'exit-called 0', 5000, 'the decision to leave');
  p.child.stdin.write('lease late 60000\n');
  const end = await p.exited;
  assert.strictEqual(end.code, 0);
  assert.ok(!p.lines.includes('caw-box-proxy ok late'), 'a lease answered after leaving');
});

test('not shared: never idles out', async () => {
  const p = await viaLoader({ policy: 'locked', allow: [], port: 0, host: '127.0.0.1', idle_ms: 300 }).ready();
  try {
    p.child.stdin.write('lease x 100\n');
    await sleep(2300);
    assert.strictEqual(p.child.exitCode, null);
    assert.ok(!p.lines.includes('caw-box-proxy ok x'), 'a proxy that is not shared answered a lease');
  } finally {
    const end = await p.stop();
    assert.strictEqual(end.code, 0);
  }
});

test('egress-balanced.txt: well-formed rules, and the proxy admits them on ports 80 and 443 only', async () => {
  const text = fs.readFileSync(path.join(ROOT, 'images', 'base', 'egress-balanced.txt'), 'utf8');
  const hosts = text.split('\n').map((l) => l.replace(/#.*/, '').trim()).filter(Boolean);
  assert.ok(hosts.length >= 25 && hosts.length <= 45, `${hosts.length} entries`);
  assert.strictEqual(new Set(hosts).size, hosts.length, 'an entry twice');
  for (const h of hosts) assert.match(h, /^(\*\.)?[a-z0-9-]+(\.[a-z0-9-]+)+$/, `not a rule: ${h}`);
  for (const h of ['registry.npmjs.org', 'pypi.org', 'files.pythonhosted.org', 'crates.io', 'static.crates.io',
    'index.crates.io', 'proxy.golang.org', 'sum.golang.org', 'rubygems.org', 'repo.maven.apache.org',
    'deb.debian.org', 'security.debian.org', 'archive.ubuntu.com', 'github.com', 'codeload.github.com',
    'objects.githubusercontent.com', 'raw.githubusercontent.com', 'gitlab.com']) {
    assert.ok(hosts.includes(h), `${h} missing`);
  }
  // Every entry follows a comment (its source) within its group of lines.
  const blocks = text.split(/\n\s*\n/);
  for (const b of blocks) {
    if (b.split('\n').some((l) => l.trim() && !l.startsWith('#'))) assert.match(b, /^#/m, `no comment: ${b}`);
  }
  // As caw-box hands them over: host:80 and host:443. The guard keeps every name off DNS,
  // so an admitted CONNECT fails there (ENOTFOUND) after its decision.
  const p = await viaLoader({
    policy: 'balanced',
    allow: hosts.flatMap((h) => [`${h}:80`, `${h}:443`]),
    port: 0,
    host: '127.0.0.1',
  }).ready();
  try {
    for (const [target, decision] of [['github.com:443', 'allowed'], ['GitHub.com:80', 'allowed'],
      ['github.com:22', 'refused'], ['evil-github.com:443', 'refused'], ['gist.github.com:443', 'refused'],
      ['storage.googleapis.com:443', 'refused']]) {
      const c = rawConnect(p.port, target);
      const raw = await c.ended;
      assert.match(raw, decision === 'allowed' ? /^HTTP\/1\.1 502 / : /^HTTP\/1\.1 403 /, `${target}: ${raw}`);
    }
    const decided = p.json().filter((v) => v.decision === 'allowed' || v.decision === 'refused');
    assert.deepStrictEqual(decided.map((d) => d.decision), ['allowed', 'allowed', 'refused', 'refused', 'refused', 'refused']);
  } finally {
    await p.stop();
  }
});

test('no log line of any run here held a path, query string, header or body', () => {
  assert.ok(allLines.length > 20);
  for (const l of allLines) {
    for (const mark of ['MARKER123', 'secret-path', 'HEADERMARK456', 'BODYMARK789', 'anything', 'just-a-path']) {
      assert.ok(!l.includes(mark), `log line holds ${mark}: ${l}`);
    }
  }
});
