#!/usr/bin/env node
// A generator of hostile HTTP requests against `attic serve` with every feature on (the
// KV store on DRAM and SSD, two tenants' API keys, context caches, linking, sparse
// decoding). docs/fuzzing.md "Hostile HTTP at volume" says how to run it.
//
//   node tests/hostile/hostile_http.mjs [--requests N] [--concurrency C] [--seed S]
//        [--url URL --key A --other-key B]   (a server already running; else one is started)
//        [--json FILE]
//
// Kinds (one request each, in a seeded mix): truncated and deeply nested JSON, huge
// numbers, wrong types, invalid UTF-8 (body and headers), duplicate keys, oversized
// bodies, raw garbage, slow clients, bursts of idle connections, streams cancelled
// mid-way, another tenant's context-cache ids, wrong paths and methods, and valid
// requests. Every answer must be a well-formed 4xx (an OpenAI error object) or a correct
// 2xx; no 5xx; the server alive throughout; its RSS sampled (peak reported, and checked
// against --max-rss-mib when given); and a normal request must succeed at the end.
// Exit status 0 only when all of that holds.
import fs from 'node:fs';
import http from 'node:http';
import net from 'node:net';
import os from 'node:os';
import path from 'node:path';
import { spawn } from 'node:child_process';
import { fileURLToPath } from 'node:url';

const here = path.dirname(fileURLToPath(import.meta.url));
const sourceDir = path.resolve(here, '../..');
const args = Object.fromEntries(
  process.argv.slice(2).reduce((acc, a, i, all) => (a.startsWith('--') ? [...acc, [a.slice(2), all[i + 1]]] : acc), []));
const N = Number(args.requests || 10000);
const C = Number(args.concurrency || 16);
let seed = Number(args.seed || 1);
const rand = () => ((seed = (seed * 1103515245 + 12345) % 2147483648) / 2147483648);
const pick = (a) => a[Math.floor(rand() * a.length)];
const model = 'stories260K-hf';

async function startServer() {
  const binary = process.env.ATTIC_BINARY || path.join(sourceDir, 'build/attic');
  const shared = process.env.ATTIC_SHARED_DIR || path.resolve(sourceDir, '../shared');
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'attic-hostile-'));
  const proc = spawn(binary, ['serve', '-m', path.join(shared, 'models/stories260K-hf'), '--host', '127.0.0.1',
    '--port', '0', '--threads', '2', '--chat-template', 'chatml', '--api-key', 'tenant-a', '--api-key', 'tenant-b',
    '--kv-dram-bytes', String(64 << 20), '--kv-ssd-dir', path.join(dir, 'kv'), '--kv-ssd-bytes', String(256 << 20),
    '--max-tokens-limit', '64', '--max-waiting', '64', '--timeout', '30'], { stdio: ['ignore', 'ignore', 'pipe'] });
  let log = '';
  const port = await new Promise((resolve, reject) => {
    proc.stderr.on('data', (d) => {
      log += d.toString();
      if (log.length > 1 << 20) log = log.slice(-(1 << 19));
      const m = log.match(/listening on http:\/\/127\.0\.0\.1:(\d+)/);
      if (m) resolve(Number(m[1]));
    });
    proc.on('exit', (code) => reject(new Error(`attic serve exited (${code}):\n${log}`)));
  });
  return { port, proc, dir, log: () => log };
}

function send(port, { method = 'POST', p = '/v1/chat/completions', headers = {}, body }) {
  return new Promise((resolve) => {
    const buf = body === undefined ? undefined : Buffer.isBuffer(body) ? body : Buffer.from(body);
    const req = http.request({ host: '127.0.0.1', port, method, path: p, agent: false,
      headers: { 'content-type': 'application/json', ...(buf ? { 'content-length': buf.length } : {}), ...headers } },
    (res) => {
      const chunks = [];
      res.on('data', (c) => chunks.push(c));
      res.on('end', () => resolve({ status: res.statusCode, body: Buffer.concat(chunks).toString() }));
      res.on('error', () => resolve({ status: res.statusCode, body: '' }));
    });
    req.on('error', (e) => resolve({ status: 0, error: e.code || String(e) }));
    if (buf) req.write(buf);
    req.end();
  });
}

