// OpenAI request parsing (every field's type and range), response/chunk/error bodies,
// and the Prometheus rendering of the metrics.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "attic/pq/sparse_planner.h"
#include "attic/server/metrics.h"
#include "attic/server/openai_api.h"
#include "attic/store/store_planner.h"

namespace attic::server {
namespace {

using json = nlohmann::json;

ApiError ChatError(const std::string& body) {
  ParseResult r = ParseApiRequest(ApiKind::kChat, body);
  EXPECT_TRUE(r.error.has_value()) << body;
  return r.error.value_or(ApiError{});
}

ApiRequest Chat(const std::string& body) {
  ParseResult r = ParseApiRequest(ApiKind::kChat, body);
  EXPECT_FALSE(r.error.has_value()) << body << ": " << (r.error ? r.error->message : "");
  return r.request;
}

TEST(OpenAiRequest, ParsesEveryChatField) {
  ApiRequest r = Chat(R"({"model":"m","messages":[{"role":"developer","content":"Be nice."},
      {"role":"user","content":[{"type":"text","text":"Hello "},{"type":"text","text":"there"}]},
      {"role":"assistant","content":null},{"role":"user","content":"x","name":"bob"}],
      "max_tokens":10,"max_completion_tokens":7,"temperature":0.5,"top_p":0.9,"seed":-3,"stop":"END",
      "stream":true,"stream_options":{"include_usage":true},"n":1,"user":"u","session_id":"s1","session_ttl":30,
      "presence_penalty":0,"frequency_penalty":0,"logprobs":false,"tools":[],"response_format":{"type":"text"},
      "unknown_field":{"a":[1,2]}})");
  EXPECT_EQ(r.model, "m");
  ASSERT_EQ(r.messages.size(), 4u);
  EXPECT_EQ(r.messages[0].role, "system");
  EXPECT_EQ(r.messages[1].content, "Hello there");
  EXPECT_EQ(r.messages[2].role, "assistant");
  EXPECT_EQ(r.messages[2].content, "");
  EXPECT_EQ(r.max_tokens.value(), 7);  // max_completion_tokens wins
  EXPECT_FLOAT_EQ(r.temperature, 0.5f);
  EXPECT_FLOAT_EQ(r.top_p, 0.9f);
  EXPECT_EQ(r.seed.value(), static_cast<uint64_t>(-3));
  EXPECT_EQ(r.stop, std::vector<std::string>{"END"});
  EXPECT_TRUE(r.stream);
  EXPECT_TRUE(r.include_usage);
  EXPECT_EQ(r.session_id, "s1");
  EXPECT_EQ(r.session_ttl_s, 30);
}

// Caught by fuzz/openai_request_fuzz's echo invariant (corpus seed-12): header bytes reached the session
// id unchecked, and a session id that is not UTF-8 made every JSON echo of it throw (a
// 500 on GET /v1/sessions).
TEST(OpenAiRequest, SessionHeaderMustBeUtf8) {
  ApiRequest r = Chat(R"({"model":"m","messages":[{"role":"user","content":"hi"}]})");
  std::optional<ApiError> e = ApplySessionHeader("conv-\xff\xfe", &r);
  ASSERT_TRUE(e.has_value());
  EXPECT_EQ(e->http_status, 400);
  EXPECT_EQ(e->param, "session_id");
  EXPECT_EQ(r.session_id, "");
  EXPECT_FALSE(ApplySessionHeader("conv-\xc3\xa9", &r).has_value());  // "conv-é"
  EXPECT_EQ(r.session_id, "conv-\xc3\xa9");
}

TEST(OpenAiRequest, SessionHeaderNamesTheSessionWhenTheBodyDoesNotOrAgrees) {
  const std::string msgs = R"("messages":[{"role":"user","content":"hi"}])";
  ApiRequest none = Chat(R"({"model":"m",)" + msgs + "}");
  EXPECT_FALSE(ApplySessionHeader("", &none).has_value());  // no header: no session
  EXPECT_EQ(none.session_id, "");
  ASSERT_FALSE(ApplySessionHeader("conv-7", &none).has_value());
  EXPECT_EQ(none.session_id, "conv-7");
  ApiRequest same = Chat(R"({"model":"m",)" + msgs + R"(,"session_id":"conv-7"})");
  ASSERT_FALSE(ApplySessionHeader("conv-7", &same).has_value());
  EXPECT_EQ(same.session_id, "conv-7");
  ApiRequest body_only = Chat(R"({"model":"m",)" + msgs + R"(,"session_id":"conv-7"})");
  ASSERT_FALSE(ApplySessionHeader("", &body_only).has_value());
  EXPECT_EQ(body_only.session_id, "conv-7");

  ApiRequest other = Chat(R"({"model":"m",)" + msgs + R"(,"session_id":"conv-8"})");
  std::optional<ApiError> e = ApplySessionHeader("conv-7", &other);
  ASSERT_TRUE(e.has_value());
  EXPECT_EQ(e->http_status, 400);
  EXPECT_EQ(e->param, "session_id");
  EXPECT_EQ(other.session_id, "conv-8");
  ApiRequest longer = Chat(R"({"model":"m",)" + msgs + "}");
  EXPECT_FALSE(ApplySessionHeader(std::string(256, 'a'), &longer).has_value());
  e = ApplySessionHeader(std::string(257, 'a'), &longer);
  ASSERT_TRUE(e.has_value());
  EXPECT_EQ(e->http_status, 400);
}

