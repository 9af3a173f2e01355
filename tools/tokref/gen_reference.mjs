// Generates the independent references that Attic's tokenizer tests compare against:
//   tests/data/tokenizer/reference_ids.json  - token ids from @huggingface/tokenizers for
//       varied strings, plus the token count and an FNV-1a-64 hash of the ids of every
//       UTF-8 text file under ../shared/datasets, for stories260K and SmolLM2;
//   tests/data/tokenizer/chat_reference.json - chat prompts rendered by @huggingface/jinja
//       from the real templates (SmolLM2's chat_template.jinja and the official Llama-3,
//       Llama-2 and Qwen2 templates in tests/data/tokenizer/*.jinja).
// Usage (from the repo root): cd tools/tokref && npm install && node gen_reference.mjs
// Environment: ATTIC_SHARED_DIR overrides ../shared (relative to the repo root).
import fs from "node:fs";
import path from "node:path";
import { fileURLToPath } from "node:url";
import { Tokenizer } from "@huggingface/tokenizers";
import { Template } from "@huggingface/jinja";

const here = path.dirname(fileURLToPath(import.meta.url));
const repo = path.resolve(here, "../..");
const shared = process.env.ATTIC_SHARED_DIR || path.resolve(repo, "../shared");
const outDir = path.join(repo, "tests/data/tokenizer");

function pkgVersion(name) {
  return JSON.parse(fs.readFileSync(path.join(here, "node_modules", name, "package.json"), "utf8")).version;
}

function readJson(p) {
  return JSON.parse(fs.readFileSync(p, "utf8"));
}

// Strings exercising the pre-tokenizers, normalizers, byte fallback and added tokens.
const TEXTS = [
  "",
  "Zoo",
  "Hello world, 12345",
  "Hello, world!",
  " leading single space",
  "   three leading spaces",
  "trailing spaces   ",
  "multiple   spaces    between     words",
  "tabs\tand\nnewlines\r\n\n\nend",
  "\n",
  "   ",
  "a\n\nb\t\tc   d",
  "Numbers: 12345 and 3.14159 and 1,000,000",
  "3.14159",
  "The year 2024 had 366 days.",
  "MiXeD CaSe WoRdS and ALLCAPS",
  "Café naïve résumé façade Ñandú",
  "Ünïcödé ÀÉÎÕÜ ß ẞ",
  "日本語のテキスト、中文文本。한국어",
  "Ελληνικά και русский текст",
  "Emoji: 😀🎉👍🏽 family 👨‍👩‍👧",
  "🦙",
  "code: def foo(x):\n    return x**2  # square\n",
  "x = [1, 2, 3]; y = {'a': 1}",
  "It's, they're, we've, I'm, you'll, he'd. IT'S",
  "URL https://example.com/path?q=1&x=2",
  "<|im_start|>user\nhi<|im_end|>",
  "<|im_start|>system\nYou are helpful.<|im_end|>\n<|im_start|>assistant\n",
  "text <|endoftext|> more",
  "<s>Hello</s> world",
  "Once upon a time, there was a little dog",
  "Lily and Tom went to the park. They",
  "\u00a0non-breaking and\u3000ideographic space",
  "4 ½ months, x² and ٣ and Ⅻ",
];

// Variants apply `overrides` (top-level keys of tokenizer.json; "model.<key>" for keys
// of the model) to a real tokenizer.json, to cover the Llama-3 and Qwen2 pre-tokenizer
// forms (Split regex + ByteLevel without regex, ignore_merges, BOS from
// TemplateProcessing, NFC) with a real 49k byte-level vocabulary. The C++ test applies
// the same overrides, read from the output file.
const LLAMA3_PATTERN =
  "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
const QWEN2_PATTERN =
  "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
const splitThenByteLevel = (pattern) => ({
  type: "Sequence",
  pretokenizers: [
    { type: "Split", pattern: { Regex: pattern }, behavior: "Isolated", invert: false },
    { type: "ByteLevel", add_prefix_space: false, trim_offsets: true, use_regex: false },
  ],
});