// Raw bytes on a socket; `slowMs` > 0 sends them a few bytes at a time. Resolves with the
// status of the answer (0: closed without one).
function raw(port, bytes, { slowMs = 0, closeAfterMs = 0 } = {}) {
  return new Promise((resolve) => {
    const sock = net.connect(port, '127.0.0.1');
    let data = '';
    let settled = false;
    let why = '';
    const done = (reason) => {
      if (typeof reason === 'string' && !why) why = reason;
      if (settled) return;
      settled = true;
      sock.destroy();
      const m = data.match(/^HTTP\/1\.[01] (\d{3})/);
      resolve({ status: m ? Number(m[1]) : 0, body: data.slice(data.indexOf('\r\n\r\n') + 4), error: why || undefined });
    };
    sock.setTimeout(30000, () => done('client timeout (30 s without a byte)'));
    sock.on('data', (d) => {
      data += d.toString('latin1');
      const at = data.indexOf('\r\n\r\n');
      const len = at >= 0 && data.slice(0, at).match(/\r\ncontent-length: *(\d+)/i);
      if (len && data.length >= at + 4 + Number(len[1])) done();
    });
    sock.on('close', () => done('closed by the server'));
    sock.on('error', (e) => done(e.code || String(e)));
    sock.on('connect', async () => {
      if (slowMs > 0) {
        for (let i = 0; i < bytes.length && !settled; i += 7) {
          sock.write(bytes.subarray(i, i + 7));
          await new Promise((r) => setTimeout(r, slowMs));
        }
      } else {
        sock.write(bytes);
      }
      if (closeAfterMs > 0) setTimeout(done, closeAfterMs);
    });
  });
}

const story = 'Once upon a time there was a little girl named Lily. She loved to play in the park with her red ball. ';
const chat = (extra = {}) => ({ model, messages: [{ role: 'user', content: 'Hi there' }], max_tokens: 4, ...extra });

function nested(depth) {
  return '{"model":"m","messages":' + '['.repeat(depth) + ']'.repeat(depth) + '}';
}

function hugeNumbers() {
  const n = pick(['1e400', '-1e400', '99999999999999999999999', '-9223372036854775809', '1.7976931348623157e309',
    '0.0000000000000000000000001', '-0', '4294967297']);
  const f = pick(['max_tokens', 'temperature', 'top_p', 'top_k', 'seed', 'min_p', 'session_ttl', 'n']);
  return `{"model":"${model}","messages":[{"role":"user","content":"x"}],"${f}":${n}}`;
}

function wrongTypes() {
  const bodies = [
    { model: 1, messages: [] }, { model, messages: 'hello' }, { model, messages: [{ role: 5, content: 'x' }] },
    { model, messages: [{ role: 'user', content: { text: 1 } }] }, { model, messages: [{ role: 'user' }] },
    chat({ max_tokens: '4' }), chat({ stream: 'yes' }), chat({ stop: [1, 2] }), chat({ stop: Array(100).fill('x') }),
    chat({ temperature: null, top_p: [] }), chat({ session_id: {} }), chat({ link: 'x' }), chat({ sparse: 7 }),
    [chat()], 'null', 42, chat({ messages: [] }), chat({ stream_options: 'x' }),
  ];
  return JSON.stringify(pick(bodies));
}