TEST(OpenAiRequest, ContextCachePartsStandInTheTextWhereTheyAre) {
  ApiRequest r = Chat(R"({"model":"m","messages":[{"role":"user","content":[{"type":"text","text":"A "},
      {"type":"context_cache","id":"ctx-1"},{"type":"text","text":"B","cache_control":{"type":"ephemeral","ttl":"1h"}},
      {"type":"context_cache","id":"ctx-1-c0"},{"type":"text","text":" C"}]}],
      "link":{"method":"cacheblend","ratio":0.3,"check_layer":2}})");
  ASSERT_EQ(r.cache_parts.size(), 3u);
  EXPECT_EQ(r.messages[0].content,
            std::string("A \xEE\x80\x80" "attic-part:0\xEE\x80\x81\xEE\x80\x80" "attic-part:1\xEE\x80\x81"
                        "\xEE\x80\x80" "attic-part:2\xEE\x80\x81 C"));
  EXPECT_EQ(r.cache_parts[0].cache_id, "ctx-1");
  EXPECT_EQ(r.cache_parts[1].cache_id, "");
  EXPECT_EQ(r.cache_parts[1].text, "B");
  EXPECT_EQ(r.cache_parts[1].ttl_s, 3600);
  EXPECT_EQ(r.cache_parts[2].cache_id, "ctx-1-c0");
  ASSERT_TRUE(r.link.has_value());
  EXPECT_EQ(r.link->method, pic::LinkMethod::kCacheBlend);
  EXPECT_DOUBLE_EQ(r.link->ratio, 0.3);
  EXPECT_EQ(r.link->check_layer, 2);
  // A completion prompt holding any object is one prompt of parts.
  ParseResult c = ParseApiRequest(ApiKind::kCompletion,
                                  R"({"model":"m","prompt":["Once",{"type":"context_cache","id":"ctx-2"}," upon"]})");
  ASSERT_FALSE(c.error.has_value()) << c.error->message;
  EXPECT_EQ(c.request.prompt_text, std::string("Once\xEE\x80\x80" "attic-part:0\xEE\x80\x81 upon"));
  EXPECT_EQ(c.request.cache_parts.size(), 1u);
}

TEST(OpenAiRequest, BadContextCachePartsAndLinksAre400NamingTheParam) {
  const std::string m = R"({"model":"m","messages":[{"role":"user","content":)";
  EXPECT_EQ(ChatError(m + R"([{"type":"context_cache"}]}]})").param, "messages[0].content[0].id");
  EXPECT_EQ(ChatError(m + R"([{"type":"text","text":"x","cache_control":{"type":"forever"}}]}]})").param,
            "messages[0].content[0].cache_control");
  EXPECT_EQ(ChatError(m + R"([{"type":"text","text":"x","cache_control":{"type":"ephemeral","ttl":"2d"}}]}]})").param,
            "messages[0].content[0].cache_control.ttl");
  EXPECT_EQ(ChatError(m + R"("a \uE000attic-part:0\uE001"}]})").param, "messages[0].content");
  EXPECT_EQ(ChatError(m + R"("x"}],"link":{"method":"fast"}})").param, "link.method");
  EXPECT_EQ(ChatError(m + R"("x"}],"link":{"method":"cacheblend","ratio":2}})").param, "link.ratio");
  EXPECT_EQ(ChatError(m + R"("x"}],"link":{"method":"attnlink","k":-1}})").param, "link.k");
  EXPECT_EQ(ChatError(m + R"("x"}],"link":{"method":"naive","k":4}})").param, "link.k");
  EXPECT_EQ(ChatError(m + R"("x"}],"link":"attnlink"})").param, "link");
}

TEST(OpenAiRequest, SparseMapsOntoSparseOptions) {
  const std::string m = R"({"model":"m","messages":[{"role":"user","content":"x"}],)";
  EXPECT_FALSE(Chat(m + R"("max_tokens":1})").sparse.has_value());  // absent: the server's --sparse
  ApiRequest r = Chat(m + R"("sparse":{"method":"pq","ratio":0.2}})");
  ASSERT_TRUE(r.sparse.has_value());
  EXPECT_EQ(r.sparse->method, pq::SparseMethod::kPq);
  EXPECT_DOUBLE_EQ(r.sparse->ratio, 0.2);
  EXPECT_EQ(r.sparse->count, 0);
  EXPECT_FALSE(r.sparse->fixed_iterations);  // adaptive unless iterations are given
  const pq::SparseOptions defaults;
  EXPECT_EQ(r.sparse->n_initial, defaults.n_initial);
  EXPECT_EQ(r.sparse->n_local, defaults.n_local);
  EXPECT_EQ(r.sparse->min_slots, defaults.min_slots);
  r = Chat(m + R"("sparse":{"method":"pq","count":2048,"initial":8,"local":64,"iterations":5,"combine":"max",
               "min_tokens":128}})");
  ASSERT_TRUE(r.sparse.has_value());
  EXPECT_EQ(r.sparse->count, 2048);
  EXPECT_EQ(r.sparse->n_initial, 8);
  EXPECT_EQ(r.sparse->n_local, 64);
  EXPECT_EQ(r.sparse->pq.iterations, 5);
  EXPECT_TRUE(r.sparse->fixed_iterations);
  EXPECT_EQ(r.sparse->combine, pq::GqaCombine::kMax);
  EXPECT_EQ(r.sparse->min_slots, 128);
  EXPECT_EQ(Chat(m + R"("sparse":{"method":"oracle","ratio":1}})").sparse->method, pq::SparseMethod::kOracle);
  EXPECT_EQ(Chat(m + R"("sparse":{"method":"streaming","count":256,"local":200}})").sparse->method,
            pq::SparseMethod::kStreaming);
  EXPECT_EQ(Chat(m + R"("sparse":{"method":"h2o","ratio":0.1,"combine":"sum"}})").sparse->method,
            pq::SparseMethod::kH2o);
  EXPECT_EQ(Chat(m + R"("sparse":{"method":"full"}})").sparse->method, pq::SparseMethod::kFull);
  EXPECT_TRUE(Chat(m + R"("sparse":null})").sparse == std::nullopt);
  EXPECT_FALSE(Chat(m + R"("sparse":{"method":"pq"}})").sparse->offload());
  EXPECT_FALSE(Chat(m + R"("sparse":{"method":"pq","offload":false}})").sparse->offload());
  r = Chat(m + R"("sparse":{"method":"pq","ratio":0.1,"offload":true}})");
  EXPECT_EQ(r.sparse->offload_cache_blocks, pq::kDefaultOffloadCacheBlocks);
  EXPECT_EQ(r.sparse->offload_policy, pq::CachePolicy::kLru);
  r = Chat(m + R"("sparse":{"method":"streaming","offload":{"cache_blocks":0,"policy":"lfu"}}})");
  EXPECT_EQ(r.sparse->offload_cache_blocks, 0);
  EXPECT_EQ(r.sparse->offload_policy, pq::CachePolicy::kLfu);
  EXPECT_EQ(Chat(m + R"("sparse":{"method":"pq","offload":{"policy":"lfu"}}})").sparse->offload_cache_blocks,
            pq::kDefaultOffloadCacheBlocks);
  // /v1/completions takes the same field.
  ParseResult c = ParseApiRequest(ApiKind::kCompletion, R"({"model":"m","prompt":"x","sparse":{"method":"h2o"}})");
  ASSERT_FALSE(c.error.has_value()) << c.error->message;
  EXPECT_EQ(c.request.sparse->method, pq::SparseMethod::kH2o);
}

