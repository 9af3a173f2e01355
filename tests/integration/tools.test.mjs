// Tools (function calling) through the official openai client against stories260K -- a
// model that never writes a tool call by itself, so with tool_choice "required" or a named
// function every call comes from the grammar. The arguments are validated with zod
// schemas written independently of the JSON Schemas the server decodes under (and, for
// zodFunction tools, by the client's own parse helper). Also: streamed calls as OpenAI's
// deltas (equal to the non-streamed calls of a greedy request), tool_choice "none" and
// "auto", a tool-result turn that reuses the conversation's stored KV, and 400s. The
// Mistral family (--chat-template mistral on the same model: no model at hand has a
// Mistral template) on a second server: its 9-character ids, OpenAI-style ids sent back,
// streamed calls, the tool-result turn's reuse, and its 400s. Streamed calls whose
// arguments arrive in pieces in each family (a third server renders Llama 3.1's format),
// and /tokenize with tools against the template as jinja2 renders it.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import fs from 'node:fs';
import OpenAI from 'openai';
import { zodFunction } from 'openai/helpers/zod';
import { z } from 'zod';
import { startServer, stories, request } from './lib/server.mjs';

let server;
let mistral;  // the same model rendered in the Mistral family's format
let llama;    // ... and in Llama 3.1's
const client = () => new OpenAI({ apiKey: 'k', baseURL: server.baseURL, maxRetries: 0, timeout: 120000 });
const mistralClient = () => new OpenAI({ apiKey: 'k', baseURL: mistral.baseURL, maxRetries: 0, timeout: 120000 });
const llamaClient = () => new OpenAI({ apiKey: 'k', baseURL: llama.baseURL, maxRetries: 0, timeout: 120000 });
const model = 'stories260K-hf';

before(async () => {
  // The tools block of the ChatML (Qwen2.5) format alone is longer than stories260K's 512
  // trained positions: a 2048-token window (RoPE takes any position).
  server = await startServer(['-m', stories, '--chat-template', 'chatml', '--ctx', '2048', '--api-key', 'k']);
  mistral = await startServer(['-m', stories, '--chat-template', 'mistral', '--ctx', '2048', '--api-key', 'k']);
  llama = await startServer(['-m', stories, '--chat-template', 'llama3', '--ctx', '2048', '--api-key', 'k']);
});
after(async () => {
  for (const s of [server, mistral, llama]) {
    const r = await s.stop();
    assert.equal(r.code, 0, `server exit: ${JSON.stringify(r)}\n${s.log()}`);
  }
});

// The JSON Schemas the server sees, and zod schemas for the same arguments (the check).
const tools = [
  {
    type: 'function',
    function: {
      name: 'get_weather',
      description: 'Weather in a city',
      parameters: {
        type: 'object',
        properties: {
          city: { type: 'string', minLength: 1, maxLength: 12 },
          unit: { type: 'string', enum: ['c', 'f'] },
          days: { type: 'integer', minimum: 1, maximum: 7 },
        },
        required: ['city', 'unit'],
        additionalProperties: false,
      },
    },
  },
  {
    type: 'function',
    function: {
      name: 'search',
      parameters: {
        type: 'object',
        properties: { query: { type: 'string', maxLength: 16 }, tags: { type: 'array', items: { type: 'string', maxLength: 6 }, maxItems: 2 } },
        required: ['query'],
      },
    },
  },
];
const argSchemas = {
  get_weather: z.object({ city: z.string().min(1).max(12), unit: z.enum(['c', 'f']), days: z.number().int().min(1).max(7).optional() }).strict(),
  search: z.object({ query: z.string().max(16), tags: z.array(z.string().max(6)).max(2).optional() }).strict(),
};

function checkCalls(calls, names, idPattern = /^call_[0-9a-f]+$/) {
  assert.ok(Array.isArray(calls) && calls.length > 0, 'no tool_calls');
  for (const c of calls) {
    assert.equal(c.type, 'function');
    assert.match(c.id, idPattern);
    assert.ok(names.includes(c.function.name), `unexpected function ${c.function.name}`);
    assert.equal(typeof c.function.arguments, 'string');
    argSchemas[c.function.name].parse(JSON.parse(c.function.arguments));  // throws if invalid
  }
  assert.equal(new Set(calls.map((c) => c.id)).size, calls.length, 'ids are unique');
}

