// Context caches through `attic serve` (paper 002): the /v1/context_caches endpoints
// (create from documents or pre-split chunks, get, list, patch, delete, expiry, tenant
// isolation), context_cache content parts in chat and completion prompts linked by each
// method, implicit caching of cache_control text parts, input errors, and caches that
// survive a restart and lost or corrupt files.
//
// The reference for an answer is the same text sent as plain text by another tenant,
// which shares no KV with the first: computed from scratch (Fully-Recompute). Under
// --deterministic equal tokens give equal answers, so "full", and an attnlink whose
// window covers every chunk, must answer exactly as the reference. Every request that
// links is made by a tenant that has sent nothing else with the same beginning (a fresh
// API key), so that the store's prefix reuse of an earlier turn does not stand in for
// linking and cached_tokens counts linked chunks only.
import { test, after } from 'node:test';
import assert from 'node:assert/strict';
import fs from 'node:fs';
import path from 'node:path';
import OpenAI from 'openai';
import { CursorPage } from 'openai/pagination';
import { startServer, stories, request, metrics, tmpRoot, until, is404, parseError } from './lib/server.mjs';

const model = 'stories260K-hf';
const servers = [];
after(async () => {
  for (const s of servers) if (s.alive()) await s.stop();
});

// Tenants: one API key each, handed out once (fresh()).
const keys = Array.from({ length: 64 }, (_, i) => `k-tenant-${i}`);
const keyFile = path.join(tmpRoot, `context-caches-keys-${process.pid}`);
fs.mkdirSync(tmpRoot, { recursive: true });
fs.writeFileSync(keyFile, keys.join('\n') + '\n');
after(() => fs.rmSync(keyFile, { force: true }));
let nextKey = 0;
function freshKey() {
  assert.ok(nextKey < keys.length, 'out of tenants');
  return keys[nextKey++];
}

async function start(extra = []) {
  const s = await startServer(['-m', stories, '--chat-template', 'chatml', '--deterministic', '--max-resident', '0',
    '--api-key-file', keyFile, ...extra]);
  servers.push(s);
  return s;
}
const client = (s, apiKey) => new OpenAI({ apiKey, baseURL: s.baseURL, maxRetries: 0, timeout: 60000 });
const fresh = (s) => client(s, freshKey());
// For the endpoints called without the client (/tokenize, /v1/context_caches without a key).
const auth = { authorization: `Bearer ${keys[keys.length - 1]}` };

// Pre-split chunks: each tokenizes on its own as it does inside a text where a space
// precedes it (SentencePiece's "▁" before the first word), so a plain text joining the
// same pieces with spaces has exactly the linked prompt's tokens (checked by sameTokens).
const chunkTexts = [
  'Tom had a red ball. He liked to play with it in the park every day.',
  'Lily saw a big dog near the tree. The dog was happy and ran to her.',
  'The sun went down and the sky was pink. They all went home to sleep.',
];
const ask = 'Who is in the story?';
const createCache = (c, body) => c.post('/context_caches', { body: { model, ...body } });
const chunkId = (cache, i) => `${cache.id}-c${i}`;
const cachePart = (id) => ({ type: 'context_cache', id });
const text = (t) => ({ type: 'text', text: t });
// A one-message chat whose user content is `parts`.
const chat = (c, parts, extra = {}) => c.chat.completions.create({
  model, messages: [{ role: 'user', content: parts }], max_tokens: 24, temperature: 0, ...extra });

// Asserts that the pieces, tokenized one by one, are the tokens of the plain text joining
// them with spaces (else the reference would not be the same prompt).
async function sameTokens(s, pieces) {
  const tok = async (prompt) => (await request(s.port, { path: '/tokenize', headers: auth,
    body: JSON.stringify({ prompt, add_special_tokens: false }) })).body;
  const ids = [];
  for (const p of pieces) ids.push(...JSON.parse(await tok(p)).tokens);
  assert.deepEqual(JSON.parse(await tok(pieces.join(' '))).tokens, ids, `pieces ${JSON.stringify(pieces)}`);
}

// The reference: the same user text, plain, from a tenant of its own.
async function reference(s, pieces, extra = {}) {
  await sameTokens(s, pieces);
  const r = await chat(fresh(s), pieces.join(' '), extra);
  assert.equal(r.usage.prompt_tokens_details.cached_tokens, 0);
  return r;
}

function assertNotFound(e, what) {
  assert.equal(e.status, 404, what);
  assert.equal(e.error.code, 'context_cache_not_found', what);
  assert.equal(typeof e.error.message, 'string');
  return true;
}