TEST(OpenAiRequest, BadSparseOptionsAre400NamingSparse) {
  const std::string m = R"({"model":"m","messages":[{"role":"user","content":"x"}],"sparse":)";
  auto error = [&](const std::string& sparse, const std::string& mentions) {
    SCOPED_TRACE(sparse);
    ApiError e = ChatError(m + sparse + "}");
    EXPECT_EQ(e.http_status, 400);
    EXPECT_EQ(e.type, "invalid_request_error");
    EXPECT_EQ(e.param, "sparse");
    EXPECT_NE(e.message.find(mentions), std::string::npos) << e.message;
  };
  error(R"("pq-0.2")", "'sparse' must be an object");
  error(R"({"ratio":0.2})", "'sparse.method'");
  error(R"({"method":"fast"})", "got 'fast'");
  error(R"({"method":7})", "'sparse.method'");
  error(R"({"method":"pq","ratio":0})", "'sparse.ratio'");
  error(R"({"method":"pq","ratio":1.5})", "'sparse.ratio'");
  error(R"({"method":"pq","ratio":"0.2"})", "'sparse.ratio'");
  error(R"({"method":"pq","ratio":0.2,"count":100})", "not both");
  error(R"({"method":"pq","count":0})", "'sparse.count'");
  error(R"({"method":"pq","count":2.5})", "'sparse.count'");
  error(R"({"method":"pq","initial":-1})", "'sparse.initial'");
  error(R"({"method":"pq","local":-4})", "'sparse.local'");
  error(R"({"method":"pq","min_tokens":-1})", "'sparse.min_tokens'");
  error(R"({"method":"pq","iterations":0})", "'sparse.iterations'");
  error(R"({"method":"pq","combine":"mean"})", "'sparse.combine'");
  error(R"({"method":"oracle","iterations":4})", "does not apply to method 'oracle'");
  error(R"({"method":"streaming","combine":"max"})", "does not apply");
  error(R"({"method":"full","ratio":0.5})", "does not apply to method 'full'");
  error(R"({"method":"pq","ration":0.2})", "'sparse.ration' is not a sparse option");
  error(R"({"method":"pq","offload":"yes"})", "'sparse.offload' must be");
  error(R"({"method":"pq","offload":{"cache_blocks":-1}})", "'sparse.offload.cache_blocks'");
  error(R"({"method":"pq","offload":{"cache_blocks":1.5}})", "'sparse.offload.cache_blocks'");
  error(R"({"method":"pq","offload":{"policy":"mru"}})", "'sparse.offload.policy'");
  error(R"({"method":"pq","offload":{"blocks":4}})", "'sparse.offload.blocks' is not an offload option");
  error(R"({"method":"oracle","offload":true})", "does not apply to method 'oracle'");
  error(R"({"method":"h2o","offload":true})", "does not apply to method 'h2o'");
}

TEST(OpenAiRequest, DefaultsAreOpenAis) {
  ApiRequest r = Chat(R"({"model":"m","messages":[{"role":"user","content":"hi"}]})");
  EXPECT_FALSE(r.max_tokens.has_value());
  EXPECT_FLOAT_EQ(r.temperature, 1.0f);
  EXPECT_FLOAT_EQ(r.top_p, 1.0f);
  EXPECT_FALSE(r.seed.has_value());
  EXPECT_FALSE(r.stream);
  EXPECT_TRUE(r.stop.empty());
}

TEST(OpenAiRequest, HugeIntegersAreClampedNotWrapped) {
  EXPECT_EQ(Chat(R"({"model":"m","messages":[{"role":"user","content":"hi"}],"max_tokens":1e300})").max_tokens.value(),
            std::numeric_limits<int64_t>::max());
  EXPECT_EQ(Chat(R"({"model":"m","messages":[{"role":"user","content":"hi"}],"max_tokens":18446744073709551615})")
                .max_tokens.value(),
            std::numeric_limits<int64_t>::max());
  EXPECT_EQ(ChatError(R"({"model":"m","messages":[{"role":"user","content":"hi"}],"max_tokens":-1e300})").param,
            "max_tokens");
}

