// store_overlap_bench: the overlap ablation of paper 001 (Fig. 19 and 20) on this machine.
//
// Every job is "a returning conversation": H history tokens whose KV the store holds
// (saved by an earlier turn) plus N new prompt tokens, answered with one token (TTFT) or
// with --answer tokens (turn time). It runs the real Scheduler + KvStore + forward pass
// in-process (no HTTP), one configuration after another, each --reps times (medians):
//
//   resident        no store; the history's KV is already in the compute buffer: the
//                   paper's ideal ("compute-only" time of the N new tokens, attending to H)
//   sync            no pre-loading: the whole entry is read, verified and entered into
//                   the compute buffer before the job's forward starts
//   layerwise       layer-wise pre-loading: layer l+1's KV enters the compute buffer
//                   (RoPE applied) while layer l computes; no read buffer
//   inline          layer l is entered by the compute threads just before it computes
//   layerwise+rbuf  also a read buffer: the next queued jobs' entries are fetched and
//                   verified while the current job runs (S_buf from measured rates)
//   ssd             the entries were demoted to the SSD tier; no prefetch (LRU policy)
//   ssd+prefetch    same, scheduler-aware prefetch pulls queued jobs' entries to DRAM
//   recompute       no store: the whole H+N prompt is prefilled (RE)
//   remote          (--kv-remote URL) another server saved the history to a Redis
//                   Cluster (write-through); this one has never seen it: the lookup finds
//                   the session in the cluster and the entry streams in layer by layer,
//                   layer l entering and computing while later layers are in flight
//                   (single job only)
//   remote-whole    the same, the entry read whole and verified before the job starts
//                   (StoreOptions::stream_layers off: the read before streaming)
//                   The returning turn comes --remote-pause ms after the other server's
//                   save (a user reading the answer; the cluster replicates meanwhile).
//
// Single-job configurations report TTFT (submit -> first token) of one job on an idle
// server. The back-to-back rows queue --jobs jobs at once (max one running, as the
// paper's Fig. 19 serves one batch at a time) and report the mean time per job; their
// store is read-only (primed by a saving scheduler), so they measure loading alone.
// Fig. 20: mean turn time of back-to-back turns that each answer --answer tokens and
// save their KV, with the store's asynchronous save (write buffer) and with a
// synchronous save on the step loop.
//
// Usage: store_overlap_bench --model PATH [--history 1000] [--new 100] [--jobs 6]
//          [--answer 32] [--reps 3] [--threads 2] [--json FILE] [--only single|queued|saving]
//          [--kv-remote redis://host:port,...] [--remote-pause MS (2000)] [--configs a,b,...]
//          [--kv-store-dtype f32|f16|q8_0|q4_0|q8_0/q4_0|kivi4 (f32): the stored entries' type]
//   --configs runs only the named rows (each section's base row always runs: the ratios
//   are against it), e.g. --only single --configs layerwise,remote.
// Output: a table on stdout, then one JSON line (also to --json).
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "attic/core/huge_pages.h"
#include "attic/engine/kv_features.h"
#include "attic/engine/scheduler.h"
#include "attic/store/kv_store.h"
#include "attic/store/redis_tier.h"
#include "attic/store/store_planner.h"
#include "bench/common/flags.h"
#include "bench/common/format.h"
#include "bench/common/output.h"
#include "bench/common/stats.h"

using namespace attic;
using namespace attic::engine;
using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