const ask = [{ role: 'user', content: 'What is the weather in Paris?' }];

test('tool_choice "required" returns calls whose arguments validate (stories260K)', async () => {
  for (const sampling of [{ temperature: 0 }, { temperature: 1, seed: 3 }, { temperature: 1, seed: 4 }, { temperature: 1.5, seed: 5 }]) {
    const r = await client().chat.completions.create({ model, messages: ask, tools, tool_choice: 'required', max_tokens: 120, ...sampling });
    const ch = r.choices[0];
    assert.equal(ch.finish_reason, 'tool_calls', JSON.stringify(ch.message));
    assert.equal(ch.message.content, null);
    checkCalls(ch.message.tool_calls, ['get_weather', 'search']);
  }
});

test('a named function and parallel_tool_calls: false give exactly one call of it', async () => {
  for (const seed of [1, 2, 3]) {
    const named = await client().chat.completions.create({
      model, messages: ask, tools, tool_choice: { type: 'function', function: { name: 'search' } }, max_tokens: 100, temperature: 1, seed,
    });
    checkCalls(named.choices[0].message.tool_calls, ['search']);
    assert.equal(named.choices[0].message.tool_calls.length, 1);
    const single = await client().chat.completions.create({
      model, messages: ask, tools, tool_choice: 'required', parallel_tool_calls: false, max_tokens: 100, temperature: 1, seed,
    });
    assert.equal(single.choices[0].message.tool_calls.length, 1);
    checkCalls(single.choices[0].message.tool_calls, ['get_weather', 'search']);
  }
});

test('zodFunction tools: the client parses and validates the arguments (strict schemas)', async () => {
  const Lookup = z.object({ word: z.string().max(10), lang: z.enum(['en', 'fr']) });
  const r = await client().chat.completions.parse({
    model, messages: [{ role: 'user', content: 'Define cat.' }], tools: [zodFunction({ name: 'lookup', parameters: Lookup })],
    tool_choice: 'required', max_tokens: 80, temperature: 0,
  });
  const call = r.choices[0].message.tool_calls[0];
  assert.equal(call.function.name, 'lookup');
  assert.deepEqual(call.function.parsed_arguments, Lookup.parse(JSON.parse(call.function.arguments)));
});

test('streamed calls arrive as OpenAI deltas and equal the non-streamed calls', async () => {
  const body = { model, messages: ask, tools, tool_choice: 'required', max_tokens: 120, temperature: 0 };
  const whole = await client().chat.completions.create(body);
  const stream = await client().chat.completions.create({ ...body, stream: true, stream_options: { include_usage: true } });
  const calls = [];
  let finish = null;
  let content = '';
  let usage = null;
  for await (const chunk of stream) {
    if (chunk.usage) usage = chunk.usage;
    const ch = chunk.choices[0];
    if (!ch) continue;
    if (ch.delta.content) content += ch.delta.content;
    for (const d of ch.delta.tool_calls ?? []) {
      if (d.id) {
        assert.equal(d.index, calls.length, 'a new call opens at the next index');
        assert.equal(d.type, 'function');
        calls.push({ id: d.id, type: 'function', function: { name: d.function.name, arguments: d.function.arguments ?? '' } });
      } else {
        calls[d.index].function.arguments += d.function.arguments;
      }
    }
    if (ch.finish_reason) finish = ch.finish_reason;
  }
  assert.equal(finish, 'tool_calls');
  assert.equal(content, '');
  checkCalls(calls, ['get_weather', 'search']);
  const strip = (cs) => cs.map((c) => ({ name: c.function.name, arguments: c.function.arguments }));
  assert.deepEqual(strip(calls), strip(whole.choices[0].message.tool_calls));
  assert.equal(usage.completion_tokens, whole.usage.completion_tokens);
  // The client's stream helper assembles the same calls.
  const helper = client().chat.completions.stream(body);
  const final = await helper.finalChatCompletion();
  assert.deepEqual(strip(final.choices[0].message.tool_calls), strip(calls));
});

