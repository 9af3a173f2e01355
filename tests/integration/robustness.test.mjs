// Hostile input: well over 1,000 malformed or abusive requests (invalid JSON, wrong
// types, huge numbers, missing fields, invalid UTF-8, oversized bodies, raw garbage,
// abrupt disconnects mid-stream). Each must get the right status with an OpenAI error
// object (or, for disconnects, be cancelled), the server must keep serving, leak no
// sequences and stay within its memory budget. Also: 429 on a full queue, timeouts.
import { test, after } from 'node:test';
import assert from 'node:assert/strict';
import net from 'node:net';
import OpenAI from 'openai';
import { startServer, stories, longContextModel, request, parseError, metrics, rssMiB, sleep } from './lib/server.mjs';

const servers = [];
after(async () => {
  for (const s of servers) {
    const r = await s.stop();
    assert.equal(r.code, 0, s.log());
  }
});

const KEY = 'robust-key';
const model = 'stories260K-hf';
const auth = { authorization: `Bearer ${KEY}`, 'content-type': 'application/json' };
const chatBody = (extra = {}) => ({ model, messages: [{ role: 'user', content: 'Hi there' }], max_tokens: 4, ...extra });
const complBody = (extra = {}) => ({ model, prompt: 'Once upon a time', max_tokens: 4, ...extra });

// Sends raw bytes on a new connection (end: then half-closes it); resolves with the status
// code of the first response line (0 if the server closed without answering).
function raw(port, bytes, { timeoutMs = 15000, end = false } = {}) {
  return new Promise((resolve) => {
    const sock = net.connect(port, '127.0.0.1');
    let data = '';
    const done = () => {
      sock.destroy();
      const m = data.match(/^HTTP\/1\.[01] (\d{3})/);
      const bodyAt = data.indexOf('\r\n\r\n');
      resolve({ status: m ? Number(m[1]) : 0, body: bodyAt >= 0 ? data.slice(bodyAt + 4) : '' });
    };
    sock.setTimeout(timeoutMs, done);
    sock.on('data', (d) => {
      data += d.toString('latin1');
      // One complete response is the answer; don't wait for keep-alive to expire.
      const at = data.indexOf('\r\n\r\n');
      const len = data.slice(0, at).match(/\r\ncontent-length: *(\d+)/i);
      if (at >= 0 && len && data.length >= at + 4 + Number(len[1])) {
        data = data.slice(0, at + 4 + Number(len[1]));
        done();
      }
    });
    sock.on('end', done);
    sock.on('close', done);
    sock.on('error', done);
    if (end) sock.end(bytes);
    else sock.write(bytes);
  });
}

// Starts a streaming request, waits for the first SSE data, then drops the connection.
function disconnectMidStream(port, body, path = '/v1/chat/completions') {
  return new Promise((resolve) => {
    const payload = Buffer.from(JSON.stringify(body));
    const sock = net.connect(port, '127.0.0.1');
    let seen = '';
    const timer = setTimeout(() => { sock.destroy(); resolve(false); }, 15000);
    sock.on('data', (d) => {
      seen += d.toString();
      if (seen.includes('data: ')) {
        clearTimeout(timer);
        sock.resetAndDestroy ? sock.resetAndDestroy() : sock.destroy();
        resolve(seen.startsWith('HTTP/1.1 200'));
      }
    });
    sock.on('error', () => {});
    sock.write(`POST ${path} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer ${KEY}\r\nContent-Type: application/json\r\n` +
      `Content-Length: ${payload.length}\r\n\r\n`);
    sock.write(payload);
  });
}

