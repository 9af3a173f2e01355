// `attic eval link`: linking separately prefilled chunks against full attention
// (paper 002's RQ1 and RQ4; docs/eval.md, "Linking").
//   attic eval link [-m MODEL] [--source text|musique|passkey] [--text FILE] [--musique FILE]
//                   [--haystack DIR|FILE] [--prompts N] [--chunks N] [--chunk-tokens T]
//                   [--continuation C] [-l LENGTH] [--split fixed sentence semantic]
//                   [--orders original reversed shuffled] [--seed S] [--greedy-tokens G]
//                   [--methods naive attnlink-16 ...] [--bos no yes] [--json FILE] [--plot FILE.svg]
// Prints a markdown table and a one-line JSON summary on stdout, progress on stderr.
#include <chrono>
#include <cstdio>
#include <memory>

#include "attic/core/file.h"
#include "attic/eval/link_eval.h"
#include "attic/eval/link_method.h"
#include "attic/eval/needle.h"
#include "attic/store/entry.h"
#include "cli/commands.h"

namespace attic::cli {

namespace {

struct LinkFlags {
  ModelFlags model;
  std::string source = "text";
  std::string text;
  std::string musique;
  std::string haystack;
  int prompts = 12;
  int chunks = 6;
  int chunk_tokens = 64;
  int continuation = 64;
  int length = 320;
  std::vector<std::string> splits{"fixed"};
  std::vector<std::string> orders{"original", "reversed", "shuffled"};
  uint64_t seed = 1;
  int greedy_tokens = 32;
  std::vector<std::string> methods{"naive",       "cacheblend-0.05", "cacheblend-0.15", "cacheblend-0.3",
                                   "attnlink-2",  "attnlink-4",      "attnlink-8",      "attnlink-16",
                                   "attnlink-32"};
  std::vector<std::string> bos{"no", "yes"};
  std::string kv_store_dtype = "f32";
  std::string json_out;
  std::string plot_out;
};

// The methods axis: "full", then every linked method in each BOS variant asked for.
StatusOr<std::vector<std::string>> Axis(const LinkFlags& f) {
  std::vector<std::string> names;
  for (const std::string& m : f.methods) {
    if (m == eval::kReferenceMethod) continue;
    if (m.ends_with(eval::kBosSuffix)) return InvalidArgumentError("--methods: give '" + m + "' without +bos; --bos picks the variants");
    if (!eval::IsLinkedMethodName(m))
      return InvalidArgumentError("--methods: '" + m + "' is not a linking method (naive, attnlink-K, cacheblend-R[@LAYER])");
    for (const std::string& b : f.bos) names.push_back(b == "yes" ? m + eval::kBosSuffix : m);
  }
  return eval::MethodsAxis(names);
}

int RunLink(const LinkFlags& f) {
  if (f.prompts < 1 || f.chunks < 1 || f.chunk_tokens < 1 || f.continuation < 1 || f.greedy_tokens < 0)
    return UsageError("--prompts, --chunks, --chunk-tokens and --continuation must be at least 1");
  if (f.source != "text" && f.source != "musique" && f.source != "passkey")
    return UsageError("--source must be text, musique or passkey");
  for (const std::string& b : f.bos)
    if (b != "yes" && b != "no") return UsageError("--bos takes yes and/or no");
  eval::LinkEvalOptions o;
  o.chunk_tokens = f.chunk_tokens;
  o.seed = f.seed;
  o.greedy_tokens = f.greedy_tokens;
  o.splits.clear();
  for (const std::string& s : f.splits) {
    auto v = eval::ParseLinkSplit(s);
    if (!v.ok()) return UsageError(v.status().message());
    o.splits.push_back(*v);
  }
  o.orders.clear();
  for (const std::string& s : f.orders) {
    auto v = eval::ParseChunkOrder(s);
    if (!v.ok()) return UsageError(v.status().message());
    o.orders.push_back(*v);
  }
  if (o.splits.empty() || o.orders.empty() || f.bos.empty()) return UsageError("--split, --orders and --bos need a value");
  auto axis = Axis(f);
  if (!axis.ok()) return UsageError(axis.status().message());
  store::KvDtype chunk_dtype;
  if (!store::ParseKvDtype(f.kv_store_dtype, &chunk_dtype))
    return UsageError("--kv-store-dtype must be " + store::KvDtypeChoices() + ", not '" + f.kv_store_dtype + "'");
  if (Status st = PrepareOutput(f.json_out, "--json"); !st.ok()) return Fail(st);
  if (Status st = PrepareOutput(f.plot_out, "--plot"); !st.ok()) return Fail(st);
  const std::string path = f.source == "text" ? f.text : f.source == "musique" ? f.musique : f.haystack;
  std::string input;
  std::vector<std::string> haystack;
  if (f.source == "passkey") {
    auto h = eval::LoadHaystack(f.haystack);
    if (!h.ok()) return Fail(h.status().WithContext("--haystack"));
    haystack = std::move(*h);
  } else {
    auto t = ReadFileToString(path);
    if (!t.ok()) return Fail(t.status().WithContext(f.source == "text" ? "--text" : "--musique"));
    input = std::move(*t);
  }

  auto eng = engine::Engine::Load(ToEngineOptions(f.model, true));
  if (!eng.ok()) return Fail(eng.status());
  engine::Engine& e = **eng;
  const tokenizer::Tokenizer& tok = e.tokenizer();
  const int context = f.chunks * f.chunk_tokens;
  std::vector<eval::LinkPrompt> prompts;
  if (f.source == "text") {
    auto tokens = e.Tokenize(input, false);
    if (!tokens.ok()) return Fail(tokens.status().WithContext(path));
    prompts = eval::TextPrompts(*tokens, tok, context, f.continuation, f.prompts);
  } else if (f.source == "musique") {
    auto p = eval::MusiquePrompts(input, tok, context, f.prompts);
    if (!p.ok()) return Fail(p.status().WithContext(path));
    prompts = std::move(*p);
  } else {
    auto p = eval::PassKeyPrompts(tok, haystack, f.length, f.prompts, f.seed);
    if (!p.ok()) return Fail(p.status());
    prompts = std::move(*p);
  }
  if (prompts.empty()) return Fail(InvalidArgumentError(path + ": not one prompt of " + std::to_string(context) + " context tokens"));
  const int32_t bos = tok.add_bos() ? tok.bos_id() : -1;
  size_t need = 0;
  for (const auto& p : prompts) {
    for (eval::LinkSplit split : o.splits) {  // semantic encodes the context's text: a token more or less
      auto cut = eval::SplitContext(p, tok, split, f.chunk_tokens);
      if (!cut.ok()) return Fail(cut.status().WithContext(p.id));
      need = std::max(need, (bos >= 0 ? 1 : 0) + cut->tokens.size() + p.query.size() +
                                std::max(p.continuation.size(), static_cast<size_t>(f.greedy_tokens)));
    }
  }
  if (need > static_cast<size_t>(e.context_length())) {
    return UsageError("prompts need " + std::to_string(need) + " tokens, more than the context window of " +
                      std::to_string(e.context_length()) + " (-c, or fewer --chunks / --chunk-tokens / --continuation)");
  }
  std::vector<std::unique_ptr<eval::Method>> methods;
  std::vector<eval::Method*> ptrs;
  for (const std::string& name : *axis) {
    auto m = eval::MakeMethod(name, e);
    if (!m.ok()) return UsageError(m.status().message());
    (*m)->set_chunk_store_dtype(chunk_dtype);
    ptrs.push_back(m->get());
    methods.push_back(std::move(*m));
  }
  std::fprintf(stderr, "attic: eval link: %s (%s): %zu prompts of %zu context tokens; %zu methods x %zu splits x %zu orders\n",
               path.c_str(), f.source.c_str(), prompts.size(), prompts[0].context.size(), ptrs.size(), o.splits.size(),
               o.orders.size());
  const auto t0 = std::chrono::steady_clock::now();
  auto r = eval::RunLinkEval(ptrs, tok, bos, prompts, o,
                             [](const std::string& line) { std::fprintf(stderr, "attic: eval %s\n", line.c_str()); });
  if (!r.ok()) return Fail(r.status());
  r->model = f.model.model;
  r->source = f.source == "passkey" ? "passkey:" + path : path;
  r->chunk_store_dtype = store::KvDtypeName(chunk_dtype);
  std::fprintf(stderr, "attic: eval link: done (%.1f s)\n",
               std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  const nlohmann::json js = eval::ToJson(*r);
  if (Status st = WriteOutput(f.json_out, js.dump(2) + "\n", "--json"); !st.ok()) return Fail(st);
  if (Status st = WriteOutput(f.plot_out, eval::ToSvg(*r), "--plot"); !st.ok()) return Fail(st);
  nlohmann::json summary = js;
  summary.erase("cells");  // every cell: only in --json
  std::printf("%s\n%s\n", eval::ToMarkdown(*r).c_str(), summary.dump().c_str());
  std::fflush(stdout);
  return kExitOk;
}

}  // namespace

void AddEvalLinkCommand(CLI::App* ev, RunFn* run) {
  auto* lk = ev->add_subcommand(
      "link", "linking separately prefilled chunks (naive, cacheblend, attnlink) against full attention, per split and order");
  auto f = std::make_shared<LinkFlags>();
  AddModelFlags(lk, &f->model);
  f->text = JoinPath(SharedDir(), "datasets/tinystories_valid_sample/TinyStories-valid-sample.txt");
  f->musique = JoinPath(SharedDir(), "datasets/longbench_musique_cacheblend/musique_s.json");
  f->haystack = JoinPath(SharedDir(), "datasets/paul_graham_essays");
  lk->add_option("--source", f->source,
                 "prompts from: text (--text, the true continuation scored), musique (--musique passages, "
                 "question and answer), passkey (--haystack filler with a pass key; exact match)")
      ->capture_default_str();
  lk->add_option("--text", f->text, "text file for --source text")->capture_default_str();
  lk->add_option("--musique", f->musique, "MuSiQue records for --source musique")->capture_default_str();
  lk->add_option("--haystack", f->haystack, "filler for --source passkey: a .txt file or a folder of them")
      ->capture_default_str();
  lk->add_option("--prompts", f->prompts, "prompts (text: consecutive, without overlap)")->capture_default_str();
  lk->add_option("--chunks", f->chunks, "text, musique: the context is chunks x chunk-tokens tokens")
      ->capture_default_str();
  lk->add_option("--chunk-tokens", f->chunk_tokens, "tokens per chunk (semantic: at most)")->capture_default_str();
  lk->add_option("--continuation", f->continuation, "text: tokens of true continuation scored")->capture_default_str();
  lk->add_option("-l,--length", f->length, "passkey: prompt length in tokens (at most)")->capture_default_str();
  lk->add_option("--split", f->splits,
                 "how the context is cut: fixed (runs of --chunk-tokens), sentence (the same tokens cut at passage "
                 "and sentence ends), semantic (pic::SplitDocument of the text)")
      ->capture_default_str();
  lk->add_option("--orders", f->orders, "chunk orders: original, reversed, shuffled")->capture_default_str();
  lk->add_option("--seed", f->seed, "seed of the shuffled order (and the pass keys)")->capture_default_str();
  lk->add_option("--greedy-tokens", f->greedy_tokens, "greedy tokens compared with full's")->capture_default_str();
  lk->add_option("--methods", f->methods, "linking methods (naive, attnlink-K, cacheblend-R[@LAYER]); full always runs first")
      ->capture_default_str();
  lk->add_option("--bos", f->bos, "chunks prefilled without (no) and/or after (yes) a BOS token")->capture_default_str();
  lk->add_option("--kv-store-dtype", f->kv_store_dtype,
                 "the context cache's entry type: each chunk's KV is read back as an entry of this type gives it "
                 "(f32: as computed; f16, q8_0, q4_0, q8_0/q4_0, kivi4) before it is linked")
      ->capture_default_str();
  lk->add_option("--json", f->json_out, "write every cell (per split, order and method) as JSON to this file");
  lk->add_option("--plot", f->plot_out, "write an SVG of KL vs full against tokens recomputed to this file");
  lk->callback([run, f] { *run = [f] { return RunLink(*f); }; });
}

}  // namespace attic::cli
