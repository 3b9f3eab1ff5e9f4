#include "testkit/testkit.h"

#include <fmt/format.h>
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <sstream>
#include <stdexcept>

#include "runtime/runtime_internal.h"
#include "tile/cpu/isa.h"

namespace strata::atk {

// ---------------------------------------------------------------------------------------------- Case
Case& Case::set(const std::string& k, const std::string& v) {
  for (auto& kv : kv_)
    if (kv.first == k) {
      kv.second = v;
      return *this;
    }
  kv_.emplace_back(k, v);
  return *this;
}
bool Case::has(const std::string& k) const {
  for (const auto& kv : kv_)
    if (kv.first == k) return true;
  return false;
}
std::string Case::get(const std::string& k, const std::string& dflt) const {
  for (const auto& kv : kv_)
    if (kv.first == k) return kv.second;
  return dflt;
}
int64_t Case::get_int(const std::string& k, int64_t dflt) const {
  const std::string v = get(k);
  return v.empty() ? dflt : std::stoll(v);
}
double Case::get_double(const std::string& k, double dflt) const {
  const std::string v = get(k);
  return v.empty() ? dflt : std::stod(v);
}
std::vector<int64_t> Case::get_shape(const std::string& k) const {
  std::vector<int64_t> s;
  std::string v = get(k);
  if (v.empty() || v == "scalar") return s;
  std::stringstream ss(v);
  std::string part;
  while (std::getline(ss, part, 'x')) s.push_back(std::stoll(part));
  return s;
}
std::string Case::str() const {
  std::string s = op_;
  for (const auto& kv : kv_) s += fmt::format(" {}={}", kv.first, kv.second);
  return s;
}
Case Case::parse(const std::string& line) {
  std::stringstream ss(line);
  std::string tok;
  ss >> tok;
  Case c(tok);
  while (ss >> tok) {
    const auto eq = tok.find('=');
    if (eq == std::string::npos) throw std::invalid_argument("case token without '=': " + tok);
    c.set(tok.substr(0, eq), tok.substr(eq + 1));
  }
  return c;
}
std::string shape_arg(const std::vector<int64_t>& s) {
  if (s.empty()) return "scalar";
  return fmt::format("{}", fmt::join(s, "x"));
}
int32_t dtype_from_name(const std::string& name) {
  for (int32_t d = 0; d < STRATA_DTYPE_COUNT; ++d)
    if (name == dtype_name(d)) return d;
  return -1;
}

// ---------------------------------------------------------------------------------------------- HostTensor
Layout layout_from_name(const std::string& s) {
  if (s == "padded") return Layout::kPaddedRows;
  if (s == "strided") return Layout::kStridedCols;
  return Layout::kContiguous;
}

HostTensor HostTensor::make(int32_t dtype, const std::vector<int64_t>& shape, Layout layout) {
  HostTensor t;
  strata_tensor_desc& d = t.desc;
  d.dtype = dtype;
  d.rank = static_cast<int32_t>(shape.size());
  d.device = {STRATA_DEVICE_CPU, 0};
  // kPaddedRows: every dimension's extent is padded by 3 of its own steps, so no two dimensions merge and
  // rows are not adjacent; kStridedCols: additionally the last dimension has stride 2.
  const int64_t pad = layout == Layout::kContiguous ? 0 : 3;
  int64_t stride = layout == Layout::kStridedCols ? 2 : 1;
  for (int i = d.rank - 1; i >= 0; --i) {
    d.shape[i] = shape[i];
    d.strides[i] = stride;
    stride *= shape[i] + pad;
  }
  d.offset = layout == Layout::kContiguous ? 0 : 5;
  int64_t span = 1;  // largest index + 1
  for (int i = 0; i < d.rank; ++i)
    if (shape[i] == 0) span = 0;
  if (span) {
    span = d.offset + 1;
    for (int i = 0; i < d.rank; ++i) span += (shape[i] - 1) * d.strides[i];
  }
  t.storage.assign(static_cast<size_t>(std::max<int64_t>(span, 1)) * dtype_size(dtype), 0);
  return t;
}

int64_t HostTensor::index(int64_t e) const {
  int64_t off = desc.offset;
  for (int i = desc.rank - 1; i >= 0; --i) {
    off += (e % desc.shape[i]) * desc.strides[i];
    e /= desc.shape[i];
  }
  return off;
}

std::vector<double> HostTensor::values() const {
  std::vector<double> v(static_cast<size_t>(numel()));
  for (int64_t e = 0; e < numel(); ++e) v[e] = get(e);
  return v;
}

void HostTensor::fill_normal(std::mt19937_64& rng, double mean, double stddev) {
  std::normal_distribution<double> dist(mean, stddev);
  for (int64_t e = 0; e < numel(); ++e) set(e, dist(rng));
}
void HostTensor::fill_uniform(std::mt19937_64& rng, double lo, double hi) {
  std::uniform_real_distribution<double> dist(lo, hi);
  for (int64_t e = 0; e < numel(); ++e) set(e, dist(rng));
}
void HostTensor::poison() { std::fill(storage.begin(), storage.end(), 0xff); }

// ---------------------------------------------------------------------------------------------- DeviceTensor
void check(strata_status s, const char* what) {
  if (s == STRATA_SUCCESS) return;
  const std::string msg = fmt::format("{}: {} ({})", what, strata_status_name(s), strata_get_last_error_message());
  if (s == STRATA_ERROR_NO_IMPLEMENTATION) throw NotApplicable(msg);
  throw std::runtime_error(msg);
}
static void check_ok(strata_status s, const char* what) { check(s, what); }

DeviceTensor::DeviceTensor(const HostTensor& h, strata_device device) : desc_(h.desc), bytes_(h.storage.size()) {
  desc_.device = device;
  check_ok(strata_malloc(device, bytes_, nullptr, &ptr_), "DeviceTensor: strata_malloc");
  upload(h);
}
DeviceTensor::~DeviceTensor() { strata_free(ptr_); }
void DeviceTensor::upload(const HostTensor& h) {
  check_ok(strata_memcpy(ptr_, h.storage.data(), bytes_, STRATA_MEMCPY_DEFAULT), "DeviceTensor::upload");
}
void DeviceTensor::download(HostTensor& h) const {
  check_ok(strata_device_synchronize(desc_.device), "DeviceTensor::download: synchronize");
  check_ok(strata_memcpy(h.storage.data(), ptr_, bytes_, STRATA_MEMCPY_DEFAULT), "DeviceTensor::download");
}

// ---------------------------------------------------------------------------------------------- compare
double dtype_ceiling(int32_t dtype) {
  switch (dtype) {
    case STRATA_DTYPE_F64: return 1e-12;
    case STRATA_DTYPE_F32: return 1e-5;
    case STRATA_DTYPE_F16: return 2e-3;
    case STRATA_DTYPE_BF16: return 1e-2;
    default: return 0.0;
  }
}

Compare compare(const std::string& name, const std::vector<double>& out, const std::vector<double>& ref,
                const std::vector<double>& naive, int32_t dtype, double reduction_len,
                const std::vector<double>* magnitude) {
  Compare c;
  c.name = name;
  double num = 0, den = 0, nnum = 0;
  size_t finite = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    const bool rf = std::isfinite(ref[i]), of = std::isfinite(out[i]);
    if (!rf || !of) {
      // Non-finite values must agree in kind and position (NaN with NaN, +Inf with +Inf).
      const bool same = (std::isnan(ref[i]) && std::isnan(out[i])) || (ref[i] == out[i]);
      if (!same) c.nan_mismatch = true;
      continue;
    }
    ++finite;
    const double d = out[i] - ref[i];
    num += d * d;
    den += ref[i] * ref[i];
    c.max_abs = std::max(c.max_abs, std::fabs(d));
    if (i < naive.size() && std::isfinite(naive[i])) {
      const double nd = naive[i] - ref[i];
      nnum += nd * nd;
    }
  }
  if (magnitude) {
    double mag = 0;
    for (double m : *magnitude)
      if (std::isfinite(m)) mag += m * m;
    den = std::max(den, mag);
  }
  // A reference whose RMS is below the smallest normal number of `dtype` (f16 2^-14 = 6.1e-5; f32 and bf16 2^-126)
  // lies where that dtype has no relative precision: errors are measured against that number instead, i.e.
  // absolutely (e.g. a gradient that strong decay takes to ~1e-17, computed from f16 operands that flush such values
  // to zero: chunk_gated_delta_rule's dh0, test_gdn_cuda_gaps.cpp).
  const double tiny = dtype == STRATA_DTYPE_F64 ? 0x1p-1022 : dtype == STRATA_DTYPE_F16 ? 0x1p-14 : 0x1p-126;
  if (den > 0.0) den = std::max(den, static_cast<double>(finite) * tiny * tiny);
  const double scale = std::sqrt(den) + 1e-30;
  c.err = std::sqrt(num) / scale;
  c.naive_err = std::sqrt(nnum) / scale;
  if (den == 0.0) {  // all-zero reference: judge the absolute error against the dtype's roundoff
    c.err = std::sqrt(num);
    c.naive_err = std::sqrt(nnum);
  }
  const double ceiling = dtype_ceiling(dtype);
  const double floor = 4.0 * unit_roundoff(dtype) * std::sqrt(std::max(reduction_len, 1.0));
  c.bound = 2.0 * c.naive_err > ceiling ? 2.0 * c.naive_err : std::min(ceiling, std::max(2.0 * c.naive_err, floor));
  c.pass = !c.nan_mismatch && c.err <= c.bound;
  return c;
}