function buildCases() {
  const cases = [];  // { name, run: async (port) => {status, body}, expect: [statuses] }
  // code: the error object's code a 4xx must carry; choices: how many a 200 holds.
  const post = (name, body, expect, { path = '/v1/chat/completions', headers = auth, code, choices = 1 } = {}) =>
    cases.push({ name, expect, code, choices, run: (port) => request(port, { path, headers, body }) });
  const postJson = (name, obj, expect, opts) => post(name, JSON.stringify(obj), expect, opts);

  // 1. Invalid JSON: every truncation of a valid body, plus classic breakages.
  const valid = JSON.stringify(chatBody({ temperature: 0.5, stop: ['x'] }));
  for (let k = 0; k < valid.length; k += 1) post(`truncated at ${k}`, valid.slice(0, k), [400]);
  for (const s of ['', ' ', 'null', '[]', '"x"', '123', 'true', '{', '}', '{"model":}', '{"model": NaN}',
    "{'model': 'x'}", '{"model": "x",}', '{"model": "x" // c\n}', '{"a":1}{"b":2}', '\u0000', '{"model":"x"}garbage',
    '[' + valid + ']', '{"model":"x","messages":[{"role":"user","content":"hi"}]', 'undefined', '{"a":01}',
    '{"a":1e}', '{"a":"\\x41"}', '{"a":"\\u12"}', '{"a":"\t"}', '--', '\ufeff{}']) {
    for (const p of ['/v1/chat/completions', '/v1/completions']) post(`bad json ${JSON.stringify(s)} ${p}`, s, [400], { path: p });
  }
  // A valid request with a NUL after it is not JSON either (JSON.parse refuses it);
  // nlohmann alone would end the input at the NUL and serve the request.
  for (const [body, p] of [[valid, '/v1/chat/completions'], [JSON.stringify(complBody({})), '/v1/completions']]) {
    for (const tail of ['\u0000', '\u0000{"n":2}']) {
      assert.throws(() => JSON.parse(body + tail), SyntaxError);
      post(`valid body + ${JSON.stringify(tail)} ${p}`, body + tail, [400], { path: p, code: 'invalid_json' });
    }
  }

  // 2. Wrong types and out-of-range values, field by field.
  const wrong = {
    model: [123, true, [], {}, ''],  // '' is a 400, an unknown name a 404
    messages: ['hi', 1, {}, [1], ['x'], [{}], [{ role: 5 }], [{ role: 'user' }], [{ role: 'user', content: 5 }],
      [{ role: 'user', content: {} }], [{ role: 'user', content: [{ type: 'image_url', image_url: { url: 'x' } }] }],
      [{ role: 'user', content: [{ type: 'text' }] }], [{ role: 'user', content: [{ type: 'text', text: 1 }] }],
      [{ role: 'user', content: [5] }], [{ role: 'robot', content: 'x' }], [{ role: 'tool', content: 'x' }],
      [{ role: 'user', content: 'x', tool_calls: [{ id: 1 }] }], []],
    max_tokens: ['10', true, [], {}, 0, -1, 1.5, -1e308, Number.MIN_SAFE_INTEGER],
    max_completion_tokens: ['10', 0, -5, 2.5],
    temperature: ['hot', true, [], -0.1, 2.5, 1e308, -1e308],
    top_p: ['x', -0.5, 1.5, [], 1e308],
    top_k: ['x', 1.5, []],
    min_p: [-1, 2, 'x'],
    seed: ['x', 1.5, [], {}, true],
    stop: [5, [1], [''], '', {}, [null], Array.from({ length: 17 }, (_, i) => `s${i}`), ['x'.repeat(2000)]],
    stream: ['yes', 1, [], {}],
    stream_options: [1, 'x', [], { include_usage: 'yes' }],
    n: [17, 0, -1, '1', 1.5, 1e300],
    user: [1, {}, [], 'u'.repeat(5000)],
    session_id: [1, {}, 's'.repeat(300)],
    ignore_eos: ['x', 1],
    presence_penalty: ['x', 3, -3],
    frequency_penalty: [[], 5],
    logit_bias: [1, 'x', { 1: 5 }],
    logprobs: ['yes', -1, 21, {}],  // chat takes a boolean, completions 0..20: wrong for both
    top_logprobs: [21, 'x'],
    tools: [[{ type: 'function', function: { name: 'bad name' } }], 'x', [{ type: 'code' }], [{ type: 'function' }]],
    tool_choice: ['auto', { type: 'function' }],
    response_format: [{ type: 'xml' }, 'json', 5, { type: 'json_schema' }],
    best_of: [2],
  };
  for (const [field, values] of Object.entries(wrong)) {
    for (const v of values) {
      postJson(`chat ${field}=${JSON.stringify(v).slice(0, 40)}`, chatBody({ [field]: v }), [400]);
      if (field !== 'messages') {
        postJson(`completions ${field}=${JSON.stringify(v).slice(0, 40)}`, complBody({ [field]: v }), [400],
          { path: '/v1/completions' });
      }
    }
  }
  for (const p of [5, true, {}, [], [[]], ['a', 'b'], [[1, 2], [3]], [1, 'a'], [-1], [1.5], [2 ** 40]]) {
    postJson(`prompt=${JSON.stringify(p)}`, complBody({ prompt: p }), [400], { path: '/v1/completions' });
  }

  // 3. Huge numbers: invalid ones are 400, valid huge ones are clamped (200). A seed is
  // never clamped (two seeds must not become one): outside int64 it is a 400.
  for (const s of ['1e400', '-1e400', '123456789012345678901234567890e999']) {
    for (const f of ['max_tokens', 'temperature', 'seed', 'n', 'top_p']) {
      post(`${f}=${s}`, `{"model":"${model}","prompt":"hi","${f}":${s}}`, [400], { path: '/v1/completions' });
    }
  }
  for (const v of ['123456789012345678901234567890', '1e300', '9223372036854775808']) {
    post(`seed outside int64 ${v}`, `{"model":"${model}","prompt":"hi","seed":${v}}`, [400], { path: '/v1/completions' });
  }
  for (const [f, v] of [['max_tokens', '1e308'], ['max_tokens', '18446744073709551615'], ['max_tokens', '9223372036854775807'],
    ['seed', '-9223372036854775808'], ['seed', '9223372036854775807'], ['top_p', '1e-320']]) {
    post(`valid huge ${f}=${v}`, `{"model":"${model}","prompt":"hi","temperature":0,"${f}":${v}}`, [200],
      { path: '/v1/completions' });
  }

  // 4. Missing fields.
  for (const [name, obj, path] of [['empty object', {}, '/v1/chat/completions'], ['no messages', { model }, '/v1/chat/completions'],
    ['no model', { messages: [{ role: 'user', content: 'x' }] }, '/v1/chat/completions'], ['no prompt', { model }, '/v1/completions'],
    ['null messages', { model, messages: null }, '/v1/chat/completions'], ['null model', { model: null, prompt: 'x' }, '/v1/completions']]) {
    for (let i = 0; i < 5; ++i) postJson(`${name} #${i}`, obj, [400], { path });
  }
  for (let i = 0; i < 10; ++i) post(`no body #${i}`, undefined, [400]);

  // 5. Invalid UTF-8 (raw bytes in JSON strings) and lone surrogates.
  const badUtf8 = [[0xff], [0xc3], [0xc0, 0xaf], [0xed, 0xa0, 0x80], [0xf4, 0x90, 0x80, 0x80], [0xe2, 0x82], [0x80],
    [0xf8, 0x88, 0x80, 0x80, 0x80], [0xfe], [0xc3, 0x28]];
  for (const bytes of badUtf8) {
    for (const where of ['content', 'model', 'stop', 'key']) {
      const head = where === 'key' ? '{"model":"' + model + '","messages":[{"role":"user","content":"hi"}],"'
        : where === 'model' ? '{"model":"' : where === 'stop' ? '{"model":"' + model + '","messages":[{"role":"user","content":"hi"}],"stop":"'
          : '{"model":"' + model + '","messages":[{"role":"user","content":"hi ';
      const tail = where === 'key' ? '":1}' : where === 'model' ? '","messages":[{"role":"user","content":"hi"}]}'
        : where === 'stop' ? '"}' : '"}]}';
      post(`invalid utf-8 ${bytes} in ${where}`, Buffer.concat([Buffer.from(head), Buffer.from(bytes), Buffer.from(tail)]), [400]);
    }
  }
  for (const esc of ['\\ud800', '\\udc00', '\\ud800\\u0041', '\\udbff']) {
    post(`lone surrogate ${esc}`, `{"model":"${model}","messages":[{"role":"user","content":"a${esc}b"}]}`, [400]);
  }

  // 6. Oversized bodies (limit 1 MiB) and prompts beyond the context window.
  const big = Buffer.alloc(1536 * 1024, 'a');
  for (let i = 0; i < 8; ++i) post(`oversized body #${i}`, big, [413]);
  for (let i = 0; i < 4; ++i) {
    cases.push({ name: `oversized chunked body #${i}`, expect: [413], run: (port) => raw(port,
      `POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer ${KEY}\r\nTransfer-Encoding: chunked\r\n\r\n` +
      `100000\r\n${'a'.repeat(0x100000)}\r\n100000\r\n${'a'.repeat(0x100000)}\r\n0\r\n\r\n`) });
  }
  for (let i = 0; i < 8; ++i) {
    postJson(`prompt beyond context #${i}`, complBody({ prompt: 'story '.repeat(3000 + i) }), [413], { path: '/v1/completions' });
    postJson(`messages beyond context #${i}`, chatBody({ messages: [{ role: 'user', content: 'tale '.repeat(5000 + i) }] }), [413]);
  }
  postJson('token ids beyond context', complBody({ prompt: Array(600).fill(100) }), [413], { path: '/v1/completions' });
  postJson('token id beyond vocabulary', complBody({ prompt: [1, 100000] }), [400], { path: '/v1/completions' });

  // 7. Deep nesting.
  post('deep array', '['.repeat(100000), [400]);
  post('deep object', '{"a":'.repeat(5000) + '1' + '}'.repeat(5000), [400]);
  post('deep field', `{"model":"${model}","messages":[{"role":"user","content":"x"}],"x":${'['.repeat(200)}${']'.repeat(200)}}`, [400]);

  // 8. Authentication.
  for (const h of [{}, { authorization: 'Bearer wrong' }, { authorization: 'Basic abc' }, { authorization: 'Bearer' },
    { authorization: `Bearer ${KEY}x` }, { authorization: `Bearer ${KEY.slice(0, -1)}` }, { authorization: 'Bearer \u00ff' }]) {
    for (const p of ['/v1/chat/completions', '/v1/completions']) {
      post(`auth ${JSON.stringify(h)} ${p}`, JSON.stringify(chatBody()), [401], { path: p, headers: { ...h, 'content-type': 'application/json' } });
    }
    cases.push({ name: `auth models ${JSON.stringify(h)}`, expect: [401], run: (port) => request(port, { method: 'GET', path: '/v1/models', headers: h }) });
  }
  postJson('unknown model', chatBody({ model: 'gpt-4' }), [404]);

  // 9. Raw HTTP abuse: garbage, bad request lines, long URIs and headers, odd methods. Each
  // gets the one status cpp-httplib 0.11 (the server's HTTP layer) and Attic's routes give:
  // - a request line that is not exactly METHOD TARGET HTTP/1.0|1.1 CRLF, or whose method is
  //   not one httplib knows (BREW), is a 400: httplib parses the request line before anything
  //   else and answers neither 405 nor 505
  //   ('binary garbage' holds a newline at byte 29, so its first "line" is read at once);
  // - a request line over 8,192 bytes (CPPHTTPLIB_REQUEST_URI_MAX_LENGTH) is a 414 after the
  //   headers are read; a header line over 8,192 bytes (CPPHTTPLIB_HEADER_MAX_LENGTH) a 400;
  // - a method and path no route serves is a 404 (httplib has no 405: it never looks for the
  //   path under other methods);
  // - Content-Length is read with strtoull: "abc" is 0 (an empty body: invalid JSON, 400) and
  //   "-5" is 2^64 - 5, past --max-body-mib (413: httplib skips the announced bytes first);
  // - a chunk size that is not hex fails the body read (400 "could not read the request body").
  // Attic's error handler puts an OpenAI error object on every one. None is a 0 (closed
  // without a response): the server answers once it has read the byte that decides, and
  // each case sends that byte. Two would depend on when bytes arrive as first written:
  // - 'long header' ends at the oversized line's CRLF (no blank line after it): the server
  //   answers when it has read that line, which is every byte sent, so it never closes with
  //   unread input (a close that resets the connection, racing the answer);
  // - 'negative content-length' half-closes after its headers (end): httplib's skip of the
  //   2^64 - 5 announced bytes meets end-of-stream at once instead of waiting out the
  //   server's 5-second read timeout, which raced this client's 15-second one.
  // The last field is the error object's code where the server sets one (null: httplib's own
  // 400 and 414).
  const rawCases = [
    ['garbage', 'GARBAGE\r\n\r\n', 400, null],
    ['binary garbage', Buffer.from(Array.from({ length: 300 }, (_, i) => (i * 97 + 13) % 256)), 400, null],
    ['bad version', 'GET /health HTTP/9.9\r\n\r\n', 400, null],
    ['no version', 'GET /health\r\n\r\n', 400, null],
    ['long uri', `GET /${'a'.repeat(10000)} HTTP/1.1\r\nHost: x\r\n\r\n`, 414, null],
    ['long header', `GET /health HTTP/1.1\r\nHost: x\r\nX-Big: ${'b'.repeat(20000)}\r\n`, 400, null],
    ['unknown method', 'BREW /v1/models HTTP/1.1\r\nHost: x\r\n\r\n', 400, null],
    ['path traversal', 'GET /../../etc/passwd HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n', 404, 'unknown_url'],
    ['bad content-length', `POST /v1/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer ${KEY}\r\nContent-Length: abc\r\n\r\n`, 400, 'invalid_json'],
    ['negative content-length', `POST /v1/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer ${KEY}\r\nContent-Length: -5\r\n\r\n`, 413, 'request_too_large'],
    ['invalid utf-8 path', Buffer.from('GET /v1/\xff\xfe HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n', 'latin1'), 404, 'unknown_url'],
    ['bad chunk size', `POST /v1/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer ${KEY}\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\nabc\r\n0\r\n\r\n`, 400, null],
  ];
  for (const [name, bytes, status, code] of rawCases) {
    const end = name === 'negative content-length';
    for (let i = 0; i < 3; ++i) cases.push({ name: `raw ${name} #${i}`, expect: [status], code, run: (port) => raw(port, bytes, { end }) });
  }
  for (const [m, p] of [['GET', '/v1/chat/completions'], ['GET', '/v1/completions'], ['DELETE', '/v1/models'],
    ['PUT', '/v1/chat/completions'], ['GET', '/v1/engines'], ['POST', '/health'], ['GET', '/v2/models'], ['GET', '/']]) {
    for (let i = 0; i < 3; ++i) {
      cases.push({ name: `${m} ${p} #${i}`, expect: [404], code: 'unknown_url',
        run: (port) => request(port, { method: m, path: p, headers: auth, body: m === 'GET' ? undefined : '{}' }) });
    }
  }

  // 10. Abrupt disconnects: mid-stream, right after sending, and mid-request.
  for (let i = 0; i < 30; ++i) {
    const body = i % 2 ? complBody({ prompt: `Disconnect ${i}`, max_tokens: 480, ignore_eos: true, stream: true })
      : chatBody({ messages: [{ role: 'user', content: `Disconnect ${i}` }], max_tokens: 440, ignore_eos: true, stream: true });
    cases.push({ name: `disconnect mid-stream #${i}`, disconnect: true,
      run: async (port) => ({ status: (await disconnectMidStream(port, body, i % 2 ? '/v1/completions' : '/v1/chat/completions')) ? 'dropped' : 'failed' }),
      expect: ['dropped'] });
  }
  for (let i = 0; i < 10; ++i) {
    const payload = JSON.stringify(complBody({ prompt: `Gone ${i}`, max_tokens: 400, ignore_eos: true }));
    cases.push({ name: `disconnect after sending #${i}`, expect: ['sent'], run: (port) => new Promise((resolve) => {
      const sock = net.connect(port, '127.0.0.1', () => {
        sock.end(`POST /v1/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer ${KEY}\r\nContent-Type: application/json\r\nContent-Length: ${payload.length}\r\n\r\n${payload}`);
        setTimeout(() => { sock.destroy(); resolve({ status: 'sent' }); }, 5);
      });
      sock.on('error', () => resolve({ status: 'sent' }));
    }) });
    cases.push({ name: `disconnect mid-body #${i}`, expect: ['sent'], run: (port) => new Promise((resolve) => {
      const sock = net.connect(port, '127.0.0.1', () => {
        sock.write(`POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 5000\r\n\r\n{"model":`);
        setTimeout(() => { sock.destroy(); resolve({ status: 'sent' }); }, 5);
      });
      sock.on('error', () => resolve({ status: 'sent' }));
    }) });
  }

  // 11. Fuzz: valid bodies with a few bytes replaced, inserted or deleted (seeded). The
  // test decides what each body is, independently of the server (strict UTF-8, then
  // JSON.parse): one that is no longer JSON must be a 400 with code invalid_json; one that
  // parses to the same request (whitespace, say) a 200. An edit that turns the body into
  // a different valid request (another temperature, a renamed field) is drawn again: its
  // status depends on the field, and sections 2-4 and 12 assert those one by one.
  let seed = 20240601;
  const rnd = (n) => {
    seed = (seed * 1103515245 + 12345) % 2147483648;
    return seed % n;
  };
  const bases = [chatBody({ temperature: 0.7, stop: ['.'] }), complBody({ seed: 5 })];
  const utf8 = new TextDecoder('utf-8', { fatal: true });
  const parse = (bytes) => {
    try {
      return { ok: true, value: JSON.parse(utf8.decode(Buffer.from(bytes))) };
    } catch {
      return { ok: false };
    }
  };
  let same = 0;
  for (let i = 0; i < 400; ++i) {
    const base = bases[i % 2];
    for (;;) {
      const bytes = [...Buffer.from(JSON.stringify(base))];
      for (let k = 0, edits = 1 + rnd(3); k < edits; ++k) {
        const at = rnd(bytes.length);
        const op = rnd(3);
        if (op === 0) bytes[at] = rnd(256);
        else if (op === 1) bytes.splice(at, 0, rnd(256));
        else bytes.splice(at, 1);
      }
      const p = parse(bytes);
      let isSame = false;
      if (p.ok) {
        try {
          assert.deepStrictEqual(p.value, base);
          isSame = true;
        } catch {
          continue;  // a different valid request: draw again
        }
      }
      if (isSame) same += 1;
      post(`fuzz #${i}${isSame ? ' (same request)' : ''}`, Buffer.from(bytes), isSame ? [200] : [400],
        { path: i % 2 ? '/v1/completions' : '/v1/chat/completions', code: isSame ? undefined : 'invalid_json' });
      break;
    }
  }
  assert.ok(same < 40, `${same} of 400 fuzz bodies parse to their base request`);
  // The same bodies with JSON whitespace (space, tab, LF, CR) inserted after structural
  // characters ({ [ , : outside strings; the bases' strings hold none): the same request, 200.
  for (let i = 0; i < 20; ++i) {
    const base = JSON.stringify(bases[i % 2]);
    const spots = [...base].flatMap((ch, at) => ('{[,:'.includes(ch) ? [at + 1] : []));
    const chosen = [0, 1, 2].map(() => spots[rnd(spots.length)]).sort((a, b) => b - a);
    let body = base;
    for (const at of chosen) body = body.slice(0, at) + ' \t\n\r'[rnd(4)] + body.slice(at);  // from the end
    assert.deepStrictEqual(JSON.parse(body), bases[i % 2], body);
    post(`fuzz whitespace #${i}`, body, [200], { path: i % 2 ? '/v1/completions' : '/v1/chat/completions' });
  }

  // 12. Valid edge cases interleaved (200).
  const okCases = [
    ['empty content', chatBody({ messages: [{ role: 'user', content: '' }] })],
    ['empty parts', chatBody({ messages: [{ role: 'user', content: [] }] })],
    ['system only', chatBody({ messages: [{ role: 'system', content: 'Be brief.' }] })],
    ['developer role', chatBody({ messages: [{ role: 'developer', content: 'x' }, { role: 'user', content: 'y' }] })],
    ['assistant null content', chatBody({ messages: [{ role: 'user', content: 'a' }, { role: 'assistant', content: null }, { role: 'user', content: 'b' }] })],
    ['unicode stop', chatBody({ stop: ['é', '😀', '\u0000'] })],
    ['16 stops', chatBody({ stop: Array.from({ length: 16 }, (_, i) => `stop${i}`) })],
    ['top_p 0', chatBody({ top_p: 0 })],
    ['n 1', chatBody({ n: 1 })],
    ['n 3', chatBody({ n: 3 })],
    ['unknown fields', chatBody({ foo: 1, bar: { baz: [1, 2] }, metadata: { a: 'b' } })],
    ['nulls', chatBody({ temperature: null, top_p: null, stop: null, seed: null, stream_options: null, tools: null })],
    ['unicode content', chatBody({ messages: [{ role: 'user', content: 'héllo wörld 😀 \u2028 日本' }] })],
    ['max_tokens float', chatBody({ max_tokens: 3.0 })],
    ['response_format text', chatBody({ response_format: { type: 'text' } })],
  ];
  for (const [name, obj] of okCases) {
    for (let i = 0; i < 2; ++i) postJson(`ok ${name} #${i}`, obj, [200], { choices: obj.n ?? 1 });
  }
  for (const p of [[1, 403, 407], [[1, 403, 407]], ['Once'], 'x']) {
    postJson(`ok prompt ${JSON.stringify(p)}`, complBody({ prompt: p }), [200], { path: '/v1/completions' });
  }
  return cases;
}

