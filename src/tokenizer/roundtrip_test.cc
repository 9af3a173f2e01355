// Whole-file tests over every text file under ../shared/datasets: decode(encode(x))
// == x for both tokenizers, and the ids equal those of @huggingface/tokenizers
// (token count + FNV-1a-64 hash recorded in tests/data/tokenizer/reference_ids.json).
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "attic/tokenizer/tokenizer.h"
#include "tokenizer/tokenizer_test_util.h"

namespace attic::tokenizer {
namespace {

using json = nlohmann::json;

struct TextFile {
  std::string rel;  // relative to the shared dir, e.g. "datasets/tiny_shakespeare/input.txt"
  std::string bytes;
};

// Every regular file under datasets/, sorted; files that are not UTF-8 are skipped
// (and reported), since Encode rejects them by contract.
const std::vector<TextFile>& DatasetFiles() {
  static const std::vector<TextFile> files = [] {
    std::vector<TextFile> out;
    const std::filesystem::path root = attic::testing::SharedDir();
    std::error_code ec;
    for (auto it = std::filesystem::recursive_directory_iterator(root / "datasets", ec);
         !ec && it != std::filesystem::recursive_directory_iterator(); it.increment(ec)) {
      if (!it->is_regular_file()) continue;
      TextFile f;
      f.rel = std::filesystem::relative(it->path(), root).string();
      f.bytes = testing::ReadOrDie(it->path().string());
      if (!IsValidUtf8(f.bytes)) {
        std::printf("[ skipped  ] %s is not valid UTF-8\n", f.rel.c_str());
        continue;
      }
      out.push_back(std::move(f));
    }
    std::sort(out.begin(), out.end(), [](const TextFile& a, const TextFile& b) { return a.rel < b.rel; });
    return out;
  }();
  return files;
}

class DatasetTest : public ::testing::TestWithParam<std::string> {
 protected:
  const Tokenizer& tok() const { return testing::ReferenceTokenizer(GetParam()); }
};

TEST_P(DatasetTest, RoundTripAndMatchReference) {
  const json& ref = testing::ReferenceIds();
  std::map<std::string, std::pair<size_t, std::string>> want;
  for (const json& d : ref["tokenizers"][GetParam()]["datasets"]) {
    want[d["path"].get<std::string>()] = {d["n_tokens"].get<size_t>(), d["fnv1a64"].get<std::string>()};
  }
  const auto& files = DatasetFiles();
  ASSERT_GT(files.size(), 10u) << "no datasets under " << attic::testing::SharedDir();
  size_t n_files = 0, total_bytes = 0, total_tokens = 0, compared = 0;
  double seconds = 0;
  const bool all_files = GetParam() == "stories260K" || GetParam() == "smollm2";
  for (const TextFile& f : files) {
    // Variants of the real tokenizers are checked on the files the reference covers.
    if (!all_files && want.count(f.rel) == 0) continue;
    ++n_files;
    const auto t0 = std::chrono::steady_clock::now();
    auto ids = tok().Encode(f.bytes);
    seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    ASSERT_TRUE(ids.ok()) << f.rel << ": " << ids.status().ToString();
    total_bytes += f.bytes.size();
    total_tokens += ids->size();
    if (auto it = want.find(f.rel); it != want.end()) {
      EXPECT_EQ(ids->size(), it->second.first) << f.rel;
      EXPECT_EQ(testing::Fnv1a64Hex(*ids), it->second.second) << f.rel;
      ++compared;
    }
    // Round trip without special-token parsing or BOS: every byte must come back.
    auto plain = tok().Encode(f.bytes, {.add_bos = false, .parse_special = false});
    ASSERT_TRUE(plain.ok());
    const std::string back = tok().Decode(*plain);
    EXPECT_TRUE(back == f.bytes) << f.rel << ": round trip differs (" << back.size() << " vs " << f.bytes.size()
                                 << " bytes)";
  }
  EXPECT_EQ(compared, want.size()) << "reference lists files that are no longer in datasets/";
  std::printf("[   info   ] %s: %zu files, %.1f MB -> %zu tokens, encode %.1f MB/s\n", GetParam().c_str(),
              n_files, total_bytes / 1e6, total_tokens, total_bytes / 1e6 / std::max(seconds, 1e-9));
}

INSTANTIATE_TEST_SUITE_P(Tokenizers, DatasetTest,
                         ::testing::Values("stories260K", "smollm2", "smollm2_llama3_style", "smollm2_qwen2_style"));

// ~1 MB of text in one Encode call (both tokenizers). A quadratic encoder still finishes
// here, only slowly: how fast is a benchmark's question, not a unit test's (no time bound
// in `make test`; DatasetTest prints the encode rate as information).
TEST(EncodeLarge, OneMegabyte) {
  const std::string text = testing::ReadOrDie(attic::testing::SharedDir() + "/datasets/tiny_shakespeare/input.txt");
  ASSERT_GT(text.size(), 1000000u);
  for (const Tokenizer* tok : {&testing::Stories(), &testing::Smol()}) {
    auto ids = tok->Encode(text);
    ASSERT_TRUE(ids.ok());
    EXPECT_FALSE(ids->empty());
  }
}

}  // namespace
}  // namespace attic::tokenizer
