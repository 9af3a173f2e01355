// The KV store on by default (issue 31, item 5; docs/store.md "The DRAM tier by
// default"): `attic serve` with no store flags keeps a host-DRAM tier, sized
// automatically and named in its start-up line, so that context caches, cache_control
// and a conversation's reuse after it left the compute buffer work on a bare `make run`;
// `--kv-dram 0` turns it off and `--kv-dram SIZE` sets it; and `make run`'s SSD folder
// (--kv-ssd-dir with the automatic DRAM tier) keeps conversations and context caches
// across a restart. Driven by the official openai client, as a user would.
import { test, after } from 'node:test';
import assert from 'node:assert/strict';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import OpenAI from 'openai';
import { startServer, stories, request, metrics, tmpRoot, until } from './lib/server.mjs';

const model = 'stories260K-hf';
const servers = [];
after(async () => {
  for (const s of servers) if (s.alive()) await s.stop();
});
async function start(args) {
  const s = await startServer(args);
  servers.push(s);
  return s;
}
const client = (s, apiKey = 'none') => new OpenAI({ apiKey, baseURL: s.baseURL, maxRetries: 0, timeout: 60000 });
const text = (t) => ({ type: 'text', text: t });
const chat = (c, content, extra = {}) => c.chat.completions.create({
  model, messages: [{ role: 'user', content }], max_tokens: 16, temperature: 0, ...extra });
const chunkTexts = [
  'Tom had a red ball. He liked to play with it in the park every day.',
  'Lily saw a big dog near the tree. The dog was happy and ran to her.',
];

// "6016M" / "8G" / "64M" (FormatByteSize) in bytes.
function bytesOf(size) {
  const m = size.match(/^(\d+)([KMGT]?)$/);
  assert.ok(m, `not a size: ${size}`);
  return Number(m[1]) * 1024 ** ' KMGT'.indexOf(m[2] || ' ');
}

const MiB = 2 ** 20;
const GiB = 2 ** 30;

// Each tenant (API key) is used for one thing, so that nothing one request left (a stored
// turn, a resident sequence) stands in for another's linking.
test('no store flags: a DRAM tier, sized automatically; context caches and cache_control work', async () => {
  const s = await start(['-m', stories, '--api-key', 'k-cache', '--api-key', 'k-hint']);
  // The start-up line names the tier and says it was chosen automatically.
  const line = s.log().split('\n').find((l) => l.startsWith('attic: serving '));
  assert.ok(line, s.log());
  const named = line.match(/KV store: DRAM (\S+) \(automatic\)/);
  assert.ok(named, `the start-up line names no automatic DRAM tier: ${line}`);
  // The tier the store has is the one named, within the rule's bounds (docs/store.md):
  // at most 8 GiB and a quarter of this machine's memory, in whole 64 MiB.
  const m = await metrics(s.port);
  const dram = m['attic_kv_store_capacity_bytes{tier="dram"}'];
  assert.ok(dram > 0, 'a server started with no store flags has no DRAM tier');
  assert.equal(dram, bytesOf(named[1]));
  assert.ok(dram <= 8 * GiB && dram <= os.totalmem() / 4, `${dram} bytes`);
  assert.equal(dram % (64 * MiB), 0);
  assert.equal(m['attic_kv_store_capacity_bytes{tier="ssd"}'], 0);

  // A context cache, created and linked (naive: every cached token used as stored).
  const c = client(s, 'k-cache');
  const cache = await c.post('/context_caches', { body: { model, chunks: chunkTexts } });
  assert.equal(cache.object, 'context_cache');
  assert.equal(cache.chunks.length, 2);
  const linked = await chat(c, [text('Read:'), { type: 'context_cache', id: cache.id }, text('Who is in the story?')],
    { link: { method: 'naive' } });
  assert.equal(linked.usage.prompt_tokens_details.cached_tokens, cache.n_tokens);
  assert.ok(linked.choices[0].message.content.length > 0);
  assert.equal((await c.get('/context_caches')).data.length, 1);

  // cache_control: cached on first sight, linked where the text reappears after other text.
  const h = client(s, 'k-hint');
  const doc = `${chunkTexts[0]} Ben ate a cake.`;
  const docTokens = JSON.parse((await request(s.port, { path: '/tokenize', headers: { authorization: 'Bearer k-hint' },
    body: JSON.stringify({ prompt: doc, add_special_tokens: false }) })).body).count;
  const hinted = { type: 'text', text: doc, cache_control: { type: 'ephemeral' } };
  const m0 = await metrics(s.port);
  const first = await chat(h, [hinted, text('What did Tom like?')]);
  assert.equal(first.usage.prompt_tokens_details.cached_tokens, 0);
  await until(async () => (await metrics(s.port))['attic_kv_store_saves_total'] >=
    m0['attic_kv_store_saves_total'] + 2, 'the text\'s KV saved');  // prefilled after the request
  let u;
  let i = 0;
  await until(async () => {  // a retry begins differently, so it cannot reuse the try before
    u = (await chat(h, [text(`Story ${i++}, read it:`), hinted, text('What did Tom like?')])).usage.prompt_tokens_details;
    return u.cached_tokens + u.recomputed_tokens >= docTokens;
  }, 'the hinted text linked');
  assert.ok(u.cached_tokens + u.recomputed_tokens >= docTokens, `${JSON.stringify(u)}, text ${docTokens} tokens`);
  assert.ok(u.cached_tokens > 0);
  const m1 = await metrics(s.port);
  assert.ok(m1['attic_context_chunk_hits_total{tier="dram"}'] >= 1, JSON.stringify(m1));
  assert.ok(m1['attic_linked_requests_total'] > m0['attic_linked_requests_total']);
  assert.equal((await s.stop()).code, 0);
});

