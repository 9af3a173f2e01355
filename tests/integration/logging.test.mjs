// The access log of `attic serve` (--log-level, docs/serving.md): at the default level
// (info) exactly one line per HTTP request once its response is complete — method, path,
// status, the usage and time to first token of completions, the duration — and never a
// prompt, a completion or an API key; at debug also the request bodies; at warn nothing.
// Lines are read from the server's stderr.
import { test, after } from 'node:test';
import assert from 'node:assert/strict';
import OpenAI from 'openai';
import { startServer, stories, request, sleep } from './lib/server.mjs';

const model = 'stories260K-hf';
const key = 'sk-attic-log-test-2f9c';
const servers = [];
after(async () => {
  for (const s of servers) if (s.alive()) await s.stop();
});

async function start(extra) {
  const s = await startServer(['-m', stories, '--chat-template', 'chatml', '--api-key', key, ...extra]);
  servers.push(s);
  return s;
}
const client = (s, apiKey = key) => new OpenAI({ apiKey, baseURL: s.baseURL, maxRetries: 0, timeout: 60000 });

// "attic: METHOD PATH STATUS [name=value ...] DURATIONms"
const accessRe = /^attic: ([A-Z]+) (\S+) (\d{3})((?: [a-z]+=[0-9.]+(?:ms)?)*) ([0-9.]+)ms$/;
function accessLines(s) {
  return s.log().split('\n').filter((l) => accessRe.test(l)).map((l) => {
    const m = l.match(accessRe);
    const fields = Object.fromEntries(m[4].trim().split(' ').filter(Boolean).map((kv) => {
      const [k, v] = kv.split('=');
      return [k, Number.parseFloat(v)];
    }));
    return { line: l, method: m[1], path: m[2], status: Number(m[3]), fields, ms: Number(m[5]) };
  });
}
// Waits for the access line of the request just answered (the server writes it right
// after the response) and returns it; requests are sent one at a time.
async function nextLine(s, seen) {
  for (let i = 0; i < 200 && accessLines(s).length <= seen; ++i) await sleep(10);
  const lines = accessLines(s);
  assert.equal(lines.length, seen + 1, `expected access line #${seen + 1}:\n${s.log()}`);
  return lines[seen];
}

