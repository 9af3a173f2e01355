// The trained stories260K model and held-out TinyStories text, for tests that need real
// attention patterns (sparse decoding, offload): header-only, for any module's tests.
#pragma once

#include <gtest/gtest.h>

#include <memory>
#include <vector>

#include "attic/core/file.h"
#include "attic/engine/engine.h"
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

}  // namespace attic::testing
