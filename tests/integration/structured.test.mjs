// Structured outputs through the official openai client: `chat.completions.parse` with
// `zodResponseFormat` (openai/helpers/zod) on 20 schemas, against stories260K -- a model
// that never writes JSON by itself, so every object comes from the grammar. The client
// parses the content and zod validates it (an invalid one throws); the test validates
// again with zod and checks finish_reason. Also response_format json_object, and 400s
// naming what is outside the supported JSON Schema subset.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import OpenAI from 'openai';
import { zodResponseFormat } from 'openai/helpers/zod';
import { z } from 'zod';
import { startServer, stories } from './lib/server.mjs';

let server;
const client = () => new OpenAI({ apiKey: 'k', baseURL: server.baseURL, maxRetries: 0, timeout: 120000 });
const model = 'stories260K-hf';

before(async () => {
  server = await startServer(['-m', stories, '--chat-template', 'chatml', '--api-key', 'k']);
});
after(async () => {
  const r = await server.stop();
  assert.equal(r.code, 0, `server exit: ${JSON.stringify(r)}\n${server.log()}`);
});

const schemas = {
  name: z.object({ name: z.string() }),
  age: z.object({ age: z.number().int() }),
  price: z.object({ price: z.number() }),
  flag: z.object({ ok: z.boolean() }),
  color: z.object({ color: z.enum(['red', 'green', 'blue']) }),
  title: z.object({ title: z.string().min(3).max(12) }),
  tags: z.object({ tags: z.array(z.string().max(8)).min(1).max(3) }),
  point: z.object({ point: z.object({ x: z.number(), y: z.number() }) }),
  person: z.object({
    person: z.object({ name: z.string().max(10), address: z.object({ city: z.string().max(10), zip: z.string().min(5).max(5) }) }),
  }),
  nullable: z.object({ nick: z.string().max(8).nullable() }),
  list: z.object({ items: z.array(z.object({ id: z.number().int(), label: z.string().max(6) })).max(2) }),
  literal: z.object({ status: z.literal('done'), n: z.number().int() }),
  score: z.object({ score: z.number().int().min(0).max(10) }),
  celsius: z.object({ celsius: z.number().min(-50).max(50) }),
  matrix: z.object({ matrix: z.array(z.array(z.number().int()).max(2)).max(2) }),
  union: z.object({ value: z.union([z.string().max(5), z.number()]) }),
  pair: z.object({ flags: z.array(z.boolean()).min(2).max(2) }),
  optional: z.object({
    kind: z.enum(['a', 'b']), count: z.number().int().nonnegative(), note: z.string().max(5).optional().nullable(),
  }),
  level: z.object({ level: z.enum(['low', 'high']).nullable() }),
  ratio: z.object({ ratio: z.number().positive().max(1), label: z.string().min(2).max(4) }),
};

test('chat.completions.parse + zodResponseFormat returns a parsed object on 20 schemas (stories260K)', async () => {
  assert.equal(Object.keys(schemas).length, 20);
  for (const [name, schema] of Object.entries(schemas)) {
    for (const sampling of [{ temperature: 0 }, { temperature: 1, seed: 11 }]) {
      const r = await client().chat.completions.parse({
        model, messages: [{ role: 'user', content: `Give me a ${name}.` }],
        response_format: zodResponseFormat(schema, name), max_tokens: 200, ...sampling,
      });
      const m = r.choices[0].message;
      assert.equal(r.choices[0].finish_reason, 'stop', `${name}: ${m.content}`);
      assert.ok(m.parsed !== null && typeof m.parsed === 'object', `${name}: ${m.content}`);
      // Independently of the helper: the text is JSON that the zod schema accepts.
      assert.deepEqual(schema.parse(JSON.parse(m.content)), m.parsed);
    }
  }
});

