// `attic bench`: prefill and decode throughput of the engine, llama-bench style:
// ppN = one prompt of N random tokens from an empty cache; tgN = N single-token decode
// steps after a 512-token prompt. Prints a table and JSON (medians over --reps).
#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <optional>

#include "attic/backend/cpu_features.h"
#include "attic/model/tensor_specs.h"
#include "bench/common/format.h"
#include "bench/common/measure.h"
#include "bench/common/roof.h"
#include "bench/common/stats.h"
#include "cli/commands.h"

namespace attic::cli {

namespace {

struct BenchFlags {
  ModelFlags model;
  std::vector<int> prompt_lengths{512, 2048};
  int n_gen = 128;
  int gen_after = 512;
  int reps = 3;
  std::string json_out;
};

int RunBench(const BenchFlags& f) {
  if (Status st = PrepareOutput(f.json_out, "--json"); !st.ok()) return Fail(st);
  ModelFlags mf = f.model;
  int max_prompt = std::max(f.gen_after + f.n_gen, *std::max_element(f.prompt_lengths.begin(), f.prompt_lengths.end()));
  if (mf.ctx == 0) mf.ctx = max_prompt + 1;
  auto eng = engine::Engine::Load(ToEngineOptions(mf, true));
  if (!eng.ok()) return Fail(eng.status());
  engine::Engine& e = **eng;
  const auto& cfg = e.model().config();
  const int vocab = cfg.vocab_size;
  nlohmann::json out;
  out["model"] = mf.model;
  out["weight_dtype"] = DTypeName(e.model().weight_dtype());
  out["threads"] = e.threads().n_threads();
  out["isa"] = backend::IsaName(backend::ActiveIsa());
  out["batch"] = mf.batch;
  if (const backend::LinearCalibration* cal = e.kernel_calibration()) {
    nlohmann::json timings = nlohmann::json::array();
    for (const auto& t : cal->timings) timings.push_back({{"kernel", t.kernel}, {"m", t.m}, {"us", t.us}});
    out["kernels"] = {{"calibrated", true}, {"gemv", cal->gemv}, {"gemv_max_m", cal->gemv_max_m},
                      {"gemm", cal->isa}, {"prepacked", cal->prepacked}, {"seconds", cal->seconds},
                      {"sample_layers", cal->sample_layers}, {"sample_bytes", cal->sample_bytes},
                      {"timings", timings}};
  } else {
    out["kernels"] = {{"calibrated", false}};
  }
  int64_t n_params = 0;
  for (const model::TensorSpec& t : model::ModelTensorSpecs(cfg)) n_params += t.numel();
  out["params"] = n_params;                        // parameters (a tied lm_head counted once)
  out["weight_bytes"] = e.model().weight_bytes();  // bytes the loaded weights take
  nlohmann::json results = nlohmann::json::array();
  using Clock = std::chrono::steady_clock;
  engine::Session session(e);
  {  // Warm-up, as llama-bench does: first-use costs (GEMM primitive creation, page
     // faults on the mapped weights) are not throughput.
    auto w = session.Prefill(bench::RandomTokens(std::min(64, e.context_length() - 2), 7, 0, vocab));
    if (!w.ok()) return Fail(w.status());
    auto s = session.Step(0);
    if (!s.ok()) return Fail(s.status());
  }

  for (int n : f.prompt_lengths) {
    if (n > e.context_length()) {
      std::fprintf(stderr, "skipping pp%d: longer than the context window (%d)\n", n, e.context_length());
      continue;
    }
    std::vector<double> tps;
    for (int r = 0; r < f.reps; ++r) {
      session.Reset();
      auto prompt = bench::RandomTokens(n, 1000 + r, 0, vocab);
      auto t0 = Clock::now();
      auto logits = session.Prefill(prompt);
      double s = std::chrono::duration<double>(Clock::now() - t0).count();
      if (!logits.ok()) return Fail(logits.status());
      tps.push_back(n / s);
      std::fprintf(stderr, "pp%d rep %d: %.1f tok/s\n", n, r + 1, n / s);
    }
    results.push_back({{"test", "pp" + std::to_string(n)}, {"n_prompt", n}, {"n_gen", 0},
                       {"tokens_per_s", bench::Median(tps)}, {"samples", tps}});
  }
  // The decode runs are bracketed by two measurements of the DRAM read roof, with the
  // bench's threads: this VM's read rate drifts by tens of percent from one minute to the
  // next, so the share is taken of their mean. The first one takes 1 GiB for a moment
  // after the prefill runs: the peak RSS so far is kept and the kernel's reset, so that
  // it does not count (no first measurement where the kernel refuses the reset).
  const bool decode = f.n_gen > 0 && f.gen_after + f.n_gen <= e.context_length();
  double peak_rss = bench::PeakRssMiB();
  std::optional<bench::ReadRoof> roof_before;
  if (decode) {
    roof_before = bench::MeasureReadRoof(e.threads().n_threads());
    if (!bench::ResetPeakRss()) roof_before.reset();
  }
  if (decode) {
    std::vector<double> tps;
    for (int r = 0; r < f.reps; ++r) {
      session.Reset();
      auto prompt = bench::RandomTokens(f.gen_after, 2000 + r, 0, vocab);
      auto logits = session.Prefill(prompt);
      if (!logits.ok()) return Fail(logits.status());
      int32_t tok = engine::Argmax(logits->data(), vocab);
      auto t0 = Clock::now();
      for (int i = 0; i < f.n_gen; ++i) {
        auto l = session.Step(tok);
        if (!l.ok()) return Fail(l.status());
        tok = engine::Argmax(l->data(), vocab);
      }
      double s = std::chrono::duration<double>(Clock::now() - t0).count();
      tps.push_back(f.n_gen / s);
      std::fprintf(stderr, "tg%d@%d rep %d: %.1f tok/s\n", f.n_gen, f.gen_after, r + 1, f.n_gen / s);
    }
    results.push_back({{"test", "tg" + std::to_string(f.n_gen)}, {"n_prompt", f.gen_after}, {"n_gen", f.n_gen},
                       {"tokens_per_s", bench::Median(tps)}, {"samples", tps}});
  }
  out["peak_rss_mib"] = std::max(peak_rss, bench::PeakRssMiB());
  // Decode against the DRAM read roof measured now (after the peak RSS: the measurement
  // takes 1 GiB for a moment), and before the decode runs where that was measured: their
  // mean. Bytes per token: the weights (what the roof share is of), and the KV read at
  // the run's mean context on top.
  bench::ReadRoof roof = bench::MeasureReadRoof(e.threads().n_threads());
  out["read_roof"] = {{"threads", roof.threads}, {"bytes", roof.bytes}, {"passes", roof.passes}};
  out["read_roof"]["gbs_after"] = roof.gbs;
  if (roof_before) {
    out["read_roof"]["gbs_before"] = roof_before->gbs;
    roof.gbs = (roof.gbs + roof_before->gbs) / 2;
  }
  out["read_roof"]["gbs"] = roof.gbs;
  const double kv_elem = DTypeBytes(e.kv_pool().shape().dtype, 1);
  const double weight_bytes = static_cast<double>(e.model().weight_bytes());
  for (auto& r : results) {
    if (r["n_gen"].get<int>() == 0) continue;
    const double tps = r["tokens_per_s"].get<double>();
    const double ctx = r["n_prompt"].get<int>() + r["n_gen"].get<int>() / 2.0;
    const double kv_bytes = 2.0 * cfg.n_layers * cfg.kv_dim() * kv_elem * ctx;
    r["weight_bytes_per_token"] = weight_bytes;
    r["kv_bytes_per_token"] = kv_bytes;
    r["weight_gbs"] = tps * weight_bytes / 1e9;
    r["roof_share"] = roof.gbs > 0 ? tps * weight_bytes / 1e9 / roof.gbs : 0.0;
    r["roof_share_with_kv"] = roof.gbs > 0 ? tps * (weight_bytes + kv_bytes) / 1e9 / roof.gbs : 0.0;
  }
  out["results"] = results;

  std::fputs(bench::TableHeader({"model", "dtype", "test", bench::Fmt("tokens/s (median of %d)", f.reps),
                                  "weights GB/s", "share of the read roof"})
                 .c_str(),
             stdout);
  for (const auto& r : results) {
    const bool tg = r.contains("roof_share");
    std::fputs(bench::TableRow({mf.model, out["weight_dtype"].get<std::string>(), r["test"].get<std::string>(),
                                bench::Fmt("%.1f", r["tokens_per_s"].get<double>()),
                                tg ? bench::Fmt("%.1f", r["weight_gbs"].get<double>()) : "",
                                tg ? bench::Fmt("%.0f%% (%.0f%% with the KV)", 100 * r["roof_share"].get<double>(),
                                                100 * r["roof_share_with_kv"].get<double>())
                                   : ""})
                   .c_str(),
               stdout);
  }
  std::printf("peak RSS: %.0f MiB; DRAM read roof: %.1f GB/s (%d threads, best of %d passes over %.0f MiB%s)\n",
              out["peak_rss_mib"].get<double>(), roof.gbs, roof.threads, roof.passes, roof.bytes / 1048576.0,
              roof_before ? bench::Fmt("; mean of %.1f before and %.1f after the decode runs", roof_before->gbs,
                                       out["read_roof"]["gbs_after"].get<double>())
                                .c_str()
                          : "");
  if (const backend::LinearCalibration* cal = e.kernel_calibration()) std::printf("kernels: %s\n", cal->Summary().c_str());
  std::string js = out.dump(2);
  std::printf("%s\n", js.c_str());
  Status st = WriteOutput(f.json_out, js + "\n", "--json");
  if (!st.ok()) return Fail(st);
  return kExitOk;
}

}  // namespace

void AddBenchCommand(CLI::App& app, RunFn* run) {
  auto* cmd = app.add_subcommand("bench", "prefill and decode tokens/s, peak RSS (table + JSON)");
  auto f = std::make_shared<BenchFlags>();
  AddModelFlags(cmd, &f->model);
  f->model.threads = 2;
  cmd->add_option("-p,--prompt-lengths", f->prompt_lengths, "prompt lengths to prefill")->capture_default_str();
  cmd->add_option("-n,--n-gen", f->n_gen, "tokens to decode (0 = skip)")->capture_default_str();
  cmd->add_option("--gen-after", f->gen_after, "prompt length before decoding")->capture_default_str();
  cmd->add_option("-r,--reps", f->reps, "repetitions (median reported)")->capture_default_str();
  cmd->add_option("--json", f->json_out, "also write the JSON to this file");
  cmd->callback([run, f] { *run = [f] { return RunBench(*f); }; });
}

}  // namespace attic::cli
