// caw-box-codex-turn: `node codex-turn.js codex exec ARGS...` runs a headless codex turn in
// the `codex app-server` a pool's box started ahead of its claim (`caw-box pool`, docs/pools.md),
// and prints what `codex exec --json ARGS...` would print; exits as it would.
//
// It takes the turn only where it can run it exactly as `codex exec` would: a first turn
// (no `resume`), flags it knows, `-c` values that are plain strings, numbers or booleans, the
// model's key in the environment variable the flags name, and nothing under ~/.codex changed
// since the server started (the person's own config.toml or AGENTS.md placed for this turn).
// Otherwise, or where the server does not answer, it runs `codex ARGS...` itself, before it
// has printed anything. Written into the box by caw-box (src/provider/codex.rs); no
// dependency beyond node.
//
// What differs from `codex exec`, by construction: the key goes to the server as the model
// provider's bearer token for this thread (never written to disk: codex keeps config
// overrides in memory), and this process's environment (but the variables codex itself
// would keep from its tools: names with KEY, SECRET or TOKEN) goes to the agent's commands
// through `shell_environment_policy.set`, as the environment `codex exec` would have passed on.
'use strict';
const fs = require('fs');
const net = require('net');
const crypto = require('crypto');
const { spawn } = require('child_process');

const DIR = process.env.CAW_BOX_WARM_DIR || '/tmp/.caw-box-warm';
const SOCKET = `${DIR}/codex.sock`;
const STAMP = `${DIR}/codex.started`;
const ARGS = process.argv.slice(2); // codex exec ...

/// Runs the real CLI with our stdio (its stdin `prompt` where this read it already); its
/// exit is ours.
function fallBack(why, prompt) {
  if (process.env.CAW_BOX_CODEX_TURN_DEBUG) process.stderr.write(`caw-box-codex-turn: ${why}\n`);
  const stdin = prompt === undefined ? 'inherit' : 'pipe';
  const child = spawn(ARGS[0], ARGS.slice(1), { stdio: [stdin, 'inherit', 'inherit'] });
  if (prompt !== undefined) child.stdin.end(prompt);
  for (const s of ['SIGTERM', 'SIGINT', 'SIGHUP']) process.on(s, () => child.kill(s));
  child.on('exit', (code, signal) => {
    if (signal) {
      process.removeAllListeners(signal);
      process.kill(process.pid, signal);
    }
    process.exit(code === null ? 1 : code);
  });
}

/// A TOML value as codex's `-c` reads it, where it is a plain one; `undefined` otherwise.
function plainValue(text) {
  if (/^"([^"\\]|\\["\\nt])*"$/.test(text)) return JSON.parse(text);
  if (text === 'true' || text === 'false') return text === 'true';
  if (/^-?[0-9]+$/.test(text)) return Number(text);
  return undefined;
}

/// The thread's settings from `codex exec`'s flags, or why they cannot go to the server.
function settings(args) {
  if (args[0] !== 'codex' || args[1] !== 'exec') return { why: 'not codex exec' };
  const config = {};
  let model = null;
  let sawPrompt = false;
  for (let i = 2; i < args.length; i++) {
    const a = args[i];
    if (['--json', '--skip-git-repo-check', '--dangerously-bypass-approvals-and-sandbox'].includes(a)) continue;
    if (a === '--disable' && args[i + 1] === 'plugins') { i++; continue; }
    if ((a === '-m' || a === '--model') && i + 1 < args.length) { model = args[++i]; continue; }
    if (a === '-c' && i + 1 < args.length) {
      const kv = args[++i];
      const eq = kv.indexOf('=');
      if (eq <= 0) return { why: `-c ${kv}` };
      const key = kv.slice(0, eq);
      if (key === 'analytics.enabled') continue; // the server's own flag
      if (key.startsWith('features.') || key.startsWith('mcp_servers')) return { why: `-c ${key}` };
      const value = plainValue(kv.slice(eq + 1));
      if (value === undefined) return { why: `-c ${key}` };
      const env = key.match(/^(model_providers\.[^.]+)\.env_key$/);
      if (env) {
        const secret = process.env[value];
        if (!secret) return { why: `no ${value}` };
        config[`${env[1]}.experimental_bearer_token`] = secret;
        continue;
      }
      config[key] = value;
      continue;
    }
    if (a === '-' && i === args.length - 1) { sawPrompt = true; continue; }
    return { why: `flag ${a}` };
  }
  if (!sawPrompt) return { why: 'no prompt on stdin' };
  if (!Object.keys(config).some((k) => k.endsWith('.experimental_bearer_token'))) {
    return { why: 'no key in the environment' };
  }
  // What `codex exec` would pass on to the agent's commands of its own environment.
  const set = {};
  for (const [k, v] of Object.entries(process.env)) {
    if (!/KEY|SECRET|TOKEN/i.test(k)) set[k] = v;
  }
  config['shell_environment_policy.set'] = set;
  return { config, model };
}

