// store_policy_bench: hit rates of the KV store's placement policies -- scheduler-aware
// (CA) vs LRU vs FIFO -- in the shape of paper 001 Fig. 21 (hit rate vs DRAM), Fig. 23
// (vs SSD) and Fig. 24 (compute buffer only / +DRAM / +DRAM+SSD), on a synthetic
// ShareGPT-like multi-turn trace. It drives the real KvStore (index, placement,
// policies, prefetch, promotion) with in-memory tiers, a virtual clock and tiny
// payloads whose byte sizes are proportional to the KV they stand for, so the whole
// run takes seconds.
//
// Workload (paper section 4.1/4.2, docs/store.md "Policy benchmark"):
//  - sessions arrive as a Poisson process; 9K sessions in the paper;
//  - turns per session: 27% single-turn, the rest 2 + geometric, mean 5.75 (ShareGPT);
//  - tokens per turn (prompt + answer): exponential around a per-session mean that is
//    lognormal (sigma 0.6, mean 650), which reproduces the ShareGPT session lengths the
//    paper quotes (47% of sessions > 2K tokens, 30% > 4K);
//  - a 4K context (LLaMA-2-13B) truncated by 2K tokens on overflow (ratio 0.5); with
//    decoupled positional encoding (paper 3.4) the stored KV stays valid, so a hit is
//    simply "the session's entry is still in the store";
//  - one FCFS queue served one job per time unit; a session's next turn joins the
//    queue when its previous turn finishes (--think adds an exponential think time).
//    The job order does not depend on the policy: every policy replays the same trace.
//    Before a job starts (while the previous one runs) the store gets the waiting queue,
//    that job first (SetLookAhead, as the server's scheduler does after admitting), the
//    scheduler-aware policy prefetches; then the job looks its session up, loads it on a
//    hit and saves the grown history. Prefetch is instantaneous here (no I/O timing).
//
// Capacity mapping ("analogous to 128 GB DRAM / 2 TB SSD"; derivation in docs/store.md):
// the paper serves LLaMA-13B (0.78 MB of KV per token, 4K context) on 2 A100s at about
// 1.87 turns/s (6.25 h of GPU time for the ~42K measured turns, Fig. 25d, read as the
// serving time) while sessions arrive at 1/s, so a time unit here is 1/1.87 s and
// sessions arrive at 0.535 per unit: the queue backs up to ~2.8K waiting jobs on average
// (consistent with Fig. 24's DRAM-only hit rates, ~ DRAM entries / backlog for all four
// models). Capacities are given in the paper's GB and converted to tokens at 0.78
// MB/token (a mean looked-up entry is ~2.0K tokens = 1.6 GB: 128 GB ~ 80 entries, 2 TB
// ~ 1.25K). Everything is scaled down by --scale (default 6: 1500 sessions, capacities
// / 6), which keeps the ratios capacity : backlog : session size of the paper's setting.
// The first 10/52 of the jobs warm the store up and are not counted (the paper warms up
// with 10K of 52K turns).
//
// Usage: store_policy_bench                      the three tables (Fig. 21, 23, 24)
//        store_policy_bench --dram GB[,GB..] --ssd GB[,GB..]   one custom grid
//   [--sessions N] [--scale K] [--rate R (sessions per job time)] [--think T (job times)]
//   [--turns T (fixed; 0 = ShareGPT)] [--turn-tokens N] [--context N]
//   [--kv-mb-per-token X] [--view N (waiting jobs shown to the store; 0 = all)]
//   [--seed S] [--json FILE]
// Output: markdown tables on stdout, then one JSON line (also written to --json).
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <queue>
#include <random>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

#include "attic/store/kv_store.h"
#include "bench/common/flags.h"
#include "bench/common/format.h"
#include "bench/common/output.h"

using namespace attic;
using namespace attic::store;
using attic::bench::Fmt;
using attic::bench::TableHeader;
using attic::bench::TableRow;