// Two turns of one conversation whose first turn left the compute buffer (--max-resident
// 0): the second reuses the first's KV from the DRAM tier.
async function twoTurns(s, session, apiKey) {
  const user1 = { role: 'user', content: 'Tell me about a cat named Tom.' };
  const t1 = await client(s, apiKey).chat.completions.create({
    model, messages: [user1], max_tokens: 24, temperature: 0, session_id: session });
  assert.equal(t1.usage.prompt_tokens_details.cached_tokens, 0);
  const stored = await request(s.port, { method: 'GET', path: `/v1/sessions/${session}`,
    headers: { authorization: `Bearer ${apiKey}` } });  // waits for the turn's queued save
  assert.equal(stored.status, 200, stored.body);
  const messages = [user1, { role: 'assistant', content: t1.choices[0].message.content },
    { role: 'user', content: 'What did Tom do next?' }];
  return { t1, messages, stored: JSON.parse(stored.body) };
}

test('no store flags: a conversation reuses its history after it left the compute buffer', async () => {
  const s = await start(['-m', stories, '--max-resident', '0']);
  const { t1, messages, stored } = await twoTurns(s, 'conv-default', 'none');
  assert.equal(stored.tier, 'dram');
  const t2 = await client(s).chat.completions.create({
    model, messages, max_tokens: 24, temperature: 0, session_id: 'conv-default' });
  const cached = t2.usage.prompt_tokens_details.cached_tokens;
  assert.ok(cached >= 0.8 * t1.usage.prompt_tokens, `reused only ${cached} of ${t1.usage.prompt_tokens}`);
  const m = await metrics(s.port);
  assert.ok(m['attic_kv_store_hits_total{tier="dram"}'] >= 1);
  assert.equal((await s.stop()).code, 0);
});

