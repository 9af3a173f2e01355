// Every malformed checkpoint must give a clean Status (DataLoss / NotFound /
// Unimplemented; InvalidArgument for GGUF metadata that parses but is invalid), never a
// crash, an out-of-bounds read or a huge allocation.
#include <gtest/gtest.h>

#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <random>

#include "attic/core/file.h"
#include "attic/model/model.h"
#include "attic/model/writer.h"
#include "model/test_models.h"
#include "test_util.h"

namespace attic::model {
namespace {

using testing::ReadBytes;
using testing::TinyConfig;
using testing::TinyTensors;
using testing::WriteBytes;

StatusCode LoadCode(const std::string& path) {
  auto m = Model::Load(path);
  return m.ok() ? StatusCode::kOk : m.status().code();
}

class HfCorruptionTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = tmp_.File("m");
    ASSERT_TRUE(WriteHfModel(dir_, TinyConfig(), TinyTensors(TinyConfig()), {}).ok());
    ASSERT_EQ(LoadCode(dir_), StatusCode::kOk);
    st_ = dir_ + "/model.safetensors";
    bytes_ = ReadBytes(st_);
  }
  // Rewrites the safetensors header through `edit`, keeping the data section.
  void EditHeader(const std::function<void(nlohmann::json&)>& edit) {
    uint64_t n = 0;
    std::memcpy(&n, bytes_.data(), 8);
    nlohmann::json h = nlohmann::json::parse(bytes_.substr(8, n));
    edit(h);
    std::string text = h.dump();
    uint64_t len = text.size();
    WriteBytes(st_, std::string(reinterpret_cast<const char*>(&len), 8) + text + bytes_.substr(8 + n));
  }
  attic::testing::TempDir tmp_;
  std::string dir_, st_, bytes_;
};

TEST_F(HfCorruptionTest, MissingFiles) {
  EXPECT_EQ(LoadCode(tmp_.File("nope")), StatusCode::kNotFound);
  std::filesystem::remove(st_);
  EXPECT_EQ(LoadCode(dir_), StatusCode::kNotFound);
  WriteBytes(st_, bytes_);
  std::filesystem::remove(dir_ + "/config.json");
  EXPECT_EQ(LoadCode(dir_), StatusCode::kNotFound);
}

TEST_F(HfCorruptionTest, BadConfig) {
  WriteBytes(dir_ + "/config.json", "{\"hidden_size\": 3,,,");
  EXPECT_EQ(LoadCode(dir_), StatusCode::kDataLoss);
  WriteBytes(dir_ + "/config.json", R"({"architectures": ["GPT2LMHeadModel"], "n_embd": 32})");
  auto m = Model::Load(dir_);
  ASSERT_EQ(m.status().code(), StatusCode::kUnimplemented);
  EXPECT_NE(m.status().message().find("GPT2LMHeadModel"), std::string::npos);
  ModelConfig c = TinyConfig();
  c.hidden_size = 64;  // tensors are for 32
  c.head_dim = 16;
  WriteBytes(dir_ + "/config.json", HfConfigToJson(c));
  EXPECT_EQ(LoadCode(dir_), StatusCode::kDataLoss);
}

TEST_F(HfCorruptionTest, HeaderLengthAndTruncation) {
  std::string b = bytes_;
  uint64_t huge = b.size();  // header "longer" than the file
  std::memcpy(b.data(), &huge, 8);
  WriteBytes(st_, b);
  EXPECT_EQ(LoadCode(dir_), StatusCode::kDataLoss);
  huge = ~uint64_t{0};
  std::memcpy(b.data(), &huge, 8);
  WriteBytes(st_, b);
  EXPECT_EQ(LoadCode(dir_), StatusCode::kDataLoss);
  for (size_t len : {size_t{0}, size_t{5}, size_t{8}, size_t{20}, bytes_.size() / 2, bytes_.size() - 1}) {
    WriteBytes(st_, bytes_.substr(0, len));
    EXPECT_EQ(LoadCode(dir_), StatusCode::kDataLoss) << "truncated to " << len;
  }
}

TEST_F(HfCorruptionTest, GarbageHeaderJson) {
  uint64_t n = 0;
  std::memcpy(&n, bytes_.data(), 8);
  std::string b = bytes_;
  for (size_t i = 8; i < 8 + n; i += 3) b[i] = '{';
  WriteBytes(st_, b);
  EXPECT_EQ(LoadCode(dir_), StatusCode::kDataLoss);
  EditHeader([](nlohmann::json& h) { h = nlohmann::json::array({1, 2}); });
  EXPECT_EQ(LoadCode(dir_), StatusCode::kDataLoss);
  EditHeader([](nlohmann::json& h) { h["model.norm.weight"] = "oops"; });
  EXPECT_EQ(LoadCode(dir_), StatusCode::kDataLoss);
}