// Found by the hostile HTTP run (tests/hostile/hostile_http.mjs): seeds beyond int64
// were clamped, so 1e23 and 2^63 sampled alike, as seed 2^63 - 1.
TEST(OpenAiRequest, SeedsOutsideInt64Are400NotClamped) {
  const std::string m = R"({"model":"m","messages":[{"role":"user","content":"hi"}],"seed":)";
  for (const char* s : {"99999999999999999999999", "9223372036854775808", "18446744073709551615", "1e23",
                        "-9223372036854775809", "-1e300"}) {
    ApiError e = ChatError(m + s + "}");
    EXPECT_EQ(e.http_status, 400) << s;
    EXPECT_EQ(e.param, "seed") << s;
  }
  // The ends of int64 are seeds; so is -0.
  EXPECT_EQ(Chat(m + "9223372036854775807}").seed.value(), 9223372036854775807ull);
  EXPECT_EQ(Chat(m + "-9223372036854775808}").seed.value(), 9223372036854775808ull);
  EXPECT_EQ(Chat(m + "-0}").seed.value(), 0u);
}

TEST(OpenAiRequest, NChoicesUpToTheDocumentedMax) {
  const std::string msgs = R"("messages":[{"role":"user","content":"hi"}])";
  EXPECT_EQ(Chat(R"({"model":"m",)" + msgs + "}").n, 1);
  EXPECT_EQ(Chat(R"({"model":"m",)" + msgs + R"(,"n":4})").n, 4);
  EXPECT_EQ(Chat(R"({"model":"m",)" + msgs + R"(,"n":3.0})").n, 3);
  EXPECT_EQ(Chat(R"({"model":"m",)" + msgs + R"(,"n":null})").n, 1);
  EXPECT_EQ(Chat(R"({"model":"m",)" + msgs + R"(,"n":16})").n, 16);
  ApiError e = ChatError(R"({"model":"m",)" + msgs + R"(,"n":17})");
  EXPECT_EQ(e.message, "'n' must be between 1 and 16");
  // Several choices with tools: a 400 naming n (each choice would need its own calls).
  const std::string tools =
      R"(,"tools":[{"type":"function","function":{"name":"f","parameters":{"type":"object"}}}])";
  ApiError t = ChatError(R"({"model":"m",)" + msgs + tools + R"(,"n":2})");
  EXPECT_EQ(t.http_status, 400);
  EXPECT_EQ(t.param, "n");
  EXPECT_EQ(Chat(R"({"model":"m",)" + msgs + tools + R"(,"n":1})").n, 1);
}

TEST(OpenAiRequest, InvalidFieldsAre400NamingTheParam) {
  const std::string msgs = R"("messages":[{"role":"user","content":"hi"}])";
  struct Case {
    std::string body, param;
  } cases[] = {
      {R"({"messages":[{"role":"user","content":"hi"}]})", "model"},
      {R"({"model":5,)" + msgs + "}", "model"},
      {R"({"model":""})", "model"},
      {R"({"model":"m"})", "messages"},
      {R"({"model":"m","messages":[]})", "messages"},
      {R"({"model":"m","messages":"hi"})", "messages"},
      {R"({"model":"m","messages":[{"role":"robot","content":"x"}]})", "messages[0].role"},
      {R"({"model":"m","messages":[{"role":"user","content":5}]})", "messages[0].content"},
      {R"({"model":"m","messages":[{"role":"user"}]})", "messages[0].content"},
      {R"({"model":"m","messages":[{"role":"user","content":[{"type":"image_url"}]}]})", "messages[0].content[0].type"},
      {R"({"model":"m",)" + msgs + R"(,"max_tokens":0})", "max_tokens"},
      {R"({"model":"m",)" + msgs + R"(,"max_tokens":1.5})", "max_tokens"},
      {R"({"model":"m",)" + msgs + R"(,"max_tokens":"10"})", "max_tokens"},
      {R"({"model":"m",)" + msgs + R"(,"temperature":2.5})", "temperature"},
      {R"({"model":"m",)" + msgs + R"(,"top_p":-1})", "top_p"},
      {R"({"model":"m",)" + msgs + R"(,"n":0})", "n"},
      {R"({"model":"m",)" + msgs + R"(,"n":-3})", "n"},
      {R"({"model":"m",)" + msgs + R"(,"n":17})", "n"},
      {R"({"model":"m",)" + msgs + R"(,"n":2.5})", "n"},
      {R"({"model":"m",)" + msgs + R"(,"n":"2"})", "n"},
      {R"({"model":"m",)" + msgs + R"(,"n":true})", "n"},
      {R"({"model":"m",)" + msgs + R"(,"stop":[""]})", "stop"},
      {R"({"model":"m",)" + msgs + R"(,"stop":[1]})", "stop"},
      {R"({"model":"m",)" + msgs + R"(,"stream":"yes"})", "stream"},
      {R"({"model":"m",)" + msgs + R"(,"stream_options":{"include_usage":1}})", "stream_options.include_usage"},
      {R"({"model":"m",)" + msgs + R"(,"logprobs":"yes"})", "logprobs"},
      {R"({"model":"m",)" + msgs + R"(,"logprobs":3})", "logprobs"},
      {R"({"model":"m",)" + msgs + R"(,"logprobs":true,"top_logprobs":21})", "top_logprobs"},
      {R"({"model":"m",)" + msgs + R"(,"logprobs":true,"top_logprobs":-1})", "top_logprobs"},
      {R"({"model":"m",)" + msgs + R"(,"top_logprobs":2})", "top_logprobs"},
      {R"({"model":"m",)" + msgs + R"(,"logprobs":false,"top_logprobs":2})", "top_logprobs"},
      {R"({"model":"m",)" + msgs + R"(,"echo":true})", "echo"},
      {R"({"model":"m",)" + msgs + R"(,"tools":[{"type":"function"}]})", "tools[0].function"},
      {R"({"model":"m",)" + msgs + R"(,"response_format":{"type":"xml"}})", "response_format.type"},
      {R"({"model":"m",)" + msgs + R"(,"session_id":7})", "session_id"},
      {R"({"model":"m",)" + msgs + R"(,"session_ttl":-1})", "session_ttl"},
  };
  for (const auto& c : cases) {
    ApiError e = ChatError(c.body);
    EXPECT_EQ(e.http_status, 400) << c.body;
    EXPECT_EQ(e.param, c.param) << c.body;
    EXPECT_FALSE(e.message.empty());
  }
}