test('create from documents and chunks; get, list, patch, delete, expiry; tenants are isolated', async () => {
  const s = await start(['--kv-dram', '64M']);
  const c = fresh(s);
  // Documents, split semantically: short paragraphs, each within max_tokens but no two
  // together, so every paragraph is one chunk (the blank line after it kept with it).
  const paragraphs = [chunkTexts[0], chunkTexts[1], chunkTexts[2]];
  const doc = paragraphs.join('\n\n');
  const made = await createCache(c, { documents: [doc, { text: 'Ben ate a cake.' }],
    split: { method: 'semantic', max_tokens: 40 }, display_name: 'stories' });
  assert.equal(made.object, 'context_cache');
  assert.match(made.id, /^ctx-[0-9a-f]{24}$/);
  assert.equal(made.model, model);
  assert.equal(made.display_name, 'stories');
  assert.equal(made.bos, true);
  assert.equal(made.chunks.length, 4, JSON.stringify(made.chunks));
  made.chunks.forEach((ch, i) => {
    assert.equal(ch.id, chunkId(made, i));
    assert.ok(ch.n_tokens >= 1 && ch.n_tokens <= 40, JSON.stringify(ch));
  });
  assert.equal(made.n_tokens, made.chunks.reduce((a, ch) => a + ch.n_tokens, 0));
  assert.deepEqual(made.usage, { prompt_tokens: made.n_tokens, cached_tokens: 0 });
  // Each chunk is what the split promises: a paragraph with its blank line, as a run of
  // the document's own encoding (so the document up to the end of chunk i's paragraph
  // encodes to chunks 0..i; "\n" is a token of its own here).
  const count = async (prompt) => JSON.parse((await request(s.port, { path: '/tokenize', headers: auth,
    body: JSON.stringify({ prompt, add_special_tokens: false }) })).body).count;
  const prefixes = [paragraphs[0] + '\n\n', paragraphs.slice(0, 2).join('\n\n') + '\n\n', doc];
  for (let i = 0; i < prefixes.length; ++i) {
    const upTo = made.chunks.slice(0, i + 1).reduce((a, ch) => a + ch.n_tokens, 0);
    assert.equal(await count(prefixes[i]), upTo, `chunks 0..${i}`);
  }
  assert.equal(await count('Ben ate a cake.'), made.chunks[3].n_tokens, 'chunk 3');
  assert.ok(Math.abs(made.expires_at - made.created_at - 3600) <= 1, 'default ttl 1 h');
  // The same chunks again: content-addressed, nothing to prefill.
  const again = await createCache(c, { documents: [doc, 'Ben ate a cake.'], split: { method: 'semantic', max_tokens: 40 } });
  assert.notEqual(again.id, made.id);
  assert.deepEqual(again.usage, { prompt_tokens: made.n_tokens, cached_tokens: made.n_tokens });
  // Pre-split chunks are taken as they are, each encoded on its own; ttl as Gemini's "300s".
  const pre = await createCache(c, { chunks: [...chunkTexts, 'Ben ate a cake.'], ttl: '300s' });
  assert.equal(pre.chunks.length, 4);
  assert.equal(pre.display_name, '');
  assert.ok(Math.abs(pre.expires_at - pre.created_at - 300) <= 1);
  // The first pre-split chunk is the first paragraph without its blank line.
  assert.ok(pre.chunks[0].n_tokens < made.chunks[0].n_tokens);
  // A one-chunk document is its own encoding, the same tokens as the pre-split chunk.
  assert.equal(pre.chunks[3].n_tokens, made.chunks[3].n_tokens);
  assert.equal(pre.usage.cached_tokens, pre.chunks[3].n_tokens, 'the last chunk was stored already');

  // GET returns the object without usage.
  const { usage, ...object } = made;
  assert.deepEqual(await c.get(`/context_caches/${made.id}`), object);

  // List: creation order, cursor pagination, the client's auto-pagination.
  const more = [];
  for (let i = 0; i < 3; ++i) more.push(await createCache(c, { chunks: [`Story number ${i} is short.`] }));
  const ids = [made.id, again.id, pre.id, ...more.map((m) => m.id)];
  const p1 = await c.get('/context_caches', { query: { limit: 2 } });
  assert.equal(p1.object, 'list');
  assert.deepEqual(p1.data.map((x) => x.id), ids.slice(0, 2));
  assert.equal(p1.first_id, ids[0]);
  assert.equal(p1.last_id, ids[1]);
  assert.equal(p1.has_more, true);
  assert.deepEqual(p1.data[0], object);
  const p2 = await c.get('/context_caches', { query: { limit: 4, after: p1.last_id } });
  assert.deepEqual(p2.data.map((x) => x.id), ids.slice(2, 6));
  assert.equal(p2.has_more, false);
  const walked = [];
  for await (const item of c.getAPIList('/context_caches', CursorPage, { query: { limit: 2 } })) walked.push(item.id);
  assert.deepEqual(walked, ids);
  for (const limit of [0, 101, 'x']) {
    await assert.rejects(c.get('/context_caches', { query: { limit } }),
      (e) => e.status === 400 && e.error.param === 'limit');
  }

  // PATCH: ttl or expire_at.
  // The server reads its clock between `before` and `after`: expires_at (whole seconds) is
  // bracketed exactly, however slow the request.
  const before = Date.now();
  const patched = await c.patch(`/context_caches/${pre.id}`, { body: { ttl: 7200 } });
  const after = Date.now();
  assert.ok(patched.expires_at >= Math.floor(before / 1000) + 7200 &&
    patched.expires_at <= Math.floor(after / 1000) + 7200, JSON.stringify(patched));
  assert.equal((await c.get(`/context_caches/${pre.id}`)).expires_at, patched.expires_at);
  const at = Math.floor(Date.now() / 1000) + 600;
  assert.equal((await c.patch(`/context_caches/${pre.id}`, { body: { expire_at: at } })).expires_at, at);

  // DELETE, then 404 everywhere; `after` a deleted id still pages.
  const del = await c.delete(`/context_caches/${more[0].id}`);
  assert.deepEqual(del, { id: more[0].id, object: 'context_cache.deleted', deleted: true });
  await assert.rejects(c.get(`/context_caches/${more[0].id}`), (e) => assertNotFound(e, 'get deleted'));
  await assert.rejects(c.delete(`/context_caches/${more[0].id}`), (e) => assertNotFound(e, 'delete deleted'));
  await assert.rejects(c.patch(`/context_caches/${more[0].id}`, { body: { ttl: 60 } }),
    (e) => assertNotFound(e, 'patch deleted'));
  await assert.rejects(chat(c, [text('Read:'), cachePart(more[0].id)]), (e) => assertNotFound(e, 'chat deleted'));
  const resumed = await c.get('/context_caches', { query: { after: more[0].id } });
  assert.deepEqual(resumed.data.map((x) => x.id), ids.slice(4));

  // Expiry: a cache given 1 s more (the PATCH finds it live) is gone after it, polled
  // until it is (no sleep that guesses how late the server is).
  const short = await createCache(c, { chunks: ['A tiny bird sang.'], ttl: 600 });
  assert.equal((await c.get(`/context_caches/${short.id}`)).id, short.id);
  const expiring = await c.patch(`/context_caches/${short.id}`, { body: { ttl: 1 } });
  await until(() => is404(c.get(`/context_caches/${short.id}`)), 'the 1 s cache expired');
  assert.ok(Date.now() >= expiring.expires_at * 1000, 'gone before its expiry');
  await assert.rejects(c.get(`/context_caches/${short.id}`), (e) => assertNotFound(e, 'get expired'));
  await assert.rejects(chat(c, [text('Read:'), cachePart(short.id)]), (e) => assertNotFound(e, 'chat expired'));
  assert.ok(!(await c.get('/context_caches')).data.some((x) => x.id === short.id));

  // Another tenant: the same 404 as an unknown id, on every endpoint and in a prompt, and
  // nothing of the cache in the answer.
  const other = fresh(s);
  for (const id of [pre.id, chunkId(pre, 1)]) {
    await assert.rejects(other.get(`/context_caches/${id}`), (e) => assertNotFound(e, 'other get'));
    await assert.rejects(other.patch(`/context_caches/${id}`, { body: { ttl: 60 } }),
      (e) => assertNotFound(e, 'other patch'));
    await assert.rejects(other.delete(`/context_caches/${id}`), (e) => assertNotFound(e, 'other delete'));
    await assert.rejects(chat(other, [text('Read:'), cachePart(id), text(ask)]), (e) => {
      assertNotFound(e, 'other chat');
      assert.ok(!e.message.includes('Tom') && !e.message.includes('Lily'), e.message);
      return true;
    });
    await assert.rejects(other.completions.create({ model, prompt: ['Read:', cachePart(id)], max_tokens: 4 }),
      (e) => assertNotFound(e, 'other completion'));
  }
  await assert.rejects(other.get('/context_caches/ctx-000000000000000000000000'), (e) => assertNotFound(e, 'unknown'));
  assert.deepEqual((await other.get('/context_caches')).data, []);
  // ... and the owner's cache is untouched by those attempts.
  assert.equal((await c.get(`/context_caches/${pre.id}`)).expires_at, at);
  const noKey = await request(s.port, { method: 'GET', path: '/v1/context_caches' });
  assert.equal(noKey.status, 401);
  const m = await metrics(s.port);
  assert.ok(m['attic_http_requests_total{endpoint="/v1/context_caches",status="200"}'] >= 15);  // 7 POST, 8 GET
  assert.ok(m['attic_http_requests_total{endpoint="/v1/context_caches/{id}",status="404"}'] >= 10);
  assert.equal(m['attic_http_requests_total{endpoint="/v1/context_caches",status="401"}'], 1);
  await s.stop();

  // Without the KV store (explicitly off: `attic serve` keeps a DRAM tier unless
  // --kv-dram 0) there are no context caches.
  const off = await start(['--kv-dram', '0']);
  const oc = fresh(off);
  await assert.rejects(createCache(oc, { chunks: ['x'] }),
    (e) => e.status === 404 && e.error.code === 'context_caches_unavailable');
  await assert.rejects(oc.get('/context_caches'), (e) => e.status === 404 && e.error.code === 'context_caches_unavailable');
  await assert.rejects(chat(oc, [text('Read:'), cachePart(pre.id)]), (e) => assertNotFound(e, 'store off'));
  // cache_control is a hint: without the store the text is plain text.
  const hinted = await chat(oc, [{ type: 'text', text: chunkTexts[0], cache_control: { type: 'ephemeral' } }, text(ask)]);
  const plain = await chat(fresh(off), `${chunkTexts[0]}${ask}`);
  assert.equal(hinted.choices[0].message.content, plain.choices[0].message.content);
  assert.equal(hinted.usage.prompt_tokens, plain.usage.prompt_tokens);
  await off.stop();
});

