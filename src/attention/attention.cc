// Attend: validates, plans the work (tiles of rows x ranges of slots), runs the ISA's
// kernels on the pool and normalises / merges their partial results.
#include "attic/attention/attention.h"

#include <algorithm>
#include <atomic>
#include <array>
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <vector>

#include "attention/attention_internal.h"
#include "attic/core/status.h"

namespace attic::attention {
namespace internal {
namespace {

// A tile's slots are split across jobs only when its request has too few tiles to keep
// every thread busy (decode, short chunks over long contexts); each piece keeps at least
// this many slots so the merge stays negligible. The split depends on the request alone
// (and the pool size), never on the rest of the batch: a sequence's attention output is
// then the same bits whatever shared its step.
constexpr int kMinSplitSlots = 128;
constexpr int kSplitAlign = 64;  // the decode kernel steps 64 slots at a time
// Aim for this many jobs per thread so dynamic claiming evens out the load (kernels whose
// pieces cost more to set up ask for fewer: KernelSet::tile_jobs_per_thread).
constexpr int kJobsPerThread = 8;
// AttendMode::kRowInvariant: slots split at multiples of this, whatever the request.
constexpr int kInvariantSplitSlots = 1024;
constexpr int kDriverScratch = 3;  // ThreadScratch buffer the driver uses; kernels use 0..2

struct PlannedJob {
  int request = 0;
  TileJob tile;
  int64_t cost = 0;
  int64_t partial_offset = -1;  // floats into the partial buffer, -1: write straight to out
};

// A tile whose slots were split: its pieces' partial results sit consecutively.
struct SplitTile {
  int request = 0;
  int kv_head = 0;
  int64_t row_begin = 0;
  int n_rows = 0;
  int n_splits = 0;
  int64_t partial_offset = 0;  // n_splits pieces of n_rows * (head_dim + 2) floats
};

// One request, validated and ready for the kernels. A request with per-KV-head index
// lists gets one AttendParams per KV head (its own list and n_vis); the kernels already
// take a head per job, so they run unchanged.
struct PreparedRequest {
  AttendParams params;                    // every head's (or, with head lists, head 0's shape)
  std::vector<AttendParams> head_params;  // [n_kv_heads] with head lists, else empty
  std::vector<int32_t> n_vis;             // [n_q], or [n_kv_heads][n_q] with head lists
  TileKernel kernel = nullptr;
  int64_t tile_rows = 0;
  int64_t n_tiles = 0;
  // [n_tiles] (or [n_kv_heads][n_tiles]): slots the tile needs (the most any query sees).
  std::vector<int32_t> tile_vis;
  float* out = nullptr;

