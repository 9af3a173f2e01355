// store_policy_bench: hit rates of the KV store's eviction policies (scheduler-aware vs
// LRU vs FIFO, paper 001 Fig. 21/23/24 shape) on a synthetic multi-turn trace, driving the
// real KvStore (index, placement, policies, prefetch) with in-memory tiers and small
// payloads, so a long trace runs in seconds.
//
// Trace: sessions arrive as a Poisson process; each has --turns turns; a turn's job
// waits in one FCFS queue served one job per time unit; the next turn of a session
// arrives an exponential think time after its previous turn finished. The job order
// and the queue seen at each job start do not depend on the policy, so every policy
// replays the same trace. At a job start the store gets the waiting queue as its
// look-ahead hint, looks the session up (a hit = the history was found in DRAM or
// SSD), loads it and saves the grown history.
//
// Usage: store_policy_bench [--sessions N] [--turns T] [--tokens-per-turn K]
//          [--rate R] [--think S] [--dram E] [--ssd E] [--seed S] [--json FILE]
// Capacities --dram/--ssd are in mean session-entry sizes (a list: --dram 4,8,16).
// Output: a human table on stdout, then one JSON line (also to --json).
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <deque>
#include <fstream>
#include <queue>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "attic/store/kv_store.h"

using namespace attic;
using namespace attic::store;

namespace {

struct Job {
  int session;
  int turn;  // 0-based
};

struct Trace {
  std::vector<Job> order;                    // service order
  std::vector<std::vector<Job>> queue_at;    // waiting jobs at each service start
  double mean_queue = 0;
};

Trace MakeTrace(int sessions, int turns, double rate, double think, uint32_t seed, int max_view) {
  std::mt19937_64 rng(seed);
  std::exponential_distribution<double> inter(rate), thinking(1.0 / think);
  // Arrival events: (time, job).
  using Ev = std::pair<double, Job>;
  auto cmp = [](const Ev& a, const Ev& b) { return a.first > b.first; };
  std::priority_queue<Ev, std::vector<Ev>, decltype(cmp)> arrivals(cmp);
  double t = 0;
  for (int s = 0; s < sessions; ++s) {
    t += inter(rng);
    arrivals.push({t, {s, 0}});
  }
  Trace tr;
  std::deque<Job> queue;
  double now = 0;
  double queue_sum = 0;
  while (!arrivals.empty() || !queue.empty()) {
    while (!arrivals.empty() && arrivals.top().first <= now) {
      queue.push_back(arrivals.top().second);
      arrivals.pop();
    }
    if (queue.empty()) {
      now = arrivals.top().first;
      continue;
    }
    Job j = queue.front();
    queue.pop_front();
    tr.order.push_back(j);
    std::vector<Job> view(queue.begin(), queue.begin() + std::min<size_t>(queue.size(), max_view));
    queue_sum += queue.size();
    tr.queue_at.push_back(std::move(view));
    now += 1.0;  // service time
    if (j.turn + 1 < turns) arrivals.push({now + thinking(rng), {j.session, j.turn + 1}});
  }
  tr.mean_queue = queue_sum / std::max<size_t>(1, tr.order.size());
  return tr;
}

std::vector<int32_t> Tokens(int session, int n) {
  std::vector<int32_t> t(n);
  for (int i = 0; i < n; ++i) t[i] = session * 100000 + i;
  return t;
}

KvEntry Entry(int session, int n_tokens) {
  KvEntry e;
  e.session_id = "s" + std::to_string(session);
  e.n_layers = 1;
  e.kv_dim = 4;
  e.tokens = Tokens(session, n_tokens);
  e.positions.resize(n_tokens);
  for (int i = 0; i < n_tokens; ++i) e.positions[i] = i;
  e.k.assign(1, std::vector<float>(static_cast<size_t>(n_tokens) * 4, 0.5f));
  e.v = e.k;
  return e;
}

struct Result {
  std::string policy;
  double dram_entries = 0, ssd_entries = 0;
  uint64_t lookups = 0, hits_dram = 0, hits_ssd = 0, prefetches = 0;
  double hit_rate() const { return lookups ? double(hits_dram + hits_ssd) / lookups : 0; }
};

Result Replay(const Trace& tr, PolicyKind policy, uint64_t dram, uint64_t ssd, int tpt) {
  StoreOptions o;
  o.fingerprint = "sim";
  o.policy = policy;
  o.default_ttl_ms = 0;
  o.prefix_block = 64;
  VirtualClock clock;
  auto store = std::move(KvStore::Open(o, std::make_unique<DramTier>(dram, TierLevel::kDram),
                                       ssd > 0 ? std::make_unique<DramTier>(ssd, TierLevel::kSsd) : nullptr, &clock))
                   .value();
  Result r;
  r.policy = PolicyName(policy);
  for (size_t i = 0; i < tr.order.size(); ++i) {
    std::vector<QueuedJob> q;
    q.reserve(tr.queue_at[i].size());
    for (const Job& j : tr.queue_at[i])
      q.push_back({"default", "s" + std::to_string(j.session), Tokens(j.session, (j.turn + 1) * tpt)});
    store->SetLookAhead(q);
    if (policy == PolicyKind::kSchedulerAware) store->Prefetch();
    const Job& j = tr.order[i];
    const int history = j.turn * tpt;
    if (j.turn > 0) {
      ++r.lookups;
      auto m = store->Lookup("default", "s" + std::to_string(j.session), Tokens(j.session, history + tpt));
      if (m && m->n_tokens >= history) {
        (m->tier == TierLevel::kDram ? r.hits_dram : r.hits_ssd)++;
        if (!store->Load(m->key).ok()) std::abort();
      }
    }
    store->Save(Entry(j.session, history + tpt)).IgnoreError();
    clock.Advance(1000);
    StoreStats st = store->Stats();
    if (st.dram_bytes > st.dram_capacity || st.ssd_bytes > st.ssd_capacity) {
      std::fprintf(stderr, "capacity exceeded\n");
      std::abort();
    }
  }
  r.prefetches = store->Stats().prefetches;
  return r;
}

std::vector<double> ParseList(const std::string& s) {
  std::vector<double> v;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, ',')) v.push_back(std::atof(item.c_str()));
  return v;
}

}  // namespace

