#!/usr/bin/env python3
"""Summarises bench/compare_llamacpp.sh runs: medians per engine, ratios, roofs.

Roofs (this machine, DESIGN.md): fp32 GEMM ~205 GFLOP/s (2 threads), ~2x that with
AVX512-BF16; DRAM read: what `attic bench` measured in the same runs (its read_roof).
FLOPs/token = 2 x matmul params (+ lm_head for the one logits row per prompt) + causal
attention 2*2*L*q_dim*(N+1)/2; the decode share counts the weight bytes per token (the
f32 KV read at the mean context is noted beside it). The weight bytes are the file's own
(its tensor table), so a quantized file's roof is its quantized size."""
import json, os, statistics, struct, sys

def gguf_shape(path):
    """Reads the few GGUF keys needed for the arithmetic (independent of Attic)."""
    with open(path, 'rb') as f:
        assert f.read(4) == b'GGUF'
        ver, nt, nkv = struct.unpack('<IQQ', f.read(20))
        def rs():
            n, = struct.unpack('<Q', f.read(8)); return f.read(n).decode('utf-8', 'replace')
        sizes = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}
        def rv(t):
            if t == 8: return rs()
            if t == 9:
                at, n = struct.unpack('<IQ', f.read(12))
                if at == 8:
                    for _ in range(n): rs()
                else: f.seek(sizes[at] * n, 1)
                return None
            fmt = {0: '<B', 1: '<b', 2: '<H', 3: '<h', 4: '<I', 5: '<i', 6: '<f', 7: '<?', 10: '<Q', 11: '<q', 12: '<d'}[t]
            return struct.unpack(fmt, f.read(sizes[t]))[0]
        kv = {}
        for _ in range(nkv):
            k = rs(); t, = struct.unpack('<I', f.read(4)); kv[k] = rv(t)
        tensors = {}
        for _ in range(nt):
            name = rs(); nd, = struct.unpack('<I', f.read(4))
            dims = struct.unpack('<%dQ' % nd, f.read(8 * nd)); t, _off = struct.unpack('<IQ', f.read(12))
            tensors[name] = (t, dims)
    return kv, tensors

# ggml type id -> (elements per block, bytes per block), from ggml's block definitions.
GGML_BLOCKS = {0: (1, 4), 1: (1, 2), 2: (32, 18), 3: (32, 20), 6: (32, 22), 7: (32, 24), 8: (32, 34),
               10: (256, 84), 11: (256, 110), 12: (256, 144), 13: (256, 176), 14: (256, 210),
               20: (32, 18), 23: (256, 136), 30: (1, 2)}
FLOAT_TYPES = {0, 1, 30}

def matrix_bytes(tensors):
    """Bytes of the 2-D weights a decode step reads: every matrix but the embedding table,
    which counts only when it is also the output head (tied embeddings)."""
    total = 0
    for name, (t, dims) in tensors.items():
        if len(dims) != 2: continue
        if name == 'token_embd.weight' and 'output.weight' in tensors: continue
        n = dims[0] * dims[1]; be, bb = GGML_BLOCKS[t]
        total += n // be * bb
    return total

def model_numbers(path):
    kv, tensors = gguf_shape(path)
    h = kv['llama.embedding_length']; L = kv['llama.block_count']; ff = kv['llama.feed_forward_length']
    nh = kv['llama.attention.head_count']; nkv = kv['llama.attention.head_count_kv']; V = kv.get('llama.vocab_size', 49152)
    hd = h // nh
    per_layer = h * nh * hd * 2 + h * nkv * hd * 2 + 3 * h * ff
    body = L * per_layer
    head = V * h
    types = {t for t, dims in tensors.values() if len(dims) == 2}
    return dict(hidden=h, layers=L, q_dim=nh * hd, kv_dim=nkv * hd, body_params=body, head_params=head,
                weight_bytes=matrix_bytes(tensors), float_weights=types <= FLOAT_TYPES,
                bf16=types == {30} or types == {30, 0})

