#include "attic/eval/needle.h"

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>

#include "attic/core/file.h"

namespace attic::eval {

const char* NeedleKindName(NeedleKind kind) { return kind == NeedleKind::kPassKey ? "passkey" : "fact"; }

StatusOr<NeedleKind> ParseNeedleKind(const std::string& name) {
  if (name == "passkey") return NeedleKind::kPassKey;
  if (name == "fact") return NeedleKind::kNamedFact;
  return InvalidArgumentError("unknown needle '" + name + "' (needles: passkey, fact)");
}

namespace {

void AppendSentences(const std::string& text, std::vector<std::string>* out) {
  std::string cur;
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (std::isspace(static_cast<unsigned char>(c))) {
      if (cur.empty()) continue;
      const char last = cur.back();
      if (last == '.' || last == '!' || last == '?') {
        out->push_back(std::move(cur));
        cur.clear();
      } else if (last != ' ') {
        cur += ' ';
      }
      continue;
    }
    cur += c;
  }
  while (!cur.empty() && cur.back() == ' ') cur.pop_back();
  if (!cur.empty()) out->push_back(std::move(cur));
}

// SplitMix64: independent, reproducible streams from (seed, kind, trial) on every
// platform (std:: distributions are not).
uint64_t Mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

uint64_t TrialRandom(uint64_t seed, NeedleKind kind, int trial, uint64_t stream) {
  return Mix(Mix(Mix(seed) ^ (static_cast<uint64_t>(kind) + 1) * 0x1000193ull) ^
             Mix(static_cast<uint64_t>(trial) * 7919 + stream));
}

constexpr const char* kNames[] = {"Mira", "Tomas", "Ines",  "Oskar", "Leila", "Jonas", "Priya", "Felix",
                                  "Nadia", "Hugo", "Elena", "Omar",  "Greta", "Ravi",  "Sofia", "Anton"};

// The prompt's text: filler pieces with the needle before pieces[needle_after] (after
// the last piece when needle_after == pieces.size()), then the question; or, without
// the tail, only the pieces before the needle. Empty pieces are skipped.
std::string JoinText(const std::vector<std::string>& pieces, size_t needle_after, const Needle& needle,
                     bool with_tail) {
  std::string text;
  auto add = [&text](const std::string& s) {
    if (s.empty()) return;
    if (!text.empty()) text += ' ';
    text += s;
  };
  for (size_t i = 0; i < pieces.size(); ++i) {
    if (i == needle_after) {
      if (!with_tail) return text;
      add(needle.sentence);
    }
    add(pieces[i]);
  }
  if (!with_tail) return text;
  if (needle_after >= pieces.size()) add(needle.sentence);
  add(needle.question);
  return text;
}

// The last `n` words of the text before haystack[start] (going back across sentences).
std::string WordsBefore(const std::vector<std::string>& haystack, size_t start, size_t n) {
  std::vector<std::string> words;  // in reverse order
  for (size_t back = 1; back <= haystack.size() && words.size() < n; ++back) {
    const std::string& s = haystack[(start + haystack.size() - back) % haystack.size()];
    size_t end = s.size();
    while (end > 0 && words.size() < n) {
      const size_t sp = s.rfind(' ', end - 1);
      const size_t begin = sp == std::string::npos ? 0 : sp + 1;
      words.push_back(s.substr(begin, end - begin));
      end = sp == std::string::npos ? 0 : sp;
    }
  }
  std::string out;
  for (size_t i = words.size(); i-- > 0;) out += (out.empty() ? "" : " ") + words[i];
  return out;
}

}  // namespace

StatusOr<std::vector<std::string>> LoadHaystack(const std::string& path) {
  namespace fs = std::filesystem;
  std::vector<std::string> files;
  if (IsDirectory(path)) {
    std::error_code ec;
    for (const auto& e : fs::directory_iterator(path, ec))
      if (e.is_regular_file() && e.path().extension() == ".txt") files.push_back(e.path().string());
    if (ec) return NotFoundError("cannot list " + path + ": " + ec.message());
    std::sort(files.begin(), files.end());
    if (files.empty()) return InvalidArgumentError("no .txt files in " + path);
  } else {
    files.push_back(path);
  }
  std::vector<std::string> sentences;
  for (const std::string& f : files) {
    ATTIC_ASSIGN_OR_RETURN(std::string text, ReadFileToString(f));
    AppendSentences(text, &sentences);
  }
  if (sentences.empty()) return InvalidArgumentError("no text in " + path);
  return sentences;
}