const TOKENIZERS = [
  { name: "stories260K", dir: "models/stories260K-hf" },
  { name: "smollm2", dir: "models/smollm2-135m-instruct-tokenizer" },
  {
    name: "smollm2_llama3_style",
    dir: "models/smollm2-135m-instruct-tokenizer",
    overrides: {
      pre_tokenizer: splitThenByteLevel(LLAMA3_PATTERN),
      "model.ignore_merges": true,
      post_processor: {
        type: "TemplateProcessing",
        single: [{ SpecialToken: { id: "<|endoftext|>", type_id: 0 } }, { Sequence: { id: "A", type_id: 0 } }],
        pair: [{ SpecialToken: { id: "<|endoftext|>", type_id: 0 } }, { Sequence: { id: "A", type_id: 0 } },
               { SpecialToken: { id: "<|endoftext|>", type_id: 1 } }, { Sequence: { id: "B", type_id: 1 } }],
        special_tokens: { "<|endoftext|>": { id: "<|endoftext|>", ids: [0], tokens: ["<|endoftext|>"] } },
      },
    },
    // Whole-file hashes only for these (the JS side is slow).
    datasets: (p) => !p.includes("longbench") && !p.includes("sharegpt_sample_venkat") && !p.includes("tiny_shakespeare"),
  },
  {
    name: "smollm2_qwen2_style",
    dir: "models/smollm2-135m-instruct-tokenizer",
    overrides: {
      normalizer: { type: "NFC" },
      pre_tokenizer: splitThenByteLevel(QWEN2_PATTERN),
      post_processor: { type: "ByteLevel", add_prefix_space: false, trim_offsets: false, use_regex: false },
    },
    datasets: (p) => !p.includes("longbench") && !p.includes("sharegpt_sample_venkat") && !p.includes("tiny_shakespeare"),
  },
];

function applyOverrides(tj, overrides) {
  for (const [k, v] of Object.entries(overrides ?? {})) {
    if (k.startsWith("model.")) tj.model[k.slice(6)] = v;
    else tj[k] = v;
  }
  return tj;
}

// FNV-1a 64 over the ids as little-endian int32 (hex, 16 digits).
function fnv1a64(ids) {
  let h = 0xcbf29ce484222325n;
  const prime = 0x100000001b3n;
  const mask = 0xffffffffffffffffn;
  for (const id of ids) {
    let v = id >>> 0;
    for (let i = 0; i < 4; ++i) {
      h ^= BigInt(v & 0xff);
      h = (h * prime) & mask;
      v >>>= 8;
    }
  }
  return h.toString(16).padStart(16, "0");
}

function listFiles(dir) {
  const out = [];
  for (const e of fs.readdirSync(dir, { withFileTypes: true })) {
    const p = path.join(dir, e.name);
    if (e.isDirectory()) out.push(...listFiles(p));
    else if (e.isFile()) out.push(p);
  }
  return out.sort();
}

// Known divergence of tokenizers.js from HF tokenizers (Rust), the implementation
// every model is trained and served with: its Digits pre-tokenizer uses JS `\d`,
// which is ASCII-only, while Rust uses char::is_numeric (Unicode Nd/Nl/No, i.e.
// \p{N}; llama.cpp's "smollm" pre-tokenizer also uses \p{N}). So "4 ½" splits as
// " ", "½" in Rust and as " ½" in tokenizers.js. Restore the Rust semantics.
function patchDigits(preTokenizer) {
  if (!preTokenizer) return;
  if (preTokenizer.constructor.name.startsWith("Digits") && preTokenizer.config) {
    const plus = preTokenizer.config.individual_digits ? "" : "+";
    preTokenizer.pattern = new RegExp(`[^\\p{N}]+|\\p{N}${plus}`, "gu");
  }
  for (const inner of preTokenizer.tokenizers ?? []) patchDigits(inner);
}

function loadTokenizer(dir, overrides) {
  const tj = applyOverrides(readJson(path.join(shared, dir, "tokenizer.json")), overrides);
  const cfgPath = path.join(shared, dir, "tokenizer_config.json");
  const cfg = fs.existsSync(cfgPath) ? readJson(cfgPath) : {};
  const tok = new Tokenizer(tj, cfg);
  patchDigits(tok.pre_tokenizer);
  return tok;
}