namespace {

// Payload: one bench token stands for a 64-token block of KV; an entry has 1 layer with
// kv_dim 256 (2 KiB of K+V per bench token). The entry's 4096-byte header stands in for
// its first 2 blocks, so an entry of c real tokens serializes to ~32 B per real token
// (rounded up to a block), proportional to the c x 0.78 MB it models.
constexpr int kBlock = 64;
constexpr int kKvDim = 256;
constexpr int kHeaderBlocks = 2;
constexpr double kBenchBytesPerToken = 2.0 * kKvDim * sizeof(float) / kBlock;

struct Params {
  int sessions = 0;          // 0 = 9000 / scale
  double scale = 6;
  double rate = 1.0 / 1.87;  // sessions per job-service time
  double think = 0;          // mean think time in job-service times
  int fixed_turns = 0;       // 0 = ShareGPT-like distribution
  double turn_tokens = 650;  // mean new tokens (prompt + answer) per turn
  double session_sigma = 0.6;
  int context = 4096;
  int truncate = 2048;
  double kv_mb_per_token = 0.78;  // LLaMA-13B (paper 4.2)
  double warmup = 10.0 / 52;
  int view = 0;  // queued jobs shown to the store; 0 = the whole queue
  uint32_t seed = 1;
};

// One turn of one session, as the store sees it.
struct Job {
  int session = 0;
  int turn = 0;
  int history = 0;       // real tokens of stored context the turn can reuse (0 on turn 0)
  int user = 0;          // new prompt tokens of this turn
  QueuedJob query;       // what the scheduler shows / looks up
  int save_start = 0;    // first bench token of the context saved after the turn
  int save_tokens = 0;   // bench tokens of that entry
};

struct Trace {
  std::vector<Job> order;        // service order
  std::vector<uint32_t> queued;  // waiting jobs at each service start (= the next ones in order)
  double mean_queue = 0, mean_entry_tokens = 0;
  size_t max_queue = 0;
  int sessions = 0;
};

int BenchTokens(int context) {
  int blocks = (context + kBlock - 1) / kBlock;
  return std::max(1, blocks - kHeaderBlocks);
}

std::vector<int32_t> Ids(int session, int first, int n) {
  std::vector<int32_t> t(n);
  for (int i = 0; i < n; ++i) t[i] = session * 65536 + first + i;
  return t;
}

Trace MakeTrace(const Params& p) {
  const int n_sessions = p.sessions > 0 ? p.sessions : static_cast<int>(std::lround(9000 / p.scale));
  std::mt19937_64 rng(p.seed);
  std::exponential_distribution<double> inter(p.rate);
  std::uniform_real_distribution<double> uni(0, 1);
  std::geometric_distribution<int> extra(1 / 6.5);  // multi-turn: 2 + geometric, mean 7.5
  const double sigma = p.session_sigma;
  std::lognormal_distribution<double> session_mean(std::log(p.turn_tokens) - sigma * sigma / 2, sigma);

  // Per session: its turns with sizes (contexts evolve turn by turn, independent of timing).
  std::vector<std::vector<Job>> turns(n_sessions);
  std::vector<double> arrival(n_sessions);
  double t = 0;
  for (int s = 0; s < n_sessions; ++s) {
    t += inter(rng);
    arrival[s] = t;
    int n = p.fixed_turns > 0 ? p.fixed_turns : (uni(rng) < 0.27 ? 1 : 2 + extra(rng));
    std::exponential_distribution<double> turn_len(1 / session_mean(rng));
    int context = 0, start = 0;  // real tokens kept; absolute index of the first kept one
    const std::string sid = "s" + std::to_string(s);
    for (int k = 0; k < n; ++k) {
      Job j;
      j.session = s;
      j.turn = k;
      j.history = context;
      int added = std::max(2, static_cast<int>(std::lround(turn_len(rng))));
      j.user = std::max(1, added / 3);  // ShareGPT: prompts ~1/3 of a turn's tokens
      // Looked up with the previous entry's tokens plus new ones (KV of a truncated
      // context re-enters at new positions: the entry stays valid, paper 3.4).
      int prev_first = start / kBlock, prev_n = k == 0 ? 0 : BenchTokens(context);
      std::vector<int32_t> q = k == 0 ? Ids(s, 60000, 4) : Ids(s, prev_first, prev_n + 4);
      j.query = {"default", sid, std::move(q)};
      context += added;
      while (context > p.context) {
        context -= p.truncate;
        start += p.truncate;
      }
      context = std::max(context, 1);
      j.save_start = start / kBlock;
      j.save_tokens = BenchTokens(context);
      turns[s].push_back(std::move(j));
    }
  }

  // FCFS queue, one job per time unit.
  using Ev = std::tuple<double, uint64_t, int, int>;  // time, tie-break, session, turn
  std::priority_queue<Ev, std::vector<Ev>, std::greater<Ev>> arrivals;
  uint64_t seq = 0;
  for (int s = 0; s < n_sessions; ++s) arrivals.push({arrival[s], seq++, s, 0});
  std::exponential_distribution<double> thinking(p.think > 0 ? 1 / p.think : 1);
  Trace tr;
  tr.sessions = n_sessions;
  std::vector<std::pair<int, int>> queue;  // FIFO as a vector + head index
  size_t head = 0;
  double now = 0, queue_sum = 0, tokens_sum = 0;
  uint64_t entries = 0;
  while (!arrivals.empty() || head < queue.size()) {
    while (!arrivals.empty() && std::get<0>(arrivals.top()) <= now) {
      queue.push_back({std::get<2>(arrivals.top()), std::get<3>(arrivals.top())});
      arrivals.pop();
    }
    if (head == queue.size()) {
      now = std::get<0>(arrivals.top());
      continue;
    }
    auto [s, k] = queue[head++];
    tr.queued.push_back(static_cast<uint32_t>(queue.size() - head));
    queue_sum += static_cast<double>(queue.size() - head);
    tr.max_queue = std::max(tr.max_queue, queue.size() - head);
    Job& j = turns[s][k];
    if (k > 0) {
      tokens_sum += j.history;
      ++entries;
    }
    tr.order.push_back(std::move(j));
    now += 1.0;
    if (k + 1 < static_cast<int>(turns[s].size()))
      arrivals.push({now + (p.think > 0 ? thinking(rng) : 0.0), seq++, s, k + 1});
  }
  // The waiting jobs at a service start are exactly the next ones in service order
  // (FCFS), but a job that arrives later cannot be seen earlier: queued[i] counts only
  // jobs already waiting, which are the next queued[i] in order.
  tr.mean_queue = queue_sum / std::max<size_t>(1, tr.order.size());
  tr.mean_entry_tokens = tokens_sum / std::max<uint64_t>(1, entries);
  return tr;
}

KvEntry Entry(const Job& j) {
  KvEntry e;
  e.session_id = j.query.session_id;
  e.n_layers = 1;
  e.kv_dim = kKvDim;
  e.tokens = Ids(j.session, j.save_start, j.save_tokens);
  e.positions.resize(e.tokens.size());
  for (size_t i = 0; i < e.positions.size(); ++i) e.positions[i] = static_cast<int32_t>(i);
  e.k.assign(1, std::vector<float>(e.tokens.size() * kKvDim, 0.5f));
  e.v = e.k;
  return e;
}

struct Result {
  std::string policy;
  double dram_gb = 0, ssd_gb = 0;
  uint64_t lookups = 0, hits_dram = 0, hits_ssd = 0;
  uint64_t prompt_tokens = 0, reused_tokens = 0;
  uint64_t prefetches = 0, prefetches_useful = 0;
  double hit_rate() const { return lookups ? double(hits_dram + hits_ssd) / lookups : 0; }
  double reuse() const { return prompt_tokens ? double(reused_tokens) / prompt_tokens : 0; }
};

// Paper GB -> bytes of this bench's payload.
uint64_t BenchBytes(double gb, const Params& p) {
  double tokens = gb * 1e9 / (p.kv_mb_per_token * 1e6) / p.scale;
  return static_cast<uint64_t>(tokens * kBenchBytesPerToken);
}

Result Replay(const Trace& tr, const Params& p, PolicyKind policy, double dram_gb, double ssd_gb) {
  StoreOptions o;
  o.fingerprint = "sim";
  o.policy = policy;
  o.default_ttl_ms = 0;
  o.prefix_block = 64;
  o.write_buffer_bytes = 0;
  VirtualClock clock;
  const uint64_t ssd = BenchBytes(ssd_gb, p);
  auto store = std::move(KvStore::Open(o, std::make_unique<DramTier>(BenchBytes(dram_gb, p), TierLevel::kDram),
                                       ssd > 0 ? std::make_unique<DramTier>(ssd, TierLevel::kSsd) : nullptr, &clock))
                   .value();
  Result r;
  r.policy = PolicyName(policy);
  r.dram_gb = dram_gb;
  r.ssd_gb = ssd_gb;
  const size_t warm = static_cast<size_t>(p.warmup * tr.order.size());
  for (size_t i = 0; i < tr.order.size(); ++i) {
    // The store sees the waiting queue while the previous job runs: job i (about to be
    // admitted) first, then those queued behind it (paper Fig. 9: while Job 1 executes,
    // the window covers Jobs 2, 3, ...).
    size_t n = policy == PolicyKind::kSchedulerAware ? 1 + tr.queued[i] : 0;
    if (p.view > 0) n = std::min<size_t>(n, p.view);
    std::vector<QueuedJob> q;
    q.reserve(n);
    for (size_t k = i; k < i + n; ++k) q.push_back(tr.order[k].query);
    // LRU and FIFO ignore the hint: skip building it (it is most of the run time).
    if (policy == PolicyKind::kSchedulerAware) {
      store->SetLookAhead(std::move(q));
      store->Prefetch();
    }
    const Job& j = tr.order[i];
    const bool measured = i >= warm;
    if (measured) r.prompt_tokens += j.history + j.user;
    if (j.turn > 0) {
      auto m = store->Lookup("default", j.query.session_id, j.query.tokens);
      bool hit = m && m->n_tokens == m->entry_tokens;
      if (hit && !store->Load(m->key).ok()) std::abort();
      if (measured) {
        ++r.lookups;
        if (hit) {
          (m->tier == TierLevel::kDram ? r.hits_dram : r.hits_ssd)++;
          r.reused_tokens += j.history;
        }
      }
    }
    store->Save(Entry(j)).IgnoreError();
    clock.Advance(535);
    StoreStats st = store->Stats();
    if (st.dram_bytes > st.dram_capacity || st.ssd_bytes > st.ssd_capacity) {
      std::fprintf(stderr, "capacity exceeded\n");
      std::abort();
    }
  }
  StoreStats st = store->Stats();
  r.prefetches = st.prefetches;
  r.prefetches_useful = st.prefetches_useful;
  return r;
}

std::string Gb(double gb) {
  if (gb == 0) return "0";
  return gb >= 1000 ? Fmt("%gT", gb / 1000) : Fmt("%gG", gb);
}

const PolicyKind kPolicies[] = {PolicyKind::kSchedulerAware, PolicyKind::kLru, PolicyKind::kFifo};

struct Runner {
  const Trace& tr;
  const Params& p;
  std::vector<Result> all;
  std::vector<Result> Run(double dram, double ssd) {  // CA, LRU, FIFO; each setting replayed once
    std::vector<Result> out;
    for (const Result& r : all)
      if (r.dram_gb == dram && r.ssd_gb == ssd) out.push_back(r);
    if (out.size() == 3) return out;
    out.clear();
    for (PolicyKind k : kPolicies) out.push_back(Replay(tr, p, k, dram, ssd));
    all.insert(all.end(), out.begin(), out.end());
    return out;
  }
};

std::string Pct(double x) { return Fmt("%.1f%%", 100 * x); }

// "hit% (dram/ssd)"
std::string Cell(const Result& r) {
  double n = std::max<uint64_t>(1, r.lookups);
  return Fmt("%.1f%% (%.1f/%.1f)", 100 * r.hit_rate(), 100 * r.hits_dram / n, 100 * r.hits_ssd / n);
}

void Row(const std::string& label, const std::vector<Result>& r, const std::string& paper) {
  std::fputs(TableRow({label, Cell(r[0]), Cell(r[1]), Cell(r[2]),
                       Fmt("%+.1f / %+.1f", 100 * (r[0].hit_rate() - r[1].hit_rate()),
                           100 * (r[0].hit_rate() - r[2].hit_rate())),
                       paper})
                 .c_str(),
             stdout);
}

void Header(const char* first) {
  std::fputs(TableHeader({first, "scheduler-aware", "LRU", "FIFO", "CA - LRU / CA - FIFO (points)",
                          "paper (CA / LRU / FIFO)"})
                 .c_str(),
             stdout);
}

}  // namespace

