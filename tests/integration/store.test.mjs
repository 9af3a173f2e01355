// The KV store through `attic serve` (paper 001): a conversation's next turn reuses its
// history from DRAM, from SSD (a DRAM tier too small to hold it), and after a restart;
// greedy answers equal recomputation (another tenant, which never shares KV); the
// session endpoints (one session, the paginated list) and the store's Prometheus
// counters. Resident (compute-buffer) reuse is off (--max-resident 0) so that every reuse
// comes from the store.
import { test, after } from 'node:test';
import assert from 'node:assert/strict';
import fs from 'node:fs';
import path from 'node:path';
import OpenAI from 'openai';
import { CursorPage } from 'openai/pagination';
import { startServer, stories, request, metrics, tmpRoot, longContextModel, until } from './lib/server.mjs';

const model = 'stories260K-hf';
const keys = ['k-conv', 'k-ref'];
const servers = [];
after(async () => {
  for (const s of servers) if (s.alive()) await s.stop();
});

async function start(extra) {
  const s = await startServer(['-m', stories, '--chat-template', 'chatml', '--max-resident', '0',
    ...keys.flatMap((k) => ['--api-key', k]), ...extra]);
  servers.push(s);
  return s;
}
const client = (s, apiKey) => new OpenAI({ apiKey, baseURL: s.baseURL, maxRetries: 0, timeout: 60000 });
const auth = { authorization: 'Bearer k-conv' };

// Two turns of one session; returns the second turn's response and its recomputation.
async function twoTurns(s, session) {
  const system = { role: 'system', content: 'You are a kind storyteller.' };
  const user1 = { role: 'user', content: 'Tell me about a cat named Tom.' };
  const t1 = await client(s, 'k-conv').chat.completions.create({
    model, messages: [system, user1], max_tokens: 24, temperature: 0, session_id: session });
  assert.equal(t1.usage.prompt_tokens_details.cached_tokens, 0);
  // GET waits for the session's queued save: turn 2 then reads its history from the tier
  // it was stored in, not from the write buffer.
  const stored = await request(s.port, { method: 'GET', path: `/v1/sessions/${session}`, headers: auth });
  assert.equal(stored.status, 200, stored.body);
  const messages = [system, user1, { role: 'assistant', content: t1.choices[0].message.content },
    { role: 'user', content: 'What did Tom do next?' }];
  const t2 = await client(s, 'k-conv').chat.completions.create({
    model, messages, max_tokens: 24, temperature: 0, session_id: session });
  const ref = await client(s, 'k-ref').chat.completions.create({ model, messages, max_tokens: 24, temperature: 0 });
  assert.equal(ref.usage.prompt_tokens_details.cached_tokens, 0);
  return { t1, t2, ref, messages };
}

test('next turn reuses its history from DRAM, exactly', async () => {
  const s = await start(['--kv-dram-bytes', String(64 << 20)]);
  const { t1, t2, ref } = await twoTurns(s, 'conv-dram');
  const cached = t2.usage.prompt_tokens_details.cached_tokens;
  assert.ok(cached >= 0.8 * t1.usage.prompt_tokens, `reused only ${cached} of ${t1.usage.prompt_tokens}`);
  assert.ok(cached < t2.usage.prompt_tokens);
  assert.equal(t2.choices[0].message.content, ref.choices[0].message.content);
  const m = await metrics(s.port);
  assert.ok(m['attic_kv_store_hits_total{tier="dram"}'] >= 1);
  assert.ok(m['attic_kv_store_reused_tokens_total'] >= cached);
  assert.ok(m['attic_kv_store_bytes{tier="dram"}'] <= m['attic_kv_store_capacity_bytes{tier="dram"}']);
  const info = await request(s.port, { method: 'GET', path: '/v1/sessions/conv-dram', headers: auth });
  assert.equal(info.status, 200, info.body);
  const j = JSON.parse(info.body);
  assert.equal(j.tier, 'dram');
  assert.ok(j.tokens > t2.usage.prompt_tokens);
  // Tenant-scoped: another key does not see it.
  const other = await request(s.port, { method: 'GET', path: '/v1/sessions/conv-dram',
    headers: { authorization: 'Bearer k-ref' } });
  assert.equal(other.status, 404);
  // A per-request TTL (extension field session_ttl, seconds): the session is freed after
  // its TTL (the store counts it expired, so it was kept, not dropped), polled until it is.
  const expiredBefore = (await metrics(s.port)).attic_kv_store_expired_total;
  const before = Date.now();
  await client(s, 'k-conv').chat.completions.create({ model, messages: [{ role: 'user', content: 'Hi' }],
    max_tokens: 4, temperature: 0, session_id: 'short', session_ttl: 1 });
  const after = Date.now();
  const live = await request(s.port, { method: 'GET', path: '/v1/sessions/short', headers: auth });
  if (live.status === 200) {  // (a 404 here: the machine was slower than the 1 s TTL)
    assert.ok(JSON.parse(live.body).expires_at * 1000 <= after + 1000, live.body);
  } else {
    assert.equal(live.status, 404, live.body);
    assert.ok(Date.now() >= before + 1000);
  }
  await until(async () => (await request(s.port, { method: 'GET', path: '/v1/sessions/short', headers: auth })).status === 404,
    'the 1 s session expired');
  assert.ok(Date.now() >= before + 1000, 'gone before its TTL');
  assert.ok((await metrics(s.port)).attic_kv_store_expired_total >= expiredBefore + 1);
  await s.stop();
});

