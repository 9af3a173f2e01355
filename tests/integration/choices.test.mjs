// Several choices (`n`) through the official openai client: n choices of one request,
// its prompt computed once (the server's attic_prompt_tokens_computed_total grows by the
// prompt's length, not n times it), seeded choices that differ and come back the same,
// streams with an index per choice, and 400s for bad values of n.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import OpenAI from 'openai';
import { startServer, stories, metrics, request, parseError, streamEvents, until } from './lib/server.mjs';

let server;
const client = () => new OpenAI({ apiKey: 'k', baseURL: server.baseURL, maxRetries: 0, timeout: 120000 });
const model = 'stories260K-hf';
const computed = (m) => m.attic_prompt_tokens_computed_total;

before(async () => {
  // No KV store and nothing kept resident: every request computes its whole prompt, so
  // the counter shows exactly what each request prefilled. --deterministic: a seeded
  // request samples the same tokens whatever shares its steps.
  server = await startServer(['-m', stories, '--chat-template', 'chatml', '--api-key', 'k', '--kv-dram', '0',
    '--max-resident', '0', '--deterministic']);
});
after(async () => {
  const r = await server.stop();
  assert.equal(r.code, 0, `server exit: ${JSON.stringify(r)}\n${server.log()}`);
});

test('n: 4 with a seed returns four different choices; the prompt is computed once', async () => {
  const body = {
    model, messages: [{ role: 'user', content: 'Tell me a story about a cat and a big red ball.' }],
    n: 4, seed: 1234, temperature: 1, max_tokens: 24,
  };
  const m0 = await metrics(server.port);
  const r = await client().chat.completions.create(body);
  // Requests are counted when the step that finished them ends (just after the reply).
  const generated = async () => (await metrics(server.port)).attic_generation_tokens_total;
  await until(async () => (await generated()) - m0.attic_generation_tokens_total === r.usage.completion_tokens,
    'the generation counter grows by usage.completion_tokens');
  const m1 = await metrics(server.port);
  assert.equal(r.choices.length, 4);
  r.choices.forEach((c, i) => {
    assert.equal(c.index, i);
    assert.ok(['stop', 'length'].includes(c.finish_reason), c.finish_reason);
    assert.equal(c.message.role, 'assistant');
    assert.ok(c.message.content.length > 0);
  });
  assert.equal(new Set(r.choices.map((c) => c.message.content)).size, 4, JSON.stringify(r.choices));
  // The prompt's length as a single-choice request of the same messages reports it.
  const one = await client().chat.completions.create({ ...body, n: 1 });
  const m2 = await metrics(server.port);
  assert.equal(r.usage.prompt_tokens, one.usage.prompt_tokens);
  assert.ok(r.usage.prompt_tokens > 10);
  assert.equal(computed(m1) - computed(m0), r.usage.prompt_tokens, 'the prompt computed once, not 4 times');
  assert.equal(computed(m2) - computed(m1), one.usage.prompt_tokens);
  assert.equal(r.usage.total_tokens, r.usage.prompt_tokens + r.usage.completion_tokens);
  // Choice 0 keeps the seed: it is the single-choice request's answer.
  assert.equal(r.choices[0].message.content, one.choices[0].message.content);
  // The same request again: the same four choices.
  const again = await client().chat.completions.create(body);
  assert.deepEqual(again.choices.map((c) => c.message.content), r.choices.map((c) => c.message.content));
});

test('completions: usage sums the choices, each generates its own max_tokens', async () => {
  const r = await client().completions.create({
    model, prompt: 'Once upon a time, there was a little dog', n: 3, seed: 5, temperature: 0.8, max_tokens: 16,
    ignore_eos: true,
  });
  assert.equal(r.choices.length, 3);
  r.choices.forEach((c, i) => {
    assert.equal(c.index, i);
    assert.equal(c.finish_reason, 'length');
  });
  assert.equal(r.usage.completion_tokens, 3 * 16);
  const one = await client().completions.create({
    model, prompt: 'Once upon a time, there was a little dog', max_tokens: 1,
  });
  assert.equal(r.usage.prompt_tokens, one.usage.prompt_tokens);
});

