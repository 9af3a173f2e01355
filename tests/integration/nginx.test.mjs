// Two `attic serve` instances on one Redis Cluster (--kv-remote; ctest's `redis_cluster`
// fixture, seed nodes in ATTIC_REDIS_NODES) behind nginx with session affinity
// (scripts/nginx-affinity.sh: `hash $http_x_session_id consistent`), driven by the
// official openai client with X-Session-Id as a default header, as docs/serving.md
// "Several servers behind nginx" tells users to: every turn of the conversation lands on
// one instance; when that instance is killed, nginx moves the next turn to the other one,
// which continues the conversation from the cluster. Every answer (greedy) equals a
// recomputation by a third server that has no KV store at all. Skipped only when nginx
// is not installed and cannot be.
import { test, after } from 'node:test';
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import fs from 'node:fs';
import net from 'node:net';
import path from 'node:path';
import OpenAI from 'openai';
import { startServer, stories, request, metrics, sourceDir, tmpRoot } from './lib/server.mjs';

const script = path.join(sourceDir, 'scripts/nginx-affinity.sh');
const nodes = process.env.ATTIC_REDIS_NODES || '';
const model = 'stories260K-hf';

function nginxAvailable() {
  try {
    execFileSync(script, ['install'], { stdio: 'pipe' });
    return true;
  } catch (e) {
    return false;
  }
}
const skip = !nodes ? 'no Redis Cluster: run through ctest (fixture redis_cluster)'
  : !nginxAvailable() ? 'nginx is not installed and could not be installed' : false;

const servers = [];
let nginx = null;  // { port, dir }
after(async () => {
  if (nginx) {
    execFileSync(script, ['stop', String(nginx.port)], { env: { ...process.env, NGINX_AFFINITY_DIR: nginx.dir } });
  }
  for (const s of servers) if (s.alive()) await s.stop();
});

async function freePort() {
  const srv = net.createServer();
  await new Promise((resolve) => srv.listen(0, '127.0.0.1', resolve));
  const { port } = srv.address();
  await new Promise((resolve) => srv.close(resolve));
  return port;
}

async function startNginx(upstreams) {
  // One state directory per build: an nginx that a killed run left there is stopped by
  // the next start.
  const dir = path.join(tmpRoot, 'nginx');
  fs.mkdirSync(tmpRoot, { recursive: true });
  for (let attempt = 0; ; attempt++) {
    const port = await freePort();
    try {
      nginx = { port, dir };
      execFileSync(script, ['start', String(port), upstreams.join(','), '--routing', 'affinity'],
        { env: { ...process.env, NGINX_AFFINITY_DIR: dir }, stdio: 'pipe' });
      return nginx;
    } catch (e) {
      nginx = null;
      if (attempt >= 2) throw new Error(`nginx did not start: ${e.stderr}`);  // else the port was taken meanwhile
    }
  }
}

// The upstream of each proxied request, from nginx's access log (the script's format:
// `... session=<X-Session-Id> upstream=<addr>[, <addr>] upstream_status=<s>[, <s>] ...`).
function accessLog() {
  const text = fs.readFileSync(path.join(nginx.dir, 'access.log'), 'utf8');
  return text.split('\n').filter((l) => l.includes('/v1/')).map((l) => ({
    line: l,
    session: l.match(/session=(\S*)/)[1],
    upstreams: l.match(/upstream=(.*?) upstream_status=/)[1].split(', '),
    statuses: l.match(/upstream_status=(.*?) [0-9.]+$/)[1].split(', '),
  }));
}

