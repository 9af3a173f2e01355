// Linking cached chunks through the scheduler (paper 002, Epic; pic/link.h) on the
// trained stories260K, with the engine in deterministic mode (every row's result the
// same bits whatever shares its step), so that "equals" means the same tokens:
//  * the exactness cases of the methods: AttnLink with k >= the chunk length and
//    CacheBlend with ratio 1 recompute every cached token and equal Fully-Recompute (a
//    plain request of the same prompt in a tenant where nothing is stored); Naive with
//    one chunk at position 0, prefilled after the same BOS, equals the uncached request;
//  * what is counted: cached and recomputed tokens per method, from the chunk lengths;
//  * a chunk whose KV is gone is computed (equals FR), a linked request batched with a
//    plain one changes neither, and a conversation's next turn reuses the linked KV
//    saved with the turn: the same tokens as linking that next turn afresh;
//  * prefill-only requests (KVGen) store exactly their prompt's KV and sample nothing.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <fstream>
#include <numeric>
#include <random>
#include <set>
#include <sstream>
#include <tuple>

#include "attic/engine/kv_features.h"
#include "attic/engine/scheduler.h"
#include "attic/pic/link.h"
#include "attic/store/kv_store.h"
#include "test_util.h"

namespace attic::engine {
namespace {

using attic::testing::SharedDir;
using namespace std::chrono_literals;

struct Result {
  std::string text;
  TokenUsage usage;
  std::string finish_reason;
  bool finished = false;
};

class LinkTest : public ::testing::Test {
 protected:
  void SetUp() override {
    EngineOptions o;
    o.model_path = SharedDir() + "/models/stories260K-hf";
    o.n_threads = 2;
    o.max_batch_tokens = 64;  // a linked prompt's computed slots span several steps
    o.kv_cache_bytes = 16 << 20;
    o.deterministic = true;
    auto e = Engine::Load(o);
    ASSERT_TRUE(e.ok()) << e.status().ToString();
    engine_ = std::move(*e);
    store::StoreOptions so;
    so.fingerprint = engine_->model().fingerprint();
    so.dram_bytes = 256 << 20;
    so.write_buffer_bytes = 0;  // saves are synchronous: a chunk is stored when its request ends
    auto st = store::KvStore::Open(so);
    ASSERT_TRUE(st.ok()) << st.status().ToString();
    store_ = std::move(*st);
    sched_ = std::make_unique<Scheduler>(*engine_, SchedulerOptions{});
    sched_->set_store(store_.get());

    std::ifstream f(SharedDir() + "/datasets/tinystories_valid_sample/TinyStories-valid-sample.txt");
    std::stringstream ss;
    ss << f.rdbuf();
    const std::string text = ss.str();
    ASSERT_GT(text.size(), 4000u);
    // Three chunks of different lengths from different places of the text.
    for (auto [at, len] : {std::pair{0, 220}, std::pair{1500, 160}, std::pair{3000, 260}}) {
      chunks_.push_back(Encode(text.substr(at, len)));
      ASSERT_GT(chunks_.back().size(), 20u);
    }
    bos_ = engine_->tokenizer().bos_id();
    ASSERT_GE(bos_, 0);
  }

  std::vector<int32_t> Encode(const std::string& s) const {
    tokenizer::EncodeOptions eo;
    eo.add_bos = false;
    auto t = engine_->tokenizer().Encode(s, eo);
    EXPECT_TRUE(t.ok());
    return t.ok() ? *t : std::vector<int32_t>{};
  }

  // Runs the requests together until all have finished.
  std::vector<Result> Run(std::vector<GenerationRequest> reqs) {
    std::vector<std::shared_ptr<ResultChannel>> chans;
    for (auto& r : reqs) {
      auto c = sched_->Submit(std::move(r));
      EXPECT_TRUE(c.ok()) << c.status().ToString();
      chans.push_back(c.ok() ? *c : nullptr);
    }
    std::vector<Result> out(chans.size());
    auto done = [&] { return std::all_of(out.begin(), out.end(), [](const Result& r) { return r.finished; }); };
    steps_ = 0;
    for (int step = 0; step < 5000 && !done(); ++step) {
      sched_->Step();
      ++steps_;
      for (size_t i = 0; i < chans.size(); ++i) {
        GenerationEvent ev;
        while (chans[i] && !out[i].finished && chans[i]->Pop(&ev, 0ms)) {
          if (ev.kind == GenerationEvent::Kind::kText) {
            out[i].text += ev.text;
          } else {
            EXPECT_EQ(ev.kind, GenerationEvent::Kind::kFinish) << ev.status.ToString();
            out[i].usage = ev.usage;
            out[i].finish_reason = ev.finish_reason;
            out[i].finished = true;
          }
        }
      }
    }
    EXPECT_TRUE(done());
    return out;
  }

