// ATK: the accuracy / performance test kit shared by the conformance tests (tests/cpp), the benchmarks and
// `strata atk` (ARCHITECTURE.md §6, §7, §9).
//
// Each op provides an OpHarness: its conformance cases (sizes 1, 63, 65, 97, 1025, non-contiguous views,
// empty tensors, every dtype), a runner that builds fresh random inputs for a case, runs one forced
// implementation on a device with NaN-poisoned outputs, and compares every output with the float64
// reference under the acceptance rule, and its benchmark shapes with the bytes and FLOPs they must move.
// A case is one replayable line: "l2norm_fwd dtype=bf16 shape=63x128 layout=padded seed=3".
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "opbase/dtype.h"
#include "opbase/tensor.h"
#include "strata/ops.h"

namespace strata::atk {

// ---- case parameters: an ordered key=value list that prints as a replayable line ----
class Case {
 public:
  Case() = default;
  explicit Case(std::string op) : op_(std::move(op)) {}
  Case& set(const std::string& k, const std::string& v);
  Case& set(const std::string& k, int64_t v) { return set(k, std::to_string(v)); }
  const std::string& op() const { return op_; }
  bool has(const std::string& k) const;
  std::string get(const std::string& k, const std::string& dflt = "") const;
  int64_t get_int(const std::string& k, int64_t dflt = 0) const;
  double get_double(const std::string& k, double dflt = 0) const;
  std::vector<int64_t> get_shape(const std::string& k) const;  // "4x63x8" -> {4, 63, 8}; "" -> {}
  std::string str() const;                                      // "op k=v k=v"
  static Case parse(const std::string& line);

 private:
  std::string op_;
  std::vector<std::pair<std::string, std::string>> kv_;
};
std::string shape_arg(const std::vector<int64_t>& s);  // {4, 63} -> "4x63"
int32_t dtype_from_name(const std::string& name);       // "bf16" -> STRATA_DTYPE_BF16, -1 if unknown

// ---- host tensors: a strided view over its own storage ----
enum class Layout { kContiguous, kPaddedRows, kStridedCols };
Layout layout_from_name(const std::string& s);  // "contiguous", "padded", "strided"

struct HostTensor {
  strata_tensor_desc desc{};  // device = CPU; offset/strides describe the view inside `storage`
  std::vector<uint8_t> storage;

  static HostTensor make(int32_t dtype, const std::vector<int64_t>& shape, Layout layout = Layout::kContiguous);
  int64_t numel() const { return strata::numel(desc); }
  // Element e (row-major index over the view's shape) -> storage element index.
  int64_t index(int64_t e) const;
  double get(int64_t e) const { return load_elem(storage.data(), desc.dtype, index(e)); }
  void set(int64_t e, double v) { store_elem(storage.data(), desc.dtype, index(e), v); }
  std::vector<double> values() const;  // the view's elements as doubles
  void fill_normal(std::mt19937_64& rng, double mean = 0.0, double stddev = 1.0);
  void fill_uniform(std::mt19937_64& rng, double lo, double hi);
  void poison();  // every storage byte 0xff: NaN for every float dtype
};

// A tensor on a device mirroring a HostTensor's storage (same desc, device swapped).
class DeviceTensor {
 public:
  DeviceTensor(const HostTensor& h, strata_device device);
  ~DeviceTensor();
  DeviceTensor(const DeviceTensor&) = delete;
  DeviceTensor& operator=(const DeviceTensor&) = delete;
  void* data() const { return ptr_; }
  const strata_tensor_desc& desc() const { return desc_; }
  void upload(const HostTensor& h);
  void download(HostTensor& h) const;