TEST(OpenAiRequest, MalformedBodiesAre400) {
  for (std::string body : {std::string(""), std::string("{"), std::string("[]"), std::string("null"),
                           std::string("{\"model\":\"m\"}x"), std::string("{\"model\":\"\xff\"}"),
                           std::string("{\"model\":\"\\ud800\"}"), std::string(100000, '['),
                           std::string("{\"a\":1e400}")}) {
    ApiError e = ChatError(body);
    EXPECT_EQ(e.http_status, 400);
    // The error body is valid JSON even when the message quotes invalid UTF-8.
    json j = json::parse(ErrorJson(e));
    EXPECT_TRUE(j["error"]["message"].is_string());
  }
  // A valid request with a NUL after it: not JSON text (RFC 8259 has no NUL outside a
  // string, none unescaped inside one), though nlohmann::json::parse alone takes the NUL
  // for the end of its input and would accept the request.
  const std::string valid = R"({"model":"m","messages":[{"role":"user","content":"hi"}]})";
  Chat(valid);
  for (const std::string& tail : {std::string(1, '\0'), std::string("\0{\"n\":2}", 8)}) {
    ApiError e = ChatError(valid + tail);
    EXPECT_EQ(e.http_status, 400);
    EXPECT_EQ(e.code, "invalid_json");
    nlohmann::ordered_json o;
    ASSERT_TRUE(ParseJsonObject(valid + tail, &o).has_value());
    json j;
    ASSERT_TRUE(ParseJsonObject(valid + tail, &j).has_value());
  }
}

TEST(OpenAiRequest, CompletionPrompts) {
  auto parse = [](const std::string& prompt) {
    return ParseApiRequest(ApiKind::kCompletion, R"({"model":"m","prompt":)" + prompt + "}");
  };
  EXPECT_EQ(parse(R"("hello")").request.prompt_text, "hello");
  EXPECT_EQ(parse(R"(["hello"])").request.prompt_text, "hello");
  EXPECT_EQ(parse("[1,2,3]").request.prompt_ids, (std::vector<int32_t>{1, 2, 3}));
  EXPECT_EQ(parse("[[1,2,3]]").request.prompt_ids, (std::vector<int32_t>{1, 2, 3}));
  for (const char* bad : {R"(["a","b"])", "[]", "[-1]", "[1.5]", "5", "{}", "[[1],[2]]"}) {
    EXPECT_TRUE(parse(bad).error.has_value()) << bad;
  }
  EXPECT_EQ(ParseApiRequest(ApiKind::kCompletion, R"({"model":"m"})").error->param, "prompt");
}

TEST(OpenAiRequest, LogprobsAndEcho) {
  const std::string msgs = R"("messages":[{"role":"user","content":"hi"}])";
  EXPECT_EQ(Chat(R"({"model":"m",)" + msgs + "}").logprobs, -1);
  EXPECT_EQ(Chat(R"({"model":"m",)" + msgs + R"(,"logprobs":false})").logprobs, -1);
  EXPECT_EQ(Chat(R"({"model":"m",)" + msgs + R"(,"logprobs":true})").logprobs, 0);
  EXPECT_EQ(Chat(R"({"model":"m",)" + msgs + R"(,"logprobs":true,"top_logprobs":20})").logprobs, 20);
  auto completion = [](const std::string& fields) {
    return ParseApiRequest(ApiKind::kCompletion, R"({"model":"m","prompt":"hi")" + fields + "}");
  };
  // lm-evaluation-harness's loglikelihood request.
  ParseResult r = completion(R"(,"echo":true,"logprobs":1,"max_tokens":0,"temperature":0)");
  ASSERT_FALSE(r.error) << r.error->message;
  EXPECT_TRUE(r.request.echo);
  EXPECT_EQ(r.request.logprobs, 1);
  EXPECT_EQ(r.request.max_tokens, 0);
  EXPECT_EQ(completion(R"(,"logprobs":0)").request.logprobs, 0);
  struct Case {
    std::string fields, param;
  } cases[] = {
      {R"(,"logprobs":21)", "logprobs"},
      {R"(,"logprobs":true)", "logprobs"},
      {R"(,"logprobs":-1)", "logprobs"},
      {R"(,"echo":1)", "echo"},
      {R"(,"max_tokens":0)", "max_tokens"},  // 0 only with echo
      {R"(,"top_logprobs":2)", "top_logprobs"},
  };
  for (const auto& c : cases) {
    ParseResult e = completion(c.fields);
    ASSERT_TRUE(e.error) << c.fields;
    EXPECT_EQ(e.error->http_status, 400) << c.fields;
    EXPECT_EQ(e.error->param, c.param) << c.fields;
  }
  ParseResult cached = ParseApiRequest(
      ApiKind::kCompletion,
      R"({"model":"m","echo":true,"prompt":[{"type":"text","text":"x","cache_control":{"type":"ephemeral"}}]})");
  ASSERT_TRUE(cached.error);
  EXPECT_EQ(cached.error->param, "echo");
}

