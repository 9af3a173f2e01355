// A long conversation decoding with PQCache (pq/sparse.h) keeps its PQ index across
// turns (pq/pq_index.h): turn 1 clusters and its index is saved with its KV; the store
// restarts with the entry on SSD; turn 2 reuses the stored prefix, imports the index
// (no clustering) and decodes sparsely. The reference is an independent greedy loop on
// a fresh engine, no scheduler, no store, turn 2's prompt prefilled from scratch, whose
// selector starts from the same saved index: turn 2 decodes the same tokens and ends
// with the same index (codebooks and imported codes bit for bit; the codes of the new
// slots, computed from reused vs recomputed K, equal where the K is the same bits and
// elsewhere near ties, within a bound derived from how far apart the two K are). At
// ratio 0.2 the greedy tokens of stories260K happen to equal full attention's too, so
// the index is what tells the reference apart from a selector that clustered afresh:
// its codes disagree almost everywhere.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "attic/core/file.h"
#include "attic/engine/kv_features.h"
#include "attic/engine/scheduler.h"
#include "attic/pq/pq_index.h"
#include "attic/pq/sparse.h"
#include "attic/pq/sparse_planner.h"
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
  r.kv_options.Set(PqFifth());
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
// prefilled from scratch in 128-token chunks, then one token a step with `hooks`. With
// `k_rot`, its K as attention read it (rotated) at the end: per layer [n_slots, kv_dim].
std::vector<int32_t> GreedyReference(Engine& e, const std::vector<int32_t>& prompt, int n, kv::LayerHooks* hooks,
                                     std::vector<std::vector<float>>* k_rot = nullptr) {
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
  if (k_rot != nullptr) {
    const int kvd = e.model().config().kv_dim();
    std::vector<float> v(static_cast<size_t>(seq.n_slots()) * kvd);
    k_rot->assign(e.model().config().n_layers, std::vector<float>(v.size()));
    for (size_t l = 0; l < k_rot->size(); ++l)
      seq.ReadKv(static_cast<int>(l), 0, seq.n_slots(), (*k_rot)[l].data(), v.data());
  }
  return out;
}

// Squared L2 norm of n floats, in double.
double SquaredNorm(const float* x, int n) {
  double s = 0;
  for (int j = 0; j < n; ++j) s += static_cast<double>(x[j]) * x[j];
  return s;
}