TEST_F(HfCorruptionTest, OffsetsShapesAndDtypes) {
  const std::string q = "model.layers.0.self_attn.q_proj.weight";
  EditHeader([&](nlohmann::json& h) { h[q]["data_offsets"][1] = uint64_t{1} << 40; });
  EXPECT_EQ(LoadCode(dir_), StatusCode::kDataLoss);
  EditHeader([&](nlohmann::json& h) {
    uint64_t b = h[q]["data_offsets"][0];
    h[q]["data_offsets"] = {b + 8, b};  // begin > end
  });
  EXPECT_EQ(LoadCode(dir_), StatusCode::kDataLoss);
  EditHeader([&](nlohmann::json& h) { h[q]["dtype"] = "F16"; });  // half the bytes the span holds
  EXPECT_EQ(LoadCode(dir_), StatusCode::kDataLoss);
  EditHeader([&](nlohmann::json& h) { h[q]["shape"] = {32, 16}; });  // span != shape x dtype
  EXPECT_EQ(LoadCode(dir_), StatusCode::kDataLoss);
  EditHeader([&](nlohmann::json& h) { h[q]["shape"] = {16, 64}; });  // consistent, but not the config's
  EXPECT_EQ(LoadCode(dir_), StatusCode::kDataLoss);
  EditHeader([&](nlohmann::json& h) { h[q]["shape"] = {-32, 32}; });
  EXPECT_EQ(LoadCode(dir_), StatusCode::kDataLoss);
  EditHeader([&](nlohmann::json& h) { h[q]["shape"] = {uint64_t{1} << 62, uint64_t{1} << 62}; });
  EXPECT_EQ(LoadCode(dir_), StatusCode::kDataLoss);
  EditHeader([&](nlohmann::json& h) {
    h[q]["dtype"] = "I8";
    h[q]["shape"] = {32, 128};
  });
  EXPECT_EQ(LoadCode(dir_), StatusCode::kUnimplemented);
  EditHeader([&](nlohmann::json& h) { h.erase(q); });
  EXPECT_EQ(LoadCode(dir_), StatusCode::kNotFound);
  EditHeader([&](nlohmann::json& h) { h.erase("lm_head.weight"); });  // untied config
  EXPECT_EQ(LoadCode(dir_), StatusCode::kNotFound);
  EditHeader([](nlohmann::json&) {});
  EXPECT_EQ(LoadCode(dir_), StatusCode::kOk);
}

// Not corrupt: a header whose length leaves the data section misaligned for f32. Such
// tensors are copied into aligned memory; the values must be unchanged.
TEST_F(HfCorruptionTest, UnalignedDataSectionStillLoads) {
  for (int pad = 0; pad < 4; ++pad) {
    EditHeader([&](nlohmann::json& h) { h["__metadata__"]["pad"] = std::string(static_cast<size_t>(pad), 'x'); });
    auto m = Model::Load(dir_);
    ASSERT_TRUE(m.ok()) << m.status().ToString();
    auto loaded = testing::LoadedTensors(**m);
    for (const NamedTensor& t : TinyTensors(TinyConfig())) ASSERT_EQ(loaded[t.name], t.data) << t.name;
    EXPECT_EQ(reinterpret_cast<uintptr_t>((*m)->weights().layers[0].wq.data) % 4, 0u);
  }
}

TEST_F(HfCorruptionTest, ShardIndex) {
  WriteOptions o;
  o.max_shard_bytes = 16 << 10;
  const std::string sd = tmp_.File("sharded");
  ASSERT_TRUE(WriteHfModel(sd, TinyConfig(), TinyTensors(TinyConfig()), o).ok());
  ASSERT_EQ(LoadCode(sd), StatusCode::kOk);
  const std::string index = ReadBytes(sd + "/model.safetensors.index.json");
  nlohmann::json j = nlohmann::json::parse(index);
  const std::string shard = j["weight_map"]["model.layers.1.mlp.up_proj.weight"];
  std::filesystem::rename(sd + "/" + shard, sd + "/moved");
  EXPECT_EQ(LoadCode(sd), StatusCode::kNotFound);
  std::filesystem::rename(sd + "/moved", sd + "/" + shard);
  ASSERT_EQ(LoadCode(sd), StatusCode::kOk);
  WriteBytes(sd + "/model.safetensors.index.json", "{\"weight_map\": ");
  EXPECT_EQ(LoadCode(sd), StatusCode::kDataLoss);
  WriteBytes(sd + "/model.safetensors.index.json", R"({"weight_map": {"lm_head.weight": "../../etc/passwd"}})");
  EXPECT_EQ(LoadCode(sd), StatusCode::kDataLoss);
  // The index names a shard that lacks the tensor.
  j["weight_map"]["lm_head.weight"] = j["weight_map"]["model.embed_tokens.weight"];
  WriteBytes(sd + "/model.safetensors.index.json", j.dump());
  EXPECT_EQ(LoadCode(sd), StatusCode::kDataLoss);
}

