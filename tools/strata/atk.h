// `strata atk` and `strata bench` (ARCHITECTURE.md §6, §7, §9): for every op harness of the ATK, precision
// (its conformance cases on one device, with the implementation dispatch picks, against float64) and
// performance (its bench cases against the floor set by the copy bandwidth measured in the same run, with
// peak memory), printed as tables and written as DIR/atk.json and DIR/atk.md.
#pragma once

#include <string>
#include <vector>

namespace strata::cli {

struct AtkOptions {
  std::string command = "atk";   // the subcommand, for the report's title
  std::string device = "auto";   // cpu, cuda, cuda:N, auto (cuda when a GPU answers, else cpu)
  std::vector<std::string> ops;  // harness names or op families ("l2norm" = l2norm_fwd + l2norm_bwd); empty: all
  std::string out_dir;           // where atk.json and atk.md go; empty: no files
  std::string impl;              // implementation to pin (as STRATA_FORCE_IMPL); empty: dispatch picks
  bool quick = false;            // a fixed subset of the conformance cases, fewer timed iterations
  int iters = 0;                 // timed iterations per bench case; 0: 20 (5 with quick)
  bool precision = true;
  bool perf = true;
};

// Returns the process exit code: 0 when every precision case passed and every bench case ran, else 1.
// Throws std::invalid_argument for a bad device or op name.
int run_atk(const AtkOptions& options);

}  // namespace strata::cli
