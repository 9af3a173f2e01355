// JsonStream against nlohmann::ordered_json itself (the whole-reply parse tool calls are
// read with): the compact text written while a value arrives in pieces equals
// parse(text).dump(-1), whatever the split; what nlohmann refuses is an error, and an
// error is only reported for input nlohmann refuses. Hand-written cases, then random
// values written with random whitespace and escapes, and random corruptions of them.
#include "server/json_stream.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <random>

namespace attic::server {
namespace {

using ojson = nlohmann::ordered_json;

std::string Dump(const ojson& v) { return v.dump(-1, ' ', false, ojson::error_handler_t::replace); }

// nlohmann's verdict on a whole text: its compact dump, or nullopt when it refuses it.
std::optional<std::string> Reference(const std::string& text) {
  try {
    return Dump(ojson::parse(text));
  } catch (const std::exception&) {
    return std::nullopt;
  }
}

struct Read {
  JsonStream::State state;
  std::string out;
  bool repeated_key;
};

// Feeds `text` cut at `cuts` (ascending positions), then ends it. Whatever follows the
// value must be whitespace, as for nlohmann::json::parse.
Read ReadPieces(const std::string& text, const std::vector<size_t>& cuts, JsonStream::Options options = {}) {
  JsonStream s(options);
  Read r{JsonStream::State::kReading, "", false};
  size_t at = 0;
  bool trailing = false;
  std::vector<size_t> ends = cuts;
  ends.push_back(text.size());
  for (size_t end : ends) {
    if (end <= at) continue;
    const std::string piece = text.substr(at, end - at);
    const size_t used = s.state() == JsonStream::State::kReading ? s.Feed(piece) : 0;
    if (piece.find_first_not_of(" \t\n\r", used) != std::string::npos) trailing = true;
    const std::string out = s.TakeOutput();
    r.out += out;
    at = end;
  }
  s.End();
  r.out += s.TakeOutput();
  r.state = trailing && s.state() == JsonStream::State::kDone ? JsonStream::State::kError : s.state();
  r.repeated_key = s.repeated_key();
  return r;
}

void ExpectLikeNlohmann(const std::string& text) {
  SCOPED_TRACE(text);
  const std::optional<std::string> want = Reference(text);
  std::vector<std::vector<size_t>> splits = {{}};
  for (size_t k = 1; k < text.size(); ++k) splits.push_back({k});  // two pieces, cut at every byte
  std::vector<size_t> bytes;
  for (size_t k = 1; k < text.size(); ++k) bytes.push_back(k);
  splits.push_back(bytes);  // one byte at a time
  for (const auto& cuts : splits) {
    const Read r = ReadPieces(text, cuts);
    if (want) {
      ASSERT_EQ(r.state, JsonStream::State::kDone) << "cuts " << cuts.size();
      if (!r.repeated_key) {
        EXPECT_EQ(r.out, *want) << "cuts " << cuts.size();
      }
    } else {
      EXPECT_EQ(r.state, JsonStream::State::kError) << "cuts " << cuts.size();
    }
  }
}

TEST(JsonStream, WritesWhatNlohmannWrites) {
  for (const char* text : {
           R"({"city": "Paris", "unit": "c"})",
           R"(  { "a" : [ 1 , 2.50 , -0 , -0.0 , 1e5 , 1E+2 , 0.1e-3 , 18446744073709551616 ] , "b" : { } , "c" : [ ] } )",
           R"({"t": true, "f": false, "n": null, "nested": {"deep": [[{"x": [null]}]]}})",
           R"({"s": "a\/b \u00e9 \ud83d\ude00 \u0001 \b\f\n\r\t \" \\ é 😀 \u007f"})",
           "\"plain\"",
           "12345",
           "-7.25e-3",
           "true",
           "[]",
       })
    ExpectLikeNlohmann(text);
}

TEST(JsonStream, RefusesWhatNlohmannRefuses) {
  for (const char* text : {
           R"({"a": 01})", R"({"a": 1.})", R"({"a": -})", R"({"a": .5})", R"({"a": +1})", R"({"a": 1e})",
           R"({"a": tru})", R"({"a": nul})", R"({"a": True})", R"({"a" 1})", R"({"a": 1,})", R"([1,])",
           R"({a: 1})", R"({"a": 'x'})", R"({"a": "\x"})", R"({"a": "\u12g4"})", R"({"a": "\ud800"})",
           R"({"a": "\ud800\u0041"})", R"({"a": "\udc00"})", "{\"a\": \"tab\there\"}", "{\"a\": \"\xC3\"}",
           "{\"a\": \"\xC3(\"}", "{\"a\": \"\xED\xA0\x80\"}", "{\"a\": \"\x80\"}", R"({"a": 1e400})",
           R"({"a": 1} x)", R"({"a": 1}})", "", "  ", "{", R"({"a": [1, 2)", R"("open)",
       })
    ExpectLikeNlohmann(text);
}

TEST(JsonStream, RepeatedKeysAreReported) {
  // nlohmann keeps the last value at the first key's place: no prefix can know that.
  const Read r = ReadPieces(R"({"a": 1, "b": {"a": 2}, "a": 3})", {});
  EXPECT_EQ(r.state, JsonStream::State::kDone);
  EXPECT_TRUE(r.repeated_key);
  EXPECT_EQ(*Reference(R"({"a": 1, "b": {"a": 2}, "a": 3})"), R"({"a":3,"b":{"a":2}})");
  EXPECT_FALSE(ReadPieces(R"({"a": {"a": 1}, "b": [{"a": 2}, {"a": 3}]})", {}).repeated_key);
}

