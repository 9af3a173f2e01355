// The Anthropic Messages API (POST /v1/messages) through the official @anthropic-ai/sdk:
// messages.create, the stream helper, stop sequences and max_tokens, prompt caching
// (cache_control) reported as cache reads on the second turn of a conversation, the SSE
// event sequence as sent, and errors in Anthropic's shape. The same conversation through
// /v1/chat/completions (the openai client) is the reference for text and token counts.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import Anthropic from '@anthropic-ai/sdk';
import OpenAI from 'openai';
import { startServer, stories, request } from './lib/server.mjs';

let server;
const anthropic = (apiKey = 'k') => new Anthropic({ apiKey, baseURL: server.url, maxRetries: 0, timeout: 120000 });
const openai = () => new OpenAI({ apiKey: 'k', baseURL: server.baseURL, maxRetries: 0, timeout: 120000 });
const model = 'stories260K-hf';

before(async () => {
  // --deterministic: a greedy reply is the same whatever shares its steps.
  server = await startServer(['-m', stories, '--chat-template', 'chatml', '--deterministic', '--api-key', 'k',
    '--api-key', 'k-cache']);
});
after(async () => {
  const r = await server.stop();
  assert.equal(r.code, 0, `server exit: ${JSON.stringify(r)}\n${server.log()}`);
});

const total = (u) => u.input_tokens + u.cache_read_input_tokens + u.cache_creation_input_tokens;

test('messages.create: a text reply in Anthropic\'s shape, the same as the chat completion', async () => {
  const m = await anthropic().messages.create({
    model, max_tokens: 20, temperature: 0, system: 'You tell stories.', messages: [{ role: 'user', content: 'Once upon a time' }],
  });
  assert.equal(m.type, 'message');
  assert.equal(m.role, 'assistant');
  assert.match(m.id, /^msg_/);
  assert.equal(m.model, model);
  assert.equal(m.content.length, 1);
  assert.equal(m.content[0].type, 'text');
  assert.ok(['end_turn', 'max_tokens'].includes(m.stop_reason));
  assert.equal(m.stop_sequence, null);
  for (const k of ['input_tokens', 'output_tokens', 'cache_read_input_tokens', 'cache_creation_input_tokens'])
    assert.equal(typeof m.usage[k], 'number', k);
  // No cache_control: nothing is reported as written to the cache.
  assert.equal(m.usage.cache_creation_input_tokens, 0);
  const c = await openai().chat.completions.create({
    model, max_tokens: 20, temperature: 0,
    messages: [{ role: 'system', content: 'You tell stories.' }, { role: 'user', content: 'Once upon a time' }],
  });
  assert.equal(m.content[0].text, c.choices[0].message.content);
  assert.equal(total(m.usage), c.usage.prompt_tokens);
  assert.equal(m.usage.output_tokens, c.usage.completion_tokens);
});

test('a two-turn conversation with a cache_control block reads the cache on the second turn', async () => {
  const system = [{ type: 'text', text: 'You are a storyteller who loves dragons and tea parties. (cache test)',
    cache_control: { type: 'ephemeral' } }];
  const messages = [{ role: 'user', content: [{ type: 'text', text: 'Tell me about a red dragon.' }] }];
  // A tenant of its own: no earlier request's KV shares a prefix with this one.
  const t1 = await anthropic('k-cache').messages.create({ model, max_tokens: 16, temperature: 0, system, messages });
  assert.equal(t1.usage.cache_read_input_tokens, 0);
  assert.ok(t1.usage.cache_creation_input_tokens > 0, JSON.stringify(t1.usage));
  assert.ok(t1.usage.input_tokens > 0, 'the user turn after the breakpoint is plain input');
  messages.push({ role: 'assistant', content: t1.content[0].text || '...' });
  messages.push({ role: 'user', content: 'And then?' });
  const t2 = await anthropic('k-cache').messages.create({ model, max_tokens: 16, temperature: 0, system, messages });
  assert.ok(t2.usage.cache_read_input_tokens > 0, JSON.stringify(t2.usage));
  // The whole cached prefix (system up to its breakpoint) was read.
  assert.ok(t2.usage.cache_read_input_tokens >= t1.usage.cache_creation_input_tokens, JSON.stringify([t1.usage, t2.usage]));
  const c = await openai().chat.completions.create({
    model, max_tokens: 1, messages: [{ role: 'system', content: system[0].text }, ...messages.map((x) => ({
      role: x.role, content: typeof x.content === 'string' ? x.content : x.content.map((b) => b.text).join('') }))],
  });
  assert.equal(total(t2.usage), c.usage.prompt_tokens);
});

