// truncation_bench: quality of three ways to handle a context-window overflow (paper 001,
// section 3.4 and Table 1), measured as perplexity with a real trained model (by default
// stories260K, window = max_position_embeddings = 512) on real text.
//
// Modes (what happens to the cache when the next chunk would overflow the window):
//   TT   token truncation: drop the oldest tokens and recompute the KV of the kept tokens
//        from their tokens, at positions 0, 1, ... (what an engine without a KV store does).
//   CA   decoupled KV truncation (AttentionStore): keep the kept tokens' stored KV - K
//        before RoPE, computed when the token was first processed, i.e. while the dropped
//        tokens were still in context - and re-enter it at new positions 0, 1, ... with
//        Transformer::EnterKv (RoPE applied at the slots' recorded positions).
//   NKVT naive KV truncation: keep the kept tokens' KV with RoPE embedded at their OLD
//        positions (pre-RoPE K entered at the old positions), while new tokens continue at
//        position = number of tokens now in the cache, as an engine that stores post-RoPE
//        KV would do.
//   SW   reference without a large drop (--no-reference skips it): sliding-window
//        recompute - TT that drops only the overflow before every chunk, so every chunk
//        sees between window-chunk and window tokens of freshly computed context.
//
// Protocol. Each dataset becomes one long token stream (the model's own tokenizer;
// TinyStories: one story per line, each with BOS; other files: one document, one BOS),
// capped at --max-tokens. The stream is fed in chunks ("turns") of --chunk tokens. Before
// a chunk, if cache + chunk > window, the cache is truncated: keep the first --keep-first
// tokens, drop D = max(overflow, ceil(ratio x (cache - keep_first))) of the following
// ones (ratio 0.5 = the paper's "discard the earliest half"), keep the rest. The drop
// decision depends only on cache lengths, so TT, CA and NKVT truncate at the same chunks
// and keep the same stream tokens. Inside a chunk tokens are fed one at a time (the
// engine returns logits for the last token of a step), each at position = cache slots
// (new tokens always follow the cache), and the logits after token j score token j+1.
// Scored: every token whose prediction was computed after the first truncation - the
// same token set for every mode (checked). PPL = exp(mean NLL); the overall row pools
// every dataset's scored tokens. Alongside the ratio CA/TT, the paired mean per-token
// NLL difference and its (naive, i.i.d.) standard error are reported, and a second
// table splits each mode's difference to TT by the chunk (after the last truncation) in
// which the predicting token was fed. Self-check at every CA/NKVT truncation: the kept
// rows' layer-0 K and V (which depend on the token alone) must match a fresh computation
// from the kept tokens, so the kept KV rows are those of the kept tokens.
//
// Caveats for stories260K: its vocabulary has 512 tokens, so a uniform guess has PPL 512
// and NKVT cannot reach the paper's > 10^3; and more context is not always better for it
// (SW, with the longest context, can score worse than TT). --max-tokens caps each dataset
// (the TinyStories sample has ~15.5k tokens in all). Default run: ~25 s of CPU, 1 thread.
//
// Usage: truncation_bench [--model DIR] [--data-dir DIR] [--datasets a,b,...]
//          [--ratio 0.5] [--keep-first 0] [--chunk 64] [--max-tokens N] [--threads T]
//          [--no-reference] [--json FILE]
// Output: a table on stdout, then one JSON line (also written to --json). Progress on
// stderr.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "attic/engine/engine.h"
#include "bench/common/flags.h"
#include "bench/common/output.h"

using namespace attic;
using namespace attic::engine;