// Changed header bytes (its length and its JSON): never a crash, and the answer the
// change calls for, judged from the bytes by an independent JSON parse:
//  * the length changed, or the JSON no longer parses: DataLoss;
//  * the JSON parses to the same header, or differs only in "__metadata__" (free-form,
//    not read): it loads, with exactly the written weights;
//  * otherwise (a tensor's name, dtype, shape or offsets changed): DataLoss, NotFound (a
//    tensor missing under its name) or Unimplemented (a dtype Attic does not compute
//    with) -- never a load, never another code.
// Two kinds of change: 3 random bytes anywhere (the JSON almost never parses), and one
// name or number character replaced by another (it mostly does: the loader's checks of
// names, dtypes, shapes and offsets, and the metadata it ignores).
TEST_F(HfCorruptionTest, ChangedHeaderBytesGiveTheStatusTheChangeCallsFor) {
  std::mt19937 rng(1);
  uint64_t n = 0;
  std::memcpy(&n, bytes_.data(), 8);
  nlohmann::json original = nlohmann::json::parse(bytes_.substr(8, n));
  original.erase("__metadata__");
  const auto written = [] {
    std::map<std::string, std::vector<float>> m;
    for (const NamedTensor& t : TinyTensors(TinyConfig())) m[t.name] = t.data;
    return m;
  }();
  int unparsed = 0, same = 0, changed = 0;
  std::map<StatusCode, int> seen;
  auto check = [&](const std::string& b, const std::string& what) {
    WriteBytes(st_, b);
    auto m = Model::Load(dir_);
    const StatusCode code = m.ok() ? StatusCode::kOk : m.status().code();
    ++seen[code];
    const std::string got = what + ": " + (m.ok() ? "OK" : m.status().ToString());
    nlohmann::json h = nlohmann::json::parse(b.substr(8, n), nullptr, /*allow_exceptions=*/false);
    if (b.compare(0, 8, bytes_, 0, 8) != 0 || h.is_discarded()) {
      ++unparsed;
      EXPECT_EQ(code, StatusCode::kDataLoss) << got;
      return;
    }
    if (h.is_object()) h.erase("__metadata__");
    if (h == original) {
      ++same;
      ASSERT_TRUE(m.ok()) << got;
      EXPECT_TRUE(testing::LoadedTensors(**m) == written) << got;
      return;
    }
    ++changed;
    EXPECT_TRUE(code == StatusCode::kDataLoss || code == StatusCode::kNotFound || code == StatusCode::kUnimplemented)
        << got;
  };
  for (int iter = 0; iter < 300; ++iter) {
    std::string b = bytes_;
    for (int k = 0; k < 3; ++k) b[rng() % (8 + n)] = static_cast<char>(rng());
    check(b, "random bytes, iteration " + std::to_string(iter));
  }
  const std::string safe = "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ_.";
  for (int iter = 0; iter < 300; ++iter) {
    std::string b = bytes_;
    size_t at;
    do {
      at = 8 + rng() % n;
    } while (safe.find(b[at]) == std::string::npos);
    b[at] = safe[rng() % safe.size()];
    check(b, "byte " + std::to_string(at) + " '" + bytes_[at] + "' -> '" + b[at] + "'");
  }
  // Each kind of answer was called for and given.
  EXPECT_GT(unparsed, 0);
  EXPECT_GT(same, 0);
  EXPECT_GT(changed, 0);
  for (StatusCode c : {StatusCode::kOk, StatusCode::kDataLoss, StatusCode::kNotFound})
    EXPECT_GT(seen[c], 0) << StatusCodeName(c);
}

// GGUF ------------------------------------------------------------------------------

void PutU64(std::string* b, size_t off, uint64_t v) { std::memcpy(b->data() + off, &v, 8); }
void PutU32(std::string* b, size_t off, uint32_t v) { std::memcpy(b->data() + off, &v, 4); }

