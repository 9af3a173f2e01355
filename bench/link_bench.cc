// link_bench: linking cached chunks (paper 002, Epic, section 6: RQ3 and RQ2) on this
// machine, in-process through the real Scheduler + KvStore + forward pass (no HTTP).
//
//   rq3  TTFT against context length: one request at a time whose prompt is BOS, N chunks
//        of --chunk tokens (each pre-generated on its own after a BOS: KVGen, before any
//        timing) and --new fresh tokens, for N in --lengths, linked by each method
//        (FR = "full", CacheBlend-15, AttnLink-16, Naive by default). TTFT = submit ->
//        first sampled token (the scheduler's own stamp). Median of --repeats, methods
//        interleaved within a repeat (this VM's speed drifts), one warm-up request per
//        method first; --skip-after S stops a method after the first length where a
//        request took longer than S seconds (FR at 16k takes minutes here). Per method:
//        the growth exponent (least-squares slope of log TTFT on log prompt length, over
//        the lengths of >= 2 chunks). Per request: the chunk
//        KV bytes entered into the compute buffer (SchedulerStats::kv, store::KvLoadStats::entered_bytes)
//        against the linked chunks' stored bytes, the most rows turns held of their own
//        (StoreStats turn_bytes: the pre-RoPE copy a turn keeps to be saved), and the
//        process's peak RSS so far (VmHWM).
//   rq2  Poisson load: each request links --chunks-per-request chunks drawn from a pool
//        of --pool pre-generated chunks (random order) plus --new fresh tokens, and
//        answers --output tokens. Arrivals are Poisson at each rate of --rates for
//        max(--duration, --min-requests / rate) seconds (open loop: a request's TTFT
//        counts from its scheduled arrival); a step-loop thread runs WaitForWork + Step as the server does. Per
//        (rate, method): TTFT p50/p90 (requests rejected by the full queue or without a
//        first token by the end of --drain count as infinitely late), throughput, and
//        the highest rate whose p90 TTFT stays within --slo (default: twice the slowest
//        linking method's unloaded TTFT, measured first; see RunRq2). Rates ascend,
//        methods interleaved at each; a method stops at the first rate it fails, and
//        one whose unloaded TTFT is above the threshold is not swept at all.
//
// Prefix reuse is off (min_reuse_tokens beyond any prompt): the first chunk's entry is
// BOS + chunk, a stored prefix of every prompt that starts with it, which would be
// entered as an exact prefix instead of linked (and FR would reuse it); the paper sends
// its requests without prefix caching. Finished sequences are not kept resident and turns
// are not saved (the store is read-only once the chunks are generated), so every request
// links afresh.
//
// Usage: link_bench rq3 --model PATH [--lengths 1,2,4,7] [--repeats 3] [--chunk 1024]
//          [--new 50] [--methods full,cacheblend-0.15@1,attnlink-16,naive] [--skip-after S]
//          [--plot FILE.svg]
//        link_bench rq2 --model PATH [--rates 0.075,0.1,0.15,0.2,0.3,0.45,0.7,1,1.5,2.2]
//          [--duration 30] [--min-requests 6] [--drain 15] [--slo S] [--pool 16] [--chunk 512] [--chunks-per-request 4] [--new 50]
//          [--output 16] [--methods attnlink-16,cacheblend-0.15@1,full]
//        common: [--threads 2] [--seed 1] [--preload layerwise|sync|inline] [--json FILE]
// Output: tables on stdout, then one JSON line (also to --json).
#include <sys/resource.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <limits>
#include <map>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "attic/core/huge_pages.h"
#include "attic/engine/kv_features.h"
#include "attic/engine/scheduler.h"
#include "attic/pic/link.h"
#include "attic/store/kv_store.h"
#include "attic/store/store_planner.h"
#include "bench/common/flags.h"
#include "bench/common/format.h"
#include "bench/common/measure.h"
#include "bench/common/output.h"
#include "bench/common/plot.h"
#include "bench/common/stats.h"

using namespace attic;
using namespace attic::engine;
using namespace std::chrono_literals;
using bench::Fmt;