/// Whether a file the server read at its start was put in HOME since, or the turn's proxy
/// variables are not the server's (the model and the agent's commands go the turn's way).
function homeChanged() {
  let started;
  try { started = fs.statSync(STAMP).mtimeMs; } catch { return 'no server stamp'; }
  let server = '';
  try { server = fs.readFileSync(`${DIR}/codex.env`, 'utf8'); } catch { return 'no server environment'; }
  const ours = Object.entries(process.env)
    .filter(([k]) => /^(https?|no)_proxy$/i.test(k))
    .map(([k, v]) => `${k}=${v}\n`)
    .sort((a, b) => (a < b ? -1 : a > b ? 1 : 0))
    .join('');
  if (ours !== server) return 'the proxy variables differ from the server\'s';
  const home = process.env.HOME || '/home/agent';
  for (const f of ['config.toml', 'AGENTS.md', 'auth.json', 'instructions.md']) {
    try {
      if (fs.statSync(`${home}/.codex/${f}`).mtimeMs > started) return `~/.codex/${f} is new`;
    } catch { /* absent */ }
  }
  return null;
}

/// A WebSocket client over the server's unix socket: text frames of JSON-RPC, one per message.
function connect(onMessage, onClose) {
  return new Promise((resolve, reject) => {
    const sock = net.connect(SOCKET);
    const key = crypto.randomBytes(16).toString('base64');
    let buf = Buffer.alloc(0);
    let open = false;
    let parts = [];
    sock.once('error', (e) => (open ? onClose(e) : reject(e)));
    sock.on('close', () => open && onClose(null));
    sock.on('connect', () => {
      sock.write(`GET / HTTP/1.1\r\nHost: localhost\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n` +
        `Sec-WebSocket-Key: ${key}\r\nSec-WebSocket-Version: 13\r\n\r\n`);
    });
    sock.on('data', (d) => {
      buf = Buffer.concat([buf, d]);
      if (!open) {
        const end = buf.indexOf('\r\n\r\n');
        if (end < 0) return;
        if (!/^HTTP\/1\.1 101/.test(buf.slice(0, end).toString('latin1'))) return reject(new Error('no upgrade'));
        buf = buf.slice(end + 4);
        open = true;
        resolve(send);
      }
      for (;;) {
        if (buf.length < 2) return;
        const op = buf[0] & 0x0f, fin = buf[0] & 0x80;
        let len = buf[1] & 0x7f, at = 2;
        if (len === 126) { if (buf.length < 4) return; len = buf.readUInt16BE(2); at = 4; }
        else if (len === 127) { if (buf.length < 10) return; len = Number(buf.readBigUInt64BE(2)); at = 10; }
        if (buf.length < at + len) return;
        const payload = buf.slice(at, at + len);
        buf = buf.slice(at + len);
        if (op === 0x9) frame(0xa, payload);
        else if (op === 0x8) sock.end();
        else if (op === 0x1 || op === 0x0) {
          parts.push(payload);
          if (fin) { const text = Buffer.concat(parts).toString('utf8'); parts = []; onMessage(JSON.parse(text)); }
        }
      }
    });
    function frame(op, payload) {
      const mask = crypto.randomBytes(4);
      const n = payload.length;
      const head = n < 126 ? Buffer.from([0x80 | op, 0x80 | n])
        : n < 65536 ? Buffer.from([0x80 | op, 0x80 | 126, n >> 8, n & 0xff])
          : Buffer.concat([Buffer.from([0x80 | op, 0x80 | 127]), (() => { const b = Buffer.alloc(8); b.writeBigUInt64BE(BigInt(n)); return b; })()]);
      const body = Buffer.alloc(n);
      for (let i = 0; i < n; i++) body[i] = payload[i] ^ mask[i & 3];
      sock.write(Buffer.concat([head, mask, body]));
    }
    function send(obj) { frame(0x1, Buffer.from(JSON.stringify(obj), 'utf8')); }
  });
}

const out = (obj) => process.stdout.write(JSON.stringify(obj) + '\n');

/// A thread item of the server's protocol as `codex exec --json` prints it (null: not printed).
function execItem(item) {
  const status = (s) => (s === 'inProgress' ? 'in_progress' : s);
  switch (item.type) {
    case 'agentMessage': return { id: item.id, type: 'agent_message', text: item.text };
    case 'reasoning': return { id: item.id, type: 'reasoning', text: [...(item.summary || []), ...(item.content || [])].join('\n') };
    case 'commandExecution': return {
      id: item.id, type: 'command_execution', command: item.command, aggregated_output: item.aggregatedOutput || '',
      exit_code: item.exitCode ?? null, status: status(item.status),
    };
    case 'fileChange': return {
      id: item.id, type: 'file_change', status: status(item.status),
      changes: (item.changes || []).map((c) => ({ path: c.path, kind: (c.kind && c.kind.type) || c.kind })),
    };
    case 'mcpToolCall': return {
      id: item.id, type: 'mcp_tool_call', server: item.server, tool: item.tool, arguments: item.arguments,
      result: item.result ?? null, error: item.error ?? null, status: status(item.status),
    };
    case 'webSearch': return { id: item.id, type: 'web_search', query: item.query };
    default: return null;
  }
}

