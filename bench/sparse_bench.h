// What sparse_bench's commands share (bench/sparse_bench.cc) and its offload command
// (bench/sparse_offload.cc).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "attic/engine/engine.h"
#include "bench/common/flags.h"

namespace sparse_bench {

inline constexpr char kProgram[] = "sparse_bench";

[[noreturn]] void Die(const std::string& message);
std::vector<int> ParseIntList(const std::string& s);

struct Common {
  std::string model, json, kv_dtype = "f16";
  int threads = 2, chunk = 1024;
  int block_size = attic::kv::kDefaultBlockSize;  // KV block (slots); offload's --block-size
  uint64_t seed = 1;
};
void AddCommonFlags(attic::bench::FlagParser& flags, Common* c);

// The engine, its compute buffer sized for `n_sequences` sequences of `context` slots
// each, or to pool_blocks(shape, n_layers) blocks when given.
using PoolBlocks = std::function<int64_t(const attic::kv::KvShape& shape, int n_layers)>;
std::unique_ptr<attic::engine::Engine> LoadEngine(const Common& c, int context, int n_sequences,
                                                  const PoolBlocks& pool_blocks = nullptr);

// n tokens: the first n of --text `text` tokenized (BOS first; too few is fatal), or
// random ones from `seed` when `text` is empty.
std::vector<int32_t> BenchTokens(attic::engine::Engine& engine, const std::string& text, int n, uint64_t seed);

// Prefills `seq` with tokens[seq->n_slots(), n) in chunks, hooks attached (may be null).
void Prefill(attic::engine::Engine& engine, attic::kv::SequenceKv* seq, const std::vector<int32_t>& tokens, int n,
             attic::kv::LayerHooks* hooks);

// sparse_bench offload (sparse_offload.cc).
int RunOffload(int argc, char** argv);

}  // namespace sparse_bench
