// Context caches on a serving engine: KVGen through the scheduler, the registry, linked
// prompts (include/attic/server/context_caches.h).
#include "attic/server/context_caches.h"

#include <algorithm>
#include <deque>
#include <set>

#include "attic/core/log.h"
#include "attic/store/clock.h"

namespace attic::server {

namespace {

using namespace std::chrono_literals;

int64_t NowMs() { return store::SystemClock().NowMs(); }

}  // namespace

ContextCacheService::ContextCacheService(engine::Engine& engine, engine::Scheduler& scheduler, store::KvStore& store,
                                         pic::ContextCacheRegistry& registry, ContextCacheOptions options)
    : engine_(engine), scheduler_(scheduler), store_(store), registry_(registry), options_(std::move(options)),
      bos_id_(engine.tokenizer().bos_id()) {}

std::string ContextCacheService::StoreKey(const std::string& tenant, const std::vector<int32_t>& tokens,
                                          bool bos) const {
  std::vector<int32_t> entry;
  if (bos && bos_id_ >= 0) entry.push_back(bos_id_);
  entry.insert(entry.end(), tokens.begin(), tokens.end());
  store::EntryKey key;
  key.tenant = tenant;
  key.fingerprint = store_.options().fingerprint;
  key.dtype = store_.kv_dtype();
  key.token_hash = store::TokenHash(entry.data(), entry.size());
  key.session_id = pic::ChunkStoreSession(tokens, bos);
  return key.ToString();
}

bool ContextCacheService::Stored(const std::string& tenant, const std::vector<int32_t>& tokens, bool bos) const {
  return Have(tenant, tokens, bos, StoreKey(tenant, tokens, bos));
}

bool ContextCacheService::Have(const std::string& tenant, const std::vector<int32_t>& tokens, bool bos,
                               const std::string& key) const {
  if (store_.Contains(key)) return true;
  // Another instance's KVGen of it, in the shared tier (--kv-remote): indexed here once found.
  store_.DiscoverSession(tenant, pic::ChunkStoreSession(tokens, bos));
  return store_.Contains(key);
}

StatusOr<int> ContextCacheService::Generate(const std::string& tenant, const std::vector<std::vector<int32_t>>& chunks,
                                            bool bos, engine::SchedClock::time_point deadline) {
  // At most half the waiting queue at a time, so that a long document neither fails on a
  // full queue nor crowds out other requests; the rest is submitted as those finish.
  const size_t window = static_cast<size_t>(std::max(1, scheduler_.options().max_waiting / 2));
  std::deque<std::shared_ptr<engine::ResultChannel>> in_flight;
  Status failed;
  auto wait_oldest = [&] {
    std::shared_ptr<engine::ResultChannel> ch = std::move(in_flight.front());
    in_flight.pop_front();
    engine::GenerationEvent ev;
    while (true) {
      if (!ch->Pop(&ev, 100ms)) {
        if (engine::SchedClock::now() > deadline + 30s) {  // the step loop is stuck: give up on it
          ch->Cancel();
          if (failed.ok()) failed = Status(StatusCode::kDeadlineExceeded, "prefilling the context cache timed out");
          return;
        }
        continue;
      }
      if (ev.kind == engine::GenerationEvent::Kind::kError && failed.ok()) failed = ev.status;
      if (ev.kind != engine::GenerationEvent::Kind::kText) return;
    }
  };
  std::set<std::string> seen;
  int computed = 0;
  for (const auto& tokens : chunks) {
    const std::string key = StoreKey(tenant, tokens, bos);
    if (!seen.insert(key).second || Have(tenant, tokens, bos, key)) continue;
    while (in_flight.size() >= window && failed.ok()) wait_oldest();
    if (!failed.ok()) break;
    engine::GenerationRequest r;
    r.tenant = tenant;
    r.session_id = pic::ChunkStoreSession(tokens, bos);
    r.session_ttl_ms = 0;  // the registry owns the chunk's lifetime (Sweep)
    if (bos && bos_id_ >= 0) r.prompt.push_back(bos_id_);
    r.prompt.insert(r.prompt.end(), tokens.begin(), tokens.end());
    r.prefill_only = true;
    r.sampling.max_tokens = 1;
    r.deadline = deadline;
    auto ch = scheduler_.Submit(std::move(r));
    if (!ch.ok()) {
      failed = ch.status();
      break;
    }
    in_flight.push_back(*ch);
    computed += static_cast<int>(tokens.size()) + (bos && bos_id_ >= 0 ? 1 : 0);
  }
  while (!in_flight.empty()) wait_oldest();
  if (!failed.ok()) return failed;
  // Saved asynchronously: make them findable before the caller links them.
  store_.Flush();
  return computed;
}

StatusOr<pic::ContextCache> ContextCacheService::Create(const std::string& tenant, const std::string& display_name,
                                                   std::vector<std::vector<int32_t>> chunks, int64_t expires_at_ms,
                                                   engine::SchedClock::time_point deadline, int* computed) {
  if (chunks.empty()) return InvalidArgumentError("a context cache needs at least one chunk");
  for (const auto& c : chunks)
    if (c.empty()) return InvalidArgumentError("a chunk of a context cache is empty");
  // The chunk tokens to prefill, without the BOS a chunk is prefilled after and each
  // distinct chunk once: what the cache's usage reports as not cached.
  std::set<std::string> pending;
  int fresh_tokens = 0;
  for (const auto& c : chunks) {
    const std::string key = StoreKey(tenant, c, options_.chunk_bos);
    if (pending.count(key) == 0 && !Have(tenant, c, options_.chunk_bos, key)) {
      pending.insert(key);
      fresh_tokens += static_cast<int>(c.size());
    }
  }
  ATTIC_RETURN_IF_ERROR(Generate(tenant, chunks, options_.chunk_bos, deadline).status());
  *computed = fresh_tokens;
  pic::ContextCache cache;
  cache.tenant = tenant;
  cache.model = options_.model;
  cache.display_name = display_name;
  cache.bos = options_.chunk_bos;
  cache.expires_at_ms = expires_at_ms;
  for (auto& tokens : chunks) {
    pic::CachedChunk c;
    c.tokens = std::move(tokens);
    cache.chunks.push_back(std::move(c));
  }
  return registry_.Create(std::move(cache));
}

StatusOr<std::shared_ptr<const pic::LinkSpec>> ContextCacheService::Link(
    const std::string& tenant, const std::vector<PromptPiece>& pieces, const pic::LinkOptions& options,
    engine::SchedClock::time_point deadline, std::vector<int32_t>* prompt, LinkPrep* prep) {
  // One pass: the spec (each chunk's store key computed once) and the chunks whose KV is
  // gone, by their BOS option.
  auto spec = std::make_shared<pic::LinkSpec>();
  spec->options = options;
  prompt->clear();
  std::vector<std::vector<int32_t>> missing[2];  // [bos]
  for (const PromptPiece& p : pieces) {
    if (p.cached && !p.tokens.empty()) {
      std::string key = StoreKey(tenant, p.tokens, p.bos);
      ++prep->chunks;
      if (!store_.Contains(key)) Have(tenant, p.tokens, p.bos, key);
      if (auto tier = store_.TierOf(key)) {
        ++prep->hits_by_tier[store_.tier_name(*tier)];
      } else {
        missing[p.bos].push_back(p.tokens);
      }
      spec->chunks.push_back({static_cast<int>(prompt->size()), static_cast<int>(p.tokens.size()), std::move(key),
                              p.bos && bos_id_ >= 0 ? 1 : 0});
    }
    prompt->insert(prompt->end(), p.tokens.begin(), p.tokens.end());
  }
  for (bool bos : {true, false}) {
    if (missing[bos].empty()) continue;
    // Evicted or lost since it was cached: prefilled again (once) before linking.
    ATTIC_ASSIGN_OR_RETURN(int n, Generate(tenant, missing[bos], bos, deadline));
    prep->regenerated += static_cast<int>(missing[bos].size());
    prep->regenerated_tokens += n;
  }
  if (spec->chunks.empty()) return std::shared_ptr<const pic::LinkSpec>();
  return std::shared_ptr<const pic::LinkSpec>(std::move(spec));
}

bool ContextCacheService::ImplicitReady(const std::string& tenant, const std::vector<int32_t>& tokens) const {
  const bool bos = options_.chunk_bos;
  return registry_.HasImplicit(tenant, options_.model, pic::ChunkStoreSession(tokens, bos)) && Stored(tenant, tokens, bos);
}

Status ContextCacheService::RememberImplicit(const std::string& tenant, const std::vector<int32_t>& tokens,
                                             int64_t ttl_ms) {
  const bool bos = options_.chunk_bos;
  ATTIC_RETURN_IF_ERROR(registry_.TouchImplicit(tenant, options_.model, tokens, bos, NowMs() + ttl_ms));
  if (Stored(tenant, tokens, bos)) return OkStatus();
  // First sight: KVGen in the background (through the scheduler's queue).
  engine::GenerationRequest r;
  r.tenant = tenant;
  r.session_id = pic::ChunkStoreSession(tokens, bos);
  r.session_ttl_ms = 0;
  if (bos && bos_id_ >= 0) r.prompt.push_back(bos_id_);
  r.prompt.insert(r.prompt.end(), tokens.begin(), tokens.end());
  r.prefill_only = true;
  r.sampling.max_tokens = 1;
  auto ch = scheduler_.Submit(std::move(r));
  return ch.ok() ? OkStatus() : ch.status();
}

int ContextCacheService::Sweep() {
  int erased = 0;
  for (const pic::ChunkKey& k : registry_.ExpireNow()) {
    if (k.model != options_.model) continue;  // another model's store holds that entry
    if (store_.EraseSession(k.tenant, k.store_session).ok()) ++erased;
  }
  return erased;
}

}  // namespace attic::server