std::string Compare::str() const {
  return fmt::format("{}: err {:.3e} (naive {:.3e}, bound {:.3e}, max_abs {:.3e}){}{}", name, err, naive_err, bound,
                     max_abs, nan_mismatch ? " NaN/Inf mismatch" : "", pass ? "" : " FAIL");
}

std::string CaseResult::str() const {
  if (skipped) return fmt::format("skipped ({})", message);
  std::string s = fmt::format("{} [{}]", pass ? "ok" : "FAIL", impl);
  for (const auto& c : compares) s += "; " + c.str();
  if (!message.empty()) s += "; " + message;
  return s;
}

// ---------------------------------------------------------------------------------------------- timing
Timing time_it(strata_device device, const std::function<void()>& fn, int iters, int warmup) {
  std::vector<double> ms;
  ms.reserve(iters);
  if (device.type == STRATA_DEVICE_CUDA) {
    // Device time of each call, as a training step issues them: the warm-up calls and then every timed call go
    // into the stream back to back, each timed call between its own pair of events, with one synchronisation at
    // the end. While the host runs ahead of the GPU (every op here whose kernels outlast its host-side plan
    // lookup and launch), a call's events bracket its kernels alone; the host's per-call cost is hidden behind
    // the previous call, as it is in a training loop and in triton's do_bench, which timed the peers of
    // PERF_TARGETS.md. Synchronising after each call instead would add the host's launch path (~10 us) to
    // every sample: 15 % of a 70 us row norm.
    check_ok(strata_device_synchronize(device), "time_it: synchronize");
    std::vector<strata_event> ev(2 * static_cast<size_t>(iters));
    for (auto& e : ev) check_ok(strata_event_create(device, &e), "time_it: event");
    for (int i = 0; i < warmup; ++i) fn();
    for (int i = 0; i < iters; ++i) {
      check_ok(strata_event_record(ev[2 * i], nullptr), "time_it: record");
      fn();
      check_ok(strata_event_record(ev[2 * i + 1], nullptr), "time_it: record");
    }
    check_ok(strata_event_synchronize(ev.back()), "time_it: synchronize");
    for (int i = 0; i < iters; ++i) {
      float t = 0;
      check_ok(strata_event_elapsed_time(&t, ev[2 * i], ev[2 * i + 1]), "time_it: elapsed");
      ms.push_back(t);
    }
    for (auto& e : ev) strata_event_destroy(e);
  } else {
    for (int i = 0; i < warmup; ++i) fn();
    check_ok(strata_device_synchronize(device), "time_it: synchronize");
    for (int i = 0; i < iters; ++i) {
      const auto t0 = std::chrono::steady_clock::now();
      fn();
      ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
    }
  }
  std::sort(ms.begin(), ms.end());
  return {ms[ms.size() / 2], ms.front(), iters};
}