// Offset of the field after GGUF string `s` (its u64 length + bytes) in `b`.
size_t After(const std::string& b, const std::string& s) {
  uint64_t len = s.size();
  size_t p = b.find(std::string(reinterpret_cast<const char*>(&len), 8) + s);
  EXPECT_NE(p, std::string::npos) << s;
  return p + 8 + s.size();
}

class GgufCorruptionTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ModelConfig c = TinyConfig();
    c.vocab_size = 512;
    WriteOptions o;
    o.tokenizer.tokenizer_json_path = attic::testing::SharedDir() + "/models/stories260K-hf/tokenizer.json";
    path_ = tmp_.File("m.gguf");
    ASSERT_TRUE(WriteGgufModel(path_, c, TinyTensors(c), o).ok());
    ASSERT_EQ(LoadCode(path_), StatusCode::kOk);
    bytes_ = ReadBytes(path_);
  }
  StatusCode With(const std::string& b) {
    WriteBytes(path_, b);
    return LoadCode(path_);
  }
  attic::testing::TempDir tmp_;
  std::string path_, bytes_;
};

TEST_F(GgufCorruptionTest, MagicAndVersion) {
  std::string b = bytes_;
  b[0] = 'X';
  EXPECT_EQ(With(b), StatusCode::kDataLoss);
  b = bytes_;
  PutU32(&b, 4, 1);
  EXPECT_EQ(With(b), StatusCode::kUnimplemented);
  PutU32(&b, 4, 2);  // v2 has the same layout
  EXPECT_EQ(With(b), StatusCode::kOk);
  PutU32(&b, 4, 7);
  EXPECT_EQ(With(b), StatusCode::kUnimplemented);
  EXPECT_EQ(With(""), StatusCode::kDataLoss);
}

TEST_F(GgufCorruptionTest, EveryTruncationIsCleanDataLoss) {
  for (size_t len = 0; len < bytes_.size(); len += (len < 20000 ? 13 : 997)) {
    ASSERT_EQ(With(bytes_.substr(0, len)), StatusCode::kDataLoss) << "truncated to " << len;
  }
}

TEST_F(GgufCorruptionTest, LengthsAndCountsPastTheEnd) {
  std::string b = bytes_;
  PutU64(&b, 24, uint64_t{1} << 40);  // first key's length
  EXPECT_EQ(With(b), StatusCode::kDataLoss);
  b = bytes_;
  PutU64(&b, 16, uint64_t{1} << 62);  // n_kv
  EXPECT_EQ(With(b), StatusCode::kDataLoss);
  b = bytes_;
  PutU64(&b, 8, uint64_t{1} << 62);  // n_tensors
  EXPECT_EQ(With(b), StatusCode::kDataLoss);
  b = bytes_;
  size_t arr = After(b, "tokenizer.ggml.tokens");  // u32 type, u32 elem type, u64 count
  PutU64(&b, arr + 8, uint64_t{1} << 61);
  EXPECT_EQ(With(b), StatusCode::kDataLoss);
  b = bytes_;
  PutU64(&b, arr + 16, uint64_t{1} << 50);  // first token string's length
  EXPECT_EQ(With(b), StatusCode::kDataLoss);
  b = bytes_;
  PutU32(&b, arr, 77);  // unknown value type
  EXPECT_EQ(With(b), StatusCode::kDataLoss);
}

TEST_F(GgufCorruptionTest, TensorInfos) {
  const std::string name = "blk.0.ffn_up.weight";  // ne = [32, 48]
  std::string b = bytes_;
  size_t info = After(b, name);  // u32 n_dims, u64 ne[2], u32 type, u64 offset
  PutU32(&b, info, 5);
  EXPECT_EQ(With(b), StatusCode::kDataLoss);
  b = bytes_;
  PutU64(&b, info + 4 + 16 + 4, uint64_t{1} << 40);  // offset
  EXPECT_EQ(With(b), StatusCode::kDataLoss);
  b = bytes_;
  PutU64(&b, info + 4, ~uint64_t{0});  // ne[0]
  EXPECT_EQ(With(b), StatusCode::kDataLoss);
  b = bytes_;
  PutU64(&b, info + 4, 48);  // [48, 32]: fits the file, wrong for the config
  PutU64(&b, info + 12, 32);
  EXPECT_EQ(With(b), StatusCode::kDataLoss);
  b = bytes_;
  PutU32(&b, info + 20, 19);  // IQ1_S: a real type Attic does not compute with
  EXPECT_EQ(With(b), StatusCode::kUnimplemented);
  b = bytes_;
  PutU32(&b, info + 20, 99);  // unknown type
  EXPECT_EQ(With(b), StatusCode::kUnimplemented);
  b = bytes_;
  b[b.find("blk.1.ffn_up.weight")] = 'x';  // tensor missing under its name
  EXPECT_EQ(With(b), StatusCode::kNotFound);
}

