// CalibrateLinear (attic/backend/kernels.h): which GEMV and which GEMV/GEMM crossover a
// model's Linear layers use, measured on the CPU at hand rather than assumed per ISA.
//
// Why: the fastest decode kernel is a property of the CPU, not of its ISA. On a Zen 5
// the AVX-512 GEMM on prepacked panels beats the vdpbf16ps GEMV from one row (135M
// shape: wk 12 vs 44 us, w_up 106 vs 138 us), while the crossover fixed in the AVX-512
// table (12) was measured on a Xeon; on a Zen 4 the AVX-512 kernels decoded slower
// than the AVX2 ones on the same machine. So every kernel this CPU runs is a candidate,
// and the one that is fastest on this model's shapes here wins.
//
// How: the candidates run the forward's own Linear calls (q/k/v together, o, gate/up
// together, down) over a sample of the model's layers of at least kSampleBytes (all of
// them in a smaller model): a sweep streams its weights from DRAM as a decode step does
// rather than from cache. Candidates are interleaved and each keeps its fastest of
// kRepsOneRow (m = 1) or kReps sweeps (the VM's speed drifts; the minimum is the least
// disturbed run).
//  1. m = 1 (decode): every GEMV table and the active table's GEMM. The fastest GEMV
//     is kept for rows below the crossover (and for the row-invariant mode).
//  2. m = 2, 4, ..., 64: that GEMV against the GEMM, until the GEMM wins twice in a
//     row; one more run halfway between the last GEMV win and the first GEMM win
//     places the crossover.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <random>
#include <sstream>

#include "attic/backend/kernels.h"
#include "attic/core/file.h"
#include "attic/core/hash.h"
#include "backend/cpu/kernel_table.h"
#include "backend/cpu/qdot.h"

namespace attic::backend {

namespace {

using cpu::KernelTable;
using cpu::LinearPath;

// Bytes of matrices a sweep reads: twice a large L3, so each sweep streams from DRAM.
constexpr uint64_t kSampleBytes = 96ull << 20;
constexpr int kReps = 3;     // per m > 1
constexpr int kRepsOneRow = 5;  // m = 1: the decode choice
constexpr int64_t kMaxM = 64;

class Sweeper {
 public:
  // The forward's Linear calls of the first layers up to kSampleBytes, one LinearMulti
  // per group of outputs that share x (q/k/v, o, gate/up, down), each output with room
  // for kMaxM rows.
  Sweeper(const ModelLinears& model, ThreadPool& pool) : pool_(pool) {
    size_t y_rows = 0;
    int64_t max_k = 1;
    for (const LayerLinears& l : model.layers) {
      if (bytes_ >= kSampleBytes) break;
      const std::vector<std::vector<const WeightTensor*>> sharing_x = {
          {l.wq, l.wk, l.wv}, {l.wo}, {l.w_gate, l.w_up}, {l.w_down}};
      for (const auto& ws : sharing_x) {
        std::vector<LinearOutput>& g = groups_.emplace_back();
        size_t rows = 0;
        for (const WeightTensor* w : ws) {
          g.push_back({w, nullptr, nullptr});
          rows += static_cast<size_t>(kMaxM * w->rows());
          bytes_ += w->stored_bytes();
          max_k = std::max(max_k, w->cols());
        }
        y_rows = std::max(y_rows, rows);
      }
      ++layers_;
    }
    y_.resize(y_rows);  // every group's outputs side by side (the groups run one by one)
    for (auto& g : groups_) {
      size_t off = 0;
      for (LinearOutput& o : g) {
        o.y = y_.data() + off;
        off += static_cast<size_t>(kMaxM * o.w->rows());
      }
    }
    std::mt19937 rng(1);
    std::normal_distribution<float> nd(0.0f, 1.0f);
    x_.resize(static_cast<size_t>(kMaxM * max_k));
    for (float& v : x_) v = nd(rng);
  }

  int layers() const { return layers_; }
  uint64_t bytes() const { return bytes_; }