test('from SSD, and after a restart; DELETE erases a session', async () => {
  const dir = path.join(tmpRoot, `kv-ssd-${process.pid}`);
  fs.rmSync(dir, { recursive: true, force: true });
  const args = ['--kv-dram-bytes', '1', '--kv-ssd-dir', dir, '--kv-ssd-bytes', String(256 << 20)];
  let s = await start(args);
  assert.match(s.log(), /attic: KV store: new store in /);
  const { t1, t2, ref, messages } = await twoTurns(s, 'conv-ssd');
  assert.ok(t2.usage.prompt_tokens_details.cached_tokens >= 0.8 * t1.usage.prompt_tokens);
  assert.equal(t2.choices[0].message.content, ref.choices[0].message.content);
  let m = await metrics(s.port);
  assert.ok(m['attic_kv_store_hits_total{tier="ssd"}'] >= 1);
  assert.ok(m['attic_kv_store_bytes{tier="ssd"}'] <= m['attic_kv_store_capacity_bytes{tier="ssd"}']);
  const r = await s.stop();
  assert.equal(r.code, 0);

  s = await start(args);
  assert.match(s.log(), /attic: KV store: restored [1-9]\d* entr(y|ies) \(\d+\.\d [KMG]iB\) from SSD /);
  const info = await request(s.port, { method: 'GET', path: '/v1/sessions/conv-ssd', headers: auth });
  assert.equal(info.status, 200, info.body);
  assert.equal(JSON.parse(info.body).tier, 'ssd');
  const more = [...messages, { role: 'assistant', content: t2.choices[0].message.content },
    { role: 'user', content: 'And then?' }];
  const t3 = await client(s, 'k-conv').chat.completions.create({
    model, messages: more, max_tokens: 16, temperature: 0, session_id: 'conv-ssd' });
  const ref3 = await client(s, 'k-ref').chat.completions.create({ model, messages: more, max_tokens: 16, temperature: 0 });
  assert.ok(t3.usage.prompt_tokens_details.cached_tokens >= t2.usage.prompt_tokens,
    `after restart reused ${t3.usage.prompt_tokens_details.cached_tokens}`);
  assert.equal(t3.choices[0].message.content, ref3.choices[0].message.content);

  const del = await request(s.port, { method: 'DELETE', path: '/v1/sessions/conv-ssd', headers: auth });
  assert.equal(del.status, 200, del.body);
  assert.equal(JSON.parse(del.body).deleted, true);
  const gone = await request(s.port, { method: 'GET', path: '/v1/sessions/conv-ssd', headers: auth });
  assert.equal(gone.status, 404);
  m = await metrics(s.port);
  assert.ok(m['attic_kv_store_lookups_total'] >= 1);
  await s.stop();
  fs.rmSync(dir, { recursive: true, force: true });
});

// Every regular file under `dir`, by relative path, with its bytes.
function snapshot(dir) {
  const out = new Map();
  for (const e of fs.readdirSync(dir, { recursive: true, withFileTypes: true })) {
    if (!e.isFile()) continue;
    const p = path.join(e.parentPath ?? e.path, e.name);
    out.set(path.relative(dir, p), fs.readFileSync(p));
  }
  return out;
}
function assertIntact(before, dir, when) {
  const now = snapshot(dir);
  for (const [p, bytes] of before) {
    assert.ok(now.has(p), `${p} was deleted (${when})`);
    assert.ok(now.get(p).equals(bytes), `${p} was changed (${when})`);
  }
}

