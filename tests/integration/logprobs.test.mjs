// Logprobs through the official openai client, against the independent float64 forward
// pass (lib/reference_llama.mjs) on stories260K:
//   - completions `echo` + `logprobs` (+ `max_tokens: 0`: lm-evaluation-harness's
//     loglikelihood request): every prompt token's logprob and top alternatives;
//   - completions and chat sampled-token logprobs and top_logprobs, streaming and not;
//   - the values are the model's distribution (log-softmax at temperature 1): sampling
//     at another temperature does not change them;
//   - bad values are 400s naming the field.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import OpenAI from 'openai';
import { startServer, stories } from './lib/server.mjs';
import { loadReference } from './lib/reference_llama.mjs';

let server;
const client = () => new OpenAI({ apiKey: 'k', baseURL: server.baseURL, maxRetries: 0, timeout: 120000 });
const model = 'stories260K-hf';
const reference = loadReference(stories);
// Attic's float32 logits are within 1e-4 of golden_reference.json (tests/engine/golden_test.cc)
// and the reference's within 1e-3 (serve.test.mjs), so within 1.1e-3 of each other; a
// log-softmax value moves by at most twice the largest logit error (the token's logit and
// the log-sum-exp each move by at most it).
const TOL = 2.2e-3;

before(async () => {
  server = await startServer(['-m', stories, '--chat-template', 'chatml', '--api-key', 'k']);
});
after(async () => {
  const r = await server.stop();
  assert.equal(r.code, 0, `server exit: ${JSON.stringify(r)}\n${server.log()}`);
});

function logSoftmax(logits) {
  const m = Math.max(...logits);
  let z = 0;
  for (const v of logits) z += Math.exp(v - m);
  const lse = m + Math.log(z);
  return Array.from(logits, (v) => v - lse);
}

// OpenAI's token strings: the text when it is valid UTF-8; else completions spell the
// bytes "bytes:\xNN" and chat puts U+FFFD for them (with the exact bytes beside).
function completionString(bytes) {
  const text = new TextDecoder('utf-8', { fatal: false }).decode(bytes);
  if (!text.includes('\uFFFD')) return text;
  return 'bytes:' + [...bytes].map((b) => '\\x' + b.toString(16).padStart(2, '0')).join('');
}
const chatString = (bytes) => new TextDecoder('utf-8', { fatal: false }).decode(bytes);

// Every (string, logprob) of a top list is a token with that string whose reference
// logprob is within TOL, listed most likely first, and no token left out is likelier
// than the least likely listed (beyond TOL).
function checkTop(entries, ref, stringOf, n, where) {
  assert.ok(entries.length <= n && entries.length >= 1, `${where}: ${entries.length} alternatives`);
  for (let i = 0; i < entries.length; i++) {
    const [s, lp] = entries[i];
    const ids = ref.map((_, id) => id).filter((id) => stringOf(id) === s);
    assert.ok(ids.some((id) => Math.abs(ref[id] - lp) <= TOL), `${where}: ${JSON.stringify(s)} ${lp}`);
    if (i > 0) assert.ok(lp <= entries[i - 1][1] + 1e-12, `${where}: not most likely first`);
  }
  const sorted = [...ref].sort((a, b) => b - a);
  assert.ok(entries[entries.length - 1][1] >= sorted[n - 1] - TOL, `${where}: a likelier token is missing`);
}

const completionOf = (id) => completionString(reference.tokenBytes(id));
const chatOf = (id) => chatString(reference.tokenBytes(id));