async function runPool(items, n, fn) {
  let next = 0;
  const results = new Array(items.length);
  await Promise.all(Array.from({ length: n }, async () => {
    while (next < items.length) {
      const i = next++;
      results[i] = await fn(items[i], i);
    }
  }));
  return results;
}

test('over 1,000 malformed or hostile requests are each answered correctly; the server keeps serving', async () => {
  const s = await startServer(['-m', stories, '--chat-template', 'chatml', '--api-key', KEY, '--max-body-mib', '1',
    '--timeout', '60']);
  servers.push(s);
  const client = new OpenAI({ apiKey: KEY, baseURL: s.baseURL, maxRetries: 0 });
  const warm = await client.chat.completions.create({ model, messages: [{ role: 'user', content: 'Hello' }], max_tokens: 8, temperature: 0 });
  const rssBefore = rssMiB(s.proc.pid);

  const cases = buildCases();
  assert.ok(cases.length >= 1000, `only ${cases.length} cases`);
  const failures = [];
  await runPool(cases, 12, async (c) => {
    let r;
    try {
      r = await c.run(s.port);
    } catch (e) {
      failures.push(`${c.name}: client error ${e.message}`);
      return;
    }
    if (!c.expect.includes(r.status)) {
      failures.push(`${c.name}: status ${r.status}, expected ${c.expect.join('|')}: ${String(r.body ?? '').slice(0, 200)}`);
      return;
    }
    if (typeof r.status === 'number' && r.status >= 400) {
      try {
        const e = parseError(r.body);
        if (c.code !== undefined && e.code !== c.code) failures.push(`${c.name}: code ${e.code}, expected ${c.code}: ${r.body.slice(0, 200)}`);
      } catch (e) {
        failures.push(`${c.name}: ${e.message}`);
      }
    } else if (r.status === 200 && r.body !== undefined) {
      const j = JSON.parse(r.body);
      if (!Array.isArray(j.choices) || j.choices.length !== c.choices) failures.push(`${c.name}: bad 200 body ${r.body.slice(0, 200)}`);
    }
  });
  assert.ok(s.alive(), 'the server died');
  assert.deepEqual(failures, []);

  // Nothing leaked: every dropped stream was cancelled and no sequence is left running.
  let m;
  for (let i = 0; i < 100; ++i) {
    m = await metrics(s.port);
    if (m.attic_requests_running === 0 && m.attic_requests_waiting === 0) break;
    await sleep(100);
  }
  assert.equal(m.attic_requests_running, 0);
  assert.equal(m.attic_requests_waiting, 0);
  assert.ok((m['attic_requests_finished_total{outcome="cancelled"}'] ?? 0) >= 25,
    `only ${m['attic_requests_finished_total{outcome="cancelled"}']} of 50 dropped requests were cancelled`);

  // Still serving, with the same answer as before.
  const again = await client.chat.completions.create({ model, messages: [{ role: 'user', content: 'Hello' }], max_tokens: 8, temperature: 0 });
  assert.equal(again.choices[0].message.content, warm.choices[0].message.content);
  const rssAfter = rssMiB(s.proc.pid);
  console.log(`# ${cases.length} hostile requests; RSS ${rssBefore.toFixed(1)} -> ${rssAfter.toFixed(1)} MiB`);
  // Under ASan the server's RSS is the sanitizer's allocator's: freed blocks wait in its
  // quarantine (256 MiB by default) and every block has redzones and shadow. The bound is
  // Attic's memory, which the release build's run of this test checks.
  if (process.env.ATTIC_SANITIZER !== 'asan') {
    assert.ok(rssAfter < rssBefore + 64, `RSS grew from ${rssBefore} to ${rssAfter} MiB`);
    assert.ok(rssAfter < 512, `RSS ${rssAfter} MiB`);
  }
});