test('chat with cache parts: reordered, repeated, between text, a whole cache; each link method', async () => {
  const s = await start(['--kv-dram', '64M']);
  // A fresh tenant with its own cache of the three chunks.
  const tenant = async () => {
    const c = fresh(s);
    const cache = await createCache(c, { chunks: chunkTexts });
    assert.equal(cache.chunks.length, 3);
    return { c, cache, n: cache.chunks.map((ch) => ch.n_tokens) };
  };
  // Each case: the content parts from a cache, the plain pieces they stand for, and the
  // chunk tokens the prompt holds.
  const cases = {
    reordered: {
      parts: (k) => [text('Read:'), cachePart(chunkId(k, 2)), cachePart(chunkId(k, 0)), cachePart(chunkId(k, 1)), text(ask)],
      pieces: ['Read:', chunkTexts[2], chunkTexts[0], chunkTexts[1], ask],
      chunkTokens: (n) => n[2] + n[0] + n[1],
    },
    twice: {
      parts: (k) => [text('Read:'), cachePart(chunkId(k, 1)), text('Again:'), cachePart(chunkId(k, 1)), text(ask)],
      pieces: ['Read:', chunkTexts[1], 'Again:', chunkTexts[1], ask],
      chunkTokens: (n) => 2 * n[1],
    },
    between: {
      parts: (k) => [text('First:'), cachePart(chunkId(k, 0)), text('Then:'), cachePart(chunkId(k, 2)), text(ask)],
      pieces: ['First:', chunkTexts[0], 'Then:', chunkTexts[2], ask],
      chunkTokens: (n) => n[0] + n[2],
    },
    whole: {
      parts: (k) => [text('Read:'), cachePart(k.id), text(ask)],
      pieces: ['Read:', ...chunkTexts, ask],
      chunkTokens: (n) => n[0] + n[1] + n[2],
    },
  };
  for (const [name, cs] of Object.entries(cases)) {
    const ref = await reference(s, cs.pieces);
    const answer = ref.choices[0].message.content;
    assert.ok(answer.length > 0);

    // full: Fully-Recompute, nothing cached used.
    let t = await tenant();
    const full = await chat(t.c, cs.parts(t.cache), { link: { method: 'full' } });
    assert.equal(full.usage.prompt_tokens, ref.usage.prompt_tokens, name);
    assert.equal(full.choices[0].message.content, answer, `${name}: full`);
    assert.equal(full.usage.prompt_tokens_details.cached_tokens, 0, name);
    assert.equal(full.usage.prompt_tokens_details.recomputed_tokens, 0, name);

    // attnlink with a window larger than any chunk: every cached token is recomputed.
    t = await tenant();
    const wide = await chat(t.c, cs.parts(t.cache), { link: { method: 'attnlink', k: 4096 } });
    assert.equal(wide.choices[0].message.content, answer, `${name}: attnlink 4096`);
    assert.equal(wide.usage.prompt_tokens_details.recomputed_tokens, cs.chunkTokens(t.n), name);
    assert.equal(wide.usage.prompt_tokens_details.cached_tokens, 0, name);

    // naive: every chunk token is used as cached, none recomputed.
    t = await tenant();
    const naive = await chat(t.c, cs.parts(t.cache), { link: { method: 'naive' } });
    assert.equal(naive.usage.prompt_tokens, ref.usage.prompt_tokens, name);
    assert.equal(naive.usage.prompt_tokens_details.cached_tokens, cs.chunkTokens(t.n), name);
    assert.equal(naive.usage.prompt_tokens_details.recomputed_tokens, 0, name);
  }

  // The reordered case with the other methods.
  const cs = cases.reordered;
  const ref = await reference(s, cs.pieces);
  // cacheblend recomputing every token from layer 0 is Fully-Recompute too.
  let t = await tenant();
  const blendAll = await chat(t.c, cs.parts(t.cache), { link: { method: 'cacheblend', ratio: 1, check_layer: 0 } });
  assert.equal(blendAll.choices[0].message.content, ref.choices[0].message.content, 'cacheblend 1@0');
  assert.equal(blendAll.usage.prompt_tokens_details.recomputed_tokens, cs.chunkTokens(t.n));
  t = await tenant();
  const blend = await chat(t.c, cs.parts(t.cache), { link: { method: 'cacheblend', ratio: 0.2, check_layer: 1 } });
  const bu = blend.usage.prompt_tokens_details;
  assert.equal(bu.cached_tokens + bu.recomputed_tokens, cs.chunkTokens(t.n));
  assert.ok(bu.recomputed_tokens > 0 && bu.recomputed_tokens <= Math.ceil(0.2 * cs.chunkTokens(t.n)) + 1,
    JSON.stringify(bu));
  // The server's default, attnlink-16: 8 tokens on each side of each of the 3 boundaries.
  t = await tenant();
  const m0 = await metrics(s.port);
  const dflt = await chat(t.c, cs.parts(t.cache));
  const du = dflt.usage.prompt_tokens_details;
  assert.equal(du.cached_tokens + du.recomputed_tokens, cs.chunkTokens(t.n));
  assert.ok(du.recomputed_tokens > 0 && du.recomputed_tokens <= 3 * 16, JSON.stringify(du));
  const m1 = await metrics(s.port);
  assert.equal(m1['attic_linked_requests_total'] - m0['attic_linked_requests_total'], 1);
  assert.equal(m1['attic_context_chunk_hits_total{tier="dram"}'] - m0['attic_context_chunk_hits_total{tier="dram"}'], 3);
  assert.equal(m1['attic_link_recomputed_tokens_total'] - m0['attic_link_recomputed_tokens_total'], du.recomputed_tokens);

  // Streaming with include_usage: the same text and usage as the same request unstreamed
  // (each from a fresh tenant, so neither reuses the other's turn).
  for (const link of [{ method: 'attnlink', k: 4096 }, { method: 'naive' }]) {
    t = await tenant();
    const plain = await chat(t.c, cs.parts(t.cache), { link });
    t = await tenant();
    const stream = await chat(t.c, cs.parts(t.cache), { link, stream: true, stream_options: { include_usage: true } });
    let streamed = '';
    let usage = null;
    for await (const chunk of stream) {
      if (chunk.choices.length > 0) streamed += chunk.choices[0].delta.content ?? '';
      if (chunk.usage) usage = chunk.usage;
    }
    assert.equal(streamed, plain.choices[0].message.content, link.method);
    assert.deepEqual(usage, plain.usage, link.method);
  }
  await s.stop();
});