TEST(OpenAiResponse, BodiesChunksAndErrors) {
  ResponseMeta meta{ApiKind::kChat, "chatcmpl-1", 42, "m", "fp"};
  engine::TokenUsage u{10, 5, 3};
  json body = json::parse(CompletionBody(meta, "hi", "stop", u));
  EXPECT_EQ(body["object"], "chat.completion");
  EXPECT_EQ(body["choices"][0]["message"]["content"], "hi");
  EXPECT_EQ(body["choices"][0]["finish_reason"], "stop");
  EXPECT_EQ(body["usage"]["total_tokens"], 15);
  EXPECT_EQ(body["usage"]["prompt_tokens_details"]["cached_tokens"], 3);

  std::string role = ChunkEvent(meta, "", "", true, true);
  ASSERT_EQ(role.rfind("data: ", 0), 0u);
  ASSERT_EQ(role.substr(role.size() - 2), "\n\n");
  json rc = json::parse(role.substr(6));
  EXPECT_EQ(rc["object"], "chat.completion.chunk");
  EXPECT_EQ(rc["choices"][0]["delta"]["role"], "assistant");
  EXPECT_TRUE(rc["choices"][0]["finish_reason"].is_null());
  EXPECT_TRUE(rc.contains("usage") && rc["usage"].is_null());
  json fc = json::parse(ChunkEvent(meta, "", "length", false).substr(6));
  EXPECT_EQ(fc["choices"][0]["finish_reason"], "length");
  EXPECT_TRUE(fc["choices"][0]["delta"].empty());
  EXPECT_FALSE(fc.contains("usage"));
  json uc = json::parse(UsageEvent(meta, u).substr(6));
  EXPECT_TRUE(uc["choices"].empty());
  EXPECT_EQ(uc["usage"]["completion_tokens"], 5);

  ResponseMeta cm{ApiKind::kCompletion, "cmpl-1", 42, "m", "fp"};
  json tc = json::parse(ChunkEvent(cm, "abc", "", false).substr(6));
  EXPECT_EQ(tc["object"], "text_completion");
  EXPECT_EQ(tc["choices"][0]["text"], "abc");

  struct {
    StatusCode code;
    int http;
  } map[] = {{StatusCode::kInvalidArgument, 400}, {StatusCode::kNotFound, 404}, {StatusCode::kOutOfRange, 413},
             {StatusCode::kResourceExhausted, 429}, {StatusCode::kUnavailable, 503},
             {StatusCode::kDeadlineExceeded, 504}, {StatusCode::kInternal, 500}};
  for (const auto& m : map) {
    ApiError e = ErrorFromStatus(Status(m.code, "boom"));
    EXPECT_EQ(e.http_status, m.http);
    json ej = json::parse(ErrorJson(e));
    EXPECT_EQ(ej["error"]["message"], "boom");
    EXPECT_TRUE(ej["error"].contains("param"));
    EXPECT_TRUE(ej["error"].contains("code"));
    EXPECT_TRUE(ej["error"]["type"].is_string());
  }
}

TEST(TokenizeRequest, VllmShapesAndLlamaServerAliases) {
  TokenizeParse p = ParseTokenizeRequest(R"({"prompt":"Hello"})");
  ASSERT_FALSE(p.error.has_value());
  EXPECT_FALSE(p.request.chat);
  EXPECT_EQ(p.request.prompt, "Hello");
  EXPECT_EQ(p.request.model, "");
  EXPECT_TRUE(p.request.add_special_tokens);  // vLLM's default for a prompt
  EXPECT_FALSE(p.request.return_token_strs);

  p = ParseTokenizeRequest(R"({"model":"m","content":"Hi","add_special":false,"with_pieces":true})");
  ASSERT_FALSE(p.error.has_value());
  EXPECT_EQ(p.request.model, "m");
  EXPECT_EQ(p.request.prompt, "Hi");
  EXPECT_FALSE(p.request.add_special_tokens);
  EXPECT_TRUE(p.request.return_token_strs);

  p = ParseTokenizeRequest(R"({"messages":[{"role":"user","content":"Hi"}],"return_token_strs":true})");
  ASSERT_FALSE(p.error.has_value());
  EXPECT_TRUE(p.request.chat);
  ASSERT_EQ(p.request.messages.size(), 1u);
  EXPECT_EQ(p.request.messages[0].content, "Hi");
  EXPECT_FALSE(p.request.add_special_tokens);  // vLLM's default for chat: the template writes BOS
  EXPECT_TRUE(p.request.add_generation_prompt);
  EXPECT_TRUE(p.request.return_token_strs);

  p = ParseTokenizeRequest(R"({"messages":[{"role":"user","content":"Hi"}],"add_generation_prompt":false,
                               "add_special_tokens":true})");
  ASSERT_FALSE(p.error.has_value());
  EXPECT_FALSE(p.request.add_generation_prompt);
  EXPECT_TRUE(p.request.add_special_tokens);
}

