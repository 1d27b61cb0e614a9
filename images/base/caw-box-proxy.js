// caw-box's egress proxy: the only way out of an agent container started with
// `--allow-host`. Admits CONNECT (https) and plain-HTTP requests to the allowed host[:port]
// list in CAW_BOX_ALLOW (comma-separated; `*.example.com` matches subdomains) and refuses
// everything else with 403. Each decision is one JSON line on stdout, which caw-box reads to
// report refused connections in the turn's events. Not a general-purpose proxy.
'use strict';
const http = require('http');
const net = require('net');

const allow = (process.env.CAW_BOX_ALLOW || '')
  .split(',')
  .map((s) => s.trim().toLowerCase())
  .filter(Boolean)
  .map((s) => {
    const i = s.lastIndexOf(':');
    return i > 0 && /^\d+$/.test(s.slice(i + 1))
      ? { host: s.slice(0, i), port: Number(s.slice(i + 1)) }
      : { host: s, port: null };
  });

function allowed(host, port) {
  host = String(host || '').toLowerCase().replace(/^\[|\]$/g, '');
  return allow.some(
    (a) =>
      (a.host === host || (a.host.startsWith('*.') && host.endsWith(a.host.slice(1)))) &&
      (a.port === null || a.port === port)
  );
}

function log(fields) {
  process.stdout.write(JSON.stringify({ proxy: 'caw-box', ts: Date.now(), ...fields }) + '\n');
}

const HOP = ['proxy-connection', 'proxy-authorization', 'connection', 'keep-alive'];

const server = http.createServer((req, res) => {
  let url;
  try {
    url = new URL(req.url);
  } catch {
    res.writeHead(400, { 'content-type': 'text/plain' });
    res.end('caw-box proxy: send an absolute http:// URL\n');
    return;
  }
  const port = Number(url.port) || 80;
  const target = `${url.hostname}:${port}`;
  if (url.protocol !== 'http:' || !allowed(url.hostname, port)) {
    log({ decision: 'refused', target, method: req.method });
    res.writeHead(403, { 'content-type': 'text/plain' });
    res.end(`caw-box: egress to ${target} is not allowed (--allow-host)\n`);
    return;
  }
  log({ decision: 'allowed', target, method: req.method });
  const headers = { ...req.headers };
  for (const h of HOP) delete headers[h];
  const upstream = http.request(
    { host: url.hostname, port, method: req.method, path: url.pathname + url.search, headers },
    (up) => {
      res.writeHead(up.statusCode, up.headers);
      up.pipe(res);
    }
  );
  upstream.on('error', (e) => {
    if (!res.headersSent) res.writeHead(502, { 'content-type': 'text/plain' });
    res.end(`caw-box proxy: ${e.message}\n`);
  });
  req.pipe(upstream);
});

server.on('connect', (req, socket, head) => {
  const i = req.url.lastIndexOf(':');
  const host = i > 0 ? req.url.slice(0, i) : req.url;
  const port = i > 0 ? Number(req.url.slice(i + 1)) || 443 : 443;
  const target = `${host}:${port}`;
  socket.on('error', () => {});
  if (!allowed(host, port)) {
    log({ decision: 'refused', target, method: 'CONNECT' });
    socket.end('HTTP/1.1 403 Forbidden\r\ncontent-type: text/plain\r\n\r\n');
    return;
  }
  log({ decision: 'allowed', target, method: 'CONNECT' });
  const upstream = net.connect(port, host, () => {
    socket.write('HTTP/1.1 200 Connection Established\r\n\r\n');
    if (head && head.length) upstream.write(head);
    upstream.pipe(socket);
    socket.pipe(upstream);
  });
  upstream.on('error', () => socket.end('HTTP/1.1 502 Bad Gateway\r\n\r\n'));
});

// CAW_BOX_PROXY_HOST: 127.0.0.1 in a Kubernetes turn pod (the agent beside it, nobody else).
const host = process.env.CAW_BOX_PROXY_HOST || '0.0.0.0';
server.listen(Number(process.env.CAW_BOX_PROXY_PORT || 3128), host, () =>
  log({ decision: 'listening', allow: allow.map((a) => a.host + (a.port ? ':' + a.port : '')) })
);
for (const sig of ['SIGTERM', 'SIGINT']) process.on(sig, () => process.exit(0));
