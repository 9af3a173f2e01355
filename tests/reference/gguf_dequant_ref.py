#!/usr/bin/env python3
"""Independent reference for Attic's GGUF block-format dequantization.

    gguf_dequant_ref.py FILE.gguf DUMP.f32

Parses FILE.gguf itself, dequantizes every tensor of a type listed below with numpy in
float32 following the ggml format definitions (block layouts of ggml-common.h,
dequantize_row_* of ggml-quants.c: each product and difference rounded to float32 in the
definition's order), and compares bit for bit with DUMP.f32: the f32 values Attic produced
for the same tensors, concatenated in the file's tensor order. Prints one line per tensor
type and exits 1 on any difference. Written separately from Attic's C++ (no shared code).
"""
import struct
import sys

import numpy as np

F32 = np.float32
IQ4NL = np.array([-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113], dtype=np.float32)
# ggml type id: (name, elements per block, bytes per block)
TYPES = {0: ("F32", 1, 4), 1: ("F16", 1, 2), 2: ("Q4_0", 32, 18), 3: ("Q4_1", 32, 20), 6: ("Q5_0", 32, 22),
         7: ("Q5_1", 32, 24), 8: ("Q8_0", 32, 34), 10: ("Q2_K", 256, 84), 11: ("Q3_K", 256, 110),
         12: ("Q4_K", 256, 144), 13: ("Q5_K", 256, 176), 14: ("Q6_K", 256, 210), 20: ("IQ4_NL", 32, 18),
         23: ("IQ4_XS", 256, 136), 30: ("BF16", 1, 2)}


def half(b, off):
    return b[:, off:off + 2].copy().view(np.float16).astype(F32)[:, 0]


def f(a):
    return np.asarray(a).astype(F32)


def q4_0(b):
    d = half(b, 0)
    qs = b[:, 2:18].astype(np.int32)
    q = np.concatenate([(qs & 15) - 8, (qs >> 4) - 8], axis=1)
    return f(q) * d[:, None]


def q4_1(b):
    d, m = half(b, 0), half(b, 2)
    qs = b[:, 4:20].astype(np.int32)
    q = np.concatenate([qs & 15, qs >> 4], axis=1)
    return f(q) * d[:, None] + m[:, None]


def q5(b, has_min):
    d = half(b, 0)
    o = 4 if has_min else 2
    qh = b[:, o:o + 4].copy().view("<u4")[:, 0].astype(np.int64)
    qs = b[:, o + 4:o + 20].astype(np.int32)
    nib = np.concatenate([qs & 15, qs >> 4], axis=1)
    hbit = np.stack([(qh >> e) & 1 for e in range(32)], axis=1).astype(np.int32)  # element e: bit e
    q = nib | (hbit << 4)
    if has_min:
        return f(q) * d[:, None] + half(b, 2)[:, None]
    return f(q - 16) * d[:, None]


def q8_0(b):
    return f(b[:, 2:34].view(np.int8)) * half(b, 0)[:, None]


def iq4_nl(b):
    qs = b[:, 2:18].astype(np.int32)
    return IQ4NL[np.concatenate([qs & 15, qs >> 4], axis=1)] * half(b, 0)[:, None]


def q2_k(b):
    sc, qs = b[:, 0:16].astype(np.int32), b[:, 16:80].astype(np.int32)
    d, dmin = half(b, 80), half(b, 82)
    y = np.zeros((b.shape[0], 256), F32)
    for h in range(2):
        for s in range(4):
            for g in range(2):
                si = 8 * h + 2 * s + g
                dl = d * f(sc[:, si] & 15)
                ml = dmin * f(sc[:, si] >> 4)
                q = (qs[:, 32 * h + 16 * g:32 * h + 16 * g + 16] >> (2 * s)) & 3
                i = 128 * h + 32 * s + 16 * g
                y[:, i:i + 16] = dl[:, None] * f(q) - ml[:, None]
    return y


