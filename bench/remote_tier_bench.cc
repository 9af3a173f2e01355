// remote_tier_bench: what the remote KV tier (RedisTier on a Redis Cluster) moves per
// second on this machine, against a loopback roof.
//
// One entry of --layers layers x --tokens tokens x --kv-dim (f32 K and V: the SmolLM2-135M
// shape by default, 30 x 2048 x 192 = 94 MB) is written and read --reps times:
//   put          RedisTier::Put (one MULTI/HSET/EXEC of every part)
//   get          RedisTier::GetShared (the parts in HMGET batches of ~8 MB, received in
//                place into one buffer)
//   get layers   the header, then every layer through GetRange (layer_read.h), one at a
//                time (each a hiredis reply)
//   read layers in place
//                the header, then every layer through ReadInto, received straight into
//                the entry's buffer, and verified: a streamed load's reads
//   roof         the same bytes over one loopback TCP connection between two threads
//                (send, receive into a buffer faulted in beforehand): what any remote tier
//                on this machine could at best move over one connection
// Reports GB/s (median over reps) as a table on stdout, then one JSON line (also --json).
//
// Usage: remote_tier_bench --kv-remote redis://host:port,... [--layers 30] [--tokens 2048]
//          [--kv-dim 192] [--reps 5] [--json FILE]
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "attic/store/entry.h"
#include "attic/store/layer_read.h"
#include "attic/store/redis_tier.h"
#include "bench/common/flags.h"
#include "bench/common/format.h"
#include "bench/common/output.h"
#include "bench/common/stats.h"

using namespace attic;
using Clock = std::chrono::steady_clock;

