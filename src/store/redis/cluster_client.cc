#include "store/redis/cluster_client.h"

#include <algorithm>
#include <thread>

#include "store/redis/key_slot.h"

namespace attic::store::redis {

namespace {
using std::chrono::milliseconds;

milliseconds Left(std::chrono::steady_clock::time_point deadline) {
  return std::chrono::duration_cast<milliseconds>(deadline - std::chrono::steady_clock::now());
}

// The node a -MOVED / -ASK reply names: "MOVED <slot> <host:port>".
std::string RedirectTarget(const redisReply& r) {
  const std::string_view text = ReplyText(r);
  const size_t last = text.rfind(' ');
  return last == std::string_view::npos ? std::string() : std::string(text.substr(last + 1));
}

// Replies that mean "not now, try again": a slot being migrated (TRYAGAIN), a cluster
// that lost a master and has not failed over yet (CLUSTERDOWN), a node loading or whose
// master is down.
bool Retryable(const redisReply& r) {
  return IsErrorReply(r, "TRYAGAIN") || IsErrorReply(r, "CLUSTERDOWN") || IsErrorReply(r, "LOADING") ||
         IsErrorReply(r, "MASTERDOWN");
}
}  // namespace

StatusOr<std::vector<std::string>> ParseRedisUrl(std::string_view url) {
  std::string_view rest = url;
  const size_t scheme = rest.find("://");
  if (scheme != std::string_view::npos) {
    if (rest.substr(0, scheme) != "redis")
      return InvalidArgumentError("'" + std::string(url) + "': only redis:// is supported (no TLS, no unix sockets)");
    rest.remove_prefix(scheme + 3);
  }
  if (rest.find_first_of("@/?") != std::string_view::npos)
    return InvalidArgumentError("'" + std::string(url) +
                                "': give only host:port[,host:port...] (no user, password, database or options)");
  std::vector<std::string> seeds;
  while (true) {
    const size_t comma = rest.find(',');
    const std::string_view part = rest.substr(0, comma);
    std::string host;
    int port = 0;
    if (Status st = ParseAddress(part, &host, &port); !st.ok())
      return InvalidArgumentError("'" + std::string(url) + "': " + st.message());
    seeds.emplace_back(part);
    if (comma == std::string_view::npos) break;
    rest.remove_prefix(comma + 1);
  }
  return seeds;
}

Status ReplyStatus(const redisReply& r) {
  if (r.type != REDIS_REPLY_ERROR) return OkStatus();
  const std::string text(ReplyText(r));
  if (IsErrorReply(r, "OOM")) return ResourceExhaustedError("redis: " + text);
  return InternalError("redis: " + text);
}

StatusOr<std::unique_ptr<ClusterClient>> ClusterClient::Create(ClusterOptions options) {
  if (options.seeds.empty()) return InvalidArgumentError("redis cluster: no seed node");
  for (const std::string& s : options.seeds) {
    std::string host;
    int port = 0;
    ATTIC_RETURN_IF_ERROR(ParseAddress(s, &host, &port));
  }
  if (options.max_attempts < 1 || options.retry_budget.count() < 1 || options.command_timeout.count() < 1 ||
      options.connect_timeout.count() < 1)
    return InvalidArgumentError("redis cluster: timeouts and attempts must be positive");
  return std::unique_ptr<ClusterClient>(new ClusterClient(std::move(options)));
}

ClusterClient::ClusterClient(ClusterOptions options)
    : options_(std::move(options)),
      slot_node_(kClusterSlots),
      clock_(options_.clock != nullptr ? options_.clock : store::SystemClock::Default()) {}

ClusterStats ClusterClient::stats() const {
  ClusterStats s;
  s.calls = counters_.calls.load();
  s.failed_calls = counters_.failed_calls.load();
  s.moved = counters_.moved.load();
  s.asked = counters_.asked.load();
  s.retries = counters_.retries.load();
  s.connects = counters_.connects.load();
  s.slot_map_reads = counters_.slot_map_reads.load();
  return s;
}

std::vector<std::string> ClusterClient::KnownNodes() {
  std::vector<std::string> nodes;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (const std::string& n : slot_node_)
      if (!n.empty() && std::find(nodes.begin(), nodes.end(), n) == nodes.end()) nodes.push_back(n);
  }
  for (const std::string& s : options_.seeds)
    if (std::find(nodes.begin(), nodes.end(), s) == nodes.end()) nodes.push_back(s);
  return nodes;
}