 private:
  strata_tensor_desc desc_{};
  void* ptr_ = nullptr;
  size_t bytes_ = 0;
};

// ---- comparison under the acceptance rule (ARCHITECTURE.md §6) ----
struct Compare {
  std::string name;
  double err = 0;        // relative RMS error of the implementation vs float64
  double naive_err = 0;  // same metric for the straightforward same-dtype computation
  double bound = 0;      // what err had to stay under
  double max_abs = 0;
  bool nan_mismatch = false;
  bool pass = false;
  std::string str() const;
};
// Acceptance bound (ARCHITECTURE.md §6): err <= max(2 * naive_err, floor), and <= the dtype's ceiling.
// floor = 4 * unit_roundoff(dtype) * sqrt(reduction_len): the expected f32/dtype roundoff of a sum of
// `reduction_len` terms (random-walk growth), so that a naive result that is exact by luck does not demand
// exactness. If the naive computation itself exceeds the ceiling the case is ill-conditioned (e.g. the
// cancellation in dy - dot(dy, y) y when D = 1) and the bound is 2 * naive_err alone.
// NaN/Inf must match by position.
// `magnitude` (optional, same length as ref): for outputs formed by cancellation (a - b with a ~ b), errors are
// measured relative to the size of the cancelling terms (||magnitude||) rather than the small difference,
// since no finite-precision implementation can do better than the rounding of its operands.
Compare compare(const std::string& name, const std::vector<double>& out, const std::vector<double>& ref,
                const std::vector<double>& naive, int32_t dtype, double reduction_len = 1.0,
                const std::vector<double>* magnitude = nullptr);
double dtype_ceiling(int32_t dtype);  // f32 1e-5, f16 2e-3, bf16 1e-2, f64 1e-12

struct CaseResult {
  bool pass = true;
  bool skipped = false;
  std::string impl;  // what actually ran
  std::vector<Compare> compares;
  std::string message;  // failure text or skip reason
  std::string str() const;
};

// ---- benchmarks ----
struct BenchCase {
  std::string label;      // "l2norm_fwd bf16 [524288, 128]"
  double bytes = 0;       // bytes that must move (inputs read once, outputs written once)
  double flops = 0;
  std::function<void()> setup;  // allocates; may be empty
  std::function<void()> run;    // one call, launched on the default stream of the device
  std::function<void()> teardown;
};

struct Timing {
  double median_ms = 0, min_ms = 0;
  int iters = 0;
};
// Times fn on `device`: warm-up, then `iters` timed calls, median. CUDA: every call between its own pair of events,
// all queued back to back (host overhead hidden while the host runs ahead, as in do_bench); CPU: steady_clock.
Timing time_it(strata_device device, const std::function<void()>& fn, int iters = 20, int warmup = 3);
// A device copy of `bytes` (so 2 * bytes move: read + written): the bandwidth ceiling of ARCHITECTURE.md §7.
// On the CPU it uses every thread the kernels use.
class CopyProbe {
 public:
  CopyProbe(strata_device device, size_t bytes);
  ~CopyProbe();
  CopyProbe(const CopyProbe&) = delete;
  CopyProbe& operator=(const CopyProbe&) = delete;
  void run();
  double bytes_moved() const { return 2.0 * static_cast<double>(bytes_); }

 private:
  strata_device device_;
  size_t bytes_;
  void* src_ = nullptr;
  void* dst_ = nullptr;
};
// Copy bandwidth in GB/s (bytes read + written) of a buffer of `bytes`, measured now.
double copy_bandwidth_gbs(strata_device device, size_t bytes);

// Times `op` and a copy moving at least as many bytes (buffers >= 512 MiB) alternately, so that both see the same
// machine state (a shared VM's bandwidth drifts by 2x within minutes): returns the op's timing and the copy
// bandwidth (GB/s) measured around it. CUDA: 4 alternating rounds. CPU: op and copy alternate call by call,
// and the ratios of op GB/s (op_bytes over a call) to copy GB/s are also returned: the median over the pairs
// (each op call against the copy right after it) and the best op call against the best copy call.
struct InterleavedTiming {
  Timing op;
  double copy_gbs = 0;
  double ratio_paired = 0, ratio_best = 0;  // CPU only (0 elsewhere)
};
InterleavedTiming time_with_copy(strata_device device, const std::function<void()>& op, double op_bytes,
                                 int iters = 20);

// Thrown by harnesses when plan creation answers STRATA_ERROR_NO_IMPLEMENTATION under a forced
// implementation: that implementation does not cover the case (a dtype it does not take), so the case is
// skipped for it rather than failed.
struct NotApplicable : std::runtime_error {
  using std::runtime_error::runtime_error;
};
// Throws NotApplicable or std::runtime_error (with the library's message) unless s is STRATA_SUCCESS.
void check(strata_status s, const char* what);
// Forces `impl` (the in-process STRATA_FORCE_IMPL) while it lives; an empty name forces nothing. Bench setups
// hold one while they make their plan, so the force is lifted also when plan creation throws.
class ScopedForceImpl {
 public:
  explicit ScopedForceImpl(const std::string& impl);
  ~ScopedForceImpl();
  ScopedForceImpl(const ScopedForceImpl&) = delete;
  ScopedForceImpl& operator=(const ScopedForceImpl&) = delete;

 private:
  bool on_;
};

// ---- the per-op harness ----
class OpHarness {
 public:
  virtual ~OpHarness() = default;
  virtual std::string op() const = 0;
  // All conformance cases (each run once per applicable implementation).
  virtual std::vector<Case> conformance_cases() const = 0;
  // Builds inputs from the case's seed, runs the plan on `device` (with the currently forced implementation),
  // compares against float64.
  virtual CaseResult run_case(const Case& c, strata_device device) const = 0;
  // Benchmark cases for this device ("big" shapes are the PERF_TARGETS shapes).
  virtual std::vector<BenchCase> bench_cases(strata_device device) const = 0;
};

std::vector<std::unique_ptr<OpHarness>> all_harnesses();

// Implementations of `op` that can run on `device` here (names in dispatch order, reference included).
std::vector<std::string> impls_for(const std::string& op, strata_device device);

// Runs one case with `impl` forced (restores the previous forcing afterwards).
CaseResult run_forced(const OpHarness& h, const Case& c, strata_device device, const std::string& impl);

}  // namespace strata::atk
