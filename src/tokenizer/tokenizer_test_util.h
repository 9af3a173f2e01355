// Helpers shared by the tokenizer tests (header-only, test binaries only): where the
// reference models and data live, and loading them.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "attic/core/file.h"
#include "attic/tokenizer/tokenizer.h"
#include "test_util.h"

namespace attic::tokenizer::testing {

inline std::string StoriesDir() { return attic::testing::SharedDir() + "/models/stories260K-hf"; }
inline std::string SmolDir() { return attic::testing::SharedDir() + "/models/smollm2-135m-instruct-tokenizer"; }
inline std::string StoriesGguf() { return attic::testing::SharedDir() + "/models/stories260K-gguf/stories260K.gguf"; }
inline std::string TestDataDir() { return attic::testing::SourceDir() + "/tests/data/tokenizer"; }

inline std::string ReadOrDie(const std::string& path) {
  auto s = ReadFileToString(path);
  EXPECT_TRUE(s.ok()) << path << ": " << s.status().ToString();
  return s.ok() ? std::move(s).value() : std::string();
}

inline nlohmann::json ReadJsonOrDie(const std::string& path) {
  return nlohmann::json::parse(ReadOrDie(path), nullptr, false);
}

// Loaded once per process; Tokenizer is immutable and thread-safe.
inline const Tokenizer& Stories() {
  static const std::unique_ptr<Tokenizer> tok = [] {
    auto t = Tokenizer::FromDirectory(StoriesDir());
    if (!t.ok()) ADD_FAILURE() << t.status().ToString();
    return t.ok() ? std::move(t).value() : nullptr;
  }();
  return *tok;
}

inline const Tokenizer& Smol() {
  static const std::unique_ptr<Tokenizer> tok = [] {
    auto t = Tokenizer::FromDirectory(SmolDir());
    if (!t.ok()) ADD_FAILURE() << t.status().ToString();
    return t.ok() ? std::move(t).value() : nullptr;
  }();
  return *tok;
}

inline const nlohmann::json& ReferenceIds() {
  static const nlohmann::json ref = ReadJsonOrDie(TestDataDir() + "/reference_ids.json");
  return ref;
}

// The tokenizer a reference_ids.json entry was made with: a model directory, or its
// tokenizer.json with the entry's "overrides" applied (as gen_reference.mjs does).
inline const Tokenizer& ReferenceTokenizer(const std::string& name) {
  if (name == "stories260K") return Stories();
  if (name == "smollm2") return Smol();
  static std::map<std::string, std::unique_ptr<Tokenizer>> cache;  // tests run on one thread
  auto& slot = cache[name];
  if (!slot) {
    const nlohmann::json& entry = ReferenceIds()["tokenizers"][name];
    nlohmann::json tj = ReadJsonOrDie(attic::testing::SharedDir() + "/" + entry["dir"].get<std::string>() +
                                      "/tokenizer.json");
    for (auto it = entry["overrides"].begin(); it != entry["overrides"].end(); ++it) {
      if (it.key().rfind("model.", 0) == 0) {
        tj["model"][it.key().substr(6)] = it.value();
      } else {
        tj[it.key()] = it.value();
      }
    }
    auto t = Tokenizer::FromJson(tj.dump(), "");
    EXPECT_TRUE(t.ok()) << name << ": " << t.status().ToString();
    if (t.ok()) slot = std::move(t).value();
  }
  return *slot;
}

inline std::vector<int32_t> EncodeOrDie(const Tokenizer& tok, const std::string& text, EncodeOptions opts = {}) {
  auto ids = tok.Encode(text, opts);
  EXPECT_TRUE(ids.ok()) << ids.status().ToString();
  return ids.ok() ? std::move(ids).value() : std::vector<int32_t>();
}

// FNV-1a 64 over the ids as little-endian int32, as tools/tokref/gen_reference.mjs.
inline std::string Fnv1a64Hex(const std::vector<int32_t>& ids) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (int32_t id : ids) {
    uint32_t v = static_cast<uint32_t>(id);
    for (int i = 0; i < 4; ++i) {
      h ^= v & 0xff;
      h *= 0x100000001b3ull;
      v >>= 8;
    }
  }
  char buf[17];
  std::snprintf(buf, sizeof(buf), "%016llx", static_cast<unsigned long long>(h));
  return buf;
}

}  // namespace attic::tokenizer::testing
