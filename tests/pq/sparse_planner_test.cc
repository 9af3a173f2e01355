// pq::SparsePlanner's Check, Match, Start and Finish without a model: the checks a request
// meets at submission, what an offloaded one reserves, and the PQ index that goes with a
// sequence's KV. The scheduler's tests (tests/engine/sparse_*_test.cc) run it on a model.
#include "attic/pq/sparse_planner.h"

#include <gtest/gtest.h>

#include "attic/pq/offload.h"

namespace attic::pq {
namespace {

class SparsePlannerTest : public ::testing::Test {
 protected:
  SparsePlannerOptions Options() {
    SparsePlannerOptions o;
    o.shape = {4, 2, 16, 0.25f};
    o.n_layers = 2;
    o.context_length = 4096;
    o.kv_shape.n_layers = 2;
    o.kv_shape.n_kv_heads = 2;
    o.kv_shape.head_dim = 16;
    o.kv_shape.block_size = 16;
    o.pool_blocks = 64;
    o.chunk_tokens = 64;
    o.threads = &threads_;
    return o;
  }
  static kv::KvRequest Request(std::shared_ptr<const SparseOptions> o, int n_prompt = 100) {
    kv::KvRequest r;
    r.n_prompt = n_prompt;
    r.max_new_tokens = 10;
    if (o != nullptr) r.options.Set(std::move(o));
    return r;
  }
  backend::ThreadPool threads_{1};
};

TEST_F(SparsePlannerTest, CheckGivesTheDefaultToARequestWithoutOptionsAndRefusesChoicesWithASelector) {
  SparsePlannerOptions po = Options();
  auto pq = std::make_shared<SparseOptions>();
  pq->method = SparseMethod::kPq;
  po.defaults = pq;
  SparsePlanner planner(po);
  kv::KvRequest r = Request(nullptr);
  kv::KvLimits limits;
  limits.max_slots = 1024;
  ASSERT_TRUE(planner.Check(r, &limits).ok());
  EXPECT_EQ(r.options.Get<SparseOptions>(), pq);
  EXPECT_EQ(limits.no_choices, "sparse decoding");
  EXPECT_EQ(limits.max_slots, 1024);
  EXPECT_FALSE(limits.whole_prompt);

  // Full attention named by the request wins over the default, and allows choices.
  auto full = std::make_shared<SparseOptions>();
  full->method = SparseMethod::kFull;
  kv::KvRequest f = Request(full);
  kv::KvLimits fl;
  ASSERT_TRUE(planner.Check(f, &fl).ok());
  EXPECT_EQ(f.options.Get<SparseOptions>(), full);
  EXPECT_EQ(fl.no_choices, "");
}

TEST_F(SparsePlannerTest, CheckPrefixesAValidationErrorWithSparse) {
  SparsePlanner planner(Options());
  auto bad = std::make_shared<SparseOptions>();
  bad->ratio = 2;
  kv::KvRequest r = Request(bad);
  kv::KvLimits limits;
  Status st = planner.Check(r, &limits);
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(st.message().rfind("sparse", 0), 0u) << st.message();
}

TEST_F(SparsePlannerTest, AnOffloadedRequestIsBoundedByTheWindowAndWaitsForItsTierBytes) {
  SparsePlannerOptions po = Options();
  auto off = std::make_shared<SparseOptions>();
  off->method = SparseMethod::kStreaming;
  off->offload_cache_blocks = 2;
  // Room in the tier for one sequence of 200 slots, not two.
  po.offload_bytes = OffloadTierBytes(po.kv_shape, 200) + OffloadTierBytes(po.kv_shape, 100);
  SparsePlanner planner(po);

  kv::KvSeq seq;
  seq.request = Request(off);
  seq.limits.max_slots = 1024;
  ASSERT_TRUE(planner.Check(seq.request, &seq.limits).ok());
  EXPECT_EQ(seq.limits.max_slots, 4096);  // the window
  EXPECT_TRUE(seq.limits.whole_prompt);
  kv::KvAdmission a;
  a.max_slots = 200;
  planner.Match(kv::KvQueue{{&seq}, false, {}}, &a);
  EXPECT_EQ(a.blocks, OffloadWorkingBlocks(*off, 16, 200, 64) + 2);
  EXPECT_EQ(a.free_first, 2);
  EXPECT_TRUE(a.ready);

  // A context beyond the tier is refused at submission.
  kv::KvRequest big = Request(off, 4000);
  kv::KvLimits bl;
  EXPECT_EQ(planner.Check(big, &bl).code(), StatusCode::kOutOfRange);
  // A prefill-only request never decodes: no offload, no selector.
  kv::KvRequest kvgen = Request(off);
  kvgen.samples = false;
  kv::KvLimits kl;
  ASSERT_TRUE(planner.Check(kvgen, &kl).ok());
  EXPECT_FALSE(kl.whole_prompt);
}

TEST_F(SparsePlannerTest, ASelectorIsTheSequencesHooksAndAnIndexOfAnotherMethodIsNotImported) {
  SparsePlanner planner(Options());
  auto h2o = std::make_shared<SparseOptions>();
  h2o->method = SparseMethod::kH2o;
  kv::KvSeq seq;
  seq.request = Request(h2o);
  ASSERT_TRUE(planner.Check(seq.request, &seq.limits).ok());
  kv::KvReused reused;
  reused.n_as_is = 8;
  int asked = 0;
  reused.attachment = [&](std::string_view kind) -> StatusOr<std::string_view> {
    ++asked;
    EXPECT_EQ(kind, kPqIndexAttachment);
    return DataLossError("bad bytes");
  };
  kv::KvSlots slots;
  slots.reused = reused;
  ASSERT_TRUE(planner.Start(seq, &slots).ok());
  EXPECT_EQ(asked, 1);
  EXPECT_TRUE(seq.has_hooks(false));
  EXPECT_TRUE(seq.has_hooks(true));
  EXPECT_EQ(planner.stats().rejected_indexes, 1u);  // bad bytes are counted whatever the method
  kv::KvKeep keep;
  planner.Finish(seq, nullptr, &keep);
  EXPECT_TRUE(keep.resident);
  EXPECT_TRUE(keep.attachments.empty());
  EXPECT_EQ(planner.stats().requests.at("h2o"), 1u);
  EXPECT_FALSE(seq.has_hooks(true));
}

}  // namespace
}  // namespace attic::pq
