// `attic bench`: prefill and decode throughput of the engine, llama-bench style:
// ppN = one prompt of N random tokens from an empty cache; tgN = N single-token decode
// steps after a 512-token prompt. Prints a table and JSON (medians over --reps), and
// where the decode steps' time went, phase by phase, against the DRAM read roof.
#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>

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

// KV bytes one decode step reads over every layer at the decode run's mean context
// (gen_after + n_gen / 2 slots), K and V as stored (q8_0 with its scales).
double KvBytesPerToken(engine::Engine& e, const BenchFlags& f) {
  const auto& cfg = e.model().config();
  const kv::KvShape& kv_shape = e.kv_pool().shape();
  const double kv_elem = DTypeBytes(kv_shape.k_dtype, 1) + DTypeBytes(kv_shape.v_dtype, 1);
  return 1.0 * cfg.n_layers * cfg.kv_dim() * kv_elem * (f.gen_after + f.n_gen / 2.0);
}

// The decode steps' phases per token: wall time, the bytes each phase reads (its weights
// as stored; attention the KV at the run's mean context), that rate and its share of the
// read roof; "other" is the rest of a token's wall time (embedding, the scheduler,
// sampling).
nlohmann::json PhasesJson(engine::Engine& e, const engine::StepPhases& p, double seconds, double kv_bytes,
                          double roof_gbs) {
  const auto& w = e.model().weights();
  double bytes[engine::StepPhases::kCount] = {};
  for (const auto& l : w.layers) {
    bytes[engine::StepPhases::kNormQkv] += l.wq.stored_bytes() + l.wk.stored_bytes() + l.wv.stored_bytes();
    bytes[engine::StepPhases::kOut] += l.wo.stored_bytes();
    bytes[engine::StepPhases::kFfnGateUp] += l.w_gate.stored_bytes() + l.w_up.stored_bytes();
    bytes[engine::StepPhases::kFfnDown] += l.w_down.stored_bytes();
  }
  bytes[engine::StepPhases::kAttention] = kv_bytes;
  bytes[engine::StepPhases::kLogits] = w.lm_head.stored_bytes();
  const double tokens = static_cast<double>(p.steps);
  nlohmann::json list = nlohmann::json::array();
  double timed = 0;
  for (int i = 0; i < engine::StepPhases::kCount; ++i) {
    const double s = p.seconds[i] / tokens;
    timed += s;
    nlohmann::json j = {{"phase", engine::StepPhases::Name(i)}, {"ms_per_token", s * 1e3},
                        {"share_of_step", p.seconds[i] / seconds}, {"bytes_per_token", bytes[i]}};
    if (bytes[i] > 0 && s > 0) {
      j["gbs"] = bytes[i] / s / 1e9;
      if (roof_gbs > 0) j["roof_share"] = bytes[i] / s / 1e9 / roof_gbs;
    }
    list.push_back(j);
  }
  const double wall = seconds / tokens;
  return {{"tokens", p.steps}, {"ms_per_token", wall * 1e3}, {"phases", list},
          {"other_ms_per_token", (wall - timed) * 1e3}, {"other_share_of_step", (wall - timed) / wall},
          {"read_roof_gbs", roof_gbs}};
}