test('a conversation stays on one instance behind nginx and continues on the other when it dies',
  { skip, timeout: 240000 }, async () => {
    const common = ['-m', stories, '--chat-template', 'chatml', '--max-resident', '0'];
    const shared = [...common, '--kv-dram', '64M', '--kv-remote', `redis://${nodes}`, '--kv-remote-timeout', '1000',
      '--api-key', 'k-conv'];
    const instances = [await startServer(shared), await startServer(shared)];
    servers.push(...instances);
    // The reference: no store (--kv-dram 0: `attic serve` keeps a DRAM tier unless told
    // not to), no resident reuse: every answer is a full recomputation.
    const ref = await startServer([...common, '--kv-dram', '0']);
    servers.push(ref);
    const front = await startNginx(instances.map((s) => `127.0.0.1:${s.port}`));

    const session = `conv-nginx-${process.pid}`;
    const client = new OpenAI({
      apiKey: 'k-conv', baseURL: `http://127.0.0.1:${front.port}/v1`, maxRetries: 0, timeout: 60000,
      defaultHeaders: { 'X-Session-Id': session },
    });
    const refClient = new OpenAI({ apiKey: 'none', baseURL: ref.baseURL, maxRetries: 0, timeout: 60000 });
    const messages = [{ role: 'system', content: 'You are a kind storyteller.' }];
    const questions = ['Tell me about a cat named Tom.', 'What did Tom do next?', 'Where did he go?',
      'Who did he meet there?'];
    // One turn through nginx (the session named only by the header), checked against the
    // reference; its save is stored (and written through to the cluster) when the
    // session's GET answers.
    async function turn(i) {
      messages.push({ role: 'user', content: questions[i] });
      const r = await client.chat.completions.create({ model, messages, max_tokens: 24, temperature: 0 });
      const want = await refClient.chat.completions.create({ model, messages, max_tokens: 24, temperature: 0 });
      assert.equal(want.usage.prompt_tokens_details.cached_tokens, 0);
      assert.equal(r.choices[0].message.content, want.choices[0].message.content, `turn ${i + 1}`);
      messages.push({ role: 'assistant', content: r.choices[0].message.content });
      const stored = await request(front.port, { method: 'GET', path: `/v1/sessions/${session}`,
        headers: { authorization: 'Bearer k-conv', 'x-session-id': session } });
      assert.equal(stored.status, 200, stored.body);
      return r;
    }

    const first = [await turn(0), await turn(1), await turn(2)];
    assert.equal(first[0].usage.prompt_tokens_details.cached_tokens, 0);
    for (const r of first.slice(1)) assert.ok(r.usage.prompt_tokens_details.cached_tokens >= 20);
    // Every turn went to one instance: all its lookups there, none on the other.
    const before = await Promise.all(instances.map((s) => metrics(s.port)));
    const lookups = before.map((m) => m['attic_kv_store_lookups_total']);
    const home = lookups.findIndex((n) => n === 3);
    assert.ok(home >= 0 && lookups[1 - home] === 0, `lookups per instance: ${lookups}`);
    assert.equal(before[home]['attic_kv_store_hits_total{tier="dram"}'], 2);  // turns 2 and 3
    assert.ok(before[home]['attic_kv_store_write_throughs_total'] >= 3);
    const log = accessLog();
    assert.equal(log.filter((e) => e.line.includes('/v1/chat/completions')).length, 3);
    for (const e of log) {
      assert.equal(e.session, session);
      assert.deepEqual(e.upstreams, [`127.0.0.1:${instances[home].port}`], e.line);
    }

    // The instance holding the conversation dies (as a crash would).
    instances[home].proc.kill('SIGKILL');
    await instances[home].stop();
    const other = instances[1 - home];
    const r4 = await turn(3);
    const cached = r4.usage.prompt_tokens_details.cached_tokens;
    assert.ok(cached >= 0.8 * r4.usage.prompt_tokens - 24, `reused only ${cached} of ${r4.usage.prompt_tokens}`);
    const m = await metrics(other.port);
    assert.equal(m['attic_kv_store_lookups_total'], 1);
    // Found in the cluster (the server never saw the conversation before); read from the
    // remote tier at admission, or promoted to DRAM by the prefetcher just before it.
    assert.equal(m['attic_kv_store_shared_found_total'], 1);
    assert.equal(m['attic_kv_store_tier_hits_total{tier="remote"}'] + m['attic_kv_store_tier_hits_total{tier="dram"}'], 1);
    assert.equal(m['attic_kv_store_reused_tokens_total'], cached);
    assert.equal(m['attic_kv_store_corrupt_total'], 0);
    // nginx tried the dead instance (502: connection refused), then the other one.
    const moved = accessLog().filter((e) => e.line.includes('/v1/chat/completions'))[3];
    assert.deepEqual(moved.upstreams, [`127.0.0.1:${instances[home].port}`, `127.0.0.1:${other.port}`], moved.line);
    assert.deepEqual(moved.statuses, ['502', '200'], moved.line);
  });