// Reads a chat stream as a client that follows OpenAI's tool-call deltas would: a call's
// first delta has its index, id, type, name and arguments ""; the next ones only the index
// and a piece of the arguments.
async function readToolStream(stream) {
  const calls = [];
  const pieces = [];  // per call: the deltas that carried a piece of its arguments
  let finish = null;
  let content = '';
  for await (const chunk of stream) {
    const ch = chunk.choices[0];
    if (!ch) continue;
    if (ch.delta.content) content += ch.delta.content;
    for (const d of ch.delta.tool_calls ?? []) {
      if (d.id !== undefined) {
        assert.equal(d.index, calls.length, 'a new call opens at the next index');
        assert.equal(d.type, 'function');
        assert.equal(d.function.arguments, '', 'the first delta of a call carries arguments ""');
        calls.push({ id: d.id, type: 'function', function: { name: d.function.name, arguments: '' } });
        pieces.push(0);
      } else {
        assert.deepEqual(Object.keys(d).sort(), ['function', 'index']);
        assert.deepEqual(Object.keys(d.function), ['arguments']);
        assert.ok(d.function.arguments.length > 0, 'an empty piece');
        assert.ok(d.index < calls.length, `a piece of call ${d.index}, which did not open`);
        calls[d.index].function.arguments += d.function.arguments;
        pieces[d.index] += 1;
      }
    }
    if (ch.finish_reason) finish = ch.finish_reason;
  }
  return { calls, pieces, finish, content };
}

test('streamed tool_choice "required": arguments arrive in pieces and add up to the non-streamed call (same seed), each family', async () => {
  const strip = (cs) => cs.map((c) => ({ name: c.function.name, arguments: c.function.arguments }));
  for (const [family, make, idPattern] of [['chatml', client, /^call_[0-9a-f]+$/], ['mistral', mistralClient, mistralId],
    ['llama3', llamaClient, /^call_[0-9a-f]+$/]]) {
    for (const sampling of [{ temperature: 1, seed: 11 }, { temperature: 0 }]) {
      const what = `${family} ${JSON.stringify(sampling)}`;
      const body = { model, messages: ask, tools, tool_choice: 'required', max_tokens: 120, ...sampling };
      const whole = await make().chat.completions.create(body);
      assert.equal(whole.choices[0].finish_reason, 'tool_calls', what);
      const r = await readToolStream(await make().chat.completions.create({ ...body, stream: true }));
      assert.equal(r.finish, 'tool_calls', what);
      assert.equal(r.content, '', what);
      checkCalls(r.calls, ['get_weather', 'search'], idPattern);  // the accumulated arguments parse and validate
      for (let i = 0; i < r.calls.length; i++)
        assert.ok(r.pieces[i] > 1, `${what}: call ${i}'s arguments came in ${r.pieces[i]} piece(s)`);
      assert.deepEqual(strip(r.calls), strip(whole.choices[0].message.tool_calls), what);
      if (sampling.temperature === 0) continue;
      // The client's own stream helper assembles the same calls.
      const final = await make().chat.completions.stream(body).finalChatCompletion();
      assert.deepEqual(strip(final.choices[0].message.tool_calls), strip(r.calls), what);
    }
  }
});

test('POST /tokenize takes tools and renders them as chat completions do', async () => {
  // The reference: Qwen2.5's template rendered by jinja2 (tools/tokref/gen_tool_reference.py),
  // tokenized as plain text; a system message, so the template's default one plays no part.
  const ref = JSON.parse(fs.readFileSync(new URL('../data/tokenizer/chat_tools_reference.json', import.meta.url)));
  const kase = ref.cases.find((c) => c.kind === 'chatml' && c.name === 'system, tools, a call and its result');
  const c = client();
  const t = await c.post('/tokenize', { body: { model, messages: kase.messages, tools: kase.tools } });
  const plain = await c.post('/tokenize', { body: { model, prompt: kase.expected, add_special_tokens: false } });
  assert.deepEqual(t.tokens, plain.tokens);
  assert.equal(t.count, plain.count);
  // = usage.prompt_tokens of the same chat; the tools are what the count adds.
  const done = await c.chat.completions.create({ model, messages: kase.messages, tools: kase.tools, max_tokens: 1, temperature: 0 });
  assert.equal(t.count, done.usage.prompt_tokens);
  const without = await c.post('/tokenize', { body: { model, messages: kase.messages } });
  assert.ok(without.count < t.count);
  // tool_choice and parallel_tool_calls are checked as for chat, and change nothing rendered.
  const forced = await c.post('/tokenize', { body: { model, messages: kase.messages, tools: kase.tools, tool_choice: 'required' } });
  assert.deepEqual(forced.tokens, t.tokens);
  const bad = [
    [{ messages: kase.messages, tools: 'x' }, 'tools'],
    [{ messages: kase.messages, tools: [{ type: 'function', function: { name: 'a b' } }] }, 'tools[0].function.name'],
    [{ messages: kase.messages, tool_choice: 'required' }, 'tool_choice'],
    [{ prompt: 'x', tools: kase.tools }, 'tools'],
  ];
  for (const [body, param] of bad) {
    const r = await request(server.port, {
      path: '/tokenize', headers: { 'content-type': 'application/json', authorization: 'Bearer k' }, body: JSON.stringify(body),
    });
    assert.equal(r.status, 400, r.body);
    assert.equal(JSON.parse(r.body).error.param, param, r.body);
    assert.equal(JSON.parse(r.body).error.type, 'invalid_request_error');
  }
});

