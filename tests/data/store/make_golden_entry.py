#!/usr/bin/env python3
"""Writes the golden KV entries of src/store/entry_test.cc (GoldenEntry tests).

An independent writer of the ATTICKV1 entry format: it follows docs/store.md ("Entry
format" and "Byte layout") and nothing of Attic's code, so that Attic's reader and
writer are checked against a second implementation of the spec. Python 3 standard
library only; XXH3-64 is implemented here from the xxHash specification
(github.com/Cyan4973/xxHash, doc/xxhash_spec.md) and checked against the published
sanity vectors (cli/xsum_sanity_check.c) before anything is written.

Outputs, next to this script:
  golden_f32_v1.kv        an f32 entry without attachments (format version 1)
  golden_f16_v2.kv        an f16 entry with one attachment (format version 2)
  golden_q8_0_v1.kv       a q8_0 entry (8-bit values, one f16 scale per group of 8
                          values of a row), without attachments
  golden_q4_0_v1.kv       a q4_0 entry (4-bit codes, one f16 scale per group of 8
                          values of a row), without attachments
  golden_q8_0_q4_0_v1.kv  a q8_0/q4_0 entry (K's rows q8_0, V's q4_0), without
                          attachments
  golden_kivi4_v1.kv      a kivi4 entry (K in 4 bits per channel over two groups of
                          tokens, with a scale and a minimum per channel and group; V's
                          rows q4_0), without attachments
  golden_entries.json     what each file holds: every field, the K/V element bits, the
                          attachments, the checksums and the entry's key (its file name)

Run from anywhere: python3 tests/data/store/make_golden_entry.py
The outputs are committed; running it again must reproduce them byte for byte.
"""

import json
import os
import re
import struct
import sys

M64 = (1 << 64) - 1

# ---------------------------------------------------------------------------------
# XXH3-64 (xxhash_spec.md, "XXH3 Algorithm Description"), seeded, default secret.

PRIME32_1 = 0x9E3779B1
PRIME32_2 = 0x85EBCA77
PRIME32_3 = 0xC2B2AE3D
PRIME64_1 = 0x9E3779B185EBCA87
PRIME64_2 = 0xC2B2AE3D27D4EB4F
PRIME64_3 = 0x165667B19E3779F9
PRIME64_4 = 0x85EBCA77C2B2AE63
PRIME64_5 = 0x27D4EB2F165667C5
PRIME_MX1 = 0x165667919E3779F9
PRIME_MX2 = 0x9FB21C651E98DF25

DEFAULT_SECRET = bytes([
    0xb8, 0xfe, 0x6c, 0x39, 0x23, 0xa4, 0x4b, 0xbe, 0x7c, 0x01, 0x81, 0x2c, 0xf7, 0x21, 0xad, 0x1c,
    0xde, 0xd4, 0x6d, 0xe9, 0x83, 0x90, 0x97, 0xdb, 0x72, 0x40, 0xa4, 0xa4, 0xb7, 0xb3, 0x67, 0x1f,
    0xcb, 0x79, 0xe6, 0x4e, 0xcc, 0xc0, 0xe5, 0x78, 0x82, 0x5a, 0xd0, 0x7d, 0xcc, 0xff, 0x72, 0x21,
    0xb8, 0x08, 0x46, 0x74, 0xf7, 0x43, 0x24, 0x8e, 0xe0, 0x35, 0x90, 0xe6, 0x81, 0x3a, 0x26, 0x4c,
    0x3c, 0x28, 0x52, 0xbb, 0x91, 0xc3, 0x00, 0xcb, 0x88, 0xd0, 0x65, 0x8b, 0x1b, 0x53, 0x2e, 0xa3,
    0x71, 0x64, 0x48, 0x97, 0xa2, 0x0d, 0xf9, 0x4e, 0x38, 0x19, 0xef, 0x46, 0xa9, 0xde, 0xac, 0xd8,
    0xa8, 0xfa, 0x76, 0x3f, 0xe3, 0x9c, 0x34, 0x3f, 0xf9, 0xdc, 0xbb, 0xc7, 0xc7, 0x0b, 0x4f, 0x1d,
    0x8a, 0x51, 0xe0, 0x4b, 0xcd, 0xb4, 0x59, 0x31, 0xc8, 0x9f, 0x7e, 0xc9, 0xd9, 0x78, 0x73, 0x64,
    0xea, 0xc5, 0xac, 0x83, 0x34, 0xd3, 0xeb, 0xc3, 0xc5, 0x81, 0xa0, 0xff, 0xfa, 0x13, 0x63, 0xeb,
    0x17, 0x0d, 0xdd, 0x51, 0xb7, 0xf0, 0xda, 0x49, 0xd3, 0x16, 0x55, 0x26, 0x29, 0xd4, 0x68, 0x9e,
    0x2b, 0x16, 0xbe, 0x58, 0x7d, 0x47, 0xa1, 0xfc, 0x8f, 0xf8, 0xb8, 0xd1, 0x7a, 0xd0, 0x31, 0xce,
    0x45, 0xcb, 0x3a, 0x8f, 0x95, 0x16, 0x04, 0x28, 0xaf, 0xd7, 0xfb, 0xca, 0xbb, 0x4b, 0x40, 0x7e,
])