namespace {

struct Args {
  std::string model;
  std::string kv_store_dtype = "f32";  // the entries' type (StoreOptions::kv_dtype)
  int history = 1000;
  int fresh = 100;
  int jobs = 6;
  int answer = 32;
  int reps = 3;
  int threads = 2;
  std::string json;
  std::string only;  // "", "single", "queued" or "saving"
  std::set<std::string> configs;  // --configs: empty = every row; else these (plus each section's base row)
  std::string remote;  // --kv-remote: a Redis Cluster for the "remote" row
  int remote_pause_ms = 2000;  // between the other server's save and the returning turn
};

double Ms(Clock::duration d) { return std::chrono::duration<double, std::milli>(d).count(); }

// Runs the step loop until every channel has finished. Returns, per channel, the time
// from `start` to its first text event and to its finish.
struct JobTimes {
  double first_ms = 0, end_ms = 0;
};

std::vector<JobTimes> Drive(Scheduler& s, const std::vector<std::shared_ptr<ResultChannel>>& chans, Clock::time_point start) {
  std::vector<JobTimes> t(chans.size());
  std::vector<bool> seen(chans.size(), false), done(chans.size(), false);
  size_t n_done = 0;
  while (n_done < chans.size()) {
    s.Step();
    const auto now = Clock::now();
    for (size_t i = 0; i < chans.size(); ++i) {
      GenerationEvent ev;
      while (!done[i] && chans[i]->Pop(&ev, 0ms)) {
        if (!seen[i]) {
          seen[i] = true;
          t[i].first_ms = Ms(now - start);
        }
        if (ev.kind != GenerationEvent::Kind::kText) {
          if (ev.kind == GenerationEvent::Kind::kError) {
            std::fprintf(stderr, "store_overlap_bench: request failed: %s\n", ev.status.ToString().c_str());
            std::exit(1);
          }
          done[i] = true;
          ++n_done;
          t[i].end_ms = Ms(now - start);
        }
      }
    }
  }
  return t;
}

std::shared_ptr<ResultChannel> Submit(Scheduler& s, std::vector<int32_t> prompt, const std::string& session,
                                      int max_tokens) {
  GenerationRequest req;
  req.prompt = std::move(prompt);
  req.session_id = session;
  req.sampling.max_tokens = max_tokens;
  req.ignore_eos = true;
  auto c = s.Submit(std::move(req));
  if (!c.ok()) {
    std::fprintf(stderr, "store_overlap_bench: submit: %s\n", c.status().ToString().c_str());
    std::exit(1);
  }
  return *c;
}

struct Config {
  std::string name;
  bool store = true;
  bool resident = false;            // keep finished sequences in the compute buffer
  store::Preload preload = store::Preload::kLayerwise;
  int64_t read_buffer = 0;          // KvFeatureOptions::kv_read_buffer_bytes
  bool ssd = false;                 // demote every entry to SSD before the timed jobs
  store::PolicyKind policy = store::PolicyKind::kSchedulerAware;
  bool async_save = true;
  bool save = true;                 // save each turn (false: read-only store)
  bool remote = false;              // primed by another store on the --kv-remote cluster
  bool stream = true;               // StoreOptions::stream_layers (remote: read layer by layer)
};

class Bench {
 public:
  Bench(Engine& e, const Args& a) : e_(e), a_(a) {
    // History and new tokens: real text, so the prompts look like a conversation's.
    std::mt19937 rng(7);
    std::uniform_int_distribution<int32_t> tok(100, e.model().config().vocab_size - 1);
    for (int s = 0; s < a.jobs; ++s) {
      std::vector<int32_t> h(a.history), n(a.fresh);
      for (auto& x : h) x = tok(rng);
      for (auto& x : n) x = tok(rng);
      hist_.push_back(h);
      fresh_.push_back(n);
    }
  }