  // Microseconds of one sweep with table t at m rows: the GEMV (kGemv) or, with `gemm`,
  // the GEMM (t's crossovers set to 0 so every call takes it).
  double Time(const KernelTable& t, bool gemm, int64_t m) {
    KernelTable forced = t;
    if (gemm) {
      std::fill(std::begin(forced.gemv_max_m), std::end(forced.gemv_max_m), 0);
      forced.gemv_max_m_packed = 0;
    }
    const auto t0 = std::chrono::steady_clock::now();
    for (const std::vector<LinearOutput>& g : groups_) {
      cpu::LinearMultiWith(forced, pool_, x_.data(), m, g.data(), static_cast<int>(g.size()),
                           gemm ? LinearPath::kAuto : LinearPath::kGemv);
    }
    return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count();
  }

 private:
  ThreadPool& pool_;
  std::vector<std::vector<LinearOutput>> groups_;
  int layers_ = 0;
  uint64_t bytes_ = 0;
  std::vector<float> x_, y_;
};

struct Candidate {
  const KernelTable* t;
  bool gemm;
  std::string name;  // e.g. "gemv avx2", "gemm avx512"
};

}  // namespace

std::string LinearCalibration::Summary() const {
  char buf[320];
  char how[96];
  if (cached) {
    std::snprintf(how, sizeof how, "as measured before on this CPU; ATTIC_KERNELS=recalibrate measures again");
  } else {
    std::snprintf(how, sizeof how, "measured in %.2f s on %d layers", seconds, sample_layers);
  }
  if (gemv_max_m == 0) {
    std::snprintf(buf, sizeof buf, "the %s GEMM%s from one row (%s)", isa.c_str(),
                  prepacked ? " on prepacked weights" : "", how);
  } else {
    std::snprintf(buf, sizeof buf, "GEMV %s up to %lld rows, then the %s GEMM%s (%s)", gemv.c_str(),
                  static_cast<long long>(gemv_max_m), isa.c_str(), prepacked ? " on prepacked weights" : "", how);
  }
  return buf;
}

std::string LinearCalibration::Serialize() const {
  std::ostringstream o;
  o << "isa=" << isa << "\ngemv=" << gemv << "\ngemv_max_m=" << gemv_max_m << "\nprepacked=" << (prepacked ? 1 : 0)
    << "\nseconds=" << seconds << "\nsample_layers=" << sample_layers << "\nsample_bytes=" << sample_bytes << "\n";
  for (const Timing& t : timings) o << "timing=" << t.kernel << "," << t.m << "," << t.us << "\n";
  return o.str();
}

StatusOr<LinearCalibration> LinearCalibration::Parse(std::string_view text) {
  LinearCalibration c;
  bool has_isa = false, has_gemv = false, has_m = false, has_packed = false;
  std::istringstream in{std::string(text)};
  std::string line;
  try {
    while (std::getline(in, line)) {
      const size_t eq = line.find('=');
      if (eq == std::string::npos) return DataLossError("calibration: line without '='");
      const std::string k = line.substr(0, eq), v = line.substr(eq + 1);
      if (k == "isa") c.isa = v, has_isa = true;
      else if (k == "gemv") c.gemv = v, has_gemv = true;
      else if (k == "gemv_max_m") c.gemv_max_m = std::stoll(v), has_m = true;
      else if (k == "prepacked") c.prepacked = v == "1", has_packed = true;
      else if (k == "seconds") c.seconds = std::stod(v);
      else if (k == "sample_layers") c.sample_layers = std::stoi(v);
      else if (k == "sample_bytes") c.sample_bytes = std::stoull(v);
      else if (k == "timing") {
        const size_t a = v.find(','), b = v.rfind(',');
        if (a == std::string::npos || a == b) return DataLossError("calibration: bad timing");
        c.timings.push_back({v.substr(0, a), std::stoll(v.substr(a + 1, b - a - 1)), std::stod(v.substr(b + 1))});
      }
    }
  } catch (const std::exception&) {
    return DataLossError("calibration: a number does not parse");
  }
  if (!has_isa || !has_gemv || !has_m || !has_packed) return DataLossError("calibration: a field is missing");
  return c;
}

namespace {

// The ISA table calibration starts from: the one for ActiveIsa(), whatever was installed.
const KernelTable& BaseTable() { return *cpu::KernelsFor(ActiveIsa()); }

const WeightTensor* FirstMatrix(const ModelLinears& model) {
  const auto& layers = model.layers;
  return layers.empty() || layers[0].wq == nullptr || !layers[0].wq->present() ? nullptr : layers[0].wq;
}

bool Prepacked(const WeightTensor& w, const KernelTable& t) {
  return w.packed != nullptr && w.packed_layout == static_cast<int>(t.isa);
}

// GEMV candidates: the base table's, its exact bf16 form, the lower ISAs' (never generic
// where a SIMD table exists: it is the same loop without vectors).
std::vector<Candidate> GemvCandidates(const KernelTable& base, DType dtype) {
  std::vector<Candidate> gemvs{{&base, false, std::string("gemv ") + base.name}};
  if (base.isa == Isa::kAvx512) {
    if (const KernelTable* fma = cpu::Avx512FmaGemvTable(); fma != nullptr && dtype == DType::kBF16)
      gemvs.push_back({fma, false, std::string("gemv ") + fma->name});
    if (const KernelTable* avx2 = cpu::KernelsFor(Isa::kAvx2))
      gemvs.push_back({avx2, false, std::string("gemv ") + avx2->name});
  }
  return gemvs;
}

// The base table with `gemv`'s GEMV up to `max_m` rows for the model's dtype.
void Install(const KernelTable& base, const KernelTable& gemv, int64_t max_m, DType dtype, bool prepacked) {
  KernelTable chosen = base;
  chosen.gemv_prepare = gemv.gemv_prepare;
  chosen.gemv_layout = gemv.gemv_layout;
  chosen.gemv = gemv.gemv;
  if (prepacked) {
    chosen.gemv_max_m_packed = max_m;
  } else {
    chosen.gemv_max_m[static_cast<int>(dtype)] = max_m;
  }
  // Rows on either path have x rounded to bf16 only if both paths round it.
  chosen.bf16_rounds_x = base.bf16_rounds_x && gemv.bf16_rounds_x;
  cpu::InstallActiveKernels(chosen);
}

std::string CpuModelName() {
  auto text = ReadFileToString("/proc/cpuinfo");
  if (!text.ok()) return "";
  const size_t at = text->find("model name");
  if (at == std::string::npos) return "";
  const size_t colon = text->find(':', at), end = text->find('\n', at);
  return colon == std::string::npos || colon > end ? "" : text->substr(colon + 1, end - colon - 1);
}

}  // namespace

std::string LinearCalibrationKey(const ModelLinears& model, const ThreadPool& pool) {
  const KernelTable& base = BaseTable();
  const CpuFeatures& f = GetCpuFeatures();
  Hasher h;
  h.Update("attic-linear-calibration-1");
  h.Update(CpuModelName());
  h.Update(base.name);
  h.UpdatePod(f.avx512_bf16);
  h.UpdatePod(pool.n_threads());
  for (const LayerLinears& l : model.layers) {
    for (const WeightTensor* w : {l.wq, l.wk, l.wv, l.wo, l.w_gate, l.w_up, l.w_down}) {
      h.UpdatePod(static_cast<int>(w->dtype));
      h.UpdatePod(w->rows());
      h.UpdatePod(w->cols());
      h.UpdatePod(Prepacked(*w, base));
    }
  }
  h.UpdatePod(model.layers.size());
  return h.Hex().substr(0, 16);
}

Status InstallLinearCalibration(const LinearCalibration& cal, const ModelLinears& model) {
  const KernelTable& base = BaseTable();
  const WeightTensor* w0 = FirstMatrix(model);
  if (w0 == nullptr) return InvalidArgumentError("the model has no layers");
  if (cal.isa != base.name) return InvalidArgumentError("calibrated for " + cal.isa + ", running " + base.name);
  if (cal.prepacked != Prepacked(*w0, base)) return InvalidArgumentError("calibrated with the other prepacking");
  if (cal.gemv_max_m < 0 || cal.gemv_max_m > kMaxM) return InvalidArgumentError("crossover out of range");
  for (const Candidate& c : GemvCandidates(base, w0->dtype)) {
    if (cal.gemv != c.t->name) continue;
    Install(base, *c.t, cal.gemv_max_m, w0->dtype, cal.prepacked);
    return OkStatus();
  }
  return InvalidArgumentError("GEMV '" + cal.gemv + "' is not a candidate on this CPU");
}

bool CalibrationWorthTiming(const ModelLinears& model) {
  for (const LayerLinears& l : model.layers)
    for (const WeightTensor* w : {l.wq, l.wk, l.wv, l.wo, l.w_gate, l.w_up, l.w_down})
      // Row-major block types: the GEMM widens every tile per call (minutes to time);
      // packed ones (AVX512-VNNI) take the GEMV for every m: no crossover to find.
      if (w != nullptr && (cpu::UsesQuantDot(w->dtype) || (DTypeIsBlock(w->dtype) && w->packed != nullptr)))
        return false;
  return true;
}

StatusOr<LinearCalibration> CalibrateLinear(const ModelLinears& model, ThreadPool& pool) {
  const auto t_start = std::chrono::steady_clock::now();
  const KernelTable& active = BaseTable();
  const WeightTensor* first = FirstMatrix(model);
  if (first == nullptr) return InvalidArgumentError("CalibrateLinear: the model has no layers");
  const WeightTensor& w0 = *first;
  const bool prepacked = Prepacked(w0, active);
  const std::vector<Candidate> gemvs = GemvCandidates(active, w0.dtype);
  const Candidate gemm{&active, true, std::string("gemm ") + active.name};

  Sweeper sweep(model, pool);
  LinearCalibration cal;
  cal.isa = active.name;
  cal.prepacked = prepacked;
  cal.sample_layers = sweep.layers();
  cal.sample_bytes = sweep.bytes();
  // Fastest of kReps interleaved sweeps per candidate (after one untimed sweep each:
  // page faults on the mapped weights, thread wake-up).
  auto measure = [&](const std::vector<Candidate>& cands, int64_t m) {
    std::vector<double> best(cands.size(), 1e300);
    for (const Candidate& c : cands) sweep.Time(*c.t, c.gemm, m);
    for (int r = 0; r < (m == 1 ? kRepsOneRow : kReps); ++r)
      for (size_t i = 0; i < cands.size(); ++i) best[i] = std::min(best[i], sweep.Time(*cands[i].t, cands[i].gemm, m));
    for (size_t i = 0; i < cands.size(); ++i) cal.timings.push_back({cands[i].name, m, best[i]});
    return best;
  };

  // 1. One row: every GEMV and the GEMM.
  std::vector<Candidate> all = gemvs;
  all.push_back(gemm);
  const std::vector<double> t1 = measure(all, 1);
  size_t g = 0;
  for (size_t i = 1; i < gemvs.size(); ++i)
    if (t1[i] < t1[g]) g = i;
  const Candidate& gemv = gemvs[g];
  cal.gemv = gemv.t->name;

  // 2. The crossover: the largest m at which the GEMV still wins (0: the GEMM wins at
  // one row already).
  int64_t last_gemv_win = 0;
  if (t1[g] <= t1.back()) {
    last_gemv_win = kMaxM;  // unless the GEMM wins somewhere below
    int64_t first_gemm_win = 0;
    int gemm_wins = 0;
    for (int64_t m = 2, prev = 1; m <= kMaxM; prev = m, m *= 2) {
      const std::vector<double> t = measure({gemv, gemm}, m);
      if (t[0] <= t[1]) {
        gemm_wins = 0;
        continue;
      }
      if (first_gemm_win == 0) first_gemm_win = m, last_gemv_win = prev;
      if (++gemm_wins == 2) break;
    }
    if (first_gemm_win - last_gemv_win > 1) {
      const int64_t mid = (first_gemm_win + last_gemv_win) / 2;
      const std::vector<double> t = measure({gemv, gemm}, mid);
      if (t[0] <= t[1]) last_gemv_win = mid;
    }
  }
  cal.gemv_max_m = last_gemv_win;

  Install(active, *gemv.t, cal.gemv_max_m, w0.dtype, prepacked);
  cal.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t_start).count();
  return cal;
}

}  // namespace attic::backend