StatusOr<std::unique_ptr<Connection>> ClusterClient::Acquire(const std::string& address, Clock::time_point deadline) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = pool_.find(address);
    if (it != pool_.end() && !it->second.empty()) {
      std::unique_ptr<Connection> c = std::move(it->second.back());
      it->second.pop_back();
      return c;
    }
  }
  const milliseconds left = Left(deadline);
  if (left.count() <= 0) return Status(StatusCode::kDeadlineExceeded, "redis " + address + ": out of time");
  std::string host;
  int port = 0;
  ATTIC_RETURN_IF_ERROR(ParseAddress(address, &host, &port));
  counters_.connects.fetch_add(1);
  return Connection::Open(host, port, std::min(options_.connect_timeout, left), options_.command_timeout);
}

void ClusterClient::Release(std::unique_ptr<Connection> conn) {
  if (conn == nullptr || conn->broken()) return;
  std::lock_guard<std::mutex> lock(mu_);
  auto& idle = pool_[conn->address()];
  if (static_cast<int>(idle.size()) < options_.pool_per_node) idle.push_back(std::move(conn));
}

StatusOr<std::vector<Reply>> ClusterClient::PipelineAt(const std::string& address,
                                                      const std::vector<Command>& commands,
                                                      Clock::time_point deadline, const BulkSink* sink) {
  auto conn = Acquire(address, deadline);
  if (!conn.ok()) {
    DropPool(address);
    return conn.status();
  }
  (*conn)->SetTimeout(std::max(milliseconds(1), std::min(options_.command_timeout, Left(deadline)))).IgnoreError();
  auto replies = (*conn)->Pipeline(commands, sink);
  if (!replies.ok()) {
    DropPool(address);
    return replies.status();
  }
  Release(std::move(*conn));
  return replies;
}

void ClusterClient::DropPool(const std::string& address) {
  std::vector<std::unique_ptr<Connection>> dropped;  // closed outside the lock
  std::lock_guard<std::mutex> lock(mu_);
  auto it = pool_.find(address);
  if (it == pool_.end()) return;
  dropped = std::move(it->second);
  pool_.erase(it);
}

Status ClusterClient::RefreshSlots(Clock::time_point deadline) {
  Status last = UnavailableError("redis cluster: no node answers (seeds " + options_.seeds.front() + "...)");
  for (const std::string& node : KnownNodes()) {
    if (Left(deadline).count() <= 0) break;
    auto replies = PipelineAt(node, {{"CLUSTER", "SLOTS"}}, deadline);
    if (!replies.ok()) {
      last = replies.status();
      continue;
    }
    const redisReply& r = *replies->front();
    if (r.type != REDIS_REPLY_ARRAY) {
      last = UnavailableError("redis " + node + ": CLUSTER SLOTS: " + std::string(ReplyText(r)));
      continue;
    }
    std::vector<std::string> map(kClusterSlots);
    const std::string asked_host = node.substr(0, node.rfind(':'));
    for (size_t i = 0; i < r.elements; ++i) {
      const redisReply* range = r.element[i];
      if (range->type != REDIS_REPLY_ARRAY || range->elements < 3) continue;
      const redisReply* master = range->element[2];
      if (master->type != REDIS_REPLY_ARRAY || master->elements < 2) continue;
      std::string host(ReplyText(*master->element[0]));
      if (host.empty() || host == "?") host = asked_host;  // a node that does not know its own address
      const std::string address = host + ":" + std::to_string(master->element[1]->integer);
      const long long lo = range->element[0]->integer, hi = range->element[1]->integer;
      for (long long s = std::max(0ll, lo); s <= hi && s < kClusterSlots; ++s) map[s] = address;
    }
    counters_.slot_map_reads.fetch_add(1);
    std::lock_guard<std::mutex> lock(mu_);
    slot_node_ = std::move(map);
    have_map_ = true;
    return OkStatus();
  }
  return last;
}

std::string ClusterClient::NodeOfSlot(int slot) {
  if (slot < 0 || slot >= kClusterSlots) return "";
  bool have = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    have = have_map_;
  }
  if (!have) RefreshSlots(Clock::now() + options_.retry_budget).IgnoreError();
  std::lock_guard<std::mutex> lock(mu_);
  return slot_node_[slot];
}