test('/v1/completions: a prompt of text and cache parts', async () => {
  const s = await start(['--kv-dram', '64M']);
  const pieces = ['Once upon a time,', chunkTexts[1], 'The end. Then'];
  await sameTokens(s, pieces);
  const ref = await fresh(s).completions.create({ model, prompt: pieces.join(' '), max_tokens: 24, temperature: 0 });
  const run = async (link) => {
    const c = fresh(s);
    const cache = await createCache(c, { chunks: chunkTexts });
    const r = await c.completions.create({ model, prompt: [pieces[0], cachePart(chunkId(cache, 1)), { type: 'text', text: pieces[2] }],
      max_tokens: 24, temperature: 0, link });
    return { r, n: cache.chunks[1].n_tokens };
  };
  const full = await run({ method: 'full' });
  assert.equal(full.r.usage.prompt_tokens, ref.usage.prompt_tokens);
  assert.equal(full.r.choices[0].text, ref.choices[0].text);
  const wide = await run({ method: 'attnlink', k: 4096 });
  assert.equal(wide.r.choices[0].text, ref.choices[0].text);
  assert.equal(wide.r.usage.prompt_tokens_details.recomputed_tokens, wide.n);
  const naive = await run({ method: 'naive' });
  assert.equal(naive.r.usage.prompt_tokens_details.cached_tokens, naive.n);
  assert.equal(naive.r.usage.prompt_tokens_details.recomputed_tokens, 0);
  await s.stop();
});