test('the output finishes within max_tokens: a tight budget still gives a valid object', async () => {
  const schema = schemas.person;
  // The shortest instance, one token per byte: the budget rule guarantees an end from there.
  const shortest = '{"person":{"name":"","address":{"city":"","zip":"00000"}}}';
  schema.parse(JSON.parse(shortest));
  for (const max_tokens of [shortest.length + 12, shortest.length]) {
    const r = await client().chat.completions.parse({
      model, messages: [{ role: 'user', content: 'Who?' }], response_format: zodResponseFormat(schema, 'p'), max_tokens,
      temperature: 0,
    });
    assert.equal(r.choices[0].finish_reason, 'stop');
    assert.ok(r.usage.completion_tokens <= max_tokens);
    schema.parse(JSON.parse(r.choices[0].message.content));
  }
});

test('streaming with a schema: the deltas join into the same valid object', async () => {
  const body = {
    model, messages: [{ role: 'user', content: 'A point.' }],
    response_format: zodResponseFormat(schemas.point, 'point'), max_tokens: 100, temperature: 0,
  };
  const full = await client().chat.completions.create(body);
  const stream = await client().chat.completions.create({ ...body, stream: true });
  let text = '';
  for await (const chunk of stream) text += chunk.choices[0]?.delta?.content ?? '';
  assert.equal(text, full.choices[0].message.content);
  schemas.point.parse(JSON.parse(text));
});

test('response_format json_object: any JSON object', async () => {
  for (const seed of [1, 2, 3]) {
    const r = await client().chat.completions.create({
      model, messages: [{ role: 'user', content: 'JSON please.' }], response_format: { type: 'json_object' },
      max_tokens: 80, temperature: 1, seed,
    });
    assert.equal(r.choices[0].finish_reason, 'stop', r.choices[0].message.content);
    const v = JSON.parse(r.choices[0].message.content);
    assert.ok(v !== null && typeof v === 'object' && !Array.isArray(v));
  }
});

test('schemas outside the supported subset are 400s naming the keyword', async () => {
  const format = (schema) => ({ type: 'json_schema', json_schema: { name: 'x', strict: true, schema } });
  const obj = (props) => ({ type: 'object', properties: props, required: Object.keys(props), additionalProperties: false });
  const cases = [
    [format(obj({ a: { type: 'string', pattern: '^a+$' } })), 'pattern'],
    [format(obj({ a: { type: 'string', format: 'email' } })), 'format'],
    [format(obj({ a: { type: 'number', multipleOf: 2 } })), 'multipleOf'],
    [format(obj({ a: { allOf: [{ type: 'string' }] } })), 'allOf'],
    [format(obj({ a: { anyOf: [obj({ x: { type: 'string' } }), obj({ y: { type: 'string' } })] } })), 'anyOf'],
    [format(obj({ a: { type: 'array', prefixItems: [{ type: 'string' }] } })), 'prefixItems'],
    [format(obj({ a: { type: 'array', items: { type: 'string' }, uniqueItems: true } })), 'uniqueItems'],
  ];
  for (const [response_format, keyword] of cases) {
    await assert.rejects(
      client().chat.completions.create({ model, messages: [{ role: 'user', content: 'x' }], response_format }),
      (e) => {
        assert.equal(e.status, 400);
        assert.equal(e.param, 'response_format.json_schema.schema');
        assert.ok(e.message.includes(`'${keyword}'`), e.message);
        return true;
      });
  }
  const bad = [
    [{ type: 'xml' }, 'response_format.type'],
    [{ type: 'json_schema' }, 'response_format.json_schema'],
    [{ type: 'json_schema', json_schema: { schema: obj({}) } }, 'response_format.json_schema.name'],
    [{ type: 'json_schema', json_schema: { name: 'a b', schema: obj({}) } }, 'response_format.json_schema.name'],
    [format({ type: 'string' }), 'response_format.json_schema.schema'],  // the root must be an object
    [format(obj({ a: { type: 'string', minLength: 5, maxLength: 2 } })), 'response_format.json_schema.schema'],
  ];
  for (const [response_format, param] of bad) {
    await assert.rejects(
      client().chat.completions.create({ model, messages: [{ role: 'user', content: 'x' }], response_format }),
      (e) => { assert.equal(e.status, 400); assert.equal(e.param, param, e.message); return true; });
  }
});
