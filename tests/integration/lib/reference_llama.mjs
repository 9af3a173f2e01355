// An independent reference for stories260K: a plain Llama forward pass (Hugging Face
// conventions: RMSNorm, rotate-half RoPE, grouped-query attention, SwiGLU, tied
// embeddings) in float64 over the model's float32 safetensors, written from the model's
// config and nothing of Attic's, and the tokenizer.json decoder (SentencePiece pieces,
// byte fallback, the leading space stripped). Tests check it against the model's
// golden_reference.json before they trust it for prompts the golden file does not hold.
import fs from 'node:fs';
import path from 'node:path';

function loadSafetensors(file) {
  const buf = fs.readFileSync(file);
  const n = Number(buf.readBigUInt64LE(0));
  const header = JSON.parse(buf.subarray(8, 8 + n).toString('utf8'));
  const base = 8 + n;
  const tensors = {};
  for (const [name, t] of Object.entries(header)) {
    if (name === '__metadata__') continue;
    if (t.dtype !== 'F32') throw new Error(`${name}: dtype ${t.dtype}, the reference reads F32 only`);
    const [begin, end] = t.data_offsets;
    const f32 = new Float32Array(buf.buffer.slice(buf.byteOffset + base + begin, buf.byteOffset + base + end));
    tensors[name] = { shape: t.shape, data: Float64Array.from(f32) };
  }
  return tensors;
}

// y[r] = sum_c W[r][c] x[c] for a row-major [rows, cols] weight (nn.Linear's layout).
function matvec(w, x) {
  const [rows, cols] = w.shape;
  const y = new Float64Array(rows);
  for (let r = 0; r < rows; r++) {
    let s = 0;
    const o = r * cols;
    for (let c = 0; c < cols; c++) s += w.data[o + c] * x[c];
    y[r] = s;
  }
  return y;
}

function rmsnorm(x, w, eps) {
  let ss = 0;
  for (const v of x) ss += v * v;
  const k = 1 / Math.sqrt(ss / x.length + eps);
  return x.map((v, i) => v * k * w.data[i]);
}

