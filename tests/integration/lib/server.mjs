// Helpers shared by the serving integration tests: where the binary and models are,
// starting `attic serve` on a free loopback port, a random-weight model with a long
// context, and small HTTP utilities that do not go through the openai client.
import { spawn, execFileSync } from 'node:child_process';
import fs from 'node:fs';
import http from 'node:http';
import os from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';

const here = path.dirname(fileURLToPath(import.meta.url));
export const sourceDir = path.resolve(here, '../../..');
export const binary = process.env.ATTIC_BINARY || path.join(sourceDir, 'build/attic');
export const sharedDir = process.env.ATTIC_SHARED_DIR || path.resolve(sourceDir, '../shared');
export const stories = path.join(sharedDir, 'models/stories260K-hf');
export const tmpRoot = process.env.ATTIC_TEST_TMP || path.join(os.tmpdir(), 'attic-integration');

// Starts `attic serve --port 0 ...args` and resolves once it listens.
export async function startServer(args, { timeoutMs = 60000 } = {}) {
  const proc = spawn(binary, ['serve', '--host', '127.0.0.1', '--port', '0', '--threads', '2', ...args], {
    stdio: ['ignore', 'ignore', 'pipe'],
  });
  let log = '';
  const port = await new Promise((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error(`attic serve did not start:\n${log}`)), timeoutMs);
    proc.stderr.on('data', (d) => {
      log += d.toString();
      const m = log.match(/listening on http:\/\/127\.0\.0\.1:(\d+)/);
      if (m) {
        clearTimeout(timer);
        resolve(Number(m[1]));
      }
    });
    proc.on('exit', (code) => {
      clearTimeout(timer);
      reject(new Error(`attic serve exited (${code}):\n${log}`));
    });
  });
  proc.removeAllListeners('exit');
  const exited = new Promise((resolve) => proc.on('exit', (code, signal) => resolve({ code, signal })));
  return {
    port,
    proc,
    url: `http://127.0.0.1:${port}`,
    baseURL: `http://127.0.0.1:${port}/v1`,
    log: () => log,
    // Graceful stop; resolves with the exit status.
    async stop() {
      if (proc.exitCode === null && proc.signalCode === null) proc.kill('SIGTERM');
      const timer = setTimeout(() => proc.kill('SIGKILL'), 15000);
      const r = await exited;
      clearTimeout(timer);
      return r;
    },
    alive: () => proc.exitCode === null && proc.signalCode === null,
  };
}

// A random-weight Llama model with the stories260K tokenizer and a 4096-token context,
// big enough that prefill chunks take measurable time (a few MB; generated once).
export function longContextModel() {
  const dir = path.join(tmpRoot, 'ctx4096-model');
  if (fs.existsSync(path.join(dir, 'model.safetensors'))) return dir;
  fs.mkdirSync(tmpRoot, { recursive: true });
  const config = {
    architectures: ['LlamaForCausalLM'],
    model_type: 'llama',
    hidden_size: 256,
    intermediate_size: 768,
    num_hidden_layers: 4,
    num_attention_heads: 8,
    num_key_value_heads: 4,
    head_dim: 32,
    vocab_size: 512,
    max_position_embeddings: 4096,
    rms_norm_eps: 1e-5,
    rope_theta: 10000.0,
    hidden_act: 'silu',
    tie_word_embeddings: true,
    bos_token_id: 1,
    eos_token_id: 2,
    torch_dtype: 'float32',
  };
  const cfg = path.join(tmpRoot, 'ctx4096-config.json');
  fs.writeFileSync(cfg, JSON.stringify(config, null, 2));
  const tmp = `${dir}.tmp${process.pid}`;
  execFileSync(binary, ['make-model', '--config', cfg, '--tokenizer', stories, '--dtype', 'bf16', '--seed', '7',
    '--out-hf', tmp], { stdio: 'ignore' });
  fs.rmSync(dir, { recursive: true, force: true });
  fs.renameSync(tmp, dir);
  return dir;
}