  // Returns per-job times of the timed phase; `jobs` jobs back to back (1 = single job).
  // `entered` (optional) gets the timed phase's stored-KV entering: bytes and seconds.
  std::vector<JobTimes> Run(const Config& c, int jobs, int answer, std::pair<double, double>* entered = nullptr) {
    const std::string ssd_dir =
        (std::filesystem::temp_directory_path() / ("attic-overlap-" + std::to_string(::getpid()))).string();
    std::filesystem::remove_all(ssd_dir);
    std::unique_ptr<store::KvStore> store, primer;
    store::RedisTier* primer_remote = nullptr;  // the primer's cluster tier (owned by primer)
    const uint64_t entry_bytes = EntryBytes();
    if (c.remote) {
      // Two stores on the cluster, as two servers: `primer` saves every history (written
      // through), `store` (the timed one) has never seen them.
      const std::string prefix = "attic-bench-" + std::to_string(::getpid()) + "-" + std::to_string(++runs_);
      primer = OpenRemote(prefix, entry_bytes, c.stream, &primer_remote);
      store = OpenRemote(prefix, entry_bytes, c.stream);
    } else if (c.store) {
      store::StoreOptions o;
      o.fingerprint = e_.model().fingerprint();
      o.kv_dtype = StoreDtype();
      // SSD runs: DRAM holds two entries (so prefetch has room), everything else on SSD.
      o.dram_bytes = c.ssd ? 2 * entry_bytes + (1 << 20) : 64 * entry_bytes;
      if (c.ssd) {
        o.ssd_dir = ssd_dir;
        o.ssd_bytes = 64 * entry_bytes;
      }
      o.policy = c.policy;
      o.write_buffer_bytes = c.async_save ? 256ull << 20 : 0;
      auto s = store::KvStore::Open(o);
      if (!s.ok()) {
        std::fprintf(stderr, "store_overlap_bench: %s\n", s.status().ToString().c_str());
        std::exit(1);
      }
      store = std::move(*s);
    }
    SchedulerOptions so;
    so.max_running = 1;
    so.max_resident = c.resident ? 64 : 0;
    KvFeatureOptions fo;
    fo.kv_preload = c.preload;
    fo.kv_read_buffer_bytes = c.read_buffer;
    so.kv_connector = KvFeatures(fo);
    // Turn 1 of every session: its history (saved to the store, or kept resident). A
    // read-only configuration primes the store with a scheduler that saves.
    auto prime = [&](Scheduler& s) {
      for (int j = 0; j < jobs; ++j) {
        auto ch = Submit(s, hist_[j], "s" + std::to_string(j), 1);
        Drive(s, {ch}, Clock::now());
      }
    };
    if (!c.save) {
      Scheduler saver(e_, so);
      saver.set_store(primer != nullptr ? primer.get() : store.get());
      prime(saver);
      saver.Shutdown();
      if (primer != nullptr) {
        primer->Flush();
        // The conversation's next turn comes after its user read the answer: by then the
        // cluster has replicated the other server's write (right after a 94 MB write the
        // masters and replicas are busy copying it, and a turn then computes on cores
        // they take: --remote-pause 0 shows it).
        std::this_thread::sleep_for(std::chrono::milliseconds(a_.remote_pause_ms));
      }
    }
    fo.store_save = c.save;
    so.kv_connector = KvFeatures(fo);
    Scheduler sched(e_, so);
    sched.set_store(store.get());
    if (c.save) prime(sched);
    if (store) store->Flush();
    if (c.ssd) {
      DemoteAllToSsd(*store);
    }
    // The timed jobs: turn 2 = history + new tokens (history's last token is recomputed
    // only if the entry lacks it; the entry holds all H tokens).
    std::vector<std::shared_ptr<ResultChannel>> chans;
    const auto start = Clock::now();
    for (int j = 0; j < jobs; ++j) {
      std::vector<int32_t> p = hist_[j];
      p.insert(p.end(), fresh_[j].begin(), fresh_[j].end());
      chans.push_back(Submit(sched, std::move(p), "s" + std::to_string(j), answer));
    }
    const store::KvLoadStats before = sched.Stats().kv.Value<store::KvLoadStats>();
    auto t = Drive(sched, chans, start);
    const store::KvLoadStats after = sched.Stats().kv.Value<store::KvLoadStats>();
    std::fprintf(stderr, "  %-16s fetch %.1f ms, enter %.1f ms, wait %.1f ms over %d jobs\n", c.name.c_str(),
                 1e3 * (after.fetch_seconds - before.fetch_seconds), 1e3 * (after.enter_seconds - before.enter_seconds),
                 1e3 * (after.wait_seconds - before.wait_seconds), jobs);
    if (entered != nullptr) {
      entered->first += static_cast<double>(after.entered_bytes - before.entered_bytes);
      entered->second += after.enter_seconds - before.enter_seconds;
    }
    if (store) store->Flush();
    // One saved entry's bytes (header + K/V rows in the store type): what each tier,
    // the cluster included, holds of a conversation.
    for (store::KvStore* st : {primer.get(), store.get()}) {
      if (st == nullptr) continue;
      const store::StoreStats ss = st->Stats();
      if (ss.saves > 0) entry_bytes_ = ss.bytes_saved / ss.saves;
    }
    // What the cluster was sent per entry written through (the entry as Redis holds it:
    // its layers and manifest).
    if (primer_remote != nullptr && primer_remote->stats().puts > 0)
      remote_bytes_per_put_ = primer_remote->stats().bytes_written / primer_remote->stats().puts;
    sched.Shutdown();
    std::filesystem::remove_all(ssd_dir);
    return t;
  }

