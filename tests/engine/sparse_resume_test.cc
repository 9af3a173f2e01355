// A long conversation decoding with PQCache (pq/sparse.h) keeps its PQ index across
// turns (pq/pq_index.h): turn 1 clusters and its index is saved with its KV; the store
// restarts with the entry on SSD; turn 2 reuses the stored prefix, imports the index
// (no clustering) and decodes sparsely. The reference is an independent greedy loop on
// a fresh engine, no scheduler, no store, turn 2's prompt prefilled from scratch, whose
// selector starts from the same saved index: turn 2 decodes the same tokens and ends
// with the same index (codebooks and imported codes bit for bit; the codes of the new
// slots, computed from reused vs recomputed K, all but near ties). At ratio 0.2 the
// greedy tokens of stories260K happen to equal full attention's too, so the index is
// what tells the reference apart from a selector that clustered afresh: its codes
// disagree almost everywhere.
#include <gtest/gtest.h>

#include <chrono>
#include <fstream>
#include <cmath>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "attic/core/file.h"
#include "attic/engine/scheduler.h"
#include "attic/pq/pq_index.h"
#include "attic/store/kv_store.h"
#include "store/store_test_util.h"
#include "stories.h"
#include "test_util.h"

namespace attic::engine {
namespace {

using attic::testing::SharedDir;
using namespace std::chrono_literals;

std::unique_ptr<Engine> LoadStories() {
  EngineOptions o;
  o.max_batch_tokens = 128;
  o.kv_cache_bytes = 8 << 20;
  return attic::testing::LoadStories(o);
}
using attic::testing::StoryTokens;

std::shared_ptr<const pq::SparseOptions> PqFifth() {
  auto o = std::make_shared<pq::SparseOptions>();
  o->method = pq::SparseMethod::kPq;
  o->ratio = 0.2;
  o->min_slots = 64;  // below every prompt: each decode step is sparse
  return o;
}

constexpr int kTokens = 16;

// Runs one turn of session "conv" to the end; returns the completion's usage.
TokenUsage Turn(Scheduler& s, std::vector<int32_t> prompt) {
  GenerationRequest r;
  r.prompt = std::move(prompt);
  r.sampling.max_tokens = kTokens;  // greedy (temperature 0)
  r.ignore_eos = true;
  r.session_id = "conv";
  r.sparse = PqFifth();
  auto ch = s.Submit(std::move(r));
  EXPECT_TRUE(ch.ok()) << ch.status().ToString();
  TokenUsage usage;
  bool ended = false;
  for (int step = 0; step < 5000 && !ended; ++step) {
    s.Step();
    GenerationEvent ev;
    while ((*ch)->Pop(&ev, 0ms)) {
      if (ev.kind == GenerationEvent::Kind::kText) continue;
      ended = true;
      EXPECT_TRUE(ev.status.ok()) << ev.status.ToString();
      usage = ev.usage;
    }
  }
  EXPECT_TRUE(ended);
  return usage;
}

store::StoreOptions StoreOptionsFor(const Engine& e, const std::string& dir, uint64_t dram_bytes) {
  store::StoreOptions o;
  o.fingerprint = e.model().fingerprint();
  o.dram_bytes = dram_bytes;
  o.ssd_dir = dir;
  o.ssd_bytes = 256 << 20;
  o.default_ttl_ms = 0;
  return o;
}

// Greedy decoding of `prompt` straight through the transformer (no scheduler, no store):
// prefilled from scratch in 128-token chunks, then one token a step with `hooks`.
std::vector<int32_t> GreedyReference(Engine& e, const std::vector<int32_t>& prompt, int n, kv::LayerHooks* hooks) {
  kv::SequenceKv seq(&e.kv_pool());
  std::vector<float> logits;
  std::vector<int32_t> out;
  const int vocab = e.model().config().vocab_size;
  auto argmax = [&] {
    int best = 0;
    for (int i = 1; i < vocab; ++i)
      if (logits[i] > logits[best]) best = i;
    return best;
  };
  for (size_t pos = 0; pos < prompt.size(); pos += 128) {
    std::vector<BatchEntry> batch(1);
    batch[0].seq = &seq;
    batch[0].tokens.assign(prompt.begin() + pos, prompt.begin() + std::min(prompt.size(), pos + 128));
    EXPECT_TRUE(e.transformer().Forward(batch, &logits, hooks).ok());
  }
  out.push_back(argmax());
  while (static_cast<int>(out.size()) < n) {
    std::vector<BatchEntry> batch(1);
    batch[0].seq = &seq;
    batch[0].tokens = {out.back()};
    EXPECT_TRUE(e.transformer().Forward(batch, &logits, hooks).ok());
    out.push_back(argmax());
  }
  return out;
}

TEST(SparseResume, AConversationResumedFromSsdDecodesSparselyWithoutClusteringAgain) {
  auto e = LoadStories();
  ASSERT_NE(e, nullptr);
  const model::ModelConfig& c = e->model().config();
  store::testing::ScratchDir dir("sparse-resume");
  const std::vector<int32_t> first = StoryTokens(*e, 400);

  // Turn 1: prefill, cluster at the first decode step, decode sparsely; saved (with its
  // index) straight to SSD (no DRAM tier).
  std::vector<int32_t> history;
  std::string key;
  std::string saved_index;
  {
    auto st = store::KvStore::Open(StoreOptionsFor(*e, dir.path(), 0));
    ASSERT_TRUE(st.ok()) << st.status().ToString();
    SchedulerOptions so;
    so.max_resident = 0;
    Scheduler s(*e, so);
    s.set_store(st->get());
    const TokenUsage one = Turn(s, first);
    EXPECT_EQ(one.completion_tokens, kTokens);
    const SparseDecodeStats sp = s.Stats().sparse;
    EXPECT_EQ(sp.sparse_steps, static_cast<uint64_t>(kTokens - 1));
    EXPECT_EQ(sp.clustered_keys, static_cast<uint64_t>(first.size()) * c.n_kv_heads * c.n_layers);
    EXPECT_GT(sp.cluster_seconds, 0.0);
    EXPECT_EQ(sp.imported_indexes, 0u);
    (*st)->Flush();
    auto tokens = (*st)->SessionTokens("default", "conv");
    ASSERT_TRUE(tokens.ok());
    history = *tokens;  // the prompt and what was decoded (the last token was never fed)
    ASSERT_EQ(history.size(), first.size() + kTokens - 1);
    auto m = (*st)->Lookup("default", "conv", history);
    ASSERT_TRUE(m.has_value());
    key = m->key;
    EXPECT_EQ(m->tier, store::TierLevel::kSsd);
    auto entry = (*st)->Load(key);
    ASSERT_TRUE(entry.ok());
    const store::EntryAttachment* a = entry->attachment(pq::kPqIndexAttachment);
    ASSERT_NE(a, nullptr);
    saved_index = *a->bytes;
  }
  auto index = pq::DeserializePqIndex(saved_index);
  ASSERT_TRUE(index.ok()) << index.status().ToString();
  ASSERT_EQ(index->n_layers(), c.n_layers);
  for (const auto& l : index->layers) {
    ASSERT_TRUE(l.built);
    // Coded up to the local window of the last step (prompt + 15 slots; budget 83 of
    // 415, local a quarter of it).
    EXPECT_GT(l.n_coded, static_cast<int>(first.size()) - 40);
    EXPECT_LE(l.n_coded, static_cast<int>(history.size()));
  }

  // Turn 2, after a restart: the prompt is the conversation so far and a new sentence.
  std::vector<int32_t> second = history;
  const std::vector<int32_t> more = *e->Tokenize(" Then they all went home and had a big cake.", false);
  second.insert(second.end(), more.begin(), more.end());
  std::vector<int32_t> decoded;
  std::optional<pq::PqIndex> extended;
  {
    auto st = store::KvStore::Open(StoreOptionsFor(*e, dir.path(), 64 << 20));
    ASSERT_TRUE(st.ok()) << st.status().ToString();
    EXPECT_EQ((*st)->open_report().ssd_entries, 1u);
    EXPECT_EQ((*st)->TierOf(key), store::TierLevel::kSsd);  // read from SSD at admission
    SchedulerOptions so;
    so.max_resident = 0;
    Scheduler s(*e, so);
    s.set_store(st->get());
    const TokenUsage two = Turn(s, second);
    EXPECT_EQ(two.completion_tokens, kTokens);
    EXPECT_EQ(two.cached_tokens, static_cast<int>(history.size()));
    const SparseDecodeStats sp = s.Stats().sparse;
    EXPECT_EQ(sp.imported_indexes, 1u);
    EXPECT_EQ(sp.rejected_indexes, 0u);
    EXPECT_EQ(sp.clustered_keys, 0u);  // no clustering
    EXPECT_EQ(sp.cluster_seconds, 0.0);
    EXPECT_EQ(sp.sparse_steps, static_cast<uint64_t>(kTokens - 1));  // and sparse decoding
    EXPECT_EQ(sp.full_steps, 0u);
    EXPECT_EQ(sp.imported_keys, static_cast<uint64_t>(index->layers[0].n_coded) * c.n_kv_heads * c.n_layers);
    EXPECT_GT(sp.encoded_keys, 0u);  // the new sentence, coded by nearest centroid
    EXPECT_LT(sp.attended_slots, sp.context_slots / 4);
    (*st)->Flush();
    // Turn 2 is saved with its own (extended) index.
    auto tokens = (*st)->SessionTokens("default", "conv");
    ASSERT_TRUE(tokens.ok());
    ASSERT_EQ(tokens->size(), second.size() + kTokens - 1);
    decoded.assign(tokens->begin() + second.size(), tokens->end());
    auto m = (*st)->Lookup("default", "conv", *tokens);
    ASSERT_TRUE(m.has_value());
    auto entry = (*st)->Load(m->key);
    ASSERT_TRUE(entry.ok());
    ASSERT_NE(entry->attachment(pq::kPqIndexAttachment), nullptr);
    auto ext = pq::DeserializePqIndex(*entry->attachment(pq::kPqIndexAttachment)->bytes);
    ASSERT_TRUE(ext.ok());
    extended = std::move(*ext);
    EXPECT_GT(extended->layers[0].n_coded, index->layers[0].n_coded);
    // Its codebooks are turn 1's, its first codes turn 1's.
    EXPECT_EQ(extended->layers[3].books[0].centroids(), index->layers[3].books[0].centroids());
    EXPECT_TRUE(std::equal(index->layers[3].codes[0].begin(), index->layers[3].codes[0].end(),
                           extended->layers[3].codes[0].begin()));
  }

  // The reference: a fresh engine, no store, turn 2's prompt prefilled from scratch, a
  // selector started from the saved index (cut to the reused slots, as the scheduler does).
  auto fresh = LoadStories();
  ASSERT_NE(fresh, nullptr);
  const attention::AttentionShape shape = engine::AttentionShapeOf(c);
  auto ref = pq::MakeSparseAttention(*PqFifth(), shape, c.n_layers, fresh->threads());
  pq::PqIndex cut = *index;
  cut.Truncate(static_cast<int>(history.size()));
  ASSERT_TRUE(ref->ImportIndex(std::move(cut)).ok());
  const std::vector<int32_t> want = GreedyReference(*fresh, second, kTokens, ref.get());
  EXPECT_EQ(ref->stats().clustered_keys, 0);
  EXPECT_EQ(ref->stats().sparse_steps, kTokens - 1);
  ASSERT_EQ(decoded.size(), static_cast<size_t>(kTokens - 1));
  EXPECT_EQ(decoded, std::vector<int32_t>(want.begin(), want.begin() + kTokens - 1));

  // The index turn 2 saved against the reference's, and against a selector that
  // clustered turn 2's prompt afresh.
  auto scratch = pq::MakeSparseAttention(*PqFifth(), shape, c.n_layers, fresh->threads());
  GreedyReference(*fresh, second, kTokens, scratch.get());
  EXPECT_GT(scratch->stats().clustered_keys, 0);
  const std::optional<pq::PqIndex> mine = ref->ExportIndex(), afresh = scratch->ExportIndex();
  ASSERT_TRUE(mine.has_value() && afresh.has_value() && extended.has_value());
  int64_t new_codes = 0, new_differ = 0, afresh_codes = 0, afresh_differ = 0;
  for (int l = 0; l < c.n_layers; ++l) {
    const int imported = index->layers[l].n_coded;
    ASSERT_EQ(extended->layers[l].n_coded, mine->layers[l].n_coded);
    for (int h = 0; h < c.n_kv_heads; ++h) {
      SCOPED_TRACE(l * 100 + h);
      EXPECT_EQ(extended->layers[l].books[h].centroids(), mine->layers[l].books[h].centroids());
      const std::vector<uint8_t>& got = extended->layers[l].codes[h];
      const std::vector<uint8_t>& ref_codes = mine->layers[l].codes[h];
      const size_t split = static_cast<size_t>(imported) * index->m;
      EXPECT_TRUE(std::equal(got.begin(), got.begin() + split, ref_codes.begin()));
      for (size_t i = split; i < got.size(); ++i) {
        ++new_codes;
        new_differ += got[i] != ref_codes[i];
      }
      for (size_t i = 0; i < std::min(got.size(), afresh->layers[l].codes[h].size()); ++i) {
        ++afresh_codes;
        afresh_differ += got[i] != afresh->layers[l].codes[h][i];
      }
    }
  }
  EXPECT_GT(new_codes, 0);
  EXPECT_LE(new_differ * 100, new_codes);      // near ties only (measured: 4 of 1280)
  EXPECT_GT(afresh_differ * 2, afresh_codes);  // another codebook: most codes differ (16738 of 17040)
}

// Fault injection: a byte of the saved index flipped on disk. After a restart the next
// turn still reuses the stored KV (its layers are intact) but not the index: it is
// counted as rejected and the turn clusters again, decoding sparsely all the same.
TEST(SparseResume, ADamagedIndexOnDiskIsDroppedAndTheTurnClustersOverTheStoredKv) {
  auto e = LoadStories();
  ASSERT_NE(e, nullptr);
  store::testing::ScratchDir dir("sparse-resume-fault");
  const std::vector<int32_t> first = StoryTokens(*e, 400);
  std::vector<int32_t> history;
  std::string path;
  {
    auto st = store::KvStore::Open(StoreOptionsFor(*e, dir.path(), 0));
    ASSERT_TRUE(st.ok());
    SchedulerOptions so;
    so.max_resident = 0;
    Scheduler s(*e, so);
    s.set_store(st->get());
    Turn(s, first);
    (*st)->Flush();
    history = *(*st)->SessionTokens("default", "conv");
    auto m = (*st)->Lookup("default", "conv", history);
    ASSERT_TRUE(m.has_value());
    path = store::SsdTier::ModelDir(dir.path(), e->model().fingerprint()) + "/" + m->key + ".kv";
  }
  std::string bytes;
  {
    std::ifstream in(path, std::ios::binary);
    bytes.assign(std::istreambuf_iterator<char>(in), {});
  }
  ASSERT_GT(bytes.size(), 100u);
  bytes[bytes.size() - 50] ^= 0x01;  // the index is the file's last bytes: its codes
  std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes;

  std::vector<int32_t> second = history;
  const std::vector<int32_t> more = *e->Tokenize(" Then they all went home and had a big cake.", false);
  second.insert(second.end(), more.begin(), more.end());
  auto st = store::KvStore::Open(StoreOptionsFor(*e, dir.path(), 64 << 20));
  ASSERT_TRUE(st.ok());
  EXPECT_EQ((*st)->open_report().removed_corrupt, 0u);
  SchedulerOptions so;
  so.max_resident = 0;
  Scheduler s(*e, so);
  s.set_store(st->get());
  const TokenUsage two = Turn(s, second);
  EXPECT_EQ(two.cached_tokens, static_cast<int>(history.size()));  // the KV is served
  const SparseDecodeStats sp = s.Stats().sparse;
  EXPECT_EQ(sp.imported_indexes, 0u);
  EXPECT_EQ(sp.rejected_indexes, 1u);
  EXPECT_GT(sp.clustered_keys, 0u);
  EXPECT_EQ(sp.sparse_steps, static_cast<uint64_t>(kTokens - 1));
  EXPECT_GE((*st)->Stats().corrupt_attachments, 1u);
  EXPECT_EQ((*st)->Stats().corrupt, 0u);
}

// Without a store, a next turn that reuses a finished sequence still resident in the
// compute buffer (its prefix, same tokens at the same slots) starts from its index too.
TEST(SparseResume, ANextTurnReusingAResidentSequenceImportsItsIndex) {
  auto e = LoadStories();
  ASSERT_NE(e, nullptr);
  const model::ModelConfig& c = e->model().config();
  const std::vector<int32_t> first = StoryTokens(*e, 400);
  std::vector<int32_t> second = first;
  const std::vector<int32_t> more = *e->Tokenize(" Then they all went home and had a big cake.", false);
  second.insert(second.end(), more.begin(), more.end());
  Scheduler s(*e, SchedulerOptions{});
  Turn(s, first);
  const TokenUsage two = Turn(s, second);
  EXPECT_EQ(two.cached_tokens, static_cast<int>(first.size()));
  const SparseDecodeStats sp = s.Stats().sparse;
  EXPECT_EQ(sp.imported_indexes, 1u);
  EXPECT_EQ(sp.clustered_keys, static_cast<uint64_t>(first.size()) * c.n_kv_heads * c.n_layers);  // turn 1's only
  EXPECT_EQ(sp.sparse_steps, 2u * (kTokens - 1));
  EXPECT_GT(sp.imported_keys, 0u);
}

}  // namespace
}  // namespace attic::engine