  // KVGen: the chunk's KV prefilled on its own after a BOS token, stored as
  // (tenant, session); returns the entry's key.
  std::string Gen(const std::string& tenant, const std::vector<int32_t>& chunk, const std::string& session) {
    GenerationRequest r;
    r.tenant = tenant;
    r.session_id = session;
    r.prompt = {bos_};
    r.prompt.insert(r.prompt.end(), chunk.begin(), chunk.end());
    r.prefill_only = true;
    r.sampling.max_tokens = 1;
    Result res = Run({std::move(r)})[0];
    EXPECT_EQ(res.finish_reason, "stop");
    EXPECT_EQ(res.usage.completion_tokens, 0);
    EXPECT_EQ(res.text, "");
    auto info = store_->GetSession(tenant, session);
    EXPECT_TRUE(info.ok()) << info.status().ToString();
    return info.ok() ? info->key : "";
  }

  // A prompt of parts: BOS, then chunk i / text alternately as `layout` says (>= 0:
  // chunks_[i]; -1: a short text), then a closing text. `spec` gets the linked chunks.
  std::vector<int32_t> Prompt(const std::vector<int>& layout, const std::vector<std::string>& keys, pic::LinkSpec* spec) {
    std::vector<int32_t> p = {bos_};
    for (int part : layout) {
      if (part < 0) {
        std::vector<int32_t> t = Encode(" And then the dog ran home.");
        p.insert(p.end(), t.begin(), t.end());
        continue;
      }
      spec->chunks.push_back({static_cast<int>(p.size()), static_cast<int>(chunks_[part].size()), keys[part], 1});
      p.insert(p.end(), chunks_[part].begin(), chunks_[part].end());
    }
    std::vector<int32_t> q = Encode(" Once upon a time, the girl");
    p.insert(p.end(), q.begin(), q.end());
    return p;
  }

  GenerationRequest Req(const std::string& tenant, std::vector<int32_t> prompt, std::shared_ptr<const pic::LinkSpec> spec,
                        int max_tokens = 24) {
    GenerationRequest r;
    r.tenant = tenant;
    r.prompt = std::move(prompt);
    if (spec != nullptr) r.kv_options.Set(std::move(spec));
    r.sampling.max_tokens = max_tokens;
    r.ignore_eos = true;
    return r;
  }

  // Fully-Recompute: the same prompt as a plain request, in a tenant with nothing stored.
  Result Fr(const std::vector<int32_t>& prompt, int max_tokens = 24) {
    return Run({Req("fr-" + std::to_string(fr_++), prompt, nullptr, max_tokens)})[0];
  }

  std::vector<std::string> GenAll(const std::string& tenant) {
    std::vector<std::string> keys;
    for (size_t i = 0; i < chunks_.size(); ++i) keys.push_back(Gen(tenant, chunks_[i], "ctx:chunk" + std::to_string(i)));
    return keys;
  }

  int Linked(const pic::LinkSpec& s) const {
    int n = 0;
    for (const auto& c : s.chunks) n += c.n;
    return n;
  }

