// Context caches across several `attic serve` processes on one Redis Cluster (--kv-remote;
// docs/serving.md "Context caches", docs/store.md "Remote tier"), the real cluster of
// ctest's `redis_cluster` fixture (its seed nodes in ATTIC_REDIS_NODES): a cache created
// on server A is read, listed, patched, deleted and linked on server B; B links A's
// chunks from the cluster (no prefill) and answers exactly as A does; tenants stay apart
// on every server; expiry holds on every server; a chunk whose KV left the cluster is
// prefilled again on B, and B still answers as A does; a cluster that does not answer
// makes the cache endpoints 503, not 404.
//
// Both servers run --kv-remote-write back: sessions reach the cluster only when demoted,
// so what B finds there is the context chunks' write-through alone. Under --deterministic
// equal tokens give equal answers; a plain-text reference comes from a tenant that
// shares no KV with the others.
import { test, after } from 'node:test';
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import OpenAI from 'openai';
import { startServer, stories, request, metrics, until, is404 } from './lib/server.mjs';

const nodes = process.env.ATTIC_REDIS_NODES || '';
const skip = nodes ? false : 'no Redis Cluster: run through ctest (fixture redis_cluster)';
const model = 'stories260K-hf';
// API keys of this run (tenants), so that caches an earlier run left in a cluster are not ours.
const run = `${process.pid}-${Date.now()}`;
const key = (name) => `k-${name}-${run}`;
const keys = ['x', 'y', 'z', 'w', 'v', 'ref'].map(key);
const servers = [];
after(async () => {
  for (const s of servers) if (s.alive()) await s.stop();
});

async function start() {
  const s = await startServer(['-m', stories, '--chat-template', 'chatml', '--deterministic', '--max-resident', '0',
    '--kv-dram', '64M', '--kv-remote', `redis://${nodes}`, '--kv-remote-write', 'back',
    '--kv-remote-timeout', '1000', ...keys.flatMap((k) => ['--api-key', k])]);
  servers.push(s);
  return s;
}
const client = (s, apiKey) => new OpenAI({ apiKey, baseURL: s.baseURL, maxRetries: 0, timeout: 60000 });
const ports = () => nodes.split(',').map((n) => n.split(':')[1]);
const cli = (port, ...args) => execFileSync('redis-cli', ['-c', '-p', port, ...args], { encoding: 'utf8' }).trim();

// Chunks that tokenize on their own as inside a text where a space precedes them, so the
// plain text joining the pieces with spaces has the linked prompt's tokens.
const chunkTexts = [
  'Tom had a red ball. He liked to play with it in the park every day.',
  'Lily saw a big dog near the tree. The dog was happy and ran to her.',
  'The sun went down and the sky was pink. They all went home to sleep.',
];
const ask = 'Who is in the story?';
const text = (t) => ({ type: 'text', text: t });
const cachePart = (id) => ({ type: 'context_cache', id });
const chat = (c, parts, extra = {}) => c.chat.completions.create({
  model, messages: [{ role: 'user', content: parts }], max_tokens: 24, temperature: 0, ...extra });
const raw = (s, apiKey, method, path, body) => request(s.port, { method, path: `/v1${path}`,
  headers: { authorization: `Bearer ${apiKey}` }, body: body === undefined ? undefined : JSON.stringify(body) });

async function assertNotFound(promise, what) {
  await assert.rejects(promise, (e) => {
    assert.equal(e.status, 404, `${what}: ${e.message}`);
    assert.equal(e.error.code, 'context_cache_not_found', what);
    return true;
  }, what);
}
const rawNotFound = (r, what) => {
  assert.equal(r.status, 404, `${what}: ${r.body}`);
  assert.equal(JSON.parse(r.body).error.code, 'context_cache_not_found', what);
};
const remoteHits = (m) => m['attic_context_chunk_hits_total{tier="remote"}'] || 0;
const chunkMisses = (m) => m['attic_context_chunk_misses_total'] || 0;