def _u32(b, i):
    return struct.unpack_from("<I", b, i)[0]


def _u64(b, i):
    return struct.unpack_from("<Q", b, i)[0]


def _rotl64(x, r):
    return ((x << r) | (x >> (64 - r))) & M64


def _bswap32(x):
    return struct.unpack("<I", struct.pack(">I", x))[0]


def _bswap64(x):
    return struct.unpack("<Q", struct.pack(">Q", x))[0]


def _avalanche(x):
    x ^= x >> 37
    x = (x * PRIME_MX1) & M64
    return x ^ (x >> 32)


def _avalanche_xxh64(x):
    x ^= x >> 33
    x = (x * PRIME64_2) & M64
    x ^= x >> 29
    x = (x * PRIME64_3) & M64
    return x ^ (x >> 32)


def _mul128_fold64(a, b):
    m = a * b
    return (m & M64) ^ (m >> 64)


def _mix_step(data, off, secret, soff, seed):
    lo = _u64(data, off) ^ ((_u64(secret, soff) + seed) & M64)
    hi = _u64(data, off + 8) ^ ((_u64(secret, soff + 8) - seed) & M64)
    return _mul128_fold64(lo, hi)


def _accumulate(acc, data, off, secret, soff):
    for i in range(8):
        lane = _u64(data, off + 8 * i)
        value = lane ^ _u64(secret, soff + 8 * i)
        acc[i ^ 1] = (acc[i ^ 1] + lane) & M64
        acc[i] = (acc[i] + (value & 0xFFFFFFFF) * (value >> 32)) & M64


def _scramble(acc, secret):
    s = len(secret) - 64
    for i in range(8):
        a = acc[i]
        a ^= a >> 47
        a ^= _u64(secret, s + 8 * i)
        acc[i] = (a * PRIME32_1) & M64


def _derive_secret(seed):
    out = bytearray()
    for i in range(12):
        out += struct.pack("<Q", (_u64(DEFAULT_SECRET, 16 * i) + seed) & M64)
        out += struct.pack("<Q", (_u64(DEFAULT_SECRET, 16 * i + 8) - seed) & M64)
    return bytes(out)


