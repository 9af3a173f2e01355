// `attic eval`: how well a model predicts held-out text and retrieves a needle, under
// full attention and under every approximation on the methods axis (docs/eval.md).
//   attic eval perplexity [-m MODEL] [--text FILE] [-l 128 256 512] [--max-windows N]
//                         [--max-tokens N] [--score-from I] [--methods full ...]
//                         [--kv-dtypes f32 f16 q8_0] [--json FILE]
//   attic eval needle [-m MODEL] [--haystack DIR|FILE] [-l 512 1024 2048] [--depths ...]
//                     [--needles passkey fact] [--trials N] [--seed S] [--methods ...]
//                     [--json FILE] [--plot FILE.svg]
//   attic eval link ...   (eval_link_cmd.cc)
// Each prints a markdown table and a one-line JSON summary on stdout, progress on stderr.
#include <algorithm>
#include <utility>
#include <chrono>
#include <cstdio>
#include <memory>

#include "attic/core/file.h"
#include "attic/core/progress.h"
#include "attic/eval/method.h"
#include "attic/eval/needle.h"
#include "attic/eval/perplexity.h"
#include "cli/commands.h"

namespace attic::cli {

namespace {

struct PerplexityFlags {
  ModelFlags model;
  std::string text;
  std::vector<int> lengths{128, 256, 512};
  int max_windows = 0;
  int64_t max_tokens = 0;
  int score_from = 1;
  std::vector<std::string> methods{eval::kReferenceMethod};
  std::vector<std::string> kv_dtypes;  // the KV-type axis, [0] the reference; empty: --kv-dtype alone
  std::string json_out;
};

struct NeedleFlags {
  ModelFlags model;
  std::string haystack;
  std::vector<int> lengths{512, 1024, 2048};
  std::vector<double> depths{0, 0.25, 0.5, 0.75, 1};
  std::vector<std::string> needles{"passkey", "fact"};
  int trials = 5;
  uint64_t seed = 1;
  std::vector<std::string> methods{eval::kReferenceMethod};
  std::string json_out;
  std::string plot_out;
};

// Loads the engine with a context window that holds `need` tokens: -c when given (the
// caller has checked it is long enough), else exactly `need` (the engine warns when that
// is past the model's trained length).
StatusOr<std::unique_ptr<engine::Engine>> LoadFor(ModelFlags mf, int need) {
  if (mf.ctx == 0) mf.ctx = need;
  return engine::Engine::Load(ToEngineOptions(mf, true));
}

// A usage error when -c is given and shorter than `need` tokens, else kExitOk.
int CheckCtx(const ModelFlags& mf, int need) {
  if (mf.ctx > 0 && mf.ctx < need) {
    return UsageError("-c " + std::to_string(mf.ctx) + " is shorter than the " + std::to_string(need) +
                      " tokens the longest length needs");
  }
  return kExitOk;
}

// The methods axis as Method objects on `e`.
StatusOr<std::vector<std::unique_ptr<eval::Method>>> MakeMethods(const std::vector<std::string>& names,
                                                                 engine::Engine& e) {
  ATTIC_ASSIGN_OR_RETURN(std::vector<std::string> axis, eval::MethodsAxis(names));
  std::vector<std::unique_ptr<eval::Method>> methods;
  for (const std::string& name : axis) {
    ATTIC_ASSIGN_OR_RETURN(std::unique_ptr<eval::Method> m, eval::MakeMethod(name, e));
    methods.push_back(std::move(m));
  }
  return methods;
}

std::vector<eval::Method*> Pointers(const std::vector<std::unique_ptr<eval::Method>>& methods) {
  std::vector<eval::Method*> p;
  for (const auto& m : methods) p.push_back(m.get());
  return p;
}

int RunPerplexity(const PerplexityFlags& f) {
  if (f.lengths.empty()) return UsageError("--lengths needs at least one length");
  const int min_length = *std::min_element(f.lengths.begin(), f.lengths.end());
  const int max_length = *std::max_element(f.lengths.begin(), f.lengths.end());
  if (min_length < 2) return UsageError("--lengths must be at least 2 tokens");
  if (f.max_windows < 0 || f.max_tokens < 0) return UsageError("--max-windows and --max-tokens cannot be negative");
  if (f.score_from < 1 || f.score_from >= min_length) {
    return UsageError("--score-from must be between 1 and the shortest length - 1 (" + std::to_string(min_length - 1) +
                      ")");
  }
  if (auto axis = eval::MethodsAxis(f.methods); !axis.ok()) return UsageError(axis.status().message());
  // Each point: one type for K and V ("q8_0"), or K's and V's ("q8_0/f16").
  std::vector<std::pair<DType, DType>> kv_dtypes;
  for (const std::string& name : f.kv_dtypes) {
    const size_t slash = name.find('/');
    auto kt = ParseDType(name.substr(0, slash));
    auto vt = ParseDType(slash == std::string::npos ? name : name.substr(slash + 1));
    auto kv_type = [](const StatusOr<DType>& t) {
      return t.ok() && (*t == DType::kF32 || *t == DType::kF16 || *t == DType::kQ8_0 || *t == DType::kQ4_0);
    };
    if (!kv_type(kt) || !kv_type(vt)) {
      return UsageError("--kv-dtypes: '" + name +
                        "' is not a KV type (f32, f16, q8_0, q4_0, or K/V such as q8_0/q4_0)");
    }
    if (std::find(kv_dtypes.begin(), kv_dtypes.end(), std::pair{*kt, *vt}) != kv_dtypes.end())
      return UsageError("--kv-dtypes: " + name + " given twice");
    kv_dtypes.emplace_back(*kt, *vt);
  }
  if (int rc = CheckCtx(f.model, max_length); rc != kExitOk) return rc;
  if (Status st = PrepareOutput(f.json_out, "--json"); !st.ok()) return Fail(st);
  auto text = ReadFileToString(f.text);
  if (!text.ok()) return Fail(text.status().WithContext("--text"));

  ModelFlags mf = f.model;
  if (!kv_dtypes.empty()) {  // the engine loads with the reference type
    mf.kv_dtype_k = DTypeName(kv_dtypes[0].first);
    mf.kv_dtype_v = DTypeName(kv_dtypes[0].second);
  }
  auto eng = LoadFor(mf, max_length);
  if (!eng.ok()) return Fail(eng.status());
  engine::Engine& e = **eng;
  std::vector<eval::KvTypePoint> kv_axis;
  for (size_t i = 0; i < kv_dtypes.size(); ++i) {
    const DType kt = kv_dtypes[i].first, vt = kv_dtypes[i].second;  // (clang 14 cannot capture bindings)
    // Checked before any work (a q8_0 the model's head_dim does not take fails here).
    for (DType dt : {kt, vt}) {
      if (Status st = engine::CheckKvDtype(dt, e.model().config().head_dim); !st.ok())
        return Fail(st.WithContext("--kv-dtypes"));
    }
    kv_axis.push_back({f.kv_dtypes[i], [&e, kt, vt] { return e.SetKvDtypes(kt, vt); }});
  }
  auto methods = MakeMethods(f.methods, e);
  if (!methods.ok()) return Fail(methods.status());
  auto tokens = e.Tokenize(*text, false);
  if (!tokens.ok()) return Fail(tokens.status().WithContext(f.text));
  if (f.max_tokens > 0 && static_cast<int64_t>(tokens->size()) > f.max_tokens)
    tokens->resize(static_cast<size_t>(f.max_tokens));
  const int32_t bos = e.tokenizer().add_bos() ? e.tokenizer().bos_id() : -1;
  std::fprintf(stderr, "attic: eval perplexity: %s: %zu tokens%s; windows %s BOS; methods:", f.text.c_str(),
               tokens->size(), f.max_tokens > 0 ? " (--max-tokens)" : "", bos >= 0 ? "start with" : "have no");
  for (const auto& m : *methods) std::fprintf(stderr, " %s", m->name().c_str());
  if (!kv_axis.empty()) {
    std::fprintf(stderr, "; KV types:");
    for (const auto& k : kv_axis) std::fprintf(stderr, " %s", k.name.c_str());
  }
  std::fprintf(stderr, "\n");

  eval::PerplexityRun run;
  run.model = f.model.model;
  run.text = f.text;
  run.text_tokens = static_cast<int64_t>(tokens->size());
  run.score_from = f.score_from;
  run.kv_dtypes = f.kv_dtypes;
  const int vocab = e.model().config().vocab_size;
  for (int length : f.lengths) {
    const auto windows = eval::MakeWindows(*tokens, bos, length, f.max_windows);
    if (windows.empty()) {
      return Fail(InvalidArgumentError(f.text + " holds " + std::to_string(tokens->size()) +
                                       " tokens: not one window of " + std::to_string(length)));
    }
    const auto t0 = std::chrono::steady_clock::now();
    ProgressBar bar("perplexity at " + std::to_string(length), windows.size(), StderrIsTerminal());
    auto r = eval::ScoreWindows(Pointers(*methods), windows, f.score_from, vocab,
                                [&bar](int done, int) { bar.Update(static_cast<uint64_t>(done)); }, kv_axis);
    bar.Finish();
    if (!r.ok()) return Fail(r.status());
    std::fprintf(stderr, "attic: eval perplexity: length %d: %d windows, %lld tokens scored:", length, r->n_windows,
                 static_cast<long long>(r->methods[0].scores.n_tokens()));
    for (const auto& m : r->methods) {
      std::fprintf(stderr, " %s%s%s %.4f", m.method.c_str(), m.kv_dtype.empty() ? "" : "/", m.kv_dtype.c_str(),
                   m.scores.perplexity());
    }
    std::fprintf(stderr, " (%.1f s)\n",
                 std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    run.lengths.push_back(std::move(*r));
  }
  const nlohmann::json js = eval::ToJson(run);
  std::printf("%s\n%s\n", eval::ToMarkdown(run).c_str(), js.dump().c_str());
  std::fflush(stdout);
  if (Status st = WriteOutput(f.json_out, js.dump(2) + "\n", "--json"); !st.ok()) return Fail(st);
  return kExitOk;
}

int RunNeedle(const NeedleFlags& f) {
  if (f.lengths.empty() || f.depths.empty() || f.needles.empty())
    return UsageError("--lengths, --depths and --needles each need at least one value");
  for (double d : f.depths)
    if (!(d >= 0 && d <= 1)) return UsageError("--depths are fractions between 0 and 1");
  if (*std::min_element(f.lengths.begin(), f.lengths.end()) < 16) return UsageError("--lengths must be at least 16");
  if (f.trials < 1) return UsageError("--trials must be at least 1");
  eval::NeedleOptions o;
  o.lengths = f.lengths;
  o.depths = f.depths;
  o.trials = f.trials;
  o.seed = f.seed;
  o.kinds.clear();
  for (const std::string& n : f.needles) {
    auto k = eval::ParseNeedleKind(n);
    if (!k.ok()) return UsageError(k.status().message());
    if (std::find(o.kinds.begin(), o.kinds.end(), *k) == o.kinds.end()) o.kinds.push_back(*k);
  }
  if (auto axis = eval::MethodsAxis(f.methods); !axis.ok()) return UsageError(axis.status().message());
  // Room for the prompt and the answer's few tokens.
  const int need = *std::max_element(f.lengths.begin(), f.lengths.end()) + eval::kMaxAnswerTokens;
  if (int rc = CheckCtx(f.model, need); rc != kExitOk) return rc;
  if (Status st = PrepareOutput(f.json_out, "--json"); !st.ok()) return Fail(st);
  if (Status st = PrepareOutput(f.plot_out, "--plot"); !st.ok()) return Fail(st);
  auto haystack = eval::LoadHaystack(f.haystack);
  if (!haystack.ok()) return Fail(haystack.status().WithContext("--haystack"));

  auto eng = LoadFor(f.model, need);
  if (!eng.ok()) return Fail(eng.status());
  engine::Engine& e = **eng;
  auto methods = MakeMethods(f.methods, e);
  if (!methods.ok()) return Fail(methods.status());
  auto r = eval::RunNeedleGrid(Pointers(*methods), e.tokenizer(), *haystack, o, [](const std::string& line) {
    std::fprintf(stderr, "attic: eval %s\n", line.c_str());
  });
  if (!r.ok()) return Fail(r.status());
  r->model = f.model.model;
  r->haystack = f.haystack;
  r->trained_length = e.model().config().max_position_embeddings;
  nlohmann::json js = eval::ToJson(*r);
  if (Status st = WriteOutput(f.json_out, js.dump(2) + "\n", "--json"); !st.ok()) return Fail(st);
  if (Status st = WriteOutput(f.plot_out, eval::ToSvg(*r), "--plot"); !st.ok()) return Fail(st);
  js.erase("results");  // every trial: only in --json
  std::printf("%s\n%s\n", eval::ToMarkdown(*r).c_str(), js.dump().c_str());
  std::fflush(stdout);
  return kExitOk;
}

std::string MethodsHelp() {
  std::string names;
  for (const std::string& n : eval::MethodNames()) names += (names.empty() ? "" : ", ") + n;
  return "methods to compare (" + names + "); \"full\" is always run first, as the reference";
}

}  // namespace

void AddEvalCommand(CLI::App& app, RunFn* run) {
  auto* ev = app.add_subcommand(
      "eval", "quality: perplexity, KL / top-1 against full attention, needle in a haystack, linking (table + JSON)");
  ev->require_subcommand(1);

  auto* ppl = ev->add_subcommand("perplexity", "perplexity of a text in windows of several lengths, per method");
  auto pf = std::make_shared<PerplexityFlags>();
  AddModelFlags(ppl, &pf->model);
  pf->text = JoinPath(SharedDir(), "datasets/tinystories_valid_sample/TinyStories-valid-sample.txt");
  ppl->add_option("--text", pf->text, "text file to score (held out from the model's training)")
      ->capture_default_str();
  ppl->add_option("-l,--lengths", pf->lengths, "window lengths in tokens, BOS included")->capture_default_str();
  ppl->add_option("--max-windows", pf->max_windows, "windows per length, from the start of the text (0 = all)")
      ->capture_default_str();
  ppl->add_option("--max-tokens", pf->max_tokens,
                  "score only the text's first N tokens, the same text at every length (0 = all)")
      ->capture_default_str();
  ppl->add_option("--score-from", pf->score_from,
                  "index of the first scored token of each window; those before it are context only "
                  "(1 = every token after BOS)")
      ->capture_default_str();
  ppl->add_option("--methods", pf->methods, MethodsHelp())->capture_default_str();
  ppl->add_option("--kv-dtypes", pf->kv_dtypes,
                  "KV types of the compute buffer to compare (f32, f16, q8_0, or K's/V's such as q8_0/f16; space- "
                  "or comma-separated): every "
                  "method runs on each, and each is measured against the first (perplexity change, KL, top-1) "
                  "on the same windows; instead of --kv-dtype")
      ->delimiter(',')
      ->excludes(ppl->get_option("--kv-dtype"));
  ppl->add_option("--json", pf->json_out, "also write the JSON to this file");
  ppl->callback([run, pf] { *run = [pf] { return RunPerplexity(*pf); }; });

  auto* nd = ev->add_subcommand("needle", "needle-in-a-haystack grid: lengths x depths, greedy exact match, per method");
  auto nf = std::make_shared<NeedleFlags>();
  AddModelFlags(nd, &nf->model);
  nf->haystack = JoinPath(SharedDir(), "datasets/paul_graham_essays");
  nd->add_option("--haystack", nf->haystack, "filler text: a .txt file or a folder of them (read in name order)")
      ->capture_default_str();
  nd->add_option("-l,--lengths", nf->lengths, "prompt lengths in tokens (at most)")->capture_default_str();
  nd->add_option("--depths", nf->depths, "needle depths in the filler, 0 (start) .. 1 (end)")->capture_default_str();
  nd->add_option("--needles", nf->needles, "needle kinds: passkey, fact")->capture_default_str();
  nd->add_option("--trials", nf->trials, "prompts per cell (different keys and filler)")->capture_default_str();
  nd->add_option("--seed", nf->seed, "seed of the keys, names and filler")->capture_default_str();
  nd->add_option("--methods", nf->methods, MethodsHelp())->capture_default_str();
  nd->add_option("--json", nf->json_out, "write the cells and every trial as JSON to this file");
  nd->add_option("--plot", nf->plot_out, "write an SVG heatmap (a panel per needle kind and method) to this file");
  nd->callback([run, nf] { *run = [nf] { return RunNeedle(*nf); }; });

  AddEvalLinkCommand(ev, run);
}

}  // namespace attic::cli