function genIds() {
  const datasetRoot = path.join(shared, "datasets");
  const files = listFiles(datasetRoot);
  const decoder = new TextDecoder("utf-8", { fatal: true });
  const texts = [];
  const skipped = [];
  for (const f of files) {
    const bytes = fs.readFileSync(f);
    try {
      texts.push({ path: path.relative(shared, f), text: decoder.decode(bytes) });
    } catch {
      skipped.push(path.relative(shared, f));
    }
  }
  const result = {
    generator: {
      library: "@huggingface/tokenizers",
      version: pkgVersion("@huggingface/tokenizers"),
      node: process.version,
      script: "tools/tokref/gen_reference.mjs",
    },
    note: "tokenizers.js's Digits pre-tokenizer is patched to Unicode \\p{N} (HF tokenizers' char::is_numeric); ids = encode(text) with add_special_tokens (BOS where the tokenizer adds one) and special tokens parsed; datasets: ids of each whole file, hashed with FNV-1a-64 over little-endian int32",
    tokenizers: {},
  };
  for (const t of TOKENIZERS) {
    const tok = loadTokenizer(t.dir, t.overrides);
    const cases = TEXTS.map((text) => ({ text, ids: tok.encode(text).ids }));
    const datasets = [];
    for (const { path: p, text } of texts) {
      if (t.datasets && !t.datasets(p)) continue;
      const t0 = Date.now();
      const ids = tok.encode(text).ids;
      datasets.push({ path: p, n_tokens: ids.length, fnv1a64: fnv1a64(ids) });
      console.error(`${t.name} ${p}: ${ids.length} tokens in ${Date.now() - t0} ms`);
    }
    result.tokenizers[t.name] = { dir: t.dir, overrides: t.overrides ?? {}, cases, datasets, datasets_not_utf8: skipped };
  }
  fs.writeFileSync(path.join(outDir, "reference_ids.json"), JSON.stringify(result, null, 1) + "\n");
}

const CONVERSATIONS = [
  [{ role: "user", content: "Hello!" }],
  [
    { role: "system", content: "You are a pirate." },
    { role: "user", content: "Hi" },
    { role: "assistant", content: "Arr, hello!" },
    { role: "user", content: "Where is the treasure?" },
  ],
  [
    { role: "user", content: "  padded content  \n" },
    { role: "assistant", content: " reply with spaces " },
    { role: "user", content: "next\tquestion" },
  ],
  [
    { role: "system", content: "Be brief." },
    { role: "user", content: "What is 2+2?" },
  ],
  [{ role: "user", content: "Café 😀 日本語\nline two" }],
  [
    { role: "user", content: "first" },
    { role: "assistant", content: "second" },
  ],
];

const TEMPLATES = [
  { name: "smollm2", kind: "chatml", file: "shared:models/smollm2-135m-instruct-tokenizer/chat_template.jinja", bos: "<|im_start|>", eos: "<|im_end|>" },
  { name: "qwen2", kind: "chatml", file: "source:tests/data/tokenizer/qwen2.jinja", bos: "", eos: "<|im_end|>" },
  { name: "llama3", kind: "llama3", file: "source:tests/data/tokenizer/llama3.jinja", bos: "<|begin_of_text|>", eos: "<|eot_id|>" },
  { name: "llama2", kind: "llama2", file: "source:tests/data/tokenizer/llama2.jinja", bos: "<s>", eos: "</s>" },
];

function resolveTemplate(file) {
  const [root, rel] = file.split(":");
  return path.join(root === "shared" ? shared : repo, rel);
}

function genChat() {
  const cases = [];
  for (const t of TEMPLATES) {
    const tpl = new Template(fs.readFileSync(resolveTemplate(t.file), "utf8"));
    for (const messages of CONVERSATIONS) {
      for (const add_generation_prompt of [true, false]) {
        const expected = tpl.render({
          messages,
          add_generation_prompt,
          bos_token: t.bos,
          eos_token: t.eos,
        });
        cases.push({ template: t.name, kind: t.kind, template_file: t.file, bos_token: t.bos, eos_token: t.eos,
                     add_generation_prompt, messages, expected });
      }
    }
  }
  const result = {
    generator: { library: "@huggingface/jinja", version: pkgVersion("@huggingface/jinja"), node: process.version,
                 script: "tools/tokref/gen_reference.mjs" },
    cases,
  };
  fs.writeFileSync(path.join(outDir, "chat_reference.json"), JSON.stringify(result, null, 1) + "\n");
}

genChat();
genIds();