namespace {

constexpr char kProgram[] = "link_bench";
constexpr char kTenant[] = "bench";
constexpr double kInf = std::numeric_limits<double>::infinity();

[[noreturn]] void Die(const std::string& message) {
  std::fprintf(stderr, "%s: error: %s\n", kProgram, message.c_str());
  std::exit(1);
}

// "FR", "CacheBlend-15", "AttnLink-16", "Naive": the paper's names.
std::string Label(const pic::LinkOptions& o) {
  switch (o.method) {
    case pic::LinkMethod::kFull: return "FR";
    case pic::LinkMethod::kNaive: return "Naive";
    case pic::LinkMethod::kAttnLink: return Fmt("AttnLink-%d", o.k);
    case pic::LinkMethod::kCacheBlend:
      return Fmt("CacheBlend-%g", o.ratio * 100) + (o.check_layer == 1 ? "" : Fmt("@%d", o.check_layer));
  }
  return "?";
}

struct Common {
  std::string model;
  int threads = 2;
  uint64_t seed = 1;
  std::string preload = "layerwise";
  std::string json;
  std::vector<pic::LinkOptions> methods;
};

void AddCommonFlags(bench::FlagParser& flags, Common* c) {
  flags.String("--model", &c->model);
  flags.Int("--threads", &c->threads);
  flags.Custom("--seed", [c](const std::string& v) -> Status {
    ATTIC_ASSIGN_OR_RETURN(int s, bench::ParseInt(v));
    c->seed = static_cast<uint64_t>(s);
    return OkStatus();
  });
  flags.String("--preload", &c->preload);
  flags.String("--json", &c->json);
  flags.Custom("--methods", [c](const std::string& v) -> Status {
    c->methods.clear();
    for (const std::string& m : bench::SplitList(v)) {
      ATTIC_ASSIGN_OR_RETURN(pic::LinkOptions o, pic::ParseLinkOptions(m));
      c->methods.push_back(o);
    }
    if (c->methods.empty()) return InvalidArgumentError("--methods is empty");
    return OkStatus();
  });
}

// Positive integers; empty when any item is not one (the callers' usage error says so).
std::vector<int> ParseIntList(const std::string& v) {
  auto list = bench::ParseIntList(v);
  return list.ok() ? *list : std::vector<int>{};
}

// The engine, its store, and the pre-generated chunks (KVGen) every experiment links.
class Rig {
 public:
  // `context`: the longest prompt + answer; `kv_sequences`: how many such sequences the
  // compute buffer holds at once; `n_chunks` chunks of `chunk` tokens are generated.
  Rig(const Common& c, int context, int kv_sequences, int n_chunks, int chunk) : c_(c), chunk_(chunk) {
    EngineOptions eo;
    eo.model_path = c.model;
    eo.n_threads = c.threads;
    eo.context_length = context;
    auto e = Engine::Load(eo);
    if (!e.ok()) Die(e.status().ToString());
    engine_ = std::move(*e);
    const auto& cfg = engine_->model().config();
    row_bytes_ = static_cast<uint64_t>(cfg.n_layers) * cfg.kv_dim() * 2 * sizeof(float);  // K + V, f32
    engine_->ResizeKvCache(static_cast<int64_t>(kv_sequences) * (context + 256) * static_cast<int64_t>(row_bytes_));
    rss_after_load_ = bench::PeakRssMiB();

    store::StoreOptions so;
    so.fingerprint = engine_->model().fingerprint();
    so.dram_bytes = static_cast<uint64_t>(n_chunks) * (chunk + 1) * row_bytes_ * 5 / 4 + (64ull << 20);
    so.write_buffer_bytes = 0;  // a chunk is stored when its KVGen request ends
    auto s = store::KvStore::Open(so);
    if (!s.ok()) Die(s.status().ToString());
    store_ = std::move(*s);

    bos_ = engine_->tokenizer().bos_id();
    if (bos_ < 0) bos_ = 1;
    for (int i = 0; i < n_chunks; ++i)
      chunks_.push_back(bench::RandomTokens(chunk, c.seed * 1000003 + i, 100, cfg.vocab_size));
    Generate();
    rss_after_gen_ = bench::PeakRssMiB();
  }

  Engine& engine() { return *engine_; }
  store::KvStore& store() { return *store_; }
  int32_t bos() const { return bos_; }
  int chunk() const { return chunk_; }
  const std::vector<int32_t>& chunk_tokens(int i) const { return chunks_[i]; }
  const std::string& key(int i) const { return keys_[i]; }
  int vocab() const { return engine_->model().config().vocab_size; }
  uint64_t row_bytes() const { return row_bytes_; }
  double gen_seconds() const { return gen_seconds_; }
  double rss_after_load() const { return rss_after_load_; }
  double rss_after_gen() const { return rss_after_gen_; }

  // Options of the schedulers that link: no prefix reuse, nothing resident, no saving
  // (see the file comment).
  SchedulerOptions LinkingOptions() const {
    SchedulerOptions so;
    so.max_resident = 0;
    so.min_reuse_tokens = 1 << 30;
    KvFeatureOptions fo;
    fo.store_save = false;
    fo.kv_preload = c_.preload == "sync" ? store::Preload::kSync
                    : c_.preload == "inline" ? store::Preload::kInline
                                             : store::Preload::kLayerwise;
    so.kv_connector = KvFeatures(fo);
    return so;
  }

  // BOS, the chunks `order` names, then `fresh`; `spec` gets the linked chunks.
  std::vector<int32_t> Prompt(const std::vector<int>& order, const std::vector<int32_t>& fresh, pic::LinkSpec* spec) const {
    std::vector<int32_t> p = {bos_};
    for (int i : order) {
      spec->chunks.push_back({static_cast<int>(p.size()), chunk_, keys_[i], 1});
      p.insert(p.end(), chunks_[i].begin(), chunks_[i].end());
    }
    p.insert(p.end(), fresh.begin(), fresh.end());
    return p;
  }

