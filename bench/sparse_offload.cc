// sparse_bench offload: the longest context that decodes with a compute buffer of a given
// size, with PQ offload (pq/offload.h). The compute buffer is --buffer-share of the
// context's KV (in the pool's element type); it holds the pool (the sequence's resident
// blocks and the block cache) and offload's two staging buffers (one layer of every slot,
// while prefill chunks and the first decode step use it; the selected rows of one layer),
// so the pool gets what the staging leaves. Without offload the same pool holds at most
// pool blocks x block size slots: that is the resident-only limit printed.
//
// One sequence of random tokens (or --text) is prefilled in --chunk chunks through the
// offload hooks (its complete blocks go to a DRAM tier, pre-RoPE, in --tier-dtype: a store
// type, f32 by default, and leave the pool), then decodes --warmup + --steps steps,
// teacher-forced. Reported: prefill time, TT2T, the timed steps' mean negative
// log-likelihood of the next token (with --text, what a tier type costs in perplexity),
// TPOT (median of the timed steps), per step the staging and fetch time and the bytes
// fetched from the tier, the peak compute-buffer bytes against the context's KV, and the
// block cache's hit rate -- for the policy that ran (--policy) and, from the same
// selections replayed through a BlockCache of each policy (pq/block_cache.h), LRU and LFU,
// at the size that ran and at each size of --replay-blocks.
#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>

#include <nlohmann/json.hpp>

#include "attic/eval/metrics.h"
#include "attic/pq/block_cache.h"
#include "attic/pq/offload.h"
#include "attic/store/tier.h"
#include "bench/common/format.h"
#include "bench/common/measure.h"
#include "bench/common/output.h"
#include "bench/common/stats.h"
#include "bench/sparse_bench.h"

using namespace attic;
using namespace attic::engine;
using bench::Fmt;