test('a cache created on one server is read, listed and linked on another, answering identically', { skip },
  async () => {
    const [a, b] = [await start(), await start()];
    const ca = client(a, key('x')), cb = client(b, key('x'));
    const ma0 = await metrics(a.port);
    const made = await ca.post('/context_caches', { body: { model, chunks: chunkTexts, display_name: 'tales', ttl: 600 } });
    assert.match(made.id, /^ctx-[0-9a-f]{24}$/);
    assert.equal(made.chunks.length, 3);
    assert.equal(made.usage.cached_tokens, 0);
    // The chunks' KV went to the cluster although sessions are written back.
    const ma1 = await metrics(a.port);
    assert.equal(ma1['attic_kv_store_write_throughs_total'] - ma0['attic_kv_store_write_throughs_total'], 3);

    // B reads and lists what A created.
    const seen = await cb.get(`/context_caches/${made.id}`);
    for (const f of ['id', 'object', 'model', 'display_name', 'created_at', 'expires_at', 'n_tokens', 'chunks'])
      assert.deepEqual(seen[f], made[f], f);
    const listed = await cb.get('/context_caches', { query: { limit: 100 } });
    assert.deepEqual(listed.data.map((c) => c.id), [made.id]);
    assert.equal(listed.has_more, false);

    // Linking: naive uses every cached token as stored, so equal answers on A and B mean
    // B linked the same KV. B found every chunk in the cluster and prefilled none.
    const parts = [text('Read:'), cachePart(made.id), text(ask)];
    const mb0 = await metrics(b.port);
    const onB = await chat(cb, parts, { link: { method: 'naive' } });
    const mb1 = await metrics(b.port);
    assert.equal(onB.usage.prompt_tokens_details.cached_tokens, made.n_tokens);
    assert.equal(remoteHits(mb1) - remoteHits(mb0), 3);
    assert.equal(chunkMisses(mb1) - chunkMisses(mb0), 0);
    assert.equal(mb1['attic_kv_store_shared_found_total'] - mb0['attic_kv_store_shared_found_total'], 3);
    const onA = await chat(ca, parts, { link: { method: 'naive' } });
    assert.equal(onA.usage.prompt_tokens_details.cached_tokens, made.n_tokens);
    assert.ok(onA.choices[0].message.content.length > 0);
    assert.equal(onB.choices[0].message.content, onA.choices[0].message.content);
    // A second creation of the same chunks on B costs nothing: they are in the cluster.
    const again = await cb.post('/context_caches', { body: { model, chunks: chunkTexts } });
    assert.equal(again.usage.cached_tokens, made.n_tokens);

    // An exact method equals recomputation of the plain text (a tenant with no KV of it).
    const wideB = await chat(cb, parts, { link: { method: 'attnlink', k: 4096 } });
    const ref = await chat(client(b, key('ref')), [text(['Read:', ...chunkTexts, ask].join(' '))]);
    assert.equal(ref.usage.prompt_tokens_details.cached_tokens, 0);
    assert.equal(wideB.usage.prompt_tokens, ref.usage.prompt_tokens);
    assert.equal(wideB.choices[0].message.content, ref.choices[0].message.content);
  });

test('a patch on one server is seen on the other; a delete is a 404 everywhere; tenants stay apart', { skip },
  async () => {
    const [a, b] = [await start(), await start()];
    const ca = client(a, key('z')), cb = client(b, key('z'));
    const made = await ca.post('/context_caches', { body: { model, chunks: chunkTexts.slice(0, 2), ttl: 600 } });
    // Another tenant, on either server: no such cache, to read, link, patch, delete or list.
    for (const s of [a, b]) {
      const other = client(s, key('w'));
      await assertNotFound(other.get(`/context_caches/${made.id}`), 'foreign get');
      await assertNotFound(chat(other, [cachePart(made.id), text(ask)]), 'foreign link');
      await assertNotFound(chat(other, [cachePart(`${made.id}-c1`), text(ask)]), 'foreign chunk link');
      await assertNotFound(other.patch(`/context_caches/${made.id}`, { body: { ttl: 60 } }), 'foreign patch');
      await assertNotFound(other.delete(`/context_caches/${made.id}`), 'foreign delete');
      const page = await other.get('/context_caches');
      assert.ok(!page.data.some((c) => c.id === made.id), 'foreign list');
    }

    // PATCH on B, seen on A (the expiry; nothing else changes).
    const before = Date.now();  // B reads its clock between before and after
    const patched = await cb.patch(`/context_caches/${made.id}`, { body: { ttl: 7200 } });
    const after = Date.now();
    assert.ok(patched.expires_at >= Math.floor(before / 1000) + 7200 &&
      patched.expires_at <= Math.floor(after / 1000) + 7200, JSON.stringify(patched));
    const onA = await ca.get(`/context_caches/${made.id}`);
    assert.equal(onA.expires_at, patched.expires_at);
    assert.deepEqual(onA.chunks, made.chunks);
    // Bad input is the same 400 as without the cluster.
    const bad = await raw(b, key('z'), 'PATCH', `/context_caches/${made.id}`, { ttl: 0 });
    assert.equal(bad.status, 400, bad.body);
    assert.equal(JSON.parse(bad.body).error.param, 'ttl');

    // DELETE on A: 404 on B for every use, and the delete is not repeated.
    const deleted = await ca.delete(`/context_caches/${made.id}`);
    assert.deepEqual(deleted, { id: made.id, object: 'context_cache.deleted', deleted: true });
    rawNotFound(await raw(b, key('z'), 'GET', `/context_caches/${made.id}`), 'get after delete');
    await assertNotFound(cb.get(`/context_caches/${made.id}`), 'get after delete');
    await assertNotFound(chat(cb, [cachePart(made.id), text(ask)]), 'link after delete');
    await assertNotFound(cb.patch(`/context_caches/${made.id}`, { body: { ttl: 60 } }), 'patch after delete');
    await assertNotFound(cb.delete(`/context_caches/${made.id}`), 'delete after delete');
    assert.ok(!(await cb.get('/context_caches')).data.some((c) => c.id === made.id));
  });