StatusOr<std::vector<Reply>> ClusterClient::Pipeline(std::string_view key, const std::vector<Command>& commands,
                                                    const BulkSink* sink) {
  counters_.calls.fetch_add(1);
  const Clock::time_point start = Clock::now();
  const Clock::time_point deadline = start + options_.retry_budget;
  {
    const int64_t now_ms = clock_->NowMs();
    std::lock_guard<std::mutex> lock(mu_);
    if (now_ms < down_until_ms_) {
      counters_.failed_calls.fetch_add(1);
      return UnavailableError("redis cluster unreachable (a call failed moments ago; retrying shortly)");
    }
  }
  const int slot = KeySlot(key);
  std::string ask_target;      // a -ASK redirect: the next attempt goes there, with ASKING
  bool stale_map = false;      // a node failed: read the map again before routing
  bool reached = false;        // some node answered
  milliseconds backoff(20);
  Status last = UnavailableError("redis cluster: no attempt within the budget");
  for (int attempt = 0; attempt < options_.max_attempts; ++attempt) {
    if (Left(deadline).count() <= 0) break;
    std::string address = ask_target;
    if (address.empty()) {
      {
        std::lock_guard<std::mutex> lock(mu_);
        if (have_map_ && !stale_map) address = slot_node_[slot];
      }
      if (address.empty()) {
        Status st = RefreshSlots(deadline);
        if (!st.ok()) {
          last = st;
          break;  // no node answers at all: nothing to retry against
        }
        stale_map = false;
        std::lock_guard<std::mutex> lock(mu_);
        address = slot_node_[slot];
      }
      if (address.empty()) {
        last = UnavailableError("redis cluster: slot " + std::to_string(slot) + " is served by no node");
        stale_map = true;
        goto back_off;
      }
    }
    {
      std::vector<Command> sent;
      const bool asking = !ask_target.empty();
      if (asking) {
        for (const Command& c : commands) {
          sent.push_back({"ASKING"});
          sent.push_back(c);
        }
      }
      auto replies = PipelineAt(address, asking ? sent : commands, deadline, sink);
      if (!replies.ok()) {
        last = replies.status();
        stale_map = true;  // a master down: the map may name its replica soon
        ask_target.clear();
        goto back_off;
      }
      reached = true;
      std::vector<Reply> out;
      if (asking) {
        for (size_t i = 1; i < replies->size(); i += 2) out.push_back((*replies)[i]);
      } else {
        out = std::move(*replies);
      }
      ask_target.clear();
      const redisReply* redirect = nullptr;
      const redisReply* busy = nullptr;
      for (const Reply& r : out) {
        if (IsErrorReply(*r, "MOVED") || IsErrorReply(*r, "ASK")) {
          redirect = r.get();
          break;
        }
        if (busy == nullptr && Retryable(*r)) busy = r.get();
      }
      if (redirect != nullptr) {
        const std::string target = RedirectTarget(*redirect);
        if (IsErrorReply(*redirect, "ASK")) {
          counters_.asked.fetch_add(1);
          ask_target = target;
        } else {
          counters_.moved.fetch_add(1);
          std::lock_guard<std::mutex> lock(mu_);
          slot_node_[slot] = target;  // at once for this slot; the whole map on the next miss
        }
        last = UnavailableError("redis cluster: too many redirects for slot " + std::to_string(slot));
        continue;  // a redirect is not a failure: no back-off
      }
      if (busy != nullptr) {
        last = UnavailableError("redis " + address + ": " + std::string(ReplyText(*busy)));
        stale_map = true;
        goto back_off;
      }
      return out;
    }
  back_off:
    if (attempt + 1 < options_.max_attempts) {
      const milliseconds wait = std::min(backoff, Left(deadline));
      if (wait.count() <= 0) break;
      std::this_thread::sleep_for(wait);
      backoff *= 2;
      counters_.retries.fetch_add(1);
    }
  }
  counters_.failed_calls.fetch_add(1);
  if (!reached && last.code() == StatusCode::kUnavailable) {
    std::lock_guard<std::mutex> lock(mu_);
    down_until_ms_ = clock_->NowMs() + options_.down_backoff.count();
    have_map_ = false;  // a cluster that comes back may have moved its slots
  }
  return last;
}

StatusOr<Reply> ClusterClient::Run(std::string_view key, const Command& command) {
  ATTIC_ASSIGN_OR_RETURN(std::vector<Reply> r, Pipeline(key, {command}));
  return std::move(r[0]);
}

StatusOr<Reply> ClusterClient::RunAnywhere(const Command& command) {
  const Clock::time_point deadline = Clock::now() + options_.retry_budget;
  Status last = UnavailableError("redis cluster: no node answers");
  for (const std::string& node : KnownNodes()) {
    if (Left(deadline).count() <= 0) break;
    auto replies = PipelineAt(node, {command}, deadline);
    if (replies.ok()) return std::move(replies->front());
    last = replies.status();
  }
  return last;
}

}  // namespace attic::store::redis
