// The JSON matcher against hand-written instances (accepted, refused; a fraction is
// written only when every fraction of its integer part is in bounds, so -1.5 >= -1.5 is
// not among them), and the token
// masks over stories260K's vocabulary: a random walk through allowed tokens always
// ends in a complete value within its budget, which nlohmann::json parses and hand
// checks validate (the schema's constraints written out here, not the matcher's).
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <random>

#include "attic/grammar/json_grammar.h"
#include "attic/tokenizer/tokenizer.h"

namespace attic::grammar {
namespace {

using ojson = nlohmann::ordered_json;

std::shared_ptr<const Grammar> Compile(const std::string& schema) {
  auto g = Grammar::FromOrderedJsonSchema(ojson::parse(schema));
  EXPECT_TRUE(g.ok()) << g.status().message();
  return g.ok() ? *g : nullptr;
}

// Whether the matcher takes `text` whole and is then complete.
bool Matches(const Grammar& g, const std::string& text) {
  Matcher m(&g);
  for (unsigned char c : text)
    if (!m.Feed(c)) return false;
  return m.Complete();
}

const char* kPerson = R"({"type":"object","properties":{
  "name":{"type":"string","minLength":2,"maxLength":4},
  "age":{"type":"integer","minimum":0,"maximum":120},
  "score":{"type":"number","minimum":-1.5,"maximum":2},
  "tags":{"type":"array","items":{"enum":["a","bc",3]},"minItems":1,"maxItems":2},
  "nick":{"type":["string","null"]},
  "opt":{"type":"boolean"}},
  "required":["name","age","score","tags","nick"],"additionalProperties":false})";

TEST(JsonMatcher, AcceptsInstancesAndRefusesTheRest) {
  auto g = Compile(kPerson);
  ASSERT_TRUE(g);
  for (const char* ok : {
           R"({"name":"ab","age":0,"score":-1,"tags":["a"],"nick":null})",
           R"({"name":"abcd","age":120,"score":2,"tags":["bc",3],"nick":"x","opt":true})",
           R"({"name":"\u00e9\n","age":7,"score":1.25,"tags":[3],"nick":"","opt":false})",
           R"({"name":"ab","age":9,"score":-0.5,"tags":["a"],"nick":null})",
           "{\"name\":\"\xC3\xA9\xE2\x82\xAC\",\"age\":1,\"score\":0,\"tags\":[\"a\"],\"nick\":null}",
       }) {
    EXPECT_TRUE(Matches(*g, ok)) << ok;
  }
  for (const char* bad : {
           R"({"name":"a","age":0,"score":0,"tags":["a"],"nick":null})",       // minLength
           R"({"name":"abcde","age":0,"score":0,"tags":["a"],"nick":null})",   // maxLength
           R"({"name":"ab","age":121,"score":0,"tags":["a"],"nick":null})",    // maximum
           R"({"name":"ab","age":-1,"score":0,"tags":["a"],"nick":null})",     // minimum
           R"({"name":"ab","age":1.5,"score":0,"tags":["a"],"nick":null})",    // integer
           R"({"name":"ab","age":1,"score":2.5,"tags":["a"],"nick":null})",    // number maximum
           R"({"name":"ab","age":1,"score":-2,"tags":["a"],"nick":null})",     // number minimum
           R"({"name":"ab","age":1,"score":0,"tags":[],"nick":null})",         // minItems
           R"({"name":"ab","age":1,"score":0,"tags":["a","a","a"],"nick":null})",  // maxItems
           R"({"name":"ab","age":1,"score":0,"tags":["b"],"nick":null})",      // enum
           R"({"name":"ab","age":1,"score":0,"tags":["a"]})",                  // required
           R"({"age":1,"name":"ab","score":0,"tags":["a"],"nick":null})",      // order
           R"({"name":"ab","age":1,"score":0,"tags":["a"],"nick":null,"x":1})",  // additional
           R"({"name": "ab","age":1,"score":0,"tags":["a"],"nick":null})",     // whitespace
           R"({"name":"ab","age":01,"score":0,"tags":["a"],"nick":null})",     // leading zero
           "{\"name\":\"\xF0\x9F\x98\x80\",\"age\":1,\"score\":0,\"tags\":[\"a\"],\"nick\":null}",  // outside the BMP
           "{\"name\":\"a\xC3\",\"age\":1,\"score\":0,\"tags\":[\"a\"],\"nick\":null}",  // broken UTF-8
       }) {
    EXPECT_FALSE(Matches(*g, bad)) << bad;
  }
}

TEST(JsonMatcher, AnyObjectAcceptsJsonObjectsOnly) {
  auto g = Grammar::AnyObject();
  for (const char* ok : {R"({})", R"({"a":[1,{"b":null}],"c":"d","e":-1.5e3,"f":true})", R"({"":{}})"})
    EXPECT_TRUE(Matches(*g, ok)) << ok;
  for (const char* bad : {R"([])", R"("x")", R"({"a":})", R"({"a":1,})", R"({a:1})", R"({"a":tru})"})
    EXPECT_FALSE(Matches(*g, bad)) << bad;
}

