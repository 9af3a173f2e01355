// Several `attic serve` processes on one Redis Cluster (--kv-remote; docs/store.md
// "Remote tier"), the real cluster of ctest's `redis_cluster` fixture (its seed nodes in
// ATTIC_REDIS_NODES): a conversation started on server A continues on server B with its
// history's KV from the cluster and greedy output identical to recomputation; tenants
// stay apart across servers; a value cut short in the cluster is a miss (recomputed,
// still identical), never wrong KV; a master killed mid-conversation fails over and the
// servers keep answering. Resident reuse is off (--max-resident 0).
import { test, after } from 'node:test';
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import fs from 'node:fs';
import OpenAI from 'openai';
import { startServer, stories, request, metrics, sleep } from './lib/server.mjs';

const nodes = process.env.ATTIC_REDIS_NODES || '';
const clusterDir = process.env.REDIS_CLUSTER_DIR || '';
const skip = nodes ? false : 'no Redis Cluster: run through ctest (fixture redis_cluster)';
const model = 'stories260K-hf';
const keys = ['k-conv', 'k-ref', 'k-other'];
const servers = [];
after(async () => {
  for (const s of servers) if (s.alive()) await s.stop();
});

async function start(extra = []) {
  const s = await startServer(['-m', stories, '--chat-template', 'chatml', '--max-resident', '0',
    '--kv-dram', '64M', '--kv-remote', `redis://${nodes}`, '--kv-remote-timeout', '1000',
    ...keys.flatMap((k) => ['--api-key', k]), ...extra]);
  servers.push(s);
  return s;
}
const client = (s, apiKey) => new OpenAI({ apiKey, baseURL: s.baseURL, maxRetries: 0, timeout: 60000 });
const ports = () => nodes.split(',').map((n) => n.split(':')[1]);
const cli = (port, ...args) => execFileSync('redis-cli', ['-c', '-p', port, ...args], { encoding: 'utf8' }).trim();
// Every entry hash in the cluster (SCAN on each node; replicas hold their masters' keys).
function entryKeys() {
  const all = new Set();
  for (const p of ports()) {
    for (const k of cli(p, '--scan', '--pattern', 'attic:kv:*').split('\n')) if (k) all.add(k);
  }
  return all;
}

const user1 = { role: 'user', content: 'Tell me about a cat named Tom.' };
// Turn 1 of `session` on `a` (its save written through to the cluster when GET returns).
// The system prompt starts with `tag`: conversations of different tags share no prefix
// worth reusing, so that each recomputation (turn2's `ref`) really recomputes.
async function turn1(a, session, apiKey = 'k-conv', tag = session) {
  const system = { role: 'system', content: `${tag}: you are a kind storyteller.` };
  const t1 = await client(a, apiKey).chat.completions.create({
    model, messages: [system, user1], max_tokens: 24, temperature: 0, session_id: session });
  const stored = await request(a.port, { method: 'GET', path: `/v1/sessions/${session}`,
    headers: { authorization: `Bearer ${apiKey}` } });
  assert.equal(stored.status, 200, stored.body);
  return [system, user1, { role: 'assistant', content: t1.choices[0].message.content },
    { role: 'user', content: 'What did Tom do next?' }];
}
async function turn2(b, session, messages, apiKey = 'k-conv') {
  const t2 = await client(b, apiKey).chat.completions.create({
    model, messages, max_tokens: 24, temperature: 0, session_id: session });
  // Recomputed on the same server by a tenant that has no KV for it.
  const ref = await client(b, 'k-ref').chat.completions.create({ model, messages, max_tokens: 24, temperature: 0 });
  assert.equal(ref.usage.prompt_tokens_details.cached_tokens, 0);
  return { t2, ref };
}

test('a session saved by one server continues on another, identical to recomputation', { skip }, async () => {
  const [a, b] = [await start(), await start()];
  const messages = await turn1(a, 'conv-shared');
  const { t2, ref } = await turn2(b, 'conv-shared', messages);
  const cached = t2.usage.prompt_tokens_details.cached_tokens;
  assert.ok(cached >= 20, `reused only ${cached} tokens`);
  assert.equal(t2.choices[0].message.content, ref.choices[0].message.content);
  const ma = await metrics(a.port);
  const mb = await metrics(b.port);
  assert.ok(ma['attic_kv_store_write_throughs_total'] >= 1);
  assert.equal(mb['attic_kv_store_shared_found_total'], 1);
  assert.ok(mb['attic_kv_store_tier_hits_total{tier="remote"}'] >= 1);
  assert.equal(mb['attic_kv_store_corrupt_total'], 0);
  // Turn 3 back on A: A indexes its own turn 1, but B's turn-2 save is the session's
  // newest in the cluster; A takes that one (all of turn 2's prompt is reused, more than
  // turn 1 could give), drops its turn 1, and answers exactly.
  // B's turn-2 save reaches the cluster asynchronously: its GET of the session returns
  // once the save is written through (as turn1 waits for A's), so turn 3 cannot race it.
  const stored2 = await request(b.port, { method: 'GET', path: '/v1/sessions/conv-shared',
    headers: { authorization: 'Bearer k-conv' } });
  assert.equal(stored2.status, 200, stored2.body);
  const m3 = [...messages, { role: 'assistant', content: t2.choices[0].message.content },
    { role: 'user', content: 'And then?' }];
  const { t2: t3, ref: ref3 } = await turn2(a, 'conv-shared', m3);
  const cached3 = t3.usage.prompt_tokens_details.cached_tokens;
  assert.ok(cached3 >= t2.usage.prompt_tokens, `turn 3 reused ${cached3} tokens, turn 2's prompt was ${t2.usage.prompt_tokens}`);
  assert.equal(t3.choices[0].message.content, ref3.choices[0].message.content);
  const ma3 = await metrics(a.port);
  assert.equal(ma3['attic_kv_store_shared_superseded_total'], 1);
  assert.equal(ma3['attic_kv_store_corrupt_total'], 0);
});