// One HTTP request on a fresh connection; resolves {status, headers, body} (body: string).
export function request(port, { method = 'POST', path: p = '/v1/chat/completions', headers = {}, body } = {}) {
  return new Promise((resolve, reject) => {
    const data = body === undefined ? undefined : Buffer.isBuffer(body) ? body : Buffer.from(body);
    const h = { ...headers };
    if (data !== undefined) h['content-length'] = data.length;
    const req = http.request({ host: '127.0.0.1', port, method, path: p, headers: h, agent: false }, (res) => {
      const chunks = [];
      res.on('data', (c) => chunks.push(c));
      res.on('end', () => resolve({ status: res.statusCode, headers: res.headers, body: Buffer.concat(chunks).toString() }));
      res.on('error', reject);
    });
    req.on('error', reject);
    req.setTimeout(60000, () => req.destroy(new Error('request timed out')));
    if (data !== undefined) req.write(data);
    req.end();
  });
}

// A streaming request read with node's http module and a minimal SSE parser; calls
// onEvent(parsedChunk) for each `data:` event, in the order received, and resolves at the
// end of the stream. For ordering tests: the openai client's per-chunk cost is far above a
// tiny model's decode rate, so it would read events long after they were sent.
export function streamEvents(port, { path: p = '/v1/completions', apiKey, body }, onEvent) {
  return new Promise((resolve, reject) => {
    const data = Buffer.from(JSON.stringify({ ...body, stream: true }));
    const headers = { 'content-type': 'application/json', 'content-length': data.length };
    if (apiKey) headers.authorization = `Bearer ${apiKey}`;
    const req = http.request({ host: '127.0.0.1', port, method: 'POST', path: p, headers, agent: false }, (res) => {
      if (res.statusCode !== 200) {
        res.resume();
        reject(new Error(`HTTP ${res.statusCode}`));
        return;
      }
      let pending = '';
      res.setEncoding('utf8');
      res.on('data', (text) => {
        pending += text;
        let end;
        while ((end = pending.indexOf('\n\n')) >= 0) {
          const event = pending.slice(0, end);
          pending = pending.slice(end + 2);
          if (event.startsWith('data: ') && event !== 'data: [DONE]') onEvent(JSON.parse(event.slice(6)));
        }
      });
      res.on('end', resolve);
      res.on('error', reject);
    });
    req.on('error', reject);
    req.setTimeout(120000, () => req.destroy(new Error('request timed out')));
    req.end(data);
  });
}

// Asserts the OpenAI error object shape; returns the parsed error.
export function parseError(body) {
  const j = JSON.parse(body);
  if (!j || typeof j.error !== 'object') throw new Error(`not an error object: ${body}`);
  const e = j.error;
  for (const k of ['message', 'type', 'param', 'code']) {
    if (!(k in e)) throw new Error(`error object lacks '${k}': ${body}`);
  }
  if (typeof e.message !== 'string' || e.message.length === 0) throw new Error(`bad error message: ${body}`);
  if (typeof e.type !== 'string') throw new Error(`bad error type: ${body}`);
  return e;
}

export async function metrics(port) {
  const r = await request(port, { method: 'GET', path: '/metrics' });
  const values = {};
  for (const line of r.body.split('\n')) {
    if (!line || line.startsWith('#')) continue;
    const i = line.lastIndexOf(' ');
    values[line.slice(0, i)] = Number(line.slice(i + 1));
  }
  return values;
}

// Resident set size of a process in MiB (Linux).
export function rssMiB(pid) {
  const status = fs.readFileSync(`/proc/${pid}/status`, 'utf8');
  const m = status.match(/VmRSS:\s+(\d+) kB/);
  return m ? Number(m[1]) / 1024 : NaN;
}

export const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

// Polls `cond` (async) every 50 ms until it holds: for state that time changes outside the
// test's hands (an expiry the server or Redis keeps). The 1,200 tries (a minute) are a
// backstop against a condition that never comes, not a bound on when it comes.
export async function until(cond, what) {
  for (let i = 0; i < 1200; ++i) {
    if (await cond()) return;
    await sleep(50);
  }
  throw new Error(`never: ${what}`);
}

// Whether `promise` rejects with HTTP 404 (resolving is false; any other error throws).
export async function is404(promise) {
  try {
    await promise;
    return false;
  } catch (e) {
    if (e.status === 404) return true;
    throw e;
  }
}
