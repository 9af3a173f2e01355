// KVSplit tests with the real tokenizers (stories260K: SentencePiece-style with byte
// fallback; SmolLM2: byte-level BPE) on real text from ../shared/datasets. Expected
// values come from the input and the tokenizer alone: the document's encoding and where
// each of its tokens starts are computed here from the token bytes, boundaries and
// paragraphs are found by this file's own scanners, budgets are set from token counts
// of hand-picked prefixes, never from SplitDocument's output.
#include "attic/pic/split.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include "tokenizer/tokenizer_test_util.h"

namespace attic::pic {
namespace {

using tokenizer::Tokenizer;

std::vector<int32_t> EncodeNoBos(const Tokenizer& tok, std::string_view text) {
  tokenizer::EncodeOptions opts;
  opts.add_bos = false;
  opts.parse_special = false;
  return tokenizer::testing::EncodeOrDie(tok, std::string(text), opts);
}

size_t CountTokens(const Tokenizer& tok, std::string_view text) { return EncodeNoBos(tok, text).size(); }

std::vector<TextChunk> SplitOrDie(const Tokenizer& tok, std::string_view text, SplitMethod method, int max_tokens) {
  SplitOptions opts;
  opts.method = method;
  opts.max_tokens = max_tokens;
  auto chunks = SplitDocument(tok, text, opts);
  EXPECT_TRUE(chunks.ok()) << chunks.status().ToString();
  return chunks.ok() ? std::move(chunks).value() : std::vector<TextChunk>();
}

std::string JoinTexts(const std::vector<TextChunk>& chunks) {
  std::string out;
  for (const TextChunk& c : chunks) out += c.text;
  return out;
}

std::vector<std::string> Texts(const std::vector<TextChunk>& chunks) {
  std::vector<std::string> out;
  for (const TextChunk& c : chunks) out.push_back(c.text);
  return out;
}

bool IsAsciiSpace(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f'; }
bool IsContinuationByte(char c) { return (static_cast<unsigned char>(c) & 0xC0) == 0x80; }

bool EndsWith(std::string_view s, std::string_view suffix) {
  return s.size() >= suffix.size() && s.substr(s.size() - suffix.size()) == suffix;
}

// A document's encoding (no BOS) and the text its tokens spell, with where each token
// starts in that text: the ground truth every split cuts.
struct Encoded {
  std::vector<int32_t> ids;
  std::string spelled;         // the tokens' bytes, without a SentencePiece leading space
  std::vector<size_t> starts;  // [ids.size() + 1]: token i is spelled[starts[i], starts[i + 1])

  // How many tokens start before byte `pos`: the index of the first token at or after it.
  size_t TokensBefore(size_t pos) const {
    return static_cast<size_t>(std::lower_bound(starts.begin(), starts.end() - 1, pos) - starts.begin());
  }
  // The last byte offset in [a, b] where a token starts; npos if none does.
  size_t LastStartIn(size_t a, size_t b) const {
    size_t out = std::string::npos;
    for (size_t i = 0; i < ids.size(); ++i) {
      if (starts[i] >= a && starts[i] <= b) out = starts[i];
    }
    return out;
  }
};

Encoded EncodeDoc(const Tokenizer& tok, std::string_view doc) {
  Encoded e;
  e.ids = EncodeNoBos(tok, doc);
  for (int32_t id : e.ids) {
    e.starts.push_back(e.spelled.size());
    e.spelled += tok.TokenBytes(id);
  }
  e.starts.push_back(e.spelled.size());
  if (tok.StripsLeadingSpace() && !e.spelled.empty() && e.spelled[0] == ' ') {
    e.spelled.erase(0, 1);
    for (size_t& s : e.starts) s = s > 0 ? s - 1 : 0;
  }
  return e;
}

std::vector<int32_t> JoinTokens(const std::vector<TextChunk>& chunks) {
  std::vector<int32_t> out;
  for (const TextChunk& c : chunks) out.insert(out.end(), c.tokens.begin(), c.tokens.end());
  return out;
}

// Token indices where one chunk ends and the next begins.
std::vector<size_t> CutTokens(const std::vector<TextChunk>& chunks) {
  std::vector<size_t> cuts;
  size_t k = 0;
  for (size_t i = 0; i + 1 < chunks.size(); ++i) {
    k += chunks[i].tokens.size();
    cuts.push_back(k);
  }
  return cuts;
}

constexpr std::string_view kClosersForTest[] = {"\u300D", "\u300F", "\uFF09", "\u201D", "\u2019",
                                                "\"",     "'",      ")",      "]",      "\u00BB"};

bool StartsWithCloser(std::string_view s) {
  for (std::string_view c : kClosersForTest) {
    if (s.substr(0, c.size()) == c) return true;
  }
  return false;
}

// Whether `before` ends a sentence: . ! ? … 。！？ then any closing quotes/brackets.
bool EndsSentenceForTest(std::string_view before, bool cjk_only) {
  for (bool stripped = true; stripped;) {
    stripped = false;
    for (std::string_view c : kClosersForTest) {
      if (EndsWith(before, c)) {
        before.remove_suffix(c.size());
        stripped = true;
      }
    }
  }
  for (std::string_view mark : {"\u3002", "\uFF01", "\uFF1F"}) {
    if (EndsWith(before, mark)) return true;
  }
  if (cjk_only) return false;
  for (std::string_view mark : {".", "!", "?", "\u2026"}) {
    if (EndsWith(before, mark)) return true;
  }
  return false;
}

// The boundary a chunk starting at byte `p` of `doc` would be cut at: 0 paragraph,
// 1 line, 2 sentence, 3 word (p at or inside a whitespace run that neither opens nor
// closes the document, graded by its newlines and what precedes it; or right after a
// CJK sentence end and its closers), -1 none.
int LevelAt(std::string_view doc, size_t p) {
  if (p == 0 || p >= doc.size()) return -1;
  size_t a = p, b = p;
  while (a > 0 && IsAsciiSpace(doc[a - 1])) --a;
  while (b < doc.size() && IsAsciiSpace(doc[b])) ++b;
  if (a < b) {
    if (a == 0 || b == doc.size()) return -1;
    const auto newlines = std::count(doc.begin() + a, doc.begin() + b, '\n');
    return newlines >= 2 ? 0 : newlines == 1 ? 1 : EndsSentenceForTest(doc.substr(0, a), false) ? 2 : 3;
  }
  return !StartsWithCloser(doc.substr(p)) && EndsSentenceForTest(doc.substr(0, p), true) ? 2 : -1;
}

// Checks what holds for every semantic split: the chunks' tokens are the document's
// encoding, cut into runs within budget; each text is what its tokens spell, so the
// texts rebuild the document (`spells_back`: the tokens spell it; otherwise they
// rebuild the tokens' own spelling); every cut's next token starts at a boundary,
// except where no boundary is within the chunk's reach: then it is the farthest token
// within reach that starts a code point.
void ExpectSemanticInvariants(const Tokenizer& tok, std::string_view doc, const std::vector<TextChunk>& chunks,
                              int max_tokens, bool spells_back = true) {
  ASSERT_FALSE(chunks.empty());
  const Encoded e = EncodeDoc(tok, doc);
  if (spells_back) {
    ASSERT_EQ(e.spelled, doc) << "the test expects a document the tokens spell back";
  }
  EXPECT_EQ(JoinTokens(chunks), e.ids);
  EXPECT_EQ(JoinTexts(chunks), e.spelled);
  const std::string_view text = e.spelled;
  size_t first = 0;
  for (size_t i = 0; i < chunks.size(); ++i) {
    const size_t last = first + chunks[i].tokens.size();
    EXPECT_FALSE(chunks[i].text.empty()) << "chunk " << i;
    EXPECT_GE(chunks[i].tokens.size(), 1u) << "chunk " << i;
    EXPECT_LE(chunks[i].tokens.size(), static_cast<size_t>(max_tokens)) << "chunk " << i;
    ASSERT_LE(last, e.ids.size());
    EXPECT_EQ(chunks[i].text, text.substr(e.starts[first], e.starts[last] - e.starts[first])) << "chunk " << i;
    if (spells_back) {
      EXPECT_TRUE(tokenizer::IsValidUtf8(chunks[i].text)) << "chunk " << i;
    }
    if (last < e.ids.size()) {
      const size_t p = e.starts[last];
      ASSERT_LT(p, text.size());
      EXPECT_FALSE(IsContinuationByte(text[p])) << "cut inside a UTF-8 sequence at byte " << p;
      if (LevelAt(text, p) < 0) {
        // Inside a word: no boundary within reach, and the cut is as late as it allows.
        const size_t reach = std::min(e.ids.size(), first + static_cast<size_t>(max_tokens));
        size_t latest = first;
        for (size_t k = first + 1; k <= reach && k < e.ids.size(); ++k) {
          const size_t q = e.starts[k];
          EXPECT_FALSE(q > e.starts[first] && LevelAt(text, q) >= 0)
              << "chunk " << i << " is cut inside a word at byte " << p << " but could end at the boundary at " << q;
          if (q > e.starts[first] && q < text.size() && !IsContinuationByte(text[q])) latest = k;
        }
        EXPECT_EQ(last, latest) << "chunk " << i << " is cut inside a word earlier than the budget allows";
      }
    }
    first = last;
  }
  EXPECT_EQ(first, e.ids.size());
}

// The whitespace runs of `doc` holding at least `min_newlines` '\n' that neither open
// nor close it, as [begin, end); with {0, 0} before them and {n, n} after them.
std::vector<std::pair<size_t, size_t>> Separators(std::string_view doc, int min_newlines) {
  std::vector<std::pair<size_t, size_t>> out = {{0, 0}};
  size_t i = 0;
  while (i < doc.size()) {
    if (!IsAsciiSpace(doc[i])) {
      ++i;
      continue;
    }
    const size_t run = i;
    int newlines = 0;
    for (; i < doc.size() && IsAsciiSpace(doc[i]); ++i) newlines += doc[i] == '\n';
    if (run > 0 && newlines >= min_newlines && i < doc.size()) out.emplace_back(run, i);
  }
  out.emplace_back(doc.size(), doc.size());
  return out;
}

// No cut strictly inside a paragraph (min_newlines 2) or line (1) that fits alone: one
// whose tokens, from the first token starting in the separator before it to the first
// starting in the one after, number at most max_tokens (a chunk starting at the former
// reaches the latter). Returns how many blocks were checked.
int ExpectFittingBlocksWhole(const Tokenizer& tok, std::string_view doc, const std::vector<TextChunk>& chunks,
                             int max_tokens, int min_newlines) {
  const Encoded e = EncodeDoc(tok, doc);
  std::vector<size_t> cuts;
  for (size_t k : CutTokens(chunks)) cuts.push_back(e.starts[k]);
  const auto seps = Separators(doc, min_newlines);
  int checked = 0;
  for (size_t s = 0; s + 1 < seps.size(); ++s) {
    const auto [prev_begin, prev_end] = seps[s];
    const auto [next_begin, next_end] = seps[s + 1];
    // A separator no token starts at or inside cannot be cut at.
    if (s > 0 && e.LastStartIn(prev_begin, prev_end) == std::string::npos) continue;
    if (s + 2 < seps.size() && e.LastStartIn(next_begin, next_end) == std::string::npos) continue;
    if (e.TokensBefore(next_begin) - e.TokensBefore(prev_begin) > static_cast<size_t>(max_tokens)) continue;
    ++checked;
    for (size_t p : cuts) {
      EXPECT_FALSE(p > prev_end && p < next_begin)
          << "block [" << prev_end << ", " << next_begin << ") fits in " << max_tokens << " tokens but is cut at " << p;
    }
  }
  return checked;
}

std::string ReadShared(const std::string& rel) {
  return tokenizer::testing::ReadOrDie(attic::testing::SharedDir() + "/" + rel);
}

// The ten MuSiQue passage files of CacheBlend's inputs, each passage as it is stored
// (they begin with "\n\n"), one after another (~130 KB; read once).
const std::string& MusiquePassages() {
  static const std::string passages = [] {
    std::string doc;
    for (int f = 1; f <= 10; ++f) {
      const nlohmann::json j = tokenizer::testing::ReadJsonOrDie(
          attic::testing::SharedDir() + "/datasets/longbench_musique_cacheblend/cacheblend_input_" + std::to_string(f) +
          ".json");
      const nlohmann::json& num = j["chunk_num"];  // a string in some files, a number in others
      const int n = num.is_string() ? std::stoi(num.get<std::string>()) : num.get<int>();
      EXPECT_GT(n, 0) << "cacheblend_input_" << f;
      for (int i = 0; i < n; ++i) doc += j[std::to_string(i)].get<std::string>();
    }
    return doc;
  }();
  return passages;
}

// Paul Graham essays (paragraphs separated by blank lines) until at least `bytes`.
std::string EssayText(size_t bytes) {
  std::string doc;
  for (const char* name : {"addiction", "aord", "apple", "avg", "before", "bias", "boss", "copy", "corpdev", "desres",
                           "diff", "ecw", "founders", "gap", "gba", "gh", "goodtaste", "hubs"}) {
    doc += ReadShared(std::string("datasets/paul_graham_essays/") + name + ".txt");
    doc += "\n\n";
    if (doc.size() >= bytes) break;
  }
  return doc;
}

// Accented Latin, CJK (with and without spaces after sentence ends), emoji (including
// a skin-tone sequence), in paragraphs, lines and sentences.
const char kMultilingual[] =
    "Café crème brûlée à la façon de grand-mère. Ça coûte 5 € — très cher!\n"
    "Zürich, Köln und Düsseldorf sind schön. Åre, Ærø og Øresund også.\n\n"
    "東京は日本の首都です。大阪は大きな都市です。京都には古い寺がたくさんあります。 "
    "「これはペンですか？」と彼は聞いた。はい！\n\n"
    "Emoji time 😀🎉 are fun 👍🏽 really… Smile 😀😀😀 again? Yes.\n"
    "Ελληνικά κείμενα εδώ. Русский текст тоже здесь.\n\n"
    "The end.";

// The semantic split straight from its definition, with none of SplitDocument's
// machinery: from each chunk's first token try every token within reach, keep the
// farthest one starting at the best boundary (LevelAt; code point starts last).
// Returns the chunks' texts (in the text the tokens spell), {} if a character does not
// fit. O(tokens x max_tokens).
std::vector<std::string> ReferenceSemantic(const Tokenizer& tok, std::string_view doc, int max_tokens) {
  const Encoded e = EncodeDoc(tok, doc);
  const std::string_view text = e.spelled;
  const size_t n = e.ids.size();
  std::vector<std::string> out;
  for (size_t first = 0; first < n;) {
    size_t last = n;
    if (n - first > static_cast<size_t>(max_tokens)) {
      int best_level = 5;
      last = 0;
      for (size_t k = first + 1; k <= first + static_cast<size_t>(max_tokens); ++k) {
        const size_t p = e.starts[k];
        if (p == e.starts[first] || p >= text.size()) continue;
        int level = LevelAt(text, p);
        if (level < 0 && !IsContinuationByte(text[p])) level = 4;
        if (level >= 0 && level <= best_level) {
          best_level = level;
          last = k;
        }
      }
      if (last == 0) return {};
    }
    out.emplace_back(text.substr(e.starts[first], e.starts[last] - e.starts[first]));
    first = last;
  }
  return out;
}

class SplitTest : public ::testing::TestWithParam<const char*> {
 protected:
  const Tokenizer& tok() const {
    return std::string(GetParam()) == "stories260K" ? tokenizer::testing::Stories() : tokenizer::testing::Smol();
  }
};

TEST(SplitMethodTest, NamesRoundTrip) {
  for (SplitMethod m : {SplitMethod::kNone, SplitMethod::kFixed, SplitMethod::kSemantic}) {
    auto parsed = ParseSplitMethod(SplitMethodName(m));
    ASSERT_TRUE(parsed.ok()) << parsed.status().ToString();
    EXPECT_EQ(*parsed, m);
  }
  EXPECT_STREQ(SplitMethodName(SplitMethod::kNone), "none");
  EXPECT_STREQ(SplitMethodName(SplitMethod::kFixed), "fixed");
  EXPECT_STREQ(SplitMethodName(SplitMethod::kSemantic), "semantic");
}

TEST(SplitMethodTest, UnknownNameListsAcceptedOnes) {
  for (const char* bad : {"", "Semantic", "fixed ", "paragraph"}) {
    auto parsed = ParseSplitMethod(bad);
    ASSERT_FALSE(parsed.ok()) << bad;
    EXPECT_EQ(parsed.status().code(), StatusCode::kInvalidArgument);
    const std::string msg = parsed.status().message();
    EXPECT_NE(msg.find("none"), std::string::npos) << msg;
    EXPECT_NE(msg.find("fixed"), std::string::npos) << msg;
    EXPECT_NE(msg.find("semantic"), std::string::npos) << msg;
  }
}

TEST_P(SplitTest, BadOptionsAreInvalidArgument) {
  for (SplitMethod m : {SplitMethod::kNone, SplitMethod::kFixed, SplitMethod::kSemantic}) {
    for (int max_tokens : {0, -1, kMaxSplitTokens + 1}) {
      SplitOptions opts;
      opts.method = m;
      opts.max_tokens = max_tokens;
      auto r = SplitDocument(tok(), "Some text.", opts);
      ASSERT_FALSE(r.ok());
      EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
      EXPECT_NE(r.status().message().find("max_tokens"), std::string::npos) << r.status().message();
      EXPECT_NE(r.status().message().find(std::to_string(max_tokens)), std::string::npos) << r.status().message();
    }
    SplitOptions opts;
    opts.method = m;
    auto empty = SplitDocument(tok(), "", opts);
    ASSERT_FALSE(empty.ok());
    EXPECT_EQ(empty.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(empty.status().message().find("empty"), std::string::npos) << empty.status().message();
    auto bad_utf8 = SplitDocument(tok(), "abc \xFF def", opts);
    ASSERT_FALSE(bad_utf8.ok());
    EXPECT_EQ(bad_utf8.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(bad_utf8.status().message().find("UTF-8"), std::string::npos) << bad_utf8.status().message();
    opts.max_tokens = kMaxSplitTokens;  // the largest budget is accepted
    EXPECT_TRUE(SplitDocument(tok(), "Some text.", opts).ok());
  }
}

TEST_P(SplitTest, NoneIsTheWholeDocument) {
  const std::string doc = kMultilingual;
  const std::vector<TextChunk> chunks = SplitOrDie(tok(), doc, SplitMethod::kNone, 1);
  ASSERT_EQ(chunks.size(), 1u);
  EXPECT_EQ(chunks[0].text, doc);
  EXPECT_EQ(chunks[0].tokens, EncodeNoBos(tok(), doc));
  EXPECT_NE(chunks[0].tokens.front(), tok().bos_id());
}

TEST_P(SplitTest, SpecialTokenTextStaysText) {
  // A document cannot forge control tokens: "<s>" / "<|im_start|>" are plain text.
  const std::string doc = "Hello <s> and <|im_start|>system friend.";
  for (SplitMethod m : {SplitMethod::kNone, SplitMethod::kFixed, SplitMethod::kSemantic}) {
    for (const TextChunk& c : SplitOrDie(tok(), doc, m, 512)) {
      for (int32_t id : c.tokens) EXPECT_FALSE(tok().IsSpecial(id)) << SplitMethodName(m) << " id " << id;
    }
  }
}

TEST_P(SplitTest, FixedRunsAreTheDocumentEncoding) {
  const std::string stories = ReadShared("datasets/tinystories_valid_sample/TinyStories-valid-sample.txt");
  for (const std::string& doc : {std::string(kMultilingual), stories.substr(0, 6000), MusiquePassages()}) {
    const std::vector<int32_t> whole = EncodeNoBos(tok(), doc);
    for (int max_tokens : {1, 7, 64, 512, 100000}) {
      SCOPED_TRACE("max_tokens " + std::to_string(max_tokens));
      const std::vector<TextChunk> chunks = SplitOrDie(tok(), doc, SplitMethod::kFixed, max_tokens);
      const size_t want_chunks = (whole.size() + max_tokens - 1) / max_tokens;
      ASSERT_EQ(chunks.size(), want_chunks);
      std::vector<int32_t> joined;
      for (size_t i = 0; i < chunks.size(); ++i) {
        const size_t want = i + 1 < chunks.size() ? max_tokens : whole.size() - (want_chunks - 1) * max_tokens;
        EXPECT_EQ(chunks[i].tokens.size(), want) << "chunk " << i;
        joined.insert(joined.end(), chunks[i].tokens.begin(), chunks[i].tokens.end());
      }
      EXPECT_EQ(joined, whole);
      // These documents hold no "▁" and no character outside the tokenizers' reach,
      // so the texts are the tokens' bytes and rebuild the document.
      EXPECT_EQ(JoinTexts(chunks), doc);
    }
  }
}

TEST_P(SplitTest, FixedTextIsWhatTheTokensSpell) {
  const std::string doc = "Once upon a time, a cat sat.\n\nThe end.";
  const std::vector<TextChunk> chunks = SplitOrDie(tok(), doc, SplitMethod::kFixed, 3);
  for (size_t i = 0; i < chunks.size(); ++i) {
    std::string spelled;
    for (int32_t id : chunks[i].tokens) spelled += tok().TokenBytes(id);
    // The first chunk of a SentencePiece tokenizer loses the space its normalizer put
    // before the document.
    if (i == 0 && tok().StripsLeadingSpace()) spelled.erase(0, 1);
    EXPECT_EQ(chunks[i].text, spelled) << "chunk " << i;
  }
}

TEST_P(SplitTest, SemanticFitsInOneChunk) {
  const std::string doc = "One.\n\nTwo.\n\nThree.\n";
  EXPECT_EQ(Texts(SplitOrDie(tok(), doc, SplitMethod::kSemantic, 512)), std::vector<std::string>{doc});
}

TEST_P(SplitTest, SemanticPacksShortParagraphs) {
  const std::string a = "Tom had a red ball.\n\n", b = "He threw it high.\n\n", c = "The dog ran after it.\n\n",
                    d = "They played all day long until the sun went down.";
  const std::string doc = a + b + c + d;
  const Encoded e = EncodeDoc(tok(), doc);
  // The budget reaches the last token starting in the blank line after c, and no further.
  const size_t abc = (a + b + c).size();
  const size_t cut = e.LastStartIn(abc - 2, abc);
  ASSERT_NE(cut, std::string::npos);
  const int max_tokens = static_cast<int>(e.TokensBefore(cut));
  ASSERT_LE(e.ids.size() - max_tokens, static_cast<size_t>(max_tokens));  // d fits after it
  EXPECT_EQ(Texts(SplitOrDie(tok(), doc, SplitMethod::kSemantic, max_tokens)),
            (std::vector<std::string>{doc.substr(0, cut), doc.substr(cut)}));
}

TEST_P(SplitTest, SemanticPrefersParagraphOverLaterLines) {
  const std::string p1 = "First para line one.\nStill the first para.\n\n";
  const std::string rest = "Second para starts here.\nAnd it goes on with more words than the budget holds";
  const std::string doc = p1 + rest;
  const Encoded e = EncodeDoc(tok(), doc);
  // The reach from the start covers the paragraph end, a line end and two words after it.
  const int max_tokens = static_cast<int>(e.TokensBefore((p1 + "Second para starts here.\nAnd it").size()) + 1);
  ASSERT_GT(e.ids.size(), static_cast<size_t>(max_tokens));
  const size_t cut = e.LastStartIn(p1.size() - 2, p1.size());
  ASSERT_NE(cut, std::string::npos);
  const std::vector<TextChunk> chunks = SplitOrDie(tok(), doc, SplitMethod::kSemantic, max_tokens);
  ASSERT_GE(chunks.size(), 2u);
  EXPECT_EQ(chunks[0].text, doc.substr(0, cut));
  ExpectSemanticInvariants(tok(), doc, chunks, max_tokens);
}

TEST_P(SplitTest, SemanticPrefersLineOverLaterWords) {
  const std::string l1 = "The cat sat on the mat.\n";
  const std::string l2 = "The dog ran to the park and played with a ball all day long";
  const std::string doc = l1 + l2;
  const Encoded e = EncodeDoc(tok(), doc);
  const int max_tokens = static_cast<int>(e.TokensBefore((l1 + "The dog ran to the park").size()) + 1);
  ASSERT_GT(e.ids.size(), static_cast<size_t>(max_tokens));
  const size_t cut = e.LastStartIn(l1.size() - 1, l1.size());
  ASSERT_NE(cut, std::string::npos);
  const std::vector<TextChunk> chunks = SplitOrDie(tok(), doc, SplitMethod::kSemantic, max_tokens);
  ASSERT_GE(chunks.size(), 2u);
  EXPECT_EQ(chunks[0].text, doc.substr(0, cut));
  // The second line has no sentence end: its first chunk ends at the farthest token
  // within reach that starts at one of its spaces.
  const size_t k1 = e.TokensBefore(cut);
  if (e.ids.size() - k1 > static_cast<size_t>(max_tokens)) {
    size_t want = 0;
    for (size_t k = k1 + max_tokens; k > k1 && want == 0; --k) {
      const size_t p = e.starts[k];
      if (p > cut && (doc[p] == ' ' || doc[p - 1] == ' ')) want = p;
    }
    ASSERT_NE(want, 0u);
    EXPECT_EQ(chunks[1].text, doc.substr(cut, want - cut));
  }
  ExpectSemanticInvariants(tok(), doc, chunks, max_tokens);
}

TEST_P(SplitTest, SemanticPrefersSentenceOverLaterWords) {
  const std::string s1 = "Tom has a red ball. ";
  const std::string doc = s1 + "He likes to throw it very high into the blue sky every single morning";
  const Encoded e = EncodeDoc(tok(), doc);
  const int max_tokens = static_cast<int>(e.TokensBefore((s1 + "He likes to throw").size()) + 1);
  ASSERT_GT(e.ids.size(), static_cast<size_t>(max_tokens));
  const size_t cut = e.LastStartIn(s1.size() - 1, s1.size());
  ASSERT_NE(cut, std::string::npos);
  const std::vector<TextChunk> chunks = SplitOrDie(tok(), doc, SplitMethod::kSemantic, max_tokens);
  ASSERT_GE(chunks.size(), 2u);
  EXPECT_EQ(chunks[0].text, doc.substr(0, cut));
  ExpectSemanticInvariants(tok(), doc, chunks, max_tokens);
}

TEST_P(SplitTest, SemanticSentenceEndsWithQuotesAndCjk) {
  // A closing quote after the period still ends the sentence; so does 。 with no space.
  const std::string s1 = "She said \"Hi.\" ";
  const std::string doc = s1 + "Then she walked away from the old house and never came back again";
  const Encoded e = EncodeDoc(tok(), doc);
  const int max_tokens = static_cast<int>(e.TokensBefore((s1 + "Then she walked").size()) + 1);
  ASSERT_GT(e.ids.size(), static_cast<size_t>(max_tokens));
  const size_t cut = e.LastStartIn(s1.size() - 1, s1.size());
  ASSERT_NE(cut, std::string::npos);
  EXPECT_EQ(SplitOrDie(tok(), doc, SplitMethod::kSemantic, max_tokens).at(0).text, doc.substr(0, cut));

  const std::string c1 = "東京は日本の首都です。";
  const std::string cjk = c1 + "大阪は大きな都市です";
  const Encoded ec = EncodeDoc(tok(), cjk);
  ASSERT_EQ(ec.LastStartIn(c1.size(), c1.size()), c1.size()) << "a token starts after 。";
  const int cjk_max = static_cast<int>(ec.TokensBefore((c1 + "大阪").size()));
  ASSERT_GT(ec.ids.size(), static_cast<size_t>(cjk_max));
  const std::vector<TextChunk> chunks = SplitOrDie(tok(), cjk, SplitMethod::kSemantic, cjk_max);
  EXPECT_EQ(chunks.at(0).text, c1);
  ExpectSemanticInvariants(tok(), cjk, chunks, cjk_max);
}

TEST_P(SplitTest, SemanticKeepsLeadingAndTrailingWhitespace) {
  const std::string doc = "\n\n  Hello there, world. How are you?  \n\n";
  for (int max_tokens : {4, 8, 512}) {
    SCOPED_TRACE("max_tokens " + std::to_string(max_tokens));
    const std::vector<TextChunk> chunks = SplitOrDie(tok(), doc, SplitMethod::kSemantic, max_tokens);
    ExpectSemanticInvariants(tok(), doc, chunks, max_tokens);
  }
  EXPECT_EQ(Texts(SplitOrDie(tok(), doc, SplitMethod::kSemantic, 512)), std::vector<std::string>{doc});
  // The runs that open and close the document are no boundaries: with a budget that
  // holds every word, the first chunk opens with its run and the last one ends with it.
  const Encoded e = EncodeDoc(tok(), doc);
  const size_t hello_end = doc.find("Hello") + 5, you_begin = doc.find("you?");
  const int roomy = static_cast<int>(std::max(e.TokensBefore(hello_end) + 1,
                                              e.ids.size() - e.TokensBefore(you_begin - 1)));
  const std::vector<TextChunk> chunks = SplitOrDie(tok(), doc, SplitMethod::kSemantic, roomy);
  ExpectSemanticInvariants(tok(), doc, chunks, roomy);
  ASSERT_GE(chunks.size(), 2u);
  EXPECT_EQ(chunks.front().text.substr(0, 9), "\n\n  Hello");
  EXPECT_TRUE(EndsWith(chunks.back().text, "you?  \n\n")) << chunks.back().text;
}

TEST_P(SplitTest, SemanticMultilingualCutsAtBoundaries) {
  const std::string doc = kMultilingual;
  for (int max_tokens : {8, 16, 32, 64, 128}) {
    SCOPED_TRACE("max_tokens " + std::to_string(max_tokens));
    const std::vector<TextChunk> chunks = SplitOrDie(tok(), doc, SplitMethod::kSemantic, max_tokens);
    ExpectSemanticInvariants(tok(), doc, chunks, max_tokens);
    ExpectFittingBlocksWhole(tok(), doc, chunks, max_tokens, 2);
    ExpectFittingBlocksWhole(tok(), doc, chunks, max_tokens, 1);
  }
}

TEST_P(SplitTest, SemanticLongWordIsCutBetweenCodePoints) {
  std::string emoji_run, cjk_run;
  for (int i = 0; i < 40; ++i) emoji_run += "😀👍🏽";
  for (int i = 0; i < 30; ++i) cjk_run += "東京は日本の首都";
  const std::string doc = "Hi " + emoji_run + " then " + cjk_run + " and résumé" + std::string(300, 'e') + " bye.";
  const Encoded e = EncodeDoc(tok(), doc);
  // "Hi" fits in every budget here, the emoji run after it in none: the first chunk ends
  // at the space between them.
  const size_t cut = e.LastStartIn(2, 3);
  ASSERT_NE(cut, std::string::npos);
  for (int max_tokens : {6, 16, 50}) {
    SCOPED_TRACE("max_tokens " + std::to_string(max_tokens));
    ASSERT_LE(e.TokensBefore(cut), static_cast<size_t>(max_tokens));
    const std::vector<TextChunk> chunks = SplitOrDie(tok(), doc, SplitMethod::kSemantic, max_tokens);
    ExpectSemanticInvariants(tok(), doc, chunks, max_tokens);
    EXPECT_EQ(chunks.at(0).text, doc.substr(0, cut));
    // Some cut falls inside the runs, which no budget here holds whole.
    int inside = 0;
    for (size_t k : CutTokens(chunks)) inside += LevelAt(doc, e.starts[k]) < 0;
    EXPECT_GT(inside, 0);
  }
}

TEST(SplitStoriesTest, BudgetBelowOneCharacterIsInvalidArgument) {
  // stories260K spells 😀 with four byte-fallback tokens.
  ASSERT_GT(CountTokens(tokenizer::testing::Stories(), "😀"), 1u);
  SplitOptions opts;
  opts.max_tokens = 1;
  auto r = SplitDocument(tokenizer::testing::Stories(), "😀", opts);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find("too small"), std::string::npos) << r.status().message();
}

TEST_P(SplitTest, SemanticRealPassagesKeepFittingParagraphs) {
  // Passages of ~2,300 characters, each opening with "\n\n": the largest budget holds
  // them whole, the others cut them at sentences.
  const std::string& doc = MusiquePassages();
  for (int max_tokens : {64, 2048}) {
    SCOPED_TRACE("max_tokens " + std::to_string(max_tokens));
    const std::vector<TextChunk> chunks = SplitOrDie(tok(), doc, SplitMethod::kSemantic, max_tokens);
    ExpectSemanticInvariants(tok(), doc, chunks, max_tokens);
    const int whole = ExpectFittingBlocksWhole(tok(), doc, chunks, max_tokens, 2);
    if (max_tokens == 2048) {
      EXPECT_GT(whole, 0);
    }
  }
}

TEST_P(SplitTest, SemanticTinyStoriesKeepsFittingLines) {
  // One story per line, no blank lines: lines are the best boundaries.
  const std::string doc = ReadShared("datasets/tinystories_valid_sample/TinyStories-valid-sample.txt");
  for (int max_tokens : {32, 128, 512}) {
    SCOPED_TRACE("max_tokens " + std::to_string(max_tokens));
    const std::vector<TextChunk> chunks = SplitOrDie(tok(), doc, SplitMethod::kSemantic, max_tokens);
    ExpectSemanticInvariants(tok(), doc, chunks, max_tokens);
    ExpectFittingBlocksWhole(tok(), doc, chunks, max_tokens, 1);
  }
}

TEST_P(SplitTest, SemanticEssaysKeepFittingParagraphs) {
  const std::string doc = EssayText(40000);
  for (int max_tokens : {100, 512}) {
    SCOPED_TRACE("max_tokens " + std::to_string(max_tokens));
    const std::vector<TextChunk> chunks = SplitOrDie(tok(), doc, SplitMethod::kSemantic, max_tokens);
    ExpectSemanticInvariants(tok(), doc, chunks, max_tokens);
    EXPECT_GT(ExpectFittingBlocksWhole(tok(), doc, chunks, max_tokens, 2), 0);
  }
}

TEST_P(SplitTest, SemanticMatchesReferenceSplit) {
  const std::string stories = ReadShared("datasets/tinystories_valid_sample/TinyStories-valid-sample.txt");
  const std::string essay = EssayText(1);
  std::string long_words = "Hi ";
  for (int i = 0; i < 12; ++i) long_words += "😀👍🏽東京";
  long_words += " then résumé" + std::string(80, 'e') + " bye.\n\nDone.";
  const std::vector<std::string> docs = {kMultilingual, stories.substr(0, 5000), essay.substr(0, 7000),
                                         MusiquePassages().substr(0, 5000), long_words};
  for (size_t d = 0; d < docs.size(); ++d) {
    for (int max_tokens : {8, 24, 100, 300}) {
      SCOPED_TRACE("doc " + std::to_string(d) + ", max_tokens " + std::to_string(max_tokens));
      const std::vector<std::string> want = ReferenceSemantic(tok(), docs[d], max_tokens);
      ASSERT_FALSE(want.empty());
      EXPECT_EQ(Texts(SplitOrDie(tok(), docs[d], SplitMethod::kSemantic, max_tokens)), want);
    }
  }
}

TEST_P(SplitTest, TokensThatDoNotSpellTheDocument) {
  // stories260K's tokens spell "▁" (U+2581) as a space; SmolLM2's spell it exactly.
  const std::string doc = "The \u2581 sign, and \u2581\u2581 twice. Then more words here.\n\nNext para \u2581.";
  const std::vector<int32_t> whole = EncodeNoBos(tok(), doc);
  const std::vector<TextChunk> fixed = SplitOrDie(tok(), doc, SplitMethod::kFixed, 5);
  EXPECT_EQ(JoinTokens(fixed), whole);
  EXPECT_EQ(JoinTexts(fixed), tok().Decode(whole));
  for (int max_tokens : {6, 12, 40}) {
    SCOPED_TRACE("max_tokens " + std::to_string(max_tokens));
    const std::vector<TextChunk> chunks = SplitOrDie(tok(), doc, SplitMethod::kSemantic, max_tokens);
    ExpectSemanticInvariants(tok(), doc, chunks, max_tokens, /*spells_back=*/false);
    EXPECT_EQ(JoinTexts(chunks), tok().Decode(whole));
    EXPECT_EQ(Texts(chunks), ReferenceSemantic(tok(), doc, max_tokens));
  }
}

TEST_P(SplitTest, SemanticChunksAreTheDocumentEncoding) {
  // Linking the chunks in order gives the document's own tokens: no token is added or
  // changed at a cut (a chunk encoded on its own would end in a lone "▁" after its last
  // word with SentencePiece-style tokenizers, or start with one).
  const std::string stories = ReadShared("datasets/tinystories_valid_sample/TinyStories-valid-sample.txt");
  for (const std::string& doc : {std::string(kMultilingual), stories.substr(0, 20000), EssayText(20000)}) {
    const std::vector<int32_t> whole = EncodeNoBos(tok(), doc);
    for (int max_tokens : {16, 64, 512}) {
      SCOPED_TRACE("max_tokens " + std::to_string(max_tokens));
      const std::vector<TextChunk> chunks = SplitOrDie(tok(), doc, SplitMethod::kSemantic, max_tokens);
      EXPECT_EQ(JoinTokens(chunks), whole);
      EXPECT_EQ(JoinTexts(chunks), doc);
      EXPECT_GE(chunks.size(), (whole.size() + max_tokens - 1) / max_tokens);
    }
  }
}

// Prints the time to split ~100k characters (no bound: the machine is shared): prose,
// and the worst cases for the search -- one 100k-character word, CJK without any
// sentence end -- where every chunk is cut between code points.
TEST_P(SplitTest, SemanticLongDocumentTime) {
  std::string word, cjk;
  for (int i = 0; word.size() < 100000; ++i) word += static_cast<char>('a' + (i * 7) % 26);
  while (cjk.size() < 100000) cjk += "東京は日本の首都大阪は大きな都市";
  const std::string essays = EssayText(100000);
  ASSERT_GE(essays.size(), 100000u);
  const std::pair<const char*, const std::string*> docs[] = {{"essays", &essays}, {"one word", &word}, {"cjk", &cjk}};
  for (auto [name, doc] : docs) {
    for (int max_tokens : {64, 512}) {
      SplitOptions opts;
      opts.max_tokens = max_tokens;
      const auto t0 = std::chrono::steady_clock::now();
      auto chunks = SplitDocument(tok(), *doc, opts);
      const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
      ASSERT_TRUE(chunks.ok()) << chunks.status().ToString();
      std::printf("[ time     ] %s: semantic split of %s (%zu bytes) at max_tokens %d: %zu chunks in %.1f ms\n",
                  GetParam(), name, doc->size(), max_tokens, chunks->size(), ms);
      EXPECT_EQ(JoinTexts(*chunks), *doc);
      for (const TextChunk& c : *chunks) {
        EXPECT_LE(c.tokens.size(), static_cast<size_t>(max_tokens));
        EXPECT_TRUE(tokenizer::IsValidUtf8(c.text));
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Tokenizers, SplitTest, ::testing::Values("stories260K", "smollm2"),
                         [](const ::testing::TestParamInfo<const char*>& info) { return std::string(info.param); });

}  // namespace
}  // namespace attic::pic
