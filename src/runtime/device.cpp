// Devices: enumeration, properties, and the device checks the layers above use.
//
// CPU properties are read once: the name from /proc/cpuinfo, cores as hardware threads, the SIMD ISA as
// the best Highway target the host runs, memory from sysconf, the last-level cache from sysconf with
// /sys as the fallback, and a UUID hashed from /etc/machine-id (stable across boots, all zeros without it).
#include <hwy/targets.h>
#include <unistd.h>

#include <cstring>
#include <fstream>
#include <string>
#include <thread>

#include "runtime/cuda_backend.h"
#include "runtime/error.h"
#include "runtime/runtime_internal.h"

namespace strata::rt {
namespace {

std::string trim(const std::string& s) {
  const size_t b = s.find_first_not_of(" \t\r\n");
  if (b == std::string::npos) return {};
  return s.substr(b, s.find_last_not_of(" \t\r\n") - b + 1);
}

std::string read_line(const std::string& path) {
  std::ifstream in(path);
  std::string line;
  std::getline(in, line);
  return trim(line);
}

std::string cpu_name() {
  std::ifstream in("/proc/cpuinfo");
  for (std::string line; std::getline(in, line);) {
    if (line.rfind("model name", 0) != 0) continue;
    const size_t colon = line.find(':');
    if (colon != std::string::npos) return trim(line.substr(colon + 1));
  }
  return "unknown CPU";  // e.g. Arm kernels do not report a model name
}

std::string cpu_isa() {
  const int64_t targets = hwy::SupportedTargets();
  std::string isa = (targets & (HWY_AVX3 | HWY_AVX3_DL)) ? "avx512"
                    : (targets & HWY_AVX2)               ? "avx2"
                    : (targets & HWY_SSE4)               ? "sse4"
                                                         : "generic";
#if defined(__x86_64__) || defined(__i386__)
  // Extensions Highway 1.0 has no target for, which bf16 kernels care about.
  if (__builtin_cpu_supports("avx512bf16")) isa += ",avx512_bf16";
  if (__builtin_cpu_supports("amx-tile")) isa += ",amx";
#endif
  return isa;
}

// "32768K" / "2M" / "1048576" as /sys prints cache sizes.
uint64_t parse_cache_size(const std::string& text) {
  if (text.empty()) return 0;
  size_t end = 0;
  uint64_t value = 0;
  try {
    value = std::stoull(text, &end);
  } catch (const std::exception&) {
    return 0;
  }
  const char unit = end < text.size() ? text[end] : '\0';
  if (unit == 'K') return value << 10;
  if (unit == 'M') return value << 20;
  if (unit == 'G') return value << 30;
  return value;
}

uint64_t cpu_llc_bytes() {
  const long l3 = sysconf(_SC_LEVEL3_CACHE_SIZE);
  if (l3 > 0) return static_cast<uint64_t>(l3);
  // sysconf answers 0 on some kernels and libcs: take the highest-level cache /sys lists for cpu0.
  uint64_t bytes = 0;
  int best_level = 0;
  for (int i = 0;; ++i) {
    const std::string dir = "/sys/devices/system/cpu/cpu0/cache/index" + std::to_string(i) + "/";
    const std::string level = read_line(dir + "level");
    if (level.empty()) break;
    const int lv = std::atoi(level.c_str());
    if (lv >= best_level && read_line(dir + "type") != "Instruction") {
      best_level = lv;
      bytes = parse_cache_size(read_line(dir + "size"));
    }
  }
  return bytes;
}

// Two FNV-1a hashes with different offset bases: stable across runs and builds, unlike std::hash.
void machine_uuid(uint8_t out[16]) {
  std::memset(out, 0, 16);
  const std::string id = read_line("/etc/machine-id");
  if (id.empty()) return;
  // Hashed rather than copied: the machine id is meant to stay private to the host.
  const std::string text = "strata-cpu:" + id;
  const uint64_t bases[2] = {0xcbf29ce484222325ull, 0x84222325cbf29ce4ull};
  for (int half = 0; half < 2; ++half) {
    uint64_t h = bases[half];
    for (const unsigned char c : text) h = (h ^ c) * 0x100000001b3ull;
    for (int i = 0; i < 8; ++i) out[half * 8 + i] = static_cast<uint8_t>(h >> (8 * i));
  }
}

const strata_device_properties& cpu_properties() {
  static const strata_device_properties props = [] {
    strata_device_properties p{};
    const std::string name = cpu_name();
    std::strncpy(p.name, name.c_str(), sizeof(p.name) - 1);
    machine_uuid(p.uuid);
    p.multiprocessor_count = static_cast<int32_t>(std::max(1u, std::thread::hardware_concurrency()));
    const std::string isa = cpu_isa();
    std::strncpy(p.isa, isa.c_str(), sizeof(p.isa) - 1);
    const long pages = sysconf(_SC_PHYS_PAGES), page_size = sysconf(_SC_PAGESIZE);
    p.total_memory = pages > 0 && page_size > 0 ? static_cast<uint64_t>(pages) * static_cast<uint64_t>(page_size) : 0;
    p.l2_cache_bytes = cpu_llc_bytes();
    return p;
  }();
  return props;
}

}  // namespace

strata_status check_device(strata_device device, const char* what) {
  if (device.type == STRATA_DEVICE_CPU) {
    if (device.index == 0) return STRATA_SUCCESS;
    return fail(STRATA_ERROR_INVALID_DEVICE, "{}: device {} does not exist (the CPU device has index 0)", what,
                device_str(device));
  }
  if (device.type != STRATA_DEVICE_CUDA) {
    return fail(STRATA_ERROR_INVALID_DEVICE, "{}: device type {} is not a strata_device_type (0 = cpu, 1 = cuda)", what,
                device.type);
  }
  if (!strata_built_with_cuda()) {
    return fail(STRATA_ERROR_DEVICE_UNAVAILABLE, "{}: device {} is unavailable: Strata was built without CUDA", what,
                device_str(device));
  }
  const int count = cuda::device_count();
  if (count == 0) {
    return fail(STRATA_ERROR_DEVICE_UNAVAILABLE, "{}: device {} is unavailable: no CUDA device answers ({})", what,
                device_str(device), cuda::unavailable_reason());
  }
  if (device.index < 0 || device.index >= count) {
    return fail(STRATA_ERROR_INVALID_DEVICE, "{}: device {} does not exist ({} CUDA device{})", what,
                device_str(device), count, count == 1 ? "" : "s");
  }
  return STRATA_SUCCESS;
}

std::string device_str(strata_device device) {
  switch (device.type) {
    case STRATA_DEVICE_CPU:
      return device.index == 0 ? "cpu" : fmt::format("cpu:{}", device.index);
    case STRATA_DEVICE_CUDA:
      return fmt::format("cuda:{}", device.index);
  }
  return fmt::format("device(type={}, index={})", device.type, device.index);
}

int cuda_sm_version(int device_index) {
  if (device_index < 0 || device_index >= cuda::device_count()) return 0;
  return cuda::sm_version(device_index);
}

strata_status cuda_set_device(int device_index) {
  if (!strata_built_with_cuda()) return STRATA_SUCCESS;
  STRATA_RETURN_IF_ERROR(check_device({STRATA_DEVICE_CUDA, device_index}, "cuda_set_device"));
  return cuda::set_device(device_index, "cuda_set_device");
}

}  // namespace strata::rt