// The directory: --kv-ssd-dir also holds the user's own files and, after a second
// model is served on it, that model's sessions. Nothing of either is touched, byte for
// byte, and the first model's session is served again when it comes back.
test('a shared --kv-ssd-dir: files not Attic\'s and another model\'s sessions stay intact', async () => {
  const dir = path.join(tmpRoot, `kv-shared-${process.pid}`);
  fs.rmSync(dir, { recursive: true, force: true });
  const args = ['--kv-dram-bytes', '1', '--kv-ssd-dir', dir, '--kv-ssd-bytes', String(256 << 20)];
  const saveSession = async (s, m, session) => {
    const r = await client(s, 'k-conv').completions.create({
      model: m, prompt: 'Once upon a time', max_tokens: 8, temperature: 0, session_id: session });
    assert.ok(r.usage.completion_tokens > 0);
    const stored = await request(s.port, { method: 'GET', path: `/v1/sessions/${session}`, headers: auth });
    assert.equal(stored.status, 200, stored.body);  // (waits for the queued save)
  };
  let s = await start(args);
  await saveSession(s, model, 'first-model');
  assert.equal((await s.stop()).code, 0);

  fs.writeFileSync(path.join(dir, 'notes.txt'), 'my notes\n');
  fs.writeFileSync(path.join(dir, 'data.tmp'), 'x'.repeat(3000));
  fs.writeFileSync(path.join(dir, 'my.kv'), 'not a KV entry');
  fs.mkdirSync(path.join(dir, 'sub'));
  fs.writeFileSync(path.join(dir, 'sub', 'a.kv'), 'a'.repeat(5000));
  const kept = snapshot(dir);
  assert.ok(kept.size >= 6);

  const other = longContextModel();
  const s2 = await startServer(['-m', other, ...keys.flatMap((k) => ['--api-key', k]), ...args]);
  servers.push(s2);
  assert.match(s2.log(), /attic: warning: KV store: 4 files in .* are not Attic's/);
  assert.match(s2.log(), /kept 1 entry of 1 other model \(.*\); ignored 4 files not Attic's/);
  await saveSession(s2, path.basename(other), 'second-model');
  assert.equal((await s2.stop()).code, 0);
  assertIntact(kept, dir, 'the second model');

  s = await start(args);
  assert.match(s.log(), /KV store: restored 1 entry .* kept 1 entry of 1 other model/);
  const info = await request(s.port, { method: 'GET', path: '/v1/sessions/first-model', headers: auth });
  assert.equal(info.status, 200, info.body);
  assert.equal(JSON.parse(info.body).tier, 'ssd');
  assert.equal((await s.stop()).code, 0);
  assertIntact(kept, dir, 'the first model again');
  fs.rmSync(dir, { recursive: true, force: true });
});

test('decoupled truncation: an overlong conversation is shortened in the store, not rejected', async () => {
  const s = await start(['--kv-dram-bytes', String(64 << 20), '--kv-truncate-ratio', '0.5', '--kv-truncate-keep', '4']);
  const ids = (n, from = 0) => Array.from({ length: n }, (_, i) => 20 + ((i + from) * 7) % 400);
  const c = client(s, 'k-conv');
  const t1 = await c.completions.create({ model, prompt: ids(400), max_tokens: 8, temperature: 0, session_id: 'trunc' });
  assert.equal(t1.usage.prompt_tokens, 400);
  const t2 = await c.completions.create({ model, prompt: ids(600), max_tokens: 8, temperature: 0, session_id: 'trunc' });
  assert.ok(t2.usage.prompt_tokens < 512, `prompt_tokens ${t2.usage.prompt_tokens}`);
  assert.ok(t2.usage.prompt_tokens_details.cached_tokens > 0);
  const m = await metrics(s.port);
  assert.ok(m['attic_kv_store_reused_tokens_total'] > 0);
  // A chat whose text is many times the window (here ~40k characters for 512 tokens) is
  // truncated too, not refused before tokenizing.
  const story = 'Once upon a time there was a little dog who liked to run in the park. '.repeat(560);
  const long = await c.chat.completions.create({
    model, messages: [{ role: 'user', content: story }], max_tokens: 4, temperature: 0, session_id: 'long-chat',
  });
  assert.ok(long.usage.prompt_tokens < 512, `prompt_tokens ${long.usage.prompt_tokens}`);
  await s.stop();
  // Without truncation both are 400-class errors.
  const plain = await start(['--kv-dram-bytes', String(64 << 20)]);
  await assert.rejects(client(plain, 'k-conv').completions.create({ model, prompt: ids(600), max_tokens: 8 }),
    (e) => e.status >= 400 && e.status < 500);
  await assert.rejects(client(plain, 'k-conv').chat.completions.create({
    model, messages: [{ role: 'user', content: story }], max_tokens: 4,
  }), (e) => e.status >= 400 && e.status < 500);
  await plain.stop();
});

test('GET /v1/sessions lists the tenant\'s sessions, paginated by cursor', async () => {
  const s = await start(['--kv-dram-bytes', String(64 << 20)]);
  const conv = client(s, 'k-conv');
  const ref = client(s, 'k-ref');
  const turn = (c, session_id) => c.chat.completions.create({
    model, messages: [{ role: 'user', content: `Tell me about ${session_id}.` }], max_tokens: 2, temperature: 0,
    session_id });
  // Created out of order; listed by session id.
  for (const id of ['s-3', 's-1', 's-5', 's-2', 's-4']) await turn(conv, id);
  await turn(ref, 'other-1');
  await conv.chat.completions.create({ model, messages: [{ role: 'user', content: 'No session.' }], max_tokens: 2 });

  const p1 = await conv.get('/sessions', { query: { limit: 2 } });
  assert.equal(p1.object, 'list');
  assert.deepEqual(p1.data.map((x) => x.id), ['s-1', 's-2']);
  assert.equal(p1.first_id, 's-1');
  assert.equal(p1.last_id, 's-2');
  assert.equal(p1.has_more, true);
  // Each item is exactly what GET /v1/sessions/{id} returns.
  for (const item of p1.data) {
    assert.deepEqual(item, await conv.get(`/sessions/${item.id}`));
    assert.equal(item.object, 'session');
    assert.equal(item.tier, 'dram');
    assert.ok(item.tokens > 0 && item.bytes > 0, JSON.stringify(item));
    assert.equal(typeof item.expires_at, 'number');
  }
  const p2 = await conv.get('/sessions', { query: { limit: 2, after: p1.last_id } });
  assert.deepEqual(p2.data.map((x) => x.id), ['s-3', 's-4']);
  assert.equal(p2.has_more, true);
  const p3 = await conv.get('/sessions', { query: { limit: 2, after: p2.last_id } });
  assert.deepEqual(p3.data.map((x) => x.id), ['s-5']);
  assert.equal(p3.has_more, false);
  // Default limit (20) holds them all.
  const all = await conv.get('/sessions');
  assert.deepEqual(all.data.map((x) => x.id), ['s-1', 's-2', 's-3', 's-4', 's-5']);
  assert.equal(all.has_more, false);
  // The client's auto-pagination walks every page.
  const walked = [];
  for await (const item of conv.getAPIList('/sessions', CursorPage, { query: { limit: 2 } })) walked.push(item.id);
  assert.deepEqual(walked, ['s-1', 's-2', 's-3', 's-4', 's-5']);
  // `after` is a position in id order: a session deleted between pages does not break it.
  await conv.delete('/sessions/s-2');
  const resumed = await conv.get('/sessions', { query: { limit: 2, after: 's-2' } });
  assert.deepEqual(resumed.data.map((x) => x.id), ['s-3', 's-4']);
  const past = await conv.get('/sessions', { query: { after: 's-5' } });
  assert.deepEqual(past, { object: 'list', data: [], first_id: null, last_id: null, has_more: false });
  // Tenant-scoped: the other key sees only its own.
  const other = await ref.get('/sessions');
  assert.deepEqual(other.data.map((x) => x.id), ['other-1']);
  // Bad parameters are OpenAI-style 400s naming the parameter; no key is a 401.
  for (const limit of [0, 101, 'x', -1, 2.5]) {
    await assert.rejects(conv.get('/sessions', { query: { limit } }), (e) => {
      assert.equal(e.status, 400, `limit ${limit}`);
      assert.equal(e.error.param, 'limit');
      return true;
    });
  }
  await assert.rejects(conv.get('/sessions', { query: { after: 'x'.repeat(300) } }),
    (e) => e.status === 400 && e.error.param === 'after');
  const noKey = await request(s.port, { method: 'GET', path: '/v1/sessions' });
  assert.equal(noKey.status, 401);
  const m = await metrics(s.port);
  assert.ok(m['attic_http_requests_total{endpoint="/v1/sessions",status="200"}'] >= 7);
  await s.stop();

  // Store off (explicitly: `attic serve` keeps a DRAM tier unless --kv-dram 0): an empty
  // list, not an error.
  const off = await start(['--kv-dram', '0']);
  assert.deepEqual(await client(off, 'k-conv').get('/sessions'),
    { object: 'list', data: [], first_id: null, last_id: null, has_more: false });
  await off.stop();
});