def xxh3_64(data, seed=0):
    """XXH3_64bits_withSeed(data, len(data), seed)."""
    data = bytes(data)
    n = len(data)
    seed &= M64
    s = DEFAULT_SECRET
    if n == 0:
        return _avalanche_xxh64(seed ^ _u64(s, 56) ^ _u64(s, 64))
    if n <= 3:
        combined = data[n - 1] | (n << 8) | (data[0] << 16) | (data[n >> 1] << 24)
        value = (((_u32(s, 0) ^ _u32(s, 4)) + seed) & M64) ^ combined
        return _avalanche_xxh64(value)
    if n <= 8:
        first, last = _u32(data, 0), _u32(data, n - 4)
        modified_seed = seed ^ (_bswap32(seed & 0xFFFFFFFF) << 32)
        combined = last | (first << 32)
        value = (((_u64(s, 8) ^ _u64(s, 16)) - modified_seed) & M64) ^ combined
        value ^= _rotl64(value, 49) ^ _rotl64(value, 24)
        value = (value * PRIME_MX2) & M64
        value ^= (value >> 35) + n
        value = (value * PRIME_MX2) & M64
        return value ^ (value >> 28)
    if n <= 16:
        lo = (((_u64(s, 24) ^ _u64(s, 32)) + seed) & M64) ^ _u64(data, 0)
        hi = (((_u64(s, 40) ^ _u64(s, 48)) - seed) & M64) ^ _u64(data, n - 8)
        value = (n + _bswap64(lo) + hi + _mul128_fold64(lo, hi)) & M64
        return _avalanche(value)
    if n <= 128:
        acc = (n * PRIME64_1) & M64
        rounds = ((n - 1) >> 5) + 1
        for i in range(rounds - 1, -1, -1):
            acc = (acc + _mix_step(data, 16 * i, s, 32 * i, seed)) & M64
            acc = (acc + _mix_step(data, n - 16 * i - 16, s, 32 * i + 16, seed)) & M64
        return _avalanche(acc)
    if n <= 240:
        acc = (n * PRIME64_1) & M64
        for i in range(8):
            acc = (acc + _mix_step(data, 16 * i, s, 16 * i, seed)) & M64
        acc = _avalanche(acc)
        for i in range(8, n >> 4):
            acc = (acc + _mix_step(data, 16 * i, s, 16 * (i - 8) + 3, seed)) & M64
        acc = (acc + _mix_step(data, n - 16, s, 119, seed)) & M64
        return _avalanche(acc)
    # Large inputs: blocks of stripes, with the secret derived from the seed.
    secret = s if seed == 0 else _derive_secret(seed)
    acc = [PRIME32_3, PRIME64_1, PRIME64_2, PRIME64_3, PRIME64_4, PRIME32_2, PRIME64_5, PRIME32_1]
    stripes_per_block = (len(secret) - 64) // 8
    block = 64 * stripes_per_block
    n_blocks = (n - 1) // block  # the last block (full or not) is left to the last round
    for b in range(n_blocks):
        for st in range(stripes_per_block):
            _accumulate(acc, data, b * block + 64 * st, secret, 8 * st)
        _scramble(acc, secret)
    last = n_blocks * block
    for st in range((n - last - 1) // 64):
        _accumulate(acc, data, last + 64 * st, secret, 8 * st)
    _accumulate(acc, data, n - 64, secret, len(secret) - 71)
    result = (n * PRIME64_1) & M64
    for i in range(4):
        result = (result + _mul128_fold64(acc[2 * i] ^ _u64(secret, 11 + 16 * i),
                                          acc[2 * i + 1] ^ _u64(secret, 11 + 16 * i + 8))) & M64
    return _avalanche(result)


def _self_test():
    """The published XXH3_64bits_withSeed vectors (xxHash cli/xsum_sanity_check.c) on
    its sanity buffer: byte i is the top byte of PRIME32 * PRIME64^i (mod 2^64)."""
    prime32, prime64 = 2654435761, 11400714785074694797
    buf = bytearray()
    gen = prime32
    for _ in range(4096 + 64 + 1):
        buf.append(gen >> 56)
        gen = (gen * prime64) & M64
    vectors = [
        (0, 0, 0x2D06800538D394C2), (0, prime64, 0xA8A6B918B2F0364A),
        (1, 0, 0xC44BDFF4074EECDB), (1, prime64, 0x032BE332DD766EF8),
        (6, 0, 0x27B56A84CD2D7325), (6, prime64, 0x84589C116AB59AB9),
        (12, 0, 0xA713DAF0DFBB77E7), (12, prime64, 0xE7303E1B2336DE0E),
        (24, 0, 0xA3FE70BF9D3510EB), (24, prime64, 0x850E80FC35BDD690),
        (48, 0, 0x397DA259ECBA1F11), (48, prime64, 0xADC2CBAA44ACC616),
        (80, 0, 0xBCDEFBBB2C47C90A), (80, prime64, 0xC6DD0CB699532E73),
        (195, 0, 0xCD94217EE362EC3A), (195, prime64, 0xBA68003D370CB3D9),
        (403, 0, 0xCDEB804D65C6DEA4), (403, prime64, 0x6259F6ECFD6443FD),
        (512, 0, 0x617E49599013CB6B), (512, prime64, 0x3CE457DE14C27708),
        (2048, 0, 0xDD59E2C3A5F038E0), (2048, prime64, 0x66F81670669ABABC),
        (2240, 0, 0x6E73A90539CF2948), (2240, prime64, 0x757BA8487D1B5247),
        (2367, 0, 0xCB37AEB9E5D361ED), (2367, prime64, 0xD2DB3415B942B42A),
    ]
    for n, seed, want in vectors:
        got = xxh3_64(buf[:n], seed)
        if got != want:
            sys.exit("xxh3_64 self-test failed: len %d seed %#x: got %#018x, want %#018x" % (n, seed, got, want))


# ---------------------------------------------------------------------------------
# The entry format (docs/store.md, "Byte layout").

MAGIC = b"ATTICKV1"
ALIGN = 4096
DTYPE_F32, DTYPE_F16, DTYPE_Q8_0, DTYPE_Q4_0, DTYPE_Q8_0_Q4_0, DTYPE_KIVI4 = 0, 1, 2, 3, 4, 5
DTYPE_NAME = {DTYPE_F32: "f32", DTYPE_F16: "f16", DTYPE_Q8_0: "q8_0", DTYPE_Q4_0: "q4_0", DTYPE_Q8_0_Q4_0: "q8_0/q4_0",
              DTYPE_KIVI4: "kivi4"}
QUANTIZED = (DTYPE_Q8_0, DTYPE_Q4_0, DTYPE_Q8_0_Q4_0, DTYPE_KIVI4)
# The type of an entry type's K rows and of its V rows.
ROW_TYPES = {DTYPE_Q8_0: (DTYPE_Q8_0, DTYPE_Q8_0), DTYPE_Q4_0: (DTYPE_Q4_0, DTYPE_Q4_0),
             DTYPE_Q8_0_Q4_0: (DTYPE_Q8_0, DTYPE_Q4_0), DTYPE_KIVI4: (DTYPE_KIVI4, DTYPE_Q4_0)}
SEED_HEADER = 0x68       # header checksum
SEED_ATTACHMENT = 0x6174  # attachment checksum
SEED_TENANT, SEED_FINGERPRINT, SEED_SESSION = 1, 2, 3  # key fields
SEED_TOKENS = 0x6B76     # key's token hash


def _string(s):
    b = s.encode("utf-8")
    return struct.pack("<I", len(b)) + b


def _elements(values, dtype):
    """Little-endian element bytes and their bit patterns (u32 for f32, u16 for f16)."""
    fmt = "<f" if dtype == DTYPE_F32 else "<e"
    raw = b"".join(struct.pack(fmt, x) for x in values)
    width = 4 if dtype == DTYPE_F32 else 2
    bits = [int.from_bytes(raw[i:i + width], "little") for i in range(0, len(raw), width)]
    return raw, bits


def _f32(x):
    """x rounded to the nearest f32 (ties to even)."""
    return struct.unpack("<f", struct.pack("<f", x))[0]


def _quantize_group(xs):
    """One group of f32 values in q8_0 (docs/store.md "Byte layout", llama.cpp's q8_0):
    d = f16(min(max|x| / 127, 65504)) (the quotient an f32 one, rounded to f16 ties to
    even), q = x / d (an f32 quotient) rounded half away from zero, clamped to
    [-127, 127]; a group of zeros has d = 0 and q = 0. Returns (q list, f16 bits of d)."""
    amax = max(abs(x) for x in xs)
    d_bits = int.from_bytes(struct.pack("<e", min(_f32(amax / 127.0), 65504.0)), "little")
    d = struct.unpack("<e", d_bits.to_bytes(2, "little"))[0]
    q = []
    for x in xs:
        if d == 0:
            q.append(0)
            continue
        r = _f32(x / d)  # f32 operands: the double quotient rounded to f32 is the f32 quotient
        n = int(abs(r) + 0.5) if abs(r) % 1 != 0.5 else int(abs(r)) + 1
        q.append(max(-127, min(127, n if r >= 0 else -n)))
    return q, d_bits


def _quantize_group_q4(xs):
    """One group of f32 values in q4_0 (docs/store.md "Byte layout", llama.cpp's
    quantize_row_q4_0_ref): m = the first value of largest magnitude (sign kept),
    d = m / -8 in f32, id = 1 / d (an f32 quotient; 0 when d is 0), code = min(15,
    trunc(f32(f32(x * id) + 8.5))); the scale stored is f16(d clamped to +-65504). Byte j
    of the group holds value j's code in its low nibble and value j + g / 2's in its high
    one. Returns (the group's g / 2 bytes, f16 bits of the scale)."""
    amax, m = 0.0, 0.0
    for x in xs:
        if amax < abs(x):
            amax, m = abs(x), x
    d = _f32(m / -8.0)
    inv = _f32(1.0 / d) if d != 0 else 0.0
    d_bits = int.from_bytes(struct.pack("<e", max(-65504.0, min(65504.0, d))), "little")
    codes = [min(15, int(_f32(_f32(x * inv) + 8.5))) for x in xs]
    half = len(xs) // 2
    return bytes(codes[j] | (codes[j + half] << 4) for j in range(half)), d_bits


def _quantized_rows(values, kv_dim, group, dtype):
    """A layer's K or V rows in q8_0 (per row kv_dim int8 values) or q4_0 (per row kv_dim
    / 2 bytes of codes, group after group), then the row's kv_dim / group f16 scales.
    Returns (bytes, the f32 inputs' bits)."""
    raw = b""
    inputs = []
    for t in range(len(values) // kv_dim):
        row = [_f32(x) for x in values[t * kv_dim:(t + 1) * kv_dim]]
        inputs += [int.from_bytes(struct.pack("<f", x), "little") for x in row]
        codes, scales = b"", []
        for g in range(0, kv_dim, group):
            if dtype == DTYPE_Q8_0:
                q, d_bits = _quantize_group(row[g:g + group])
                codes += struct.pack("<%db" % group, *q)
            else:
                q, d_bits = _quantize_group_q4(row[g:g + group])
                codes += q
            scales.append(d_bits)
        raw += codes + struct.pack("<%dH" % len(scales), *scales)
    return raw, inputs


def _f16_bits(x):
    """x (an f32 value, |x| <= 65504) rounded to f16, ties to even: its bits."""
    return int.from_bytes(struct.pack("<e", x), "little")


def _f16(bits):
    return struct.unpack("<e", bits.to_bytes(2, "little"))[0]


def _kivi4_k(values, kv_dim, ends):
    """A layer's K in kivi4 (docs/store.md "Byte layout"): per group of tokens (ends: each
    group's end token), per channel c: m = f16(min over the group's tokens, clamped to
    +-65504), s = f16(f32(f32(max - m) / 15) clamped to [0, 65504]), code = round half to even of
    f32(f32(x - m) / s), clamped to [0, 15] (0 when s is 0). The layer's codes come first,
    token by token (channel 2c in the low nibble of byte c, 2c + 1 in the high one), then
    each group's kv_dim f16 scales and kv_dim f16 minimums. Returns (bytes, f32 inputs'
    bits)."""
    n_tokens = len(values) // kv_dim
    rows = [[_f32(x) for x in values[t * kv_dim:(t + 1) * kv_dim]] for t in range(n_tokens)]
    inputs = [int.from_bytes(struct.pack("<f", x), "little") for row in rows for x in row]
    codes = [[0] * kv_dim for _ in range(n_tokens)]
    params = b""
    first = 0
    for end in ends:
        scales, mins = [], []
        for c in range(kv_dim):
            col = [rows[t][c] for t in range(first, end)]
            m_bits = _f16_bits(max(-65504.0, min(65504.0, min(col))))
            m = _f16(m_bits)
            s_bits = _f16_bits(max(0.0, min(_f32(_f32(max(col) - m) / 15.0), 65504.0)))
            s = _f16(s_bits)
            for t in range(first, end):
                codes[t][c] = 0 if s == 0 else max(0, min(15, round(_f32(_f32(rows[t][c] - m) / s))))
            scales.append(s_bits)
            mins.append(m_bits)
        params += struct.pack("<%dH" % kv_dim, *scales) + struct.pack("<%dH" % kv_dim, *mins)
        first = end
    raw = b"".join(bytes(row[2 * j] | (row[2 * j + 1] << 4) for j in range(kv_dim // 2)) for row in codes)
    return raw + params, inputs


def write_entry(e):
    """Serialized bytes of entry `e` (a dict) and what the manifest records of it."""
    dtype, n_layers, kv_dim = e["dtype"], e["n_layers"], e["kv_dim"]
    n_tokens = len(e["tokens"])
    assert len(e["positions"]) == n_tokens
    version = 2 if e["attachments"] else 1
    group = e.get("group", 0)
    layers, k_bits, v_bits, layer_checksums = [], [], [], []
    k_inputs, v_inputs = [], []
    for l in range(n_layers):
        if dtype in QUANTIZED:
            # The bits listed are the stored bytes (codes and scales, row by row); the f32
            # inputs they were quantized from are listed apart.
            k_type, v_type = ROW_TYPES[dtype]
            if dtype == DTYPE_KIVI4:
                k_raw, ki = _kivi4_k(e["k"][l], kv_dim, e["k_group_ends"])
            else:
                k_raw, ki = _quantized_rows(e["k"][l], kv_dim, group, k_type)
            v_raw, vi = _quantized_rows(e["v"][l], kv_dim, group, v_type)
            kb, vb = list(k_raw), list(v_raw)
            k_inputs.append(ki)
            v_inputs.append(vi)
            def codes(t):
                return kv_dim if t == DTYPE_Q8_0 else kv_dim // 2
            if dtype == DTYPE_KIVI4:
                assert len(kb) == n_tokens * kv_dim // 2 + len(e["k_group_ends"]) * 4 * kv_dim
            else:
                assert len(kb) == n_tokens * (codes(k_type) + 2 * kv_dim // group)
            assert len(vb) == n_tokens * (codes(v_type) + 2 * kv_dim // group)
        else:
            k_raw, kb = _elements(e["k"][l], dtype)
            v_raw, vb = _elements(e["v"][l], dtype)
            assert len(kb) == len(vb) == n_tokens * kv_dim
        layers.append(k_raw + v_raw)
        k_bits.append(kb)
        v_bits.append(vb)
        # A layer's checksum: XXH3-64 of its K bytes (seed 0), then of its V bytes seeded
        # with the first.
        layer_checksums.append(xxh3_64(v_raw, xxh3_64(k_raw, 0)))
    body = MAGIC + struct.pack("<5I", version, dtype, n_layers, kv_dim, n_tokens)
    if dtype in QUANTIZED:  # a quantized type's group follows n_tokens
        body += struct.pack("<I", group)
    if dtype == DTYPE_KIVI4:  # then K's groups: their count and end tokens
        ends = e["k_group_ends"]
        body += struct.pack("<I", len(ends)) + struct.pack("<%dI" % len(ends), *ends)
    body += struct.pack("<q", e["expires_at_ms"])
    body += _string(e["tenant"]) + _string(e["session_id"]) + _string(e["fingerprint"])
    attachments = []
    if version == 2:
        body += struct.pack("<I", len(e["attachments"]))
        for kind, blob in e["attachments"]:
            checksum = xxh3_64(blob, SEED_ATTACHMENT)
            body += _string(kind) + struct.pack("<QQ", len(blob), checksum)
            attachments.append({"kind": kind, "bytes_hex": blob.hex(), "checksum": "%016x" % checksum})
    body += struct.pack("<%di" % n_tokens, *e["tokens"])
    body += struct.pack("<%di" % n_tokens, *e["positions"])
    body += struct.pack("<%dQ" % n_layers, *layer_checksums)
    header_checksum = xxh3_64(body, SEED_HEADER)
    header = body + struct.pack("<Q", header_checksum)
    data_offset = (len(header) + ALIGN - 1) // ALIGN * ALIGN
    out = header + bytes(data_offset - len(header)) + b"".join(layers)
    out += b"".join(blob for _, blob in e["attachments"])

    def hex16(v):
        return "%016x" % v

    key = "-".join([
        hex16(xxh3_64(e["tenant"].encode("utf-8"), SEED_TENANT)),
        hex16(xxh3_64(e["fingerprint"].encode("utf-8"), SEED_FINGERPRINT)),
        DTYPE_NAME[dtype].replace("/", "+"),  # a key is a file name: '+' for '/'
        hex16(xxh3_64(struct.pack("<%di" % n_tokens, *e["tokens"]), SEED_TOKENS)),
        hex16(xxh3_64(e["session_id"].encode("utf-8"), SEED_SESSION)),
    ])
    manifest = {
        "version": version,
        "dtype": DTYPE_NAME[dtype],
        "n_layers": n_layers,
        "kv_dim": kv_dim,
        "expires_at_ms": e["expires_at_ms"],
        "tenant": e["tenant"],
        "session_id": e["session_id"],
        "fingerprint": e["fingerprint"],
        "tokens": e["tokens"],
        "positions": e["positions"],
        "k_bits": k_bits,
        "v_bits": v_bits,
        "attachments": attachments,
        "layer_checksums": [hex16(c) for c in layer_checksums],
        "header_bytes": len(header),  # through the header checksum; zeros follow to data_offset
        "header_checksum": hex16(header_checksum),
        "data_offset": data_offset,
        "total_bytes": len(out),
        "key": key,
    }
    if dtype in QUANTIZED:
        manifest["group"] = group
        manifest["k_input_bits"] = k_inputs
        manifest["v_input_bits"] = v_inputs
    if dtype == DTYPE_KIVI4:
        manifest["k_group_ends"] = e["k_group_ends"]
    return out, manifest


def _values(n_layers, n_tokens, kv_dim, a, b, c, mod, scale):
    """Small dyadic values (exact in f16 and f32), different for every layer, token and
    element."""
    return [[((l * a + t * b + j * c) % mod - mod // 2) / scale
             for t in range(n_tokens) for j in range(kv_dim)] for l in range(n_layers)]


def _q8_golden_rows(layer, sign):
    """The q8_0 golden entry's 3 rows of 16 values (see main) for one layer's K or V."""
    t0 = [127 / 16, 2.5 / 16, -2.5 / 16, 0.5 / 16, -0.5 / 16, 1.0, -3.0, 0.25 * (layer + 1)] + [0.0] * 8
    t1 = [1.0, -1.0, 0.5, 0.1, -0.3, 0.007, 0.0, 0.75] + [sign * x for x in [0.125, 1.5, -2.0, 3.0, 0.0, 1.0, -4.0, 0.5]]
    t2 = [1e6, -1e6, 300.0, 5e5, -2e6, 0.0, 1e5, -3e4] + [0.001 * (j + 1) for j in range(8)]
    return [sign * x if i < 8 else x for i, x in enumerate(t0)] + t1 + t2


def _q4_golden_rows(layer, sign):
    """The q4_0 golden entry's 3 rows of 16 values (see main) for one layer's K or V."""
    # Token 0: m = -4 (d = 0.5: code trunc(x / 0.5 + 8.5): 0.75 -> 10, -0.25 -> 8, 3.5 ->
    # 15 and 3.9 -> 16 capped at 15), then a group of zeros (d = 0, every code 8).
    t0 = [-4.0, 0.75, -0.25, 3.5, 3.9, 0.0, -1.0, 0.5 * (layer + 1)] + [0.0] * 8
    # Token 1: +-2 tie in magnitude (the first, +2, is m: d = -0.25), then m = 1 (d =
    # -0.125) with values not multiples of the step.
    t1 = [2.0, -2.0, 0.3, -0.7, 1.1, 0.01, -1.9, 0.0] + [sign * x for x in [0.1, 1.0, -0.33, 0.6, -0.99, 0.5, 0.2, -0.05]]
    # Token 2: m = -1e6 (d = 125000 clamps to 65504 in the scale; the codes use the
    # unclamped d), then m = 7e-3 (d = -8.75e-4: a scale f16 rounds).
    t2 = [-1e6, 5e5, 3e5, -2.5e5, 1e5, 0.0, 9e5, -4e5] + [0.001 * (j + 1) for j in range(7)] + [-0.002]
    return [sign * x if i < 8 else x for i, x in enumerate(t0)] + t1 + t2


def _kivi4_golden_k(layer):
    """The kivi4 golden entry's K: 5 tokens of 16 channels (see main), two groups (tokens
    0-2 and 3-4), row by row."""
    rows = []
    for t in range(5):
        g = 0 if t < 3 else 1
        row = [
            0.75,                                   # c0: constant (s = 0, every code 0)
            [0.0, 15 / 16, 0.5][t] if g == 0 else [0.25, 0.0][t - 3],  # c1: exact steps of 1/16 (group 0)
            [0.0, 15.0, 2.5][t] if g == 0 else [3.5, 0.0][t - 3],      # c2: s = 1; 2.5 -> 2 (ties to even)
            0.3 if g == 1 else [0.3, 0.9, 0.6][t],  # c3: min rounds up in f16 (code 0; group 1: scale 0)
            [-1e6, 1e6, 0.0][t] if g == 0 else [-7.0, -9.0][t - 3],    # c4: min and scale clamp to 65504
            [-3.0, -2.0, -1.25][t] if g == 0 else [-0.1, -0.2][t - 3], # c5: negative only
            0.1 * (t + 1) * (layer + 1),            # c6: rounded scales
            -0.05 * t + 0.01 * layer,               # c7
        ]
        row += [((layer * 7 + t * 5 + j * 3) % 17 - 8) / 8.0 + 0.03 * j for j in range(8)]  # c8-15
        rows += row
    return rows


def main():
    _self_test()
    here = os.path.dirname(os.path.abspath(__file__))
    entries = {
        # f32, version 1. A layer's K (and V) is 5 * 16 * 4 = 320 bytes: XXH3's large-input
        # path; the header body (130 bytes) its 129-240 path. Positions are not 0..n-1 (a
        # truncated history's are not).
        "golden_f32_v1.kv": {
            "dtype": DTYPE_F32, "n_layers": 2, "kv_dim": 16, "expires_at_ms": 4102444800123,
            "tenant": "alice", "session_id": "chat-7", "fingerprint": "golden-model-fp",
            "tokens": [1, 17, 4242, 7, 100000], "positions": [0, 1, 2, 9, 10],
            "k": _values(2, 5, 16, 31, 7, 3, 41, 8.0), "v": _values(2, 5, 16, 17, 11, 5, 37, 16.0),
            "attachments": [],
        },
        # f16, version 2 (one attachment), no session, no expiry. A layer's K is 3 * 4 * 2 =
        # 24 bytes (XXH3's 17-128 path).
        "golden_f16_v2.kv": {
            "dtype": DTYPE_F16, "n_layers": 3, "kv_dim": 4, "expires_at_ms": 0,
            "tenant": "bob", "session_id": "", "fingerprint": "golden-model-fp",
            "tokens": [1, 2, 3], "positions": [5, 6, 7],
            "k": _values(3, 3, 4, 13, 5, 3, 29, 4.0), "v": _values(3, 3, 4, 7, 3, 11, 23, 8.0),
            "attachments": [("golden-blob", b"attic golden attachment \x00\x01\x02\xff")],
        },
        # q8_0, version 1: 2 layers, kv_dim 16 in groups of 8 (stories260K's head_dim), 3
        # tokens; a row is 16 + 2 * 2 = 20 bytes. The values are hand-picked groups: token 0
        # has max |x| = 127/16 (scale 1/16 exactly: q = 16 x, with +-2.5/16 and +-0.5/16
        # rounding away from zero to +-3 and +-1) and a group of zeros (scale 0); token 1
        # max |x| = 1 (scale f16(1/127) = 0x2008, not exact); token 2 max |x| = 1e6 (the
        # scale clamps to 65504: every value clamps to +-127, or rounds to 0).
        "golden_q8_0_v1.kv": {
            "dtype": DTYPE_Q8_0, "group": 8, "n_layers": 2, "kv_dim": 16, "expires_at_ms": 0,
            "tenant": "carol", "session_id": "q8-session", "fingerprint": "golden-model-fp",
            "tokens": [11, 12, 13], "positions": [0, 1, 2],
            "k": [_q8_golden_rows(l, 1.0) for l in range(2)], "v": [_q8_golden_rows(l, -0.5) for l in range(2)],
            "attachments": [],
        },
        # q4_0, version 1: 2 layers, kv_dim 16 in groups of 8, 3 tokens; a row is 8 + 2 * 2 =
        # 12 bytes. Hand-picked groups (_q4_golden_rows): exact steps, the cap at code 15, a
        # group of zeros, a tie in magnitude, a clamped scale, a rounded one; V's rows are
        # K's times -0.5 (the other sign of every scale).
        "golden_q4_0_v1.kv": {
            "dtype": DTYPE_Q4_0, "group": 8, "n_layers": 2, "kv_dim": 16, "expires_at_ms": 0,
            "tenant": "dave", "session_id": "q4-session", "fingerprint": "golden-model-fp",
            "tokens": [21, 22, 23], "positions": [4, 5, 6],
            "k": [_q4_golden_rows(l, 1.0) for l in range(2)], "v": [_q4_golden_rows(l, -0.5) for l in range(2)],
            "attachments": [],
        },
        # q8_0/q4_0, version 1: K's rows q8_0 (20 bytes at kv_dim 16, group 8), V's q4_0 (12
        # bytes), so a layer is 3 * 20 of K then 3 * 12 of V; K holds the q8_0 entry's
        # hand-picked rows, V the q4_0 entry's.
        "golden_q8_0_q4_0_v1.kv": {
            "dtype": DTYPE_Q8_0_Q4_0, "group": 8, "n_layers": 2, "kv_dim": 16, "expires_at_ms": 0,
            "tenant": "erin", "session_id": "k8v4-session", "fingerprint": "golden-model-fp",
            "tokens": [31, 32, 33], "positions": [0, 1, 2],
            "k": [_q8_golden_rows(l, 1.0) for l in range(2)], "v": [_q4_golden_rows(l, -0.5) for l in range(2)],
            "attachments": [],
        },
        # kivi4, version 1: 2 layers, kv_dim 16, V's group 8, 5 tokens in two K groups (3 and
        # 2 tokens: a group as a turn's save writes it after a stored entry's). A layer is 5
        # rows of 8 bytes of K codes, 2 groups x (16 + 16) f16 of scales and minimums, then
        # 5 q4_0 rows of V (12 bytes). K's channels are hand-picked (_kivi4_golden_k): a
        # constant one, exact steps, a tie in rounding, a minimum f16 rounds up, clamped
        # scale and minimum, a negative-only one, a constant one f16 rounds up past itself
        # (a scale of 0, not negative); V holds the q4_0 entry's rows.
        "golden_kivi4_v1.kv": {
            "dtype": DTYPE_KIVI4, "group": 8, "n_layers": 2, "kv_dim": 16, "expires_at_ms": 0,
            "tenant": "frank", "session_id": "kivi-session", "fingerprint": "golden-model-fp",
            "tokens": [41, 42, 43, 44, 45], "positions": [0, 1, 2, 3, 4], "k_group_ends": [3, 5],
            "k": [_kivi4_golden_k(l) for l in range(2)],
            "v": [_q4_golden_rows(l, -0.5) + _q4_golden_rows(l, 0.25)[:32] for l in range(2)],
            "attachments": [],
        },
    }
    manifest = {}
    for name, e in entries.items():
        data, m = write_entry(e)
        with open(os.path.join(here, name), "wb") as f:
            f.write(data)
        manifest[name] = m
    text = json.dumps(manifest, indent=1, sort_keys=True)
    # Lists of numbers on one line each.
    text = re.sub(r"\[[-0-9,\s]*\]", lambda m: re.sub(r"\s+", " ", m.group(0)).replace("[ ", "[").replace(" ]", "]"), text)
    with open(os.path.join(here, "golden_entries.json"), "w") as f:
        f.write(text + "\n")


if __name__ == "__main__":
    main()