int main(int argc, char** argv) {
  int sessions = 1000, turns = 8, tpt = 200, max_view = 100000;
  double rate = 0.15, think = 40;
  std::string dram_list = "8,16,32", ssd_list = "0,32,64";
  uint32_t seed = 1;
  std::string json_out;
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string a = argv[i], v = argv[i + 1];
    if (a == "--sessions") sessions = std::atoi(v.c_str());
    else if (a == "--turns") turns = std::atoi(v.c_str());
    else if (a == "--tokens-per-turn") tpt = std::atoi(v.c_str());
    else if (a == "--rate") rate = std::atof(v.c_str());
    else if (a == "--think") think = std::atof(v.c_str());
    else if (a == "--dram") dram_list = v;
    else if (a == "--ssd") ssd_list = v;
    else if (a == "--seed") seed = static_cast<uint32_t>(std::atoi(v.c_str()));
    else if (a == "--json") json_out = v;
    else {
      std::fprintf(stderr, "unknown flag %s\n", a.c_str());
      return 2;
    }
  }
  auto t0 = std::chrono::steady_clock::now();
  Trace tr = MakeTrace(sessions, turns, rate, think, seed, max_view);
  const uint64_t mean_entry = Entry(0, tpt * (turns + 1) / 2).SerializedBytes();
  std::printf("store_policy_bench: %d sessions x %d turns, %d tokens/turn, rate %.3f, think %.0f, mean queue %.1f, "
              "mean entry %llu B\n",
              sessions, turns, tpt, rate, think, tr.mean_queue, static_cast<unsigned long long>(mean_entry));
  std::printf("%-16s %10s %10s %9s %9s %9s %10s\n", "policy", "dram(ent)", "ssd(ent)", "hit%", "dram%", "ssd%",
              "prefetch");
  std::ostringstream js;
  js << "{\"bench\":\"store_policy\",\"sessions\":" << sessions << ",\"turns\":" << turns << ",\"tokens_per_turn\":"
     << tpt << ",\"rate\":" << rate << ",\"think\":" << think << ",\"mean_queue\":" << tr.mean_queue
     << ",\"results\":[";
  bool first = true;
  for (double d : ParseList(dram_list)) {
    for (double s : ParseList(ssd_list)) {
      for (PolicyKind p : {PolicyKind::kSchedulerAware, PolicyKind::kLru, PolicyKind::kFifo}) {
        Result r = Replay(tr, p, static_cast<uint64_t>(d * mean_entry), static_cast<uint64_t>(s * mean_entry), tpt);
        double n = std::max<uint64_t>(1, r.lookups);
        std::printf("%-16s %10.0f %10.0f %8.1f%% %8.1f%% %8.1f%% %10llu\n", r.policy.c_str(), d, s,
                    100 * r.hit_rate(), 100 * r.hits_dram / n, 100 * r.hits_ssd / n,
                    static_cast<unsigned long long>(r.prefetches));
        js << (first ? "" : ",") << "{\"policy\":\"" << r.policy << "\",\"dram_entries\":" << d
           << ",\"ssd_entries\":" << s << ",\"lookups\":" << r.lookups << ",\"hits_dram\":" << r.hits_dram
           << ",\"hits_ssd\":" << r.hits_ssd << ",\"hit_rate\":" << r.hit_rate() << ",\"prefetches\":" << r.prefetches
           << "}";
        first = false;
      }
    }
  }
  double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  js << "],\"seconds\":" << secs << "}";
  std::printf("%s\n", js.str().c_str());
  if (!json_out.empty()) std::ofstream(json_out) << js.str() << "\n";
  return 0;
}