namespace {

enum class Mode { kTT, kCA, kNKVT, kSW };
const char* ModeName(Mode m) {
  switch (m) {
    case Mode::kTT: return "TT";
    case Mode::kCA: return "CA";
    case Mode::kNKVT: return "NKVT";
    case Mode::kSW: return "SW";
  }
  return "?";
}

struct Options {
  std::string model;
  std::string data_dir;
  std::vector<std::string> datasets = {"tinystories", "shakespeare", "wikitext2"};
  double ratio = 0.5;
  int keep_first = 0;
  int chunk = 64;
  int max_tokens = 16384;
  int threads = 1;
  bool reference = true;
  std::string json_path;
};

[[noreturn]] void Die(const std::string& msg) {
  std::fprintf(stderr, "truncation_bench: error: %s\n", msg.c_str());
  std::exit(1);
}

using attic::bench::SharedDir;
using attic::bench::SplitList;

Options ParseArgs(int argc, char** argv) {
  Options o;
  o.model = SharedDir() + "/models/stories260K-hf";
  o.data_dir = SharedDir() + "/datasets";
  bool no_reference = false;
  attic::bench::FlagParser flags(
      "truncation_bench",
      "[--model DIR] [--data-dir DIR] [--datasets a,b,...] [--ratio 0.5]\n"
      "         [--keep-first 0] [--chunk 64] [--max-tokens N] [--threads T] [--no-reference]\n"
      "         [--json FILE]\n"
      "datasets: tinystories (tinystories_valid_sample), shakespeare (tiny_shakespeare),\n"
      "          wikitext2 (wikitext2_raw_test)");
  flags.String("--model", &o.model);
  flags.String("--data-dir", &o.data_dir);
  flags.Custom("--datasets", [&](const std::string& v) {
    o.datasets = SplitList(v);
    return OkStatus();
  });
  flags.Double("--ratio", &o.ratio);
  flags.Int("--keep-first", &o.keep_first);
  flags.Int("--chunk", &o.chunk);
  flags.Int("--max-tokens", &o.max_tokens);
  flags.Int("--threads", &o.threads);
  flags.Switch("--no-reference", &no_reference);
  flags.String("--json", &o.json_path);
  flags.ParseOrExit(argc, argv);
  o.reference = !no_reference;
  if (!(o.ratio >= 0.0 && o.ratio <= 1.0)) flags.UsageError("--ratio must be in [0, 1]");
  if (o.keep_first < 0) flags.UsageError("--keep-first must be >= 0");
  if (o.chunk < 1) flags.UsageError("--chunk must be >= 1");
  if (o.max_tokens < 2) flags.UsageError("--max-tokens must be >= 2");
  if (o.threads < 0) flags.UsageError("--threads must be >= 0");
  if (o.datasets.empty()) flags.UsageError("--datasets is empty");
  attic::bench::CheckOutput("truncation_bench", o.json_path);
  return o;
}

std::string ReadFile(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) Die("cannot read " + path);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

struct Dataset {
  std::string name;  // short name
  std::string file;
  std::vector<int32_t> tokens;
};

// The token stream of a dataset, at most max_tokens long.
Dataset LoadDataset(const Engine& e, const Options& o, const std::string& requested) {
  Dataset d;
  bool per_line = false;
  if (requested == "tinystories" || requested == "tinystories_valid_sample") {
    d.name = "tinystories";
    d.file = o.data_dir + "/tinystories_valid_sample/TinyStories-valid-sample.txt";
    per_line = true;
  } else if (requested == "shakespeare" || requested == "tiny_shakespeare") {
    d.name = "shakespeare";
    d.file = o.data_dir + "/tiny_shakespeare/input.txt";
  } else if (requested == "wikitext2" || requested == "wikitext2_raw_test") {
    d.name = "wikitext2";
    d.file = o.data_dir + "/wikitext2_raw_test/wiki.test.raw";
  } else {
    Die("unknown dataset '" + requested + "' (tinystories, shakespeare, wikitext2)");
  }
  const std::string text = ReadFile(d.file);
  if (per_line) {
    // One story per line, each starting with BOS (as the model was trained).
    for (const std::string& line : SplitList(text, '\n')) {
      auto ids = e.Tokenize(line, true);
      if (!ids.ok()) Die(d.file + ": " + ids.status().ToString());
      d.tokens.insert(d.tokens.end(), ids->begin(), ids->end());
      if (static_cast<int>(d.tokens.size()) >= o.max_tokens) break;
    }
  } else {
    // One document: tokenize a prefix ending at a line break, large enough for max_tokens.
    size_t bytes = static_cast<size_t>(o.max_tokens) * 6 + 4096;
    while (true) {
      size_t cut = text.size();
      if (bytes < text.size()) {
        cut = text.rfind('\n', bytes);
        if (cut == std::string::npos || cut == 0) cut = bytes;
      }
      auto ids = e.Tokenize(text.substr(0, cut), true);
      if (!ids.ok()) Die(d.file + ": " + ids.status().ToString());
      d.tokens = std::move(*ids);
      if (static_cast<int>(d.tokens.size()) >= o.max_tokens || cut == text.size()) break;
      bytes *= 2;
    }
  }
  if (static_cast<int>(d.tokens.size()) > o.max_tokens) d.tokens.resize(o.max_tokens);
  return d;
}

struct RunResult {
  std::vector<double> nll;       // per scored token, in stream order
  std::vector<int> since;        // per scored token: chunks fed since the last truncation (0 = the first)
  int first_scored = -1;         // stream index of the first scored token
  int truncations = 0;
  int64_t recomputed = 0;        // tokens re-prefilled by truncations (TT, SW)
  int64_t reentered = 0;         // token rows re-entered from stored KV (CA, NKVT)
  double seconds = 0;
};

double NegLogProb(const float* logits, int vocab, int32_t target) {
  float mx = logits[0];
  for (int i = 1; i < vocab; ++i) mx = std::max(mx, logits[i]);
  double sum = 0;
  for (int i = 0; i < vocab; ++i) sum += std::exp(static_cast<double>(logits[i]) - mx);
  return std::log(sum) - (static_cast<double>(logits[target]) - mx);
}

void Check(const Status& st, const char* what) {
  if (!st.ok()) Die(std::string(what) + ": " + st.ToString());
}

// Self-check that the kept rows of the stored KV belong to the kept tokens: layer 0's K
// and V depend on the token alone (not on its position or context), so they must match
// a fresh computation from the tokens (up to GEMV-vs-GEMM rounding).
void VerifyKeptRows(Engine& e, const std::vector<int32_t>& kept_tokens, const std::vector<float>& k0,
                    const std::vector<float>& v0) {
  Transformer& tf = e.transformer();
  const int kvd = tf.config().kv_dim();
  std::vector<float> fresh_k, fresh_v;
  kv::KvObserver layer0 = [&](int layer, int, const float* k, const float* v, int nt) {
    if (layer != 0) return;
    fresh_k.insert(fresh_k.end(), k, k + static_cast<size_t>(nt) * kvd);
    fresh_v.insert(fresh_v.end(), v, v + static_cast<size_t>(nt) * kvd);
  };
  kv::SequenceKv scratch(&e.kv_pool());
  const int nk = static_cast<int>(kept_tokens.size());
  for (int p = 0; p < nk; p += tf.max_batch_tokens()) {
    std::vector<BatchEntry> b(1);
    b[0].seq = &scratch;
    b[0].tokens.assign(kept_tokens.begin() + p, kept_tokens.begin() + std::min(nk, p + tf.max_batch_tokens()));
    b[0].want_logits = false;
    kv::KvObserverHooks hooks(layer0);
    Check(tf.Forward(b, nullptr, &hooks), "verify");
  }
  float worst = 0, scale = 0;
  for (size_t i = 0; i < fresh_k.size(); ++i) {
    worst = std::max({worst, std::fabs(fresh_k[i] - k0[i]), std::fabs(fresh_v[i] - v0[i])});
    scale = std::max({scale, std::fabs(fresh_k[i]), std::fabs(fresh_v[i])});
  }
  if (fresh_k.size() != k0.size() || worst > 1e-4f * std::max(scale, 1.0f)) {
    Die("kept KV rows do not match their tokens (layer-0 max |diff| " + std::to_string(worst) + ")");
  }
}

// Streams `tokens` through the model in chunks, truncating with `mode` on overflow.
RunResult RunMode(Engine& e, const std::vector<int32_t>& tokens, Mode mode, const Options& o, const std::string& label) {
  using Clock = std::chrono::steady_clock;
  const auto t0 = Clock::now();
  Transformer& tf = e.transformer();
  const auto& cfg = e.model().config();
  const int window = e.context_length();
  const int n_layers = cfg.n_layers;
  const int kvd = cfg.kv_dim();
  const int vocab = cfg.vocab_size;
  const int n = static_cast<int>(tokens.size());
  const bool keep_host = mode == Mode::kCA || mode == Mode::kNKVT;
  const double ratio = mode == Mode::kSW ? 0.0 : o.ratio;

  RunResult r;
  auto seq = std::make_unique<kv::SequenceKv>(&e.kv_pool());
  // Host copy of every slot's pre-RoPE K and V per layer (what AttentionStore holds).
  std::vector<std::vector<float>> host_k(n_layers), host_v(n_layers);
  kv::KvObserver observer = nullptr;
  if (keep_host) {
    observer = [&](int layer, int, const float* k, const float* v, int nt) {
      host_k[layer].insert(host_k[layer].end(), k, k + static_cast<size_t>(nt) * kvd);
      host_v[layer].insert(host_v[layer].end(), v, v + static_cast<size_t>(nt) * kvd);
    };
  }
  bool truncated = false;
  int chunks_since = 0;
  std::vector<float> logits;
  int last_report = 0;
  for (int start = 0; start < n; start += o.chunk) {
    const int c = std::min(o.chunk, n - start);
    const int have = seq->n_slots();
    if (have + c > window) {
      // Which slots survive: the first keep_first, then all after the dropped run.
      const int rest = have - o.keep_first;
      int drop = std::max(have + c - window, static_cast<int>(std::ceil(ratio * rest)));
      drop = std::min(drop, rest);
      std::vector<int> kept;
      for (int s = 0; s < o.keep_first; ++s) kept.push_back(s);
      for (int s = o.keep_first + drop; s < have; ++s) kept.push_back(s);
      const int nk = static_cast<int>(kept.size());
      std::vector<int32_t> kept_tokens(nk), kept_old_pos(nk), new_pos(nk);
      for (int i = 0; i < nk; ++i) {
        kept_tokens[i] = seq->tokens()[kept[i]];
        kept_old_pos[i] = seq->positions()[kept[i]];
        new_pos[i] = i;
      }
      seq = std::make_unique<kv::SequenceKv>(&e.kv_pool());  // the old blocks are freed first
      if (mode == Mode::kTT || mode == Mode::kSW) {
        // Recompute the kept tokens' KV from their tokens at positions 0..nk-1.
        for (int p = 0; p < nk; p += tf.max_batch_tokens()) {
          const int m = std::min(nk - p, tf.max_batch_tokens());
          std::vector<BatchEntry> b(1);
          b[0].seq = seq.get();
          b[0].tokens.assign(kept_tokens.begin() + p, kept_tokens.begin() + p + m);
          b[0].positions.assign(new_pos.begin() + p, new_pos.begin() + p + m);
          b[0].want_logits = false;
          Check(tf.Forward(b, nullptr), "recompute");
        }
        r.recomputed += nk;
      } else {
        // Keep only the kept rows of the stored pre-RoPE KV and re-enter them.
        for (int l = 0; l < n_layers; ++l) {
          std::vector<float> k(static_cast<size_t>(nk) * kvd), v(static_cast<size_t>(nk) * kvd);
          for (int i = 0; i < nk; ++i) {
            std::copy_n(host_k[l].data() + static_cast<size_t>(kept[i]) * kvd, kvd, k.data() + static_cast<size_t>(i) * kvd);
            std::copy_n(host_v[l].data() + static_cast<size_t>(kept[i]) * kvd, kvd, v.data() + static_cast<size_t>(i) * kvd);
          }
          host_k[l] = std::move(k);
          host_v[l] = std::move(v);
        }
        VerifyKeptRows(e, kept_tokens, host_k[0], host_v[0]);
        const std::vector<int32_t>& pos = mode == Mode::kCA ? new_pos : kept_old_pos;
        Check(seq->Append(kept_tokens.data(), pos.data(), nk), "append kept slots");
        for (int l = 0; l < n_layers; ++l) tf.EnterKv(seq.get(), l, 0, nk, host_k[l].data(), host_v[l].data());
        r.reentered += nk;
      }
      ++r.truncations;
      truncated = true;
      chunks_since = 0;
    }
    for (int j = start; j < start + c; ++j) {
      std::vector<BatchEntry> b(1);
      b[0].seq = seq.get();
      b[0].tokens = {tokens[j]};
      b[0].positions = {seq->n_slots()};  // new tokens follow the cache (NKVT: its count)
      kv::KvObserverHooks hooks(observer);
      Check(tf.Forward(b, &logits, observer ? &hooks : nullptr), "forward");
      if (truncated && j + 1 < n) {
        if (r.first_scored < 0) r.first_scored = j + 1;
        r.nll.push_back(NegLogProb(logits.data(), vocab, tokens[j + 1]));
        r.since.push_back(chunks_since);
      }
    }
    ++chunks_since;
    if (start + c - last_report >= 2048 || start + c == n) {
      last_report = start + c;
      std::fprintf(stderr, "\r  %-12s %-4s %6d/%d tokens", label.c_str(), ModeName(mode), start + c, n);
      std::fflush(stderr);
    }
  }
  r.seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  std::fprintf(stderr, "  (%.1f s)\n", r.seconds);
  return r;
}

// Paired per-token NLL difference a - b: mean and naive standard error.
std::pair<double, double> PairedDiff(const std::vector<double>& a, const std::vector<double>& b) {
  const size_t n = a.size();
  if (n == 0 || b.size() != n) return {std::nan(""), std::nan("")};
  double s = 0, s2 = 0;
  for (size_t i = 0; i < n; ++i) {
    double d = a[i] - b[i];
    s += d;
    s2 += d * d;
  }
  double mean = s / n;
  double var = n > 1 ? (s2 - n * mean * mean) / (n - 1) : 0.0;
  return {mean, std::sqrt(std::max(var, 0.0) / n)};
}

double PplOf(const std::vector<double>& nll) {
  if (nll.empty()) return std::nan("");
  double s = 0;
  for (double x : nll) s += x;
  return std::exp(s / nll.size());
}

nlohmann::json Num(double x) { return std::isfinite(x) ? nlohmann::json(x) : nlohmann::json(nullptr); }

struct Row {
  std::string name;
  int streamed = 0;
  int first_scored = -1;
  int truncations = 0;
  std::vector<Mode> modes;
  std::vector<std::vector<double>> nll;  // per mode
  std::vector<int> since;                // per scored token (the same in every mode)
  std::vector<double> seconds;           // per mode
};

}  // namespace

