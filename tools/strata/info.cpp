#include "info.h"

#include <fmt/format.h>

#include <cstdlib>
#include <string>

#include "opbase/plan.h"
#include "report.h"
#include "runtime/runtime_internal.h"
#include "tile/cpu/isa.h"

namespace strata::cli {
namespace {

using json = nlohmann::ordered_json;

std::string uuid_hex(const uint8_t (&uuid)[16]) {
  std::string s;
  for (int i = 0; i < 16; ++i) s += fmt::format("{:02x}{}", uuid[i], (i == 3 || i == 5 || i == 7 || i == 9) ? "-" : "");
  return s;
}

const char* determinism_meaning(int level) {
  switch (level) {
    case 0: return "off";
    case 1: return "deterministic: same inputs give the same bits run to run";
    case 2: return "batch-invariant: a row's result does not depend on the batch or thread count";
  }
  return "?";
}

// Why no CUDA device is listed: the runtime's own message for cuda:0.
std::string cuda_unavailable_reason() {
  if (!strata_built_with_cuda()) return "Strata was built without CUDA";
  strata_device_properties p{};
  if (strata_device_get_properties({STRATA_DEVICE_CUDA, 0}, &p) == STRATA_SUCCESS) return "";
  return strata_get_last_error_message();
}

// The probe plan of `op` on `device`: the problem, the pick, and every candidate's verdict.
json dispatch_json(const OpInfo& op, strata_device device) {
  json d = {{"device", rt::device_str(device)}};
  strata_plan handle = nullptr;
  if (op.probe(device, &handle) != STRATA_SUCCESS) {
    d["error"] = strata_get_last_error_message();
    return d;
  }
  const Plan* plan = plan_from_handle(handle);
  d["problem"] = plan->summary;
  d["chosen"] = plan->impl;
  d["workspace_bytes"] = plan->workspace;
  json verdicts = json::array();
  for (const auto& v : plan->verdicts)
    verdicts.push_back({{"impl", v.impl}, {"reason", v.reason.empty() ? json(nullptr) : json(v.reason)}});
  d["verdicts"] = std::move(verdicts);
  strata_plan_destroy(handle);
  return d;
}

}  // namespace

json build_json() {
  json b;
  b["cuda"] = strata_built_with_cuda() == 1;
  b["cuda_archs"] = strata_built_with_cuda() ? json(STRATA_CLI_CUDA_ARCHS) : json(nullptr);
  b["cuda_compiler"] = strata_built_with_cuda() ? json(STRATA_CLI_CUDA_COMPILER) : json(nullptr);
  b["compiler"] = STRATA_CLI_CXX_COMPILER;
  b["build_type"] = STRATA_CLI_BUILD_TYPE;
  json isas = json::array();
  for (const auto& isa : tile::cpu_isas()) isas.push_back(isa.name);
  b["cpu_kernel_isas"] = std::move(isas);
  return b;
}

json device_json(strata_device device) {
  strata_device_properties p{};
  if (strata_device_get_properties(device, &p) != STRATA_SUCCESS)
    throw std::runtime_error(strata_get_last_error_message());
  json d = {{"device", rt::device_str(device)}, {"name", p.name}, {"uuid", uuid_hex(p.uuid)}};
  if (device.type == STRATA_DEVICE_CPU) {
    d["cores"] = p.multiprocessor_count;
    d["isa"] = p.isa;                              // what the host has, extensions included
    d["kernel_isa"] = tile::best_cpu_isa_name();  // what the CPU kernels dispatch to
    d["memory_bytes"] = p.total_memory;
    d["llc_bytes"] = p.l2_cache_bytes;
  } else {
    d["sms"] = p.multiprocessor_count;
    d["sm"] = fmt::format("sm_{}{}", p.sm_major, p.sm_minor);
    d["memory_bytes"] = p.total_memory;
    d["l2_bytes"] = p.l2_cache_bytes;
  }
  return d;
}

json settings_json() {
  json s;
  const int level = strata_get_determinism();
  s["determinism"] = {{"level", level}, {"meaning", determinism_meaning(level)}};
  s["threads"] = strata_get_num_threads();
  json env = json::object();
  for (const char* name : {"STRATA_FORCE_IMPL", "STRATA_VERBOSE", "STRATA_DETERMINISM", "OMP_NUM_THREADS",
                           "CUDA_VISIBLE_DEVICES"})
    if (const char* v = std::getenv(name)) env[name] = v;
  s["environment"] = std::move(env);
  return s;
}

std::vector<strata_device> available_devices() {
  std::vector<strata_device> out = {{STRATA_DEVICE_CPU, 0}};
  int32_t n = 0;
  if (strata_device_count(STRATA_DEVICE_CUDA, &n) == STRATA_SUCCESS)
    for (int32_t i = 0; i < n; ++i) out.push_back({STRATA_DEVICE_CUDA, i});
  return out;
}

json info_json() {
  json info;
  info["version"] = {{"string", strata_get_version_string()}, {"number", strata_get_version()}};
  info["build"] = build_json();
  const std::vector<strata_device> devices = available_devices();
  json devs = json::array();
  for (const auto& d : devices) devs.push_back(device_json(d));
  info["devices"] = std::move(devs);
  if (devices.size() == 1) info["cuda_unavailable"] = cuda_unavailable_reason();
  info["settings"] = settings_json();
  json ops = json::array();
  for (const auto& op : registered_ops()) {
    json o = {{"op", op.name}, {"implementations", op.impl_names()}};
    json per_device = json::array();
    for (const auto& d : devices) per_device.push_back(dispatch_json(op, d));
    o["dispatch"] = std::move(per_device);
    ops.push_back(std::move(o));
  }
  info["ops"] = std::move(ops);
  return info;
}

void print_info(const json& info) {
  fmt::print("strata {} ({})\n", info["version"]["string"].get<std::string>(), info["version"]["number"].get<int>());

  const json& b = info["build"];
  const auto isas = b["cpu_kernel_isas"].get<std::vector<std::string>>();
  fmt::print("build     {} {}; CUDA {}; CPU kernels for {}\n", b["compiler"].get<std::string>(),
             b["build_type"].get<std::string>(),
             b["cuda"].get<bool>() ? fmt::format("yes (archs {}, {})", b["cuda_archs"].get<std::string>(),
                                                 b["cuda_compiler"].get<std::string>())
                                   : std::string("no"),
             fmt::join(isas, ", "));

  const json& s = info["settings"];
  fmt::print("settings  determinism {} ({}); {} CPU threads\n", s["determinism"]["level"].get<int>(),
             s["determinism"]["meaning"].get<std::string>(), s["threads"].get<int>());
  for (const auto& [k, v] : s["environment"].items()) fmt::print("          {}={}\n", k, v.get<std::string>());

  fmt::print("devices\n");
  for (const auto& d : info["devices"]) {
    if (d["device"] == "cpu") {
      fmt::print("  cpu     {}: {} cores, {} (kernels use {}), {} memory, {} last-level cache\n",
                 d["name"].get<std::string>(), d["cores"].get<int>(), d["isa"].get<std::string>(),
                 d["kernel_isa"].get<std::string>(), format_bytes(d["memory_bytes"].get<double>()),
                 format_bytes(d["llc_bytes"].get<double>()));
    } else {
      fmt::print("  {:<7} {}: {}, {} SMs, {} memory, {} L2\n", d["device"].get<std::string>(),
                 d["name"].get<std::string>(), d["sm"].get<std::string>(), d["sms"].get<int>(),
                 format_bytes(d["memory_bytes"].get<double>()), format_bytes(d["l2_bytes"].get<double>()));
    }
  }
  if (info.contains("cuda_unavailable"))
    fmt::print("  cuda    none: {}\n", info["cuda_unavailable"].get<std::string>());

  // Candidates after the chosen one were never asked, so they are listed as not tried, not as rejected.
  fmt::print("ops       the implementation each op picks here for a representative problem; x = rejected, why\n");
  for (const auto& o : info["ops"]) {
    for (const auto& d : o["dispatch"]) {
      const std::string head = fmt::format("  {} on {}", o["op"].get<std::string>(), d["device"].get<std::string>());
      if (d.contains("error")) {
        fmt::print("{}: no implementation: {}\n", head, d["error"].get<std::string>());
        continue;
      }
      fmt::print("{} -> {}   ({})\n", head, d["chosen"].get<std::string>(), d["problem"].get<std::string>());
      std::vector<std::string> not_tried;
      bool after_chosen = false;
      for (const auto& v : d["verdicts"]) {
        if (v["reason"].is_null()) {
          after_chosen = true;
        } else if (after_chosen) {
          not_tried.push_back(v["impl"].get<std::string>());
        } else {
          fmt::print("      x {}: {}\n", v["impl"].get<std::string>(), v["reason"].get<std::string>());
        }
      }
      if (!not_tried.empty()) fmt::print("      not tried: {}\n", fmt::join(not_tried, ", "));
    }
  }
}

}  // namespace strata::cli