int main(int argc, char** argv) {
  Params p;
  std::vector<double> dram_list, ssd_list;
  std::string json_out;
  attic::bench::FlagParser flags(
      "store_policy_bench",
      "[--dram GB[,GB..] --ssd GB[,GB..]] [--sessions N] [--scale K] [--rate R] [--think T] [--turns T]\n"
      "         [--turn-tokens N] [--context N] [--kv-mb-per-token X] [--view N] [--seed S] [--json FILE]");
  flags.Int("--sessions", &p.sessions);
  flags.Double("--scale", &p.scale);
  flags.Double("--rate", &p.rate);
  flags.Double("--think", &p.think);
  flags.Int("--turns", &p.fixed_turns);
  flags.Double("--turn-tokens", &p.turn_tokens);
  flags.Custom("--context", [&](const std::string& v) -> Status {  // truncated by half of it
    StatusOr<int> x = attic::bench::ParseInt(v);
    if (!x.ok()) return x.status();
    p.context = *x;
    p.truncate = *x / 2;
    return OkStatus();
  });
  flags.Double("--kv-mb-per-token", &p.kv_mb_per_token);
  flags.Int("--view", &p.view);
  flags.DoubleList("--dram", &dram_list);
  flags.DoubleList("--ssd", &ssd_list);
  flags.Custom("--seed", [&](const std::string& v) -> Status {
    StatusOr<int> x = attic::bench::ParseInt(v);
    if (!x.ok()) return x.status();
    p.seed = static_cast<uint32_t>(*x);
    return OkStatus();
  });
  flags.String("--json", &json_out);
  flags.ParseOrExit(argc, argv);
  attic::bench::CheckOutput("store_policy_bench", json_out);
  auto t0 = std::chrono::steady_clock::now();
  Trace tr = MakeTrace(p);
  const double entry_gb = tr.mean_entry_tokens * p.kv_mb_per_token / 1000;
  std::printf("store_policy_bench: %d sessions (paper 9000 / scale %g), %zu jobs, rate %.3f sessions/job, think %g, "
              "queue mean %.0f / peak %zu jobs (x scale = %.0f / %.0f), mean looked-up entry %.0f tokens = %.2f GB at "
              "%.2f MB/token\n",
              tr.sessions, p.scale, tr.order.size(), p.rate, p.think, tr.mean_queue, tr.max_queue,
              tr.mean_queue * p.scale, tr.max_queue * p.scale,
              tr.mean_entry_tokens, entry_gb, p.kv_mb_per_token);
  std::printf("capacities in the paper's GB (LLaMA-13B KV), scaled by 1/%g; cells: hit rate of returning turns "
              "(DRAM / SSD hits), after warm-up\n\n",
              p.scale);
  Runner run{tr, p, {}};
  if (!dram_list.empty() || !ssd_list.empty()) {
    if (dram_list.empty()) dram_list = {128};
    if (ssd_list.empty()) ssd_list = {2000};
    Header("DRAM / SSD");
    for (double d : dram_list)
      for (double s : ssd_list) Row(Gb(d) + " / " + Gb(s), run.Run(d, s), "");
  } else {
    std::printf("Fig. 21-style: hit rate vs DRAM capacity, SSD 2 TB\n\n");
    Header("DRAM / SSD");
    for (double d : {32.0, 64.0, 128.0, 256.0, 512.0})
      Row(Gb(d) + " / 2T", run.Run(d, 2000), d == 128 ? "~40 / 12.9 / 9.5" : "");
    std::printf("\nFig. 23-style: hit rate vs SSD capacity, DRAM 128 GB\n\n");
    Header("DRAM / SSD");
    for (double s : {500.0, 1000.0, 2000.0, 3000.0, 5000.0, 10000.0})
      Row("128G / " + Gb(s), run.Run(128, s), s == 10000 ? "86 / 58 / 48" : s == 2000 ? "~40 / 12.9 / 9.5" : "");
    std::printf("\nFig. 24-style: caching media (compute buffer = the paper's 10 GB HBM cache); "
                "reuse = prompt tokens whose KV needed no recompute\n\n");
    std::fputs(TableHeader({"media", "capacity", "CA hit", "LRU hit", "FIFO hit", "CA reuse", "LRU reuse", "FIFO reuse",
                            "paper CA hit"})
                   .c_str(),
               stdout);
    std::fputs(TableRow({"no store", "0", Pct(0), Pct(0), Pct(0), Pct(0), Pct(0), Pct(0), "0"}).c_str(), stdout);
    struct M {
      const char* name;
      double dram, ssd;
      const char* paper;
    };
    for (M m : {M{"compute buffer only", 10, 0, "~0"}, M{"+DRAM", 138, 0, "3.4"}, M{"+DRAM+SSD", 138, 2000, "-"},
                M{"+DRAM+SSD", 138, 10000, "86"}}) {
      auto r = run.Run(m.dram, m.ssd);
      std::fputs(TableRow({m.name, Gb(m.dram) + (m.ssd > 0 ? " + " + Gb(m.ssd) : ""), Pct(r[0].hit_rate()),
                           Pct(r[1].hit_rate()), Pct(r[2].hit_rate()), Pct(r[0].reuse()), Pct(r[1].reuse()),
                           Pct(r[2].reuse()), m.paper})
                     .c_str(),
                 stdout);
    }
  }
  std::printf("\nscheduler-aware prefetches (SSD -> DRAM) found in DRAM by their request:");
  for (const Result& r : run.all)
    if (r.policy == PolicyName(PolicyKind::kSchedulerAware) && r.prefetches > 0)
      std::printf(" %s/%s %.1f%% of %llu;", Gb(r.dram_gb).c_str(), Gb(r.ssd_gb).c_str(),
                  100.0 * r.prefetches_useful / r.prefetches, static_cast<unsigned long long>(r.prefetches));
  std::printf("\n");
  double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::ostringstream js;
  js << "{\"bench\":\"store_policy\",\"sessions\":" << tr.sessions << ",\"scale\":" << p.scale
     << ",\"jobs\":" << tr.order.size() << ",\"rate\":" << p.rate << ",\"think\":" << p.think
     << ",\"mean_queue\":" << tr.mean_queue << ",\"mean_entry_tokens\":" << tr.mean_entry_tokens << ",\"results\":[";
  for (size_t i = 0; i < run.all.size(); ++i) {
    const Result& r = run.all[i];
    js << (i ? "," : "") << "{\"policy\":\"" << r.policy << "\",\"dram_gb\":" << r.dram_gb << ",\"ssd_gb\":" << r.ssd_gb
       << ",\"lookups\":" << r.lookups << ",\"hits_dram\":" << r.hits_dram << ",\"hits_ssd\":" << r.hits_ssd
       << ",\"hit_rate\":" << r.hit_rate() << ",\"reuse\":" << r.reuse() << ",\"prefetches\":" << r.prefetches
       << ",\"prefetches_useful\":" << r.prefetches_useful << "}";
  }
  js << "],\"seconds\":" << secs << "}";
  std::printf("\n%.1f s\n%s\n", secs, js.str().c_str());
  attic::bench::WriteOutput("store_policy_bench", json_out, js.str() + "\n");
  return 0;
}