def q3_k(b):
    hm, qs, raw = b[:, 0:32].astype(np.int32), b[:, 32:96].astype(np.int32), b[:, 96:108].astype(np.int32)
    d = half(b, 108)
    scales = []
    for i in range(16):
        low = raw[:, i] & 15 if i < 8 else raw[:, i - 8] >> 4
        high = (raw[:, 8 + i % 4] >> (2 * (i // 4))) & 3
        scales.append(low | (high << 4))
    y = np.zeros((b.shape[0], 256), F32)
    for h in range(2):
        for s in range(4):
            for g in range(2):
                dl = d * f(scales[8 * h + 2 * s + g] - 32)
                lo = (qs[:, 32 * h + 16 * g:32 * h + 16 * g + 16] >> (2 * s)) & 3
                hb = (hm[:, 16 * g:16 * g + 16] >> (4 * h + s)) & 1
                q = lo - np.where(hb == 1, 0, 4)
                i = 128 * h + 32 * s + 16 * g
                y[:, i:i + 16] = dl[:, None] * f(q)
    return y


def scale_min_k4(sc, j):
    if j < 4:
        return sc[:, j] & 63, sc[:, j + 4] & 63
    return (sc[:, j + 4] & 15) | ((sc[:, j - 4] >> 6) << 4), (sc[:, j + 4] >> 4) | ((sc[:, j] >> 6) << 4)


def q45_k(b, five):
    d, dmin = half(b, 0), half(b, 2)
    sc = b[:, 4:16].astype(np.int32)
    qh = b[:, 16:48].astype(np.int32)
    qs = b[:, 48:176].astype(np.int32) if five else b[:, 16:144].astype(np.int32)
    y = np.zeros((b.shape[0], 256), F32)
    for c in range(4):
        for h in range(2):
            s, m = scale_min_k4(sc, 2 * c + h)
            chunk = qs[:, 32 * c:32 * c + 32]
            q = chunk & 15 if h == 0 else chunk >> 4
            if five:
                q = q + 16 * ((qh >> (2 * c + h)) & 1)
            y[:, 64 * c + 32 * h:64 * c + 32 * h + 32] = (d * f(s))[:, None] * f(q) - (dmin * f(m))[:, None]
    return y


def q6_k(b):
    ql, qh = b[:, 0:128].astype(np.int32), b[:, 128:192].astype(np.int32)
    sc = b[:, 192:208].view(np.int8).astype(np.int32)
    d = half(b, 208)
    y = np.zeros((b.shape[0], 256), F32)
    for n in range(2):
        for r in range(4):
            for l in range(32):
                byte = ql[:, 64 * n + l + 32 * (r % 2)]
                nib = byte & 15 if r < 2 else byte >> 4
                q = (nib | (((qh[:, 32 * n + l] >> (2 * r)) & 3) << 4)) - 32
                s = sc[:, 8 * n + l // 16 + 2 * r]
                y[:, 128 * n + 32 * r + l] = (d * f(s)) * f(q)
    return y


def iq4_xs(b):
    d = half(b, 0)
    sh = b[:, 2:4].copy().view("<u2")[:, 0].astype(np.int32)
    sl, qs = b[:, 4:8].astype(np.int32), b[:, 8:136].astype(np.int32)
    y = np.zeros((b.shape[0], 256), F32)
    for ib in range(8):
        ls = ((sl[:, ib // 2] >> (4 * (ib % 2))) & 15) | (((sh >> (2 * ib)) & 3) << 4)
        dl = d * f(ls - 32)
        blk = qs[:, 16 * ib:16 * ib + 16]
        y[:, 32 * ib:32 * ib + 32] = dl[:, None] * IQ4NL[np.concatenate([blk & 15, blk >> 4], axis=1)]
    return y


DEQUANT = {2: q4_0, 3: q4_1, 6: lambda b: q5(b, False), 7: lambda b: q5(b, True), 8: q8_0, 10: q2_k, 11: q3_k,
           12: lambda b: q45_k(b, False), 13: lambda b: q45_k(b, True), 14: q6_k, 20: iq4_nl, 23: iq4_xs}


class Reader:
    def __init__(self, data):
        self.d, self.p = data, 0

    def take(self, fmt):
        v = struct.unpack_from("<" + fmt, self.d, self.p)
        self.p += struct.calcsize("<" + fmt)
        return v[0]

    def string(self):
        n = self.take("Q")
        s = self.d[self.p:self.p + n].decode("utf-8", "replace")
        self.p += n
        return s

    def value(self, t):
        scalar = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}
        if t in scalar:
            return self.take(scalar[t])
        if t == 8:
            return self.string()
        if t == 9:
            et, n = self.take("I"), self.take("Q")
            return [self.value(et) for _ in range(n)]
        raise ValueError(f"unknown metadata type {t}")


def main():
    path, dump_path = sys.argv[1], sys.argv[2]
    data = open(path, "rb").read()
    r = Reader(data)
    assert data[:4] == b"GGUF", "not a GGUF file"
    r.p = 4
    r.take("I")
    n_tensors, n_kv = r.take("Q"), r.take("Q")
    align = 32
    for _ in range(n_kv):
        key, t = r.string(), r.take("I")
        v = r.value(t)
        if key == "general.alignment":
            align = v
    infos = []
    for _ in range(n_tensors):
        name = r.string()
        nd = r.take("I")
        ne = [r.take("Q") for _ in range(nd)]
        infos.append((name, ne, r.take("I"), r.take("Q")))
    base = (r.p + align - 1) // align * align
    dump = np.fromfile(dump_path, dtype=np.float32)
    pos, bad, counts = 0, 0, {}
    for name, ne, t, off in infos:
        if t not in TYPES:
            continue
        tname, bs, bb = TYPES[t]
        n = int(np.prod(ne))
        raw = np.frombuffer(data, dtype=np.uint8, count=n // bs * bb, offset=base + off)
        if t in DEQUANT:
            ref = DEQUANT[t](raw.reshape(-1, bb)).reshape(-1)
        elif t == 0:
            ref = raw.view(np.float32)
        elif t == 1:
            ref = raw.view(np.float16).astype(F32)
        else:
            ref = (raw.view(np.uint16).astype(np.uint32) << 16).view(np.float32)
        got = dump[pos:pos + n]
        pos += n
        diff = int(np.count_nonzero(ref.view(np.uint32) != got.view(np.uint32))) if got.size == n else n
        counts.setdefault(tname, [0, 0, 0])
        counts[tname][0] += 1
        counts[tname][1] += n
        counts[tname][2] += diff
        if diff:
            bad += 1
            i = int(np.argmax(ref.view(np.uint32) != got.view(np.uint32))) if got.size == n else 0
            print(f"MISMATCH {name} {tname}: {diff} of {n} values differ (first at {i}: "
                  f"ref {ref[i]!r} got {got[i] if got.size > i else None!r})")
    if pos != dump.size:
        print(f"MISMATCH dump has {dump.size} values, the file's tensors {pos}")
        bad += 1
    for tname, (nt, nv, nd) in sorted(counts.items()):
        print(f"{tname}: {nt} tensors, {nv} values, {nd} differ")
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