test('the stream helper: text deltas, the final message, usage with cache reads', async () => {
  const params = {
    model, max_tokens: 24, temperature: 0, system: [{ type: 'text', text: 'Stream test system prompt.', cache_control: { type: 'ephemeral', ttl: '1h' } }],
    messages: [{ role: 'user', content: 'A cat sat' }],
  };
  const whole = await anthropic().messages.create(params);
  let text = '';
  const stream = anthropic().messages.stream(params);
  stream.on('text', (t) => { text += t; });
  const final = await stream.finalMessage();
  assert.equal(text, whole.content[0].text);
  assert.equal(final.content[0].text, whole.content[0].text);
  assert.equal(final.stop_reason, whole.stop_reason);
  assert.equal(final.usage.output_tokens, whole.usage.output_tokens);
  assert.equal(total(final.usage), total(whole.usage));
  assert.ok(final.usage.cache_read_input_tokens > 0, 'the second identical request reads the cache');
});

test('the SSE events come in Anthropic\'s order', async () => {
  const events = [];
  const r = await request(server.port, {
    path: '/v1/messages', headers: { 'content-type': 'application/json', 'x-api-key': 'k', 'anthropic-version': '2023-06-01' },
    body: JSON.stringify({ model, max_tokens: 8, temperature: 0, stream: true, messages: [{ role: 'user', content: 'Hi' }] }),
  });
  assert.equal(r.status, 200);
  assert.match(r.headers['content-type'], /text\/event-stream/);
  for (const block of r.body.split('\n\n').filter((b) => b.trim())) {
    const [ev, data] = block.split('\n');
    const name = ev.replace(/^event: /, '');
    const payload = JSON.parse(data.replace(/^data: /, ''));
    assert.equal(payload.type, name);
    events.push(payload);
  }
  const names = events.map((e) => e.type);
  assert.deepEqual(names.slice(0, 2), ['message_start', 'content_block_start']);
  assert.deepEqual(names.slice(-3), ['content_block_stop', 'message_delta', 'message_stop']);
  assert.ok(names.slice(2, -3).every((n) => n === 'content_block_delta'));
  assert.equal(events[0].message.content.length, 0);
  assert.equal(events[1].content_block.type, 'text');
  const delta = events.at(-2);
  assert.equal(delta.usage.output_tokens, 8);
  assert.equal(delta.delta.stop_reason, 'max_tokens');
});

test('stop_sequences end the reply before the sequence; max_tokens ends it at the limit', async () => {
  const base = { model, temperature: 0, messages: [{ role: 'user', content: 'Once upon a time, there was' }] };
  const free = await anthropic().messages.create({ ...base, max_tokens: 40 });
  const words = free.content[0].text.split(' ').filter((w) => w.length > 2);
  assert.ok(words.length >= 3, free.content[0].text);
  const stop = words[2];
  const cut = await anthropic().messages.create({ ...base, max_tokens: 40, stop_sequences: ['zzzq', stop] });
  assert.equal(cut.stop_reason, 'stop_sequence');
  assert.equal(cut.stop_sequence, stop);
  assert.equal(cut.content[0].text, free.content[0].text.slice(0, free.content[0].text.indexOf(stop)));
  const short = await anthropic().messages.create({ ...base, max_tokens: 3 });
  assert.equal(short.stop_reason, 'max_tokens');
  assert.equal(short.usage.output_tokens, 3);
});