namespace sparse_bench {

int RunOffload(int argc, char** argv) {
  Common c;
  c.chunk = 1024;
  int context = 65536, steps = 16, warmup = 2, cache_blocks = -1;
  double share = 0.125;
  std::string method_flag = "pq-0.1", policy_flag = "lru", text, replay_flag = "8,16,32,64,128", tier_flag = "f32";
  int block_size = kv::kDefaultBlockSize;
  bench::FlagParser flags(std::string(kProgram) + " offload",
                          "--model PATH [--context 65536] [--buffer-share 0.125] [--method pq-0.1] [--cache-blocks N] "
                          "[--policy lru|lfu] [--steps 16] [--warmup 2] [--text FILE] [--replay-blocks 8,16,32,64,128] "
                          "[--tier-dtype f32|f16|q8_0|q4_0|q8_0/q4_0|kivi4] [--block-size 128]");
  AddCommonFlags(flags, &c);
  flags.Int("--context", &context);
  flags.Double("--buffer-share", &share);
  flags.String("--method", &method_flag);
  flags.Int("--cache-blocks", &cache_blocks);
  flags.String("--policy", &policy_flag);
  flags.Int("--steps", &steps);
  flags.Int("--warmup", &warmup);
  flags.String("--text", &text);
  flags.String("--replay-blocks", &replay_flag);
  flags.String("--tier-dtype", &tier_flag);
  flags.Int("--block-size", &block_size);
  flags.ParseOrExit(argc - 1, argv + 1);
  std::vector<int> replay_blocks = ParseIntList(replay_flag);
  auto parsed = pq::ParseSparseOptions(method_flag);
  if (c.model.empty() || context < 256 || steps < 1 || warmup < 1 || !(share > 0 && share <= 1))
    flags.UsageError("--model is required; --context >= 256, --steps >= 1, --warmup >= 1, 0 < --buffer-share <= 1");
  if (!parsed.ok()) flags.UsageError("--method: " + parsed.status().message());
  if (policy_flag != "lru" && policy_flag != "lfu") flags.UsageError("--policy must be lru or lfu");
  store::KvDtype tier_dtype;
  if (!store::ParseKvDtype(tier_flag, &tier_dtype))
    flags.UsageError("--tier-dtype must be " + store::KvDtypeChoices() + ", not '" + tier_flag + "'");
  if (block_size < 1) flags.UsageError("--block-size must be >= 1");
  c.block_size = block_size;
  const pq::CachePolicy policy = policy_flag == "lru" ? pq::CachePolicy::kLru : pq::CachePolicy::kLfu;
  bench::CheckOutput(kProgram, c.json);
  const std::string load_start = bench::LoadAverage();
  const int total = context + warmup + steps;

  // The compute buffer: what the pool gets after the staging buffers.
  int64_t kv_bytes = 0, budget_bytes = 0, staging_bytes = 0, pool_blocks = 0, tail_blocks = 0;
  auto engine = LoadEngine(c, total, 1, [&](const kv::KvShape& shape, int n_layers) -> int64_t {
    const int bs = shape.block_size;
    const int64_t kv_blocks = (total + bs - 1) / bs;
    kv_bytes = kv_blocks * shape.block_bytes();
    budget_bytes = static_cast<int64_t>(share * static_cast<double>(kv_bytes));
    const pq::Budget b = pq::SplitBudget(*parsed, total);
    const int64_t selected_blocks = (b.initial + b.local + b.top + bs - 1) / bs;
    staging_bytes = (kv_blocks + selected_blocks) * shape.block_bytes() / n_layers;
    pool_blocks = (budget_bytes - staging_bytes) / shape.block_bytes();
    // First block, the local window and the block before it, the block being written,
    // and a prefill chunk's blocks before they leave.
    tail_blocks = 1 + (b.local + bs - 1) / bs + 2 + (c.chunk + bs - 1) / bs;
    if (cache_blocks < 0) cache_blocks = static_cast<int>(std::max<int64_t>(0, pool_blocks - tail_blocks));
    if (pool_blocks < tail_blocks + cache_blocks)
      Die(Fmt("a compute buffer of %.1f MiB leaves %lld pool blocks; the sequence's tail needs %lld and the cache %d",
              budget_bytes / 1048576.0, static_cast<long long>(pool_blocks), static_cast<long long>(tail_blocks),
              cache_blocks));
    return pool_blocks;
  });
  const auto& cfg = engine->model().config();
  Status vst = parsed->Validate(cfg.head_dim);
  if (!vst.ok()) Die(vst.ToString());
  const kv::KvShape& shape = engine->kv_pool().shape();
  // One more than the steps feed: the last timed step's next token.
  const std::vector<int32_t> tokens = BenchTokens(*engine, text, total + 1, c.seed);

  store::DramTier tier(static_cast<uint64_t>(pq::OffloadTierBytes(shape, total, tier_dtype)) + (uint64_t{1} << 20));
  const attention::RopeTable rope(cfg);
  kv::SequenceKv seq(&engine->kv_pool());
  pq::OffloadOptions oo;
  oo.cache_blocks = cache_blocks;
  oo.policy = policy;
  oo.tier_dtype = tier_dtype;
  auto made = pq::MakeOffloadedSparseAttention(
      pq::MakeSparseAttention(*parsed, AttentionShapeOf(cfg), cfg.n_layers, engine->threads()), oo, &seq, rope, &tier,
      cfg.n_layers, engine->threads());
  if (!made.ok()) Die(made.status().ToString());
  pq::OffloadedSparseAttention& off = **made;

  std::fprintf(stderr, "context %d, compute buffer %.1f MiB of %.1f MiB KV (%d pool blocks, cache %d):\n", context,
               budget_bytes / 1048576.0, kv_bytes / 1048576.0, engine->kv_pool().n_blocks(), cache_blocks);
  const double p0 = bench::NowSeconds();
  Prefill(*engine, &seq, tokens, context, &off);
  const double prefill_s = bench::NowSeconds() - p0;

  // Decode, recording each step's selected slots of released blocks for the replay.
  // replay[capacity][policy][layer * n_kv_heads + head]; capacity 0 is the cache that ran.
  const pq::CachePolicy policies[] = {pq::CachePolicy::kLru, pq::CachePolicy::kLfu};
  replay_blocks.insert(replay_blocks.begin(), cache_blocks);
  std::vector<std::vector<std::vector<pq::BlockCache>>> replay(replay_blocks.size(), std::vector<std::vector<pq::BlockCache>>(2));
  for (size_t ci = 0; ci < replay_blocks.size(); ++ci)
    for (int p = 0; p < 2; ++p)
      for (int i = 0; i < cfg.n_layers * cfg.n_kv_heads; ++i)
        replay[ci][p].emplace_back(replay_blocks[ci], policies[p], shape.block_size);
  std::vector<double> step_s;
  double first_step_s = 0, nll = 0;  // nll: summed over the timed steps
  pq::OffloadStats before;
  std::vector<float> logits;
  std::vector<int32_t> sel;
  std::vector<char> resident;
  for (int i = 0; i < warmup + steps; ++i) {
    if (i == warmup) before = off.offload_stats();
    resident.assign(seq.block_table().size() + 1, 1);
    for (size_t b = 0; b < seq.block_table().size(); ++b) resident[b] = seq.resident(static_cast<int>(b));
    std::vector<BatchEntry> batch(1);
    batch[0].seq = &seq;
    batch[0].tokens = {tokens[context + i]};
    const double t0 = bench::NowSeconds();
    Status st = engine->transformer().Forward(batch, &logits, &off);
    const double dt = bench::NowSeconds() - t0;
    if (!st.ok()) Die("decode: " + st.ToString());
    if (i == 0) first_step_s = dt;
    if (i >= warmup) {
      step_s.push_back(dt);
      nll += eval::NegLogLikelihood(logits.data(), static_cast<int>(logits.size()), tokens[context + i + 1]);
    }
    for (int l = 0; l < cfg.n_layers; ++l) {
      for (int h = 0; h < cfg.n_kv_heads; ++h) {
        sel.clear();
        for (int32_t s : off.last_selection(l, h))
          if (!resident[s / shape.block_size]) sel.push_back(s);
        for (auto& per_capacity : replay)
          for (auto& r : per_capacity) r[l * cfg.n_kv_heads + h].Access(sel.data(), static_cast<int>(sel.size()));
      }
    }
    std::fprintf(stderr, "\r  step %d / %d", i + 1, warmup + steps);
  }
  std::fprintf(stderr, "\n");
  const pq::OffloadStats& s = off.offload_stats();
  const double n_steps = steps;
  std::vector<std::array<double, 2>> replay_rate(replay_blocks.size());
  for (size_t ci = 0; ci < replay_blocks.size(); ++ci) {
    for (int p = 0; p < 2; ++p) {
      int64_t hits = 0, misses = 0;
      for (const auto& cache : replay[ci][p]) {
        hits += cache.stats().token_hits;
        misses += cache.stats().token_misses;
      }
      replay_rate[ci][p] = hits + misses > 0 ? static_cast<double>(hits) / (hits + misses) : 0;
    }
  }
  const double tpot = bench::Median(step_s);
  const int64_t resident_limit = static_cast<int64_t>(engine->kv_pool().n_blocks()) * shape.block_size;

  std::printf("# sparse_bench offload: %s, %s KV, context %d (%s), %s, %d pool blocks + staging; CPU %s\n\n",
              c.model.c_str(), c.kv_dtype.c_str(), context, text.empty() ? "random tokens" : text.c_str(),
              parsed->ToString().c_str(), engine->kv_pool().n_blocks(), bench::CpuName().c_str());
  std::printf("%s", bench::TableHeader({"quantity", "value"}).c_str());
  auto row = [](const std::string& k, const std::string& v) { std::printf("%s", bench::TableRow({k, v}).c_str()); };
  row("context (slots)", std::to_string(context));
  row("KV of the context", Fmt("%.1f MiB", kv_bytes / 1048576.0));
  row("compute buffer (budget)", Fmt("%.1f MiB (%.3f of the KV)", budget_bytes / 1048576.0, share));
  row("compute buffer (peak held)", Fmt("%.1f MiB (%.3f of the KV)", s.peak_buffer_bytes / 1048576.0,
                                        static_cast<double>(s.peak_buffer_bytes) / kv_bytes));
  row("resident-only limit with this pool", Fmt("%lld slots", static_cast<long long>(resident_limit)));
  row("blocks in the tier / resident at the end", Fmt("%lld / %d", static_cast<long long>(s.offloaded_blocks),
                                                      seq.n_resident_blocks()));
  row("tier bytes (" + tier_flag + ")", Fmt("%.1f MiB", s.backing_bytes / 1048576.0));
  row("prefill", Fmt("%.1f s", prefill_s));
  row("TT2T (prefill + first step)", Fmt("%.1f s", prefill_s + first_step_s));
  row("TPOT (median)", Fmt("%.1f ms", tpot * 1e3));
  row("next-token NLL (timed steps, mean)", Fmt("%.4f (perplexity %.3f)", nll / n_steps, std::exp(nll / n_steps)));
  row("staging per step (fetches included)", Fmt("%.1f ms", (s.stage_seconds - before.stage_seconds) / n_steps * 1e3));
  row("fetch per step", Fmt("%.1f ms", (s.fetch_seconds - before.fetch_seconds) / n_steps * 1e3));
  row("fetched per step", Fmt("%.2f MiB", (s.fetched_bytes - before.fetched_bytes) / n_steps / 1048576.0));
  row("cache blocks per layer and KV head", Fmt("%d (%.3f of the context)", cache_blocks,
                                                static_cast<double>(cache_blocks) * shape.block_size / context));
  row("hit rate, " + policy_flag + " (ran)", Fmt("%.3f", s.hit_rate()));
  row("hit rate, LRU (replayed)", Fmt("%.3f", replay_rate[0][0]));
  row("hit rate, LFU (replayed)", Fmt("%.3f", replay_rate[0][1]));
  row("tier errors", std::to_string(s.backing_errors));
  std::printf("\nThe same selections replayed through caches of other sizes (blocks per layer and KV head):\n\n%s",
              bench::TableHeader({"cache blocks", "share of context", "LRU hit rate", "LFU hit rate"}).c_str());
  nlohmann::json replay_json = nlohmann::json::array();
  for (size_t ci = 1; ci < replay_blocks.size(); ++ci) {
    std::printf("%s", bench::TableRow({std::to_string(replay_blocks[ci]),
                                       Fmt("%.3f", static_cast<double>(replay_blocks[ci]) * shape.block_size / context),
                                       Fmt("%.3f", replay_rate[ci][0]), Fmt("%.3f", replay_rate[ci][1])})
                          .c_str());
    replay_json.push_back({{"blocks", replay_blocks[ci]}, {"lru", replay_rate[ci][0]}, {"lfu", replay_rate[ci][1]}});
  }

  nlohmann::json out;
  out["program"] = std::string(kProgram) + " offload";
  out["model"] = c.model;
  out["cpu"] = bench::CpuName();
  out["kv_dtype"] = c.kv_dtype;
  out["threads"] = c.threads;
  out["context"] = context;
  out["text"] = text;
  out["method"] = parsed->ToString();
  out["chunk"] = c.chunk;
  out["steps"] = steps;
  out["warmup"] = warmup;
  out["kv_bytes"] = kv_bytes;
  out["buffer_share"] = share;
  out["buffer_budget_bytes"] = budget_bytes;
  out["staging_allowance_bytes"] = staging_bytes;
  out["pool_blocks"] = engine->kv_pool().n_blocks();
  out["block_bytes"] = shape.block_bytes();
  out["peak_buffer_bytes"] = s.peak_buffer_bytes;
  out["peak_buffer_share"] = static_cast<double>(s.peak_buffer_bytes) / kv_bytes;
  out["resident_only_limit_slots"] = resident_limit;
  out["offloaded_blocks"] = s.offloaded_blocks;
  out["resident_blocks_end"] = seq.n_resident_blocks();
  out["tier_bytes"] = s.backing_bytes;
  out["tier_dtype"] = tier_flag;
  out["block_size"] = shape.block_size;
  out["nll_mean"] = nll / n_steps;
  out["prefill_s"] = prefill_s;
  out["first_step_s"] = first_step_s;
  out["tt2t_s"] = prefill_s + first_step_s;
  out["step_s"] = step_s;
  out["tpot_s"] = tpot;
  out["stage_s_per_step"] = (s.stage_seconds - before.stage_seconds) / n_steps;
  out["fetch_s_per_step"] = (s.fetch_seconds - before.fetch_seconds) / n_steps;
  out["fetched_bytes_per_step"] = (s.fetched_bytes - before.fetched_bytes) / n_steps;
  out["cache_blocks"] = cache_blocks;
  out["policy"] = policy_flag;
  out["hit_rate"] = s.hit_rate();
  out["hit_rate_replayed"] = {{"lru", replay_rate[0][0]}, {"lfu", replay_rate[0][1]}};
  out["replay"] = replay_json;
  out["tier_errors"] = s.backing_errors;
  out["load_average"] = {load_start, bench::LoadAverage()};
  std::printf("\nCPU %s; load average %s at the start, %s at the end\n", bench::CpuName().c_str(), load_start.c_str(),
              bench::LoadAverage().c_str());
  const std::string line = out.dump();
  std::printf("\n%s\n", line.c_str());
  bench::WriteOutput(kProgram, c.json, line + "\n");
  return 0;
}

}  // namespace sparse_bench
