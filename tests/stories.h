// The trained stories260K model and held-out TinyStories text, for tests that need real
// attention patterns (sparse decoding, offload): header-only, for any module's tests.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <memory>
#include <vector>

#include "attic/core/file.h"
#include "attic/engine/engine.h"
#include "attic/kv/block_pool.h"
#include "attic/kv/layer_hooks.h"
#include "test_util.h"

namespace attic::testing {

// stories260K with `o`'s options (2 threads unless set); null (and a test failure) when it
// cannot be loaded.
inline std::unique_ptr<engine::Engine> LoadStories(engine::EngineOptions o = {}) {
  o.model_path = SharedDir() + "/models/stories260K-hf";
  if (o.n_threads == 0) o.n_threads = 2;
  auto e = engine::Engine::Load(o);
  EXPECT_TRUE(e.ok()) << e.status().ToString();
  return e.ok() ? std::move(*e) : nullptr;
}

// The first n tokens of the held-out stories (BOS first).
inline std::vector<int32_t> StoryTokens(engine::Engine& e, size_t n) {
  auto text = ReadFileToString(SharedDir() + "/datasets/tinystories_valid_sample/TinyStories-valid-sample.txt");
  EXPECT_TRUE(text.ok());
  auto ids = e.Tokenize(*text, true);
  EXPECT_TRUE(ids.ok());
  EXPECT_GE(ids->size(), n);
  ids->resize(n);
  return *ids;
}

// Prefills `prompt` of `tokens` in chunks of 128, then decodes the rest teacher-forced,
// one token per step, through `hooks` (may be null); returns the decode steps' logits.
inline std::vector<float> TeacherForcedDecode(engine::Engine& e, const std::vector<int32_t>& tokens, size_t prompt,
                                              kv::LayerHooks* hooks) {
  kv::SequenceKv seq(&e.kv_pool());
  std::vector<float> logits, all;
  for (size_t pos = 0; pos < tokens.size();) {
    const size_t end = pos < prompt ? std::min(prompt, pos + 128) : pos + 1;
    std::vector<engine::BatchEntry> batch(1);
    batch[0].seq = &seq;
    batch[0].tokens.assign(tokens.begin() + pos, tokens.begin() + end);
    EXPECT_TRUE(e.transformer().Forward(batch, &logits, hooks).ok());
    if (end > prompt) all.insert(all.end(), logits.begin(), logits.end());
    pos = end;
  }
  return all;
}

}  // namespace attic::testing