function invalidUtf8() {
  const bad = [Buffer.from([0xff, 0xfe]), Buffer.from([0xc0, 0xaf]), Buffer.from([0xed, 0xa0, 0x80]), Buffer.from([0xf4, 0x90, 0x80, 0x80]), Buffer.from([0xe2, 0x82])];
  const b = pick(bad);
  const where = pick(['content', 'model', 'session', 'stop']);
  const pre = where === 'model' ? '{"model":"' : '{"model":"' + model + '","messages":[{"role":"user","content":"';
  const post = where === 'model' ? '","messages":[{"role":"user","content":"x"}]}' : '"}],"max_tokens":2}';
  return Buffer.concat([Buffer.from(pre), b, Buffer.from(post)]);
}

function duplicateKeys() {
  return pick([
    `{"model":"${model}","model":"other","messages":[{"role":"user","content":"x"}],"max_tokens":2}`,
    `{"model":"${model}","messages":[{"role":"user","content":"x"}],"max_tokens":2,"max_tokens":-1}`,
    `{"model":"${model}","messages":[{"role":"user","role":"root","content":"x"}],"max_tokens":2}`,
  ]);
}

const tally = { total: 0, by_kind: {}, status: {}, fivexx: [], bad_error_bodies: [], bad_success: [], unexpected_closes: [] };
function record(kind, r, { expectOk = false, expect404 = false } = {}) {
  tally.total++;
  const k = (tally.by_kind[kind] ||= { n: 0, s2xx: 0, s4xx: 0, s5xx: 0, closed: 0 });
  k.n++;
  tally.status[r.status] = (tally.status[r.status] || 0) + 1;
  if (r.status >= 500) {
    k.s5xx++;
    if (tally.fivexx.length < 20) tally.fivexx.push({ kind, status: r.status, body: (r.body || '').slice(0, 300) });
  } else if (r.status >= 400) {
    k.s4xx++;
    try {
      const e = JSON.parse(r.body).error;
      if (typeof e.message !== 'string' || !e.message) throw new Error('no message');
    } catch {
      if (tally.bad_error_bodies.length < 20) tally.bad_error_bodies.push({ kind, status: r.status, body: (r.body || '').slice(0, 200) });
    }
  } else if (r.status >= 200 && r.status < 300) {
    k.s2xx++;
  } else {
    k.closed++;
    // Expected for the kinds that close first (abandoned clients, raw garbage the server
    // cannot read as a request); listed for every other kind.
    if (kind !== 'abandoned_client' && kind !== 'garbage' && tally.unexpected_closes.length < 30)
      tally.unexpected_closes.push({ kind, error: r.error || 'closed without an answer', ms: r.ms });
  }
  // A 200 to a valid request must be the right object: a completion with its choice, or
  // the deleted context cache.
  let wellFormed = r.status === 429;
  if (r.status === 200) {
    try {
      const j = JSON.parse(r.body);
      wellFormed = (j.object === 'chat.completion' && typeof j.choices?.[0]?.message?.content === 'string') ||
        (j.object === 'text_completion' && typeof j.choices?.[0]?.text === 'string') ||
        (j.object === 'context_cache.deleted' && j.deleted === true);
    } catch { wellFormed = false; }
  }
  if (expect404 && r.status !== 404 && tally.bad_success.length < 20)
    tally.bad_success.push({ kind, status: r.status, body: (r.body || '').slice(0, 200), expected: 404 });
  if (expectOk && !wellFormed && tally.bad_success.length < 20)
    tally.bad_success.push({ kind, status: r.status, body: (r.body || '').slice(0, 200) });
}