TEST(JsonGrammar, UnsupportedKeywordsAreNamed) {
  for (const auto& [schema, keyword] : std::vector<std::pair<std::string, std::string>>{
           {R"({"type":"object","properties":{"a":{"type":"string","pattern":"x"}}})", "'pattern'"},
           {R"({"type":"object","properties":{"a":{"type":"string","format":"date"}}})", "'format'"},
           {R"({"type":"object","properties":{"a":{"allOf":[]}}})", "'allOf'"},
           {R"({"type":"object","properties":{"a":{"anyOf":[{"type":"object"},{"type":"object"}]}}})", "'anyOf'"},
           {R"({"type":"object","properties":{"a":{"type":"string","minItems":1}}})", "'minItems'"},
       }) {
    auto g = Grammar::FromOrderedJsonSchema(ojson::parse(schema));
    ASSERT_FALSE(g.ok()) << schema;
    EXPECT_NE(g.status().message().find(keyword), std::string::npos) << g.status().message();
  }
  EXPECT_FALSE(Grammar::FromOrderedJsonSchema(ojson::parse(R"({"type":"array"})")).ok());  // the root is an object
}

// Random walks through the masks of stories260K's vocabulary: every walk ends complete
// within its budget, and what it wrote is an instance.
TEST(JsonProcessor, RandomWalksEndInValidInstancesWithinTheBudget) {
  auto tok = tokenizer::Tokenizer::FromDirectory(std::string(ATTIC_SHARED_DIR) + "/models/stories260K-hf");
  ASSERT_TRUE(tok.ok()) << tok.status().message();
  auto vocab = std::make_shared<Vocabulary>(**tok);
  ASSERT_TRUE(vocab->has_every_byte());
  auto g = Compile(kPerson);
  ASSERT_TRUE(g);
  // The shortest instance, one token per byte: the tightest budget that can end well.
  const std::string shortest = R"({"name":"ab","age":0,"score":0,"tags":[3],"nick":null})";
  ASSERT_TRUE(Matches(*g, shortest));
  std::mt19937_64 rng(42);
  for (int walk = 0; walk < 60; ++walk) {
    const int64_t budget = static_cast<int64_t>(shortest.size()) + walk % 5 * 25;
    JsonProcessor p(g, vocab, budget);
    std::string text;
    int64_t steps = 0;
    std::vector<float> logits(vocab->size());
    while (!p.Complete()) {
      ASSERT_LT(steps, budget) << text;
      std::fill(logits.begin(), logits.end(), 0.0f);
      p.Apply(logits.data(), vocab->size());
      std::vector<int32_t> allowed;
      for (int i = 0; i < vocab->size(); ++i)
        if (logits[i] == 0.0f) allowed.push_back(i);
      ASSERT_FALSE(allowed.empty()) << text;
      const int32_t t = allowed[rng() % allowed.size()];
      text += (*tok)->TokenBytes(t);
      p.Accept(t);
      ++steps;
    }
    SCOPED_TRACE(text);
    const nlohmann::json v = nlohmann::json::parse(text);  // throws if not JSON
    const std::string name = v.at("name").get<std::string>();
    // Characters (all in the BMP here): UTF-8 bytes that are not continuation bytes.
    int chars = 0;
    for (unsigned char c : name) chars += (c & 0xC0) != 0x80;
    EXPECT_GE(chars, 2);
    EXPECT_LE(chars, 4);
    EXPECT_TRUE(v.at("age").is_number_integer());
    EXPECT_GE(v.at("age").get<int64_t>(), 0);
    EXPECT_LE(v.at("age").get<int64_t>(), 120);
    EXPECT_GE(v.at("score").get<double>(), -1.5);
    EXPECT_LE(v.at("score").get<double>(), 2.0);
    EXPECT_GE(v.at("tags").size(), 1u);
    EXPECT_LE(v.at("tags").size(), 2u);
    for (const auto& t : v.at("tags")) EXPECT_TRUE(t == "a" || t == "bc" || t == 3);
    EXPECT_TRUE(v.at("nick").is_null() || v.at("nick").is_string());
    if (v.contains("opt")) {
      EXPECT_TRUE(v.at("opt").is_boolean());
    }
    EXPECT_LE(v.size(), 6u);
  }
}

// Tool calls: the arguments follow the schema of the function the name chose.
std::shared_ptr<const Grammar> Tools(bool array) {
  std::vector<Grammar::Function> fns = {
      {"get", ojson::parse(R"({"type":"object","properties":{"id":{"type":"integer","minimum":1}},"required":["id"]})")},
      {"get_all", ojson::parse(R"({"type":"object","properties":{"q":{"type":"string","maxLength":3}},"required":["q"]})")},
      {"now", ojson()},  // no parameters: {}
  };
  auto g = Grammar::ToolCalls(fns, "arguments", array);
  EXPECT_TRUE(g.ok()) << g.status().message();
  return g.ok() ? *g : nullptr;
}