test('errors are in Anthropic\'s shape, and bad fields are 400s naming them', async () => {
  const ok = { model, max_tokens: 4, messages: [{ role: 'user', content: 'x' }] };
  const cases = [
    [{ ...ok, max_tokens: undefined }, 'max_tokens'],
    [{ ...ok, max_tokens: 0 }, 'max_tokens'],
    [{ ...ok, max_tokens: 1.5 }, 'max_tokens'],
    [{ ...ok, model: undefined }, 'model'],
    [{ ...ok, messages: [] }, 'messages'],
    [{ ...ok, messages: [{ role: 'system', content: 'x' }] }, 'messages[0].role'],
    [{ ...ok, messages: [{ role: 'user' }] }, 'messages[0].content'],
    [{ ...ok, messages: [{ role: 'user', content: '' }] }, 'messages[0].content'],
    [{ ...ok, messages: [{ role: 'user', content: [{ type: 'image', source: {} }] }] }, 'messages[0].content[0].type'],
    [{ ...ok, messages: [{ role: 'user', content: [{ type: 'text', text: '' }] }] }, 'messages[0].content[0].text'],
    [{ ...ok, messages: [{ role: 'user', content: [{ type: 'text', text: 'a', cache_control: { type: 'persistent' } }] }] },
      'messages[0].content[0].cache_control'],
    [{ ...ok, messages: [{ role: 'user', content: [{ type: 'text', text: 'a', cache_control: { type: 'ephemeral', ttl: '2h' } }] }] },
      'messages[0].content[0].cache_control.ttl'],
    [{ ...ok, messages: [{ role: 'user', content: Array.from({ length: 5 }, () => ({ type: 'text', text: 'a', cache_control: { type: 'ephemeral' } })) }] },
      'messages[0].content[4].cache_control'],
    [{ ...ok, messages: [{ role: 'user', content: 'x' }, { role: 'assistant', content: 'y' }] }, 'messages'],
    [{ ...ok, system: 5 }, 'system'],
    [{ ...ok, temperature: 1.5 }, 'temperature'],
    [{ ...ok, top_p: 0 }, 'top_p'],
    [{ ...ok, top_k: -1 }, 'top_k'],
    [{ ...ok, stop_sequences: 'x' }, 'stop_sequences'],
    [{ ...ok, stop_sequences: [''] }, 'stop_sequences'],
    [{ ...ok, stream: 'yes' }, 'stream'],
    [{ ...ok, metadata: 'x' }, 'metadata'],
    [{ ...ok, tools: [{ name: 'f', input_schema: { type: 'object' } }] }, 'tools'],
    [{ ...ok, thinking: { type: 'enabled', budget_tokens: 1024 } }, 'thinking'],
  ];
  for (const [body, param] of cases) {
    const r = await request(server.port, {
      path: '/v1/messages', headers: { 'content-type': 'application/json', 'x-api-key': 'k' }, body: JSON.stringify(body),
    });
    assert.equal(r.status, 400, `${JSON.stringify(body).slice(0, 150)}: ${r.body}`);
    const j = JSON.parse(r.body);
    assert.equal(j.type, 'error');
    assert.equal(j.error.type, 'invalid_request_error');
    assert.ok(j.error.message.includes(param), `${param}: ${j.error.message}`);
  }
  for (const [body, status, type] of [['{"model":', 400, 'invalid_request_error'], ['[]', 400, 'invalid_request_error'],
    [JSON.stringify({ ...ok, model: 'nope' }), 404, 'not_found_error']]) {
    const r = await request(server.port, { path: '/v1/messages', headers: { 'content-type': 'application/json', 'x-api-key': 'k' }, body });
    assert.equal(r.status, status, r.body);
    assert.equal(JSON.parse(r.body).error.type, type);
  }
  // Through the SDK: its error classes, with Anthropic's error object.
  await assert.rejects(anthropic('wrong').messages.create(ok), (e) => e instanceof Anthropic.AuthenticationError && e.status === 401 &&
    e.error.type === 'error' && e.error.error.type === 'authentication_error');
  await assert.rejects(anthropic().messages.create({ ...ok, max_tokens: 0 }), (e) => e instanceof Anthropic.BadRequestError &&
    e.error.error.type === 'invalid_request_error');
  await assert.rejects(anthropic().messages.stream({ ...ok, temperature: 7 }).finalMessage(),
    (e) => e instanceof Anthropic.BadRequestError);
});
