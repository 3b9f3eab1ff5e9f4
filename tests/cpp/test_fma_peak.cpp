// The fp32 FMA peak probe (src/testkit/fma_peak.h) that CPU benchmarks quote "% of peak" against: it runs, its
// per-CPU-second rate is physically possible and not absurdly low, the thread count is honoured, and on an
// unloaded machine with several cores the wall rate grows with the threads.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <stdexcept>
#include <thread>

#include "testkit/fma_peak.h"

namespace {

using strata::atk::FmaPeak;
using strata::atk::fp32_fma_peak;

// Upper bound of one core: 2 FLOPs per FMA lane, at most 2 vector FMA units (every x86 core so far), 6 GHz.
double core_ceiling_gflops(int lanes) { return 2.0 * lanes * 2 * 6.0; }
// Lower bound of one core while it runs: one vector FMA every 4 cycles at 1 GHz (an unoptimised build issues
// loads and stores around each FMA, still far above this; the scalar target has 1 lane).
double core_floor_gflops(int lanes) { return 2.0 * lanes * 0.25; }

TEST(FmaPeak, OneThreadIsPlausible) {
  const FmaPeak p = fp32_fma_peak(1, 3, 0.02);
  EXPECT_EQ(p.threads, 1);
  ASSERT_GE(p.lanes, 1);
  EXPECT_FALSE(p.isa.empty());
  EXPECT_GT(p.iters, 0);
  ASSERT_EQ(p.rep_gflops.size(), 3u);
  EXPECT_GT(p.gflops, 0);
  EXPECT_LE(p.gflops_median, p.gflops);
  EXPECT_EQ(p.gflops, *std::max_element(p.rep_gflops.begin(), p.rep_gflops.end()));
  // Thread CPU time is charged only while the thread runs, so this bound holds on a loaded machine too.
  EXPECT_GT(p.gflops_per_cpu_second, core_floor_gflops(p.lanes)) << p.isa << " " << p.lanes << " lanes";
  EXPECT_LT(p.gflops_per_cpu_second, core_ceiling_gflops(p.lanes)) << p.isa << " " << p.lanes << " lanes";
  // Wall time >= the thread's CPU time: the wall rate cannot exceed the CPU-time rate (5 % for clock grain).
  EXPECT_LE(p.gflops, 1.05 * p.gflops_per_cpu_second);
}

TEST(FmaPeak, HonoursTheThreadCount) {
  const FmaPeak p = fp32_fma_peak(2, 2, 0.01);
  EXPECT_EQ(p.threads, 2);
  EXPECT_GT(p.gflops, 0);
  EXPECT_LT(p.gflops, 2 * core_ceiling_gflops(p.lanes));
  EXPECT_GT(p.gflops_per_cpu_second, core_floor_gflops(p.lanes));
}

TEST(FmaPeak, RejectsBadArguments) {
  EXPECT_THROW(fp32_fma_peak(1, 0, 0.01), std::invalid_argument);
  EXPECT_THROW(fp32_fma_peak(1, 1, 0.0), std::invalid_argument);
}

// Up to 4 threads against 1, best of 5 each. SMT siblings share FMA units, so the bound is loose (1.25x for 2+
// threads): it catches threads that do not run at once (1x), not imperfect scaling. A busy machine (1-minute
// load average above half its hardware threads) cannot show scaling: skipped, with the load printed.
TEST(FmaPeak, ScalesWithThreadsWhenIdle) {
  const int hw = static_cast<int>(std::thread::hardware_concurrency());
  if (hw < 2) GTEST_SKIP() << "one hardware thread";
  double load[1] = {0};
  if (getloadavg(load, 1) != 1 || load[0] > hw / 2.0)
    GTEST_SKIP() << "load average " << load[0] << " on " << hw << " hardware threads: too busy to time scaling";
  const int n = std::min(hw, 4);
  const FmaPeak one = fp32_fma_peak(1, 5, 0.03);
  const FmaPeak many = fp32_fma_peak(n, 5, 0.03);
  EXPECT_EQ(many.threads, n);
  EXPECT_GT(many.gflops, 1.25 * one.gflops) << n << " threads " << many.gflops << " GFLOP/s, 1 thread "
                                            << one.gflops << " (load average " << load[0] << ")";
}

}  // namespace