export function loadReference(modelDir) {
  const cfg = JSON.parse(fs.readFileSync(path.join(modelDir, 'config.json'), 'utf8'));
  const W = loadSafetensors(path.join(modelDir, 'model.safetensors'));
  const tok = JSON.parse(fs.readFileSync(path.join(modelDir, 'tokenizer.json'), 'utf8'));
  const pieces = [];
  for (const [piece, id] of Object.entries(tok.model.vocab)) pieces[id] = piece;
  const d = cfg.hidden_size;
  const nh = cfg.num_attention_heads;
  const nkv = cfg.num_key_value_heads;
  const hd = cfg.head_dim ?? d / nh;
  const L = cfg.num_hidden_layers;
  const eps = cfg.rms_norm_eps;
  const theta = cfg.rope_theta;
  const embed = W['model.embed_tokens.weight'];
  const lmHead = W['lm_head.weight'] ?? embed;
  const layer = (i, n) => W[`model.layers.${i}.${n}.weight`];

  // HF rotate_half: pairs (j, j + hd/2) with frequency theta^(-2j/hd).
  function rope(v, pos) {
    const half = hd / 2;
    for (let j = 0; j < half; j++) {
      const a = pos * Math.pow(theta, (-2 * j) / hd);
      const c = Math.cos(a);
      const s = Math.sin(a);
      const x0 = v[j];
      const x1 = v[j + half];
      v[j] = x0 * c - x1 * s;
      v[j + half] = x1 * c + x0 * s;
    }
  }

  // Feeds token ids one at a time; returns the logits after the last.
  function session() {
    const keys = Array.from({ length: L }, () => []);
    const values = Array.from({ length: L }, () => []);
    let pos = 0;
    return function step(token) {
      let x = Float64Array.from(embed.data.subarray(token * d, (token + 1) * d));
      for (let l = 0; l < L; l++) {
        const h = rmsnorm(x, layer(l, 'input_layernorm'), eps);
        const q = matvec(layer(l, 'self_attn.q_proj'), h);
        const k = matvec(layer(l, 'self_attn.k_proj'), h);
        const v = matvec(layer(l, 'self_attn.v_proj'), h);
        const heads = [];
        for (let i = 0; i < nh; i++) {
          const qh = q.slice(i * hd, (i + 1) * hd);
          rope(qh, pos);
          heads.push(qh);
        }
        const ks = [];
        for (let i = 0; i < nkv; i++) {
          const kh = k.slice(i * hd, (i + 1) * hd);
          rope(kh, pos);
          ks.push(kh);
        }
        keys[l].push(ks);
        values[l].push(Array.from({ length: nkv }, (_, i) => v.slice(i * hd, (i + 1) * hd)));
        const att = new Float64Array(d);
        for (let i = 0; i < nh; i++) {
          const g = Math.floor(i / (nh / nkv));
          const scores = keys[l].map((kt) => {
            let s = 0;
            for (let j = 0; j < hd; j++) s += heads[i][j] * kt[g][j];
            return s / Math.sqrt(hd);
          });
          const m = Math.max(...scores);
          const e = scores.map((s) => Math.exp(s - m));
          const z = e.reduce((a, b) => a + b, 0);
          for (let t = 0; t < e.length; t++) {
            const vt = values[l][t][g];
            for (let j = 0; j < hd; j++) att[i * hd + j] += (e[t] / z) * vt[j];
          }
        }
        const o = matvec(layer(l, 'self_attn.o_proj'), att);
        x = x.map((xv, j) => xv + o[j]);
        const h2 = rmsnorm(x, layer(l, 'post_attention_layernorm'), eps);
        const gate = matvec(layer(l, 'mlp.gate_proj'), h2);
        const up = matvec(layer(l, 'mlp.up_proj'), h2);
        const act = gate.map((gv, j) => (gv / (1 + Math.exp(-gv))) * up[j]);
        const down = matvec(layer(l, 'mlp.down_proj'), act);
        x = x.map((xv, j) => xv + down[j]);
      }
      pos++;
      return matvec(lmHead, rmsnorm(x, W['model.norm.weight'], eps));
    };
  }

  const argmax = (a) => a.reduce((best, v, i) => (v > a[best] ? i : best), 0);

  return {
    // Greedy continuation of promptIds (BOS included if wanted): n tokens, stopping after
    // an id in stopIds. Returns {ids, firstLogits}.
    greedy(promptIds, n, stopIds = [cfg.bos_token_id, cfg.eos_token_id]) {
      const step = session();
      let logits;
      for (const t of promptIds) logits = step(t);
      const firstLogits = logits;
      const ids = [];
      while (ids.length < n) {
        const t = argmax(logits);
        ids.push(t);
        if (stopIds.includes(t)) break;
        logits = step(t);
      }
      return { ids, firstLogits };
    },
    // The logits after each of `ids` (the distribution of the token that follows it).
    logitsAfterEach(ids) {
      const step = session();
      return ids.map((t) => step(t));
    },
    // A token's bytes as the vocabulary spells it: '▁' -> ' ', <0xNN> -> that byte, the
    // special tokens (<unk>, <s>, </s>) as written; no space cut.
    tokenBytes(id) {
      const p = pieces[id];
      const m = /^<0x([0-9A-Fa-f]{2})>$/.exec(p);
      if (m) return Buffer.from([parseInt(m[1], 16)]);
      return Buffer.from(id > 2 ? p.replaceAll('\u2581', ' ') : p, 'utf8');
    },
    vocabSize: pieces.length,
    // tokenizer.json's decoder: '▁' -> ' ', <0xNN> pieces as bytes, one leading space cut.
    decode(ids) {
      const bytes = [];
      for (const id of ids) {
        const p = pieces[id];
        const m = /^<0x([0-9A-Fa-f]{2})>$/.exec(p);
        if (m) bytes.push(parseInt(m[1], 16));
        else if (id > 2) bytes.push(...Buffer.from(p.replaceAll('\u2581', ' '), 'utf8'));
      }
      const text = Buffer.from(bytes).toString('utf8');
      return text.startsWith(' ') ? text.slice(1) : text;
    },
  };
}