TEST_F(GgufCorruptionTest, Metadata) {
  std::string b = bytes_;
  size_t arch = After(b, "general.architecture");  // u32 type, string "llama"
  std::memcpy(b.data() + arch + 12, "qwen2", 5);
  auto m = (WriteBytes(path_, b), Model::Load(path_));
  ASSERT_EQ(m.status().code(), StatusCode::kUnimplemented);
  EXPECT_NE(m.status().message().find("qwen2"), std::string::npos);
  b = bytes_;
  b[b.find("general.architecture") + 3] = 'X';
  EXPECT_EQ(With(b), StatusCode::kDataLoss);
  b = bytes_;
  b[b.find("llama.embedding_length") + 5] = 'X';
  EXPECT_EQ(With(b), StatusCode::kDataLoss);
  b = bytes_;
  PutU32(&b, After(b, "general.alignment") + 4, 3);
  EXPECT_EQ(With(b), StatusCode::kDataLoss);
  b = bytes_;
  PutU32(&b, After(b, "llama.attention.head_count_kv") + 4, 3);  // 4 % 3 != 0
  EXPECT_EQ(With(b), StatusCode::kInvalidArgument);
  b = bytes_;
  PutU32(&b, After(b, "llama.block_count"), 8);  // type: string instead of u32
  EXPECT_NE(With(b), StatusCode::kOk);
}

// Random bytes of the metadata and tensor infos changed: never a crash, and only the
// codes a malformed GGUF may give: DataLoss (malformed), NotFound (a tensor missing
// under its name), Unimplemented (a version, type or architecture Attic does not
// support) or InvalidArgument (metadata that parses but is invalid: a config's head
// counts, a token that is not UTF-8). A load is possible (GGUF has no checksum: a changed
// token text or float is still a model), but never another code (Internal, a failed
// allocation, ...). The magic and the version are judged from the bytes: a changed magic
// is DataLoss, a version other than 2 and 3 Unimplemented.
TEST_F(GgufCorruptionTest, RandomHeaderByteFlipsGiveOnlyTheCodesOfAMalformedFile) {
  std::mt19937 rng(2);
  const size_t header = bytes_.find("blk.1.ffn_down.weight") + 64;
  std::map<StatusCode, int> seen;
  for (int iter = 0; iter < 1000; ++iter) {
    std::string b = bytes_;
    for (int k = 0; k < 2; ++k) b[rng() % header] = static_cast<char>(rng());
    WriteBytes(path_, b);
    auto m = Model::Load(path_);
    const StatusCode code = m.ok() ? StatusCode::kOk : m.status().code();
    ++seen[code];
    const std::string what = "iteration " + std::to_string(iter) + ": " + (m.ok() ? "OK" : m.status().ToString());
    uint32_t version = 0;
    std::memcpy(&version, b.data() + 4, 4);
    if (b.compare(0, 4, "GGUF") != 0) {
      EXPECT_EQ(code, StatusCode::kDataLoss) << what;
    } else if (version != 2 && version != 3) {
      EXPECT_EQ(code, StatusCode::kUnimplemented) << what;
    } else {
      EXPECT_TRUE(code == StatusCode::kOk || code == StatusCode::kDataLoss || code == StatusCode::kNotFound ||
                  code == StatusCode::kUnimplemented || code == StatusCode::kInvalidArgument)
          << what;
    }
  }
  EXPECT_GT(seen[StatusCode::kDataLoss], 0);  // the changes do reach the parser's checks
}

TEST(GgufStoriesTruncationTest, SharedFileTruncated) {
  const std::string src = attic::testing::SharedDir() + "/models/stories260K-gguf/stories260K.gguf";
  std::string bytes = ReadBytes(src);
  ASSERT_GT(bytes.size(), 100000u);
  attic::testing::TempDir tmp;
  for (size_t len : {size_t{3}, size_t{23}, size_t{4000}, size_t{14170}, size_t{500000}, bytes.size() - 1}) {
    WriteBytes(tmp.File("t.gguf"), bytes.substr(0, len));
    EXPECT_EQ(LoadCode(tmp.File("t.gguf")), StatusCode::kDataLoss) << len;
  }
}

}  // namespace
}  // namespace attic::model
