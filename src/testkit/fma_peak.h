// The fp32 FMA peak of this CPU, measured now: the compute ceiling that CPU benchmarks quote "% of peak" against
// (ARCHITECTURE.md §7; issue 3's CPU target "≥ 40 % of the fp32 FMA peak measured in the same run"). A dense
// sgemm (torch.mm) is not that ceiling: its packing and memory traffic keep it below the FMA rate, and the fused
// GDN kernels read 129-171 % of it (bench/results/2026-12-01_cpu_gdn_s14_quiet.md).
//
// Each thread runs kFmaChains independent vector FMA chains a = a * b + c of the best Highway target the host
// has (the ISA the `cpu.<isa>` kernels dispatch to): 12 chains cover the 4-5 cycle FMA latency of two FMA
// ports (8-10 in flight) and, with b and c, fit AVX2's 16 registers without spilling. The threads run under
// one OpenMP parallel region; the rate is the FLOPs of all threads over the wall time between two barriers,
// the best of `reps` repetitions (a ceiling: a repetition slowed down by other processes only under-reads). On an
// oversubscribed machine the wall rate of several threads collapses (the slowest thread sets it): compare
// gflops_per_cpu_second there.
#pragma once

#include <string>
#include <vector>

namespace strata::atk {

inline constexpr int kFmaChains = 12;

struct FmaPeak {
  double gflops = 0;         // best repetition: all threads' FLOPs / wall seconds / 1e9
  double gflops_median = 0;  // median repetition
  // One thread's FLOPs per second of its own CPU time (CLOCK_THREAD_CPUTIME_ID), best repetition, mean over the
  // threads: what a core does while it runs, the figure that holds up on a loaded machine (a descheduled thread
  // is not charged), comparable with per-CPU-second rates of the kernels.
  double gflops_per_cpu_second = 0;
  int threads = 0;           // threads that ran (the OpenMP region's team size)
  int lanes = 0;             // fp32 lanes per vector of the target
  std::string isa;           // Highway target name ("AVX2", "AVX3", ...)
  long long iters = 0;       // FMA rounds per chain per repetition
  double seconds = 0;        // wall seconds of the best repetition
  std::vector<double> rep_gflops;
};

// threads <= 0: Strata's thread count (strata_set_num_threads / rt::num_threads()). `seconds`: the target wall
// time of one repetition (the round count is calibrated on one thread first). Throws std::invalid_argument for
// reps < 1 or seconds <= 0.
FmaPeak fp32_fma_peak(int threads = 0, int reps = 5, double seconds = 0.1);

}  // namespace strata::atk