test('a cache expires on every server at its time', { skip }, async () => {
  const [a, b] = [await start(), await start()];
  const ca = client(a, key('y')), cb = client(b, key('y'));
  const brief = await ca.post('/context_caches', { body: { model, chunks: [chunkTexts[2]], ttl: 600 } });
  const kept = await cb.post('/context_caches', { body: { model, chunks: [chunkTexts[0]], ttl: 600 } });
  assert.equal((await cb.get(`/context_caches/${brief.id}`)).id, brief.id);
  // Pages of one across both servers' caches, in creation order.
  const first = await ca.get('/context_caches', { query: { limit: 1 } });
  assert.deepEqual([first.data.map((c) => c.id), first.has_more], [[brief.id], true]);
  const second = await cb.get('/context_caches', { query: { limit: 1, after: brief.id } });
  assert.deepEqual([second.data.map((c) => c.id), second.has_more], [[kept.id], false]);
  // B gives it 1 s more (found live there), then it is polled until gone on both servers.
  const expiring = await cb.patch(`/context_caches/${brief.id}`, { body: { ttl: 1 } });
  for (const c of [ca, cb]) await until(() => is404(c.get(`/context_caches/${brief.id}`)), 'the 1 s cache expired');
  assert.ok(Date.now() >= expiring.expires_at * 1000, 'gone before its expiry');
  for (const c of [ca, cb]) {
    await assertNotFound(c.get(`/context_caches/${brief.id}`), 'expired get');
    await assertNotFound(chat(c, [cachePart(brief.id), text(ask)]), 'expired link');
    assert.deepEqual((await c.get('/context_caches')).data.map((x) => x.id), [kept.id]);
  }
});

test('a chunk whose KV left the cluster is prefilled again, never made up', { skip }, async () => {
  const [a, b] = [await start(), await start()];
  const ca = client(a, key('v')), cb = client(b, key('v'));
  const made = await ca.post('/context_caches', { body: { model, chunks: [chunkTexts[1], chunkTexts[2]], ttl: 600 } });
  // Every KV entry (and session pointer) of the default prefix leaves the cluster; the
  // cache's record stays.
  for (const p of ports()) {
    for (const k of cli(p, '--scan', '--pattern', 'attic:kv:*').split('\n').concat(
      cli(p, '--scan', '--pattern', 'attic:session:*').split('\n'))) {
      if (k) cli(p, 'DEL', k);
    }
  }
  const parts = [text('Read:'), cachePart(made.id), text(ask)];
  const mb0 = await metrics(b.port);
  const onB = await chat(cb, parts, { link: { method: 'naive' } });
  const mb1 = await metrics(b.port);
  assert.equal(chunkMisses(mb1) - chunkMisses(mb0), 2);
  assert.equal(remoteHits(mb1) - remoteHits(mb0), 0);
  const onA = await chat(ca, parts, { link: { method: 'naive' } });  // A's chunks are in its DRAM
  assert.equal(onB.choices[0].message.content, onA.choices[0].message.content);
});

test('a cluster that does not answer is a 503, never a 404 that would say a cache is gone', async () => {
  // Nothing listens on port 1: every call to the cluster fails at once.
  const s = await startServer(['-m', stories, '--chat-template', 'chatml', '--max-resident', '0', '--kv-dram', '64M',
    '--kv-remote', 'redis://127.0.0.1:1', '--kv-remote-timeout', '200', '--api-key', key('x')]);
  servers.push(s);
  const c = client(s, key('x'));
  const id = 'ctx-0123456789abcdef01234567';
  const unavailable = (what) => (e) => {
    assert.equal(e.status, 503, `${what}: ${e.message}`);
    assert.equal(e.error.code, 'unavailable', what);
    return true;
  };
  await assert.rejects(c.get(`/context_caches/${id}`), unavailable('get'));
  await assert.rejects(c.get('/context_caches'), unavailable('list'));
  await assert.rejects(c.patch(`/context_caches/${id}`, { body: { ttl: 60 } }), unavailable('patch'));
  await assert.rejects(c.delete(`/context_caches/${id}`), unavailable('delete'));
  await assert.rejects(chat(c, [cachePart(id), text(ask)]), unavailable('link'));
  await assert.rejects(c.post('/context_caches', { body: { model, chunks: [chunkTexts[0]] } }), unavailable('create'));
  // Input errors are still 400s, and a request without caches is served.
  const bad = await raw(s, key('x'), 'POST', '/context_caches', { model, chunks: [] });
  assert.equal(bad.status, 400, bad.body);
  const plain = await chat(c, [text(ask)]);
  assert.ok(plain.choices[0].message.content.length > 0);
});