test('tool_choice "none" and "auto": stories260K answers in text, no calls', async () => {
  for (const tool_choice of ['none', 'auto', undefined]) {
    const r = await client().chat.completions.create({ model, messages: ask, tools, tool_choice, max_tokens: 12, temperature: 0 });
    const ch = r.choices[0];
    assert.equal(ch.message.tool_calls, undefined, JSON.stringify(ch.message));
    assert.equal(typeof ch.message.content, 'string');
    assert.ok(['stop', 'length'].includes(ch.finish_reason));
  }
});

test('the turn after a tool result reuses the conversation\'s stored KV (cached_tokens)', async () => {
  const session_id = 'agent-tools-1';
  const messages = [{ role: 'system', content: 'You help.' }, { role: 'user', content: 'Weather in Rome?' }];
  const t1 = await client().chat.completions.create({
    model, messages, tools, tool_choice: { type: 'function', function: { name: 'get_weather' } }, max_tokens: 60, temperature: 0, session_id,
  });
  const call = t1.choices[0].message.tool_calls[0];
  checkCalls([call], ['get_weather']);
  messages.push({ role: 'assistant', content: null, tool_calls: [call] });
  messages.push({ role: 'tool', tool_call_id: call.id, content: '{"temp":21}' });
  const t2 = await client().chat.completions.create({ model, messages, tools, max_tokens: 16, temperature: 0, session_id });
  const cached = t2.usage.prompt_tokens_details.cached_tokens;
  assert.ok(cached > 0, 'the tool-result turn reused nothing');
  assert.ok(cached >= 0.8 * t1.usage.prompt_tokens, `reused only ${cached} of ${t1.usage.prompt_tokens}`);
  assert.ok(cached < t2.usage.prompt_tokens);
  // The next turn reuses the tool-result turn in turn.
  messages.push({ role: 'assistant', content: t2.choices[0].message.content ?? '' });
  messages.push({ role: 'user', content: 'Thanks.' });
  const t3 = await client().chat.completions.create({ model, messages, tools, max_tokens: 8, temperature: 0, session_id });
  assert.ok(t3.usage.prompt_tokens_details.cached_tokens >= 0.8 * t2.usage.prompt_tokens,
    `turn 3 reused ${t3.usage.prompt_tokens_details.cached_tokens} of ${t2.usage.prompt_tokens}`);
});