test('tenants stay apart across servers', { skip }, async () => {
  const [a, b] = [await start(), await start()];
  const messages = await turn1(a, 'conv-iso', 'k-conv');
  // Another tenant with the same session id on B: nothing of A's tenant is reused.
  const t = await client(b, 'k-other').chat.completions.create({
    model, messages, max_tokens: 24, temperature: 0, session_id: 'conv-iso' });
  assert.equal(t.usage.prompt_tokens_details.cached_tokens, 0);
  const mb = await metrics(b.port);
  assert.equal(mb['attic_kv_store_shared_found_total'], 0);
  const other = await request(b.port, { method: 'GET', path: '/v1/sessions/conv-iso',
    headers: { authorization: 'Bearer k-other' } });
  assert.equal(other.status, 200);  // k-other's own turn, saved just now
  const mine = await request(a.port, { method: 'GET', path: '/v1/sessions/conv-iso',
    headers: { authorization: 'Bearer k-conv' } });
  assert.equal(mine.status, 200);
  assert.notEqual(JSON.parse(mine.body).tokens, 0);
});

// The header is intact, so B starts the turn streaming the entry layer by layer; the
// bad layer is found when it arrives, after the request's forward began: the request
// starts over as a fresh prefill (attic_kv_load_failed_total), never using the layers.
test('a value cut short in the cluster is a miss, recomputed exactly', { skip }, async () => {
  const [a, b] = [await start(), await start()];
  const before = entryKeys();
  const messages = await turn1(a, 'conv-cut');
  const added = [...entryKeys()].filter((k) => !before.has(k));
  assert.equal(added.length, 1, `new entries: ${added}`);
  // Layer 0's part (field 1) replaced by a few bytes.
  assert.equal(cli(ports()[0], 'HSET', added[0], '1', 'short'), '0');
  const { t2, ref } = await turn2(b, 'conv-cut', messages);
  assert.equal(t2.usage.prompt_tokens_details.cached_tokens, 0);
  assert.equal(t2.choices[0].message.content, ref.choices[0].message.content);
  const mb = await metrics(b.port);
  assert.equal(mb['attic_kv_store_corrupt_total'], 1);
  assert.equal(mb['attic_kv_store_streamed_loads_total'], 1);
  assert.equal(mb['attic_kv_store_stream_failures_total'], 1);
  assert.equal(mb['attic_kv_load_failed_total'], 1);
  assert.equal(mb['attic_kv_store_reused_tokens_total'], 0);  // the failed load reused nothing
  assert.equal(cli(ports()[0], 'EXISTS', added[0]), '0');  // deleted from the cluster
});

test('a master killed mid-conversation fails over; the servers keep serving', { skip }, async () => {
  const [a, b] = [await start(), await start()];
  const before = entryKeys();
  const messages = await turn1(a, 'conv-failover');
  const [key] = [...entryKeys()].filter((k) => !before.has(k));
  assert.ok(key, 'the session entry');
  // The master holding it (a replica answers -MOVED to a plain EXISTS).
  const master = ports().find((p) => cli(p, 'ROLE').startsWith('master') &&
    execFileSync('redis-cli', ['-p', p, 'EXISTS', key], { encoding: 'utf8' }).trim() === '1');
  assert.ok(master, 'the master of the entry');
  const pid = Number(fs.readFileSync(`${clusterDir}/${master}/redis.pid`, 'utf8'));
  process.kill(pid, 'SIGKILL');  // as a crash would
  // Right away, before the replica is promoted: B answers exactly (a miss or a hit, never
  // an error or a hang: a hang fails as the client's request timeout, not a bound here).
  const { t2, ref } = await turn2(b, 'conv-failover', messages);
  assert.equal(t2.choices[0].message.content, ref.choices[0].message.content);
  // After the failover the cluster is used again: a conversation started on A continues
  // on a fresh server C from the cluster.
  const c = await start();
  // Polled until the promotion is seen as reuse: a condition, not a bound on how long it
  // takes. The backstop against a cluster that never recovers: Redis marks the master
  // failed after cluster-node-timeout (2 s, scripts/redis-cluster.sh), and its replica is
  // elected 0.5-1 s plus 1 s per rank later, ~4 s in all; 30 tries of >= 1 s is ~7x that.
  let reused = 0;
  for (let i = 0; i < 30 && reused === 0; i++) {
    await sleep(1000);
    const m = await turn1(a, `conv-after-${i}`, 'k-conv', `${i} ${i} ${i}`);
    const { t2: tc, ref: rc } = await turn2(c, `conv-after-${i}`, m);
    assert.equal(tc.choices[0].message.content, rc.choices[0].message.content);
    reused = tc.usage.prompt_tokens_details.cached_tokens;
  }
  assert.ok(reused > 0, 'no reuse through the cluster after the failover');
  // The killed node comes back as a replica: the cluster is whole for the next tests
  // (polled; the 30 s backstop is the promotion's ~7x again, for the rejoin's gossip).
  execFileSync('redis-server', [`${clusterDir}/${master}/redis.conf`]);
  let whole = false;
  for (let i = 0; i < 150 && !whole; i++) {
    await sleep(200);
    whole = ports().every((p) => {
      try { return cli(p, 'CLUSTER', 'INFO').includes('cluster_state:ok'); } catch { return false; }
    });
  }
  assert.ok(whole, 'the cluster did not become whole again');
});
