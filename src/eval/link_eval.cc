// `attic eval link`: every prompt under every split, chunk order and method
// (attic/eval/link_eval.h).
#include "attic/eval/link_eval.h"

#include <algorithm>
#include <chrono>

#include "attic/eval/link_method.h"
#include "attic/eval/needle.h"

namespace attic::eval {

namespace {

// Common prefix of a and b over the longer one's length (1 when both are empty).
double PrefixAgreement(const std::vector<int32_t>& a, const std::vector<int32_t>& b) {
  const size_t longest = std::max(a.size(), b.size());
  if (longest == 0) return 1;
  size_t k = 0;
  while (k < a.size() && k < b.size() && a[k] == b[k]) ++k;
  return static_cast<double>(k) / static_cast<double>(longest);
}

// One prompt laid out in one chunk order: the token sequence, the chunks' places in it,
// where scoring starts, and the greedy prompt's length.
struct Layout {
  std::vector<int32_t> tokens;
  std::vector<ContextChunk> chunks;
  int first_scored = 0;
  int greedy_prompt = 0;
};

Layout Lay(const LinkPrompt& p, const SplitContextResult& split, const std::vector<int>& order, int32_t bos) {
  Layout l;
  if (bos >= 0) l.tokens.push_back(bos);
  for (int i : order) {
    const ContextChunk& c = split.chunks[static_cast<size_t>(i)];
    l.chunks.push_back({static_cast<int>(l.tokens.size()), c.n});
    l.tokens.insert(l.tokens.end(), split.tokens.begin() + c.begin, split.tokens.begin() + c.begin + c.n);
  }
  l.first_scored = static_cast<int>(l.tokens.size());
  l.tokens.insert(l.tokens.end(), p.query.begin(), p.query.end());
  l.greedy_prompt = static_cast<int>(l.tokens.size());
  l.tokens.insert(l.tokens.end(), p.continuation.begin(), p.continuation.end());
  return l;
}

double Seconds(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

StatusOr<LinkRun> RunLinkEval(const std::vector<Method*>& methods, const tokenizer::Tokenizer& tok, int32_t bos,
                              const std::vector<LinkPrompt>& prompts, const LinkEvalOptions& options,
                              const std::function<void(const std::string&)>& progress) {
  if (methods.empty()) return InvalidArgumentError("no methods");
  if (prompts.empty()) return InvalidArgumentError("no prompts");
  if (options.chunk_tokens < 1) return InvalidArgumentError("chunk tokens must be at least 1");
  for (const LinkPrompt& p : prompts) {
    if (p.context.empty() || p.query.size() + p.continuation.size() < 1)
      return InvalidArgumentError("prompt " + p.id + " has no context or nothing to score");
  }
  LinkRun run;
  run.options = options;
  run.n_prompts = static_cast<int>(prompts.size());
  for (Method* m : methods) run.methods.push_back(m->name());
  const int vocab = tok.vocab_size();
  const size_t n_methods = methods.size();

  for (LinkSplit split : options.splits) {
    const size_t first_cell = run.cells.size();
    // Cells: [0, n_methods) all orders; then n_methods per order.
    for (size_t o = 0; o <= options.orders.size(); ++o) {
      for (Method* m : methods) {
        LinkCell c;
        c.split = LinkSplitName(split);
        c.order = o == 0 ? "all" : ChunkOrderName(options.orders[o - 1]);
        c.method = m->name();
        run.cells.push_back(std::move(c));
      }
    }
    auto cell = [&](size_t order_index, size_t m) -> LinkCell& {
      return run.cells[first_cell + order_index * n_methods + m];
    };
    std::vector<SplitContextResult> split_chunks;
    for (const LinkPrompt& p : prompts) {
      auto cut = SplitContext(p, tok, split, options.chunk_tokens);
      if (!cut.ok()) return cut.status().WithContext(std::string(LinkSplitName(split)) + " split of " + p.id);
      split_chunks.push_back(std::move(*cut));
    }

    for (size_t oi = 0; oi < options.orders.size(); ++oi) {
      const auto t_order = std::chrono::steady_clock::now();
      for (size_t pi = 0; pi < prompts.size(); ++pi) {
        const LinkPrompt& p = prompts[pi];
        const std::vector<int> order = OrderChunks(static_cast<int>(split_chunks[pi].chunks.size()), options.orders[oi],
                                                   options.seed + pi);
        const Layout l = Lay(p, split_chunks[pi], order, bos);
        const std::vector<int32_t> greedy_prompt(l.tokens.begin(), l.tokens.begin() + l.greedy_prompt);
        std::vector<float> ref_logits, logits;
        std::vector<int32_t> ref_greedy;
        for (size_t mi = 0; mi < n_methods; ++mi) {
          Method* m = methods[mi];
          m->set_chunks(l.chunks);
          Status st = m->Score(l.tokens, l.first_scored, mi == 0 ? &ref_logits : &logits);
          if (!st.ok()) return st.WithContext(m->name() + " on " + p.id);
          const std::vector<float>& q = mi == 0 ? ref_logits : logits;
          auto t0 = std::chrono::steady_clock::now();
          auto greedy = m->Greedy(greedy_prompt, options.greedy_tokens);
          if (!greedy.ok()) return greedy.status().WithContext(m->name() + " on " + p.id);
          double first_token_seconds = 0;
          auto* linked = dynamic_cast<LinkedMethod*>(m);
          if (linked != nullptr) {
            first_token_seconds = linked->last_link_seconds();
          } else {
            t0 = std::chrono::steady_clock::now();
            auto one = m->Greedy(greedy_prompt, 1);  // the prefill alone: full's first-token time
            if (!one.ok()) return one.status();
            first_token_seconds = Seconds(t0);
          }
          if (mi == 0) ref_greedy = *greedy;
          const double agree = PrefixAgreement(*greedy, ref_greedy);
          const bool exact = !p.answer.empty() && ExactMatch(tok.Decode(*greedy, true), p.answer);
          for (size_t ci : {size_t{0}, oi + 1}) {
            LinkCell& c = cell(ci, mi);
            c.scores.BeginWindow();
            const size_t n_rows = l.tokens.size() - static_cast<size_t>(l.first_scored);
            for (size_t r = 0; r < n_rows; ++r) {
              const float* pr = ref_logits.data() + r * static_cast<size_t>(vocab);
              const float* qr = q.data() + r * static_cast<size_t>(vocab);
              const double kl = mi == 0 ? 0.0 : KlDivergence(pr, qr, vocab);
              const bool top1 = mi == 0 || std::max_element(pr, pr + vocab) - pr == std::max_element(qr, qr + vocab) - qr;
              c.scores.Add(NegLogLikelihood(qr, vocab, l.tokens[static_cast<size_t>(l.first_scored) + r]), kl, top1);
            }
            c.greedy_agreement += agree;
            if (!p.answer.empty()) {
              ++c.exact_of;
              c.exact += exact ? 1 : 0;
            }
            if (linked != nullptr) {
              c.recomputed += linked->last_recomputed();
              c.linked += linked->last_linked();
            }
            c.link_seconds += first_token_seconds;
            ++c.n_prompts;
            c.n_chunks += static_cast<int64_t>(l.chunks.size());
          }
        }
      }
      if (progress) {
        char buf[256];
        std::snprintf(buf, sizeof buf, "link: split %s, order %s: %zu prompts x %zu methods (%.1f s)",
                      LinkSplitName(split), ChunkOrderName(options.orders[oi]), prompts.size(), n_methods,
                      Seconds(t_order));
        progress(buf);
      }
    }
    for (size_t i = first_cell; i < run.cells.size(); ++i) {
      LinkCell& c = run.cells[i];
      if (c.n_prompts > 0) c.greedy_agreement /= c.n_prompts;
    }
  }
  return run;
}

}  // namespace attic::eval
