// caw-box's egress proxy: the only way out of an agent container under an egress policy
// (`--egress balanced|locked|open`, `--allow-host`). Admits CONNECT (https and anything
// else tunnelled) and plain-HTTP requests to the hosts its policy lets through, refuses
// everything else at once with a 403 whose body says what happened and what the person
// running caw-box can do about it. Not a general-purpose proxy.
//
// Policies: `locked` and `balanced` admit the `allow` rules only (the caller puts the model's
// API, the --allow-host hosts and, for `balanced`, the hosts of egress-balanced.txt in them);
// the policy names the refusal's words. `open` admits every host and port.
// Rules: `host` (any port), `host:port`, `*.example.com` (its subdomains at any depth, never
// example.com itself: add that as a rule of its own). Hosts compare case-insensitively, with
// IPv6 brackets and a trailing dot removed.
//
// Two ways to run, the same code:
// - `node caw-box-proxy.js` (or `require`d from `node -e`): configured by the environment,
//   CAW_BOX_EGRESS_POLICY (balanced|locked|open; unset: locked, as before policies existed),
//   CAW_BOX_ALLOW (comma-separated rules), CAW_BOX_PROXY_PORT (3128), CAW_BOX_PROXY_HOST
//   (0.0.0.0; 127.0.0.1 in a Kubernetes turn pod, beside the agent).
// - shipped on stdin to the loader (session/broker's LOADER), which calls
//   `module.exports(config, rest)` with config {policy, allow: [rules], port, host, shared,
//   idle_ms}. A shared proxy (`"shared": true`, reused by several turns) holds leases, one
//   command a line on stdin:
//     lease <id> <ttl-ms>   (again before the ttl ends; answered "caw-box-proxy ok <id>")
//     release <id>
//   With no lease and no client connection left for `idle_ms` (300000), it exits 0; once it
//   decided to, it answers no lease (the turn then starts a new proxy). Leases expire after
//   their ttl. A proxy that is not shared never idles out.
// Either way it prints the plain line "caw-box-proxy ready" once it listens, and exits 0 on
// SIGTERM or SIGINT.
//
// Log: one JSON line on stdout per event, each with {"proxy":"caw-box","ts":<ms>}, and never
// a path, query string, header or body: only host:port, method, the client's address, byte
// counts and error codes. `conn` numbers the client's TCP connection (several plain-HTTP
// requests may share one; a CONNECT has one to itself).
//   {"event":"listening","decision":"listening","policy","allow":[rules],"host","port","shared"}
//   {"decision":"allowed"|"refused","target":"host:port","method","from","conn"}
//   {"decision":"failed","target","method","from","conn","error":"ECONNREFUSED"}   (502 sent)
//   {"closed":true,"conn","from","target","method","up","down"}
// Every "allowed" line has exactly one "closed" line, once its request or tunnel is over
// (also after "failed"). `up` counts bytes from the client to the upstream, `down` from the
// upstream to the client: for a tunnel every byte through it (with what the client sent
// along with its CONNECT); for a plain-HTTP request the request and response bodies as they
// travel (headers are not counted; a chunked body counts its data, not its framing).
'use strict';
module.exports = function proxy(config, rest) {
  const http = require('http');
  const net = require('net');
  config = config || {};
  const SCOPE = {
    balanced: "(only the model's API and common package and source hosts are reachable)",
    locked: "(only the model's API is reachable)",
    open: '',
  };
  const policy = config.policy == null || config.policy === '' ? 'locked' : String(config.policy);
  if (!Object.prototype.hasOwnProperty.call(SCOPE, policy)) {
    process.stderr.write(
      `caw-box proxy: unknown egress policy ${JSON.stringify(policy)} (balanced, locked or open)\n`
    );
    process.exit(2);
  }
  const list = Array.isArray(config.allow) ? config.allow : String(config.allow || '').split(',');
  const rules = list.map((s) => String(s).trim().toLowerCase()).filter(Boolean).map(rule);
  const shared = config.shared === true;
  const connectMs = Number(config.connect_ms) || 30000;
  const HOP = ['proxy-authorization', 'proxy-connection', 'connection', 'keep-alive'];
  const agent = new http.Agent({ keepAlive: true });
  const leases = new Map();
  let leaving = false;
  let idleSince = Date.now();
  let seq = 0;
  let open = 0;

  // `host[:port]` as CAW_BOX_ALLOW has always been read (tests/fuzz.rs mirrors this).
  function rule(s) {
    const i = s.lastIndexOf(':');
    return i > 0 && /^\d+$/.test(s.slice(i + 1))
      ? { host: bare(s.slice(0, i)), port: Number(s.slice(i + 1)) }
      : { host: bare(s), port: null };
  }

  function bare(host) {
    return String(host || '').toLowerCase().replace(/^\[(.*)\]$/, '$1').replace(/\.$/, '');
  }

  function admits(host, port) {
    if (policy === 'open') return true;
    return rules.some(
      (r) =>
        (r.host === host
          || (r.host.length > 2 && r.host.startsWith('*.') && host.endsWith(r.host.slice(1))))
        && (r.port === null || r.port === port)
    );
  }

  // A host name or an IP address, nothing a request could hide more in.
  function hostLike(host) {
    return /^[a-z0-9_-]+(\.[a-z0-9_-]+)*$/.test(host) || net.isIP(host) !== 0;
  }

  function hostPort(host, port) {
    return `${host.includes(':') ? `[${host}]` : host}:${port}`;
  }

  function log(fields) {
    process.stdout.write(JSON.stringify({ proxy: 'caw-box', ts: Date.now(), ...fields }) + '\n');
  }

  // An error's code only: a message may name more than the host (a path, a header).
  function code(e) {
    return e && typeof e.code === 'string' && /^[A-Z0-9_]{1,40}$/.test(e.code) ? e.code : 'ERROR';
  }

  function refusal(target) {
    return (
      `caw-box: egress to ${target} is refused by the egress policy "${policy}" ${SCOPE[policy]}.\n`
      + `To allow it, the person running caw-box can add --allow-host ${target}, `
      + 'or choose --egress open.\n'
    );
  }

  function plain(res, status, body, extra) {
    res.writeHead(status, {
      'content-type': 'text/plain',
      'content-length': Buffer.byteLength(body),
      ...extra,
    });
    res.end(body);
  }

  // A raw answer on a CONNECT's socket, which is then ended (and dropped soon after, should
  // the client never close its side).
  function rawEnd(socket, status, body, extra) {
    const head = [`HTTP/1.1 ${status}`, 'content-type: text/plain',
      `content-length: ${Buffer.byteLength(body)}`, ...(extra || []), 'connection: close'];
    socket.end(head.join('\r\n') + '\r\n\r\n' + body);
    setTimeout(() => socket.destroy(), 2000).unref();
  }

  // A new TCP connection to `host:port` that gives up after connectMs.
  function dial(host, port) {
    const s = net.connect({ host, port });
    timeConnect(s, () => s.destroy(Object.assign(new Error('connect timeout'), { code: 'ETIMEDOUT' })));
    return s;
  }

  function timeConnect(s, onTimeout) {
    if (!s.connecting) return;
    const t = setTimeout(onTimeout, connectMs);
    s.once('connect', () => clearTimeout(t));
    s.once('close', () => clearTimeout(t));
  }

  const server = http.createServer((req, res) => {
    const { id: conn, from } = req.socket.cawBox || {};
    let url;
    try {
      url = new URL(req.url);
    } catch {
      url = null;
    }
    if (!url || (url.protocol !== 'http:' && url.protocol !== 'https:')) {
      req.resume();
      plain(res, 400, 'caw-box proxy: this is an HTTP proxy; use it as one (HTTP_PROXY / '
        + 'HTTPS_PROXY): an absolute http:// URL in the request line, or CONNECT host:port.\n');
      return;
    }
    if (url.protocol === 'https:') {
      req.resume();
      plain(res, 400, 'caw-box proxy: https:// URLs go through CONNECT host:443 (HTTPS_PROXY), '
        + 'not as a plain request.\n');
      return;
    }
    const host = bare(url.hostname);
    const port = Number(url.port) || 80;
    if (!hostLike(host)) {
      req.resume();
      plain(res, 400, 'caw-box proxy: the URL names no host.\n');
      return;
    }
    const target = hostPort(host, port);
    const method = req.method;
    if (!admits(host, port)) {
      log({ decision: 'refused', target, method, from, conn });
      req.resume();
      plain(res, 403, refusal(target), { 'x-caw-box-egress': 'refused' });
      return;
    }
    log({ decision: 'allowed', target, method, from, conn });
    let up = 0;
    let down = 0;
    let done = false;
    const finish = () => {
      if (done) return;
      done = true;
      log({ closed: true, conn, from, target, method, up, down });
    };
    const headers = { ...req.headers };
    for (const h of HOP) delete headers[h];
    const upstream = http.request(
      { host, port, method, path: url.pathname + url.search, headers, agent },
      (upRes) => {
        const back = { ...upRes.headers };
        for (const h of HOP) delete back[h];
        res.writeHead(upRes.statusCode, upRes.statusMessage, back);
        upRes.on('data', (c) => {
          down += c.length;
        });
        upRes.on('error', () => res.destroy());
        upRes.pipe(res);
      }
    );
    upstream.on('socket', (s) => timeConnect(s, () => upstream.destroy(
      Object.assign(new Error('connect timeout'), { code: 'ETIMEDOUT' })
    )));
    upstream.on('error', (e) => {
      if (res.headersSent) {
        res.destroy();
        return;
      }
      log({ decision: 'failed', target, method, from, conn, error: code(e) });
      req.resume();
      plain(res, 502, `caw-box proxy: could not reach ${target} (${code(e)}).\n`);
    });
    res.on('close', () => {
      if (!res.writableFinished) upstream.destroy();
      finish();
    });
    req.on('data', (c) => {
      up += c.length;
    });
    req.pipe(upstream);
  });

  server.on('connection', (socket) => {
    const from = String(socket.remoteAddress || '').replace(/^::ffff:/i, '');
    socket.cawBox = { id: ++seq, from };
    open += 1;
    socket.on('error', () => {});
    socket.on('close', () => {
      open -= 1;
      if (open === 0) idleSince = Date.now();
    });
  });

  server.on('connect', (req, socket, head) => {
    const { id: conn, from } = socket.cawBox || {};
    const m = /^(.+):(\d{1,5})$/.exec(req.url || '');
    const port = m ? Number(m[2]) : 0;
    const host = m ? bare(m[1]) : '';
    if (!m || port < 1 || port > 65535 || !hostLike(host)) {
      rawEnd(socket, '400 Bad Request', 'caw-box proxy: CONNECT needs host:port.\n');
      return;
    }
    const target = hostPort(host, port);
    if (!admits(host, port)) {
      log({ decision: 'refused', target, method: 'CONNECT', from, conn });
      rawEnd(socket, '403 Forbidden', refusal(target), ['x-caw-box-egress: refused']);
      return;
    }
    log({ decision: 'allowed', target, method: 'CONNECT', from, conn });
    let up = 0;
    let down = 0;
    let closed = 0;
    const finish = () => {
      closed += 1;
      if (closed === 2) log({ closed: true, conn, from, target, method: 'CONNECT', up, down });
    };
    let established = false;
    const upstream = dial(host, port);
    upstream.once('connect', () => {
      established = true;
      socket.write('HTTP/1.1 200 Connection Established\r\n\r\n');
      if (head && head.length) {
        up += head.length;
        upstream.write(head);
      }
      socket.on('data', (c) => {
        up += c.length;
      });
      upstream.on('data', (c) => {
        down += c.length;
      });
      upstream.pipe(socket);
      socket.pipe(upstream);
    });
    upstream.on('error', (e) => {
      if (established) return;
      log({ decision: 'failed', target, method: 'CONNECT', from, conn, error: code(e) });
      rawEnd(socket, '502 Bad Gateway', `caw-box proxy: could not reach ${target} (${code(e)}).\n`);
    });
    // The upstream's end reaches the client through the pipe (after what it still has to
    // read); a reset cuts the client off. The client gone, the upstream goes too.
    upstream.on('close', (hadError) => {
      if (hadError && established) socket.destroy();
      finish();
    });
    socket.on('close', () => {
      upstream.destroy();
      finish();
    });
  });

  function command(line) {
    const [verb, id, ttl] = line.trim().split(/\s+/);
    if (verb === 'lease' && id && !leaving) {
      leases.set(id, Date.now() + (Number(ttl) || 60000));
      process.stdout.write(`caw-box-proxy ok ${id}\n`);
    } else if (verb === 'release' && id) {
      unlease(id);
    }
  }

  function unlease(id) {
    if (!leases.delete(id)) return;
    if (leases.size === 0) idleSince = Date.now();
  }

  if (shared) {
    let buf = rest && rest.length ? rest.toString() : '';
    const take = () => {
      let i;
      while ((i = buf.indexOf('\n')) >= 0) {
        command(buf.slice(0, i));
        buf = buf.slice(i + 1);
      }
    };
    process.stdin.on('data', (d) => {
      buf += d.toString();
      take();
    });
    process.stdin.resume();
    take();
    const idleMs = Number(config.idle_ms) || 300000;
    setInterval(() => {
      const now = Date.now();
      for (const [id, until] of leases) if (until < now) unlease(id);
      if (!leaving && leases.size === 0 && open === 0 && now - idleSince >= idleMs) {
        leaving = true;
        server.close(() => process.exit(0));
        setTimeout(() => process.exit(0), 2000);
      }
    }, 1000).unref();
  }

  process.stdout.on('error', () => {});
  server.on('error', (e) => {
    process.stderr.write(`caw-box proxy: cannot listen (${code(e)})\n`);
    process.exit(1);
  });
  const port = config.port == null || config.port === '' ? 3128 : Number(config.port);
  server.listen(port, config.host || '0.0.0.0', () => {
    const where = server.address();
    log({
      event: 'listening',
      decision: 'listening',
      policy,
      allow: rules.map((r) => (r.port === null ? r.host : hostPort(r.host, r.port))),
      host: where.address,
      port: where.port,
      shared,
    });
    process.stdout.write('caw-box-proxy ready\n');
  });
  for (const sig of ['SIGTERM', 'SIGINT']) process.on(sig, () => process.exit(0));
  return server;
};

// Run from the environment: `node caw-box-proxy.js`, or `require`d by a `node -e` script (the
// Kubernetes sidecar's). The loader hands over a module of its own, without a filename.
if (require.main === module || (require.main === undefined && typeof module.filename === 'string')) {
  const env = process.env;
  module.exports({
    policy: env.CAW_BOX_EGRESS_POLICY || 'locked',
    allow: (env.CAW_BOX_ALLOW || '').split(','),
    port: env.CAW_BOX_PROXY_PORT || 3128,
    host: env.CAW_BOX_PROXY_HOST || '0.0.0.0',
  });
}