test('cache_control: a text part is cached on first sight and linked where it reappears', async () => {
  const s = await start(['--kv-dram', '64M']);
  const c = fresh(s);
  const doc = `${chunkTexts[0]} ${chunkTexts[1]}`;
  const docTokens = JSON.parse((await request(s.port, { path: '/tokenize', headers: auth,
    body: JSON.stringify({ prompt: doc, add_special_tokens: false }) })).body).count;
  const cached = { type: 'text', text: doc, cache_control: { type: 'ephemeral' } };
  const m0 = await metrics(s.port);
  const first = await chat(c, [cached, text(ask)]);
  assert.equal(first.usage.prompt_tokens_details.cached_tokens, 0);
  assert.equal(first.usage.prompt_tokens_details.recomputed_tokens, 0);
  // The text's KV is prefilled after the request (its turn and the text: two saves).
  await until(async () => (await metrics(s.port))['attic_kv_store_saves_total'] >=
    m0['attic_kv_store_saves_total'] + 2, 'the text\'s KV saved');
  // The same text after another part (and with a 1 h ttl): linked once the background
  // prefill is registered (polled). A retry begins differently, so that it cannot reuse the
  // turn of the try before.
  let second;
  let i = 0;
  await until(async () => {
    second = await chat(c, [text(`Story ${i++}, read it:`), { ...cached, cache_control: { type: 'ephemeral', ttl: '1h' } },
      text('What did Tom like?')]);
    const u = second.usage.prompt_tokens_details;
    return u.cached_tokens + u.recomputed_tokens >= docTokens;
  }, 'the cached text linked');
  const u = second.usage.prompt_tokens_details;
  assert.ok(u.cached_tokens + u.recomputed_tokens >= docTokens, `${JSON.stringify(u)}, text ${docTokens} tokens`);
  assert.ok(u.cached_tokens > 0);
  const m1 = await metrics(s.port);
  assert.ok(m1['attic_context_chunk_hits_total{tier="dram"}'] >= 1, JSON.stringify(m1));
  assert.ok(m1['attic_linked_requests_total'] > m0['attic_linked_requests_total']);
  // Implicit caches are the tenant's: another one sees a first sight, nothing cached.
  const other = await chat(fresh(s), [text('Story 0, read it:'), cached, text('What did Tom like?')]);
  assert.equal(other.usage.prompt_tokens_details.cached_tokens, 0);
  await s.stop();
});