test('completions echo + logprobs + max_tokens 0 (loglikelihood): every prompt token against the reference', async () => {
  const prompt = [1, ...(await client().post('/tokenize', {
    body: { model, prompt: 'Once upon a time, there was a little girl named Lily. She liked to play', add_special_tokens: false },
  })).tokens];
  const r = await client().completions.create({ model, prompt, echo: true, logprobs: 5, max_tokens: 0, temperature: 0 });
  const c = r.choices[0];
  assert.equal(c.finish_reason, 'length');
  assert.equal(r.usage.completion_tokens, 0);
  assert.equal(r.usage.prompt_tokens, prompt.length);
  // The echoed text is the prompt's, decoded (no completion).
  const detok = await client().post('/detokenize', { body: { model, tokens: prompt } });
  assert.equal(c.text, detok.prompt);
  const lp = c.logprobs;
  assert.equal(lp.tokens.length, prompt.length);
  assert.deepEqual(lp.tokens, prompt.map(completionOf));
  assert.equal(lp.token_logprobs[0], null);
  assert.equal(lp.top_logprobs[0], null);
  const logits = reference.logitsAfterEach(prompt);
  let worst = 0;
  for (let i = 1; i < prompt.length; i++) {
    const ref = logSoftmax(logits[i - 1]);
    worst = Math.max(worst, Math.abs(lp.token_logprobs[i] - ref[prompt[i]]));
    checkTop(Object.entries(lp.top_logprobs[i]).sort((a, b) => b[1] - a[1]), ref, completionOf, 5, `prompt token ${i}`);
  }
  assert.ok(worst <= TOL, `prompt logprobs differ from the reference by ${worst}`);
  // text_offset: where each token string starts in the returned text's token strings.
  let at = 0;
  lp.tokens.forEach((t, i) => { assert.equal(lp.text_offset[i], at); at += [...t].length; });
});

test('completions echo + logprobs with sampled tokens (greedy): prompt then completion, both against the reference', async () => {
  const prompt = [1, ...(await client().post('/tokenize', {
    body: { model, prompt: 'The dog ran to the', add_special_tokens: false },
  })).tokens];
  const n = 10;
  const body = { model, prompt, echo: true, logprobs: 2, max_tokens: n, temperature: 0, ignore_eos: true };
  const r = await client().completions.create(body);
  const { ids } = reference.greedy(prompt, n, []);
  const all = [...prompt, ...ids];
  const lp = r.choices[0].logprobs;
  assert.deepEqual(lp.tokens, all.map(completionOf));
  const logits = reference.logitsAfterEach(all);
  let worst = 0;
  for (let i = 1; i < all.length; i++) {
    const ref = logSoftmax(logits[i - 1]);
    worst = Math.max(worst, Math.abs(lp.token_logprobs[i] - ref[all[i]]));
    checkTop(Object.entries(lp.top_logprobs[i]).sort((a, b) => b[1] - a[1]), ref, completionOf, 2, `token ${i}`);
  }
  assert.ok(worst <= TOL, `logprobs differ from the reference by ${worst}`);
  // Streaming: the same tokens and values, the echo first.
  const stream = await client().completions.create({ ...body, stream: true });
  const tokens = [];
  const values = [];
  let text = '';
  for await (const chunk of stream) {
    const ch = chunk.choices[0];
    text += ch.text;
    if (ch.logprobs) { tokens.push(...ch.logprobs.tokens); values.push(...ch.logprobs.token_logprobs); }
  }
  assert.equal(text, r.choices[0].text);
  assert.deepEqual(tokens, lp.tokens);
  values.forEach((v, i) => assert.ok(v === lp.token_logprobs[i] || Math.abs(v - lp.token_logprobs[i]) <= 1e-9));
});

