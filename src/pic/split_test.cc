// KVSplit tests with the real tokenizers (stories260K: SentencePiece-style with byte
// fallback; SmolLM2: byte-level BPE) on real text from ../shared/datasets. Expected
// values come from the input and the tokenizer alone: boundaries and paragraphs are
// found here by their own scanners, budgets are set from token counts of hand-picked
// prefixes, never from SplitDocument's output.
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

// Byte offsets where one chunk ends and the next begins.
std::vector<size_t> CutOffsets(const std::vector<TextChunk>& chunks) {
  std::vector<size_t> cuts;
  size_t pos = 0;
  for (size_t i = 0; i + 1 < chunks.size(); ++i) {
    pos += chunks[i].text.size();
    cuts.push_back(pos);
  }
  return cuts;
}

bool IsAsciiSpace(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f'; }
bool IsContinuationByte(char c) { return (static_cast<unsigned char>(c) & 0xC0) == 0x80; }

bool EndsWith(std::string_view s, std::string_view suffix) {
  return s.size() >= suffix.size() && s.substr(s.size() - suffix.size()) == suffix;
}

// A cut at `p` is at a boundary: right after whitespace, or right after a CJK sentence
// end (。！？), closing brackets/quotes allowed after it.
bool AtBoundary(std::string_view doc, size_t p) {
  if (p == 0 || p == doc.size()) return true;
  // Whitespace that opens the document belongs to its first word.
  if (doc.find_first_not_of(" \t\n\r\v\f") >= p) return false;
  if (IsAsciiSpace(doc[p - 1])) return true;
  std::string_view before = doc.substr(0, p);
  for (bool stripped = true; stripped;) {
    stripped = false;
    for (std::string_view closer : {"\u300D", "\u300F", "\uFF09", "\u201D", "\u2019", "\"", "'", ")", "]", "\u00BB"}) {
      if (EndsWith(before, closer)) {
        before.remove_suffix(closer.size());
        stripped = true;
      }
    }
  }
  return EndsWith(before, "\u3002") || EndsWith(before, "\uFF01") || EndsWith(before, "\uFF1F");
}

// Checks what holds for every semantic split: the texts rebuild the document, each
// chunk's tokens are its own text's encoding within budget, cuts fall between code
// points and at boundaries -- except inside a word that alone is over budget.
void ExpectSemanticInvariants(const Tokenizer& tok, std::string_view doc, const std::vector<TextChunk>& chunks,
                              int max_tokens) {
  ASSERT_FALSE(chunks.empty());
  EXPECT_EQ(JoinTexts(chunks), doc);
  for (size_t i = 0; i < chunks.size(); ++i) {
    EXPECT_FALSE(chunks[i].text.empty()) << "chunk " << i;
    EXPECT_LE(chunks[i].tokens.size(), static_cast<size_t>(max_tokens)) << "chunk " << i;
    EXPECT_EQ(chunks[i].tokens, EncodeNoBos(tok, chunks[i].text)) << "chunk " << i;
    EXPECT_TRUE(tokenizer::IsValidUtf8(chunks[i].text)) << "chunk " << i;
  }
  for (size_t p : CutOffsets(chunks)) {
    ASSERT_LT(p, doc.size());
    EXPECT_FALSE(IsContinuationByte(doc[p])) << "cut inside a UTF-8 sequence at byte " << p;
    if (AtBoundary(doc, p)) continue;
    // Inside a word: only allowed if the word (from the boundary before to the one
    // after) does not fit in the budget by itself.
    size_t a = p, b = p;
    while (!AtBoundary(doc, a)) --a;
    while (!AtBoundary(doc, b)) ++b;
    EXPECT_GT(CountTokens(tok, doc.substr(a, b - a)), static_cast<size_t>(max_tokens))
        << "cut inside a word that fits, at byte " << p << ": '" << doc.substr(a, b - a) << "'";
  }
}

// [begin, end) of each paragraph of `doc`, its separator (a whitespace run with two or
// more '\n', or `min_newlines` of them) included.
std::vector<std::pair<size_t, size_t>> Blocks(std::string_view doc, int min_newlines) {
  std::vector<std::pair<size_t, size_t>> out;
  size_t begin = 0;
  size_t i = 0;
  while (i < doc.size()) {
    if (!IsAsciiSpace(doc[i])) {
      ++i;
      continue;
    }
    const size_t run = i;
    int newlines = 0;
    for (; i < doc.size() && IsAsciiSpace(doc[i]); ++i) newlines += doc[i] == '\n';
    if (run > 0 && newlines >= min_newlines && i < doc.size()) {
      out.emplace_back(begin, i);
      begin = i;
    }
  }
  out.emplace_back(begin, doc.size());
  return out;
}

// No cut strictly inside a paragraph (min_newlines 2) or line (1) that fits alone.
// Returns how many blocks were checked.
int ExpectFittingBlocksWhole(const Tokenizer& tok, std::string_view doc, const std::vector<TextChunk>& chunks,
                             int max_tokens, int min_newlines) {
  const std::vector<size_t> cuts = CutOffsets(chunks);
  int checked = 0;
  for (auto [begin, end] : Blocks(doc, min_newlines)) {
    if (CountTokens(tok, doc.substr(begin, end - begin)) > static_cast<size_t>(max_tokens)) continue;
    ++checked;
    for (size_t p : cuts) {
      EXPECT_FALSE(p > begin && p < end) << "block [" << begin << ", " << end << ") fits in " << max_tokens
                                         << " tokens but is cut at " << p;
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

// The semantic split straight from its definition, with none of SplitDocument's
// search: from each chunk's start try every cut in order while the chunk still fits,
// end at the farthest fitting cut of the best level (0 paragraph .. 3 word) or, if not
// even the first word fits, at the farthest fitting code point. O(cuts x chunk) encodes.
std::vector<std::string> ReferenceSemantic(const Tokenizer& tok, std::string_view doc, int max_tokens) {
  struct RefCut {
    size_t pos;
    int level;
  };
  std::vector<RefCut> cuts;
  const size_t first_text = doc.find_first_not_of(" \t\n\r\v\f");
  for (size_t p = 1; p < doc.size(); ++p) {
    if (IsAsciiSpace(doc[p]) || first_text == std::string_view::npos || p <= first_text) continue;
    if (IsAsciiSpace(doc[p - 1])) {
      size_t a = p;
      while (IsAsciiSpace(doc[a - 1])) --a;
      const auto newlines = std::count(doc.begin() + a, doc.begin() + p, '\n');
      const int level = newlines >= 2 ? 0 : newlines == 1 ? 1 : EndsSentenceForTest(doc.substr(0, a), false) ? 2 : 3;
      cuts.push_back({p, level});
    } else if (!StartsWithCloser(doc.substr(p)) && EndsSentenceForTest(doc.substr(0, p), true)) {
      cuts.push_back({p, 2});
    }
  }
  cuts.push_back({doc.size(), 0});
  const auto fits = [&](size_t begin, size_t end) {
    return CountTokens(tok, doc.substr(begin, end - begin)) <= static_cast<size_t>(max_tokens);
  };
  std::vector<std::string> out;
  size_t next = 0;
  for (size_t start = 0; start < doc.size();) {
    while (cuts[next].pos <= start) ++next;
    ptrdiff_t best = -1;
    for (size_t j = next; j < cuts.size() && fits(start, cuts[j].pos); ++j) {
      if (best < 0 || cuts[j].level <= cuts[best].level) best = static_cast<ptrdiff_t>(j);
    }
    size_t end = 0;
    if (best >= 0) {
      end = cuts[best].pos;
    } else {
      for (size_t p = start + 1; p < cuts[next].pos && (IsContinuationByte(doc[p]) || fits(start, p)); ++p) {
        if (!IsContinuationByte(doc[p])) end = p;
      }
      if (end == 0) return {};
    }
    out.emplace_back(doc.substr(start, end - start));
    start = end;
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
  const int max_tokens = static_cast<int>(CountTokens(tok(), a + b + c));
  ASSERT_GT(CountTokens(tok(), doc), static_cast<size_t>(max_tokens));
  ASSERT_LE(CountTokens(tok(), d), static_cast<size_t>(max_tokens));
  EXPECT_EQ(Texts(SplitOrDie(tok(), doc, SplitMethod::kSemantic, max_tokens)),
            (std::vector<std::string>{a + b + c, d}));
}

TEST_P(SplitTest, SemanticPrefersParagraphOverLaterLines) {
  const std::string p1 = "First para line one.\nStill the first para.\n\n";
  const std::string rest = "Second para starts here.\nAnd it goes on with more words than the budget holds";
  const std::string doc = p1 + rest;
  // The reach from the start covers the paragraph end, a line end and two words after it.
  const int max_tokens = static_cast<int>(CountTokens(tok(), p1 + "Second para starts here.\nAnd it "));
  ASSERT_GT(CountTokens(tok(), doc), static_cast<size_t>(max_tokens));
  const std::vector<TextChunk> chunks = SplitOrDie(tok(), doc, SplitMethod::kSemantic, max_tokens);
  ASSERT_GE(chunks.size(), 2u);
  EXPECT_EQ(chunks[0].text, p1);
  ExpectSemanticInvariants(tok(), doc, chunks, max_tokens);
}

TEST_P(SplitTest, SemanticPrefersLineOverLaterWords) {
  const std::string l1 = "The cat sat on the mat.\n";
  const std::string l2 = "The dog ran to the park and played with a ball all day long";
  const std::string doc = l1 + l2;
  const int max_tokens = static_cast<int>(CountTokens(tok(), l1 + "The dog ran to the park "));
  ASSERT_GT(CountTokens(tok(), doc), static_cast<size_t>(max_tokens));
  const std::vector<TextChunk> chunks = SplitOrDie(tok(), doc, SplitMethod::kSemantic, max_tokens);
  ASSERT_GE(chunks.size(), 2u);
  EXPECT_EQ(chunks[0].text, l1);
  // The second line has no sentence end: its first chunk is its longest run of whole
  // words (each with the space after it) within budget.
  std::string want;
  for (size_t sp = l2.find(' '); sp != std::string::npos; sp = l2.find(' ', sp + 1)) {
    if (CountTokens(tok(), l2.substr(0, sp + 1)) <= static_cast<size_t>(max_tokens)) want = l2.substr(0, sp + 1);
  }
  ASSERT_FALSE(want.empty());
  if (CountTokens(tok(), l2) > static_cast<size_t>(max_tokens)) {
    EXPECT_EQ(chunks[1].text, want);
  }
  ExpectSemanticInvariants(tok(), doc, chunks, max_tokens);
}

TEST_P(SplitTest, SemanticPrefersSentenceOverLaterWords) {
  const std::string s1 = "Tom has a red ball. ";
  const std::string doc = s1 + "He likes to throw it very high into the blue sky every single morning";
  const int max_tokens = static_cast<int>(CountTokens(tok(), s1 + "He likes to throw "));
  ASSERT_GT(CountTokens(tok(), doc), static_cast<size_t>(max_tokens));
  const std::vector<TextChunk> chunks = SplitOrDie(tok(), doc, SplitMethod::kSemantic, max_tokens);
  ASSERT_GE(chunks.size(), 2u);
  EXPECT_EQ(chunks[0].text, s1);
  ExpectSemanticInvariants(tok(), doc, chunks, max_tokens);
}

TEST_P(SplitTest, SemanticSentenceEndsWithQuotesAndCjk) {
  // A closing quote after the period still ends the sentence; so does 。 with no space.
  const std::string s1 = "She said \"Hi.\" ";
  const std::string doc = s1 + "Then she walked away from the old house and never came back again";
  const int max_tokens = static_cast<int>(CountTokens(tok(), s1 + "Then she walked "));
  ASSERT_GT(CountTokens(tok(), doc), static_cast<size_t>(max_tokens));
  EXPECT_EQ(SplitOrDie(tok(), doc, SplitMethod::kSemantic, max_tokens).at(0).text, s1);

  const std::string c1 = "東京は日本の首都です。";
  const std::string cjk = c1 + "大阪は大きな都市です";
  const int cjk_max = static_cast<int>(CountTokens(tok(), c1 + "大阪"));
  ASSERT_GT(CountTokens(tok(), cjk), static_cast<size_t>(cjk_max));
  const std::vector<TextChunk> chunks = SplitOrDie(tok(), cjk, SplitMethod::kSemantic, cjk_max);
  EXPECT_EQ(chunks.at(0).text, c1);
  ExpectSemanticInvariants(tok(), cjk, chunks, cjk_max);
}

TEST_P(SplitTest, SemanticKeepsLeadingAndTrailingWhitespace) {
  const std::string doc = "\n\n  Hello there, world. How are you?  \n\n";
  for (int max_tokens : {4, 8, 512}) {
    const std::vector<TextChunk> chunks = SplitOrDie(tok(), doc, SplitMethod::kSemantic, max_tokens);
    ExpectSemanticInvariants(tok(), doc, chunks, max_tokens);
  }
  EXPECT_EQ(Texts(SplitOrDie(tok(), doc, SplitMethod::kSemantic, 512)), std::vector<std::string>{doc});
  // Separators stay with the chunk before: with a budget that holds every word and the
  // whitespace after it, no chunk but the first starts with whitespace.
  const std::vector<std::string> words = {"\n\n  Hello ", "there, ", "world. ", "How ", "are ", "you?  \n\n"};
  std::string joined;
  size_t widest = 0;
  for (const std::string& w : words) {
    joined += w;
    widest = std::max(widest, CountTokens(tok(), w));
  }
  ASSERT_EQ(joined, doc);
  const int roomy = static_cast<int>(widest);
  const std::vector<TextChunk> chunks = SplitOrDie(tok(), doc, SplitMethod::kSemantic, roomy);
  ExpectSemanticInvariants(tok(), doc, chunks, roomy);
  for (size_t i = 1; i < chunks.size(); ++i) EXPECT_FALSE(IsAsciiSpace(chunks[i].text[0])) << i;
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
  for (int max_tokens : {6, 16, 50}) {
    SCOPED_TRACE("max_tokens " + std::to_string(max_tokens));
    const std::vector<TextChunk> chunks = SplitOrDie(tok(), doc, SplitMethod::kSemantic, max_tokens);
    ExpectSemanticInvariants(tok(), doc, chunks, max_tokens);
    // The first word fits, the next does not: the first chunk is "Hi ".
    EXPECT_EQ(chunks.at(0).text, "Hi ");
    // Some cut falls inside the runs, which no budget here holds whole.
    int inside = 0;
    for (size_t p : CutOffsets(chunks)) inside += !AtBoundary(doc, p);
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
  std::vector<int32_t> joined;
  for (const TextChunk& c : fixed) joined.insert(joined.end(), c.tokens.begin(), c.tokens.end());
  EXPECT_EQ(joined, whole);
  EXPECT_EQ(JoinTexts(fixed), tok().Decode(whole));
  for (int max_tokens : {6, 12, 40}) {
    SCOPED_TRACE("max_tokens " + std::to_string(max_tokens));
    ExpectSemanticInvariants(tok(), doc, SplitOrDie(tok(), doc, SplitMethod::kSemantic, max_tokens), max_tokens);
    EXPECT_EQ(Texts(SplitOrDie(tok(), doc, SplitMethod::kSemantic, max_tokens)),
              ReferenceSemantic(tok(), doc, max_tokens));
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