  // One entry the last run saved, in bytes (0 before any save).
  uint64_t entry_bytes() const { return entry_bytes_; }
  // Bytes written to the cluster per entry (0 without --kv-remote).
  uint64_t remote_bytes_per_put() const { return remote_bytes_per_put_; }

 private:
  std::unique_ptr<store::KvStore> OpenRemote(const std::string& prefix, uint64_t entry_bytes, bool stream,
                                             store::RedisTier** tier_out = nullptr) {
    store::StoreOptions o;
    o.kv_dtype = StoreDtype();
    o.stream_layers = stream;
    o.fingerprint = e_.model().fingerprint();
    o.dram_bytes = 64 * entry_bytes;
    o.policy = store::PolicyKind::kLru;
    o.default_ttl_ms = 600 * 1000;  // the cluster drops the bench's entries after 10 minutes
    o.write_through = true;
    store::RedisTierOptions r;
    r.url = a_.remote;
    r.prefix = prefix;
    r.capacity = 64 * entry_bytes;
    auto tier = store::RedisTier::Open(r);
    if (!tier.ok()) {
      std::fprintf(stderr, "store_overlap_bench: --kv-remote: %s\n", tier.status().ToString().c_str());
      std::exit(1);
    }
    auto tiers = store::KvStore::LocalTiers(o);  // DRAM
    if (!tiers.ok()) {
      std::fprintf(stderr, "store_overlap_bench: %s\n", tiers.status().ToString().c_str());
      std::exit(1);
    }
    if (tier_out != nullptr) *tier_out = tier->get();
    tiers->push_back(std::move(*tier));
    auto s = store::KvStore::Open(o, std::move(*tiers), nullptr);
    if (!s.ok()) {
      std::fprintf(stderr, "store_overlap_bench: %s\n", s.status().ToString().c_str());
      std::exit(1);
    }
    return std::move(*s);
  }

  store::KvDtype StoreDtype() const {
    store::KvDtype t = store::KvDtype::kF32;
    store::ParseKvDtype(a_.kv_store_dtype, &t);  // checked by the flag
    return t;
  }
  // An upper bound of one entry's bytes (f32 rows: any store type's are smaller).
  uint64_t EntryBytes() const {
    const auto& cfg = e_.model().config();
    return static_cast<uint64_t>(a_.history + a_.fresh + a_.answer) * cfg.n_layers * cfg.kv_dim() * 2 * 4 + (64 << 10);
  }