// Squared L2 distance of two sub-vectors of n floats, in double.
double Dist2(const float* x, const float* y, int n) {
  double s = 0;
  for (int j = 0; j < n; ++j) {
    const double t = static_cast<double>(x[j]) - y[j];
    s += t * t;
  }
  return s;
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
    const pq::SparseDecodeStats sp = s.Stats().kv.Value<pq::SparseDecodeStats>();
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
  std::vector<std::vector<float>> turn_k;  // turn 2's K as its selector coded it: [layer][slot, kv_dim]
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
    const pq::SparseDecodeStats sp = s.Stats().kv.Value<pq::SparseDecodeStats>();
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
    // The entry keeps K before RoPE; the selector coded it rotated, as the forward (new
    // slots) and the loader (reused slots) rotate it: RopeTable, the same bits either way.
    ASSERT_EQ(entry->dtype, store::KvDtype::kF32);
    const int kvd = c.kv_dim(), n_rows = entry->n_tokens();
    turn_k.assign(c.n_layers, std::vector<float>(static_cast<size_t>(n_rows) * kvd));
    for (int l = 0; l < c.n_layers; ++l) {
      for (int r = 0; r < n_rows; ++r)
        std::copy(entry->k_row(l, r), entry->k_row(l, r) + kvd, turn_k[l].begin() + static_cast<size_t>(r) * kvd);
      e->transformer().rope().Apply(turn_k[l].data(), n_rows, c.n_kv_heads, entry->positions.data());
    }
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
  std::vector<std::vector<float>> ref_k;
  const std::vector<int32_t> want = GreedyReference(*fresh, second, kTokens, ref.get(), &ref_k);
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
  // The codes of the new slots are each path's nearest centroid (PqCodebook::Encode: f32
  // squared L2 summed over a sub-space's dsub elements, first minimum) of its own K: the
  // scheduler's k' (turn 2's entry, rotated) and the reference's k (its sequence), both
  // f32 as the forward computed them (an f32 compute buffer: no rounding on the way).
  // Where a sub-vector of k' and k is the same bits, so is its code (same arithmetic).
  // Elsewhere, with d = k' - k, a the centroid chosen for k' and b the one for k:
  //   |k-a|^2 - |k-b|^2 = (|k'-a|^2 - |k'-b|^2) + 2 d.(a-b)  <=  2 |d| |a-b| + r(k'),
  //   |k-a|^2 - |k-b|^2 >= -r(k),
  // as a is nearest to k' and b to k up to r(x) = g (|x-a|^2 + |x-b|^2), the rounding of the
  // two f32 distances (sums of non-negative terms): a term carries the rounding of x - c
  // twice (squared), of the product once and of at most dsub - 1 sums (the first adds to
  // 0 exactly; FMA only removes roundings), so g = gamma(dsub + 2) = n u / (1 - n u),
  // u = 2^-24; one more u, gamma(dsub + 3), covers this test's double arithmetic.
  // d itself is reported, not bounded by rounding: the slots turn 1 decoded hold K that
  // turn 1 computed with sparse attention (a fifth of the slots a step) where the reference
  // prefills them with full attention, from layer 1 on, and the new sentence's K reads
  // those from layer 2 on. Elsewhere both K come from full attention and d is rounding
  // alone (other batch shapes: the forward is not batch-invariant outside --deterministic).
  const int hd = c.head_dim, kvd = c.kv_dim(), m = index->m, dsub = hd / m;
  const double g = (dsub + 3) * std::ldexp(1.0, -24) / (1 - (dsub + 3) * std::ldexp(1.0, -24));
  int64_t new_codes = 0, new_differ = 0, sparse_differ = 0, same_bits = 0, afresh_codes = 0, afresh_differ = 0;
  double rel_d_full = 0, rel_d_sparse = 0, worst_gap = 0, worst_bound = 0, worst_share = -1;
  std::vector<uint8_t> recoded;
  for (int l = 0; l < c.n_layers; ++l) {
    const int imported = index->layers[l].n_coded, n_coded = extended->layers[l].n_coded;
    ASSERT_EQ(mine->layers[l].n_coded, n_coded);
    ASSERT_LE(static_cast<size_t>(n_coded) * kvd, std::min(turn_k[l].size(), ref_k[l].size()));
    for (int h = 0; h < c.n_kv_heads; ++h) {
      SCOPED_TRACE(l * 100 + h);
      const pq::PqCodebook& book = extended->layers[l].books[h];
      EXPECT_EQ(book.centroids(), mine->layers[l].books[h].centroids());
      const std::vector<uint8_t>& got = extended->layers[l].codes[h];
      const std::vector<uint8_t>& ref_codes = mine->layers[l].codes[h];
      const size_t split = static_cast<size_t>(imported) * m;
      EXPECT_TRUE(std::equal(got.begin(), got.begin() + split, ref_codes.begin()));
      // The keys read here are the ones each path coded: coding them again gives its codes.
      recoded.assign(static_cast<size_t>(n_coded) * m, 0);
      ASSERT_EQ(got.size(), recoded.size());
      book.Encode(turn_k[l].data() + h * hd, n_coded, kvd, recoded.data());
      auto at = std::mismatch(recoded.begin(), recoded.end(), got.begin()).first;
      EXPECT_TRUE(at == recoded.end()) << "turn 2's K, code " << (at - recoded.begin());
      book.Encode(ref_k[l].data() + static_cast<size_t>(imported) * kvd + h * hd, n_coded - imported, kvd,
                  recoded.data() + split);
      at = std::mismatch(recoded.begin() + split, recoded.end(), ref_codes.begin() + split).first;
      EXPECT_TRUE(at == recoded.end()) << "the reference's K, code " << (at - recoded.begin());
      for (size_t i = split; i < got.size(); ++i) {
        ++new_codes;
        const int slot = static_cast<int>(i / m), s = static_cast<int>(i % m);
        const float* k2 = turn_k[l].data() + static_cast<size_t>(slot) * kvd + h * hd + s * dsub;
        const float* k1 = ref_k[l].data() + static_cast<size_t>(slot) * kvd + h * hd + s * dsub;
        const double d = std::sqrt(Dist2(k2, k1, dsub));
        // Whether turn 1's sparse steps feed this K (see above).
        const bool sparse_fed = slot >= static_cast<int>(first.size()) &&
                                l >= (slot >= static_cast<int>(history.size()) ? 2 : 1);
        double& rel_d = sparse_fed ? rel_d_sparse : rel_d_full;
        rel_d = std::max(rel_d, d / std::sqrt(std::max(1e-60, SquaredNorm(k1, dsub))));
        if (std::memcmp(k2, k1, sizeof(float) * dsub) == 0) {
          ++same_bits;
          EXPECT_EQ(got[i], ref_codes[i]) << "slot " << slot << " sub-space " << s << ": same K, another code";
          continue;
        }
        if (got[i] == ref_codes[i]) continue;
        ++new_differ;
        sparse_differ += sparse_fed;
        const float* a = book.centroid(s, got[i]);
        const float* b = book.centroid(s, ref_codes[i]);
        const double gap = Dist2(k1, a, dsub) - Dist2(k1, b, dsub);
        const double low = -g * (Dist2(k1, a, dsub) + Dist2(k1, b, dsub));
        const double high = 2 * d * std::sqrt(Dist2(a, b, dsub)) + g * (Dist2(k2, a, dsub) + Dist2(k2, b, dsub));
        EXPECT_GE(gap, low) << "slot " << slot << " sub-space " << s;
        EXPECT_LE(gap, high) << "slot " << slot << " sub-space " << s << ": |d| " << d;
        if (gap / high > worst_share) worst_share = gap / high, worst_gap = gap, worst_bound = high;
      }
      for (size_t i = 0; i < std::min(got.size(), afresh->layers[l].codes[h].size()); ++i) {
        ++afresh_codes;
        afresh_differ += got[i] != afresh->layers[l].codes[h][i];
      }
    }
  }
  std::printf("new slots' codes: %lld; K the same bits: %lld; codes that differ: %lld (%lld where turn 1's sparse "
              "steps feed K), worst gap %.3g of its bound %.3g; max |d| / |k|: %.3g where sparse steps feed K, %.3g "
              "elsewhere\n",
              static_cast<long long>(new_codes), static_cast<long long>(same_bits), static_cast<long long>(new_differ),
              static_cast<long long>(sparse_differ), worst_gap, worst_bound, rel_d_sparse, rel_d_full);
  EXPECT_GT(new_codes, 0);
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
  const pq::SparseDecodeStats sp = s.Stats().kv.Value<pq::SparseDecodeStats>();
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
  const pq::SparseDecodeStats sp = s.Stats().kv.Value<pq::SparseDecodeStats>();
  EXPECT_EQ(sp.imported_indexes, 1u);
  EXPECT_EQ(sp.clustered_keys, static_cast<uint64_t>(first.size()) * c.n_kv_heads * c.n_layers);  // turn 1's only
  EXPECT_EQ(sp.sparse_steps, 2u * (kTokens - 1));
  EXPECT_GT(sp.imported_keys, 0u);
}

}  // namespace
}  // namespace attic::engine