namespace {

double Seconds(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

// Seconds to move `bytes` bytes from one thread to another over loopback TCP.
double LoopbackSeconds(const std::string& bytes) {
  const int server = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof addr;
  if (server < 0 || bind(server, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0 || listen(server, 1) != 0 ||
      getsockname(server, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    std::perror("remote_tier_bench: loopback socket");
    std::exit(1);
  }
  // Received into memory faulted in beforehand: the roof is the transfer alone.
  std::string buffer(bytes.size(), '\1');
  std::thread receiver([&] {
    const int c = accept(server, nullptr, nullptr);
    size_t got = 0;
    while (got < bytes.size()) {
      const ssize_t n = recv(c, buffer.data() + got, bytes.size() - got, 0);
      if (n <= 0) break;
      got += static_cast<size_t>(n);
    }
    close(c);
  });
  const int client = socket(AF_INET, SOCK_STREAM, 0);
  const auto t0 = Clock::now();
  if (connect(client, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) {
    std::perror("remote_tier_bench: connect");
    std::exit(1);
  }
  for (size_t sent = 0; sent < bytes.size();) {
    const ssize_t n = send(client, bytes.data() + sent, bytes.size() - sent, 0);
    if (n <= 0) break;
    sent += static_cast<size_t>(n);
  }
  close(client);
  receiver.join();
  const double s = Seconds(t0);
  close(server);
  return s;
}

}  // namespace

int main(int argc, char** argv) {
  std::string url, json;
  int layers = 30, tokens = 2048, kv_dim = 192, reps = 5;
  bench::FlagParser flags("remote_tier_bench",
                          "--kv-remote redis://host:port,... [--layers 30] [--tokens 2048] [--kv-dim 192] [--reps 5] "
                          "[--json FILE]");
  flags.String("--kv-remote", &url);
  flags.Int("--layers", &layers);
  flags.Int("--tokens", &tokens);
  flags.Int("--kv-dim", &kv_dim);
  flags.Int("--reps", &reps);
  flags.String("--json", &json);
  flags.ParseOrExit(argc, argv);
  if (url.empty() || layers < 1 || tokens < 1 || kv_dim < 1 || reps < 1)
    flags.UsageError("--kv-remote is required; sizes and --reps must be positive");
  bench::CheckOutput("remote_tier_bench", json);

  store::KvEntry e;
  e.fingerprint = "remote-tier-bench";
  e.session_id = "bench";
  e.n_layers = layers;
  e.kv_dim = kv_dim;
  e.expires_at_ms = 0;
  std::mt19937 rng(1);
  for (int t = 0; t < tokens; ++t) {
    e.tokens.push_back(static_cast<int32_t>(rng() % 32000));
    e.positions.push_back(t);
  }
  std::uniform_real_distribution<float> d(-1, 1);
  e.k.assign(layers, std::vector<float>(static_cast<size_t>(tokens) * kv_dim));
  e.v = e.k;
  for (int l = 0; l < layers; ++l)
    for (size_t i = 0; i < e.k[l].size(); ++i) e.k[l][i] = e.v[l][i] = d(rng);
  auto serialized = store::SerializeEntry(e);
  bench::DieOnError("remote_tier_bench", serialized.status());
  const std::string& bytes = *serialized;
  const std::string key = e.key().ToString();

  store::RedisTierOptions o;
  o.url = url;
  o.prefix = "attic-bench-" + std::to_string(::getpid());
  o.capacity = 2 * bytes.size();
  o.command_timeout = std::chrono::milliseconds(30000);
  o.retry_budget = std::chrono::milliseconds(60000);
  auto tier = store::RedisTier::Open(o);
  bench::DieOnError("remote_tier_bench", tier.status());

  std::vector<double> put, get, layered, in_place, roof;
  for (int r = 0; r < reps; ++r) {
    auto t0 = Clock::now();
    bench::DieOnError("remote_tier_bench", (*tier)->Put(key, bytes));
    put.push_back(bytes.size() / 1e9 / Seconds(t0));
    t0 = Clock::now();
    auto whole = (*tier)->GetShared(key);
    bench::DieOnError("remote_tier_bench", whole.status());
    get.push_back(bytes.size() / 1e9 / Seconds(t0));
    if ((*whole)->view() != bytes) {
      std::fprintf(stderr, "remote_tier_bench: read back different bytes\n");
      return 1;
    }
    t0 = Clock::now();
    auto h = store::ReadEntryHeader(**tier, key, e.fingerprint);
    bench::DieOnError("remote_tier_bench", h.status());
    for (int l = 0; l < layers; ++l) bench::DieOnError("remote_tier_bench", store::ReadEntryLayer(**tier, key, *h, l).status());
    layered.push_back(bytes.size() / 1e9 / Seconds(t0));
    // What a streamed load does (KvStore::OpenForTurn): each layer received in place
    // into the entry's buffer, then verified.
    auto into = store::Bytes::Allocate(bytes.size());
    t0 = Clock::now();
    h = store::ReadEntryHeader(**tier, key, e.fingerprint);
    bench::DieOnError("remote_tier_bench", h.status());
    for (int l = 0; l < layers; ++l)
      bench::DieOnError("remote_tier_bench", store::ReadEntryLayerInto(**tier, key, *h, l,
                                                                       into->data() + store::EntryLayerOffset(*h, l)));
    in_place.push_back(bytes.size() / 1e9 / Seconds(t0));
    roof.push_back(bytes.size() / 1e9 / LoopbackSeconds(bytes));
  }
  (*tier)->Erase(key).IgnoreError();

  nlohmann::json out;
  out["entry_bytes"] = bytes.size();
  out["layers"] = layers;
  out["tokens"] = tokens;
  out["kv_dim"] = kv_dim;
  out["reps"] = reps;
  const double roof_gbps = bench::Median(roof);
  std::printf("## Remote tier: one %.1f MB entry (%d layers x %d tokens x kv_dim %d, f32), median of %d\n\n%s",
              bytes.size() / 1e6, layers, tokens, kv_dim, reps,
              bench::TableHeader({"operation", "GB/s", "vs loopback roof"}).c_str());
  for (const auto& [name, v] : std::vector<std::pair<const char*, std::vector<double>*>>{
           {"put", &put}, {"get", &get}, {"get layers", &layered}, {"read layers in place", &in_place},
           {"loopback roof", &roof}}) {
    const double m = bench::Median(*v);
    std::fputs(bench::TableRow({name, bench::Fmt("%.2f", m), bench::Fmt("%.2fx", m / roof_gbps)}).c_str(), stdout);
    out[name] = {{"gbps", m}, {"runs", *v}};
  }
  const std::string line = out.dump();
  std::printf("\n%s\n", line.c_str());
  bench::WriteOutput("remote_tier_bench", json, line + "\n");
  return 0;
}