CopyProbe::CopyProbe(strata_device device, size_t bytes) : device_(device), bytes_(std::max<size_t>(bytes, 4096)) {
  check_ok(strata_malloc(device, bytes_, nullptr, &src_), "CopyProbe: malloc");
  check_ok(strata_malloc(device, bytes_, nullptr, &dst_), "CopyProbe: malloc");
  check_ok(strata_memset(src_, 1, bytes_), "CopyProbe: memset");
  check_ok(strata_memset(dst_, 2, bytes_), "CopyProbe: memset");
}
CopyProbe::~CopyProbe() {
  strata_free(src_);
  strata_free(dst_);
}
void CopyProbe::run() {
  if (device_.type == STRATA_DEVICE_CUDA) {
    check_ok(strata_memcpy_async(dst_, src_, bytes_, STRATA_MEMCPY_DEVICE_TO_DEVICE, nullptr), "CopyProbe: copy");
    return;
  }
  // Split like the kernels split rows: one contiguous piece per thread.
  const int threads = rt::num_threads();
  const size_t chunk = (bytes_ + threads - 1) / threads;
#pragma omp parallel for num_threads(threads) schedule(static)
  for (int t = 0; t < threads; ++t) {
    const size_t b = std::min(bytes_, t * chunk), e = std::min(bytes_, b + chunk);
    std::memcpy(static_cast<char*>(dst_) + b, static_cast<const char*>(src_) + b, e - b);
  }
}