  // Pushes every session entry out of DRAM (whose capacity is two entries): saves two
  // filler entries of another tenant, which demotes whatever DRAM holds, then erases them.
  void DemoteAllToSsd(store::KvStore& s) {
    const auto& cfg = e_.model().config();
    for (int f = 0; f < 2; ++f) {
      store::KvEntry e;
      e.tenant = "filler";
      e.session_id = "f" + std::to_string(f);
      e.n_layers = cfg.n_layers;
      e.kv_dim = cfg.kv_dim();
      e.tokens.assign(a_.history, 1 + f);
      e.positions.resize(a_.history);
      for (int i = 0; i < a_.history; ++i) e.positions[i] = i;
      e.k.assign(cfg.n_layers, std::vector<float>(static_cast<size_t>(a_.history) * cfg.kv_dim(), 0.f));
      e.v = e.k;
      if (!s.Save(std::move(e)).ok()) std::fprintf(stderr, "store_overlap_bench: filler save failed\n");
    }
    for (int f = 0; f < 2; ++f) (void)s.EraseSession("filler", "f" + std::to_string(f));
  }

  Engine& e_;
  const Args& a_;
  std::vector<std::vector<int32_t>> hist_, fresh_;
  int runs_ = 0;
  uint64_t entry_bytes_ = 0;  // the last run's saved entries, bytes each
  uint64_t remote_bytes_per_put_ = 0;
};

}  // namespace

