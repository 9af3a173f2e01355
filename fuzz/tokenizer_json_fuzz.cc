// tokenizer.json (and tokenizer_config.json) loading (src/tokenizer/tokenizer_json.cc,
// bpe_model.cc, text_pipeline.cc): the input is tokenizer.json, optionally followed by a
// NUL and tokenizer_config.json.
//
// Invariants: no crash or uncaught exception; a tokenizer that loads encodes a few
// fixed texts into ids inside its vocabulary, decodes any ids of it, and its
// StreamDecoder only ever emits valid UTF-8.
#include <cstdint>
#include <string>
#include <string_view>

#include "attic/tokenizer/tokenizer.h"
#include "fuzz_check.h"
#include "tokenizer/utf8.h"

using namespace attic::tokenizer;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view in(reinterpret_cast<const char*>(data), size);
  const size_t nul = in.find('\0');
  const std::string tj(in.substr(0, nul));
  const std::string config = nul == std::string_view::npos ? "" : std::string(in.substr(nul + 1));
  auto tok = Tokenizer::FromJson(tj, config);
  if (!tok.ok()) return 0;
  const Tokenizer& t = **tok;
  const int n = t.vocab_size();
  FUZZ_CHECK(n > 0);
  for (const char* text : {"Hello world", " Once upon a time", "<s>x</s>", "\xC3\xA9\xF0\x9F\x98\x80 \t\n", ""}) {
    auto ids = t.Encode(text);
    FUZZ_CHECK(ids.ok(), "valid UTF-8 refused: %s", ids.status().ToString().c_str());
    for (int32_t id : *ids) FUZZ_CHECK(id >= 0 && id < n, "id %d of %d", id, n);
    (void)t.Decode(*ids);
  }
  StreamDecoder dec(t);
  std::string streamed;
  for (int32_t id = 0; id < n && id < 512; ++id) {
    (void)t.TokenBytes(id);
    (void)t.TokenText(id);
    streamed += dec.Push(id);
  }
  streamed += dec.Flush();
  FUZZ_CHECK(IsValidUtf8(streamed), "StreamDecoder emitted invalid UTF-8");
  return 0;
}