test('greedy choices are all the single-choice answer; logprobs per choice', async () => {
  const body = {
    model, messages: [{ role: 'user', content: 'Where is the ball?' }], temperature: 0, max_tokens: 12, logprobs: true,
  };
  const one = await client().chat.completions.create(body);
  const r = await client().chat.completions.create({ ...body, n: 3 });
  assert.equal(r.choices.length, 3);
  for (const c of r.choices) {
    assert.equal(c.message.content, one.choices[0].message.content);
    assert.equal(c.finish_reason, one.choices[0].finish_reason);
    assert.deepEqual(c.logprobs, one.choices[0].logprobs);
  }
});

test('a stream of n choices: every chunk names its choice, each finishes once', async () => {
  const body = {
    model, messages: [{ role: 'user', content: 'A story about a tree.' }], n: 3, seed: 99, temperature: 1,
    max_tokens: 20, stream_options: { include_usage: true },
  };
  const full = await client().chat.completions.create({ ...body, stream_options: undefined });
  const text = ['', '', ''];
  const finish = [[], [], []];
  const roles = [0, 0, 0];
  let usage = null;
  await streamEvents(server.port, { path: '/v1/chat/completions', apiKey: 'k', body }, (chunk) => {
    if (chunk.usage) usage = chunk.usage;
    for (const c of chunk.choices) {
      assert.ok(c.index >= 0 && c.index < 3, JSON.stringify(chunk));
      assert.ok(finish[c.index].length === 0, 'a chunk after its choice finished');
      if (c.delta.role) roles[c.index] += 1;
      text[c.index] += c.delta.content ?? '';
      if (c.finish_reason) finish[c.index].push(c.finish_reason);
    }
  });
  assert.deepEqual(roles, [1, 1, 1]);
  assert.deepEqual(finish, full.choices.map((c) => [c.finish_reason]));
  assert.deepEqual(text, full.choices.map((c) => c.message.content));
  assert.equal(usage.prompt_tokens, full.usage.prompt_tokens);
  assert.equal(usage.completion_tokens, full.usage.completion_tokens);
  // The official client's stream too.
  const stream = await client().chat.completions.create({ ...body, stream: true });
  const viaClient = ['', '', ''];
  for await (const chunk of stream) for (const c of chunk.choices) viaClient[c.index] += c.delta?.content ?? '';
  assert.deepEqual(viaClient, text);
});

test('bad n is a 400 naming n', async () => {
  const cases = [0, -1, 17, 2.5, '2', true, [2]];
  for (const n of cases) {
    const r = await request(server.port, {
      headers: { authorization: 'Bearer k', 'content-type': 'application/json' },
      body: JSON.stringify({ model, messages: [{ role: 'user', content: 'hi' }], n }),
    });
    assert.equal(r.status, 400, `n=${JSON.stringify(n)}: ${r.body}`);
    const e = parseError(r.body);
    assert.equal(e.param, 'n');
    assert.equal(e.type, 'invalid_request_error');
  }
  // n > 1 with a grammar: each choice would need its own.
  await assert.rejects(
    client().chat.completions.create({
      model, messages: [{ role: 'user', content: 'hi' }], n: 2, response_format: { type: 'json_object' },
    }),
    (e) => e.status === 400 && e.param === 'n' && /response_format|constrained/.test(e.message));
  // The documented maximum is accepted.
  const r = await client().completions.create({ model, prompt: 'Hi', n: 16, max_tokens: 2, seed: 1 });
  assert.equal(r.choices.length, 16);
});

test('with the KV store: choice 0 is saved, the next turn on it reuses the prompt and the reply', async () => {
  const s = await startServer(['-m', stories, '--chat-template', 'chatml', '--kv-dram', '64M', '--max-resident', '0']);
  try {
    const c = new OpenAI({ apiKey: 'x', baseURL: s.baseURL, maxRetries: 0, timeout: 120000 });
    const messages = [{ role: 'user', content: 'Tell me about the little dog and the park.' }];
    const r = await c.chat.completions.create({
      model, messages, n: 3, seed: 3, temperature: 1, max_tokens: 16, session_id: 'conv-n',
    });
    assert.equal(r.choices.length, 3);
    const next = await c.chat.completions.create({
      model, messages: [...messages, { role: 'assistant', content: r.choices[0].message.content },
        { role: 'user', content: 'And then?' }],
      max_tokens: 4, temperature: 0, session_id: 'conv-n',
    });
    // Nothing is resident (--max-resident 0): what is reused came from the saved turn.
    assert.ok(next.usage.prompt_tokens_details.cached_tokens >= r.usage.prompt_tokens,
      JSON.stringify(next.usage));
  } finally {
    const st = await s.stop();
    assert.equal(st.code, 0, s.log());
  }
});