  std::unique_ptr<Engine> engine_;
  std::unique_ptr<store::KvStore> store_;
  std::unique_ptr<Scheduler> sched_;
  int steps_ = 0;  // scheduler steps the last Run took
  std::vector<std::vector<int32_t>> chunks_;
  int32_t bos_ = -1;
  int fr_ = 0;
};

TEST_F(LinkTest, PrefillOnlyStoresExactlyThePromptsKv) {
  const std::string key = Gen("t", chunks_[0], "ctx:a");
  ASSERT_FALSE(key.empty());
  auto e = store_->Load(key);
  ASSERT_TRUE(e.ok()) << e.status().ToString();
  std::vector<int32_t> want = {bos_};
  want.insert(want.end(), chunks_[0].begin(), chunks_[0].end());
  EXPECT_EQ(e->tokens, want);
  for (int i = 0; i < e->n_tokens(); ++i) EXPECT_EQ(e->positions[i], i);
}

TEST_F(LinkTest, AttnLinkWithKAtLeastTheChunkLengthEqualsFullRecompute) {
  const auto keys = GenAll("t");
  auto spec = std::make_shared<pic::LinkSpec>();
  const std::vector<int32_t> prompt = Prompt({-1, 2, 0, -1, 1}, keys, spec.get());
  spec->options.method = pic::LinkMethod::kAttnLink;
  spec->options.k = 2 * 300;
  const Result linked = Run({Req("t", prompt, spec)})[0];
  const Result fr = Fr(prompt);
  EXPECT_EQ(linked.text, fr.text);
  EXPECT_EQ(linked.usage.recomputed_tokens, Linked(*spec));
  EXPECT_EQ(linked.usage.cached_tokens, 0);
  EXPECT_EQ(linked.usage.prompt_tokens, static_cast<int>(prompt.size()));
}

TEST_F(LinkTest, CacheBlendWithRatioOneEqualsFullRecompute) {
  for (int check_layer : {0, 1, engine_->model().config().n_layers - 1}) {
    // A tenant per case: a repeated prompt would reuse the previous answer's KV.
    const std::string t = "t" + std::to_string(check_layer);
    const auto keys = GenAll(t);
    auto spec = std::make_shared<pic::LinkSpec>();
    const std::vector<int32_t> prompt = Prompt({-1, 1, -1, 2, 0}, keys, spec.get());
    spec->options.method = pic::LinkMethod::kCacheBlend;
    spec->options.ratio = 1.0;
    spec->options.check_layer = check_layer;
    const Result linked = Run({Req(t, prompt, spec)})[0];
    EXPECT_EQ(linked.text, Fr(prompt).text) << "check_layer " << check_layer;
    EXPECT_EQ(linked.usage.recomputed_tokens, Linked(*spec));
    EXPECT_EQ(linked.usage.cached_tokens, 0);
  }
}

TEST_F(LinkTest, NaiveWithOneChunkAtPositionZeroEqualsTheUncachedRequest) {
  // The chunk's entry is also a stored prefix of this prompt: prefix reuse is turned off
  // so that the chunk is linked.
  SchedulerOptions so;
  so.min_reuse_tokens = 1 << 20;
  sched_ = std::make_unique<Scheduler>(*engine_, so);
  sched_->set_store(store_.get());
  const auto keys = GenAll("t");
  auto spec = std::make_shared<pic::LinkSpec>();
  const std::vector<int32_t> prompt = Prompt({0}, keys, spec.get());
  spec->options.method = pic::LinkMethod::kNaive;
  const Result linked = Run({Req("t", prompt, spec)})[0];
  EXPECT_EQ(linked.text, Fr(prompt).text);
  EXPECT_EQ(linked.usage.cached_tokens, static_cast<int>(chunks_[0].size()));
  EXPECT_EQ(linked.usage.recomputed_tokens, 0);
}

TEST_F(LinkTest, CountsWhatEachMethodRecomputes) {
  const std::vector<int> layout = {-1, 0, 1, -1, 2};
  int n_tenants = 0;
  auto linked_with = [&](pic::LinkOptions o) {
    // A tenant per case: a repeated prompt would reuse the previous answer's KV.
    const std::string t = "t" + std::to_string(n_tenants++);
    const auto keys = GenAll(t);
    auto spec = std::make_shared<pic::LinkSpec>();
    const std::vector<int32_t> prompt = Prompt(layout, keys, spec.get());
    spec->options = o;
    Result r = Run({Req(t, prompt, spec, 4)})[0];
    EXPECT_EQ(r.usage.prompt_tokens, static_cast<int>(prompt.size()));
    return std::pair{r.usage, Linked(*spec)};
  };
  pic::LinkOptions o;
  o.method = pic::LinkMethod::kNaive;
  auto [naive, n_linked] = linked_with(o);
  EXPECT_EQ(naive.recomputed_tokens, 0);
  EXPECT_EQ(naive.cached_tokens, n_linked);
  o.method = pic::LinkMethod::kAttnLink;
  o.k = 6;  // 3 from each chunk's start, 3 from its end
  auto [attn, n2] = linked_with(o);
  EXPECT_EQ(attn.recomputed_tokens, 3 * 6);
  EXPECT_EQ(attn.cached_tokens, n2 - 18);
  o.k = 5;  // 3 from the start, 2 from the end
  EXPECT_EQ(linked_with(o).first.recomputed_tokens, 3 * 5);
  o.method = pic::LinkMethod::kCacheBlend;
  o.ratio = 0.25;
  o.check_layer = 1;
  auto [blend, n3] = linked_with(o);
  // Selected per step among its chunk rows (ceil of the ratio each step): sum ceil(x_i / 4)
  // is at least n3 / 4 and below n3 / 4 + 1 per step; the request took steps_ steps (its
  // prefill steps and its 4 decode steps: an upper bound on the steps that selected).
  EXPECT_GE(blend.recomputed_tokens, (n3 + 3) / 4);
  EXPECT_LT(blend.recomputed_tokens, n3 / 4.0 + steps_);
  EXPECT_EQ(blend.cached_tokens, n3 - blend.recomputed_tokens);
  o.method = pic::LinkMethod::kFull;
  auto [full, n4] = linked_with(o);
  EXPECT_EQ(full.cached_tokens, 0);
  EXPECT_EQ(full.recomputed_tokens, 0);
}

// CacheBlend's selection against planted deviations (docs/linking.md: at the check layer
// the `ratio` of each forward step's chunk rows whose fresh K and V deviate most, by
// squared L2 over K and V, go on; the prompt's last slot always does). The chunks'
// stored KV is what Fully-Recompute computes for those slots (read from FR's saved turn)
// plus a planted offset per row and layer, so each row's deviation is known before the
// run: at the check layer the rows' squared deviations are 1, 2, ..., n in a shuffled
// order (well apart: no ties, far above rounding), split unevenly between K and V and
// between KV heads; at every other layer the order is reversed. Which rows went past the
// check layer is read back from the linked turn's saved entry: a row dropped there keeps
// its planted KV in the later layers, a kept row has fresh KV. The expected set is
// computed here in float64 from the planted values (RoPE is a rotation: the deviation
// of rotated K is the deviation of pre-RoPE K), per step of max_batch_tokens (64) rows.
TEST_F(LinkTest, CacheBlendKeepsTheRowsThatDeviateMostPerStep) {
  const model::ModelConfig& c = engine_->model().config();
  const int kvd = c.kv_dim(), n_layers = c.n_layers, check_layer = 1, kStep = 64;
  ASSERT_GT(n_layers, check_layer + 1);  // layers after the check layer to read the selection from
  const double ratio = 0.3;
  // BOS, text, chunk 0, text, chunk 2: the prompt ends inside a chunk, so its last slot
  // (always computed) is a chunk row.
  std::vector<int32_t> prompt = {bos_};
  auto append = [&](const std::vector<int32_t>& t) { prompt.insert(prompt.end(), t.begin(), t.end()); };
  append(Encode(" And then the dog ran home."));
  const int a0 = static_cast<int>(prompt.size());
  append(chunks_[0]);
  append(Encode(" The cat sat on the mat."));
  const int b0 = static_cast<int>(prompt.size());
  append(chunks_[2]);
  const int n = static_cast<int>(prompt.size()), last = n - 1;
  ASSERT_GT(n, 2 * kStep);  // three steps
  std::vector<uint8_t> is_chunk(n, 0);
  std::fill(is_chunk.begin() + a0, is_chunk.begin() + a0 + static_cast<int>(chunks_[0].size()), 1);
  std::fill(is_chunk.begin() + b0, is_chunk.end(), 1);

  // Fully-Recompute's KV of every slot, pre-RoPE (what the chunks' KV deviates from).
  GenerationRequest fr_req = Req("blend-fr", prompt, nullptr, 1);
  fr_req.session_id = "fr";
  Run({std::move(fr_req)});
  auto fr_info = store_->GetSession("blend-fr", "fr");
  ASSERT_TRUE(fr_info.ok()) << fr_info.status().ToString();
  auto fr = store_->Load(fr_info->key);
  ASSERT_TRUE(fr.ok()) << fr.status().ToString();
  ASSERT_GE(fr->n_tokens(), n);
  ASSERT_TRUE(std::equal(prompt.begin(), prompt.end(), fr->tokens.begin()));

  // The planted offsets. Candidates (chunk rows but the last slot) get ranks 0..m-1 in a
  // shuffled order; the squared deviation of rank r is 1 + r at the check layer and
  // m - r elsewhere; the last slot gets the smallest of all (0.5).
  std::vector<int> cand;
  for (int s = 0; s < n; ++s)
    if (is_chunk[s] && s != last) cand.push_back(s);
  const int m = static_cast<int>(cand.size());
  SCOPED_TRACE("prompt of " + std::to_string(n) + " slots, " + std::to_string(m) + " candidate chunk rows");
  std::vector<int> rank(n, -1);
  {
    std::vector<int> r(m);
    std::iota(r.begin(), r.end(), 0);
    std::mt19937 rng(7);
    for (int i = m - 1; i > 0; --i) std::swap(r[i], r[static_cast<int>(rng() % static_cast<uint32_t>(i + 1))]);
    for (int i = 0; i < m; ++i) rank[cand[i]] = r[i];
  }
  // The planted KV of every chunk slot: FR's plus the offset, K's all in one element of
  // KV head s % n_kv_heads, V's in one element of the next head, their shares of the
  // squared deviation 0.1 / 0.5 / 0.9 for K by slot.
  const int hd = c.head_dim, n_kv_heads = c.n_kv_heads;
  const double k_share[3] = {0.1, 0.5, 0.9};
  std::vector<std::vector<float>> pk(n_layers), pv(n_layers);  // [n_layers][n, kvd]
  for (int l = 0; l < n_layers; ++l) {
    pk[l].assign(static_cast<size_t>(n) * kvd, 0.0f);
    pv[l].assign(static_cast<size_t>(n) * kvd, 0.0f);
    for (int s = 0; s < n; ++s) {
      if (!is_chunk[s]) continue;
      float* k = pk[l].data() + static_cast<size_t>(s) * kvd;
      float* v = pv[l].data() + static_cast<size_t>(s) * kvd;
      std::copy(fr->k_row(l, s), fr->k_row(l, s) + kvd, k);
      std::copy(fr->v_row(l, s), fr->v_row(l, s) + kvd, v);
      const double d = s == last ? 0.5 : l == check_layer ? 1.0 + rank[s] : static_cast<double>(m - rank[s]);
      const double fk = k_share[s % 3];
      k[(s % n_kv_heads) * hd + (s / n_kv_heads) % hd] += static_cast<float>(std::sqrt(fk * d));
      v[((s + 1) % n_kv_heads) * hd + (s / n_kv_heads) % hd] += static_cast<float>(std::sqrt((1 - fk) * d));
    }
  }
  // The chunks' entries: BOS row (unused: src_row 1), then FR's rows plus the offsets.
  std::vector<std::string> keys;
  for (auto [slot, len, session] : {std::tuple{a0, static_cast<int>(chunks_[0].size()), "ctx:planted-a"},
                                    std::tuple{b0, static_cast<int>(chunks_[2].size()), "ctx:planted-b"}}) {
    store::KvEntry e;
    e.tenant = "blend";
    e.session_id = session;
    e.fingerprint = engine_->model().fingerprint();
    e.n_layers = n_layers;
    e.kv_dim = kvd;
    e.tokens = {bos_};
    e.tokens.insert(e.tokens.end(), prompt.begin() + slot, prompt.begin() + slot + len);
    for (int i = 0; i <= len; ++i) e.positions.push_back(i);
    e.k.assign(n_layers, std::vector<float>(static_cast<size_t>(len + 1) * kvd, 0.0f));
    e.v = e.k;
    for (int l = 0; l < n_layers; ++l) {
      std::copy(pk[l].begin() + static_cast<size_t>(slot) * kvd, pk[l].begin() + static_cast<size_t>(slot + len) * kvd,
                e.k[l].begin() + kvd);
      std::copy(pv[l].begin() + static_cast<size_t>(slot) * kvd, pv[l].begin() + static_cast<size_t>(slot + len) * kvd,
                e.v[l].begin() + kvd);
    }
    ASSERT_TRUE(store_->Save(std::move(e)).ok());
    auto info = store_->GetSession("blend", session);
    ASSERT_TRUE(info.ok()) << info.status().ToString();
    keys.push_back(info->key);
  }
  // Squared deviation of slot s's planted KV from FR at layer l, in float64: of K and V
  // over every KV head (`part`: 0 both, 1 K only, 2 V only, 3 KV head 0 only).
  auto deviation = [&](int l, int s, int part) {
    const float* k = pk[l].data() + static_cast<size_t>(s) * kvd;
    const float* v = pv[l].data() + static_cast<size_t>(s) * kvd;
    double d = 0;
    for (int j = 0; j < kvd; ++j) {
      if (part == 3 && j >= hd) break;
      const double dk = static_cast<double>(k[j]) - fr->k_row(l, s)[j];
      const double dv = static_cast<double>(v[j]) - fr->v_row(l, s)[j];
      if (part != 2) d += dk * dk;
      if (part != 1) d += dv * dv;
    }
    return d;
  };
  // The rows kept by a selection of the top ceil(ratio * rows) of each group of rows by
  // `score` (highest first), plus the last slot.
  auto select = [&](const std::vector<std::vector<int>>& groups, auto score) {
    std::set<int> kept = {last};
    for (std::vector<int> g : groups) {
      std::sort(g.begin(), g.end(), [&](int x, int y) { return score(x) > score(y); });
      const int n_keep = (3 * static_cast<int>(g.size()) + 9) / 10;  // ceil(0.3 * rows), exactly
      kept.insert(g.begin(), g.begin() + n_keep);
    }
    return kept;
  };
  // The steps: the prompt alone in the scheduler, every slot computed from slot 0 (no
  // stored prefix of it in the tenant), 64 rows a step.
  std::vector<std::vector<int>> steps((n + kStep - 1) / kStep);
  for (int s : cand) steps[s / kStep].push_back(s);
  // The scores are distinct (no ties to break).
  std::set<double> scores;
  for (int s : cand) scores.insert(deviation(check_layer, s, 0));
  ASSERT_EQ(static_cast<int>(scores.size()), m);
  // Rounding the planted values to f32 moves each by at most an ulp of |K| + offset
  // (~1e-6 here), the squared deviation by ~1e-5: within 1e-3 of 1 + rank, while
  // consecutive ranks are 1 apart.
  for (int s : cand) ASSERT_NEAR(deviation(check_layer, s, 0), 1.0 + rank[s], 1e-3) << s;
  const std::set<int> want = select(steps, [&](int s) { return deviation(check_layer, s, 0); });
  // What a wrong selection would keep: each differs from `want`, so the test tells them apart.
  EXPECT_NE(want, select({cand}, [&](int s) { return deviation(check_layer, s, 0); })) << "global, not per step";
  EXPECT_NE(want, select(steps, [&](int s) { return -deviation(check_layer, s, 0); })) << "the least deviating";
  EXPECT_NE(want, select(steps, [&](int s) { return deviation(0, s, 0); })) << "at layer 0";
  EXPECT_NE(want, select(steps, [&](int s) { return deviation(check_layer, s, 1); })) << "K only";
  EXPECT_NE(want, select(steps, [&](int s) { return deviation(check_layer, s, 2); })) << "V only";
  EXPECT_NE(want, select(steps, [&](int s) { return deviation(check_layer, s, 3); })) << "KV head 0 only";

  // The linked turn, saved as a conversation's.
  auto spec = std::make_shared<pic::LinkSpec>();
  spec->chunks = {{a0, static_cast<int>(chunks_[0].size()), keys[0], 1},
                  {b0, static_cast<int>(chunks_[2].size()), keys[1], 1}};
  spec->options.method = pic::LinkMethod::kCacheBlend;
  spec->options.ratio = ratio;
  spec->options.check_layer = check_layer;
  GenerationRequest r = Req("blend", prompt, spec, 1);
  r.session_id = "conv";
  const Result linked = Run({std::move(r)})[0];
  ASSERT_TRUE(linked.finished);
  auto info = store_->GetSession("blend", "conv");
  ASSERT_TRUE(info.ok()) << info.status().ToString();
  auto turn = store_->Load(info->key);
  ASSERT_TRUE(turn.ok()) << turn.status().ToString();
  ASSERT_GE(turn->n_tokens(), n);
  // A chunk row's saved V equals its planted V at a layer where it kept its cached KV.
  auto cached_at = [&](int l, int s) {
    return std::memcmp(turn->v_row(l, s), pv[l].data() + static_cast<size_t>(s) * kvd, kvd * sizeof(float)) == 0;
  };
  std::set<int> kept;
  for (int s = 0; s < n; ++s) {
    if (!is_chunk[s]) continue;
    for (int l = 0; l <= check_layer; ++l) EXPECT_FALSE(cached_at(l, s)) << "slot " << s << " not recomputed at layer " << l;
    const bool dropped = cached_at(check_layer + 1, s);
    for (int l = check_layer + 2; l < n_layers; ++l) EXPECT_EQ(cached_at(l, s), dropped) << "slot " << s << " layer " << l;
    if (!dropped) kept.insert(s);
  }
  EXPECT_EQ(kept, want);
}

TEST_F(LinkTest, AChunkWhoseKvIsGoneIsComputed) {
  const auto keys = GenAll("t");
  ASSERT_TRUE(store_->EraseSession("t", "ctx:chunk1").ok());
  auto spec = std::make_shared<pic::LinkSpec>();
  const std::vector<int32_t> prompt = Prompt({-1, 1}, keys, spec.get());
  spec->options.method = pic::LinkMethod::kNaive;
  const Result linked = Run({Req("t", prompt, spec)})[0];
  EXPECT_EQ(linked.usage.cached_tokens, 0);
  EXPECT_EQ(linked.text, Fr(prompt).text);
  // Another tenant's chunks are not linked either (the key names the tenant).
  const auto other = GenAll("u");
  auto spec2 = std::make_shared<pic::LinkSpec>();
  const std::vector<int32_t> p2 = Prompt({-1, 0, 2}, other, spec2.get());
  spec2->options.method = pic::LinkMethod::kNaive;
  const Result foreign = Run({Req("w", p2, spec2)})[0];
  EXPECT_EQ(foreign.usage.cached_tokens, 0);
  EXPECT_EQ(foreign.text, Fr(p2).text);
}

TEST_F(LinkTest, ALinkedRequestBatchesWithAPlainOne) {
  // Alone in tenant a, batched in tenant b (each with its own chunks: a repeated prompt
  // would reuse the previous answer's KV).
  auto linked = [&](const std::string& t) {
    auto spec = std::make_shared<pic::LinkSpec>();
    const std::vector<int32_t> prompt = Prompt({-1, 0, -1, 2, 1}, GenAll(t), spec.get());
    spec->options.method = pic::LinkMethod::kAttnLink;
    spec->options.k = 8;
    return Req(t, prompt, spec);
  };
  const std::vector<int32_t> plain = Prompt({}, {}, nullptr);
  const Result alone = Run({linked("a")})[0];
  const Result plain_alone = Fr(plain);
  const auto both = Run({linked("b"), Req("v", plain, nullptr)});
  EXPECT_EQ(both[0].text, alone.text);
  EXPECT_EQ(both[1].text, plain_alone.text);
  EXPECT_EQ(both[0].usage.recomputed_tokens, alone.usage.recomputed_tokens);
  EXPECT_EQ(alone.usage.recomputed_tokens, 3 * 8);
}

TEST_F(LinkTest, TheNextTurnReusesTheLinkedKvSavedWithTheTurn) {
  // No resident reuse: the next turn reads the first turn's saved entry.
  SchedulerOptions so;
  so.max_resident = 0;
  sched_ = std::make_unique<Scheduler>(*engine_, so);
  sched_->set_store(store_.get());
  for (pic::LinkMethod m : {pic::LinkMethod::kAttnLink, pic::LinkMethod::kCacheBlend, pic::LinkMethod::kNaive}) {
    const std::string t = std::string("conv-") + pic::LinkMethodName(m);
    const auto keys = GenAll(t);
    auto spec = std::make_shared<pic::LinkSpec>();
    const std::vector<int32_t> p1 = Prompt({2, -1, 0}, keys, spec.get());
    spec->options.method = m;
    spec->options.k = 4;
    spec->options.ratio = 0.3;
    GenerationRequest r1 = Req(t, p1, spec, 12);
    r1.session_id = "conv";
    const Result t1 = Run({std::move(r1)})[0];
    auto stored = store_->SessionTokens(t, "conv");
    ASSERT_TRUE(stored.ok()) << stored.status().ToString();
    ASSERT_GE(stored->size(), p1.size());
    // Turn 2: the stored turn (prompt + answer) and a new question.
    std::vector<int32_t> p2 = *stored;
    std::vector<int32_t> q = Encode(" The end. Then the cat");
    p2.insert(p2.end(), q.begin(), q.end());
    GenerationRequest r2 = Req(t, p2, spec, 12);
    r2.session_id = "conv";
    const Result t2 = Run({std::move(r2)})[0];
    EXPECT_GE(t2.usage.cached_tokens, static_cast<int>(stored->size()) - 1) << pic::LinkMethodName(m);
    EXPECT_EQ(t2.usage.recomputed_tokens, 0) << pic::LinkMethodName(m);
    // The same second turn linked afresh (another tenant holding the same chunks):
    // turn 1's answer was decoded over the same linked KV, so the tokens agree. (Not for
    // CacheBlend: its selection depends on how the steps cut the rows.)
    if (m == pic::LinkMethod::kCacheBlend) continue;
    const std::string t_fresh = t + "-fresh";
    const auto keys2 = GenAll(t_fresh);
    auto spec2 = std::make_shared<pic::LinkSpec>(*spec);
    for (size_t i = 0; i < spec2->chunks.size(); ++i)
      spec2->chunks[i].store_key = keys2[std::find(keys.begin(), keys.end(), spec->chunks[i].store_key) - keys.begin()];
    const Result fresh = Run({Req(t_fresh, p2, spec2, 12)})[0];
    EXPECT_EQ(t2.text, fresh.text) << pic::LinkMethodName(m);
  }
}

// Linking over a kivi4 store (K per channel over groups of tokens, docs/store.md "kivi4
// entries"): the chunks are kivi4 entries; the linked turn enters them at other slots than
// their rows, so it copies their rows as its own (K dequantized to f32: a turn's own K
// waits for its save to be grouped) beside the rows AttnLink recomputes in place; its
// save is a kivi4 entry of groups of at most 128 tokens, and the next turn reuses all of
// it, recomputing nothing.
TEST_F(LinkTest, AKivi4StoreLinksChunksAndSavesTheLinkedTurn) {
  sched_.reset();
  store::StoreOptions so;
  so.fingerprint = engine_->model().fingerprint();
  so.dram_bytes = 256 << 20;
  so.write_buffer_bytes = 0;
  so.kv_dtype = store::KvDtype::kKivi4;
  auto st = store::KvStore::Open(so);
  ASSERT_TRUE(st.ok()) << st.status().ToString();
  store_ = std::move(*st);
  SchedulerOptions sched_options;
  sched_options.max_resident = 0;
  sched_ = std::make_unique<Scheduler>(*engine_, sched_options);
  sched_->set_store(store_.get());
  const std::string t = "kivi";
  const auto keys = GenAll(t);
  for (const std::string& key : keys) {
    auto chunk = store_->Load(key);
    ASSERT_TRUE(chunk.ok()) << chunk.status().ToString();
    EXPECT_EQ(chunk->dtype, store::KvDtype::kKivi4);
  }
  auto spec = std::make_shared<pic::LinkSpec>();
  const std::vector<int32_t> p1 = Prompt({2, -1, 0}, keys, spec.get());
  spec->options.method = pic::LinkMethod::kAttnLink;
  spec->options.k = 4;
  GenerationRequest r1 = Req(t, p1, spec, 12);
  r1.session_id = "conv";
  const Result t1 = Run({std::move(r1)})[0];
  // The chunks' rows entered, less what AttnLink recomputed (plus one where the prompt's
  // BOS counts as reused too: the first chunk follows it; an f32 store counts the same).
  EXPECT_GT(t1.usage.recomputed_tokens, 0);
  EXPECT_GE(t1.usage.cached_tokens, Linked(*spec) - t1.usage.recomputed_tokens);
  EXPECT_LE(t1.usage.cached_tokens, Linked(*spec) + 1 - t1.usage.recomputed_tokens);
  auto info = store_->GetSession(t, "conv");
  ASSERT_TRUE(info.ok()) << info.status().ToString();
  auto saved = store_->Load(info->key);
  ASSERT_TRUE(saved.ok()) << saved.status().ToString();
  EXPECT_EQ(saved->dtype, store::KvDtype::kKivi4);
  ASSERT_GT(saved->n_tokens(), 128);
  const std::vector<int32_t> ends = saved->KGroupEnds();
  EXPECT_EQ(ends.front(), 128);  // the turn's own rows, from slot 0
  EXPECT_EQ(ends.back(), saved->n_tokens());
  for (size_t g = 1; g < ends.size(); ++g) EXPECT_LE(ends[g] - ends[g - 1], 128);
  std::vector<int32_t> p2 = saved->tokens;
  const std::vector<int32_t> q = Encode(" The end. Then the cat");
  p2.insert(p2.end(), q.begin(), q.end());
  GenerationRequest r2 = Req(t, p2, spec, 12);
  r2.session_id = "conv";
  const Result t2 = Run({std::move(r2)})[0];
  EXPECT_TRUE(t2.finished);
  EXPECT_GE(t2.usage.cached_tokens, saved->n_tokens() - 1);
  EXPECT_EQ(t2.usage.recomputed_tokens, 0);
}

TEST_F(LinkTest, AnOverlongLinkedPromptIsTruncatedInTheCacheAndStillLinks) {
  // Decoupled truncation (paper 001): the prompt overflows the 512-token window; its
  // chunks follow the tokens they cover. With k covering every chunk the link equals
  // Fully-Recompute of the prompt as truncated (read back from the turn's stored entry).
  KvFeatureOptions fo;
  fo.truncate_ratio = 0.3;
  fo.truncate_keep_first = 4;
  SchedulerOptions so;
  so.kv_connector = KvFeatures(fo);
  sched_ = std::make_unique<Scheduler>(*engine_, so);
  sched_->set_store(store_.get());
  const auto keys = GenAll("t");
  auto spec = std::make_shared<pic::LinkSpec>();
  const std::vector<int32_t> prompt = Prompt({-1, 0, 1, 2, -1, 0, 1, 2}, keys, spec.get());
  ASSERT_GT(static_cast<int>(prompt.size()), engine_->context_length());
  spec->options.method = pic::LinkMethod::kAttnLink;
  spec->options.k = 600;
  GenerationRequest r = Req("t", prompt, spec, 8);
  r.session_id = "long";
  const Result linked = Run({std::move(r)})[0];
  ASSERT_TRUE(linked.finished);
  EXPECT_LT(linked.usage.prompt_tokens, engine_->context_length());
  EXPECT_GT(linked.usage.recomputed_tokens, 0);  // chunks that survived the cut were linked
  auto stored = store_->SessionTokens("t", "long");
  ASSERT_TRUE(stored.ok()) << stored.status().ToString();
  const std::vector<int32_t> truncated(stored->begin(), stored->begin() + linked.usage.prompt_tokens);
  EXPECT_EQ(std::vector<int32_t>(truncated.begin(), truncated.begin() + 4),
            std::vector<int32_t>(prompt.begin(), prompt.begin() + 4));
  EXPECT_EQ(linked.text, Fr(truncated, 8).text);
}

TEST_F(LinkTest, ALinkedPromptOutsideAConversationIsNotSaved) {
  const auto keys = GenAll("t");
  auto spec = std::make_shared<pic::LinkSpec>();
  const std::vector<int32_t> prompt = Prompt({-1, 0, 1}, keys, spec.get());
  const uint64_t entries = store_->Stats().entries;
  Run({Req("t", prompt, spec, 4)});
  store_->Flush();
  EXPECT_EQ(store_->Stats().entries, entries);
  // The same prompt in a conversation is saved (the first request's unsaved sequence did
  // not stay resident to be adopted unsaved).
  const uint64_t entries2 = store_->Stats().entries;
  GenerationRequest r = Req("t", prompt, spec, 4);
  r.session_id = "conv";
  Run({std::move(r)});
  store_->Flush();
  EXPECT_EQ(store_->Stats().entries, entries2 + 1);
}

TEST_F(LinkTest, BadLinkSpecsAreRejected) {
  const auto keys = GenAll("t");
  auto spec = std::make_shared<pic::LinkSpec>();
  const std::vector<int32_t> prompt = Prompt({0, 1}, keys, spec.get());
  auto bad = [&](auto change) {
    auto s = std::make_shared<pic::LinkSpec>(*spec);
    change(*s);
    auto c = sched_->Submit(Req("t", prompt, s));
    EXPECT_FALSE(c.ok());
    if (!c.ok()) {
      EXPECT_EQ(c.status().code(), StatusCode::kInvalidArgument) << c.status().ToString();
    }
  };
  bad([](pic::LinkSpec& s) { std::swap(s.chunks[0], s.chunks[1]); });  // not ascending
  bad([&](pic::LinkSpec& s) { s.chunks[1].n = static_cast<int>(prompt.size()); });  // outside the prompt
  bad([](pic::LinkSpec& s) { s.options.method = pic::LinkMethod::kCacheBlend, s.options.ratio = 1.5; });
  bad([](pic::LinkSpec& s) { s.options.method = pic::LinkMethod::kCacheBlend, s.options.check_layer = 99; });
  bad([](pic::LinkSpec& s) { s.options.k = -1; });
}

}  // namespace
}  // namespace attic::engine