test('bad input is an OpenAI-style 400 naming the parameter', async () => {
  const s = await start(['--kv-dram', '64M']);
  const c = fresh(s);
  const cache = await createCache(c, { chunks: chunkTexts });
  const parts = [text('Read:'), cachePart(chunkId(cache, 0)), text(ask)];
  const rejects = async (promise, param, what) => {
    await assert.rejects(promise, (e) => {
      assert.equal(e.status, 400, `${what}: ${e.message}`);
      assert.equal(e.error.param, param, `${what}: ${JSON.stringify(e.error)}`);
      assert.equal(e.error.type, 'invalid_request_error', what);
      assert.equal(typeof e.error.code, 'string', what);
      assert.ok(e.error.message.length > 0, what);
      return true;
    });
  };
  // link
  for (const [link, param] of [
    [{ method: 'bogus' }, 'link.method'],
    [{}, 'link.method'],
    ['attnlink', 'link'],
    [{ method: 'attnlink', k: -1 }, 'link.k'],
    [{ method: 'attnlink', k: 1.5 }, 'link.k'],
    [{ method: 'cacheblend', ratio: 1.5 }, 'link.ratio'],
    [{ method: 'cacheblend', ratio: -0.1 }, 'link.ratio'],
    [{ method: 'cacheblend', check_layer: -1 }, 'link.check_layer'],
    [{ method: 'cacheblend', check_layer: 99 }, 'link.check_layer'],
    [{ method: 'naive', k: 4 }, 'link.k'],
    [{ method: 'attnlink', ratio: 0.5 }, 'link.ratio'],
  ]) {
    await rejects(chat(c, parts, { link }), param, `link ${JSON.stringify(link)}`);
  }
  // create
  for (const [body, param] of [
    [{ chunks: ['a'], ttl: 0 }, 'ttl'],
    [{ chunks: ['a'], ttl: -5 }, 'ttl'],
    [{ chunks: ['a'], ttl: 'soon' }, 'ttl'],
    [{ chunks: ['a'], ttl: '5m' }, 'ttl'],
    [{ chunks: ['a'], ttl: 60, expire_at: Math.floor(Date.now() / 1000) + 60 }, 'ttl'],
    [{ chunks: ['a'], expire_at: 1000 }, 'expire_at'],
    [{ documents: ['a'], chunks: ['a'] }, 'chunks'],
    [{}, 'documents'],
    [{ chunks: [] }, 'chunks'],
    [{ chunks: 'a' }, 'chunks'],
    [{ chunks: [''] }, 'chunks[0]'],
    [{ chunks: ['a', 5] }, 'chunks[1]'],
    [{ documents: ['a'], split: { method: 'paragraphs' } }, 'split.method'],
    [{ documents: ['a'], split: { max_tokens: 0 } }, 'split.max_tokens'],
    [{ chunks: ['a'], split: { method: 'none' } }, 'split'],
    [{ chunks: ['a'], display_name: 5 }, 'display_name'],
  ]) {
    await rejects(createCache(c, body), param, `create ${JSON.stringify(body)}`);
  }
  // patch
  await rejects(c.patch(`/context_caches/${cache.id}`, { body: { display_name: 'x' } }), 'display_name', 'patch name');
  await rejects(c.patch(`/context_caches/${cache.id}`, { body: {} }), 'ttl', 'patch nothing');
  await rejects(c.patch(`/context_caches/${cache.id}`, { body: { ttl: 0 } }), 'ttl', 'patch ttl 0');
  // chat and completions
  await rejects(chat(c, parts, { session_id: 'ctx:x' }), 'session_id', 'ctx: session');
  await rejects(c.completions.create({ model, prompt: 'Hi', max_tokens: 2, session_id: 'ctx:abc' }), 'session_id',
    'ctx: session (completions)');
  await rejects(chat(c, [text('Hi'), { type: 'image_url', image_url: { url: 'http://x/y.png' } }]),
    'messages[0].content[1].type', 'image part');
  await rejects(chat(c, [{ type: 'context_cache' }]), 'messages[0].content[0].id', 'part without id');
  await rejects(chat(c, [{ type: 'text', text: 'Hi', cache_control: { type: 'persistent' } }]),
    'messages[0].content[0].cache_control', 'cache_control type');
  await rejects(chat(c, [{ type: 'text', text: 'Hi', cache_control: { type: 'ephemeral', ttl: '2h' } }]),
    'messages[0].content[0].cache_control.ttl', 'cache_control ttl');
  await rejects(c.completions.create({ model, prompt: ['Hi', { type: 'audio' }], max_tokens: 2 }), 'prompt[1].type',
    'completion part type');
  // Text that spells the server's private stand-in for a cache part cannot forge one.
  const forged = `Read:\uE000attic-part:0\uE001${ask}`;
  await rejects(chat(c, forged), 'messages[0].content', 'forged part marker');
  await rejects(chat(c, [text(forged), cachePart(chunkId(cache, 0))]), 'messages[0].content[0].text', 'forged marker part');
  await rejects(c.completions.create({ model, prompt: forged, max_tokens: 2 }), 'prompt', 'forged marker prompt');
  // Raw create bodies no client sends. Those JSON.parse (the reference) refuses are an
  // invalid_json 400: a NUL after the object among them (nlohmann alone would end the input
  // there and create the cache). Nesting past kMaxJsonDepth is a 400 as on the chat routes.
  const createBody = JSON.stringify({ model, chunks: ['a'] });
  for (const [body, code] of [[createBody + '\u0000', 'invalid_json'], [createBody + '\u0000{"ttl":0}', 'invalid_json'],
    [createBody.slice(0, -1), 'invalid_json'], [`{"model":"${model}","chunks":["a"],"x":${'['.repeat(100)}${']'.repeat(100)}}`, null]]) {
    if (code === 'invalid_json') assert.throws(() => JSON.parse(body), SyntaxError);
    const r = await request(s.port, { path: '/v1/context_caches', headers: { ...auth, 'content-type': 'application/json' }, body });
    assert.equal(r.status, 400, `${JSON.stringify(body.slice(-12))}: ${r.body}`);
    const e = parseError(r.body);
    if (code) assert.equal(e.code, code, r.body);
  }
  // Errors leave the server serving: the cache still links.
  const ok = await chat(c, parts, { link: { method: 'naive' } });
  assert.ok(ok.usage.prompt_tokens_details.cached_tokens > 0);
  await s.stop();
});