int main(int argc, char** argv) {
  ReexecWithHugePageMalloc(argv);
  Args a;
  bench::FlagParser flags("store_overlap_bench",
                          "--model PATH [--history 1000] [--new 100] [--jobs 6] [--answer 32] [--reps 3] "
                          "[--threads 2]\n         [--json FILE] [--only single|queued|saving] [--kv-remote URL]\n         [--remote-pause MS] [--configs a,b,...]");
  flags.String("--model", &a.model);
  flags.Int("--history", &a.history);
  flags.Int("--new", &a.fresh);
  flags.Int("--jobs", &a.jobs);
  flags.Int("--answer", &a.answer);
  flags.Int("--reps", &a.reps);
  flags.Int("--threads", &a.threads);
  flags.String("--json", &a.json);
  flags.String("--only", &a.only);
  flags.String("--kv-remote", &a.remote);
  flags.String("--kv-store-dtype", &a.kv_store_dtype);
  flags.Int("--remote-pause", &a.remote_pause_ms);
  flags.Custom("--configs", [&](const std::string& v) {
    for (const std::string& name : bench::SplitList(v)) a.configs.insert(name);
    return OkStatus();
  });
  flags.ParseOrExit(argc, argv);
  if (a.model.empty() || a.history < 16 || a.fresh < 1 || a.jobs < 2 || a.reps < 1)
    flags.UsageError("--model is required; --history >= 16, --new >= 1, --jobs >= 2");
  if (store::KvDtype t; !store::ParseKvDtype(a.kv_store_dtype, &t))
    flags.UsageError("--kv-store-dtype must be " + store::KvDtypeChoices() + ", not '" + a.kv_store_dtype + "'");
  attic::bench::CheckOutput("store_overlap_bench", a.json);
  EngineOptions eo;
  eo.model_path = a.model;
  eo.n_threads = a.threads;
  eo.context_length = std::max(2048, a.history + a.fresh + a.answer + 16);
  eo.max_batch_tokens = 512;
  const auto load = Engine::Load(eo);
  if (!load.ok()) {
    std::fprintf(stderr, "store_overlap_bench: %s\n", load.status().ToString().c_str());
    return 1;
  }
  Engine& e = **load;
  {
    const auto& cfg = e.model().config();
    const int64_t per_seq = static_cast<int64_t>(eo.context_length) * cfg.n_layers * cfg.kv_dim() * 2 * 4;
    e.ResizeKvCache(per_seq * (a.jobs + 1));
  }
  Bench b(e, a);

  std::vector<Config> single = {
      {"resident", false, true, store::Preload::kLayerwise, 0},
      {"sync", true, false, store::Preload::kSync, 0},
      {"layerwise", true, false, store::Preload::kLayerwise, 0},
      {"inline", true, false, store::Preload::kInline, 0},
      {"recompute", false, false, store::Preload::kSync, 0},
  };
  if (!a.remote.empty()) {
    single.push_back({"remote", true, false, store::Preload::kLayerwise, 0, false, store::PolicyKind::kLru, true, false, true});
    single.push_back(
        {"remote-whole", true, false, store::Preload::kLayerwise, 0, false, store::PolicyKind::kLru, true, false, true, false});
  }
  // Loading only (Fig. 19): the store configurations are read-only here (their entries
  // primed by a saving scheduler), so SSD rows measure reads and prefetch, not the
  // demotions the jobs' own saves would cause; saving is measured below (Fig. 20).
  using store::PolicyKind;
  const std::vector<Config> queued = {
      {"resident", false, true, store::Preload::kLayerwise, 0},
      {"sync", true, false, store::Preload::kSync, 0, false, PolicyKind::kSchedulerAware, true, false},
      {"layerwise", true, false, store::Preload::kLayerwise, 0, false, PolicyKind::kSchedulerAware, true, false},
      {"inline", true, false, store::Preload::kInline, 0, false, PolicyKind::kSchedulerAware, true, false},
      {"layerwise+rbuf", true, false, store::Preload::kLayerwise, -1, false, PolicyKind::kSchedulerAware, true, false},
      {"ssd", true, false, store::Preload::kLayerwise, -1, true, PolicyKind::kLru, true, false},
      {"ssd+prefetch", true, false, store::Preload::kLayerwise, -1, true, PolicyKind::kSchedulerAware, true, false},
      {"recompute", false, false, store::Preload::kSync, 0},
  };
  const std::vector<Config> saving = {
      {"async save", true, false, store::Preload::kLayerwise, -1, false, store::PolicyKind::kSchedulerAware, true},
      {"sync save", true, false, store::Preload::kLayerwise, -1, false, store::PolicyKind::kSchedulerAware, false},
      {"no save", true, false, store::Preload::kLayerwise, -1, false, store::PolicyKind::kSchedulerAware, true, false},
  };

  // One table per section: single jobs report TTFT, queued jobs and saving turns the
  // mean time per job (the last one's end / jobs), each against its base configuration.
  struct Section {
    const char* key;       // --only and the JSON key
    const char* progress;  // stderr label
    std::string title;
    const char* column;    // the value's column and JSON field
    const char* field;
    const char* base;      // configuration the ratios are against
    const char* vs_field;
    int ratio_digits;
    const std::vector<Config>& configs;
    int jobs, answer;
    std::map<std::string, std::vector<double>> runs;
    std::map<std::string, std::pair<double, double>> entered;  // stored KV bytes, enter seconds (all reps)
  };
  std::vector<Section> sections = {
      {"single", "single-job TTFT",
       bench::Fmt("## Single job: TTFT of %d history + %d new tokens (median of %d)", a.history, a.fresh, a.reps), "TTFT ms",
       "ttft_ms", "resident", "vs_resident", 2, single, 1, 1, {}, {}},
      {"queued", "back-to-back jobs",
       bench::Fmt("\n## %d jobs queued back to back: mean time per job (median of %d)", a.jobs, a.reps), "ms per job",
       "ms_per_job", "resident", "vs_resident", 2, queued, a.jobs, 1, {}, {}},
      {"saving", "turn time with saving",
       bench::Fmt("\n## Turn time with saving: %d jobs answering %d tokens each (median of %d)", a.jobs, a.answer, a.reps),
       "ms per turn", "ms_per_turn", "no save", "vs_no_save", 3, saving, a.jobs, a.answer, {}, {}},
  };
  auto wanted = [&](const Section& sec) { return a.only.empty() || a.only == sec.key; };
  auto row_wanted = [&](const Section& sec, const Config& c) {
    return a.configs.empty() || c.name == sec.base || a.configs.count(c.name) != 0;
  };
  for (const std::string& name : a.configs) {  // a name no section has is a typo
    bool known = false;
    for (const Section& sec : sections)
      for (const Config& c : sec.configs) known = known || c.name == name;
    if (!known) flags.UsageError("--configs: no row named '" + name + "'");
  }
  for (int rep = 0; rep < a.reps; ++rep) {
    for (Section& sec : sections) {
      std::fprintf(stderr, "[rep %d/%d] %s\n", rep + 1, a.reps, sec.progress);
      if (!wanted(sec)) continue;
      for (const auto& c : sec.configs) {
        if (!row_wanted(sec, c)) continue;
        const std::vector<JobTimes> t = b.Run(c, sec.jobs, sec.answer, &sec.entered[c.name]);
        double last = 0;
        for (const auto& x : t) last = std::max(last, x.end_ms);
        sec.runs[c.name].push_back(sec.jobs == 1 ? t[0].first_ms : last / sec.jobs);
      }
    }
  }

  nlohmann::json out;
  out["model"] = a.model;
  out["history_tokens"] = a.history;
  out["new_tokens"] = a.fresh;
  out["jobs"] = a.jobs;
  out["answer_tokens"] = a.answer;
  out["reps"] = a.reps;
  out["kv_store_dtype"] = a.kv_store_dtype;
  out["stored_entry_bytes"] = b.entry_bytes();
  if (!a.remote.empty()) {
    out["remote_bytes_per_entry"] = b.remote_bytes_per_put();
    std::printf("remote tier: %llu bytes written per entry\n", static_cast<unsigned long long>(b.remote_bytes_per_put()));
  }
  std::printf("stored entry: %llu bytes (%s rows)\n", static_cast<unsigned long long>(b.entry_bytes()),
              a.kv_store_dtype.c_str());
  if (!a.remote.empty()) out["remote_pause_ms"] = a.remote_pause_ms;
  for (Section& sec : sections) {
    if (!wanted(sec)) continue;
    const double base = bench::Median(sec.runs[sec.base]);
    std::printf("%s\n\n%s", sec.title.c_str(),
                bench::TableHeader({"configuration", sec.column, std::string("vs ") + sec.base}).c_str());
    for (const auto& c : sec.configs) {
      if (!row_wanted(sec, c)) continue;
      const double m = bench::Median(sec.runs[c.name]);
      std::fputs(bench::TableRow({c.name, bench::Fmt("%.1f", m), bench::Fmt("%.*fx", sec.ratio_digits, m / base)}).c_str(),
                 stdout);
      out[sec.key][c.name] = {{sec.field, m}, {sec.vs_field, m / base}, {"runs", sec.runs[c.name]}};
    }
  }
  // Entering: the stored bytes over the time spent entering them (RoPE + copy into the
  // compute buffer). sync and inline enter with the compute threads while nothing else
  // runs; layer-wise, the loader thread shares the cores with the forward it overlaps.
  std::printf("\n## Entering stored KV into the compute buffer (all reps)\n\n%s",
              bench::TableHeader({"section", "configuration", "GB entered", "enter s", "GB/s"}).c_str());
  for (Section& sec : sections) {
    if (!wanted(sec)) continue;
    for (const auto& c : sec.configs) {
      const auto [bytes, secs] = sec.entered[c.name];
      if (bytes <= 0 || secs <= 0) continue;
      std::fputs(bench::TableRow({sec.key, c.name, bench::Fmt("%.2f", bytes / 1e9), bench::Fmt("%.3f", secs),
                                  bench::Fmt("%.1f", bytes / 1e9 / secs)})
                     .c_str(),
                 stdout);
      out[sec.key][c.name]["entered_bytes"] = bytes;
      out[sec.key][c.name]["enter_s"] = secs;
      out[sec.key][c.name]["enter_gbps"] = bytes / 1e9 / secs;
    }
  }
  const std::string line = out.dump();
  std::printf("\n%s\n", line.c_str());
  attic::bench::WriteOutput("store_overlap_bench", a.json, line + "\n");
  return 0;
}