Needle MakeNeedle(NeedleKind kind, uint64_t seed, int trial) {
  Needle n;
  n.kind = kind;
  const uint64_t r = TrialRandom(seed, kind, trial, 1);
  if (kind == NeedleKind::kPassKey) {
    n.answer = std::to_string(10000 + r % 90000);
    n.sentence = "The pass key is " + n.answer + ". Remember it. " + n.answer + " is the pass key.";
    n.question = "What is the pass key? The pass key is";
  } else {
    const std::string name = kNames[(r >> 32) % (sizeof(kNames) / sizeof(kNames[0]))];
    n.answer = std::to_string(1000 + r % 9000);
    n.sentence = name + "'s number is " + n.answer + ".";
    n.question = "What is " + name + "'s number? " + name + "'s number is";
  }
  return n;
}

int AnswerTokens(const Needle& needle) { return static_cast<int>(needle.answer.size()) + 3; }

StatusOr<NeedlePrompt> BuildNeedlePrompt(const tokenizer::Tokenizer& tok, const std::vector<std::string>& haystack,
                                         size_t start, const Needle& needle, int length, double depth) {
  if (haystack.empty()) return InvalidArgumentError("the haystack is empty");
  tokenizer::EncodeOptions with_bos;  // BOS when the tokenizer's config adds one
  tokenizer::EncodeOptions no_bos;
  no_bos.add_bos = false;
  auto count = [&](const std::string& s) -> StatusOr<int64_t> {
    if (s.empty()) return int64_t{0};
    ATTIC_ASSIGN_OR_RETURN(std::vector<int32_t> ids, tok.Encode(s, no_bos));
    return static_cast<int64_t>(ids.size());
  };
  // Filler pieces: pieces[0], a lead-in of whole words from the text before `start` (it
  // makes the prompt's length exact to a word), then whole sentences from `start` on.
  // The needle goes at a piece boundary: before pieces[k] for k in 0..n.
  std::vector<std::string> pieces{""};
  for (int64_t total = 0; total < length;) {  // enough sentences to pass `length` on their own
    pieces.push_back(haystack[(start + pieces.size() - 1) % haystack.size()]);
    ATTIC_ASSIGN_OR_RETURN(int64_t n, count(pieces.back()));
    total += n;
  }
  // The boundary nearest to depth x the filler's tokens (each piece counted on its own).
  auto needle_after = [&](const std::vector<std::string>& ps) -> StatusOr<size_t> {
    std::vector<int64_t> cum{0};
    for (const std::string& p : ps) {
      ATTIC_ASSIGN_OR_RETURN(int64_t n, count(p));
      cum.push_back(cum.back() + n);
    }
    const double target = depth * static_cast<double>(cum.back());
    size_t best = 0;
    for (size_t k = 1; k < cum.size(); ++k)
      if (std::abs(static_cast<double>(cum[k]) - target) < std::abs(static_cast<double>(cum[best]) - target)) best = k;
    return best;
  };
  auto build = [&](const std::vector<std::string>& ps) -> StatusOr<std::vector<int32_t>> {
    ATTIC_ASSIGN_OR_RETURN(size_t k, needle_after(ps));
    return tok.Encode(JoinText(ps, k, needle, true), with_bos);
  };
  // The most whole sentences that fit, then the most lead-in words (token counts grow
  // with both).
  auto prefix = [&](size_t n_sentences, size_t n_words) {
    std::vector<std::string> ps(pieces.begin(), pieces.begin() + static_cast<std::ptrdiff_t>(1 + n_sentences));
    ps[0] = WordsBefore(haystack, start, n_words);
    return ps;
  };
  ATTIC_ASSIGN_OR_RETURN(std::vector<int32_t> best, build(prefix(0, 0)));
  if (static_cast<int>(best.size()) > length) {
    return InvalidArgumentError("a prompt of " + std::to_string(length) + " tokens cannot hold the needle and the "
                                "question (" + std::to_string(best.size()) + " tokens)");
  }
  size_t lo = 0, hi = pieces.size() - 1;
  while (lo < hi) {
    const size_t mid = (lo + hi + 1) / 2;
    ATTIC_ASSIGN_OR_RETURN(std::vector<int32_t> ids, build(prefix(mid, 0)));
    if (static_cast<int>(ids.size()) <= length) {
      lo = mid;
      best = std::move(ids);
    } else {
      hi = mid - 1;
    }
  }
  const size_t n_sentences = lo;
  lo = 0, hi = static_cast<size_t>(length);  // a word is at least one token
  while (lo < hi) {
    const size_t mid = (lo + hi + 1) / 2;
    ATTIC_ASSIGN_OR_RETURN(std::vector<int32_t> ids, build(prefix(n_sentences, mid)));
    if (static_cast<int>(ids.size()) <= length) {
      lo = mid;
      best = std::move(ids);
    } else {
      hi = mid - 1;
    }
  }
  const std::vector<std::string> ps = prefix(n_sentences, lo);
  NeedlePrompt p;
  p.tokens = std::move(best);
  p.filler_sentences = static_cast<int>(n_sentences);
  p.lead_in_words = static_cast<int>(lo);
  ATTIC_ASSIGN_OR_RETURN(size_t k, needle_after(ps));
  p.needle_after = static_cast<int>(k);
  int64_t before = 0, all = 0;
  for (size_t i = 0; i < ps.size(); ++i) {
    ATTIC_ASSIGN_OR_RETURN(int64_t n, count(ps[i]));
    all += n;
    if (i < k) before += n;
  }
  p.depth = all > 0 ? static_cast<double>(before) / static_cast<double>(all) : 0.0;
  ATTIC_ASSIGN_OR_RETURN(std::vector<int32_t> head, tok.Encode(JoinText(ps, k, needle, false), with_bos));
  p.needle_token = static_cast<int>(head.size());
  return p;
}

