#!/usr/bin/env python3
"""Writes the seed corpora of the fuzz harnesses (fuzz/corpus/<name>/seed-*).

The seeds are written from the formats' specifications (GGUF, safetensors, RESP, the KV
entry layout of docs/store.md), not by Attic's own writers. Each harness's first byte(s)
select its mode (see the harness). Re-running rewrites the seeds; inputs found by
fuzzing (crash-*, other names) are left alone.
"""
import json
import os
import struct

HERE = os.path.dirname(os.path.abspath(__file__))
SHARED = os.environ.get("ATTIC_SHARED_DIR", os.path.join(HERE, "..", "..", "shared"))


def put(name, i, data):
    d = os.path.join(HERE, "corpus", name)
    os.makedirs(d, exist_ok=True)
    if isinstance(data, str):
        data = data.encode()
    with open(os.path.join(d, "seed-%02d" % i), "wb") as f:
        f.write(data)


def openai_request():
    chat = {"model": "m", "messages": [{"role": "system", "content": "Be brief."},
                                       {"role": "user", "content": "Hello"}],
            "max_tokens": 8, "temperature": 0.7, "top_p": 0.9, "stop": ["\n", "END"], "stream": True,
            "stream_options": {"include_usage": True}, "seed": 3, "session_id": "conv-1", "session_ttl": 60}
    caches = {"model": "m", "messages": [{"role": "user", "content": [
        {"type": "context_cache", "id": "ctx-123"},
        {"type": "text", "text": "doc", "cache_control": {"type": "ephemeral", "ttl": "5m"}},
        {"type": "text", "text": "question?"}]}], "link": {"method": "attnlink", "k": 4},
              "sparse": {"method": "pq", "top_k": 32}}
    comp = {"model": "m", "prompt": "Once upon a time", "max_tokens": 4, "top_k": 5, "min_p": 0.1,
            "ignore_eos": True, "user": "u"}
    comp_ids = {"model": "m", "prompt": [1, 2, 3, 400], "max_completion_tokens": 2}
    seeds = [
        b"\x00" + json.dumps(chat).encode(),
        b"\x00" + json.dumps(caches).encode(),
        b"\x01" + json.dumps(comp).encode(),
        b"\x01" + json.dumps(comp_ids).encode(),
        b"\x02" + json.dumps({"prompt": "Hi there", "add_special_tokens": False, "return_token_strs": True}).encode(),
        b"\x02" + json.dumps({"messages": [{"role": "user", "content": "x"}], "add_generation_prompt": True}).encode(),
        b"\x03" + json.dumps({"tokens": [1, 2, 3]}).encode(),
        b"\x04conv-1\x00" + json.dumps(chat).encode(),
        b"\x05bad \xff\xfe field",
        b"\x00" + b'{"model":"m","messages":[{"role":"user","content":"a"}],"max_tokens":1e400,"temperature":"x"}',
        b"\x00" + b"[" * 100 + b"]" * 100,
        b"\x00" + b'{"model":"m","model":"n","messages":[]}',
        b"\x04conv-\xff\xfe\x00" + json.dumps({"model": "m", "messages": [{"role": "user", "content": "Hi"}]}).encode(),
    ]
    for i, s in enumerate(seeds):
        put("openai_request", i, s)


def chat_template():
    seeds = [b"\x00s\x00Be brief.\x00u\x00Hello\x00a\x00Hi!\x00u\x00More?",
             b"\x01u\x00<|eot_id|> injected\x00a\x00ok",
             b"\x02s\x00  padded  \x00u\x00[INST] x [/INST]\x00a\x00y",
             b"\x03tool\x00x",
             b"\x06u\x00\xff\xfe invalid utf-8",
             b"\x00{% for message in messages %}<|im_start|>{{ message['role'] }}{% endfor %}"]
    for i, s in enumerate(seeds):
        put("chat_template", i, s)


def gguf_str(s):
    b = s.encode()
    return struct.pack("<Q", len(b)) + b


def gguf_kv(key, typ, payload):
    return gguf_str(key) + struct.pack("<I", typ) + payload


