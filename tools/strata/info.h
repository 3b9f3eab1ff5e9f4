// `strata info` (ARCHITECTURE.md §9): the version, the build, the devices, the process-wide settings, and for
// every registered op on every device the implementation dispatch picks here and why each candidate before
// it was rejected. The facts are gathered once into JSON; the text view renders that same JSON, and
// `strata atk` reuses the build and device parts for its report header.
#pragma once

#include <nlohmann/json.hpp>
#include <vector>

#include "strata/runtime.h"

namespace strata::cli {

nlohmann::ordered_json build_json();                       // CUDA yes/no, archs, compiler, build type, CPU kernel ISAs
nlohmann::ordered_json device_json(strata_device device);  // name, cores or SMs, ISA or sm_XY, memory, last-level cache
nlohmann::ordered_json settings_json();                    // determinism level, threads, STRATA_* environment
std::vector<strata_device> available_devices();    // the CPU, then every CUDA device that answers
nlohmann::ordered_json info_json();                        // all of the above plus versions and per-op dispatch
void print_info(const nlohmann::ordered_json& info);

}  // namespace strata::cli