bool ExactMatch(const std::string& output, const std::string& answer) {
  size_t i = 0;
  while (i < output.size() && std::isspace(static_cast<unsigned char>(output[i]))) ++i;
  size_t j = i;
  while (j < output.size() && std::isdigit(static_cast<unsigned char>(output[j]))) ++j;
  return !answer.empty() && output.compare(i, j - i, answer) == 0;  // the whole digit run
}

StatusOr<NeedleRun> RunNeedleGrid(const std::vector<Method*>& methods, const tokenizer::Tokenizer& tok,
                                  const std::vector<std::string>& haystack, const NeedleOptions& options,
                                  const std::function<void(const std::string&)>& progress) {
  using Clock = std::chrono::steady_clock;
  NeedleRun run;
  run.options = options;
  for (Method* m : methods) run.methods.push_back(m->name());
  if (haystack.empty()) return InvalidArgumentError("the haystack is empty");
  for (int length : options.lengths) {
    const auto t0 = Clock::now();
    std::vector<int> correct(methods.size(), 0);
    int n = 0;
    for (NeedleKind kind : options.kinds) {
      for (int trial = 0; trial < options.trials; ++trial) {
        const Needle needle = MakeNeedle(kind, options.seed, trial);
        const size_t start = TrialRandom(options.seed, kind, trial, 2) % haystack.size();
        for (double depth : options.depths) {
          ATTIC_ASSIGN_OR_RETURN(NeedlePrompt prompt, BuildNeedlePrompt(tok, haystack, start, needle, length, depth));
          const int max_new = AnswerTokens(needle);
          ++n;
          for (size_t m = 0; m < methods.size(); ++m) {
            auto out = methods[m]->Greedy(prompt.tokens, max_new);
            if (!out.ok()) {
              return out.status().WithContext(methods[m]->name() + ", " + NeedleKindName(kind) + " at " +
                                              std::to_string(length) + " tokens");
            }
            NeedleTrial t;
            t.kind = kind;
            t.length = length;
            t.depth = depth;
            t.trial = trial;
            t.method = methods[m]->name();
            t.n_tokens = static_cast<int>(prompt.tokens.size());
            t.actual_depth = prompt.depth;
            t.answer = needle.answer;
            t.output = tok.Decode(*out, true);
            t.correct = ExactMatch(t.output, t.answer);
            correct[m] += t.correct ? 1 : 0;
            run.trials.push_back(std::move(t));
          }
        }
      }
    }
    if (progress) {
      std::string line = "needle: length " + std::to_string(length) + ": " + std::to_string(n) + " prompts";
      for (size_t m = 0; m < methods.size(); ++m) {
        char buf[96];
        std::snprintf(buf, sizeof(buf), ", %s %d/%d exact", methods[m]->name().c_str(), correct[m], n);
        line += buf;
      }
      char buf[48];
      std::snprintf(buf, sizeof(buf), " (%.1f s)", std::chrono::duration<double>(Clock::now() - t0).count());
      progress(line + buf);
    }
  }
  return run;
}

double CellAccuracy(const NeedleRun& run, const std::string& method, NeedleKind kind, int length, double depth) {
  int n = 0, ok = 0;
  for (const NeedleTrial& t : run.trials) {
    if (t.method != method || t.kind != kind || t.length != length || t.depth != depth) continue;
    ++n;
    ok += t.correct ? 1 : 0;
  }
  return n > 0 ? static_cast<double>(ok) / n : std::nan("");
}

}  // namespace attic::eval
