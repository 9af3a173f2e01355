#include "attic/kv/connector.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace attic::kv {
namespace {

struct Calls {
  std::vector<std::string> log;
};

// A planner that records its calls and answers as told.
class FakePlanner : public KvPlanner {
 public:
  struct State : KvSeqState {
    explicit State(LayerHooks* h) : h_(h) {}
    LayerHooks* hooks(bool decoding) override { return decoding ? nullptr : h_; }
    LayerHooks* h_;
  };
  FakePlanner(std::string name, Calls* calls) : name_(std::move(name)), calls_(calls) {}

  Status Check(KvRequest& request, KvLimits* limits) override {
    calls_->log.push_back(name_ + ".Check");
    if (!check_.ok()) return check_;
    limits->max_slots = std::min(limits->max_slots, max_slots_);
    return OkStatus();
  }
  void Match(const KvQueue& queue, KvAdmission* a) override {
    calls_->log.push_back(name_ + ".Match");
    if (a == nullptr) return;
    a->blocks = blocks_;
    a->free_first = free_first_;
    a->ready = ready_;
  }
  Status Start(KvSeq& seq, KvSlots* slots) override {
    calls_->log.push_back(name_ + ".Start");
    state(seq) = std::make_unique<State>(&hooks_);
    return OkStatus();
  }
  double WaitLayer(KvSeq& seq, int layer) override { return 0.5; }
  void Finish(KvSeq& seq, const SequenceKv* kv, KvKeep* keep) override {
    calls_->log.push_back(name_ + ".Finish");
    keep->resident = resident_;
    keep->attachments.push_back({name_, std::make_shared<const std::string>(name_)});
    state(seq).reset();
  }

  std::string name_;
  Calls* calls_;
  Status check_;
  int max_slots_ = 1 << 30;
  int blocks_ = -1;
  int free_first_ = 0;
  bool ready_ = true;
  bool resident_ = true;
  LayerHooks hooks_;
};

TEST(ComposedConnector, CallsThePlannersInOrderAndStopsAtTheFirstCheckError) {
  Calls calls;
  ComposedConnector c;
  auto a = std::make_unique<FakePlanner>("a", &calls);
  auto b = std::make_unique<FakePlanner>("b", &calls);
  a->max_slots_ = 100;
  b->max_slots_ = 50;
  FakePlanner* pa = a.get();
  c.Add(std::move(a));
  c.Add(std::move(b));
  KvRequest req;
  KvLimits limits;
  limits.max_slots = 4096;
  ASSERT_TRUE(c.Check(req, &limits).ok());
  EXPECT_EQ(limits.max_slots, 50);
  pa->check_ = InvalidArgumentError("a says no");
  EXPECT_EQ(c.Check(req, &limits).message(), "a says no");
  EXPECT_EQ(calls.log, (std::vector<std::string>{"a.Check", "b.Check", "a.Check"}));
}

TEST(ComposedConnector, MatchTakesTheLargestReservationAndReadyOnlyWhenAllAre) {
  Calls calls;
  ComposedConnector c;
  auto a = std::make_unique<FakePlanner>("a", &calls);
  auto b = std::make_unique<FakePlanner>("b", &calls);
  a->blocks_ = 7;
  a->free_first_ = 2;
  b->free_first_ = 3;
  FakePlanner* pb = b.get();
  c.Add(std::move(a));
  c.Add(std::move(b));
  KvSeq seq;
  KvAdmission adm;
  adm.max_slots = 64;
  c.Match(KvQueue{{&seq}, false, {}}, &adm);
  EXPECT_EQ(adm.blocks, 7);
  EXPECT_EQ(adm.free_first, 5);
  EXPECT_TRUE(adm.ready);
  pb->ready_ = false;
  KvAdmission again;
  c.Match(KvQueue{{&seq}, false, {}}, &again);
  EXPECT_FALSE(again.ready);
  EXPECT_EQ(again.blocks, 7);
}

TEST(ComposedConnector, ASequencesHooksFollowThePlannerOrderAndFinishGathersWhatToKeep) {
  Calls calls;
  ComposedConnector c;
  auto a = std::make_unique<FakePlanner>("a", &calls);
  auto b = std::make_unique<FakePlanner>("b", &calls);
  FakePlanner* pa = a.get();
  FakePlanner* pb = b.get();
  pb->resident_ = false;
  c.Add(std::move(a));
  c.Add(std::move(b));
  KvSeq seq;
  KvSlots slots;
  ASSERT_TRUE(c.Start(seq, &slots).ok());
  std::vector<LayerHooks*> order;
  seq.ForEachHooks(/*decoding=*/false, [&](LayerHooks* h) { order.push_back(h); });
  EXPECT_EQ(order, (std::vector<LayerHooks*>{&pa->hooks_, &pb->hooks_}));
  EXPECT_TRUE(seq.has_hooks(false));
  EXPECT_FALSE(seq.has_hooks(/*decoding=*/true));
  EXPECT_DOUBLE_EQ(c.WaitLayer(seq, 0), 1.0);
  KvKeep keep;
  c.Finish(seq, nullptr, &keep);
  EXPECT_FALSE(keep.resident);
  ASSERT_EQ(keep.attachments.size(), 2u);
  EXPECT_EQ(keep.attachments[0].kind, "a");
  EXPECT_EQ(keep.attachments[1].kind, "b");
  EXPECT_FALSE(seq.has_hooks(false));
}

TEST(ComposedConnector, StartRunsTheLastPlannerFirstAndFinishPassesWhatToKeepOn) {
  Calls calls;
  ComposedConnector c;
  auto a = std::make_unique<FakePlanner>("a", &calls);
  auto b = std::make_unique<FakePlanner>("b", &calls);
  FakePlanner* pa = a.get();
  pa->resident_ = false;
  c.Add(std::move(a));
  c.Add(std::move(b));
  KvSeq seq;
  KvSlots slots;
  ASSERT_TRUE(c.Start(seq, &slots).ok());
  KvQueue queue;
  c.Match(queue, nullptr);  // the look-ahead round: no head
  KvKeep keep;
  c.Finish(seq, nullptr, &keep);
  // b, after a, sees a's answer and overrides it (the fake assigns): the order is a, b.
  EXPECT_TRUE(keep.resident);
  EXPECT_EQ(calls.log, (std::vector<std::string>{"b.Start", "a.Start", "a.Match", "b.Match", "a.Finish", "b.Finish"}));
}

TEST(KvSlots, MakesTheComputeBuffersSlotsOnlyWhenAsked) {
  int made = 0;
  KvSlots slots;
  slots.local = [&](KvReused* reused) {
    ++made;
    reused->n_as_is = 3;
    return std::unique_ptr<SequenceKv>();
  };
  EXPECT_EQ(made, 0);
  slots.get();
  EXPECT_EQ(made, 1);
  EXPECT_EQ(slots.reused.n_as_is, 3);
}

TEST(KvRequestOptions, HoldsOneValuePerType) {
  KvRequestOptions o;
  EXPECT_EQ(o.Get<int>(), nullptr);
  o.Set(std::make_shared<const int>(3));
  o.Set(std::make_shared<const std::string>("x"));
  o.Set(std::make_shared<const int>(4));
  ASSERT_NE(o.Get<int>(), nullptr);
  EXPECT_EQ(*o.Get<int>(), 4);
  EXPECT_EQ(*o.Get<std::string>(), "x");
}

}  // namespace
}  // namespace attic::kv
