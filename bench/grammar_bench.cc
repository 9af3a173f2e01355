// grammar_bench: the cost per output token of constrained decoding (response_format
// json_schema) against unconstrained decoding of the same model, prompt and length.
//
// Each round runs one unconstrained request and one with a JSON Schema (an unbounded
// array of objects, so that the grammar runs for the whole length and the budget rule
// closes it at the end), one after the other on the same scheduler; TPOT is the mean gap
// between a request's sampled tokens (the scheduler's own record). Rounds interleave the
// two so that drift of the machine hits both. Prints a table and, with --json, JSON.
//
//   grammar_bench [--model DIR] [--tokens 128] [--rounds 5] [--threads 0] [--json FILE]
#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>

#include "attic/engine/engine.h"
#include "attic/engine/scheduler.h"
#include "attic/grammar/json_grammar.h"
#include "bench/common/flags.h"
#include "bench/common/output.h"

namespace {

using namespace attic;
using namespace attic::engine;

constexpr const char* kSchema = R"({"type":"object","properties":{"items":{"type":"array","items":{
  "type":"object","properties":{"name":{"type":"string","maxLength":24},"count":{"type":"integer","minimum":0},
  "price":{"type":"number"},"ok":{"type":"boolean"},"kind":{"enum":["book","pen","cup"]}},
  "required":["name","count","price","ok","kind"],"additionalProperties":false}}},
  "required":["items"],"additionalProperties":false})";

[[noreturn]] void Die(const std::string& m) {
  std::fprintf(stderr, "grammar_bench: %s\n", m.c_str());
  std::exit(1);
}

struct Run {
  double tpot_ms = 0;
  int tokens = 0;
};

Run Generate(Scheduler& s, const std::vector<int32_t>& prompt, int n, uint64_t seed,
             std::shared_ptr<LogitsProcessor> processor, RequestRecord* last) {
  GenerationRequest g;
  g.prompt = prompt;
  g.sampling.temperature = 1.0f;
  g.sampling.seed = seed;
  g.sampling.max_tokens = n;
  g.ignore_eos = true;
  g.processor = std::move(processor);
  auto ch = s.Submit(std::move(g));
  if (!ch.ok()) Die(ch.status().ToString());
  GenerationEvent ev;
  while (true) {
    s.Step();
    if ((*ch)->Pop(&ev, std::chrono::milliseconds(0)) && ev.kind != GenerationEvent::Kind::kText) break;
  }
  if (ev.kind == GenerationEvent::Kind::kError) Die(ev.status.ToString());
  Run r;
  r.tokens = ev.usage.completion_tokens;
  double sum = 0;
  for (double gap : last->inter_token_seconds) sum += gap;
  r.tpot_ms = last->inter_token_seconds.empty() ? 0 : sum / last->inter_token_seconds.size() * 1e3;
  return r;
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  std::string model = attic::bench::SharedDir() + "/models/stories260K-hf";
  int tokens = 128, rounds = 5, threads = 0;
  std::string json_path;
  attic::bench::FlagParser flags("grammar_bench", "[--model DIR] [--tokens 128] [--rounds 5] [--threads 0] [--json FILE]");
  flags.String("--model", &model);
  flags.Int("--tokens", &tokens);
  flags.Int("--rounds", &rounds);
  flags.Int("--threads", &threads);
  flags.String("--json", &json_path);
  flags.ParseOrExit(argc, argv);
  if (tokens < 8) flags.UsageError("--tokens must be >= 8");
  if (rounds < 1) flags.UsageError("--rounds must be >= 1");

  EngineOptions eo;
  eo.model_path = model;
  eo.n_threads = threads;
  eo.calibrate_kernels = true;
  auto loaded = Engine::Load(eo);
  if (!loaded.ok()) Die(model + ": " + loaded.status().ToString());
  Engine& e = **loaded;
  auto prompt = e.Tokenize("Here is the list of things in the shop, as JSON:", true);
  if (!prompt.ok()) Die(prompt.status().ToString());
  auto grammar = grammar::Grammar::FromOrderedJsonSchema(nlohmann::ordered_json::parse(kSchema));
  if (!grammar.ok()) Die(grammar.status().ToString());
  const auto t0 = std::chrono::steady_clock::now();
  auto vocab = std::make_shared<grammar::Vocabulary>(e.tokenizer());
  const double vocab_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();

  SchedulerOptions so;
  so.max_running = 1;
  Scheduler s(e, so);
  RequestRecord last;
  s.set_observer([&last](const RequestRecord& r) { last = r; });

  std::vector<double> plain, constrained;
  int plain_tokens = 0, constrained_tokens = 0;
  double cold_ms = 0;
  // Round 0 warms up; its constrained request starts with the grammar's mask cache empty
  // (as a server's first request with a schema does): reported apart as "cold".
  for (int round = 0; round <= rounds; ++round) {
    Run a = Generate(s, *prompt, tokens, 1000 + round, nullptr, &last);
    auto p = std::make_shared<grammar::JsonProcessor>(*grammar, vocab, tokens);
    Run b = Generate(s, *prompt, tokens, 1000 + round, p, &last);
    if (round == 0) {
      cold_ms = b.tpot_ms;
      continue;
    }
    plain.push_back(a.tpot_ms);
    constrained.push_back(b.tpot_ms);
    plain_tokens = a.tokens;
    constrained_tokens = b.tokens;
  }
  const double tp = Median(plain), tc = Median(constrained);
  std::string name = model;
  while (!name.empty() && name.back() == '/') name.pop_back();
  name = name.substr(name.find_last_of('/') + 1);
  std::printf("grammar_bench: %s, vocabulary %d tokens (trie built in %.1f ms), %d tokens per request, %d rounds\n",
              name.c_str(), vocab->size(), vocab_ms, tokens, rounds);
  std::printf("%-14s %10s %8s\n", "decoding", "TPOT (ms)", "tokens");
  std::printf("%-14s %10.3f %8d\n", "unconstrained", tp, plain_tokens);
  std::printf("%-14s %10.3f %8d\n", "json_schema", tc, constrained_tokens);
  std::printf("%-14s %10.3f %8s\n", "  (cold cache)", cold_ms, "");
  std::printf("ratio (median TPOT, json_schema / unconstrained): %.3f\n", tp > 0 ? tc / tp : 0);
  nlohmann::json j = {{"model", name},
                      {"vocab_size", vocab->size()},
                      {"trie_ms", vocab_ms},
                      {"tokens", tokens},
                      {"rounds", rounds},
                      {"tpot_ms", {{"unconstrained", plain}, {"json_schema", constrained}}},
                      {"median_tpot_ms", {{"unconstrained", tp}, {"json_schema", tc}}},
                      {"cold_cache_tpot_ms", cold_ms},
                      {"ratio", tp > 0 ? tc / tp : 0}};
  if (!json_path.empty()) std::ofstream(json_path) << j.dump(2) << "\n";
  std::printf("%s\n", j.dump().c_str());
  return 0;
}
