// The `strata` command (ARCHITECTURE.md §9):
//   strata info [--json]                     version, build, devices, settings, what each op runs here and why
//   strata atk [--device D] [--ops a,b] ...  precision, performance and peak memory of every op harness
//   strata bench --op NAME [--device D] ...  one op's bench cases only, for tuning
//   strata peak [--threads N] [--json]       the CPU's fp32 FMA peak, measured now (the CPU "% of peak" ceiling)
// Exit codes: 0 success, 1 a precision case failed or a bench case errored, 2 bad usage or setup failure.
#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include <cstdio>
#include <exception>
#include <stdexcept>

#include "atk.h"
#include "info.h"
#include "testkit/fma_peak.h"

namespace {

void add_device_option(CLI::App* cmd, std::string& device) {
  cmd->add_option("--device", device, "cpu, cuda, cuda:N, or auto (cuda when a GPU answers, else cpu)")
      ->capture_default_str();
}

void add_run_options(CLI::App* cmd, strata::cli::AtkOptions& o) {
  cmd->add_option("--iters", o.iters, "timed iterations per bench case (default 20, 5 with --quick)")
      ->check(CLI::PositiveNumber);
  cmd->add_option("--impl", o.impl, "pin one implementation, as STRATA_FORCE_IMPL does (default: dispatch picks)");
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"strata: operators for LLM training on x86 CPUs and NVIDIA GPUs"};
  app.require_subcommand(1);

  CLI::App* info = app.add_subcommand("info", "version, build, devices, and the implementation each op picks here");
  bool info_as_json = false;
  info->add_flag("--json", info_as_json, "print JSON instead of text");

  strata::cli::AtkOptions atk;
  atk.out_dir = "atk_report";
  CLI::App* atk_cmd =
      app.add_subcommand("atk", "accuracy/performance/memory test kit: every op's cases vs float64 and the floor");
  add_device_option(atk_cmd, atk.device);
  atk_cmd->add_option("--ops", atk.ops, "ops or op families to run, comma-separated (default: all)")->delimiter(',');
  atk_cmd->add_option("--out", atk.out_dir, "folder for atk.json and atk.md")->capture_default_str();
  atk_cmd->add_flag("--quick", atk.quick, "24 conformance cases per op, 5 timed iterations, a copy buffer of 4x the last-level cache without the 256 MiB / 1 GiB minimum");
  add_run_options(atk_cmd, atk);
  bool no_precision = false, no_perf = false;
  atk_cmd->add_flag("--no-precision", no_precision, "skip the conformance cases");
  atk_cmd->add_flag("--no-perf", no_perf, "skip the copy bandwidth and the bench cases");

  strata::cli::AtkOptions bench;
  bench.command = "bench";
  std::string bench_op;
  CLI::App* bench_cmd = app.add_subcommand("bench", "one op's bench cases only (no precision), for tuning");
  bench_cmd->add_option("--op", bench_op, "op or op family")->required();
  add_device_option(bench_cmd, bench.device);
  bench_cmd->add_option("--out", bench.out_dir, "also write atk.json and atk.md into this folder");
  add_run_options(bench_cmd, bench);

  CLI::App* peak_cmd =
      app.add_subcommand("peak", "the fp32 FMA peak of this CPU, measured now (FMA chains on every thread)");
  int peak_threads = 0, peak_reps = 5;
  double peak_seconds = 0.1;
  bool peak_as_json = false;
  peak_cmd->add_option("--threads", peak_threads, "threads (default 0: Strata's thread count, all cores)")
      ->check(CLI::Range(0, 4096));
  peak_cmd->add_option("--reps", peak_reps, "repetitions; the best one is the peak")->check(CLI::Range(1, 1000))
      ->capture_default_str();
  peak_cmd->add_option("--seconds", peak_seconds, "wall seconds per repetition")->check(CLI::Range(0.001, 60.0))
      ->capture_default_str();
  peak_cmd->add_flag("--json", peak_as_json, "print JSON instead of text");

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    // --help and --version are "errors" with exit code 0; every real usage error exits 2, as documented.
    return app.exit(e) == 0 ? 0 : 2;
  }

  try {
    if (info->parsed()) {
      const nlohmann::ordered_json j = strata::cli::info_json();
      if (info_as_json) {
        fmt::print("{}\n", j.dump(2));
      } else {
        strata::cli::print_info(j);
      }
      return 0;
    }
    if (peak_cmd->parsed()) {
      const strata::atk::FmaPeak p = strata::atk::fp32_fma_peak(peak_threads, peak_reps, peak_seconds);
      if (peak_as_json) {
        fmt::print("{{\"gflops\": {:.2f}, \"gflops_median\": {:.2f}, \"gflops_per_cpu_second\": {:.2f}, \"threads\": {}, \"isa\": \"{}\", "
                   "\"lanes\": {}, \"chains\": {}, \"iters\": {}, \"rep_gflops\": [{:.2f}]}}\n",
                   p.gflops, p.gflops_median, p.gflops_per_cpu_second, p.threads, p.isa, p.lanes, strata::atk::kFmaChains, p.iters,
                   fmt::join(p.rep_gflops, ", "));
      } else {
        fmt::print("fp32 FMA peak: {:.1f} GFLOP/s (best of {}; median {:.1f}), {} thread{}, {:.1f} per thread, "
                   "{:.1f} per thread CPU-second, {} x {} lanes x {} chains\n",
                   p.gflops, p.rep_gflops.size(), p.gflops_median, p.threads, p.threads == 1 ? "" : "s", p.gflops / p.threads,
                   p.gflops_per_cpu_second, p.isa, p.lanes, strata::atk::kFmaChains);
      }
      return 0;
    }
    if (atk_cmd->parsed()) {
      atk.precision = !no_precision;
      atk.perf = !no_perf;
      return strata::cli::run_atk(atk);
    }
    bench.ops = {bench_op};
    bench.precision = false;
    return strata::cli::run_atk(bench);
  } catch (const std::exception& e) {
    std::fflush(stdout);
    fmt::print(stderr, "strata: {}\n", e.what());
    return 2;
  }
}