test('bad tool fields are 400s naming the field', async () => {
  const base = { model, messages: ask };
  const fn = (over) => ({ type: 'function', function: { name: 'f', parameters: { type: 'object', properties: {} }, ...over } });
  const cases = [
    [{ tools: 'x' }, 'tools'],
    [{ tools: [5] }, 'tools[0]'],
    [{ tools: [{ type: 'code_interpreter' }] }, 'tools[0].type'],
    [{ tools: [{ type: 'function' }] }, 'tools[0].function'],
    [{ tools: [fn({ name: 'bad name' })] }, 'tools[0].function.name'],
    [{ tools: [fn({ name: 'x'.repeat(65) })] }, 'tools[0].function.name'],
    [{ tools: [fn({ parameters: 'x' })] }, 'tools[0].function.parameters'],
    [{ tools: [fn({ description: 5 })] }, 'tools[0].function.description'],
    [{ tools: [fn({}), fn({})] }, 'tools[1].function.name'],
    [{ tools: Array.from({ length: 129 }, (_, i) => fn({ name: `f${i}` })) }, 'tools'],
    [{ tool_choice: 'required' }, 'tool_choice'],
    [{ tools: [fn({})], tool_choice: 'always' }, 'tool_choice'],
    [{ tools: [fn({})], tool_choice: { type: 'function', function: { name: 'g' } } }, 'tool_choice.function.name'],
    [{ tools: [fn({})], tool_choice: { type: 'function' } }, 'tool_choice'],
    [{ tools: [fn({})], parallel_tool_calls: 'yes' }, 'parallel_tool_calls'],
    [{ tools: [fn({ parameters: { type: 'object', properties: { a: { type: 'string', pattern: '^a' } } } })], tool_choice: 'required' }, 'tools'],
    [{ tools: [fn({ parameters: { type: 'string' } })], tool_choice: 'required' }, 'tools'],
    [{ tools: [fn({})], tool_choice: 'required', response_format: { type: 'json_object' } }, 'response_format'],
    [{ messages: [{ role: 'tool', content: 'x' }] }, 'messages[0].tool_call_id'],
    [{ messages: [{ role: 'user', content: 'x', tool_calls: [{ id: 'a', type: 'function', function: { name: 'f', arguments: '{}' } }] }] }, 'messages[0].tool_calls'],
    [{ messages: [{ role: 'assistant', content: null, tool_calls: [{ id: 'a', type: 'function', function: { name: 'f', arguments: {} } }] }] }, 'messages[0].tool_calls[0].function.arguments'],
    [{ messages: [{ role: 'assistant', tool_calls: [{ id: 'a', function: { arguments: '{}' } }] }] }, 'messages[0].tool_calls[0].function.name'],
    [{ messages: [{ role: 'assistant', tool_calls: 'x' }] }, 'messages[0].tool_calls'],
    [{ functions: [{ name: 'f' }] }, 'functions'],
  ];
  for (const [over, param] of cases) {
    const r = await request(server.port, {
      headers: { 'content-type': 'application/json', authorization: 'Bearer k' }, body: JSON.stringify({ ...base, ...over }),
    });
    assert.equal(r.status, 400, `${JSON.stringify(over).slice(0, 120)}: ${r.body}`);
    const e = JSON.parse(r.body).error;
    assert.equal(e.param, param, `${JSON.stringify(over).slice(0, 120)}: ${r.body}`);
    assert.equal(e.type, 'invalid_request_error');
    assert.ok(e.message.length > 0);
  }
  // A keyword outside the subset is named, with the function; in "auto" nothing is
  // decoded under the schema, so the same tool is accepted.
  const patterned = [fn({ parameters: { type: 'object', properties: { a: { type: 'string', format: 'email' } } } })];
  const bad = await request(server.port, {
    headers: { 'content-type': 'application/json', authorization: 'Bearer k' },
    body: JSON.stringify({ ...base, tools: patterned, tool_choice: 'required' }),
  });
  assert.match(JSON.parse(bad.body).error.message, /function 'f'.*'format'/);
  const ok = await client().chat.completions.create({ ...base, tools: patterned, max_tokens: 4 });
  assert.equal(ok.choices[0].message.tool_calls, undefined);
  // Completions take no tools.
  const compl = await request(server.port, {
    path: '/v1/completions', headers: { 'content-type': 'application/json', authorization: 'Bearer k' },
    body: JSON.stringify({ model, prompt: 'x', tools: [fn({})] }),
  });
  assert.equal(compl.status, 400);
  assert.equal(JSON.parse(compl.body).error.param, 'tools');
});

// The Mistral family: Mistral-7B-Instruct-v0.3's format, its ids of 9 alphanumerics.
const mistralId = /^[A-Za-z0-9]{9}$/;

