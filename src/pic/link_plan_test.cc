#include "attic/pic/link_plan.h"

#include <gtest/gtest.h>

namespace attic::pic {
namespace {

LinkSpec Spec(std::vector<LinkedChunk> chunks, LinkMethod method = LinkMethod::kAttnLink) {
  LinkSpec s;
  s.chunks = std::move(chunks);
  s.options.method = method;
  return s;
}

TEST(LinkPlan, LinkedEndIsTheSlotAfterTheLastChunk) {
  EXPECT_EQ(LinkedEnd(Spec({})), 0);
  EXPECT_EQ(LinkedEnd(Spec({{2, 5, "a", 0}, {10, 4, "b", 1}})), 14);
}

TEST(LinkPlan, TruncationKeepsTheHeadOfAChunkAndMovesItsTailDown) {
  // Tokens [4, 4 + 6) dropped: chunk a (slots 2..11) keeps 2..3 and its tail 10..11 ->
  // 4..5 (rows 8..9 of its entry); chunk b (slots 12..15) moves to 6..9.
  const LinkSpec spec = Spec({{2, 10, "a", 0}, {12, 4, "b", 1}});
  std::shared_ptr<const LinkSpec> t = TruncateLinkSpec(spec, /*keep=*/4, /*drop=*/6);
  ASSERT_NE(t, nullptr);
  ASSERT_EQ(t->chunks.size(), 3u);
  EXPECT_EQ(t->chunks[0].slot, 2);
  EXPECT_EQ(t->chunks[0].n, 2);
  EXPECT_EQ(t->chunks[0].src_row, 0);
  EXPECT_EQ(t->chunks[1].slot, 4);
  EXPECT_EQ(t->chunks[1].n, 2);
  EXPECT_EQ(t->chunks[1].src_row, 8);
  EXPECT_EQ(t->chunks[1].store_key, "a");
  EXPECT_EQ(t->chunks[2].slot, 6);
  EXPECT_EQ(t->chunks[2].n, 4);
  EXPECT_EQ(t->chunks[2].src_row, 1);
  EXPECT_EQ(t->options.method, LinkMethod::kAttnLink);
  // A chunk wholly inside the dropped tokens is gone; with nothing left, no spec.
  EXPECT_EQ(TruncateLinkSpec(Spec({{5, 3, "c", 0}}), 4, 6), nullptr);
}

TEST(LinkPlan, TheLookAheadNamesEachChunkByKeyUnlessTheMethodUsesNothingCached) {
  std::vector<store::QueuedJob> jobs;
  AppendLinkedJobs(Spec({{0, 3, "a", 0}, {5, 2, "b", 1}}), "t1", &jobs);
  ASSERT_EQ(jobs.size(), 2u);
  EXPECT_EQ(jobs[0].tenant, "t1");
  EXPECT_EQ(jobs[0].key, "a");
  EXPECT_EQ(jobs[0].prompt_tokens, 3);
  EXPECT_EQ(jobs[1].key, "b");
  AppendLinkedJobs(Spec({{0, 3, "a", 0}}, LinkMethod::kFull), "t1", &jobs);
  EXPECT_EQ(jobs.size(), 2u);
}

}  // namespace
}  // namespace attic::pic