 private:
  // KVGen: every chunk prefilled on its own after a BOS and stored as a session.
  void Generate() {
    const double t0 = bench::NowSeconds();
    SchedulerOptions so;
    so.max_resident = 0;
    Scheduler gen(*engine_, so);
    gen.set_store(store_.get());
    std::atomic<int> done{0};
    gen.set_observer([&](const RequestRecord& r) {
      if (r.code != StatusCode::kOk) Die("KVGen request failed");
      ++done;
    });
    int submitted = 0;
    for (size_t i = 0; i < chunks_.size(); ++i) {
      GenerationRequest r;
      r.tenant = kTenant;
      r.session_id = "chunk" + std::to_string(i);
      r.prompt = {bos_};
      r.prompt.insert(r.prompt.end(), chunks_[i].begin(), chunks_[i].end());
      r.prefill_only = true;
      r.sampling.max_tokens = 1;
      auto ch = gen.Submit(std::move(r));
      if (!ch.ok()) Die("KVGen submit: " + ch.status().ToString());
      ++submitted;
      while (gen.Stats().waiting >= gen.options().max_waiting - 1) gen.Step();
    }
    while (done.load() < submitted) gen.Step();
    gen.Shutdown();
    for (size_t i = 0; i < chunks_.size(); ++i) {
      auto info = store_->GetSession(kTenant, "chunk" + std::to_string(i));
      if (!info.ok()) Die("chunk " + std::to_string(i) + " was not stored: " + info.status().ToString());
      keys_.push_back(info->key);
    }
    gen_seconds_ = bench::NowSeconds() - t0;
    std::fprintf(stderr, "%s: %zu chunks of %d tokens generated (KVGen) in %.1f s\n", kProgram, chunks_.size(), chunk_,
                 gen_seconds_);
  }