def gguf():
    # GGUF v3 (ggml/docs/gguf.md): types 4 u32, 5 i32, 6 f32, 7 bool, 8 string, 9 array.
    tokens = ["<unk>", "<s>", "</s>"] + ["<0x%02X>" % b for b in range(256)] + ["\u2581a", "\u2581b", "ab"]
    arr_str = struct.pack("<IQ", 8, len(tokens)) + b"".join(gguf_str(t) for t in tokens)
    arr_f32 = struct.pack("<IQ", 6, len(tokens)) + b"".join(struct.pack("<f", -float(i)) for i in range(len(tokens)))
    types = [2, 3, 3] + [6] * 256 + [1, 1, 1]
    arr_i32 = struct.pack("<IQ", 5, len(tokens)) + b"".join(struct.pack("<i", t) for t in types)
    kvs = [gguf_kv("general.architecture", 8, gguf_str("llama")),
           gguf_kv("general.alignment", 4, struct.pack("<I", 32)),
           gguf_kv("llama.block_count", 4, struct.pack("<I", 1)),
           gguf_kv("tokenizer.ggml.model", 8, gguf_str("llama")),
           gguf_kv("tokenizer.ggml.tokens", 9, arr_str),
           gguf_kv("tokenizer.ggml.scores", 9, arr_f32),
           gguf_kv("tokenizer.ggml.token_type", 9, arr_i32),
           gguf_kv("tokenizer.ggml.bos_token_id", 4, struct.pack("<I", 1)),
           gguf_kv("tokenizer.ggml.eos_token_id", 4, struct.pack("<I", 2)),
           gguf_kv("tokenizer.ggml.add_bos_token", 7, b"\x01")]
    tensors = [("token_embd.weight", [4, 2], 0, 0), ("output_norm.weight", [4], 1, 32)]  # f32 at 0, f16 at 32
    info = b"".join(gguf_str(n) + struct.pack("<I", len(d)) + b"".join(struct.pack("<Q", x) for x in d) +
                    struct.pack("<IQ", t, off) for n, d, t, off in tensors)
    head = b"GGUF" + struct.pack("<IQQ", 3, len(tensors), len(kvs)) + b"".join(kvs) + info
    head += b"\x00" * (-len(head) % 32)
    data = struct.pack("<8f", *range(8)) + struct.pack("<4e", 1, 2, 3, 4)
    put("gguf", 0, head + data)
    put("gguf", 1, head[:64])
    # Version 2 header with a metadata-only file.
    put("gguf", 2, b"GGUF" + struct.pack("<IQQ", 3, 0, 1) + gguf_kv("general.name", 8, gguf_str("x")))


def safetensors():
    def st(header, data):
        h = json.dumps(header).encode()
        return struct.pack("<Q", len(h)) + h + data
    put("safetensors", 0, st({"__metadata__": {"format": "pt"},
                               "a": {"dtype": "F32", "shape": [2, 2], "data_offsets": [0, 16]},
                               "b": {"dtype": "BF16", "shape": [3], "data_offsets": [16, 22]},
                               "c": {"dtype": "F16", "shape": [1, 1], "data_offsets": [22, 24]}}, bytes(24)))
    put("safetensors", 1, st({"x": {"dtype": "I64", "shape": [1], "data_offsets": [0, 8]}}, bytes(8)))
    put("safetensors", 2, st({"x": {"dtype": "F32", "shape": [4611686018427387904, 4], "data_offsets": [0, 16]}},
                             bytes(16)))


def tokenizer_json():
    with open(os.path.join(SHARED, "models", "stories260K-hf", "tokenizer.json"), "rb") as f:
        put("tokenizer_json", 0, f.read())
    with open(os.path.join(SHARED, "models", "stories260K-hf", "tokenizer_config.json"), "rb") as f:
        cfg = f.read()
    vocab = {chr(0x100 + b) if b < 33 or 126 < b < 161 or b == 173 else chr(b): b for b in range(256)}
    vocab = {k: i for i, k in enumerate(sorted(vocab, key=lambda k: vocab[k]))}
    vocab["he"] = len(vocab)
    bytelevel = {"version": "1.0", "added_tokens": [{"id": len(vocab), "content": "<|endoftext|>", "special": True,
                                                      "single_word": False, "lstrip": False, "rstrip": False,
                                                      "normalized": False}],
                 "normalizer": None,
                 "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True,
                                   "use_regex": True},
                 "post_processor": None, "decoder": {"type": "ByteLevel"},
                 "model": {"type": "BPE", "vocab": vocab, "merges": ["h e"], "byte_fallback": False}}
    put("tokenizer_json", 1, json.dumps(bytelevel))
    put("tokenizer_json", 2, json.dumps(bytelevel).encode() + b"\x00" + cfg)
    put("tokenizer_json", 3, '{"model":{"type":"BPE","vocab":{"a":0},"merges":["a a"]}}')