TEST(ToolCallGrammar, ArgumentsFollowTheChosenFunction) {
  auto g = Tools(false);
  ASSERT_TRUE(g);
  for (const char* ok : {R"({"name":"get","arguments":{"id":3}})", R"({"name":"get_all","arguments":{"q":"ab"}})",
                         R"({"name":"now","arguments":{}})"})
    EXPECT_TRUE(Matches(*g, ok)) << ok;
  for (const char* bad : {
           R"({"name":"get","arguments":{"q":"ab"}})",      // get_all's arguments under get
           R"({"name":"get_all","arguments":{"id":3}})",    // and the other way round
           R"({"name":"get","arguments":{"id":0}})",        // minimum
           R"({"name":"get_all","arguments":{"q":"abcd"}})",  // maxLength
           R"({"name":"now","arguments":{"x":1}})",         // no properties
           R"({"name":"put","arguments":{}})",              // not a function
           R"({"arguments":{},"name":"now"})",              // order
           R"([{"name":"now","arguments":{}}])",            // not an array here
       })
    EXPECT_FALSE(Matches(*g, bad)) << bad;
  auto list = Tools(true);
  ASSERT_TRUE(list);
  EXPECT_TRUE(Matches(*list, R"([{"name":"get","arguments":{"id":1}},{"name":"get_all","arguments":{"q":""}}])"));
  EXPECT_FALSE(Matches(*list, R"([])"));
  EXPECT_FALSE(Matches(*list, R"({"name":"now","arguments":{}})"));
  // The same functions share one grammar (and its masks).
  EXPECT_EQ(Tools(true).get(), list.get());
}

TEST(ToolCallGrammar, BadParametersNameTheFunction) {
  auto bad = Grammar::ToolCalls({{"a", ojson::parse(R"({"type":"object"})")},
                                 {"b", ojson::parse(R"({"type":"object","properties":{"x":{"type":"string","pattern":"y"}}})")}},
                                "arguments", false);
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().message().rfind("functions[1]: ", 0), 0u) << bad.status().message();
  EXPECT_NE(bad.status().message().find("'pattern'"), std::string::npos);
  EXPECT_FALSE(Grammar::ToolCalls({{"a", ojson::parse(R"({"type":"string"})")}}, "arguments", false).ok());
  EXPECT_FALSE(Grammar::ToolCalls({}, "arguments", false).ok());
}

// Random walks through stories260K's masks under a tool-call grammar: every walk ends in
// a call of a declared function whose arguments meet that function's constraints.
TEST(ToolCallGrammar, RandomWalksEndInValidCalls) {
  auto tok = tokenizer::Tokenizer::FromDirectory(std::string(ATTIC_SHARED_DIR) + "/models/stories260K-hf");
  ASSERT_TRUE(tok.ok()) << tok.status().message();
  auto vocab = std::make_shared<Vocabulary>(**tok);
  auto g = Tools(true);
  ASSERT_TRUE(g);
  std::mt19937_64 rng(7);
  for (int walk = 0; walk < 40; ++walk) {
    const int64_t budget = 40 + walk % 4 * 30;
    JsonProcessor p(g, vocab, budget);
    std::string text;
    std::vector<float> logits(vocab->size());
    for (int64_t steps = 0; !p.Complete(); ++steps) {
      ASSERT_LT(steps, budget) << text;
      std::fill(logits.begin(), logits.end(), 0.0f);
      p.Apply(logits.data(), vocab->size());
      std::vector<int32_t> allowed;
      for (int i = 0; i < vocab->size(); ++i)
        if (logits[i] == 0.0f) allowed.push_back(i);
      ASSERT_FALSE(allowed.empty()) << text;
      const int32_t t = allowed[rng() % allowed.size()];
      text += (*tok)->TokenBytes(t);
      p.Accept(t);
    }
    SCOPED_TRACE(text);
    const nlohmann::json calls = nlohmann::json::parse(text);
    ASSERT_TRUE(calls.is_array());
    ASSERT_GE(calls.size(), 1u);
    for (const auto& c : calls) {
      ASSERT_EQ(c.size(), 2u);
      const std::string name = c.at("name");
      const nlohmann::json& args = c.at("arguments");
      if (name == "get") {
        ASSERT_EQ(args.size(), 1u);
        EXPECT_TRUE(args.at("id").is_number_integer());
        EXPECT_GE(args.at("id").get<int64_t>(), 1);
      } else if (name == "get_all") {
        ASSERT_EQ(args.size(), 1u);
        EXPECT_TRUE(args.at("q").is_string());
      } else {
        EXPECT_EQ(name, "now");
        EXPECT_TRUE(args.is_object() && args.empty());
      }
    }
  }
}

}  // namespace
}  // namespace attic::grammar
