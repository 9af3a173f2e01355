// The automatic size of the KV store's host-DRAM tier: what `attic serve` keeps when no
// --kv-dram is given (docs/store.md, "The DRAM tier by default"). llama-server keeps a
// host-RAM prompt cache of 8 GiB by default (--cache-ram); Attic takes the same ceiling
// but never more than the machine can spare:
//
//   min(8 GiB, physical / 4, available / 2), rounded down to a multiple of 64 MiB;
//   0 (no DRAM tier) when that is less than 64 MiB.
//
// physical / 4: a server never plans on more than a quarter of the machine's memory for
// a cache. available / 2: the tier grows after start-up while other things grow beside
// it (request buffers, --sparse-offload-bytes, other processes), so a full tier must not
// take everything that was free when the server started. Memory the host does not report
// (0) is not a constraint.
//
// Thread-safety: the functions are pure, except ReadHostMemory, which reads /proc and
// /sys and may run on any thread.
#pragma once

#include <cstdint>
#include <string_view>

namespace attic::store {

inline constexpr uint64_t kAutoDramMaxBytes = uint64_t{8} << 30;    // llama-server's --cache-ram default
inline constexpr uint64_t kAutoDramGrainBytes = uint64_t{64} << 20;  // rounding, and the smallest tier

// The automatic DRAM tier size for a host with `physical_bytes` of memory of which
// `available_bytes` are available now (either 0: unknown). Pure.
uint64_t AutoDramTierBytes(uint64_t physical_bytes, uint64_t available_bytes);

struct HostMemory {
  uint64_t physical_bytes = 0;   // installed memory (sysconf), or the cgroup's limit when lower; 0 = unknown
  uint64_t available_bytes = 0;  // MemAvailable, or what the cgroup's limit leaves when lower; 0 = unknown
};

// This process's memory as ReadHostMemory sees it: sysconf(_SC_PHYS_PAGES), MemAvailable
// of /proc/meminfo, and the memory.max / memory.current of the process's cgroup (v2) and
// its ancestors, so that a server in a container sizes itself by the container's limit.
HostMemory ReadHostMemory();

// The MemAvailable line of /proc/meminfo text, in bytes; 0 if there is none. Pure.
uint64_t ParseMemAvailable(std::string_view meminfo);

}  // namespace attic::store