test('--kv-dram 0 turns the store off; --kv-dram SIZE is the tier as given', async () => {
  const off = await start(['-m', stories, '--kv-dram', '0']);
  assert.match(off.log(), /attic: serving .*no KV store \(--kv-dram 0\)/);
  assert.equal((await metrics(off.port))['attic_kv_store_capacity_bytes{tier="dram"}'], undefined);
  await assert.rejects(client(off).post('/context_caches', { body: { model, chunks: ['x'] } }),
    (e) => e.status === 404 && e.error.code === 'context_caches_unavailable');
  assert.equal((await off.stop()).code, 0);

  const set = await start(['-m', stories, '--kv-dram', '64M']);
  assert.match(set.log(), /attic: serving .*KV store: DRAM 64M[,)]/);
  assert.equal((await metrics(set.port))['attic_kv_store_capacity_bytes{tier="dram"}'], 64 * MiB);
  assert.equal((await set.stop()).code, 0);
});

// `make run` passes --kv-ssd-dir out/kv-ssd beside the automatic DRAM tier: what DRAM
// holds when the server stops goes to SSD, and the next start finds it.
test('make run\'s SSD folder: a restart keeps conversations and context caches', async () => {
  const dir = path.join(tmpRoot, `kv-ssd-default-${process.pid}`);
  fs.rmSync(dir, { recursive: true, force: true });
  const args = ['-m', stories, '--max-resident', '0', '--api-key', 'k-conv', '--api-key', 'k-ref', '--api-key', 'k-cache',
    '--kv-ssd-dir', dir];
  let s = await start(args);
  const escaped = dir.replace(/[.*+?^${}()|[\]\\]/g, '\\$&');
  assert.match(s.log(), new RegExp(`KV store: DRAM \\S+ \\(automatic\\) \\+ SSD 16G in ${escaped}`));
  const { t1, messages, stored } = await twoTurns(s, 'conv-restart', 'k-conv');
  assert.equal(stored.tier, 'dram');  // in DRAM only, until the server stops
  // A context cache, created and not yet used (its tenant links it after the restart).
  const cache = await client(s, 'k-cache').post('/context_caches', { body: { model, chunks: chunkTexts } });
  assert.equal((await s.stop()).code, 0);
  assert.match(s.log(), /KV store: moved \d+ entr(y|ies) from DRAM to SSD for the next start/);

  s = await start(args);
  assert.match(s.log(), /KV store: restored \d+ entr(y|ies) .* from SSD/);
  const again = await request(s.port, { method: 'GET', path: '/v1/sessions/conv-restart',
    headers: { authorization: 'Bearer k-conv' } });
  assert.equal(again.status, 200, again.body);
  assert.equal(JSON.parse(again.body).tier, 'ssd');
  // Turn 2 after the restart reuses turn 1's KV, and answers as a recomputation does
  // (another tenant, which shares no KV).
  const t2 = await client(s, 'k-conv').chat.completions.create({
    model, messages, max_tokens: 24, temperature: 0, session_id: 'conv-restart' });
  const cached = t2.usage.prompt_tokens_details.cached_tokens;
  assert.ok(cached >= 0.8 * t1.usage.prompt_tokens, `reused only ${cached} of ${t1.usage.prompt_tokens}`);
  const ref = await client(s, 'k-ref').chat.completions.create({ model, messages, max_tokens: 24, temperature: 0 });
  assert.equal(ref.usage.prompt_tokens_details.cached_tokens, 0);
  assert.equal(t2.choices[0].message.content, ref.choices[0].message.content);
  // The context cache is listed and linked from SSD, nothing prefilled again.
  const c2 = client(s, 'k-cache');
  assert.deepEqual((await c2.get('/context_caches')).data.map((x) => x.id), [cache.id]);
  const m0 = await metrics(s.port);
  const linked = await chat(c2, [text('Read:'), { type: 'context_cache', id: cache.id }, text('Who is in the story?')],
    { link: { method: 'naive' } });
  assert.equal(linked.usage.prompt_tokens_details.cached_tokens, cache.n_tokens);
  const m1 = await metrics(s.port);
  assert.equal(m1['attic_context_chunk_hits_total{tier="ssd"}'] - (m0['attic_context_chunk_hits_total{tier="ssd"}'] ?? 0), 2);
  assert.equal(m1['attic_context_chunk_misses_total'], 0);
  assert.equal((await s.stop()).code, 0);
  fs.rmSync(dir, { recursive: true, force: true });
});
