#include "atk.h"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>
#include <numeric>
#include <random>
#include <set>
#include <stdexcept>

#include <nlohmann/json.hpp>

#include "info.h"
#include "report.h"
#include "testkit/testkit.h"

namespace strata::cli {
namespace {

using json = nlohmann::ordered_json;

// Conformance cases run with --quick, per op.
constexpr size_t kQuickCases = 24;
// Copy-bandwidth buffer: at least 4x the last-level cache so the copy streams from memory, and at least this
// much (PERF_TARGETS.md; H200 L2 = 60 MB) in a full run.
constexpr double kMiB = 1024.0 * 1024.0;
constexpr double kCopyMinCpu = 256 * kMiB, kCopyMinCuda = 1024 * kMiB;
constexpr double kCopyMinQuick = 64 * kMiB;
// What the CPU's extra columns mean (the terminal and atk.md).
constexpr const char* kPairedNote =
    "; CPU: op and copy calls alternate, paired % = median over the pairs of op GB/s / copy GB/s (the figure "
    "robust to load), best % = fastest op call / fastest copy call";
// Failures listed per op on the terminal (the JSON has all of them).
constexpr size_t kFailuresShown = 10;

struct Precision {
  int cases = 0, passed = 0, failed = 0, skipped = 0;
  double worst_ratio = 0;              // max over compared outputs of err / bound (< 1 passes)
  std::string worst;                   // "<output> in <case line>"
  std::set<std::string> impls;         // what dispatch picked
  std::vector<std::string> failures;   // "<case line>: <result>"
  double seconds = 0;
};

struct BenchRow {
  std::string label;
  double bytes = 0, flops = 0;
  atk::Timing timing;
  double copy_gbs = 0;      // copy bandwidth measured in rounds alternating with this case's timing
  double ratio_paired = 0;  // CPU: median over op/copy call pairs of op GB/s / copy GB/s (0: not measured)
  double ratio_best = 0;    // CPU: best op call's GB/s / best copy call's GB/s
  uint64_t peak_bytes = 0;  // allocated during setup and run, beyond what was allocated before
  bool skipped = false;     // the pinned implementation cannot run it
  std::string error;        // skip reason or failure
  bool ok() const { return error.empty(); }
};

struct OpRun {
  std::string op;
  bool ran_precision = false;
  Precision precision;
  std::vector<BenchRow> bench;
};

strata_device resolve_device(const std::string& name) {
  int32_t n_cuda = 0;
  if (strata_device_count(STRATA_DEVICE_CUDA, &n_cuda) != STRATA_SUCCESS) n_cuda = 0;
  if (name == "auto") return n_cuda > 0 ? strata_device{STRATA_DEVICE_CUDA, 0} : strata_device{STRATA_DEVICE_CPU, 0};
  if (name == "cpu") return {STRATA_DEVICE_CPU, 0};
  if (name == "cuda" || name.rfind("cuda:", 0) == 0) {
    int index = 0;
    if (name != "cuda") {
      const std::string digits = name.substr(5);
      const bool numeric = !digits.empty() && digits.size() <= 4 &&
                           std::all_of(digits.begin(), digits.end(), [](unsigned char ch) { return std::isdigit(ch); });
      if (!numeric) throw std::invalid_argument(fmt::format("--device {}: expected cuda:N with N a device index", name));
      index = std::stoi(digits);
    }
    const strata_device d{STRATA_DEVICE_CUDA, index};
    strata_device_properties p{};
    if (strata_device_get_properties(d, &p) != STRATA_SUCCESS)
      throw std::invalid_argument(fmt::format("--device {}: {}", name, strata_get_last_error_message()));
    return d;
  }
  throw std::invalid_argument(fmt::format("--device {}: expected cpu, cuda, cuda:N or auto", name));
}

// The harnesses that `wanted` names: an exact harness name, or an op family ("l2norm" for l2norm_fwd and
// l2norm_bwd). Every name must match something.
std::vector<std::unique_ptr<atk::OpHarness>> select_harnesses(const std::vector<std::string>& wanted) {
  std::vector<std::unique_ptr<atk::OpHarness>> all = atk::all_harnesses(), out;
  auto matches = [](const std::string& op, const std::string& w) {
    return op == w || op == w + "_fwd" || op == w + "_bwd";
  };
  for (const auto& w : wanted) {
    if (std::none_of(all.begin(), all.end(), [&](const auto& h) { return matches(h->op(), w); })) {
      std::vector<std::string> names;
      for (const auto& h : all) names.push_back(h->op());
      throw std::invalid_argument(fmt::format("no op harness named {} (have: {})", w, fmt::join(names, ", ")));
    }
  }
  for (auto& h : all)
    if (wanted.empty() || std::any_of(wanted.begin(), wanted.end(), [&](const auto& w) { return matches(h->op(), w); }))
      out.push_back(std::move(h));
  return out;
}

std::vector<atk::Case> select_cases(std::vector<atk::Case> cases, bool quick) {
  if (!quick || cases.size() <= kQuickCases) return cases;
  // A fixed shuffle rather than a stride: harnesses list cases as nested loops (dtype x shape x layout), and
  // a stride sharing a factor with an inner loop's length would keep picking the same layout or dtype.
  std::vector<size_t> idx(cases.size());
  std::iota(idx.begin(), idx.end(), size_t{0});
  std::mt19937_64 rng(20261129);
  std::shuffle(idx.begin(), idx.end(), rng);
  idx.resize(kQuickCases);
  std::sort(idx.begin(), idx.end());
  std::vector<atk::Case> out;
  for (size_t i : idx) out.push_back(std::move(cases[i]));
  return out;
}

double copy_buffer_bytes(strata_device device, bool quick) {
  strata_device_properties p{};
  atk::check(strata_device_get_properties(device, &p), "device properties");
  const double floor = quick ? kCopyMinQuick : (device.type == STRATA_DEVICE_CUDA ? kCopyMinCuda : kCopyMinCpu);
  double bytes = std::max(floor, 4.0 * static_cast<double>(p.l2_cache_bytes));
  // Two buffers of this size must fit comfortably next to what the process already holds.
  if (p.total_memory > 0) bytes = std::min(bytes, static_cast<double>(p.total_memory) / 8);
  return std::floor(bytes / kMiB) * kMiB;
}

Precision run_precision(const atk::OpHarness& h, strata_device device, const std::vector<atk::Case>& cases,
                        const std::string& impl, Progress& bar) {
  Precision p;
  const auto t0 = std::chrono::steady_clock::now();
  for (const auto& c : cases) {
    const std::string line = c.str();
    bar.start(line);
    // An empty name pins nothing, so dispatch picks (STRATA_FORCE_IMPL from the environment still applies).
    const atk::CaseResult r = atk::run_forced(h, c, device, impl);
    ++p.cases;
    if (r.skipped) {
      ++p.skipped;
    } else {
      r.pass ? ++p.passed : ++p.failed;
      if (!r.impl.empty()) p.impls.insert(r.impl);
      if (!r.pass) p.failures.push_back(fmt::format("{}: {}", line, r.str()));
      for (const auto& cmp : r.compares) {
        const double ratio = cmp.bound > 0 ? cmp.err / cmp.bound
                             : cmp.err > 0 ? std::numeric_limits<double>::infinity()
                                           : 0.0;
        if (ratio > p.worst_ratio || p.worst.empty()) {
          p.worst_ratio = std::max(ratio, p.worst_ratio);
          p.worst = fmt::format("{} in {}", cmp.name, line);
        }
      }
    }
    bar.advance();
  }
  p.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return p;
}

BenchRow run_bench(const atk::BenchCase& b, strata_device device, const AtkOptions& o, int iters, Progress& bar) {
  BenchRow row;
  row.label = b.label;
  row.bytes = b.bytes;
  row.flops = b.flops;
  bar.start(b.label);
  // The plan is made in setup, so a pinned implementation has to be in place around it.
  if (!o.impl.empty()) strata_set_force_impl(o.impl.c_str());
  try {
    atk::check(strata_memory_reset_peak(device), "reset peak memory");
    strata_memory_stats before{};
    atk::check(strata_memory_get_stats(device, &before), "memory stats");
    if (b.setup) b.setup();
    // Peak memory is read before the copy probe allocates its buffers.
    row.timing = atk::time_it(device, b.run, 2, o.quick ? 1 : 2);
    strata_memory_stats after{};
    atk::check(strata_memory_get_stats(device, &after), "memory stats");
    row.peak_bytes = after.peak_allocated - before.allocated;
    const atk::InterleavedTiming t = atk::time_with_copy(device, b.run, b.bytes, iters);
    row.timing = t.op;
    row.copy_gbs = t.copy_gbs;
    row.ratio_paired = t.ratio_paired;
    row.ratio_best = t.ratio_best;
  } catch (const atk::NotApplicable& e) {
    row.skipped = true;
    row.error = e.what();
  } catch (const std::exception& e) {
    row.error = e.what();
  }
  if (!o.impl.empty()) strata_set_force_impl(nullptr);
  try {
    if (b.teardown) b.teardown();
  } catch (const std::exception& e) {
    if (row.error.empty()) row.error = fmt::format("teardown: {}", e.what());
  }
  // Hands the case's buffers back to the system, so that the next case (or op) starts from the same state
  // and large CPU cases do not pile up in the allocator's cache.
  strata_memory_empty_cache(device);
  bar.advance();
  return row;
}

// ---- derived figures: one place, used by the tables and the JSON ----
double gbs(const BenchRow& r) { return r.bytes / (r.timing.median_ms * 1e-3) / 1e9; }
// The floor uses the copy bandwidth measured alongside the case (the run-wide figure when there is none).
double floor_ms(const BenchRow& r, double copy_gbs) {
  return r.bytes / ((r.copy_gbs > 0 ? r.copy_gbs : copy_gbs) * 1e9) * 1e3;
}

std::string ratio_str(double r) {
  return std::isfinite(r) ? fmt::format("{:.3f}", r) : std::string("inf");
}

std::string precision_verdict(const Precision& p) {
  if (p.failed) return "FAIL";
  return p.passed ? "ok" : "none run";
}

Table precision_table(const std::vector<OpRun>& runs, bool with_worst_case) {
  std::vector<Table::Column> cols = {{"op"},
                                     {"impl"},
                                     {"cases", Table::Align::kRight},
                                     {"pass", Table::Align::kRight},
                                     {"fail", Table::Align::kRight},
                                     {"skip", Table::Align::kRight},
                                     {"worst err/bound", Table::Align::kRight},
                                     {"s", Table::Align::kRight},
                                     {"result"}};
  if (with_worst_case) cols.push_back({"worst case"});
  Table t(cols);
  for (const auto& r : runs) {
    if (!r.ran_precision) continue;
    const Precision& p = r.precision;
    std::vector<std::string> row = {r.op,
                                    fmt::format("{}", fmt::join(p.impls, ", ")),
                                    std::to_string(p.cases),
                                    std::to_string(p.passed),
                                    std::to_string(p.failed),
                                    std::to_string(p.skipped),
                                    ratio_str(p.worst_ratio),
                                    fmt::format("{:.1f}", p.seconds),
                                    precision_verdict(p)};
    if (with_worst_case) row.push_back(p.worst);
    t.add_row(std::move(row));
  }
  return t;
}

// TFLOP/s is left empty for the memory-bound ops (flops == 0); the floor is bytes / copy bandwidth.
Table perf_table(const std::vector<OpRun>& runs, double copy_gbs) {
  Table t({{"case"},
           {"median ms", Table::Align::kRight},
           {"min ms", Table::Align::kRight},
           {"GB/s", Table::Align::kRight},
           {"TFLOP/s", Table::Align::kRight},
           {"copy GB/s", Table::Align::kRight},
           {"floor ms", Table::Align::kRight},
           {"x floor", Table::Align::kRight},
           {"% copy bw", Table::Align::kRight},
           {"paired %", Table::Align::kRight},
           {"best %", Table::Align::kRight},
           {"peak mem", Table::Align::kRight}});
  for (const auto& r : runs)
    for (const auto& b : r.bench) {
      if (!b.ok()) {
        t.add_row({b.label, b.skipped ? "skipped" : "ERROR", "", "", "", "", "", "", "", "", "", ""});
        continue;
      }
      const double fl = floor_ms(b, copy_gbs);
      t.add_row({b.label, format_ms(b.timing.median_ms), format_ms(b.timing.min_ms), fmt::format("{:.1f}", gbs(b)),
                 b.flops > 0 ? fmt::format("{:.2f}", b.flops / (b.timing.median_ms * 1e-3) / 1e12) : "",
                 fmt::format("{:.1f}", b.copy_gbs > 0 ? b.copy_gbs : copy_gbs), format_ms(fl), fmt::format("{:.2f}", b.timing.median_ms / fl),
                 fmt::format("{:.0f}%", 100.0 * fl / b.timing.median_ms),
                 b.ratio_paired > 0 ? fmt::format("{:.0f}%", 100.0 * b.ratio_paired) : "",
                 b.ratio_best > 0 ? fmt::format("{:.0f}%", 100.0 * b.ratio_best) : "",
                 format_bytes(static_cast<double>(b.peak_bytes))});
    }
  return t;
}

json precision_json(const Precision& p) {
  return {{"cases", p.cases},
          {"passed", p.passed},
          {"failed", p.failed},
          {"skipped", p.skipped},
          {"worst_err_over_bound", std::isfinite(p.worst_ratio) ? json(p.worst_ratio) : json("inf")},
          {"worst", p.worst},
          {"impls", p.impls},
          {"failures", p.failures},
          {"seconds", p.seconds}};
}

json bench_json(const BenchRow& b, double copy_gbs) {
  json j = {{"label", b.label}, {"bytes", std::llround(b.bytes)}, {"flops", std::llround(b.flops)}};
  if (!b.ok()) {
    j[b.skipped ? "skipped" : "error"] = b.error;
    return j;
  }
  const double fl = floor_ms(b, copy_gbs);
  j["median_ms"] = b.timing.median_ms;
  j["min_ms"] = b.timing.min_ms;
  j["iters"] = b.timing.iters;
  j["gbs"] = gbs(b);
  j["copy_gbs"] = b.copy_gbs;
  j["tflops"] = b.flops > 0 ? json(b.flops / (b.timing.median_ms * 1e-3) / 1e12) : json(nullptr);
  j["floor_ms"] = fl;
  j["floor_ratio"] = b.timing.median_ms / fl;
  if (b.ratio_paired > 0) {
    j["copy_ratio_paired"] = b.ratio_paired;
    j["copy_ratio_best"] = b.ratio_best;
  }
  j["peak_bytes"] = b.peak_bytes;
  return j;
}

std::string device_line(const json& d) {
  if (d.contains("sm"))
    return fmt::format("{} ({}, {}, {} SMs, {} memory, {} L2)", d["device"].get<std::string>(),
                       d["name"].get<std::string>(), d["sm"].get<std::string>(), d["sms"].get<int>(),
                       format_bytes(d["memory_bytes"].get<double>()), format_bytes(d["l2_bytes"].get<double>()));
  return fmt::format("{} ({}, {} cores, {}, {} memory, {} LLC)", d["device"].get<std::string>(),
                     d["name"].get<std::string>(), d["cores"].get<int>(), d["kernel_isa"].get<std::string>(),
                     format_bytes(d["memory_bytes"].get<double>()), format_bytes(d["llc_bytes"].get<double>()));
}

void write_file(const std::filesystem::path& path, const std::string& text) {
  std::ofstream f(path);
  f << text;
  if (!f) throw std::runtime_error(fmt::format("cannot write {}", path.string()));
}

}  // namespace

int run_atk(const AtkOptions& o) {
  const strata_device device = resolve_device(o.device);
  const std::vector<std::unique_ptr<atk::OpHarness>> harnesses = select_harnesses(o.ops);
  const int iters = o.iters > 0 ? o.iters : (o.quick ? 5 : 20);
  const json dev = device_json(device);
  const json settings = settings_json();
  const std::string date = utc_now_iso();

  // Everything is listed before anything runs, so the bar knows its length.
  std::vector<std::vector<atk::Case>> cases;
  std::vector<std::vector<atk::BenchCase>> benches;
  int steps = o.perf ? 1 : 0;  // the copy
  for (const auto& h : harnesses) {
    cases.push_back(o.precision ? select_cases(h->conformance_cases(), o.quick) : std::vector<atk::Case>{});
    benches.push_back(o.perf ? h->bench_cases(device) : std::vector<atk::BenchCase>{});
    steps += static_cast<int>(cases.back().size() + benches.back().size());
  }

  fmt::print("strata {} {} on {}\n", o.command, strata_get_version_string(), device_line(dev));
  fmt::print("  {}; {} CPU threads, determinism {}; {} op{}{}{}\n", date, settings["threads"].get<int>(),
             settings["determinism"]["level"].get<int>(), harnesses.size(), harnesses.size() == 1 ? "" : "s",
             o.quick ? ", quick" : "",
             o.impl.empty() ? "" : fmt::format(", pinned to {}", o.impl));
  std::fflush(stdout);

  Progress bar(steps);
  double copy_gbs = 0, copy_bytes = 0;
  if (o.perf) {
    copy_bytes = copy_buffer_bytes(device, o.quick);
    bar.start(fmt::format("copy bandwidth, {} buffer", format_bytes(copy_bytes)));
    copy_gbs = atk::copy_bandwidth_gbs(device, static_cast<size_t>(copy_bytes));
    strata_memory_empty_cache(device);
    bar.advance();
    bar.print_line(fmt::format("  copy bandwidth {:.1f} GB/s (read + write, {} buffer)", copy_gbs,
                               format_bytes(copy_bytes)));
  }

  std::vector<OpRun> runs;
  for (size_t i = 0; i < harnesses.size(); ++i) {
    OpRun run;
    run.op = harnesses[i]->op();
    if (o.precision) {
      run.ran_precision = true;
      run.precision = run_precision(*harnesses[i], device, cases[i], o.impl, bar);
    }
    for (const auto& b : benches[i]) run.bench.push_back(run_bench(b, device, o, iters, bar));
    std::string line = fmt::format("  {:<28}", run.op);
    if (run.ran_precision)
      line += fmt::format(" precision {}: {}/{} pass, {} skipped, worst err/bound {}", precision_verdict(run.precision),
                          run.precision.passed, run.precision.cases, run.precision.skipped,
                          ratio_str(run.precision.worst_ratio));
    std::vector<std::string> bench;
    for (const auto& b : run.bench)
      bench.push_back(b.ok() ? fmt::format("{:.1f} GB/s", gbs(b)) : std::string(b.skipped ? "skipped" : "ERROR"));
    if (!bench.empty()) line += fmt::format("{}bench {}", run.ran_precision ? "; " : " ", fmt::join(bench, ", "));
    bar.print_line(line);
    runs.push_back(std::move(run));
  }
  bar.clear();

  int failed = 0, bench_errors = 0;
  for (const auto& r : runs) {
    failed += r.precision.failed;
    for (const auto& b : r.bench) bench_errors += !b.ok() && !b.skipped;
  }

  // ---- terminal ----
  if (o.precision) fmt::print("\nprecision (vs float64; a case passes when err <= bound)\n{}", precision_table(runs, false).text());
  for (const auto& r : runs) {
    for (size_t k = 0; k < r.precision.failures.size() && k < kFailuresShown; ++k)
      fmt::print("  FAIL {}\n", r.precision.failures[k]);
    if (r.precision.failures.size() > kFailuresShown)
      fmt::print("  ... {} more failures of {} (see the JSON report)\n", r.precision.failures.size() - kFailuresShown, r.op);
  }
  if (o.perf) {
    fmt::print("\nperformance (median of {} runs; floor = bytes / copy bandwidth measured alternately with each case; run start: {:.1f} GB/s{})\n{}", iters, copy_gbs,
               device.type == STRATA_DEVICE_CPU ? kPairedNote : "", perf_table(runs, copy_gbs).text());
    for (const auto& r : runs)
      for (const auto& b : r.bench)
        if (!b.ok()) fmt::print("  {} {}: {}\n", b.skipped ? "skipped" : "ERROR", b.label, b.error);
  }

  // ---- reports ----
  if (!o.out_dir.empty()) {
    const std::filesystem::path dir(o.out_dir);
    std::filesystem::create_directories(dir);
    json ops = json::array();
    for (const auto& r : runs) {
      json bench = json::array();
      for (const auto& b : r.bench) bench.push_back(bench_json(b, copy_gbs));
      ops.push_back({{"op", r.op}, {"precision", r.ran_precision ? precision_json(r.precision) : json(nullptr)},
                     {"bench", std::move(bench)}});
    }
    json report = {
        {"tool", "strata " + o.command},
        {"strata_version", strata_get_version_string()},
        {"date", date},
        {"build", build_json()},
        {"device", dev},
        {"settings", settings},
        {"options",
         {{"quick", o.quick}, {"iters", iters}, {"precision", o.precision}, {"perf", o.perf}, {"impl", o.impl},
          {"ops", o.ops}}},
        {"copy", o.perf ? json{{"bytes", std::llround(copy_bytes)}, {"gbs", copy_gbs}} : json(nullptr)},
        {"ops", std::move(ops)},
        {"result", {{"precision_failures", failed}, {"bench_errors", bench_errors}, {"pass", failed + bench_errors == 0}}}};
    write_file(dir / "atk.json", report.dump(2) + "\n");

    std::string md = fmt::format("# Strata {} report\n\n- strata {}, {}\n- device: {}\n- date: {}\n- {} CPU threads, "
                                 "determinism {}{}{}\n",
                                 o.command, strata_get_version_string(), build_json()["compiler"].get<std::string>(),
                                 device_line(dev), date, settings["threads"].get<int>(),
                                 settings["determinism"]["level"].get<int>(), o.quick ? ", quick run" : "",
                                 o.impl.empty() ? "" : fmt::format(", pinned to {}", o.impl));
    if (o.perf)
      md += fmt::format("- copy bandwidth: {:.1f} GB/s (read + write, {} buffer); floor = bytes / the copy bandwidth measured alternately with each case (column copy GB/s)\n",
                        copy_gbs, format_bytes(copy_bytes));
    if (o.precision) md += "\n## Precision (vs float64)\n\n" + precision_table(runs, true).markdown();
    if (o.perf)
      md += fmt::format("\n## Performance (median of {} runs{})\n\n", iters,
                        device.type == STRATA_DEVICE_CPU ? kPairedNote : "") +
            perf_table(runs, copy_gbs).markdown();
    std::string problems;
    for (const auto& r : runs) {
      for (const auto& f : r.precision.failures) problems += fmt::format("- FAIL `{}`\n", f);
      for (const auto& b : r.bench)
        if (!b.ok()) problems += fmt::format("- {} `{}`: {}\n", b.skipped ? "skipped" : "ERROR", b.label, b.error);
    }
    if (!problems.empty()) md += "\n## Failures and skips\n\n" + problems;
    write_file(dir / "atk.md", md);
    fmt::print("\nreport: {}, {}\n", (dir / "atk.json").string(), (dir / "atk.md").string());
  }

  const bool pass = failed == 0 && bench_errors == 0;
  fmt::print("{}: {} precision failure{}, {} bench error{}\n", pass ? "PASS" : "FAIL", failed, failed == 1 ? "" : "s",
             bench_errors, bench_errors == 1 ? "" : "s");
  return pass ? 0 : 1;
}

}  // namespace strata::cli