// Every regular file under `dir` (recursively), by path.
function files(dir) {
  return fs.readdirSync(dir, { recursive: true, withFileTypes: true })
    .filter((e) => e.isFile()).map((e) => path.join(e.parentPath ?? e.path, e.name));
}

test('restart: caches and their KV survive on SSD; lost or corrupt files are recovered from', async () => {
  const dir = path.join(tmpRoot, `ctx-ssd-${process.pid}`);
  fs.rmSync(dir, { recursive: true, force: true });
  // A DRAM tier too small for any entry: every chunk lives on SSD.
  const args = ['--kv-dram-bytes', '1', '--kv-ssd-dir', dir, '--kv-ssd-bytes', String(256 << 20)];
  let s = await start(args);
  const parts = (cache) => [text('Read:'), cachePart(chunkId(cache, 2)), cachePart(chunkId(cache, 0)), text(ask)];
  // Tenants: `before` answers before the restart; `a`, `b` and `d` each ask the same after
  // one (never before, so that no stored turn of theirs stands in for linking).
  const t = {};
  for (const name of ['before', 'a', 'b', 'd']) {
    const key = freshKey();
    const c = client(s, key);
    t[name] = { key, cache: await createCache(c, { chunks: chunkTexts, display_name: name }) };
  }
  const extra = await createCache(client(s, t.a.key), { chunks: ['A cat sat on a mat.'], display_name: 'extra' });
  const ask1 = (srv, tn) => chat(client(srv, tn.key), parts(tn.cache), { link: { method: 'naive' } });
  const before = await ask1(s, t.before);
  const n = t.before.cache.chunks[2].n_tokens + t.before.cache.chunks[0].n_tokens;
  assert.equal(before.usage.prompt_tokens_details.cached_tokens, n);
  assert.equal((await s.stop()).code, 0);
  const registryDir = path.join(dir, 'context-caches');
  assert.equal(files(registryDir).filter((f) => /ctx-[0-9a-f]{24}\.json$/.test(f)).length, 5);

  // 1. Restart: listed, and linked from SSD with nothing prefilled again.
  s = await start(args);
  const listed = await client(s, t.a.key).get('/context_caches');
  assert.deepEqual(listed.data.map((x) => x.id), [t.a.cache.id, extra.id]);
  assert.deepEqual(listed.data[0].chunks, t.a.cache.chunks);
  let m0 = await metrics(s.port);
  const a = await ask1(s, t.a);
  assert.equal(a.choices[0].message.content, before.choices[0].message.content);
  assert.equal(a.usage.prompt_tokens_details.cached_tokens, n);
  let m1 = await metrics(s.port);
  assert.equal(m1['attic_context_chunk_hits_total{tier="ssd"}'] - (m0['attic_context_chunk_hits_total{tier="ssd"}'] ?? 0), 2);
  assert.equal(m1['attic_context_chunk_misses_total'], 0);
  assert.equal((await s.stop()).code, 0);

  // 2. While stopped, every KV entry file of the model is deleted, and the record of the
  // `extra` cache is corrupted: the caches' chunks are prefilled again when needed, the
  // corrupt record is dropped, the server serves on.
  const modelDirs = fs.readdirSync(dir, { withFileTypes: true })
    .filter((e) => e.isDirectory() && e.name !== 'context-caches').map((e) => path.join(dir, e.name));
  assert.equal(modelDirs.length, 1, fs.readdirSync(dir).join(' '));
  const entries = files(modelDirs[0]);
  assert.ok(entries.length >= 3, entries.join(' '));
  for (const f of entries) fs.rmSync(f);
  const extraRecord = path.join(registryDir, `${extra.id}.json`);
  assert.ok(fs.existsSync(extraRecord));
  fs.writeFileSync(extraRecord, '{"id": "ctx-trunc');
  s = await start(args);
  assert.ok(s.alive());
  assert.match(s.log(), /context caches: removing corrupt record '.*ctx-[0-9a-f]{24}\.json'/);
  assert.ok(!fs.existsSync(extraRecord));
  assert.deepEqual((await client(s, t.a.key).get('/context_caches')).data.map((x) => x.id), [t.a.cache.id]);
  await assert.rejects(client(s, t.a.key).get(`/context_caches/${extra.id}`), (e) => assertNotFound(e, 'corrupt'));
  m0 = await metrics(s.port);
  const b = await ask1(s, t.b);
  assert.equal(b.choices[0].message.content, before.choices[0].message.content);
  assert.equal(b.usage.prompt_tokens_details.cached_tokens, n);
  m1 = await metrics(s.port);
  assert.equal(m1['attic_context_chunk_misses_total'] - m0['attic_context_chunk_misses_total'], 2);
  // `d`'s chunks are stored again by creating another cache of the same chunks.
  const d2 = await createCache(client(s, t.d.key), { chunks: chunkTexts });
  assert.equal(d2.usage.cached_tokens, 0);
  assert.equal((await s.stop()).code, 0);

  // 3. Entry files corrupted in place (same size, bytes flipped in the middle), among
  // them `d`'s chunks: they are found corrupt and prefilled again; the answer is the same.
  const corrupted = files(modelDirs[0]).filter((f) => fs.statSync(f).size > 64);
  assert.ok(corrupted.length >= 2, corrupted.join(' '));
  for (const f of corrupted) {
    const bytes = fs.readFileSync(f);
    for (let i = Math.floor(bytes.length / 2); i < Math.min(bytes.length, Math.floor(bytes.length / 2) + 32); ++i) bytes[i] ^= 0xff;
    fs.writeFileSync(f, bytes);
  }
  s = await start(args);
  const d = await ask1(s, t.d);
  assert.equal(d.choices[0].message.content, before.choices[0].message.content);
  assert.ok(s.alive());
  assert.equal((await s.stop()).code, 0);
  fs.rmSync(dir, { recursive: true, force: true });
});