def tokenizer_encode():
    texts = [b"Once upon a time, there was a little girl.", b" leading space\tand tabs\n\n",
             "caf\u00e9 \u2014 \U0001F600 \u4e2d\u6587".encode(), b"\xff\xfe\xc0\xaf overlong", b"\xed\xa0\x80 surrogate",
             b"<s>special</s> <|im_start|>user"]
    i = 0
    for which in (0, 1):
        for mode in (0, 1):
            for t in texts:
                put("tokenizer_encode", i, bytes([which | mode << 1]) + t)
                i += 1
        put("tokenizer_encode", i, bytes([which | 2 << 1]) + bytes(range(0, 200)))
        i += 1


def entry(n_layers=2, kv_dim=4, n_tokens=3, dtype=0, attachments=(), group=0, k_group_ends=()):
    # docs/store.md's layout; the checksums are left zero for ssd_entry's repair mode.
    # Row bytes: f32 4 kv_dim, f16 2 kv_dim, q8_0 (dtype 2) kv_dim int8 and q4_0 (dtype 3)
    # kv_dim / 2 bytes of codes, then kv_dim / group f16 scales; q8_0/q4_0 (dtype 4): K's
    # rows q8_0, V's q4_0; kivi4 (dtype 5): K's rows kv_dim / 2 bytes of codes, then per
    # K group kv_dim f16 scales and kv_dim f16 minimums; V's rows q4_0.
    scales = 2 * (kv_dim // max(group, 1))
    k_row = {0: 4 * kv_dim, 1: 2 * kv_dim, 2: kv_dim + scales, 3: kv_dim // 2 + scales, 4: kv_dim + scales,
             5: kv_dim // 2}[dtype]
    v_row = kv_dim // 2 + scales if dtype in (4, 5) else k_row
    k_params = 4 * kv_dim * len(k_group_ends)
    def s(x):
        return struct.pack("<I", len(x)) + x
    version = 2 if attachments else 1
    h = b"ATTICKV1" + struct.pack("<IIIII", version, dtype, n_layers, kv_dim, n_tokens)
    if dtype in (2, 3, 4, 5):  # a quantized type's group follows n_tokens
        h += struct.pack("<I", group)
    if dtype == 5:  # then kivi4's K groups: their count, their end tokens
        h += struct.pack("<I", len(k_group_ends)) + struct.pack("<%dI" % len(k_group_ends), *k_group_ends)
    h += struct.pack("<q", 0)
    h += s(b"default") + s(b"session-1") + s(b"fp")
    if attachments:
        h += struct.pack("<I", len(attachments))
        for kind, blob in attachments:
            h += s(kind) + struct.pack("<QQ", len(blob), 0)
    h += struct.pack("<%di" % n_tokens, *range(10, 10 + n_tokens)) + struct.pack("<%di" % n_tokens, *range(n_tokens))
    h += bytes(8 * n_layers) + bytes(8)
    h += bytes(-len(h) % 4096)
    # Bytes 0..255 repeated: a quantized row's scales among them are finite f16 or not
    # (0x7c00 and up, 0xfc00 and up): both paths of the scale check.
    layer_bytes = n_tokens * (k_row + v_row) + k_params
    layer = bytes(range(256)) * (layer_bytes // 256 + 1)
    body = b"".join(layer[:layer_bytes] for _ in range(n_layers))
    return h + body + b"".join(blob for _, blob in attachments)


def ssd_entry():
    put("ssd_entry", 0, b"\x03" + entry())
    put("ssd_entry", 1, b"\x03" + entry(dtype=1, n_layers=3))
    put("ssd_entry", 2, b"\x07" + entry(attachments=[(b"pq", b"codes")]))
    put("ssd_entry", 3, b"\x04" + bytes(100))
    put("ssd_entry", 4, b"\x01" + entry()[:200])
    put("ssd_entry", 5, b"\x03" + entry(dtype=2, kv_dim=16, group=8))
    put("ssd_entry", 6, b"\x07" + entry(dtype=3, kv_dim=16, group=8, n_tokens=5))
    put("ssd_entry", 7, b"\x03" + entry(dtype=3, kv_dim=64, group=32, n_layers=1))
    put("ssd_entry", 8, b"\x07" + entry(dtype=4, kv_dim=16, group=8, n_tokens=4))
    put("ssd_entry", 9, b"\x03" + entry(dtype=5, kv_dim=16, group=8, n_tokens=5, k_group_ends=(3, 5)))
    put("ssd_entry", 10, b"\x07" + entry(dtype=5, kv_dim=8, group=8, n_tokens=2, k_group_ends=(2,)))


def redis_entry():
    put("redis_entry", 0, b"\x00ATTICR1 10000 4096 8192")
    put("redis_entry", 1, b"\x00ATTICR1 18446744073709551615 1")
    put("redis_entry", 2, b"\x00ATTICR1 5 5")
    put("redis_entry", 3, b"\x01" + entry())
    put("redis_entry", 4, b"\x01" + bytes(64 << 10))


def resp_reader():
    seeds = [b"\x00\xff*3\r\n$1\r\nm\r\n$5\r\nhello\r\n$-1\r\n", b"\x03\x02*2\r\n$4\r\nATTI\r\n$0\r\n\r\n",
             b"\x00\x00+OK\r\n", b"\x01\x00-MOVED 1234 127.0.0.1:7001\r\n", b"\x00\x00*-1\r\n",
             b"\x00\x00*9223372036854775807\r\n", b"\x05\x00*1\r\n$9223372036854775806\r\nabc",
             b"\x00\x00:12\r\n", b"\x00\x01*1\r\n$3\r\nabcX\r\n"]
    for i, s in enumerate(seeds):
        put("resp_reader", i, s)


def tool_call_stream():
    # First byte: family (bits 0-1: ChatML, Llama-3, Mistral), tool_choice (bits 2-3: auto,
    # auto, required, the function "now"), pieces of 1 + (bits 4-7) bytes.
    weather = '{"name": "get_weather", "arguments": {"city": "Z\\u00fcrich \\"old\\"", "days": [1, 2.50, -0]}}'
    seeds = [
        b"\x00" + ("Let me check.\n<tool_call>\n" + weather + "\n</tool_call>\nand <tool_call>{\"name\": \"now\"}</tool_call>").encode(),
        b"\x30" + b'<tool_call>{"arguments": "{\\"a\\": 1}", "name": "now"}</tool_call> <tool_call>{"name": "rm"}</tool_call>',
        b"\x01" + b' <|python_tag|>{"name": "now", "parameters": {}}; {"name": "get_weather", "parameters": {"city": "Oslo"}}',
        b"\x11" + b'{"answer": 42} is not a call',
        b"\x02" + b'Checking.\n[TOOL_CALLS] [{"name": "get_weather", "arguments": {"city": "Oslo"}, "id": "a1B2c3D4e"}, {"name": "now", "arguments": {}}]',
        b"\x22" + b"[1] is a footnote; [TOOL_CALLS] not JSON",
        b"\x08" + b'[{"name":"now","arguments":{}},{"name":"get_weather","arguments":{"city":"x","city":"y"}}]',
        b"\x0d" + b'{"name":"now","parameters":{"x":1e400}}',
        b"\xf4" + b'{"name":"get_weather","arguments":{"city":"Os',
        b"\x00" + "<tool_call>{\"name\": \"now\", \"arguments\": {\"s\": \"\u00e9\\ud83d\\ude00 </tool_call>\"}}</tool_call>".encode(),
    ]
    for i, s in enumerate(seeds):
        put("tool_call_stream", i, s)


for f in (openai_request, chat_template, gguf, safetensors, tokenizer_json, tokenizer_encode, ssd_entry, redis_entry,
          resp_reader, tool_call_stream):
    f()