void PrintPhases(const nlohmann::json& d) {
  std::printf("\ndecode step, %.3f ms per token over %lld tokens (the read roof around the reps: %.1f GB/s):\n",
              d["ms_per_token"].get<double>(), static_cast<long long>(d["tokens"].get<int64_t>()),
              d["read_roof_gbs"].get<double>());
  std::fputs(bench::TableHeader({"phase", "ms per token", "share of the step", "MB read per token", "GB/s",
                                  "share of the roof"})
                 .c_str(),
             stdout);
  for (const auto& p : d["phases"]) {
    std::fputs(bench::TableRow({p["phase"].get<std::string>(), bench::Fmt("%.3f", p["ms_per_token"].get<double>()),
                                bench::Fmt("%.1f%%", 100 * p["share_of_step"].get<double>()),
                                bench::Fmt("%.1f", p["bytes_per_token"].get<double>() / 1e6),
                                p.contains("gbs") ? bench::Fmt("%.1f", p["gbs"].get<double>()) : "",
                                p.contains("roof_share") ? bench::Fmt("%.0f%%", 100 * p["roof_share"].get<double>()) : ""})
                   .c_str(),
               stdout);
  }
  std::fputs(bench::TableRow({"other", bench::Fmt("%.3f", d["other_ms_per_token"].get<double>()),
                              bench::Fmt("%.1f%%", 100 * d["other_share_of_step"].get<double>()), "", "", ""})
                 .c_str(),
             stdout);
  std::printf("\n");
}

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
  // Decode against the DRAM read roof, with the bench's threads. This VM's read rate
  // drifts by tens of percent from one minute to the next (and from one second to the
  // next while a neighbour streams), so each decode rep is bracketed by two measurements
  // of the roof, just before its first step and just after its last, and the rep's share
  // is taken of their mean; the share reported is the median of the reps' shares. A
  // measurement takes 1 GiB for a moment: the peak RSS so far is kept and the kernel's
  // reset around each one, so that it does not count. Where the kernel refuses the reset,
  // the roof is measured once, after every run, and every rep's share is taken of it.
  // Bytes per token: the weights (what the roof share is of), and the KV read at the
  // run's mean context on top.
  const bool decode = f.n_gen > 0 && f.gen_after + f.n_gen <= e.context_length();
  double peak_rss = bench::PeakRssMiB();
  const bool paired = decode && bench::ResetPeakRss();
  std::vector<double> roofs;      // every measurement, in order (paired: two per rep)
  bench::ReadRoof roof_info;
  auto measure_roof = [&] {
    peak_rss = std::max(peak_rss, bench::PeakRssMiB());
    roof_info = bench::MeasureReadRoof(e.threads().n_threads());
    bench::ResetPeakRss();
    roofs.push_back(roof_info.gbs);
    return roof_info.gbs;
  };
  std::vector<double> decode_tps, rep_roof;  // per decode rep: tokens/s, the roof around it
  engine::StepPhases phases;                 // where the decode steps' time went
  double decode_seconds = 0;
  if (decode) {
    for (int r = 0; r < f.reps; ++r) {
      session.Reset();
      auto prompt = bench::RandomTokens(f.gen_after, 2000 + r, 0, vocab);
      auto logits = session.Prefill(prompt);
      if (!logits.ok()) return Fail(logits.status());
      int32_t tok = engine::Argmax(logits->data(), vocab);
      const double roof0 = paired ? measure_roof() : 0;
      e.transformer().set_step_phases(&phases);
      auto t0 = Clock::now();
      for (int i = 0; i < f.n_gen; ++i) {
        auto l = session.Step(tok);
        if (!l.ok()) return Fail(l.status());
        tok = engine::Argmax(l->data(), vocab);
      }
      double s = std::chrono::duration<double>(Clock::now() - t0).count();
      e.transformer().set_step_phases(nullptr);
      decode_seconds += s;
      decode_tps.push_back(f.n_gen / s);
      if (paired) rep_roof.push_back((roof0 + measure_roof()) / 2);
      std::fprintf(stderr, "tg%d@%d rep %d: %.1f tok/s%s\n", f.n_gen, f.gen_after, r + 1, f.n_gen / s,
                   paired ? bench::Fmt(" (read roof around it %.1f GB/s)", rep_roof.back()).c_str() : "");
    }
    results.push_back({{"test", "tg" + std::to_string(f.n_gen)}, {"n_prompt", f.gen_after}, {"n_gen", f.n_gen},
                       {"tokens_per_s", bench::Median(decode_tps)}, {"samples", decode_tps}});
  }
  if (!paired) {
    measure_roof();
    rep_roof.assign(decode_tps.size(), roofs.back());
  }
  out["peak_rss_mib"] = std::max(peak_rss, bench::PeakRssMiB());
  out["read_roof"] = {{"threads", roof_info.threads}, {"bytes", roof_info.bytes}, {"passes", roof_info.passes},
                      {"gbs", bench::Mean(roofs)}, {"gbs_min", *std::min_element(roofs.begin(), roofs.end())},
                      {"gbs_max", *std::max_element(roofs.begin(), roofs.end())}, {"gbs_each", roofs},
                      {"gbs_before", roofs.front()}, {"gbs_after", roofs.back()}, {"paired_with_reps", paired}};
  const double weight_bytes = static_cast<double>(e.model().weight_bytes());
  const double kv_bytes = KvBytesPerToken(e, f);
  for (auto& r : results) {
    if (r["n_gen"].get<int>() == 0) continue;
    std::vector<double> share, share_kv;
    for (size_t i = 0; i < decode_tps.size(); ++i) {
      const double per_gb = rep_roof[i] > 0 ? decode_tps[i] / 1e9 / rep_roof[i] : 0.0;  // no roof: no share
      share.push_back(per_gb * weight_bytes);
      share_kv.push_back(per_gb * (weight_bytes + kv_bytes));
    }
    r["weight_bytes_per_token"] = weight_bytes;
    r["kv_bytes_per_token"] = kv_bytes;
    r["weight_gbs"] = r["tokens_per_s"].get<double>() * weight_bytes / 1e9;
    r["read_roof_gbs"] = rep_roof;  // per rep, as "samples"
    r["roof_shares"] = share;
    r["roof_share"] = bench::Median(share);
    r["roof_share_with_kv"] = bench::Median(share_kv);
  }
  out["results"] = results;
  if (phases.steps > 0) out["decode_phases"] = PhasesJson(e, phases, decode_seconds, kv_bytes, bench::Mean(rep_roof));

  std::fputs(bench::TableHeader({"model", "dtype", "test", bench::Fmt("tokens/s (median of %d)", f.reps),
                                  "weights GB/s", "share of the read roof around each rep (median)"})
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
  if (out.contains("decode_phases")) PrintPhases(out["decode_phases"]);
  std::printf("peak RSS: %.0f MiB; DRAM read roof: %.1f GB/s (%d threads, best of %d passes over %.0f MiB; %s)\n",
              out["peak_rss_mib"].get<double>(), bench::Mean(roofs), roof_info.threads, roof_info.passes,
              roof_info.bytes / 1048576.0,
              paired ? bench::Fmt("mean of %zu measurements around the decode reps, %.1f-%.1f; each rep's share is "
                                  "of the roof around it, the median shown",
                                  roofs.size(), out["read_roof"]["gbs_min"].get<double>(),
                                  out["read_roof"]["gbs_max"].get<double>())
                           .c_str()
                     : "measured once, after the runs");
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