// A streaming completion held open: `started` resolves at its first SSE event (it is
// running), `cut()` drops the connection (the server cancels it).
function holdStream(port, body) {
  const payload = Buffer.from(JSON.stringify({ ...body, stream: true }));
  const sock = net.connect(port, '127.0.0.1');
  let seen = '';
  let onStart;
  const started = new Promise((resolve) => { onStart = resolve; });
  sock.on('data', (d) => {
    seen += d.toString();
    if (seen.includes('data: ')) onStart(seen.startsWith('HTTP/1.1 200'));
  });
  sock.on('error', () => {});
  sock.write(`POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n` +
    `Content-Length: ${payload.length}\r\n\r\n`);
  sock.write(payload);
  return { started, cut: () => (sock.resetAndDestroy ? sock.resetAndDestroy() : sock.destroy()) };
}

test('a full queue answers 429 with Retry-After', async () => {
  const s = await startServer(['-m', longContextModel(), '--max-running', '1', '--max-waiting', '1', '--kv-budget-mib', '64']);
  servers.push(s);
  const body = (i, n) => JSON.stringify({ model: 'ctx4096-model', prompt: `Queue ${i}`, max_tokens: n, ignore_eos: true, temperature: 0 });
  const headers = { 'content-type': 'application/json' };
  // One request runs (a stream of up to 4,000 tokens, held until the others are answered
  // and then dropped, so the test does not depend on how fast it decodes); then 7 arrive
  // at once: one fits the queue, six are refused at once.
  const first = holdStream(s.port, { model: 'ctx4096-model', prompt: 'Queue first', max_tokens: 4000, ignore_eos: true, temperature: 0 });
  assert.equal(await first.started, true);
  const pending = Array.from({ length: 7 }, (_, i) => request(s.port, { path: '/v1/completions', headers, body: body(i, 20) }));
  const answered = [];  // six answer while the held stream runs (the seventh waits in the queue)
  await new Promise((resolve, reject) => {
    for (const p of pending) p.then((r) => { answered.push(r); if (answered.length === 6) resolve(); }, reject);
  });
  assert.equal((await metrics(s.port)).attic_requests_running, 1, 'the held stream ended before the queue filled');
  assert.deepEqual(answered.map((r) => r.status), [429, 429, 429, 429, 429, 429]);
  for (const r of answered) {
    assert.equal(r.headers['retry-after'], '1');
    assert.equal(parseError(r.body).code, 'queue_full');
  }
  first.cut();  // the queued request runs once the held one is cancelled
  const statuses = (await Promise.all(pending)).map((r) => r.status).sort();
  assert.deepEqual(statuses, [200, 429, 429, 429, 429, 429, 429]);
  // The openai client sees a RateLimitError.
  const client = new OpenAI({ apiKey: 'none', baseURL: s.baseURL, maxRetries: 0 });
  const errs = await Promise.allSettled(Array.from({ length: 6 }, (_, i) =>
    client.completions.create({ model: 'ctx4096-model', prompt: `Again ${i}`, max_tokens: 200, ignore_eos: true })));
  assert.ok(errs.some((e) => e.status === 'rejected' && e.reason instanceof OpenAI.RateLimitError));
  const ok = await request(s.port, { path: '/v1/completions', headers, body: body(100, 4) });
  assert.equal(ok.status, 200);
});

test('requests past --timeout end with 504 (or an SSE error event when streaming)', async () => {
  const s = await startServer(['-m', longContextModel(), '--kv-budget-mib', '64', '--timeout', '0.25']);
  servers.push(s);
  const body = (extra) => JSON.stringify({ model: 'ctx4096-model', prompt: 'Slow', max_tokens: 4000, ignore_eos: true, ...extra });
  const headers = { 'content-type': 'application/json' };
  const t = await request(s.port, { path: '/v1/completions', headers, body: body({}) });
  assert.equal(t.status, 504);
  assert.equal(parseError(t.body).code, 'timeout');
  const st = await request(s.port, { path: '/v1/completions', headers, body: body({ stream: true }) });
  assert.equal(st.status, 200);
  const events = st.body.split('\n\n').filter((e) => e.startsWith('data: '));
  assert.equal(parseError(events[events.length - 1].slice(6)).code, 'timeout');
  let m;
  for (let i = 0; i < 100; ++i) {  // the step loop records the outcome just after sending it
    m = await metrics(s.port);
    if (m['attic_requests_finished_total{outcome="timeout"}'] === 2) break;
    await sleep(20);
  }
  assert.equal(m['attic_requests_finished_total{outcome="timeout"}'], 2);
});
