// Continuous batching seen from clients: 16 simultaneous streaming chats give exactly the
// text each gives alone (greedy), and a 3,500-token prompt arriving while 8 streams
// decode is prefilled a chunk per step between their tokens, not in one step that stalls
// them (counted in tokens; gaps in time are `attic bench serve`'s).
import { test, after } from 'node:test';
import assert from 'node:assert/strict';
import OpenAI from 'openai';
import { startServer, stories, longContextModel, metrics, streamEvents } from './lib/server.mjs';

const servers = [];
after(async () => {
  for (const s of servers) {
    const r = await s.stop();
    assert.equal(r.code, 0, s.log());
  }
});

const topics = ['a dog', 'a cat', 'the sea', 'a red ball', 'a big tree', 'the moon', 'a little bird', 'a fish',
  'a train', 'the park', 'a bear', 'a cake', 'the rain', 'a frog', 'a car', 'the sun'];

async function streamChat(client, model, content, maxTokens) {
  const stream = await client.chat.completions.create({
    model, messages: [{ role: 'user', content }], max_tokens: maxTokens, temperature: 0, stream: true,
  });
  let text = '';
  let finish = null;
  for await (const c of stream) {
    text += c.choices[0]?.delta?.content ?? '';
    finish = c.choices[0]?.finish_reason ?? finish;
  }
  return { text, finish };
}

test('16 simultaneous streaming chats equal each chat run alone (greedy)', async () => {
  const s = await startServer(['-m', stories, '--chat-template', 'chatml', '--api-key', 'alone', '--api-key', 'together']);
  servers.push(s);
  const mk = (k) => new OpenAI({ apiKey: k, baseURL: s.baseURL, maxRetries: 0, timeout: 120000 });
  const model = 'stories260K-hf';
  const prompts = topics.map((t) => `Tell me a story about ${t}.`);
  // Alone: one at a time, as the "alone" tenant (so no KV is shared with the others).
  const alone = [];
  for (const p of prompts) alone.push(await streamChat(mk('alone'), model, p, 160));
  const before = await metrics(s.port);
  assert.equal(before.attic_decode_batch_peak, 1);
  const together = await Promise.all(prompts.map((p) => streamChat(mk('together'), model, p, 160)));
  for (let i = 0; i < prompts.length; ++i) {
    assert.ok(alone[i].text.length > 0);
    assert.equal(together[i].text, alone[i].text, `chat ${i} (${prompts[i]}) differs when batched`);
    assert.equal(together[i].finish, alone[i].finish);
  }
  const m = await metrics(s.port);
  assert.ok(m.attic_decode_batch_peak >= 8, `streams were not batched (peak decode batch ${m.attic_decode_batch_peak})`);
});

test('a 3,500-token prompt is prefilled in chunks between the decode steps of 8 streams', async () => {
  const chunk = 128;  // --batch: rows per step, so a prefill chunk is at most this many tokens
  const s = await startServer(['-m', longContextModel(), '--batch', String(chunk), '--kv-budget-mib', '256',
    '--api-key', 'load']);
  servers.push(s);
  const client = new OpenAI({ apiKey: 'load', baseURL: s.baseURL, maxRetries: 0, timeout: 120000 });
  const model = 'ctx4096-model';
  let seed = 12345;
  const longTokens = 3500;
  const longPrompt = Array.from({ length: longTokens }, () => {
    seed = (seed * 1103515245 + 12345) % 2147483648;
    return 3 + (seed % 497);
  });

  // Events are ordered by when the client saw them (a counter, not a clock): each stream's
  // tokens get the counter's value, the long prompt's answer too.
  let seen = 0;
  const order = Array.from({ length: 8 }, () => []);
  let release;
  const ready = new Promise((r) => { release = r; });
  // 8 streams decode; once each has produced 30 tokens, the long prompt is sent.
  const streams = order.map((os, i) => streamEvents(s.port, {
    apiKey: 'load',
    body: { model, prompt: `Stream ${i}: once upon a time`, max_tokens: 700, temperature: 0, ignore_eos: true },
  }, (c) => {
    if (c.choices.length > 0) os.push(++seen);  // an event per token (and a closing one)
    if (order.every((o) => o.length >= 30)) release();
  }));
  await ready;
  const sent = seen;
  const r = await client.completions.create({ model, prompt: longPrompt, max_tokens: 1, temperature: 0 });
  const answered = ++seen;
  assert.equal(r.usage.prompt_tokens, longTokens);
  assert.equal(r.usage.prompt_tokens_details.cached_tokens, 0);
  await Promise.all(streams);

  // Every step decodes each running stream and prefills at most `chunk` prompt tokens, so
  // the prompt takes at least ceil(3500 / 128) = 28 steps, each giving every stream a token
  // that is written before the prompt's answer. Less 2 for the steps at either end (a token
  // of the last step may be read after the answer, from another socket): 26. A prefill in
  // one step (or in 1,024-token chunks) leaves a stream a handful of tokens in that window.
  const minSteps = Math.ceil(longTokens / chunk);
  const during = order.map((os) => os.filter((k) => k > sent && k < answered).length);
  console.log(`# tokens per stream while the ${longTokens}-token prompt was prefilled: ${during.join(' ')}`);
  for (const [i, n] of during.entries()) {
    assert.ok(n >= minSteps - 2, `stream ${i} got ${n} tokens during the prefill (at least ${minSteps - 2} expected)`);
  }
  for (const os of order) assert.ok(os.length >= 700, `a stream sent ${os.length} events for 700 tokens`);
});
