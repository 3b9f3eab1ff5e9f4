// fp32 FMA peak probe (fma_peak.h): the chains written once with Highway, dispatched to the best target.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "testkit/fma_peak.cpp"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>

#include <omp.h>
#include <time.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <stdexcept>
#include <vector>

#include "runtime/runtime_internal.h"
#include "testkit/fma_peak.h"

// Target-independent result type (this file is compiled once per target: define it once).
#ifndef STRATA_TESTKIT_FMA_PEAK_CHAIN_OUT
#define STRATA_TESTKIT_FMA_PEAK_CHAIN_OUT
namespace strata::atk {
struct ChainOut {
  float sink;       // the chains' sum, so the compiler keeps every FMA
  int lanes;        // fp32 lanes per vector
  const char* isa;  // this target's name
};
}  // namespace strata::atk
#endif

HWY_BEFORE_NAMESPACE();
namespace strata::atk::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// `iters` rounds of kFmaChains independent FMA chains a_i = a_i * b + c. b and c come from the caller, so
// nothing folds at compile time; with b < 1 each chain converges to c / (1 - b): no overflow, no denormals.
HWY_NOINLINE ChainOut FmaChains(int64_t iters, float b_in, float c_in) {
  const hn::ScalableTag<float> d;
  using V = hn::Vec<decltype(d)>;
  const V b = hn::Set(d, b_in), c = hn::Set(d, c_in);
  V a[kFmaChains];
#pragma GCC unroll 12
  for (int i = 0; i < kFmaChains; ++i) a[i] = hn::Set(d, 1.0f + 1e-3f * static_cast<float>(i));
  for (int64_t it = 0; it < iters; ++it) {
#pragma GCC unroll 12
    for (int i = 0; i < kFmaChains; ++i) a[i] = hn::MulAdd(a[i], b, c);
  }
  V s = a[0];
#pragma GCC unroll 12
  for (int i = 1; i < kFmaChains; ++i) s = hn::Add(s, a[i]);
  return {hn::GetLane(hn::SumOfLanes(d, s)), static_cast<int>(hn::Lanes(d)), hwy::TargetName(HWY_TARGET)};
}

}  // namespace strata::atk::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace strata::atk {
HWY_EXPORT(FmaChains);

namespace {
double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}
double thread_cpu_s() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}
}  // namespace

FmaPeak fp32_fma_peak(int threads, int reps, double seconds) {
  if (reps < 1) throw std::invalid_argument("fp32_fma_peak: reps must be >= 1");
  if (!(seconds > 0)) throw std::invalid_argument("fp32_fma_peak: seconds must be > 0");
  if (threads <= 0) threads = rt::num_threads();
  const auto chains = HWY_DYNAMIC_DISPATCH(FmaChains);
  const float b = 0.999999f, c = 1e-7f;

  // Calibrate on one thread: double the rounds until a call takes >= 10 ms, then scale to `seconds`.
  FmaPeak out;
  int64_t iters = 1 << 14;
  for (;;) {
    const double t0 = now_s();
    const ChainOut r = chains(iters, b, c);
    const double t = now_s() - t0;
    out.lanes = r.lanes;
    out.isa = r.isa;
    if (t >= 0.01 || iters >= (int64_t{1} << 40)) {
      iters = std::max<int64_t>(1, static_cast<int64_t>(static_cast<double>(iters) * seconds / std::max(t, 1e-9)));
      break;
    }
    iters *= 2;
  }

  std::vector<float> sinks(static_cast<size_t>(threads), 0.f);
  std::vector<double> cpu_s(static_cast<size_t>(threads), 0.0);
  for (int rep = 0; rep < reps; ++rep) {
    double t0 = 0, t1 = 0;
    int team = 0;
#pragma omp parallel num_threads(threads)
    {
#pragma omp single
      team = omp_get_num_threads();
      // (the single's implicit barrier: every thread is up before the clock starts)
#pragma omp master
      t0 = now_s();
#pragma omp barrier
      const auto id = static_cast<size_t>(omp_get_thread_num());
      const double c0 = thread_cpu_s();
      sinks[id] += chains(iters, b, c).sink;
      cpu_s[id] = thread_cpu_s() - c0;
#pragma omp barrier
#pragma omp master
      t1 = now_s();
    }
    const double per_thread = 2.0 * out.lanes * kFmaChains * static_cast<double>(iters);
    const double g = per_thread * team / std::max(t1 - t0, 1e-9) / 1e9;
    double cpu_rate = 0;
    for (int t = 0; t < team; ++t) cpu_rate += per_thread / std::max(cpu_s[static_cast<size_t>(t)], 1e-9) / 1e9 / team;
    out.gflops_per_cpu_second = std::max(out.gflops_per_cpu_second, cpu_rate);
    out.rep_gflops.push_back(g);
    if (g > out.gflops) {
      out.gflops = g;
      out.seconds = t1 - t0;
    }
    out.threads = team;
  }
  float total = 0;
  for (float s : sinks) total += s;
  volatile float keep = total;  // the sums are used: no chain is dead code
  (void)keep;
  std::vector<double> sorted = out.rep_gflops;
  std::sort(sorted.begin(), sorted.end());
  out.gflops_median = sorted[sorted.size() / 2];
  out.iters = iters;
  return out;
}

}  // namespace strata::atk
#endif