test('info (default): one access line per request with status, tokens and TTFT; no prompt text', async () => {
  const s = await start([]);
  const c = client(s);
  const secret = 'PURPLE-ELEPHANT-7731';
  let n = 0;
  let l;

  const chat = await c.chat.completions.create({ model, messages: [{ role: 'user', content: `Say ${secret}` }],
    max_tokens: 5, temperature: 0 });
  l = await nextLine(s, n++);
  assert.deepEqual([l.method, l.path, l.status], ['POST', '/v1/chat/completions', 200]);
  assert.equal(l.fields.prompt, chat.usage.prompt_tokens);
  assert.equal(l.fields.cached, chat.usage.prompt_tokens_details.cached_tokens);
  assert.equal(l.fields.completion, chat.usage.completion_tokens);
  assert.ok(l.fields.ttft >= 0 && l.fields.ttft <= l.ms, l.line);

  // A second turn: cached tokens are reported as the usage reports them.
  const turn2 = await c.chat.completions.create({ model, messages: [{ role: 'user', content: `Say ${secret}` },
    { role: 'assistant', content: chat.choices[0].message.content }, { role: 'user', content: 'Again.' }],
  max_tokens: 3, temperature: 0 });
  l = await nextLine(s, n++);
  assert.ok(turn2.usage.prompt_tokens_details.cached_tokens > 0);
  assert.equal(l.fields.cached, turn2.usage.prompt_tokens_details.cached_tokens);
  assert.equal(l.fields.prompt, turn2.usage.prompt_tokens);

  // Streaming: logged when the stream ends, with its final usage.
  const stream = await c.completions.create({ model, prompt: 'ZEBRA-CROSSING-4242 was', max_tokens: 6,
    temperature: 0, stream: true, stream_options: { include_usage: true } });
  let usage;
  for await (const chunk of stream) if (chunk.usage) usage = chunk.usage;
  l = await nextLine(s, n++);
  assert.deepEqual([l.method, l.path, l.status], ['POST', '/v1/completions', 200]);
  assert.deepEqual([l.fields.prompt, l.fields.completion], [usage.prompt_tokens, usage.completion_tokens]);
  assert.ok(l.fields.ttft <= l.ms, l.line);

  // Errors and other routes: method, path, status, duration only.
  await assert.rejects(c.chat.completions.create({ model, messages: [{ role: 'user', content: secret }],
    temperature: 3 }), (e) => e.status === 400);
  l = await nextLine(s, n++);
  assert.deepEqual([l.method, l.path, l.status, l.fields], ['POST', '/v1/chat/completions', 400, {}]);
  await assert.rejects(client(s, 'sk-wrong-key-0000').models.list(), (e) => e.status === 401);
  l = await nextLine(s, n++);
  assert.deepEqual([l.method, l.path, l.status, l.fields], ['GET', '/v1/models', 401, {}]);
  await c.post('/tokenize', { body: { prompt: secret } });
  l = await nextLine(s, n++);
  assert.deepEqual([l.method, l.path, l.status], ['POST', '/v1/tokenize', 200]);
  await c.get('/sessions', { query: { limit: 5 } });
  l = await nextLine(s, n++);
  assert.deepEqual([l.method, l.path, l.status], ['GET', '/v1/sessions', 200]);  // no query string
  const health = await request(s.port, { method: 'GET', path: '/health' });
  assert.equal(health.status, 200);
  l = await nextLine(s, n++);
  assert.deepEqual([l.method, l.path, l.status], ['GET', '/health', 200]);
  const unknown = await request(s.port, { method: 'GET', path: '/v1/nope%0Aattic:%20GET%20/forged%20200%201.0ms' });
  assert.equal(unknown.status, 404);
  l = await nextLine(s, n++);
  assert.equal(l.status, 404);
  // Newline and spaces escaped: no forged line, and the path stays one word.
  assert.equal(l.path, '/v1/nope\\nattic:\\x20GET\\x20/forged\\x20200\\x201.0ms', l.line);

  const r = await s.stop();
  assert.equal(r.code, 0);
  assert.equal(accessLines(s).length, n, s.log());  // exactly one per request
  for (const text of [secret, 'ZEBRA-CROSSING', key, 'sk-wrong-key']) assert.ok(!s.log().includes(text), text);
  if (chat.choices[0].message.content.length >= 8) assert.ok(!s.log().includes(chat.choices[0].message.content));
});

test('--log-level debug adds request bodies; --log-level warn has no access lines', async () => {
  const secret = 'ORANGE-GIRAFFE-5150';
  const debug = await start(['--log-level', 'debug']);
  await client(debug).chat.completions.create({ model, messages: [{ role: 'user', content: secret }], max_tokens: 2 });
  const l = await nextLine(debug, 0);
  assert.deepEqual([l.path, l.status], ['/v1/chat/completions', 200]);
  await client(debug).models.list();
  await nextLine(debug, 1);
  await debug.stop();
  assert.equal(accessLines(debug).length, 2, debug.log());
  const body = debug.log().split('\n').filter((x) => x.startsWith('attic: POST /v1/chat/completions body ('));
  assert.equal(body.length, 1, debug.log());
  assert.ok(body[0].includes(secret), body[0]);
  assert.ok(body[0].includes('"max_tokens":2'), body[0]);
  assert.ok(!debug.log().includes(key));  // headers are never logged

  const warn = await start(['--log-level', 'warn']);
  await client(warn).chat.completions.create({ model, messages: [{ role: 'user', content: secret }], max_tokens: 2 });
  await assert.rejects(client(warn).chat.completions.create({ model: 'nope', messages: [] }), (e) => e.status >= 400);
  await request(warn.port, { method: 'GET', path: '/health' });
  await warn.stop();
  assert.deepEqual(accessLines(warn), []);
  assert.ok(!warn.log().includes(secret));
  assert.match(warn.log(), /listening on/);  // start-up lines are not access lines
});

test('an unknown --log-level is a clear error', async () => {
  await assert.rejects(startServer(['-m', stories, '--log-level', 'loud']),
    /attic: error: unknown log level 'loud' \(expected debug, info, warn, error or off\)/);
});