test('Mistral family: forced calls with 9-character ids; streamed deltas equal the non-streamed calls', async () => {
  for (const sampling of [{ temperature: 0 }, { temperature: 1, seed: 3 }]) {
    const r = await mistralClient().chat.completions.create({ model, messages: ask, tools, tool_choice: 'required', max_tokens: 120, ...sampling });
    assert.equal(r.choices[0].finish_reason, 'tool_calls', JSON.stringify(r.choices[0].message));
    assert.equal(r.choices[0].message.content, null);
    checkCalls(r.choices[0].message.tool_calls, ['get_weather', 'search'], mistralId);
  }
  const named = await mistralClient().chat.completions.create({
    model, messages: ask, tools, tool_choice: { type: 'function', function: { name: 'search' } }, max_tokens: 100, temperature: 1, seed: 2,
  });
  assert.equal(named.choices[0].message.tool_calls.length, 1);
  checkCalls(named.choices[0].message.tool_calls, ['search'], mistralId);
  const body = { model, messages: ask, tools, tool_choice: 'required', max_tokens: 120, temperature: 0 };
  const whole = await mistralClient().chat.completions.create(body);
  const final = await mistralClient().chat.completions.stream(body).finalChatCompletion();
  const calls = final.choices[0].message.tool_calls;
  checkCalls(calls, ['get_weather', 'search'], mistralId);
  const strip = (cs) => cs.map((c) => ({ name: c.function.name, arguments: c.function.arguments }));
  assert.deepEqual(strip(calls), strip(whole.choices[0].message.tool_calls));
  assert.equal(final.choices[0].finish_reason, 'tool_calls');
});

test('Mistral family: ids sent back (its own, or OpenAI-style) render, and the tool-result turn reuses the stored KV', async () => {
  const session_id = 'agent-tools-mistral';
  const messages = [{ role: 'user', content: 'Weather in Rome?' }];
  const t1 = await mistralClient().chat.completions.create({
    model, messages, tools, tool_choice: { type: 'function', function: { name: 'get_weather' } }, max_tokens: 60, temperature: 0, session_id,
  });
  const call = t1.choices[0].message.tool_calls[0];
  checkCalls([call], ['get_weather'], mistralId);
  messages.push({ role: 'assistant', content: null, tool_calls: [call] });
  messages.push({ role: 'tool', tool_call_id: call.id, content: '{"temp":21}' });
  const t2 = await mistralClient().chat.completions.create({ model, messages, tools, max_tokens: 16, temperature: 0, session_id });
  const cached = t2.usage.prompt_tokens_details.cached_tokens;
  assert.ok(cached >= 0.8 * t1.usage.prompt_tokens, `reused only ${cached} of ${t1.usage.prompt_tokens}`);
  assert.ok(cached < t2.usage.prompt_tokens);
  // Ids the template would refuse (not 9 characters) are rendered as 9 alphanumerics: 200.
  const openaiStyle = [
    { role: 'system', content: 'You help.' },
    { role: 'user', content: 'Weather in Rome?' },
    { role: 'assistant', content: null, tool_calls: [
      { id: 'call_1', type: 'function', function: { name: 'get_weather', arguments: '{"city":"Rome","unit":"c"}' } },
      { id: 'call_abc_0123456789abcdef', type: 'function', function: { name: 'search', arguments: '{"query":"Rome"}' } }] },
    { role: 'tool', tool_call_id: 'call_1', content: '21' },
    { role: 'tool', tool_call_id: 'call_abc_0123456789abcdef', content: 'Rome is warm.' },
    { role: 'assistant', content: 'It is 21.' },
    { role: 'user', content: 'Thanks.' },
  ];
  const t3 = await mistralClient().chat.completions.create({ model, messages: openaiStyle, tools, max_tokens: 8, temperature: 0 });
  assert.ok(['stop', 'length'].includes(t3.choices[0].finish_reason));
});

test('Mistral family: conversations its template refuses are 400s naming messages', async () => {
  const cases = [
    [{ role: 'user', content: 'a' }, { role: 'user', content: 'b' }],
    [{ role: 'assistant', content: 'a' }],
    [{ role: 'user', content: 'a' }, { role: 'assistant', content: 'b' }, { role: 'system', content: 's' }, { role: 'user', content: 'c' }],
  ];
  for (const messages of cases) {
    for (const extra of [{}, { tools }]) {
      const r = await request(mistral.port, {
        headers: { 'content-type': 'application/json', authorization: 'Bearer k' }, body: JSON.stringify({ model, messages, ...extra }),
      });
      assert.equal(r.status, 400, `${JSON.stringify(messages)}: ${r.body}`);
      const e = JSON.parse(r.body).error;
      assert.equal(e.param, 'messages', r.body);
      assert.match(e.message, /Mistral/);
    }
  }
});