def flops_prefill(m, n):  # per token
    att = 2 * 2 * m['layers'] * m['q_dim'] * (n + 1) / 2
    return 2 * m['body_params'] + 2 * m['head_params'] / n + att

def decode_bytes(m, ctx):
    return m['weight_bytes'] + 2 * m['layers'] * m['kv_dim'] * 4 * ctx

def load(path):
    with open(path) as f: return json.load(f)

def main():
    out_dir, models = sys.argv[1], sys.argv[2:]
    rows, summary = [], []
    for mpath in models:
        name = os.path.basename(mpath)[:-5]
        m = model_numbers(mpath)
        bf16 = m['bf16']
        att = [load(os.path.join(out_dir, f)) for f in sorted(os.listdir(out_dir)) if f.startswith(name + '.attic.')]
        lc = [load(os.path.join(out_dir, f)) for f in sorted(os.listdir(out_dir)) if f.startswith(name + '.llamacpp.')]
        def attic_vals(test):
            return [r['tokens_per_s'] for a in att for r in a['results'] if r['test'] == test]
        def lc_vals(test):
            if test.startswith('pp'): return [x['pp'][test[2:]]['median'] for x in lc]
            return [list(x['tg'].values())[0]['median'] for x in lc]
        for test, n in (('pp512', 512), ('pp2048', 2048), ('tg128', 576)):
            a, l = attic_vals(test), lc_vals(test)
            if not a or not l: continue
            am, lm = statistics.median(a), statistics.median(l)
            if test.startswith('pp'):
                fl = flops_prefill(m, n)
                if m['float_weights']:
                    roof = 205e9 * (2 if bf16 else 1)
                    frac = lambda t: t * fl / roof
                    note = f"{fl/1e9:.3f} GFLOP/tok vs {roof/1e9:.0f} GFLOP/s"
                else:  # int8 dot products (vpdpbusd): no measured roof to set them against
                    frac = lambda t: None
                    note = f"{fl/1e9:.3f} GFLOP/tok: Attic {am*fl/1e9:.0f}, llama.cpp {lm*fl/1e9:.0f} GFLOP/s (int8 products; no roof)"
            else:
                # The weights read per token against the DRAM read roof `attic bench` measured
                # in each of its runs (median; 40 GB/s if the runs predate that).
                by = m['weight_bytes']
                roofs = [a['read_roof']['gbs'] * 1e9 for a in att if 'read_roof' in a]
                roof = statistics.median(roofs) if roofs else 40e9
                frac = lambda t: t * by / roof
                note = f"weights {by/1e6:.0f} MB/tok vs {roof/1e9:.1f} GB/s measured (+{(decode_bytes(m, n) - by)/1e6:.0f} MB f32 KV)"
            row = dict(model=name, test=test, attic=am, llamacpp=lm, ratio=am / lm, attic_runs=a, llamacpp_runs=l,
                       attic_roof_frac=frac(am), llamacpp_roof_frac=frac(lm), roof=note)
            summary.append(row)
    print("| model | test | Attic t/s | llama.cpp t/s | ratio | Attic % of roof | llama.cpp % of roof | roof |")
    print("|---|---|---|---|---|---|---|---|")
    for r in summary:
        pct = lambda v: '-' if v is None else f"{100*v:.0f}%"
        print(f"| {r['model']} | {r['test']} | {r['attic']:.1f} | {r['llamacpp']:.1f} | {r['ratio']:.2f}x | "
              f"{pct(r['attic_roof_frac'])} | {pct(r['llamacpp_roof_frac'])} | {r['roof']} |")
    with open(os.path.join(out_dir, '..', 'compare.json'), 'w') as f:
        json.dump(summary, f, indent=1)
    print(json.dumps(summary, indent=1))

if __name__ == '__main__':
    main()