  const AttendParams& For(int kv_head) const { return head_params.empty() ? params : head_params[kv_head]; }
  int32_t TileVis(int kv_head, int64_t tile) const {
    return head_params.empty() ? tile_vis[tile] : tile_vis[kv_head * n_tiles + tile];
  }
};

// REQUIRES: list ascending and within [0, n_slots).
void CheckIndexList(const int32_t* list, int n, int n_slots) {
  ATTIC_CHECK(list != nullptr || n == 0);
  for (int j = 0; j < n; ++j) {
    ATTIC_CHECK(list[j] >= 0 && list[j] < n_slots && (j == 0 || list[j - 1] < list[j]));
  }
}

// n_vis[i]: how many of the slots query i sees are in `list` ([n_list]; every slot when
// !use_list).
void CountVisible(const AttendRequest& req, bool use_list, const int32_t* list, int n_list, int32_t* n_vis) {
  for (int i = 0; i < req.n_q; ++i) {
    const int32_t end = req.kv_end[i];
    ATTIC_CHECK(end >= 0 && end <= req.kv.n_slots);
    n_vis[i] = use_list ? static_cast<int32_t>(std::lower_bound(list, list + n_list, end) - list) : end;
  }
}

// out row for row `row` of KV head h: o / l (zero when nothing was visible).
void WriteRow(const AttendParams& p, int kv_head, int64_t row, const float* o, float l, float* out) {
  const int d = p.shape.head_dim;
  const int64_t query = row / p.group;
  const int head = kv_head * p.group + static_cast<int>(row % p.group);
  float* dst = out + (query * p.shape.n_heads + head) * d;
  const float inv = l > 0 ? 1.0f / l : 0.0f;
  for (int i = 0; i < d; ++i) dst[i] = o[i] * inv;
}

// Merges the pieces of one split tile: weights 2^(m_s - max_s m_s).
void MergeSplitTile(const AttendParams& p, const SplitTile& t, const float* partial, float* out) {
  const int d = p.shape.head_dim;
  const int64_t piece = static_cast<int64_t>(t.n_rows) * (d + 2);
  std::vector<float> acc(d);
  for (int r = 0; r < t.n_rows; ++r) {
    float m_max = -FLT_MAX;
    for (int s = 0; s < t.n_splits; ++s) {
      const float* base = partial + t.partial_offset + s * piece;
      m_max = std::max(m_max, base[static_cast<int64_t>(t.n_rows) * d + r]);
    }
    std::fill(acc.begin(), acc.end(), 0.0f);
    float l = 0;
    for (int s = 0; s < t.n_splits; ++s) {
      const float* base = partial + t.partial_offset + s * piece;
      const float m_s = base[static_cast<int64_t>(t.n_rows) * d + r];
      const float l_s = base[static_cast<int64_t>(t.n_rows) * (d + 1) + r];
      if (l_s <= 0) continue;
      const float w = std::exp2(m_s - m_max);
      l += w * l_s;
      const float* o = base + static_cast<int64_t>(r) * d;
      for (int i = 0; i < d; ++i) acc[i] += w * o[i];
    }
    WriteRow(p, t.kv_head, t.row_begin + r, acc.data(), l, out);
  }
}

// Slots per piece of a tile that sees `vis` slots (vis itself: not split), for a request
// that wants its tiles cut into want_splits pieces.
int64_t PieceSlots(AttendMode mode, int64_t vis, int64_t want_splits) {
  if (mode == AttendMode::kRowInvariant) return kInvariantSplitSlots;
  const int64_t splits = std::min<int64_t>(want_splits, vis / kMinSplitSlots);
  if (splits <= 1) return vis;
  return ((vis + splits - 1) / splits + kSplitAlign - 1) / kSplitAlign * kSplitAlign;
}

PreparedRequest Prepare(const KernelSet& ks, const AttentionShape& shape, const AttendRequest& req, AttendMode mode) {
  const KvLayerView& kv = req.kv;
  ATTIC_CHECK(kv.block_size > 0 && kv.n_slots >= 0);
  ATTIC_CHECK(kv.n_slots == 0 || (kv.block_stride > 0 && kv.v_block_stride > 0));
  const bool per_head = req.head_indices != nullptr;
  ATTIC_CHECK(!per_head || (req.indices == nullptr && req.n_head_indices != nullptr));
  CheckIndexList(req.indices, req.n_indices, kv.n_slots);
  PreparedRequest pr;
  pr.out = req.out;
  AttendParams& p = pr.params;
  p.shape = shape;
  p.group = shape.n_heads / shape.n_kv_heads;
  p.q = req.q;
  p.n_q = req.n_q;
  p.indices = req.indices;
  p.kv = kv;
  // n_vis: how many virtual slots each query sees (per KV head with head lists).
  if (!per_head) {
    pr.n_vis.resize(req.n_q);
    CountVisible(req, req.indices != nullptr, req.indices, req.n_indices, pr.n_vis.data());
    p.n_vis = pr.n_vis.data();  // the vector's buffer survives moves of pr
  } else {
    pr.n_vis.resize(static_cast<size_t>(shape.n_kv_heads) * req.n_q);
    pr.head_params.assign(shape.n_kv_heads, p);
    for (int h = 0; h < shape.n_kv_heads; ++h) {
      CheckIndexList(req.head_indices[h], req.n_head_indices[h], kv.n_slots);
      int32_t* n_vis = pr.n_vis.data() + static_cast<int64_t>(h) * req.n_q;
      CountVisible(req, /*use_list=*/true, req.head_indices[h], req.n_head_indices[h], n_vis);  // null: empty
      pr.head_params[h].indices = req.head_indices[h];
      pr.head_params[h].n_vis = n_vis;
    }
    p.n_vis = pr.n_vis.data();
  }

  const int64_t rows_per_head = static_cast<int64_t>(req.n_q) * p.group;
  const bool few =
      UsesFewKernel(ks, mode == AttendMode::kFastest, rows_per_head, shape.head_dim, KType(kv), VType(kv));
  pr.kernel = few ? ks.few : ks.tile;
  pr.tile_rows = few ? rows_per_head : static_cast<int64_t>(ks.tile_rows) * ks.max_tiles_per_job;
  pr.n_tiles = (rows_per_head + pr.tile_rows - 1) / pr.tile_rows;
  const int n_lists = per_head ? shape.n_kv_heads : 1;
  pr.tile_vis.assign(pr.n_tiles * n_lists, 0);
  for (int h = 0; h < n_lists; ++h) {
    const int32_t* n_vis = pr.n_vis.data() + static_cast<int64_t>(h) * req.n_q;
    int32_t* tile_vis = pr.tile_vis.data() + h * pr.n_tiles;
    for (int64_t t = 0; t < pr.n_tiles; ++t) {
      const int64_t r0 = t * pr.tile_rows, r1 = std::min(rows_per_head, r0 + pr.tile_rows);
      for (int64_t qi = r0 / p.group; qi <= (r1 - 1) / p.group; ++qi) tile_vis[t] = std::max(tile_vis[t], n_vis[qi]);
    }
  }
  return pr;
}

// Jobs run in n_lists lists, list t holding jobs t, t + n_lists, t + 2 n_lists, ... in
// that order (RunInLists), so each job can name the one after it on its thread
// (TileJob::next_*, for the decode kernels' prefetch) when it reads the same KV through
// the same params.
void LinkNextJobs(const std::vector<PreparedRequest>& prs, int64_t n_lists, std::vector<PlannedJob>* jobs) {
  std::vector<PlannedJob>& js = *jobs;
  for (size_t i = 0; i + static_cast<size_t>(n_lists) < js.size(); ++i) {
    const PlannedJob& nx = js[i + static_cast<size_t>(n_lists)];
    if (nx.request != js[i].request || !prs[nx.request].head_params.empty()) continue;
    js[i].tile.next_kv_head = nx.tile.kv_head;
    js[i].tile.next_slot_begin = nx.tile.slot_begin;
    js[i].tile.next_slot_end = nx.tile.slot_end;
  }
}

// Runs run(0) .. run(n_jobs - 1) on the pool: thread t takes list t (jobs t, t + n_lists,
// ...) in order, and a thread done with its own list takes what is left of the others',
// so a late or slow thread leaves no work waiting.
template <class Run>
void RunInLists(backend::ThreadPool& pool, int64_t n_jobs, int64_t n_lists, const Run& run) {
  if (n_lists <= 1) {
    for (int64_t task = 0; task < n_jobs; ++task) run(task);
    return;
  }
  struct alignas(64) List {
    std::atomic<int64_t> next{0};  // list t's next entry: job t + next * n_lists
  };
  std::vector<List> lists(static_cast<size_t>(n_lists));
  // Tasks [0, n_lists) start on their own list; tasks [n_lists, 2 n_lists) only help.
  pool.ParallelFor(2 * n_lists, [&](int64_t task, int) {
    for (int64_t k = 0; k < n_lists; ++k) {
      const int64_t t = (task + k) % n_lists;
      for (int64_t e; (e = t + lists[t].next.fetch_add(1, std::memory_order_relaxed) * n_lists) < n_jobs;) run(e);
    }
  });
}

void AttendWithKernels(const KernelSet& ks, backend::ThreadPool& pool, const AttentionShape& shape,
                       const AttendRequest* requests, int n_requests, AttendMode mode) {
  ATTIC_CHECK(shape.n_heads > 0 && shape.n_kv_heads > 0 && shape.n_heads % shape.n_kv_heads == 0);
  ATTIC_CHECK(shape.head_dim > 0);
  const int d = shape.head_dim;
  std::vector<PreparedRequest> prs;
  prs.reserve(n_requests);
  int64_t units = 0;
  for (int i = 0; i < n_requests; ++i) {
    if (requests[i].n_q <= 0) continue;
    prs.push_back(Prepare(ks, shape, requests[i], mode));
    units += prs.back().n_tiles * shape.n_kv_heads;
  }
  if (prs.empty()) return;

  std::vector<PlannedJob> jobs;
  std::vector<SplitTile> split_tiles;
  int64_t partial_size = 0;
  jobs.reserve(units);
  for (int ri = 0; ri < static_cast<int>(prs.size()); ++ri) {
    const PreparedRequest& pr = prs[ri];
    const int64_t rows_per_head = static_cast<int64_t>(pr.params.n_q) * pr.params.group;
    const int64_t own_units = pr.n_tiles * shape.n_kv_heads;
    // A request with too few tiles to keep every thread busy on its own (decode, short
    // chunks over long contexts) has each tile's slots split into pieces, merged afterwards.
    const int64_t per_thread = pr.kernel == ks.tile ? ks.tile_jobs_per_thread : kJobsPerThread;
    const int64_t target = per_thread * pool.n_threads();
    const int64_t want_splits = pool.n_threads() > 1 && own_units < target ? (target + own_units - 1) / own_units : 1;
    for (int h = 0; h < shape.n_kv_heads; ++h) {
      for (int64_t t = 0; t < pr.n_tiles; ++t) {
        const int64_t r0 = t * pr.tile_rows;
        const int n_rows = static_cast<int>(std::min(rows_per_head, r0 + pr.tile_rows) - r0);
        const int vis = pr.TileVis(h, t);
        const int64_t len = PieceSlots(mode, vis, want_splits);
        const int64_t splits = std::max<int64_t>(1, len > 0 ? (vis + len - 1) / len : 0);
        if (splits > 1) split_tiles.push_back(SplitTile{ri, h, r0, n_rows, static_cast<int>(splits), partial_size});
        for (int64_t s = 0; s < splits; ++s) {
          PlannedJob j;
          j.request = ri;
          j.tile = TileJob{h, r0, n_rows, static_cast<int>(s * len), static_cast<int>(std::min<int64_t>(vis, (s + 1) * len))};
          j.cost = static_cast<int64_t>(n_rows) * (j.tile.slot_end - j.tile.slot_begin) + 64 * n_rows;
          if (splits > 1) {
            j.partial_offset = partial_size;
            partial_size += static_cast<int64_t>(n_rows) * (d + 2);
          }
          jobs.push_back(j);
        }
      }
    }
  }
  // Longest first (and so in each thread's list): this balances causal work (later queries see more).
  std::stable_sort(jobs.begin(), jobs.end(), [](const PlannedJob& a, const PlannedJob& b) { return a.cost > b.cost; });

  const int64_t n_jobs = static_cast<int64_t>(jobs.size());
  const int64_t n_lists = std::min<int64_t>(pool.n_threads(), n_jobs);
  LinkNextJobs(prs, n_lists, &jobs);

  std::vector<float> partial(partial_size);
  auto run = [&](int64_t task) {
    const PlannedJob& j = jobs[task];
    const PreparedRequest& pr = prs[j.request];
    const int n_rows = j.tile.n_rows;
    float* o = j.partial_offset >= 0 ? partial.data() + j.partial_offset
                                     : ThreadScratch(kDriverScratch, static_cast<size_t>(n_rows) * (d + 2));
    float* m = o + static_cast<int64_t>(n_rows) * d;
    float* l = m + n_rows;
    pr.kernel(pr.For(j.tile.kv_head), j.tile, o, m, l);
    if (j.partial_offset < 0) {
      for (int r = 0; r < n_rows; ++r) {
        WriteRow(pr.params, j.tile.kv_head, j.tile.row_begin + r, o + static_cast<int64_t>(r) * d, l[r], pr.out);
      }
    }
  };
  RunInLists(pool, n_jobs, n_lists, run);
  if (split_tiles.empty()) return;
  int64_t merge_work = 0;
  for (const SplitTile& t : split_tiles) merge_work += static_cast<int64_t>(t.n_rows) * t.n_splits * d;
  auto merge = [&](const SplitTile& t) { MergeSplitTile(prs[t.request].params, t, partial.data(), prs[t.request].out); };
  if (merge_work < (1 << 16)) {
    for (const SplitTile& t : split_tiles) merge(t);
  } else {
    pool.ParallelFor(static_cast<int64_t>(split_tiles.size()), [&](int64_t i, int) { merge(split_tiles[i]); });
  }
}

}  // namespace

float* ThreadScratch(int which, size_t n) {
  thread_local std::array<std::vector<float>, 5> buffers;
  std::vector<float>& b = buffers[which];
  if (b.size() < n + 16) b.resize(n + 16);
  const uintptr_t a = reinterpret_cast<uintptr_t>(b.data());
  return reinterpret_cast<float*>((a + 63) & ~static_cast<uintptr_t>(63));
}

KernelSet KernelsFor(backend::Isa isa) {
  switch (isa) {
    case backend::Isa::kAvx512: return Avx512Kernels();
    case backend::Isa::kAvx2: return Avx2Kernels();
    case backend::Isa::kGeneric: break;
  }
  return GenericKernels();
}

void AttendBatchIsa(backend::Isa isa, backend::ThreadPool& pool, const AttentionShape& shape,
                    const AttendRequest* requests, int n_requests, AttendMode mode) {
  AttendWithKernels(KernelsFor(isa), pool, shape, requests, n_requests, mode);
}

void AttendIsa(backend::Isa isa, backend::ThreadPool& pool, const AttentionShape& shape, const float* q, int n_q,
               const int32_t* kv_end, const int32_t* indices, int n_indices, const KvLayerView& kv, float* out) {
  const AttendRequest req{q, n_q, kv_end, indices, n_indices, kv, out};
  AttendWithKernels(KernelsFor(isa), pool, shape, &req, 1, AttendMode::kFastest);
}

}  // namespace internal

void Attend(backend::ThreadPool& pool, const AttentionShape& shape, const float* q, int n_q, const int32_t* kv_end,
            const int32_t* indices, int n_indices, const KvLayerView& kv, float* out) {
  internal::AttendIsa(backend::ActiveIsa(), pool, shape, q, n_q, kv_end, indices, n_indices, kv, out);
}

void AttendBatch(backend::ThreadPool& pool, const AttentionShape& shape, const AttendRequest* requests,
                 int n_requests, AttendMode mode) {
  internal::AttendBatchIsa(backend::ActiveIsa(), pool, shape, requests, n_requests, mode);
}

}  // namespace attic::attention
