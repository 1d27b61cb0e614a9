// caw-box's credential broker: the agent's CLI sends its model traffic here with a
// placeholder key; the broker swaps each placeholder for the real key and forwards the
// request to the real upstream (the vendor's API host over TLS, or the --endpoint URL).
//
// Everything secret arrives on stdin as one JSON object, never in argv or the environment:
//   {"port": N, "upstream": "https://api.anthropic.com", "places": ["x-api-key", ...],
//    "keys": {"<placeholder>": "<real>"}}
// on one line. The broker prints one line "caw-box-broker ready" on stdout once it listens,
// and otherwise logs nothing that could hold a secret (no headers, no query strings).
//
// A shared broker (`"shared": true`, one per network, upstream and key set, reused by the
// turns of every session there) swaps no key directly: `keys` are named slots, and each turn
// leases its own placeholders on stdin, while it runs:
//   lease <id> <ttl-ms> <placeholder>=<slot> ...   (again before the ttl ends; answered
//                                                    "caw-box-broker ok <id>" on stdout)
//   release <id>
// A placeholder works only while its lease holds. With no lease left for `idle_ms`, the
// broker exits; once it decided to, it answers no lease (the turn then starts a new one).
// `places` (the vendor's, from its credential spec under auth/) says where the CLI sends its
// key: header names (a value may be `Bearer <key>`), or `query:<name>`. Only there is a
// placeholder swapped; a value that is not a placeholder passes unchanged (a key the user
// gave the agent with --env still works).
//
// OAuth logins (`oauth`: {"<slot>": {access, refresh, expires_ms, token_url, client_id,
// client_secret, body, scope}}, placeholders leased like keys, or, for a turn's own broker, slots named
// by their placeholder): the broker swaps the placeholder access token for the real one,
// refreshes it when it is within `margin_ms` of expiry or the upstream answers 401 (once
// for all concurrent requests: one refresh in flight per login, and never again for an
// access token that was already replaced), retries the request once, and reports the new
// tokens on stdout sealed (AES-256-GCM with the `seal` key, which only caw-box holds):
//   caw-box-broker login <slot> <base64 of iv | ciphertext | tag>
// so the caw-box processes attached store them (under the store's lock). `report` on stdin
// (a caw-box that attached later: it finishes a pod's turn whose driver is gone) has the
// newest refreshed tokens of each login reported again, so a refresh made while nobody
// was attached reaches the store too, and a refresh hand-off question still unanswered is
// asked again.
//
// Back-off: after a 429 or 529 answer the broker sends nothing upstream for its
// `retry-after`; `pace <ms>` on stdin (a shared broker: `pace <ms> <lease>`) holds the
// turn's requests that long, as its account's schedule says (see `backOff` below).
//
// `tls` ({cert, key}, PEM: a certificate of the turn's own CA for the hosts a login's CLI
// reaches directly, such as opencode's chatgpt.com): the broker also listens with TLS on
// `tls_port` (443; the agent's container resolves those hosts to the broker), with the same
// handler: a login's placeholder there goes to the login's upstream, the path unchanged.
//
// `"host": "127.0.0.1"` makes it listen on loopback only (a sidecar in the agent's pod).
// `direct_dns` (hosts): the upstream's name is resolved by DNS, not the hosts file, for
// those hosts: a sidecar that stands in for them shares the pod's hosts file, which points
// them at itself.
//
// caw-box ships this file on the broker container's stdin too (the container runs a small
// loader with `node -e`), so the broker always matches the caw-box that started it.
'use strict';
module.exports = function broker(config, rest) {
  const http = require('http');
  const https = require('https');
  const upstream = new URL(config.upstream);
  const keys = new Map(Object.entries(config.keys || {}));
  const logins = new Map(Object.entries(config.oauth || {}));
  const shared = config.shared === true;
  // placeholder -> slot, for the leases that hold (shared brokers).
  const aliases = new Map();
  const leases = new Map();
  // Refresh handoff questions waiting for their answer (see `ask`).
  const asked = new Map();
  let idleSince = Date.now();
  let leaving = false;
  const places = config.places || ['x-api-key', 'authorization', 'x-goog-api-key', 'query:key'];
  const headerPlaces = places.filter((p) => !p.startsWith('query:'));
  const queryPlaces = places.filter((p) => p.startsWith('query:')).map((p) => p.slice(6));
  const client = upstream.protocol === 'https:' ? https : http;
  const base = upstream.pathname.replace(/\/+$/, '');
  // The upstream's lookup (see `direct_dns`); undefined: the system's (hosts file first).
  const lookup = (config.direct_dns || []).includes(upstream.hostname)
    ? (host, opts, cb) => {
      const dns = require('dns');
      const found = (list) => (opts && opts.all ? cb(null, list)
        : cb(null, list[0].address, list[0].family));
      dns.resolve4(host, (e4, a4) => {
        if (!e4 && a4.length) return found(a4.map((address) => ({ address, family: 4 })));
        dns.resolve6(host, (e6, a6) => {
          if (e6 || !a6.length) return cb(e4 || e6);
          return found(a6.map((address) => ({ address, family: 6 })));
        });
      });
    }
    : undefined;
  const HOP = [
    'connection', 'keep-alive', 'proxy-connection', 'proxy-authorization', 'te',
    'trailer', 'transfer-encoding', 'upgrade', 'host',
  ];

  // What the upstream says of the account's limits, on each model response: the headers
  // its vendor documents for them (counts and times, no secret), for caw-box to keep per
  // account: `caw-box-broker limits {"status","at","headers"}` on stdout. A 429 or 529
  // (overloaded) is reported even without them.
  const LIMIT_HEADER = /^(anthropic-ratelimit-|x-ratelimit-|x-codex-(primary|secondary)-|retry-after(-ms)?$)/;
  function reportLimits(up) {
    backOff(up);
    const headers = {};
    for (const [k, v] of Object.entries(up.headers)) {
      if (LIMIT_HEADER.test(k)) headers[k] = String(v).slice(0, 100);
    }
    const status = up.statusCode || 0;
    if (!Object.keys(headers).length && status !== 429 && status !== 529) return;
    process.stdout.write(`caw-box-broker limits ${JSON.stringify({ status, at: Date.now(), headers })}\n`);
  }

  // Backing off (caw-box's `auth::backoff`): after a 429 or 529 the broker sends nothing
  // upstream for the answer's `retry-after` (else 5 s; within 1–60 s), and the caw-box
  // attached tells it when its turn may send again, as the account's schedule says:
  // `pace <ms>` (a shared broker: `pace <ms> <lease>`, that lease's turn). A held request
  // just waits here: the CLI sees a slow answer, not one more refusal.
  let ownUntil = 0;
  let paceUntil = 0;
  const paces = new Map();
  function backOff(up) {
    if (up.statusCode !== 429 && up.statusCode !== 529) return;
    const ms = Number(up.headers['retry-after-ms']);
    const secs = Number(up.headers['retry-after']);
    const dated = Date.parse(up.headers['retry-after'] || '') - Date.now();
    let wait = ms >= 0 ? ms : secs >= 0 ? secs * 1000 : dated >= 0 ? dated : 5000;
    wait = Math.min(Math.max(wait, 1000), 60000);
    ownUntil = Math.max(ownUntil, Date.now() + wait);
  }
  function leaseOf(req) {
    for (const k of headerPlaces) {
      const v = req.headers[k];
      if (typeof v !== 'string') continue;
      const p = /^(?:Bearer\s+)?(.*)$/i.exec(v)[1];
      for (const [id, l] of leases) if (l.placeholders.includes(p)) return id;
    }
    return undefined;
  }
  function whenOpen(req, go) {
    let at = ownUntil;
    if (shared) {
      const id = leaseOf(req);
      at = Math.max(at, (id !== undefined && paces.get(id)) || 0);
    } else {
      at = Math.max(at, paceUntil);
    }
    const left = at - Date.now();
    if (left <= 0) return go();
    setTimeout(() => whenOpen(req, go), Math.min(left, 250));
  }

  function real(placeholder) {
    if (shared) return aliases.has(placeholder) ? keys.get(aliases.get(placeholder)) : undefined;
    return keys.get(placeholder);
  }

  function swap(value) {
    if (typeof value !== 'string') return value;
    const whole = real(value);
    if (whole !== undefined) return whole;
    const m = /^(Bearer\s+)(.*)$/i.exec(value);
    const inner = m ? real(m[2]) : undefined;
    if (inner !== undefined) return m[1] + inner;
    return value;
  }

  function unlease(id) {
    const l = leases.get(id);
    if (!l) return;
    leases.delete(id);
    for (const p of l.placeholders) aliases.delete(p);
    paces.delete(id);
    if (leases.size === 0) idleSince = Date.now();
  }

  function command(line) {
    const [verb, id, ...args] = line.trim().split(/\s+/);
    if (verb === 'lease' && id && !leaving) {
      const ttl = Number(args.shift()) || 60000;
      const old = leases.get(id);
      const placeholders = old ? old.placeholders : [];
      for (const pair of args) {
        const i = pair.indexOf('=');
        if (i <= 0 || !(keys.has(pair.slice(i + 1)) || logins.has(pair.slice(i + 1)))) continue;
        aliases.set(pair.slice(0, i), pair.slice(i + 1));
        placeholders.push(pair.slice(0, i));
      }
      leases.set(id, { until: Date.now() + ttl, placeholders });
      process.stdout.write(`caw-box-broker ok ${id}\n`);
    } else if (verb === 'release' && id) {
      unlease(id);
    } else if (verb === 'handoff' && id && asked.has(id)) {
      asked.get(id)(args[0]);
    } else if (verb === 'report') {
      report();
    } else if (verb === 'pace' && id) {
      const until = Date.now() + (Number(id) || 0);
      if (args[0]) paces.set(args[0], until);
      else paceUntil = until;
    }
  }

  {
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
  }
  if (shared) {
    const idleMs = Number(config.idle_ms) || 300000;
    setInterval(() => {
      const now = Date.now();
      for (const [id, l] of leases) if (l.until < now) unlease(id);
      if (!leaving && leases.size === 0 && now - idleSince > idleMs) {
        leaving = true;
        server.close(() => process.exit(0));
        setTimeout(() => process.exit(0), 2000);
      }
    }, 1000).unref();
  }

  const server = http.createServer((req, res) => whenOpen(req, () => forward(req, res)));
  function forward(req, res) {
    const slot = loginOf(req);
    if (slot !== undefined) return viaLogin(req, res, slot);
    const headers = {};
    for (const [k, v] of Object.entries(req.headers)) {
      if (HOP.includes(k)) continue;
      headers[k] = headerPlaces.includes(k) ? swap(v) : v;
    }
    let path = req.url || '/';
    const q = path.indexOf('?');
    if (q >= 0) {
      const params = new URLSearchParams(path.slice(q + 1));
      const names = queryPlaces.filter((n) => params.has(n));
      for (const n of names) params.set(n, swap(params.get(n)));
      if (names.length) path = path.slice(0, q) + '?' + params.toString();
    }
    // A base URL with a path (a gateway at https://gw/openai) keeps it: the CLI's paths
    // come after it.
    if (base && !path.startsWith(base + '/') && path !== base) path = base + path;
    const out = client.request(
      {
        protocol: upstream.protocol,
        hostname: upstream.hostname,
        port: upstream.port || (upstream.protocol === 'https:' ? 443 : 80),
        method: req.method,
        path,
        headers: { ...headers, host: upstream.host },
        servername: upstream.hostname,
        lookup,
      },
      (up) => {
        const h = { ...up.headers };
        delete h.connection;
        delete h['keep-alive'];
        delete h['transfer-encoding'];
        reportLimits(up);
        res.writeHead(up.statusCode || 502, h);
        up.pipe(res);
      }
    );
    out.on('error', (e) => {
      process.stderr.write(`caw-box-broker: ${req.method} upstream error: ${e.code || e.message}\n`);
      // The CLI sees its model unreachable as it would without the broker (a dropped
      // connection it reports and retries), so caw-box still tells `unreachable` apart.
      res.destroy();
      req.socket.destroy();
    });
    req.pipe(out);
    req.on('aborted', () => out.destroy());
  }
  // --- OAuth logins ---
  const crypto = require('crypto');
  const margin = Number(config.margin_ms) || 300000;
  const inflight = new Map();
  // Refresh handoff (`"handoff": true`: a caw-box is attached to answer). Before it
  // refreshes, the broker asks whether another broker (another network's, or a locked-down
  // turn's own) refreshed the login already, which would have used up its refresh token:
  //   caw-box-broker refresh? <slot> <id> <sealed {"refresh"}>
  // answered on stdin with `handoff <id> go` (refresh; the caw-box that answered holds the
  // login's refresh lock until `caw-box-broker refreshed <slot>`) or `handoff <id> <sealed
  // tokens>` (the newer login in the store: taken, no refresh). No answer within 15 s: it
  // refreshes anyway.
  function ask(slot, l) {
    if (!config.handoff) return Promise.resolve('go');
    const id = crypto.randomBytes(8).toString('hex');
    const line = `caw-box-broker refresh? ${slot} ${id} ${seal({ refresh: l.refresh })}\n`;
    return new Promise((resolve) => {
      const timer = setTimeout(() => asked.delete(id) && resolve('go'), 15000);
      const answer = (a) => {
        clearTimeout(timer);
        asked.delete(id);
        resolve(a || 'go');
      };
      // Asked again by `report` (a caw-box attached after the question).
      answer.line = line;
      asked.set(id, answer);
      process.stdout.write(line);
    });
  }

  // The login slot whose placeholder a request carries (as `Bearer <placeholder>`).
  function loginOf(req) {
    for (const k of headerPlaces) {
      const v = req.headers[k];
      if (typeof v !== 'string') continue;
      const m = /^(?:Bearer\s+)?(.*)$/i.exec(v);
      const s = shared ? aliases.get(m[1]) : m[1];
      if (s !== undefined && logins.has(s)) return s;
    }
    return undefined;
  }

  function seal(obj) {
    const iv = crypto.randomBytes(12);
    const c = crypto.createCipheriv('aes-256-gcm', Buffer.from(config.seal, 'hex'), iv);
    const ct = Buffer.concat([c.update(JSON.stringify(obj)), c.final()]);
    return Buffer.concat([iv, ct, c.getAuthTag()]).toString('base64');
  }

  function unseal(text) {
    try {
      const raw = Buffer.from(text, 'base64');
      const d = crypto.createDecipheriv('aes-256-gcm', Buffer.from(config.seal, 'hex'),
                                        raw.subarray(0, 12));
      d.setAuthTag(raw.subarray(raw.length - 16));
      return JSON.parse(Buffer.concat([d.update(raw.subarray(12, raw.length - 16)), d.final()]));
    } catch {
      return undefined;
    }
  }

  function post(url, body, type) {
    return new Promise((resolve, reject) => {
      const u = new URL(url);
      const r = (u.protocol === 'https:' ? https : http).request(
        { method: 'POST', hostname: u.hostname, port: u.port || (u.protocol === 'https:' ? 443 : 80),
          path: u.pathname + u.search, servername: u.hostname,
          headers: { 'content-type': type, 'content-length': Buffer.byteLength(body) } },
        (up) => {
          const parts = [];
          up.on('data', (d) => parts.push(d));
          up.on('end', () => resolve({ status: up.statusCode, body: Buffer.concat(parts).toString() }));
        });
      r.on('error', reject);
      r.setTimeout(30000, () => r.destroy(new Error('timeout')));
      r.end(body);
    });
  }

  // Refreshes `slot` unless its access token is no longer `stale` (another request did).
  function refresh(slot, stale) {
    const l = logins.get(slot);
    if (l.access !== stale) return Promise.resolve();
    if (inflight.has(slot)) return inflight.get(slot);
    const p = (async () => {
      const answer = await ask(slot, l);
      const newer = answer === 'go' ? undefined : unseal(answer);
      if (newer && typeof newer.access === 'string' && typeof newer.refresh === 'string') {
        l.access = newer.access;
        l.refresh = newer.refresh;
        l.expires_ms = Number(newer.expires_ms) || Date.now() + 3600000;
        if (typeof newer.id_token === 'string') l.id_token = newer.id_token;
        // The store has these: nothing of this broker's own to report.
        l.previous = undefined;
        return;
      }
      const fields = { grant_type: 'refresh_token', refresh_token: l.refresh, client_id: l.client_id };
      if (l.client_secret) fields.client_secret = l.client_secret;
      if (l.scope) fields.scope = l.scope;
      const form = l.body === 'form';
      const body = form ? new URLSearchParams(fields).toString() : JSON.stringify(fields);
      const type = form ? 'application/x-www-form-urlencoded' : 'application/json';
      const r = await post(l.token_url, body, type);
      if (r.status !== 200) throw new Error(`token endpoint answered ${r.status}`);
      const t = JSON.parse(r.body);
      if (typeof t.access_token !== 'string') throw new Error('no access_token in the answer');
      const previous = l.refresh;
      l.previous = previous;
      l.access = t.access_token;
      if (typeof t.refresh_token === 'string') l.refresh = t.refresh_token;
      l.expires_ms = Date.now() + (Number(t.expires_in) || 3600) * 1000;
      if (typeof t.id_token === 'string') l.id_token = t.id_token;
      const sealed = seal({ previous, access: l.access, refresh: l.refresh,
                            expires_ms: l.expires_ms, id_token: l.id_token });
      process.stdout.write(`caw-box-broker login ${slot} ${sealed}\n`);
      process.stdout.write(`caw-box-broker refreshed ${slot}\n`);
    })().catch((e) => {
      process.stderr.write(`caw-box-broker: refresh failed: ${e.message}\n`);
      process.stdout.write(`caw-box-broker refreshed ${slot}\n`);
    }).finally(() => inflight.delete(slot));
    inflight.set(slot, p);
    return p;
  }

  // Reports each login this broker refreshed last (see `report` above).
  function report() {
    for (const a of asked.values()) process.stdout.write(a.line);
    for (const [slot, l] of logins) {
      if (l.previous === undefined) continue;
      const sealed = seal({ previous: l.previous, access: l.access, refresh: l.refresh,
                            expires_ms: l.expires_ms, id_token: l.id_token });
      process.stdout.write(`caw-box-broker login ${slot} ${sealed}\n`);
    }
  }

  function viaLogin(req, res, slot) {
    const parts = [];
    req.on('data', (d) => parts.push(d));
    req.on('end', async () => {
      const body = Buffer.concat(parts);
      const l = logins.get(slot);
      if (l.expires_ms - Date.now() < margin) await refresh(slot, l.access);
      let path = req.url || '/';
      // A login's own API (codex: chatgpt.com/backend-api/codex) has no `/v1` where the
      // CLI's base URL has one.
      const cp = config.cli_prefix;
      if (cp && path.startsWith(cp + '/')) path = path.slice(cp.length);
      if (base && !path.startsWith(base + '/') && path !== base) path = base + path;
      const send = (retry) => {
        const access = l.access;
        const headers = {};
        for (const [k, v] of Object.entries(req.headers)) {
          if (HOP.includes(k) || k === 'content-length') continue;
          headers[k] = headerPlaces.includes(k) && loginOf({ headers: { [k]: v } }) !== undefined
            ? `Bearer ${access}` : v;
        }
        headers['content-length'] = body.length;
        const out = client.request(
          { protocol: upstream.protocol, hostname: upstream.hostname,
            port: upstream.port || (upstream.protocol === 'https:' ? 443 : 80),
            method: req.method, path, headers: { ...headers, host: upstream.host },
            servername: upstream.hostname, lookup },
          (up) => {
            if (up.statusCode === 401 && retry) {
              up.resume();
              refresh(slot, access).then(() => send(false));
              return;
            }
            const h = { ...up.headers };
            delete h.connection;
            delete h['keep-alive'];
            delete h['transfer-encoding'];
            reportLimits(up);
            res.writeHead(up.statusCode || 502, h);
            up.pipe(res);
          });
        out.on('error', (e) => {
          process.stderr.write(`caw-box-broker: ${req.method} upstream error: ${e.code || e.message}\n`);
          res.destroy();
          req.socket.destroy();
        });
        out.end(body);
      };
      send(true);
    });
  }

  server.keepAliveTimeout = 65000;
  const servers = [server];
  if (config.tls) {
    const handler = server.listeners('request')[0];
    const secure = https.createServer({ cert: config.tls.cert, key: config.tls.key }, handler);
    secure.keepAliveTimeout = 65000;
    servers.push(secure);
  }
  // `host`: where it listens (a broker in the agent's own pod: loopback only).
  let listening = 0;
  const ports = [config.port || 8080, config.tls_port || 443];
  servers.forEach((s, i) => {
    s.on('error', (e) => {
      process.stderr.write(`caw-box-broker: cannot listen on ${ports[i]}: ${e.code || e.message}\n`);
      process.exit(1);
    });
    s.listen(ports[i], config.host || '0.0.0.0', () => {
      if (++listening === servers.length) process.stdout.write('caw-box-broker ready\n');
    });
  });
  const stop = () => {
    servers.forEach((s) => s.close());
    setTimeout(() => process.exit(0), 200);
  };
  process.on('SIGTERM', stop);
  process.on('SIGINT', stop);
};
