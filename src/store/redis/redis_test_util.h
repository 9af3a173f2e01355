// Helpers for the tests of the remote tier against the real Redis Cluster that ctest's
// `redis_cluster` fixture starts (scripts/redis-cluster.sh; CMakeLists.txt): its seed
// nodes come in ATTIC_REDIS_NODES. Run alone, outside ctest, the tests skip unless it is set.
#pragma once

#include <gtest/gtest.h>

#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include "store/redis/cluster_client.h"

namespace attic::store::redis::testing {

// "host:port,..." of the fixture's cluster, or "" when there is none.
inline std::string TestNodes() {
  const char* n = std::getenv("ATTIC_REDIS_NODES");
  return n == nullptr ? "" : n;
}

inline std::vector<std::string> TestSeeds() {
  auto seeds = ParseRedisUrl(TestNodes());
  return seeds.ok() ? *seeds : std::vector<std::string>{};
}

// A fresh key prefix per tier, so tests never see each other's (or an earlier run's) keys.
inline std::string FreshPrefix() {
  static std::mt19937_64 rng(std::random_device{}());
  return "attic-test-" + std::to_string(rng());
}

#define ATTIC_REQUIRE_REDIS()                                                                        \
  if (::attic::store::redis::testing::TestNodes().empty())                                           \
  GTEST_SKIP() << "no Redis Cluster: run through ctest (fixture redis_cluster) or set ATTIC_REDIS_NODES"

inline std::unique_ptr<ClusterClient> TestClient(ClusterOptions o = {}) {
  o.seeds = TestSeeds();
  auto c = ClusterClient::Create(std::move(o));
  EXPECT_TRUE(c.ok()) << c.status().ToString();
  return c.ok() ? std::move(c).value() : nullptr;
}

// Runs a command at one node (no routing).
inline Reply AtNode(const std::string& address, const Command& command) {
  std::string host;
  int port = 0;
  EXPECT_TRUE(ParseAddress(address, &host, &port).ok());
  auto c = Connection::Open(host, port, std::chrono::milliseconds(1000), std::chrono::milliseconds(5000));
  EXPECT_TRUE(c.ok()) << c.status().ToString();
  if (!c.ok()) return nullptr;
  auto r = (*c)->Run(command);
  EXPECT_TRUE(r.ok()) << r.status().ToString();
  return r.ok() ? *r : nullptr;
}

// Runs scripts/redis-cluster.sh `command` (stop, restart, ...) on the fixture's cluster.
inline int ClusterScript(const std::string& command) {
  const std::string cmd = std::string("REDIS_CLUSTER_DIR='") + ATTIC_REDIS_CLUSTER_DIR + "' " + ATTIC_SOURCE_DIR +
                          "/scripts/redis-cluster.sh " + command + " " + std::to_string(ATTIC_REDIS_PORT_BASE) +
                          " >/dev/null";
  return std::system(cmd.c_str());
}

}  // namespace attic::store::redis::testing