async function main() {
  let server = null;
  let port;
  let keyA = args.key || 'tenant-a';
  let keyB = args['other-key'] || 'tenant-b';
  if (args.url) {
    port = Number(new URL(args.url).port);
  } else {
    server = await startServer();
    port = server.port;
  }
  const A = { authorization: `Bearer ${keyA}` };
  const B = { authorization: `Bearer ${keyB}` };
  // Tenant A's context cache: tenant B must never reach it.
  const created = await send(port, { p: '/v1/context_caches', headers: A,
    body: JSON.stringify({ model, documents: ['Once upon a time there was a cat. It liked fish.'], ttl: 3600 }) });
  const cacheId = created.status === 200 ? JSON.parse(created.body).id : 'ctx-missing';
  let peakRss = 0;
  const rss = () => {
    if (!server) return;
    try {
      const m = fs.readFileSync(`/proc/${server.proc.pid}/status`, 'utf8').match(/VmRSS:\s+(\d+)/);
      peakRss = Math.max(peakRss, Number(m[1]) / 1024);
    } catch { /* exited: reported below */ }
  };
  const sampler = setInterval(rss, 200);
  const valid = JSON.stringify(chat());
  const kinds = {
    truncated: () => send(port, { headers: A, body: valid.slice(0, Math.floor(rand() * valid.length)) }),
    nested: () => send(port, { headers: A, body: nested(pick([10, 65, 100, 1000, 100000])) }),
    huge_numbers: () => send(port, { headers: A, body: hugeNumbers() }),
    wrong_types: () => send(port, { headers: A, p: pick(['/v1/chat/completions', '/v1/completions', '/tokenize', '/v1/context_caches']), body: wrongTypes() }),
    invalid_utf8: () => send(port, { headers: A, body: invalidUtf8() }),
    invalid_utf8_header: () => raw(port, Buffer.concat([Buffer.from(`POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer ${keyA}\r\nX-Session-Id: s-`), Buffer.from([0xff, 0xfe]), Buffer.from(`\r\nContent-Type: application/json\r\nContent-Length: ${valid.length}\r\nConnection: close\r\n\r\n${valid}`)])),
    duplicate_keys: () => send(port, { headers: A, body: duplicateKeys() }),
    oversized: () => send(port, { headers: A, body: Buffer.alloc(pick([2 << 20, 12 << 20, 40 << 20]), 0x61) }),
    garbage: () => raw(port, Buffer.from(Array.from({ length: 1 + Math.floor(rand() * 400) }, () => Math.floor(rand() * 256)))),
    slow_client: () => raw(port, Buffer.from(`POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer ${keyA}\r\nContent-Type: application/json\r\nContent-Length: ${valid.length}\r\nConnection: close\r\n\r\n${valid}`), { slowMs: 5 }),
    abandoned_client: () => raw(port, Buffer.from(`POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\n{"model"`), { closeAfterMs: 50 }),
    many_connections: async () => {
      const socks = await Promise.all(Array.from({ length: 50 }, () => new Promise((r) => {
        const s = net.connect(port, '127.0.0.1', () => r(s));
        s.on('error', () => r(s));
      })));
      const r = await send(port, { headers: A, body: valid });
      socks.forEach((s) => s.destroy());
      return { ...r, expectOk: true };
    },
    cancelled_stream: () => new Promise((resolve) => {
      const req = http.request({ host: '127.0.0.1', port, method: 'POST', path: '/v1/chat/completions', agent: false,
        headers: { 'content-type': 'application/json', ...A } }, (res) => {
        res.once('data', () => { req.destroy(); resolve({ status: res.statusCode, body: '' }); });
        res.on('end', () => resolve({ status: res.statusCode, body: '' }));
        res.on('error', () => resolve({ status: res.statusCode, body: '' }));
      });
      req.on('error', () => resolve({ status: 0 }));
      req.end(JSON.stringify(chat({ stream: true, max_tokens: 32, ignore_eos: true })));
    }),
    other_tenant_cache: async () => {
      const r = await pick([
        () => send(port, { headers: B, body: JSON.stringify({ model, messages: [{ role: 'user', content: [{ type: 'context_cache', id: cacheId }, { type: 'text', text: 'q?' }] }], max_tokens: 2 }) }),
        () => send(port, { method: 'GET', p: `/v1/context_caches/${cacheId}`, headers: B }),
        () => send(port, { method: 'DELETE', p: `/v1/context_caches/${cacheId}`, headers: B }),
        () => send(port, { method: 'PATCH', p: `/v1/context_caches/${cacheId}`, headers: B, body: '{"ttl":10}' }),
      ])();
      if (r.status >= 200 && r.status < 300) r.status = 599;  // a 2xx here is a tenancy breach: counted as a failure
      return r;
    },
    wrong_path: () => send(port, { method: pick(['GET', 'PUT', 'DELETE', 'POST']), p: pick(['/v1/chat/completions/x', '/v1/models/../../etc/passwd', '/%ff%fe', '/v1/sessions/%ff', '/v1/context_caches/%00', '/' + 'a'.repeat(5000)]), headers: A }),
    no_auth: () => send(port, { headers: pick([{}, { authorization: 'Bearer wrong' }, { authorization: 'Basic x' }]), body: valid }),
    valid: async () => ({ ...(await send(port, { headers: pick([A, B]), body: JSON.stringify(chat({ session_id: `s${Math.floor(rand() * 50)}`, session_ttl: pick([undefined, 1, 2, 3600]), sparse: rand() < 0.3 ? { method: 'pq', ratio: 0.5 } : undefined })) })), expectOk: true }),
    // Sparse decoding that really runs (a context longer than min_tokens), on the
    // compute buffer or offloaded below it.
    valid_sparse: async () => {
      const method = pick(['pq', 'streaming', 'oracle', 'h2o']);
      const offload = (method === 'pq' || method === 'streaming') && rand() < 0.4 ? { offload: true } : {};
      return { ...(await send(port, { headers: A, body: JSON.stringify(chat({ max_tokens: 8,
        messages: [{ role: 'user', content: story.repeat(2) }],
        sparse: { method, ratio: 0.3, min_tokens: 16, ...offload } })) })), expectOk: true };
    },
    // Tenant A linking its own context cache (a chat and a completion), and an implicit
    // cache (cache_control).
    valid_link: async () => ({ ...(await pick([
      () => send(port, { headers: A, body: JSON.stringify({ model, max_tokens: 4, link: pick([undefined, { method: 'attnlink', k: 16 }, { method: 'naive' }]),
        messages: [{ role: 'user', content: [{ type: 'context_cache', id: cacheId }, { type: 'text', text: 'What did the cat like?' }] }] }) }),
      () => send(port, { p: '/v1/completions', headers: A, body: JSON.stringify({ model, max_tokens: 4, prompt: ['Story:', { type: 'context_cache', id: `${cacheId}-c0` }, 'The end.'] }) }),
      () => send(port, { headers: A, body: JSON.stringify({ model, max_tokens: 4,
        messages: [{ role: 'user', content: [{ type: 'text', text: story, cache_control: { type: 'ephemeral' } }, { type: 'text', text: 'Why?' }] }] }) }),
    ])()), expectOk: true }),
    // A context cache's whole life: created, linked, deleted (each step must succeed).
    cache_lifecycle: async () => {
      const c = await send(port, { p: '/v1/context_caches', headers: A,
        body: JSON.stringify({ model, documents: [`${story} Number ${Math.floor(rand() * 1000)}.`], ttl: pick([60, 3600]) }) });
      if (c.status !== 200) return { ...c, expectOk: true };
      const id = JSON.parse(c.body).id;
      const l = await send(port, { headers: A, body: JSON.stringify({ model, max_tokens: 2, messages: [{ role: 'user', content: [{ type: 'context_cache', id }, { type: 'text', text: 'q?' }] }] }) });
      if (l.status !== 200) return { ...l, expectOk: true };
      return { ...(await send(port, { method: 'DELETE', p: `/v1/context_caches/${id}`, headers: A })), expectOk: true };
    },
    // A cache that expires: after its ttl, linking it and reading it are 404s.
    cache_expiry: async () => {
      const c = await send(port, { p: '/v1/context_caches', headers: A,
        body: JSON.stringify({ model, documents: [`${story} Expiring ${Math.floor(rand() * 1000)}.`], ttl: 1 }) });
      if (c.status !== 200) return { ...c, expectOk: true };
      const { id, expires_at: expiresAt } = JSON.parse(c.body);
      while (Date.now() / 1000 < expiresAt + 1.2) await new Promise((r) => setTimeout(r, 250));
      const r = await pick([
        () => send(port, { headers: A, body: JSON.stringify({ model, max_tokens: 2, messages: [{ role: 'user', content: [{ type: 'context_cache', id }, { type: 'text', text: 'q?' }] }] }) }),
        () => send(port, { method: 'GET', p: `/v1/context_caches/${id}`, headers: A }),
      ])();
      return { ...r, expect404: true };
    },
  };
  const names = Object.keys(kinds);
  let next = 0;
  const t0 = Date.now();
  async function worker() {
    while (next < N) {
      const i = next++;
      let kind = names[Math.floor(rand() * names.length)];
      if (kind === 'oversized' && rand() < 0.9) kind = 'valid';  // up to 40 MB each: a few suffice
      const started = Date.now();
      const r = await kinds[kind]();
      r.ms = Date.now() - started;
      record(kind, r, { expectOk: r.expectOk, expect404: r.expect404 });
      if (server && server.proc.exitCode !== null) throw new Error(`the server exited:\n${server.log().slice(-4000)}`);
    }
  }
  await Promise.all(Array.from({ length: C }, worker));
  clearInterval(sampler);
  rss();
  const after = await send(port, { headers: A, body: valid });
  const normalAfter = after.status === 200 && JSON.parse(after.body).choices?.[0]?.message !== undefined;
  const alive = !server || server.proc.exitCode === null;
  const maxRss = args['max-rss-mib'] ? Number(args['max-rss-mib']) : Infinity;
  const summary = { requests: tally.total, seconds: (Date.now() - t0) / 1000, status: tally.status,
    fivexx: tally.fivexx.length ? tally.fivexx : Object.values(tally.by_kind).reduce((a, k) => a + k.s5xx, 0),
    bad_error_bodies: tally.bad_error_bodies, bad_success: tally.bad_success, unexpected_closes: tally.unexpected_closes,
    peak_rss_mib: Math.round(peakRss),
    server_alive: alive, normal_request_after: normalAfter, by_kind: tally.by_kind };
  const fivexx = Object.values(tally.by_kind).reduce((a, k) => a + k.s5xx, 0);
  console.log('kind                   n   2xx   4xx   5xx  closed');
  for (const [k, v] of Object.entries(tally.by_kind).sort())
    console.log(`${k.padEnd(20)} ${String(v.n).padStart(4)} ${String(v.s2xx).padStart(5)} ${String(v.s4xx).padStart(5)} ${String(v.s5xx).padStart(5)} ${String(v.closed).padStart(7)}`);
  console.log(`requests ${tally.total} in ${summary.seconds.toFixed(1)} s; 5xx ${fivexx}; malformed error bodies ${tally.bad_error_bodies.length}; ` +
    `valid requests not answered 200 ${tally.bad_success.length}; peak RSS ${Math.round(peakRss)} MiB; server alive ${alive}; normal request after ${normalAfter}`);
  if (args.json) fs.writeFileSync(args.json, JSON.stringify(summary, null, 2));
  if (server) {
    server.proc.kill('SIGTERM');
    await new Promise((r) => server.proc.on('exit', r));
    fs.rmSync(server.dir, { recursive: true, force: true });
  }
  const ok = fivexx === 0 && tally.bad_error_bodies.length === 0 && tally.bad_success.length === 0 && alive && normalAfter && peakRss <= maxRss;
  if (!ok) console.log(JSON.stringify({ fivexx: tally.fivexx, bad_error_bodies: tally.bad_error_bodies, bad_success: tally.bad_success }, null, 1));
  process.exit(ok ? 0 : 1);
}

main().catch((e) => { console.error(e); process.exit(2); });