double copy_bandwidth_gbs(strata_device device, size_t bytes) {
  CopyProbe copy(device, bytes);
  const Timing t = time_it(device, [&] { copy.run(); }, 10, 2);
  return copy.bytes_moved() / (t.median_ms * 1e-3) / 1e9;
}

InterleavedTiming time_with_copy(strata_device device, const std::function<void()>& op, double op_bytes,
                                 int iters) {
  // At least 512 MiB per buffer: glibc's memcpy switches to non-temporal stores only for large copies, and
  // below that threshold the "ceiling" would be a slower kind of copy than the streaming kernels do.
  CopyProbe copy(device, std::max<size_t>(static_cast<size_t>(op_bytes / 2), size_t{512} << 20));
  InterleavedTiming out;
  if (device.type == STRATA_DEVICE_CPU) {
    // CPU: op and copy alternate call by call, so each op sample has a copy sample taken right after it, under
    // the same load (on the shared 2-core VM the copy rate of one run's cases ranged 6.7-39.4 GB/s within two
    // minutes as other processes came and went: bench/results/2026-11-30_cpu_atk_paired.md). The copy also
    // evicts the op's data, so every op call starts cold. Per pair, op GB/s over copy GB/s; the median of these
    // ratios is the figure robust to slow drift, the best op call over the best copy call the unloaded one.
    // Calls of a few ms with 2 threads stay load-sensitive: under oversubscription each parallel region may
    // wait a scheduler tick for its second thread, which a copy of tens of ms absorbs and they do not.
    const auto wall_ms = [](const std::function<void()>& fn) {
      const auto t0 = std::chrono::steady_clock::now();
      fn();
      return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    };
    const std::function<void()> run_copy = [&] { copy.run(); };
    for (int i = 0; i < 2; ++i) op();
    copy.run();
    const int n = std::max(iters, 1);
    std::vector<double> op_ms, copy_ms, ratio;
    for (int i = 0; i < n; ++i) {
      op_ms.push_back(wall_ms(op));
      copy_ms.push_back(wall_ms(run_copy));
      ratio.push_back(op_bytes / op_ms.back() / (copy.bytes_moved() / copy_ms.back()));
    }
    const auto median = [](std::vector<double> v) {
      std::sort(v.begin(), v.end());
      return v.size() % 2 ? v[v.size() / 2] : 0.5 * (v[v.size() / 2 - 1] + v[v.size() / 2]);
    };
    const double op_min = *std::min_element(op_ms.begin(), op_ms.end());
    const double copy_min = *std::min_element(copy_ms.begin(), copy_ms.end());
    out.op = {median(op_ms), op_min, n};
    out.copy_gbs = copy.bytes_moved() / (median(copy_ms) * 1e-3) / 1e9;
    out.ratio_paired = median(ratio);
    out.ratio_best = op_bytes / op_min / (copy.bytes_moved() / copy_min);
    return out;
  }
  const int rounds = 4, per = std::max(1, iters / rounds);
  std::vector<double> op_ms, copy_ms;
  double op_min = 1e300;
  for (int r = 0; r < rounds; ++r) {
    const Timing t = time_it(device, op, per, r == 0 ? 3 : 1);
    const Timing c = time_it(device, [&] { copy.run(); }, per, 1);
    op_ms.push_back(t.median_ms);
    op_min = std::min(op_min, t.min_ms);
    copy_ms.push_back(c.median_ms);
  }
  std::sort(op_ms.begin(), op_ms.end());
  std::sort(copy_ms.begin(), copy_ms.end());
  out.op = {0.5 * (op_ms[rounds / 2 - 1] + op_ms[rounds / 2]), op_min, per * rounds};
  const double cm = 0.5 * (copy_ms[rounds / 2 - 1] + copy_ms[rounds / 2]);
  out.copy_gbs = copy.bytes_moved() / (cm * 1e-3) / 1e9;
  return out;
}

