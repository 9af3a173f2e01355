// A Q4_K_M model served through the official openai client (issue 33): a random-weight
// Llama of 256-wide rows (so Q4_K and Q6_K blocks, not only the legacy fallbacks), written
// by `attic make-model --dtype q4_k_m`, with the stories260K tokenizer. A two-turn chat
// reuses its history, a context cache links into a chat, and a sparse (PQCache) request
// decodes. --deterministic: a tenant's answer with reused or linked KV is compared with
// another tenant's answer to the same prompt computed from scratch.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import fs from 'node:fs';
import path from 'node:path';
import { execFileSync } from 'node:child_process';
import OpenAI from 'openai';
import { startServer, stories, binary, tmpRoot, metrics } from './lib/server.mjs';

let server;
let model;
const keys = ['k-quant-a', 'k-quant-b', 'k-quant-c', 'k-quant-d', 'k-quant-e', 'k-quant-f'];
const dir = path.join(tmpRoot, `quantized-${process.pid}`);
const client = (apiKey) => new OpenAI({ apiKey, baseURL: server.baseURL, maxRetries: 0, timeout: 60000 });

before(async () => {
  fs.mkdirSync(dir, { recursive: true });
  const config = {
    architectures: ['LlamaForCausalLM'], model_type: 'llama', hidden_size: 256, intermediate_size: 512,
    num_hidden_layers: 2, num_attention_heads: 4, num_key_value_heads: 2, head_dim: 64, vocab_size: 512,
    max_position_embeddings: 1024, rms_norm_eps: 1e-5, rope_theta: 10000.0, hidden_act: 'silu',
    tie_word_embeddings: true, bos_token_id: 1, eos_token_id: 2, torch_dtype: 'float32',
  };
  fs.writeFileSync(path.join(dir, 'config.json'), JSON.stringify(config));
  const file = path.join(dir, 'q4km.gguf');
  execFileSync(binary, ['make-model', '--config', path.join(dir, 'config.json'), '--tokenizer', stories,
    '--dtype', 'q4_k_m', '--seed', '11', '--out-gguf', file], { stdio: 'ignore' });
  fs.writeFileSync(path.join(dir, 'keys'), keys.join('\n') + '\n');
  server = await startServer(['-m', file, '--chat-template', 'chatml', '--deterministic', '--max-resident', '0',
    '--kv-dram', '64M', '--api-key-file', path.join(dir, 'keys')]);
  model = (await client(keys[0]).models.list()).data[0].id;
});
after(async () => {
  if (server) {
    const r = await server.stop();
    assert.equal(r.code, 0, `server exit: ${JSON.stringify(r)}\n${server.log()}`);
  }
  fs.rmSync(dir, { recursive: true, force: true });
});

const chat = (apiKey, messages, extra = {}) => client(apiKey).chat.completions.create({
  model, messages, max_tokens: 12, temperature: 0, ignore_eos: true, ...extra });

test('a two-turn chat on Q4_K_M weights reuses its history and answers as recompute does', async () => {
  const first = [{ role: 'user', content: 'Tom had a red ball. He liked to play with it.' }];
  const a = await chat(keys[0], first);
  assert.equal(a.usage.completion_tokens, 12);
  const second = [...first, { role: 'assistant', content: a.choices[0].message.content },
    { role: 'user', content: 'What did Tom do next?' }];
  const b = await chat(keys[0], second);
  assert.ok(b.usage.prompt_tokens_details.cached_tokens >= a.usage.prompt_tokens,
    `cached ${JSON.stringify(b.usage)} after a first turn of ${a.usage.prompt_tokens} prompt tokens`);
  const fresh = await chat(keys[1], second);
  assert.equal(fresh.usage.prompt_tokens_details.cached_tokens, 0);
  assert.equal(b.choices[0].message.content, fresh.choices[0].message.content);
});

test('a context cache of Q4_K_M KV links into a chat', async () => {
  const c = client(keys[2]);
  const chunks = ['Lily saw a big dog near the tree.', 'The dog was happy and ran to her.'];
  const cache = await c.post('/context_caches', { body: { model, chunks } });
  assert.equal(cache.chunks.length, 2);
  const parts = [{ type: 'context_cache', id: cache.id }, { type: 'text', text: 'Who ran?' }];
  // naive: every chunk token is used as cached (docs/serving.md, link methods).
  const r = await chat(keys[2], [{ role: 'user', content: parts }], { link: { method: 'naive' } });
  assert.equal(r.usage.prompt_tokens_details.cached_tokens, cache.n_tokens);
  assert.equal(r.usage.prompt_tokens_details.recomputed_tokens, 0);
  assert.equal(r.usage.completion_tokens, 12);
});

test('a sparse (PQ) request on Q4_K_M weights decodes', async () => {
  const story = 'Once upon a time, there was a little girl named Lily. She loved to play in the park. '.repeat(4);
  const before = await metrics(server.port);
  const r = await chat(keys[3], [{ role: 'user', content: `${story}What did Lily do?` }],
    { sparse: { method: 'pq', ratio: 0.5, min_tokens: 32 } });
  assert.equal(r.choices[0].finish_reason, 'length');
  assert.equal(r.usage.completion_tokens, 12);
  const after = await metrics(server.port);
  const key = 'attic_sparse_requests_total{method="pq"}';
  assert.equal((after[key] ?? 0) - (before[key] ?? 0), 1);
  assert.ok(after.attic_sparse_decode_steps_total - (before.attic_sparse_decode_steps_total ?? 0) >= 11);
});