TEST(TokenizeRequest, ChatToolsAreReadAsForChatCompletions) {
  // The tools in the client's key order (the template renders them as written), as
  // ParseApiRequest reads them for /v1/chat/completions.
  const std::string tools = R"("tools":[{"type":"function","function":{"name":"f","parameters":{"type":"object",
      "properties":{"z":{"type":"string"},"a":{"type":"integer"}}}}}])";
  const std::string body = R"({"messages":[{"role":"user","content":"Hi"}],)" + tools + "}";
  TokenizeParse p = ParseTokenizeRequest(body);
  ASSERT_FALSE(p.error.has_value()) << p.error->message;
  ParseResult chat = ParseApiRequest(ApiKind::kChat, R"({"model":"m","messages":[{"role":"user","content":"Hi"}],)" + tools + "}");
  ASSERT_FALSE(chat.error.has_value());
  EXPECT_EQ(p.request.tools.ToolJson(), chat.request.tools.ToolJson());
  ASSERT_EQ(p.request.tools.tools.size(), 1u);
  EXPECT_EQ(p.request.tools.tools[0].json,
            R"({"type":"function","function":{"name":"f","parameters":{"type":"object","properties":{"z":{"type":"string"},"a":{"type":"integer"}}}}})");
  // A tool turn without tools, and no tools at all: nothing to render.
  p = ParseTokenizeRequest(R"({"messages":[{"role":"user","content":"w?"},{"role":"assistant","content":null,
      "tool_calls":[{"id":"c","type":"function","function":{"name":"f","arguments":"{}"}}]},
      {"role":"tool","tool_call_id":"c","content":"1"}]})");
  ASSERT_FALSE(p.error.has_value()) << p.error->message;
  EXPECT_TRUE(p.request.tools.ToolJson().empty());
}

TEST(TokenizeRequest, InvalidFieldsAre400NamingTheParam) {
  struct Case {
    std::string body, param;
  } cases[] = {
      {R"([1,2])", ""},
      {R"({"prompt":)", ""},
      {R"({})", "prompt"},
      {R"({"prompt":5})", "prompt"},
      {R"({"content":["a"]})", "content"},
      {R"({"prompt":"a","content":"b"})", "content"},
      {R"({"prompt":"a","messages":[{"role":"user","content":"b"}]})", "messages"},
      {R"({"prompt":"a","model":7})", "model"},
      {R"({"prompt":"a","add_special_tokens":1})", "add_special_tokens"},
      {R"({"prompt":"a","add_special_tokens":true,"add_special":true})", "add_special"},
      {R"({"prompt":"a","with_pieces":"yes"})", "with_pieces"},
      {R"({"messages":[]})", "messages"},
      {R"({"messages":[{"role":"tool","content":"x"}]})", "messages[0].tool_call_id"},
      {R"({"messages":[{"role":"user","content":"x"}],"add_generation_prompt":"no"})", "add_generation_prompt"},
      {R"({"messages":[{"role":"user","content":"x"}],"continue_final_message":true})", "continue_final_message"},
      {R"({"messages":[{"role":"user","content":"x"}],"chat_template":"{{x}}"})", "chat_template"},
      {R"({"prompt":"a","tools":[{"type":"function","function":{"name":"f"}}]})", "tools"},
      {R"({"messages":[{"role":"user","content":"x"}],"tools":"x"})", "tools"},
      {R"({"messages":[{"role":"user","content":"x"}],"tools":[{"type":"function","function":{"name":"a b"}}]})",
       "tools[0].function.name"},
      {R"({"messages":[{"role":"user","content":"x"}],"tool_choice":"required"})", "tool_choice"},
  };
  for (const auto& c : cases) {
    TokenizeParse p = ParseTokenizeRequest(c.body);
    ASSERT_TRUE(p.error.has_value()) << c.body;
    EXPECT_EQ(p.error->http_status, 400) << c.body;
    EXPECT_EQ(p.error->param, c.param) << c.body;
  }
}

TEST(DetokenizeRequest, TokenIdsOnly) {
  DetokenizeParse p = ParseDetokenizeRequest(R"({"model":"m","tokens":[1,410,0]})");
  ASSERT_FALSE(p.error.has_value());
  EXPECT_EQ(p.request.model, "m");
  EXPECT_EQ(p.request.tokens, (std::vector<int32_t>{1, 410, 0}));
  EXPECT_TRUE(ParseDetokenizeRequest(R"({"tokens":[]})").request.tokens.empty());
  for (const char* body : {R"({})", R"({"tokens":"abc"})", R"({"tokens":[1.5]})", R"({"tokens":[-1]})",
                           R"({"tokens":[2147483648]})", R"({"tokens":[[1]]})", R"({"tokens":[true]})"}) {
    DetokenizeParse bad = ParseDetokenizeRequest(body);
    ASSERT_TRUE(bad.error.has_value()) << body;
    EXPECT_EQ(bad.error->param, "tokens") << body;
  }
}