async function main() {
  const s = settings(ARGS);
  if (s.why) return fallBack(s.why);
  const changed = homeChanged();
  if (changed) return fallBack(changed);
  let prompt = '';
  try { prompt = fs.readFileSync(0, 'utf8'); } catch { /* empty */ }

  let nextId = 0;
  const pending = new Map();
  let thread = null, turnId = null, usage = null;
  let finished;
  const done = new Promise((r) => (finished = r));
  const call = (send, method, params) => new Promise((resolve) => {
    const id = ++nextId;
    pending.set(id, resolve);
    send({ jsonrpc: '2.0', id, method, params });
  });
  const onMessage = (m) => {
    if (m.id !== undefined && pending.has(m.id)) { const r = pending.get(m.id); pending.delete(m.id); return r(m); }
    const p = m.params || {};
    switch (m.method) {
      case 'turn/started': out({ type: 'turn.started' }); break;
      case 'item/started': { const it = execItem(p.item || {}); if (it && it.type !== 'agent_message' && it.type !== 'reasoning') out({ type: 'item.started', item: it }); break; }
      case 'item/completed': { const it = execItem(p.item || {}); if (it) out({ type: 'item.completed', item: it }); break; }
      case 'thread/tokenUsage/updated': usage = p.tokenUsage && p.tokenUsage.total; break;
      case 'error': if (p.error && p.error.message) out({ type: 'error', message: p.error.message }); break;
      case 'turn/completed': finished(p.turn || {}); break;
      default: break;
    }
  };
  let send;
  try {
    send = await connect(onMessage, () => finished({ status: 'failed', error: { message: 'the codex app-server went away' } }));
    const init = await call(send, 'initialize', { clientInfo: { name: 'codex_exec', version: '1' } });
    if (init.error) throw new Error(init.error.message);
    send({ jsonrpc: '2.0', method: 'initialized', params: {} });
    const started = await call(send, 'thread/start', {
      model: s.model, cwd: process.cwd(), approvalPolicy: 'never', sandbox: 'danger-full-access', config: s.config,
    });
    if (started.error) throw new Error(started.error.message);
    thread = started.result.thread;
  } catch (e) {
    return fallBack(`the server: ${e.message}`, prompt);
  }
  out({ type: 'thread.started', thread_id: thread.id });
  const stop = (signal) => {
    if (turnId) send({ jsonrpc: '2.0', id: ++nextId, method: 'turn/interrupt', params: { threadId: thread.id, turnId } });
    setTimeout(() => process.exit(128 + ({ SIGHUP: 1, SIGINT: 2, SIGTERM: 15 }[signal] || 0)), 2000).unref();
  };
  for (const sig of ['SIGTERM', 'SIGINT', 'SIGHUP']) process.on(sig, () => stop(sig));
  const turn = await call(send, 'turn/start', { threadId: thread.id, input: [{ type: 'text', text: prompt }] });
  if (turn.error) {
    out({ type: 'error', message: turn.error.message });
    out({ type: 'turn.failed', error: { message: turn.error.message } });
    process.exit(1);
  }
  turnId = turn.result && turn.result.turn && turn.result.turn.id;
  const end = await done;
  // The thread's file holds the turn once its task_complete is written (the server may
  // still be writing when it says the turn completed; the box ends soon after this).
  await flushed(thread.path, 2000);
  if (end.status === 'completed') {
    const u = usage || {};
    out({ type: 'turn.completed', usage: {
      input_tokens: u.inputTokens || 0, cached_input_tokens: u.cachedInputTokens || 0, output_tokens: u.outputTokens || 0,
    } });
    process.exit(0);
  }
  const message = (end.error && end.error.message) || (end.status === 'interrupted' ? 'the turn was interrupted' : 'the turn failed');
  out({ type: 'turn.failed', error: { message } });
  process.exit(1);
}

/// Waits (up to `ms`) until the thread's rollout file ends with the turn's task_complete.
async function flushed(path, ms) {
  if (!path) return;
  const until = Date.now() + ms;
  while (Date.now() < until) {
    try {
      const text = fs.readFileSync(path, 'utf8').trimEnd();
      const last = text.slice(text.lastIndexOf('\n') + 1);
      if (/"type":"task_complete"/.test(last)) return;
    } catch { /* not yet */ }
    await new Promise((r) => setTimeout(r, 5));
  }
}

main();