  const Common& c_;
  int chunk_;
  std::unique_ptr<Engine> engine_;
  std::unique_ptr<store::KvStore> store_;
  int32_t bos_ = 1;
  uint64_t row_bytes_ = 0;
  std::vector<std::vector<int32_t>> chunks_;
  std::vector<std::string> keys_;
  double gen_seconds_ = 0, rss_after_load_ = 0, rss_after_gen_ = 0;
};

// ---------------------------------------------------------------------------------------
// rq3

struct Rq3Sample {
  double ttft_s = 0;
  int recomputed = 0, cached = 0;
  uint64_t entered_bytes = 0;   // chunk KV entered into the compute buffer
  uint64_t turn_bytes_peak = 0; // rows turns held of their own, most seen after a step
  double enter_s = 0, wait_s = 0;
  std::vector<double> step_ms;  // the request's forward steps
};

// One request on an idle scheduler, stepped on this thread until it ends.
Rq3Sample RunOne(Rig& rig, Scheduler& s, GenerationRequest req) {
  Rq3Sample out;
  std::vector<RequestRecord> records;
  s.set_observer([&](const RequestRecord& r) { records.push_back(r); });
  const store::KvLoadStats before = s.Stats().kv.Value<store::KvLoadStats>();
  // The turn's own rows live only while the request runs (often one step): sampled from
  // another thread.
  std::atomic<bool> done{false};
  std::atomic<uint64_t> turn_peak{0};
  std::thread poll([&] {
    while (!done.load()) {
      turn_peak = std::max(turn_peak.load(), rig.store().Stats().turn_bytes);
      std::this_thread::sleep_for(1ms);
    }
  });
  auto ch = s.Submit(std::move(req));
  if (!ch.ok()) Die("submit: " + ch.status().ToString());
  while (records.empty()) {
    const double t0 = bench::NowSeconds();
    const int rows = s.Step();
    if (rows > 0) out.step_ms.push_back(1e3 * (bench::NowSeconds() - t0));
    turn_peak = std::max(turn_peak.load(), rig.store().Stats().turn_bytes);
  }
  done = true;
  poll.join();
  out.turn_bytes_peak = turn_peak.load();
  const RequestRecord& r = records.front();
  if (r.code != StatusCode::kOk || r.ttft_seconds < 0) Die("request failed (code " + std::to_string(int(r.code)) + ")");
  const store::KvLoadStats after = s.Stats().kv.Value<store::KvLoadStats>();
  out.ttft_s = r.ttft_seconds;
  out.recomputed = r.usage.recomputed_tokens;
  out.cached = r.usage.cached_tokens;
  out.entered_bytes = after.entered_bytes - before.entered_bytes;
  out.enter_s = after.enter_seconds - before.enter_seconds;
  out.wait_s = after.wait_seconds - before.wait_seconds;
  return out;
}

// Least-squares slope of log y on log x.
double GrowthExponent(const std::vector<double>& x, const std::vector<double>& y) {
  const size_t n = x.size();
  if (n < 2) return std::nan("");
  double sx = 0, sy = 0, sxx = 0, sxy = 0;
  for (size_t i = 0; i < n; ++i) {
    const double lx = std::log(x[i]), ly = std::log(y[i]);
    sx += lx, sy += ly, sxx += lx * lx, sxy += lx * ly;
  }
  return (n * sxy - sx * sy) / (n * sxx - sx * sx);
}


int RunRq3(int argc, char** argv) {
  Common c;
  c.methods = {*pic::ParseLinkOptions("full"), *pic::ParseLinkOptions("cacheblend-0.15@1"), *pic::ParseLinkOptions("attnlink-16"),
               *pic::ParseLinkOptions("naive")};
  std::string lengths_flag = "1,2,4,7", plot;
  int repeats = 3, chunk = 1024, fresh = 50;
  double skip_after = 0;
  bench::FlagParser flags(std::string(kProgram) + " rq3",
                          "--model PATH [--lengths 1,2,4,7 (chunks)] [--repeats 3] [--chunk 1024] [--new 50]\n"
                          "         [--methods full,cacheblend-0.15@1,attnlink-16,naive] [--skip-after SECONDS]\n"
                          "         [--plot FILE.svg] [--threads 2]\n"
                          "         [--seed 1] [--preload layerwise|sync|inline] [--json FILE]");
  AddCommonFlags(flags, &c);
  flags.String("--lengths", &lengths_flag);
  flags.Int("--repeats", &repeats);
  flags.Int("--chunk", &chunk);
  flags.Int("--new", &fresh);
  flags.String("--plot", &plot);
  flags.Double("--skip-after", &skip_after);
  flags.ParseOrExit(argc - 1, argv + 1);
  std::vector<int> lengths = ParseIntList(lengths_flag);
  std::sort(lengths.begin(), lengths.end());
  lengths.erase(std::unique(lengths.begin(), lengths.end()), lengths.end());
  if (c.model.empty() || lengths.empty() || repeats < 1 || chunk < 16 || fresh < 1)
    flags.UsageError("--model is required; --lengths positive chunk counts, --repeats >= 1, --chunk >= 16, --new >= 1");
  bench::CheckOutput(kProgram, c.json);
  bench::CheckOutput(kProgram, plot);
  const std::string load_start = bench::LoadAverage();

  const int max_chunks = lengths.back();
  const int context = 1 + max_chunks * chunk + fresh + 8;
  Rig rig(c, context, 1, max_chunks, chunk);
  auto request = [&](int n_chunks, const pic::LinkOptions& o, uint64_t salt) {
    auto spec = std::make_shared<pic::LinkSpec>();
    std::vector<int> order(n_chunks);
    for (int i = 0; i < n_chunks; ++i) order[i] = i;
    const auto fresh_tokens = bench::RandomTokens(fresh, c.seed * 7919 + salt, 100, rig.engine().model().config().vocab_size);
    GenerationRequest r;
    r.tenant = kTenant;
    r.prompt = rig.Prompt(order, fresh_tokens, spec.get());
    spec->options = o;
    r.kv_options.Set(std::shared_ptr<const pic::LinkSpec>(spec));
    r.sampling.max_tokens = 1;
    r.ignore_eos = true;
    return r;
  };
  Scheduler sched(rig.engine(), rig.LinkingOptions());
  sched.set_store(&rig.store());

  // samples[method][length] over the repeats.
  std::vector<std::vector<std::vector<Rq3Sample>>> samples(c.methods.size(),
                                                           std::vector<std::vector<Rq3Sample>>(lengths.size()));
  std::vector<std::vector<double>> rss(c.methods.size(), std::vector<double>(lengths.size(), 0));
  // --skip-after: a method whose TTFT at a length exceeded it runs no longer lengths.
  std::vector<int> too_slow_from(c.methods.size(), 1 << 30);
  uint64_t salt = 0;
  for (size_t m = 0; m < c.methods.size(); ++m) {
    const Rq3Sample w = RunOne(rig, sched, request(lengths.front(), c.methods[m], ++salt));
    std::fprintf(stderr, "warm-up %-14s %d chunks: %.3f s\n", Label(c.methods[m]).c_str(), lengths.front(), w.ttft_s);
  }
  for (int rep = 0; rep < repeats; ++rep) {
    for (size_t li = 0; li < lengths.size(); ++li) {
      for (size_t m = 0; m < c.methods.size(); ++m) {
        if (lengths[li] > too_slow_from[m]) continue;
        Rq3Sample s = RunOne(rig, sched, request(lengths[li], c.methods[m], ++salt));
        if (skip_after > 0 && s.ttft_s > skip_after) too_slow_from[m] = std::min(too_slow_from[m], lengths[li]);
        std::fprintf(stderr, "[rep %d/%d] %2d chunks %-14s TTFT %8.3f s, %3zu steps, recomputed %5d, entered %.1f MB\n",
                     rep + 1, repeats, lengths[li], Label(c.methods[m]).c_str(), s.ttft_s, s.step_ms.size(),
                     s.recomputed, s.entered_bytes / 1e6);
        samples[m][li].push_back(std::move(s));
        rss[m][li] = bench::PeakRssMiB();
      }
    }
  }
  sched.Shutdown();

  // Tables and JSON.
  nlohmann::json out;
  out["experiment"] = "rq3";
  out["cpu"] = bench::CpuName();
  out["loadavg_start"] = load_start;
  out["loadavg_end"] = bench::LoadAverage();
  out["model"] = c.model;
  out["threads"] = c.threads;
  out["chunk_tokens"] = chunk;
  out["new_tokens"] = fresh;
  out["repeats"] = repeats;
  out["preload"] = c.preload;
  out["kvgen_seconds"] = rig.gen_seconds();
  out["rss_mib_after_load"] = rig.rss_after_load();
  out["rss_mib_after_kvgen"] = rig.rss_after_gen();
  std::vector<double> x;
  for (int n : lengths) x.push_back(1.0 + n * chunk + fresh);
  std::vector<std::vector<double>> med(c.methods.size(), std::vector<double>(lengths.size()));
  std::vector<std::string> names;
  std::vector<double> exponents;
  for (size_t m = 0; m < c.methods.size(); ++m) {
    names.push_back(Label(c.methods[m]));
    std::vector<double> fx, fy;
    for (size_t li = 0; li < lengths.size(); ++li) {
      std::vector<double> t;
      for (const auto& s : samples[m][li]) t.push_back(s.ttft_s);
      med[m][li] = t.empty() ? std::nan("") : bench::Median(t);  // nan: skipped (--skip-after)
      if (lengths[li] * chunk >= 2048 && !t.empty()) fx.push_back(x[li]), fy.push_back(med[m][li]);
    }
    exponents.push_back(GrowthExponent(fx, fy));
  }
  const int fr = [&] {
    for (size_t m = 0; m < c.methods.size(); ++m)
      if (c.methods[m].method == pic::LinkMethod::kFull) return static_cast<int>(m);
    return -1;
  }();
  std::printf("## TTFT by context length (median of %d, seconds; %d-token chunks + %d new tokens)\n\n", repeats, chunk,
              fresh);
  std::vector<std::string> head = {"chunks", "prompt tokens"};
  for (const auto& n : names) head.push_back(n);
  for (size_t m = 0; m < names.size(); ++m)
    if (static_cast<int>(m) != fr && fr >= 0) head.push_back("FR / " + names[m]);
  std::fputs(bench::TableHeader(head).c_str(), stdout);
  for (size_t li = 0; li < lengths.size(); ++li) {
    std::vector<std::string> row = {std::to_string(lengths[li]), Fmt("%.0f", x[li])};
    auto cell = [](double v, const char* f) { return std::isnan(v) ? std::string("-") : Fmt(f, v); };
    for (size_t m = 0; m < names.size(); ++m) row.push_back(cell(med[m][li], "%.3f"));
    for (size_t m = 0; m < names.size(); ++m)
      if (static_cast<int>(m) != fr && fr >= 0) row.push_back(cell(med[fr][li] / med[m][li], "%.1fx"));
    std::fputs(bench::TableRow(row).c_str(), stdout);
  }
  std::printf("\n## Growth exponent (slope of log TTFT on log prompt tokens, lengths >= 2k)\n\n%s",
              bench::TableHeader({"method", "exponent"}).c_str());
  for (size_t m = 0; m < names.size(); ++m) std::fputs(bench::TableRow({names[m], Fmt("%.2f", exponents[m])}).c_str(), stdout);

  std::printf("\n## Per request (medians): recomputed tokens, chunk KV entered vs stored, turn rows, steps, peak RSS\n\n%s",
              bench::TableHeader({"method", "chunks", "recomputed", "stored MB", "entered MB", "entered / stored",
                                  "turn rows MB", "enter ms", "wait ms", "steps", "step ms (max)", "peak RSS MiB"})
                  .c_str());
  for (size_t m = 0; m < names.size(); ++m) {
    nlohmann::json jm;
    jm["method"] = c.methods[m].ToString();
    jm["exponent"] = exponents[m];
    for (size_t li = 0; li < lengths.size(); ++li) {
      const auto& ss = samples[m][li];
      if (ss.empty()) continue;
      std::vector<double> ttft, rec, ent, turn, enter, wait, steps, step_max;
      for (const auto& s : ss) {
        ttft.push_back(s.ttft_s), rec.push_back(s.recomputed), ent.push_back(static_cast<double>(s.entered_bytes));
        turn.push_back(static_cast<double>(s.turn_bytes_peak)), enter.push_back(s.enter_s), wait.push_back(s.wait_s);
        steps.push_back(static_cast<double>(s.step_ms.size()));
        step_max.push_back(s.step_ms.empty() ? 0 : *std::max_element(s.step_ms.begin(), s.step_ms.end()));
      }
      const double stored = static_cast<double>(lengths[li]) * chunk * rig.row_bytes();
      const double e = bench::Median(ent);
      std::fputs(bench::TableRow({names[m], std::to_string(lengths[li]), Fmt("%.0f", bench::Median(rec)),
                                  Fmt("%.1f", stored / 1e6), Fmt("%.1f", e / 1e6), Fmt("%.2f", e / stored),
                                  Fmt("%.1f", bench::Median(turn) / 1e6), Fmt("%.1f", 1e3 * bench::Median(enter)),
                                  Fmt("%.1f", 1e3 * bench::Median(wait)), Fmt("%.0f", bench::Median(steps)),
                                  Fmt("%.1f", bench::Median(step_max)), Fmt("%.0f", rss[m][li])})
                     .c_str(),
                 stdout);
      nlohmann::json jl;
      jl["chunks"] = lengths[li];
      jl["prompt_tokens"] = x[li];
      jl["ttft_s_median"] = med[m][li];
      if (!std::isnan(med[m][li]) && fr >= 0 && !std::isnan(med[fr][li])) jl["fr_over_this"] = med[fr][li] / med[m][li];
      jl["ttft_s"] = ttft;
      jl["recomputed_tokens"] = rec;
      jl["chunk_stored_bytes"] = stored;
      jl["entered_bytes"] = ent;
      jl["turn_rows_bytes_peak"] = turn;
      jl["enter_s"] = enter;
      jl["load_wait_s"] = wait;
      jl["step_ms"] = ss.back().step_ms;  // the last repeat's steps
      jl["peak_rss_mib_so_far"] = rss[m][li];
      jm["lengths"].push_back(jl);
    }
    out["methods"].push_back(jm);
  }
  if (!plot.empty()) {
    const std::string title = Fmt("TTFT vs context length (%d-token chunks, %d threads)", chunk, c.threads);
    bench::WriteOutput(kProgram, plot, bench::LogLogPlotSvg(names, x, med, title, "prompt tokens (log)", "TTFT (log)", "s"));
  }
  out["peak_rss_mib"] = bench::PeakRssMiB();
  std::printf("\npeak RSS %.0f MiB (after model load %.0f, after KVGen %.0f); CPU %s; load average %s at the start, "
              "%s at the end\n",
              bench::PeakRssMiB(), rig.rss_after_load(), rig.rss_after_gen(), bench::CpuName().c_str(), load_start.c_str(),
              bench::LoadAverage().c_str());
  const std::string line = out.dump();
  std::printf("\n%s\n", line.c_str());
  bench::WriteOutput(kProgram, c.json, line + "\n");
  return 0;
}

// ---------------------------------------------------------------------------------------
// rq2

struct Rq2Cell {
  double rate = 0, window = 0;
  int submitted = 0, rejected = 0, finished = 0, unfinished = 0;
  double p50 = kInf, p90 = kInf, req_s = 0, tok_s = 0, mean_recomputed = 0;
  bool ran = false;
};

struct Rq2Args {
  std::vector<double> rates = {0.075, 0.1, 0.15, 0.2, 0.3, 0.45, 0.7, 1, 1.5, 2.2};
  double duration = 30, drain = 15;
  int min_requests = 6;  // a rate's window is long enough for this many arrivals on average
  // The arrival window at `rate`, seconds.
  double Window(double rate) const { return std::max(duration, min_requests / rate); }
  double slo = 0;  // 0: twice the slowest linking method's unloaded TTFT (RunRq2)
  int pool = 16, chunk = 512, per_request = 4, fresh = 50, output = 16;
};

// A request of --chunks-per-request chunks of the pool, in random order, + fresh tokens.
GenerationRequest Rq2Request(const Rig& rig, const Rq2Args& a, const pic::LinkOptions& method, std::mt19937_64& rng) {
  std::vector<int> order(a.pool);
  for (int j = 0; j < a.pool; ++j) order[j] = j;
  std::shuffle(order.begin(), order.end(), rng);
  order.resize(a.per_request);
  auto spec = std::make_shared<pic::LinkSpec>();
  GenerationRequest r;
  r.tenant = kTenant;
  r.prompt = rig.Prompt(order, bench::RandomTokens(a.fresh, rng(), 100, rig.vocab()), spec.get());
  spec->options = method;
  r.kv_options.Set(std::shared_ptr<const pic::LinkSpec>(spec));
  r.sampling.max_tokens = a.output;
  r.ignore_eos = true;
  return r;
}

// One (rate, method) run: Poisson arrivals for args.duration seconds on a fresh scheduler
// driven by a step-loop thread.
Rq2Cell RunLoad(Rig& rig, const Rq2Args& a, const pic::LinkOptions& method, double rate, uint64_t seed) {
  // The same arrivals and prompts for every method at a rate.
  std::mt19937_64 rng(seed);
  std::exponential_distribution<double> gap(rate);
  std::vector<double> at;
  const double window = a.Window(rate);
  for (double t = gap(rng); t < window; t += gap(rng)) at.push_back(t);
  std::vector<GenerationRequest> reqs;
  for (size_t i = 0; i < at.size(); ++i) reqs.push_back(Rq2Request(rig, a, method, rng));

  SchedulerOptions so = rig.LinkingOptions();
  so.max_waiting = 256;
  Scheduler sched(rig.engine(), so);
  sched.set_store(&rig.store());
  std::mutex mu;
  std::vector<RequestRecord> records;
  std::vector<SchedClock::time_point> ended;  // when each record's request ended
  sched.set_observer([&](const RequestRecord& r) {
    std::lock_guard<std::mutex> lock(mu);
    records.push_back(r);
    ended.push_back(SchedClock::now());
  });
  std::atomic<bool> stop{false};
  std::thread loop([&] {
    while (!stop.load()) {
      if (sched.WaitForWork(20ms)) sched.Step();
    }
  });

  Rq2Cell cell;
  cell.rate = rate;
  cell.window = window;
  cell.ran = true;
  std::vector<std::shared_ptr<ResultChannel>> chans;
  const auto t0 = SchedClock::now();
  for (size_t i = 0; i < reqs.size(); ++i) {
    const auto when = t0 + std::chrono::duration_cast<SchedClock::duration>(std::chrono::duration<double>(at[i]));
    std::this_thread::sleep_until(when);
    reqs[i].arrival = when;
    ++cell.submitted;
    auto ch = sched.Submit(std::move(reqs[i]));
    if (ch.ok()) {
      chans.push_back(*ch);
    } else {
      ++cell.rejected;
    }
  }
  auto n_records = [&] {
    std::lock_guard<std::mutex> lock(mu);
    return records.size();
  };
  const auto drain_end = t0 + std::chrono::duration_cast<SchedClock::duration>(std::chrono::duration<double>(window + a.drain));
  while (n_records() < chans.size() && SchedClock::now() < drain_end) std::this_thread::sleep_for(10ms);
  for (auto& ch : chans) ch->Cancel();  // what is left past the drain
  const auto reap_end = SchedClock::now() + 10s;
  while (n_records() < chans.size() && SchedClock::now() < reap_end) std::this_thread::sleep_for(10ms);
  stop = true;
  loop.join();
  sched.Shutdown();

  std::vector<double> ttft;
  double last_end = 0;  // the last finished request's end, seconds after t0
  int64_t tokens = 0;
  double recomputed = 0;
  std::lock_guard<std::mutex> lock(mu);
  for (size_t i = 0; i < records.size(); ++i) {
    const RequestRecord& r = records[i];
    if (r.code != StatusCode::kOk || r.finish_reason.empty() || r.ttft_seconds < 0) continue;
    ttft.push_back(r.ttft_seconds);
    ++cell.finished;
    tokens += r.usage.completion_tokens;
    recomputed += r.usage.recomputed_tokens;
    last_end = std::max(last_end, std::chrono::duration<double>(ended[i] - t0).count());
  }
  // Throughput: what finished, over the time from the window's start to the last finish
  // (at least the window: an idle tail after the last arrival is not the server's).
  const double elapsed = std::max(last_end, window);
  cell.req_s = cell.finished / elapsed;
  cell.tok_s = tokens / elapsed;
  cell.unfinished = cell.submitted - cell.rejected - cell.finished;
  // Requests without a first token count as infinitely late.
  std::vector<double> all = ttft;
  all.resize(cell.submitted, kInf);
  if (!all.empty()) {
    cell.p50 = bench::Percentile(all, 50);
    cell.p90 = bench::Percentile(all, 90);
  }
  cell.mean_recomputed = cell.finished ? recomputed / cell.finished : 0;
  return cell;
}

int RunRq2(int argc, char** argv) {
  Common c;
  c.methods = {*pic::ParseLinkOptions("attnlink-16"), *pic::ParseLinkOptions("cacheblend-0.15@1"), *pic::ParseLinkOptions("full")};
  Rq2Args a;
  bench::FlagParser flags(std::string(kProgram) + " rq2",
                          "--model PATH [--rates 0.075,0.1,0.15,0.2,0.3,0.45,0.7,1,1.5,2.2] [--duration 30]\n"
                          "         [--min-requests 6] [--drain 15]"
                          " [--slo SECONDS (0: auto)] [--pool 16]\n"
                          "         [--chunk 512] [--chunks-per-request 4] [--new 50] [--output 16]\n"
                          "         [--methods attnlink-16,cacheblend-0.15@1,full] [--threads 2] [--seed 1]\n"
                          "         [--preload layerwise|sync|inline] [--json FILE]");
  AddCommonFlags(flags, &c);
  flags.DoubleList("--rates", &a.rates);
  flags.Double("--duration", &a.duration);
  flags.Int("--min-requests", &a.min_requests);
  flags.Double("--drain", &a.drain);
  flags.Double("--slo", &a.slo);
  flags.Int("--pool", &a.pool);
  flags.Int("--chunk", &a.chunk);
  flags.Int("--chunks-per-request", &a.per_request);
  flags.Int("--new", &a.fresh);
  flags.Int("--output", &a.output);
  flags.ParseOrExit(argc - 1, argv + 1);
  std::sort(a.rates.begin(), a.rates.end());
  if (c.model.empty() || a.rates.empty() || a.rates.front() <= 0 || a.duration <= 0 || a.drain < 0 || a.slo < 0 ||
      a.pool < a.per_request || a.per_request < 1 || a.chunk < 16 || a.fresh < 1 || a.output < 1)
    flags.UsageError("--model is required; rates > 0, --pool >= --chunks-per-request >= 1, --chunk >= 16, --slo >= 0");
  bench::CheckOutput(kProgram, c.json);
  const bool slo_auto = a.slo == 0;
  const std::string load_start = bench::LoadAverage();

  const int context = 1 + a.per_request * a.chunk + a.fresh + a.output + 8;
  Rig rig(c, context, SchedulerOptions{}.max_running, a.pool, a.chunk);

  // Unloaded TTFT of each method: requests one at a time on an idle scheduler (3 each,
  // FR 1: it is the slowest by far and only reported). The default --slo is twice the
  // slowest linking method's: a threshold every linking method meets when unloaded, so
  // that each has a sustained rate to compare, and that allows queueing delay up to one
  // more unloaded TTFT of the slower method.
  std::vector<double> unloaded(c.methods.size(), 0);
  {
    Scheduler idle(rig.engine(), rig.LinkingOptions());
    idle.set_store(&rig.store());
    std::mt19937_64 rng(c.seed * 31 + 5);
    double slowest = 0;
    for (size_t m = 0; m < c.methods.size(); ++m) {
      const bool fr = c.methods[m].method == pic::LinkMethod::kFull;
      std::vector<double> t;
      for (int i = 0; i < (fr ? 1 : 3); ++i) {
        GenerationRequest r = Rq2Request(rig, a, c.methods[m], rng);
        r.sampling.max_tokens = 1;
        t.push_back(RunOne(rig, idle, std::move(r)).ttft_s);
      }
      unloaded[m] = bench::Median(t);
      if (!fr) slowest = std::max(slowest, unloaded[m]);
      std::fprintf(stderr, "unloaded TTFT %-14s %.3f s\n", Label(c.methods[m]).c_str(), unloaded[m]);
    }
    idle.Shutdown();
    if (a.slo <= 0) a.slo = slowest > 0 ? 2 * slowest : unloaded[0] * 2;
  }
  std::fprintf(stderr, "p90 TTFT threshold %.3f s\n", a.slo);

  // Rates in ascending order, methods interleaved at each; a method stops at the first
  // rate it does not sustain (a higher rate would not either, and would take the longest).
  std::vector<std::vector<Rq2Cell>> cells(c.methods.size(), std::vector<Rq2Cell>(a.rates.size()));
  // A method whose unloaded TTFT is above the threshold sustains no rate: not swept.
  std::vector<bool> failed(c.methods.size(), false);
  for (size_t m = 0; m < c.methods.size(); ++m) failed[m] = unloaded[m] > a.slo;
  for (size_t ri = 0; ri < a.rates.size(); ++ri) {
    for (size_t m = 0; m < c.methods.size(); ++m) {
      if (failed[m]) continue;
      Rq2Cell cell = RunLoad(rig, a, c.methods[m], a.rates[ri], c.seed * 104729 + ri);
      std::fprintf(stderr, "rate %5.2f/s %-14s p50 %7.3f p90 %7.3f s, %d/%d finished, %d rejected, %.2f req/s\n",
                   a.rates[ri], Label(c.methods[m]).c_str(), cell.p50, cell.p90, cell.finished, cell.submitted,
                   cell.rejected, cell.req_s);
      if (!(cell.p90 <= a.slo)) failed[m] = true;
      cells[m][ri] = cell;
    }
  }

  nlohmann::json out;
  out["experiment"] = "rq2";
  out["cpu"] = bench::CpuName();
  out["loadavg_start"] = load_start;
  out["loadavg_end"] = bench::LoadAverage();
  out["model"] = c.model;
  out["threads"] = c.threads;
  out["rates"] = a.rates;
  out["duration_s"] = a.duration;
  out["min_requests"] = a.min_requests;
  out["drain_s"] = a.drain;
  out["slo_p90_ttft_s"] = a.slo;
  out["slo_auto"] = slo_auto;
  out["pool_chunks"] = a.pool;
  out["chunk_tokens"] = a.chunk;
  out["chunks_per_request"] = a.per_request;
  out["new_tokens"] = a.fresh;
  out["output_tokens"] = a.output;
  out["preload"] = c.preload;
  out["kvgen_seconds"] = rig.gen_seconds();
  auto ms = [](double s) { return std::isinf(s) ? std::string("inf") : Fmt("%.0f", 1e3 * s); };
  std::printf("## Poisson load: %d x %d-token chunks of a pool of %d + %d new tokens, %d output tokens; each rate for "
              "max(%.0f s, %d / rate); a method stops at the first rate it fails\n\n%s",
              a.per_request, a.chunk, a.pool, a.fresh, a.output, a.duration, a.min_requests,
              bench::TableHeader({"rate req/s", "method", "submitted", "finished", "rejected", "TTFT p50 ms",
                                  "TTFT p90 ms", "req/s", "output tok/s", "recomputed / req"})
                  .c_str());
  std::vector<double> sustained(c.methods.size(), 0);
  for (size_t ri = 0; ri < a.rates.size(); ++ri) {
    for (size_t m = 0; m < c.methods.size(); ++m) {
      const Rq2Cell& k = cells[m][ri];
      if (!k.ran) continue;
      if (k.p90 <= a.slo) sustained[m] = std::max(sustained[m], k.rate);
      std::fputs(bench::TableRow({Fmt("%g", k.rate), Label(c.methods[m]), std::to_string(k.submitted),
                                  std::to_string(k.finished), std::to_string(k.rejected), ms(k.p50), ms(k.p90),
                                  Fmt("%.2f", k.req_s), Fmt("%.1f", k.tok_s), Fmt("%.0f", k.mean_recomputed)})
                     .c_str(),
                 stdout);
      out["cells"].push_back({{"rate", k.rate},
                              {"method", c.methods[m].ToString()},
                              {"window_s", k.window},
                              {"submitted", k.submitted},
                              {"finished", k.finished},
                              {"rejected", k.rejected},
                              {"unfinished", k.unfinished},
                              {"ttft_p50_s", std::isinf(k.p50) ? -1 : k.p50},
                              {"ttft_p90_s", std::isinf(k.p90) ? -1 : k.p90},
                              {"req_per_s", k.req_s},
                              {"output_tok_per_s", k.tok_s},
                              {"recomputed_per_request", k.mean_recomputed}});
    }
  }
  std::printf("\n## Highest rate sustained with p90 TTFT <= %.2f s (of the rates swept)\n\n%s", a.slo,
              bench::TableHeader({"method", "unloaded TTFT ms", "sustained req/s"}).c_str());
  for (size_t m = 0; m < c.methods.size(); ++m) {
    const std::string none = unloaded[m] > a.slo ? "none (unloaded TTFT above the threshold)" : "none";
    std::fputs(bench::TableRow({Label(c.methods[m]), Fmt("%.0f", 1e3 * unloaded[m]),
                                sustained[m] > 0 ? Fmt("%g", sustained[m]) : none})
                   .c_str(),
               stdout);
    out["sustained_req_per_s"][c.methods[m].ToString()] = sustained[m];
    out["unloaded_ttft_s"][c.methods[m].ToString()] = unloaded[m];
  }
  out["peak_rss_mib"] = bench::PeakRssMiB();
  std::printf("\npeak RSS %.0f MiB; CPU %s; load average %s at the start, %s at the end\n", bench::PeakRssMiB(),
              bench::CpuName().c_str(), load_start.c_str(), bench::LoadAverage().c_str());
  const std::string line = out.dump();
  std::printf("\n%s\n", line.c_str());
  bench::WriteOutput(kProgram, c.json, line + "\n");
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  ReexecWithHugePageMalloc(argv);
  const std::string cmd = argc > 1 ? argv[1] : "";
  if (cmd == "rq3") return RunRq3(argc, argv);
  if (cmd == "rq2") return RunRq2(argc, argv);
  const bool help = cmd == "--help" || cmd == "-h";
  std::fprintf(help ? stdout : stderr,
               "usage: %s rq3|rq2 --model PATH [flags]   (%s rq3 --help, %s rq2 --help)\n"
               "  rq3  TTFT against context length, per linking method (Epic RQ3)\n"
               "  rq2  TTFT and throughput under Poisson load, per linking method (Epic RQ2)\n",
               kProgram, kProgram, kProgram);
  return help ? 0 : 2;
}