TEST(Metrics, RendersCountersHistogramsAndGauges) {
  Metrics m;
  m.CountHttp("/v1/completions", 200);
  m.CountHttp("/v1/completions", 200);
  m.CountHttp("/v1/completions", 400);
  engine::RequestRecord r;
  r.usage = {10, 4, 6};
  r.finish_reason = "length";
  r.ttft_seconds = 0.02;
  r.inter_token_seconds = {0.004, 0.004, 0.2};
  m.Observe(r);
  engine::SchedulerStats s;
  s.waiting = 3;
  s.running = 2;
  s.kv_blocks_used = 7;
  s.kv_blocks_free = 9;
  std::string text = m.Render(s);
  auto has = [&](const std::string& line) { return text.find("\n" + line + "\n") != std::string::npos; };
  EXPECT_TRUE(has(R"(attic_http_requests_total{endpoint="/v1/completions",status="200"} 2)"));
  EXPECT_TRUE(has(R"(attic_http_requests_total{endpoint="/v1/completions",status="400"} 1)"));
  EXPECT_TRUE(has(R"(attic_requests_finished_total{outcome="length"} 1)"));
  EXPECT_TRUE(has("attic_prompt_tokens_reused_total 6"));
  EXPECT_TRUE(has("attic_generation_tokens_total 4"));
  EXPECT_TRUE(has(R"(attic_time_to_first_token_seconds_bucket{le="0.01"} 0)"));
  EXPECT_TRUE(has(R"(attic_time_to_first_token_seconds_bucket{le="0.025"} 1)"));
  EXPECT_TRUE(has(R"(attic_time_per_output_token_seconds_bucket{le="0.005"} 2)"));
  EXPECT_TRUE(has(R"(attic_time_per_output_token_seconds_bucket{le="+Inf"} 3)"));
  EXPECT_TRUE(has("attic_time_per_output_token_seconds_count 3"));
  EXPECT_TRUE(has("attic_requests_waiting 3"));
  EXPECT_TRUE(has("attic_requests_running 2"));
  EXPECT_TRUE(has("attic_kv_blocks_used 7"));
  EXPECT_TRUE(has("attic_kv_blocks_free 9"));
}

TEST(Metrics, RendersSparseDecodingCounters) {
  Metrics m;
  engine::SchedulerStats s;
  pq::SparseStats a;
  a.sparse_steps = 10;
  a.full_steps = 2;
  a.attended_slots = 200;
  a.context_slots = 1000;
  a.select_seconds = 0.25;
  a.clustered_keys = 4096;
  a.cluster_seconds = 0.5;
  a.encoded_keys = 7;
  pq::SparseDecodeStats sparse;
  sparse.Add(pq::SparseMethod::kPq, a);
  sparse.Add(pq::SparseMethod::kPq, a);
  sparse.Add(pq::SparseMethod::kStreaming, pq::SparseStats{});
  s.kv.Set(std::make_shared<const pq::SparseDecodeStats>(sparse));
  std::string text = m.Render(s);
  auto has = [&](const std::string& line) { return text.find("\n" + line + "\n") != std::string::npos; };
  EXPECT_TRUE(has(R"(attic_sparse_requests_total{method="pq"} 2)")) << text;
  EXPECT_TRUE(has(R"(attic_sparse_requests_total{method="streaming"} 1)"));
  EXPECT_TRUE(has(R"(attic_sparse_requests_total{method="oracle"} 0)"));
  EXPECT_TRUE(has(R"(attic_sparse_requests_total{method="h2o"} 0)"));
  EXPECT_TRUE(has("# TYPE attic_sparse_decode_steps_total counter"));
  EXPECT_TRUE(has("attic_sparse_decode_steps_total 20"));
  EXPECT_TRUE(has("attic_sparse_full_decode_steps_total 4"));
  EXPECT_TRUE(has("attic_sparse_attended_slots_total 400"));
  EXPECT_TRUE(has("attic_sparse_context_slots_total 2000"));
  EXPECT_TRUE(has("attic_sparse_select_seconds_total 0.5"));
  EXPECT_TRUE(has("attic_pq_clustered_keys_total 8192"));
  EXPECT_TRUE(has("attic_pq_cluster_seconds_total 1"));
  EXPECT_TRUE(has("attic_pq_encoded_keys_total 14"));
}

// Counters print exactly (no double rounding past 2^53, no exponent) and doubles in a form
// that reads back as the same double: a scrape never loses precision.
TEST(Metrics, ValuesKeepFullPrecision) {
  Metrics m;
  engine::RequestRecord r;
  r.usage = {2147483647, 2147483647, 0};
  r.finish_reason = "stop";
  r.ttft_seconds = 1234.56789012345;
  for (int i = 0; i < 3; ++i) m.Observe(r);
  engine::SchedulerStats s;
  store::KvLoadStats load;
  load.fetch_seconds = 0.1 + 0.2;  // 0.30000000000000004
  s.kv.Set(std::make_shared<const store::KvLoadStats>(load));
  s.steps = 9007199254740993ull;        // 2^53 + 1: not a double
  std::string text = m.Render(s);
  auto has = [](const std::string& text, const std::string& line) {
    return text.find("\n" + line + "\n") != std::string::npos;
  };
  EXPECT_TRUE(has(text, "attic_prompt_tokens_total 6442450941")) << text;
  EXPECT_TRUE(has(text, "attic_generation_tokens_total 6442450941"));
  EXPECT_TRUE(has(text, "attic_time_to_first_token_seconds_sum 3703.70367037035"));
  EXPECT_TRUE(has(text, "attic_scheduler_steps_total 9007199254740993"));
  EXPECT_TRUE(has(text, R"(attic_kv_load_seconds_total{phase="fetch"} 0.30000000000000004)"));
  EXPECT_TRUE(has(text, R"(attic_time_to_first_token_seconds_bucket{le="0.005"} 0)"));

  store::StoreStats st;
  st.bytes_saved = 12345678901234567ull;
  st.lookups = 123456789012ull;
  st.save_wait_ms = 12345678.25;
  std::string store_text = RenderStoreMetrics(st);
  EXPECT_TRUE(has(store_text, R"(attic_kv_store_bytes_total{direction="save"} 12345678901234567)")) << store_text;
  EXPECT_TRUE(has(store_text, "attic_kv_store_lookups_total 123456789012"));
  EXPECT_TRUE(has(store_text, "attic_kv_store_save_wait_seconds_total 12345.67825"));
}

}  // namespace
}  // namespace attic::server