test('chat logprobs + top_logprobs (greedy, streaming and not) equal the reference', async () => {
  const messages = [{ role: 'user', content: 'Tell me about a cat.' }];
  const ids = (await client().post('/tokenize', { body: { model, messages } })).tokens;
  const n = 12;
  const body = { model, messages, logprobs: true, top_logprobs: 3, max_tokens: n, temperature: 0 };
  const r = await client().chat.completions.create(body);
  const content = r.choices[0].logprobs.content;
  const { ids: greedy } = reference.greedy(ids, n, []);
  assert.equal(content.length, n);
  const logits = reference.logitsAfterEach([...ids, ...greedy]);
  let worst = 0;
  const refs = [];
  content.forEach((e, i) => {
    const id = greedy[i];
    assert.equal(e.token, chatOf(id));
    assert.deepEqual(e.bytes, [...reference.tokenBytes(id)]);
    const ref = logSoftmax(logits[ids.length - 1 + i]);
    refs.push(ref[id]);
    worst = Math.max(worst, Math.abs(e.logprob - ref[id]));
    assert.equal(e.top_logprobs.length, 3);
    assert.equal(e.top_logprobs[0].token, e.token);  // greedy: the likeliest
    checkTop(e.top_logprobs.map((t) => [t.token, t.logprob]), ref, chatOf, 3, `token ${i}`);
  });
  assert.ok(worst <= TOL, `chat logprobs differ from the reference by ${worst}`);
  assert.equal(r.choices[0].logprobs.refusal, null);
  const stream = await client().chat.completions.create({ ...body, stream: true });
  const streamed = [];
  for await (const chunk of stream) if (chunk.choices[0]?.logprobs) streamed.push(...chunk.choices[0].logprobs.content);
  assert.deepEqual(streamed.map((e) => e.token), content.map((e) => e.token));
  // (The second request reuses the first's prompt KV, computed in another batch: equal to
  // the reference within TOL, not to the bit.)
  streamed.forEach((e, i) => assert.ok(Math.abs(e.logprob - refs[i]) <= TOL, `streamed token ${i}`));
  // Without logprobs: null.
  const plain = await client().chat.completions.create({ model, messages, max_tokens: 2 });
  assert.equal(plain.choices[0].logprobs, null);
});

test('logprobs are the model\'s distribution: sampling at temperature 1.5 does not change them', async () => {
  const messages = [{ role: 'user', content: 'Sing.' }];
  const ids = (await client().post('/tokenize', { body: { model, messages } })).tokens;
  const r = await client().chat.completions.create({
    model, messages, logprobs: true, max_tokens: 10, temperature: 1.5, top_p: 0.9, seed: 7,
  });
  const content = r.choices[0].logprobs.content;
  assert.ok(content.length >= 1);
  // The sampled ids, from their strings (unique in this vocabulary but for byte pieces,
  // which a sampled token rarely is: then any id with the string must match).
  const sampled = [];
  let worst = 0;
  for (let i = 0; i < content.length; i++) {
    const candidates = Array.from({ length: reference.vocabSize }, (_, id) => id)
      .filter((id) => chatOf(id) === content[i].token && Buffer.compare(reference.tokenBytes(id), Buffer.from(content[i].bytes)) === 0);
    assert.ok(candidates.length >= 1, content[i].token);
    const ref = logSoftmax(reference.logitsAfterEach([...ids, ...sampled]).at(-1));
    const err = Math.min(...candidates.map((id) => Math.abs(ref[id] - content[i].logprob)));
    worst = Math.max(worst, err);
    sampled.push(candidates.reduce((a, b) => (Math.abs(ref[a] - content[i].logprob) <= Math.abs(ref[b] - content[i].logprob) ? a : b)));
  }
  assert.ok(worst <= TOL, `sampled-token logprobs differ from the temperature-1 reference by ${worst}`);
});

test('bad logprobs fields are 400s naming the field', async () => {
  const messages = [{ role: 'user', content: 'hi' }];
  const cases = [
    [() => client().chat.completions.create({ model, messages, logprobs: true, top_logprobs: 21 }), 'top_logprobs'],
    [() => client().chat.completions.create({ model, messages, top_logprobs: 2 }), 'top_logprobs'],
    [() => client().chat.completions.create({ model, messages, logprobs: 'yes' }), 'logprobs'],
    [() => client().completions.create({ model, prompt: 'a', logprobs: 21 }), 'logprobs'],
    [() => client().completions.create({ model, prompt: 'a', echo: 'yes' }), 'echo'],
    [() => client().completions.create({ model, prompt: 'a', max_tokens: 0 }), 'max_tokens'],
  ];
  for (const [call, param] of cases) {
    await assert.rejects(call, (e) => {
      assert.equal(e.status, 400);
      assert.equal(e.error?.param ?? e.param, param);
      return true;
    });
  }
});