// ---------------------------------------------------------------------------------------------- impls
std::vector<std::string> impls_for(const std::string& op, strata_device device) {
  const char* names[64];
  const int32_t n = strata_op_impl_names(op.c_str(), names, 64);
  std::vector<std::string> out;
  for (int32_t i = 0; i < n && i < 64; ++i) {
    const std::string name = names[i];
    const bool cuda = name.rfind("cuda.", 0) == 0;
    if (device.type == STRATA_DEVICE_CUDA ? !cuda : cuda) continue;
    bool ok = true;
    for (const auto& isa : tile::cpu_isas())
      if (name == isa.impl) ok = tile::reject_cpu_isa(isa).empty();
    // The native-bf16 AVX3 builds are offered only where the CPU has AVX512-BF16 (not on an AVX2-only host).
    if (name == tile::kAvx512Bf16Impl && !tile::cpu_has_avx512_bf16()) ok = false;
    if (ok) out.push_back(name);
  }
  return out;
}

ScopedForceImpl::ScopedForceImpl(const std::string& impl) : on_(!impl.empty()) {
  if (on_) strata_set_force_impl(impl.c_str());
}
ScopedForceImpl::~ScopedForceImpl() {
  if (on_) strata_set_force_impl(nullptr);
}

CaseResult run_forced(const OpHarness& h, const Case& c, strata_device device, const std::string& impl) {
  strata_set_force_impl(impl.c_str());
  CaseResult r;
  try {
    r = h.run_case(c, device);
  } catch (const NotApplicable& e) {
    r.skipped = true;
    r.message = e.what();
  } catch (const std::exception& e) {
    r.pass = false;
    r.message = e.what();
  }
  strata_set_force_impl(nullptr);
  if (r.impl.empty()) r.impl = impl;
  return r;
}

}  // namespace strata::atk
