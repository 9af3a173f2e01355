// Continuous batching seen from clients: 16 simultaneous streaming chats give exactly the
// text each gives alone (greedy), and a 3,500-token prompt arriving while 8 streams
// decode delays their next tokens by about one prefill chunk, not by the whole prefill.
import { test, after } from 'node:test';
import assert from 'node:assert/strict';
import { performance } from 'node:perf_hooks';
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

test('a 3,500-token prompt delays 8 decoding streams by about one prefill chunk', async () => {
  const chunk = 128;  // --batch: rows per step, so a prefill chunk is at most this many tokens
  const s = await startServer(['-m', longContextModel(), '--batch', String(chunk), '--kv-budget-mib', '256',
    '--api-key', 'solo', '--api-key', 'load']);
  servers.push(s);
  const mk = (k) => new OpenAI({ apiKey: k, baseURL: s.baseURL, maxRetries: 0, timeout: 120000 });
  const model = 'ctx4096-model';
  let seed = 12345;
  // Long enough that its prefill (~0.1 s alone here) stays well above the OS's occasional
  // ~60 ms hold on a thread of this shared 2-core machine, which the relative bound below
  // must not mistake for a stall.
  const longTokens = 3500;
  const longPrompt = () => Array.from({ length: longTokens }, () => {
    seed = (seed * 1103515245 + 12345) % 2147483648;
    return 3 + (seed % 497);
  });
  const timeLong = async (key) => {
    const t0 = performance.now();
    const r = await mk(key).completions.create({ model, prompt: longPrompt(), max_tokens: 1, temperature: 0 });
    assert.equal(r.usage.prompt_tokens, longTokens);
    assert.equal(r.usage.prompt_tokens_details.cached_tokens, 0);
    return performance.now() - t0;
  };
  await timeLong('solo');  // warm-up
  const alone = Math.min(await timeLong('solo'), await timeLong('solo'));
  const chunkMs = alone / Math.ceil(longTokens / chunk);

  // 8 streams decode; once each has produced 30 chunks, the long prompt arrives.
  const times = Array.from({ length: 8 }, () => []);
  let release;
  const ready = new Promise((r) => { release = r; });
  // The streams are read with a minimal SSE reader (see streamEvents): ~8,000 chunks/s
  // here, more than the openai client parses on a shared 2-core machine.
  const streams = times.map((ts, i) => streamEvents(s.port, {
    apiKey: 'load',
    body: { model, prompt: `Stream ${i}: once upon a time`, max_tokens: 700, temperature: 0, ignore_eos: true },
  }, (c, at) => {
    if (c.choices[0]?.text) ts.push(at);
    if (times.every((t) => t.length >= 30)) release();
  }));
  await ready;
  const tSend = performance.now();
  const longMs = await timeLong('load');
  const tDone = tSend + longMs;
  await Promise.all(streams);

  const gaps = (ts, from, to) => {
    const g = [];
    for (let k = 1; k < ts.length; ++k) if (ts[k] > from && ts[k - 1] < to) g.push(ts[k] - ts[k - 1]);
    return g;
  };
  const during = times.flatMap((ts) => gaps(ts, tSend, tDone));
  const baseline = times.flatMap((ts) => gaps(ts, 0, tSend)).sort((a, b) => a - b);
  const p50 = baseline[Math.floor(baseline.length / 2)];
  const maxGap = Math.max(...during);
  console.log(`# long prompt alone ${alone.toFixed(1)} ms (~${chunkMs.toFixed(1)} ms per ${chunk}-token chunk); ` +
    `under load ${longMs.toFixed(1)} ms; stream gap p50 ${p50.toFixed(2)} ms, max during prefill ${maxGap.toFixed(1)} ms`);
  assert.ok(during.length > 8 * 5, 'the streams did not decode while the long prompt was prefilled');
  // Generous bound: a few chunks plus scheduling noise on a shared 2-core machine (the OS
  // can hold a thread back ~100 ms), far below the whole prefill; exact gaps are reported
  // by `attic bench serve`, not asserted here.
  assert.ok(maxGap <= 4 * chunkMs + 4 * p50 + 120, `a stream stalled ${maxGap.toFixed(1)} ms (chunk ~${chunkMs.toFixed(1)} ms)`);
  assert.ok(maxGap < 0.5 * longMs, `a stream stalled ${maxGap.toFixed(1)} ms of a ${longMs.toFixed(1)} ms prefill`);
  for (const ts of times) assert.ok(ts.length > 350, `a stream produced only ${ts.length} chunks`);
});