TEST(JsonStream, ObjectOnlyAndByteOrderMark) {
  // As nlohmann reads the JSON text held in a string: a BOM only as the first bytes.
  const JsonStream::Options o{.object_only = true, .allow_bom = true};
  EXPECT_EQ(ReadPieces("\xEF\xBB\xBF {\"a\":1}", {}, o).out, "{\"a\":1}");
  EXPECT_EQ(ReadPieces("\xEF\xBB\xBF {\"a\":1}", {1, 2}, o).state, JsonStream::State::kDone);
  EXPECT_EQ(ReadPieces(" \xEF\xBB\xBF{}", {}, o).state, JsonStream::State::kError);
  EXPECT_EQ(ReadPieces("\xEF\xBB{}", {}, o).state, JsonStream::State::kError);
  EXPECT_EQ(ReadPieces("[1]", {}, o).state, JsonStream::State::kError);
  EXPECT_EQ(ReadPieces("\xEF\xBB\xBF{}", {}).state, JsonStream::State::kError);  // not allowed by default
  EXPECT_EQ(*Reference("\xEF\xBB\xBF {\"a\":1}"), "{\"a\":1}");
}

TEST(JsonStream, ValueEndsWhereItEnds) {
  JsonStream s;
  EXPECT_EQ(s.Feed(R"( {"a":[1]} ; rest)"), 10u);  // up to the closing brace
  EXPECT_EQ(s.state(), JsonStream::State::kDone);
  JsonStream n;
  EXPECT_EQ(n.Feed("42;"), 2u);  // a number ends before the byte after it
  EXPECT_EQ(n.state(), JsonStream::State::kDone);
  EXPECT_EQ(n.TakeOutput(), "42");
}

// Random values, written with random whitespace and a random choice of escapes.
class Writer {
 public:
  explicit Writer(uint64_t seed) : rng_(seed) {}

  std::string Value(int depth) {
    switch (Pick(depth > 3 ? 4 : 6)) {
      case 0: return Number();
      case 1: return String();
      case 2: return std::vector<std::string>{"true", "false", "null"}[Pick(3)];
      case 3: return Number();
      case 4: {
        std::string s = "{" + Space();
        const int n = Pick(4);
        for (int i = 0; i < n; ++i) s += (i ? "," + Space() : "") + Key() + Space() + ":" + Space() + Value(depth + 1) + Space();
        return s + "}";
      }
      default: {
        std::string s = "[" + Space();
        const int n = Pick(4);
        for (int i = 0; i < n; ++i) s += (i ? "," + Space() : "") + Value(depth + 1) + Space();
        return s + "]";
      }
    }
  }

  // A small corruption: a byte removed, doubled or replaced.
  std::string Corrupt(std::string s) {
    if (s.empty()) return s;
    const size_t at = Pick(static_cast<int>(s.size()));
    static const std::string kBytes = "{}[]\",:\\ 0-e.tu\xC3\x80";
    switch (Pick(3)) {
      case 0: s.erase(at, 1); break;
      case 1: s.insert(at, 1, s[at]); break;
      default: s[at] = kBytes[Pick(static_cast<int>(kBytes.size()))];
    }
    return s;
  }

 private:
  std::mt19937_64 rng_;
  int Pick(int n) { return static_cast<int>(rng_() % static_cast<uint64_t>(n)); }
  std::string Space() { return std::vector<std::string>{"", "", "", " ", "\n  ", "\t"}[Pick(6)]; }
  std::string Key() {
    // Few distinct keys, so that some objects repeat one.
    return std::vector<std::string>{R"("a")", R"("b")", R"("c\u0064")", R"("city")", R"("é")"}[Pick(5)];
  }
  std::string Number() {
    static const std::vector<std::string> kNumbers = {"0", "-0", "7", "-12", "3.25", "0.10", "1e3", "-2.5E-4",
                                                      "123456789012345678901234", "1.7976931348623157e308", "5e-324"};
    return kNumbers[Pick(static_cast<int>(kNumbers.size()))];
  }
  std::string String() {
    static const std::vector<std::string> kUnits = {"a", "Z", " ", "\\n", "\\\"", "\\\\", "\\/", "\\u00e9", "é",
                                                    "\\ud83d\\ude00", "😀", "\\u0007", "\\t", "中", "<", "\\u003c"};
    std::string s = "\"";
    for (int n = Pick(8); n > 0; --n) s += kUnits[Pick(static_cast<int>(kUnits.size()))];
    return s + "\"";
  }
};

TEST(JsonStream, RandomValuesAndCorruptionsAgreeWithNlohmann) {
  Writer w(20261201);
  int valid = 0, refused = 0, repeated = 0;
  for (int i = 0; i < 3000; ++i) {
    std::string text = w.Value(0);
    if (i % 2 == 1) text = w.Corrupt(text);
    SCOPED_TRACE(text);
    const std::optional<std::string> want = Reference(text);
    std::mt19937_64 rng(i);
    std::vector<size_t> cuts;
    for (size_t k = 1; k < text.size(); ++k)
      if (rng() % 3 == 0) cuts.push_back(k);
    const Read r = ReadPieces(text, cuts);
    if (!want) {
      ++refused;
      ASSERT_EQ(r.state, JsonStream::State::kError);
      continue;
    }
    ++valid;
    ASSERT_EQ(r.state, JsonStream::State::kDone);
    if (r.repeated_key) {
      ++repeated;
    } else {
      ASSERT_EQ(r.out, *want);
    }
  }
  // The generator reaches every kind of case.
  EXPECT_GT(valid, 1500);
  EXPECT_GT(refused, 500);
  EXPECT_GT(repeated, 50);
}

}  // namespace
}  // namespace attic::server