int main(int argc, char** argv) {
  Options o = ParseArgs(argc, argv);
  EngineOptions eo;
  eo.model_path = o.model;
  eo.n_threads = o.threads;
  eo.max_batch_tokens = 512;
  auto loaded = Engine::Load(eo);
  if (!loaded.ok()) Die(o.model + ": " + loaded.status().ToString());
  Engine& e = **loaded;
  const int window = e.context_length();
  if (o.keep_first + o.chunk > window) Die("--keep-first + --chunk must not exceed the context window");
  std::string model_name = o.model;
  while (!model_name.empty() && model_name.back() == '/') model_name.pop_back();
  model_name = model_name.substr(model_name.find_last_of('/') + 1);

  std::vector<Mode> modes = {Mode::kTT, Mode::kCA, Mode::kNKVT};
  if (o.reference) modes.push_back(Mode::kSW);

  const auto t_start = std::chrono::steady_clock::now();
  std::fprintf(stderr, "truncation_bench: %s, window %d, chunk %d, ratio %.2f, keep-first %d, %d threads\n",
               model_name.c_str(), window, o.chunk, o.ratio, o.keep_first, o.threads);
  std::vector<Row> rows;
  for (const std::string& ds : o.datasets) {
    Dataset d = LoadDataset(e, o, ds);
    Row row;
    row.name = d.name;
    row.streamed = static_cast<int>(d.tokens.size());
    row.modes = modes;
    std::fprintf(stderr, "%s: %d tokens\n", d.name.c_str(), row.streamed);
    for (Mode m : modes) {
      RunResult r = RunMode(e, d.tokens, m, o, d.name);
      if (m == Mode::kTT) {
        row.first_scored = r.first_scored;
        row.truncations = r.truncations;
        row.since = r.since;
      } else if (r.first_scored != row.first_scored || r.nll.size() != row.nll[0].size() ||
                 (m != Mode::kSW && (r.truncations != row.truncations || r.since != row.since))) {
        Die(std::string("mode ") + ModeName(m) + " scored a different token set than TT");
      }
      row.nll.push_back(std::move(r.nll));
      row.seconds.push_back(r.seconds);
    }
    rows.push_back(std::move(row));
  }
  // Overall: every dataset's scored tokens pooled.
  Row all;
  all.name = "overall";
  all.modes = modes;
  all.nll.resize(modes.size());
  all.seconds.assign(modes.size(), 0.0);
  for (const Row& r : rows) {
    all.streamed += r.streamed;
    all.truncations += r.truncations;
    for (size_t m = 0; m < modes.size(); ++m) {
      all.nll[m].insert(all.nll[m].end(), r.nll[m].begin(), r.nll[m].end());
      all.seconds[m] += r.seconds[m];
    }
    all.since.insert(all.since.end(), r.since.begin(), r.since.end());
  }
  const double total_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t_start).count();

  // Table.
  std::printf("truncation_bench: %s (window %d), chunk %d, ratio %.2f, keep-first %d\n", model_name.c_str(), window,
              o.chunk, o.ratio, o.keep_first);
  std::printf(
      "protocol: stream each dataset in %d-token chunks; before a chunk that would overflow the %d-token window,\n"
      "keep the first %d tokens and drop max(overflow, ceil(%.2f x rest)) of the oldest others; score NLL of every\n"
      "token predicted after the first truncation (same tokens in every mode). TT = recompute kept tokens at\n"
      "positions 0..; CA = stored pre-RoPE KV re-entered at positions 0..; NKVT = KV kept at its old positions,\n"
      "new tokens at position = cache size; SW = reference, recompute the last window-chunk tokens before each chunk.\n\n",
      o.chunk, window, o.keep_first, o.ratio);
  std::printf("| dataset | streamed | scored | truncations | PPL TT | PPL CA | PPL NKVT |%s CA/TT | NKVT/TT | CA-TT mean NLL (SE) |\n",
              o.reference ? " PPL SW |" : "");
  std::printf("|---|---|---|---|---|---|---|%s---|---|---|\n", o.reference ? "---|" : "");
  nlohmann::json jrows = nlohmann::json::array();
  auto emit = [&](const Row& r) {
    const size_t scored = r.nll[0].size();
    double ppl[4];
    for (size_t m = 0; m < modes.size(); ++m) ppl[m] = PplOf(r.nll[m]);
    auto [dmean, dse] = PairedDiff(r.nll[1], r.nll[0]);
    std::string sw;
    if (o.reference) {
      char buf[32];
      std::snprintf(buf, sizeof buf, " %.3f |", ppl[3]);
      sw = buf;
    }
    std::printf("| %s | %d | %zu | %d | %.3f | %.3f | %.1f |%s %.4f | %.1f | %+.4f (%.4f) |\n", r.name.c_str(),
                r.streamed, scored, r.truncations, ppl[0], ppl[1], ppl[2], sw.c_str(), ppl[1] / ppl[0],
                ppl[2] / ppl[0], dmean, dse);
    nlohmann::json j;
    j["dataset"] = r.name;
    j["tokens_streamed"] = r.streamed;
    j["tokens_scored"] = scored;
    j["truncations"] = r.truncations;
    if (r.first_scored >= 0) j["first_scored_index"] = r.first_scored;
    nlohmann::json jp, js;
    for (size_t m = 0; m < modes.size(); ++m) {
      jp[ModeName(modes[m])] = Num(ppl[m]);
      js[ModeName(modes[m])] = r.seconds[m];
    }
    j["ppl"] = jp;
    j["seconds"] = js;
    j["ca_tt_ratio"] = Num(ppl[1] / ppl[0]);
    j["nkvt_tt_ratio"] = Num(ppl[2] / ppl[0]);
    j["ca_minus_tt_mean_nll"] = Num(dmean);
    j["ca_minus_tt_mean_nll_se"] = Num(dse);
    jrows.push_back(j);
  };
  for (const Row& r : rows) emit(r);
  emit(all);

  // Where the differences come from: mean per-token NLL difference to TT by the chunk
  // (after the truncation) in which the predicting token was fed.
  int n_bins = 0;
  for (int b : all.since) n_bins = std::max(n_bins, b + 1);
  n_bins = std::min(n_bins, 8);
  if (n_bins > 0) {
    std::printf("\nmean NLL difference to TT (nats/token) by chunk since the last truncation (1 = the chunk right\n"
                "after it%s):\n\n| dataset | mode |", n_bins == 8 ? "; 8 = 8th and later" : "");
    for (int b = 0; b < n_bins; ++b) std::printf(" %d |", b + 1);
    std::printf("\n|---|---|");
    for (int b = 0; b < n_bins; ++b) std::printf("---|");
    std::printf("\n");
    auto by_chunk = [&](const Row& r, size_t m) {
      std::vector<double> sum(n_bins, 0.0);
      std::vector<int64_t> cnt(n_bins, 0);
      for (size_t i = 0; i < r.since.size(); ++i) {
        int b = std::min(r.since[i], n_bins - 1);
        sum[b] += r.nll[m][i] - r.nll[0][i];
        ++cnt[b];
      }
      nlohmann::json j = nlohmann::json::array();
      std::printf("| %s | %s-TT |", r.name.c_str(), ModeName(modes[m]));
      for (int b = 0; b < n_bins; ++b) {
        double mean = cnt[b] ? sum[b] / cnt[b] : std::nan("");
        std::printf(" %+.4f |", mean);
        j.push_back(Num(mean));
      }
      std::printf("\n");
      return j;
    };
    size_t ri = 0;
    for (const Row* r : [&] {
           std::vector<const Row*> v;
           for (const Row& x : rows) v.push_back(&x);
           v.push_back(&all);
           return v;
         }()) {
      nlohmann::json diag;
      for (size_t m = 1; m < modes.size(); ++m) diag[std::string(ModeName(modes[m])) + "-TT"] = by_chunk(*r, m);
      jrows[ri++]["nll_diff_by_chunk_since_truncation"] = diag;
    }
  }
  std::printf("\n%.1f s in all\n", total_s);

  nlohmann::json out;
  out["bench"] = "truncation";
  out["model"] = model_name;
  out["window"] = window;
  out["chunk"] = o.chunk;
  out["ratio"] = o.ratio;
  out["keep_first"] = o.keep_first;
  out["max_tokens"] = o.max_tokens;
  out["threads"] = o.threads;
  out["protocol"] =
      "stream tokens in chunks; truncate before a chunk that would overflow the window (keep first keep_first, drop "
      "max(overflow, ceil(ratio*rest)) oldest); score every token predicted after the first truncation; TT recompute "
      "kept at 0..; CA pre-RoPE KV re-entered at 0..; NKVT KV at old positions, new tokens at cache size; SW sliding "
      "recompute reference";
  out["results"] = jrows;
  out["seconds"] = total_s;
  const std::string line = out.dump();
  attic::bench::WriteOutput("truncation_bench", o.json_path, line + "\n");
  std::printf("%s\n", line.c_str());
  return 0;
}