using namespace strata;
using namespace strata::rt;

extern "C" {

int32_t strata_built_with_cuda(void) {
#if STRATA_WITH_CUDA
  return 1;
#else
  return 0;
#endif
}

strata_status strata_device_count(int32_t type, int32_t* count) {
  if (count == nullptr) return fail(STRATA_ERROR_NULL_POINTER, "strata_device_count: count (the output) is NULL");
  switch (type) {
    case STRATA_DEVICE_CPU:
      *count = 1;
      return STRATA_SUCCESS;
    case STRATA_DEVICE_CUDA:
      *count = cuda::device_count();
      return STRATA_SUCCESS;
  }
  return fail(STRATA_ERROR_INVALID_DEVICE,
              "strata_device_count: type {} is not a strata_device_type (0 = cpu, 1 = cuda)", type);
}

strata_status strata_device_get_properties(strata_device device, strata_device_properties* props) {
  if (props == nullptr) {
    return fail(STRATA_ERROR_NULL_POINTER, "strata_device_get_properties: props (the output) is NULL");
  }
  STRATA_RETURN_IF_ERROR(check_device(device, "strata_device_get_properties"));
  if (device.type == STRATA_DEVICE_CPU) {
    *props = cpu_properties();
    return STRATA_SUCCESS;
  }
  return cuda::get_properties(device.index, props, "strata_device_get_properties");
}

}  // extern "C"
