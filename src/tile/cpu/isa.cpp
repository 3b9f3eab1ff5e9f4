#include "tile/cpu/isa.h"

#include <fmt/format.h>
#include <hwy/highway.h>
#include <hwy/targets.h>

namespace strata::tile {

const std::vector<CpuIsa>& cpu_isas() {
  static const std::vector<CpuIsa> isas = {
      {HWY_AVX3, "avx512", "cpu.avx512"},
      {HWY_AVX2, "avx2", "cpu.avx2"},
      {HWY_SSE4, "sse4", "cpu.sse4"},
      // The portable fallback: HWY_SCALAR, or HWY_EMU128 where the compiler builds it (g++ 13).
      {(HWY_TARGETS & HWY_EMU128) ? HWY_EMU128 : HWY_SCALAR, "scalar", "cpu.scalar"},
  };
  return isas;
}

std::string reject_cpu_isa(const CpuIsa& isa) {
  if (isa.hwy_target == HWY_SCALAR || isa.hwy_target == HWY_EMU128) return {};
  if ((hwy::SupportedTargets() & isa.hwy_target) == 0) return fmt::format("this CPU lacks {}", isa.name);
  return {};
}

bool cpu_has_avx512_bf16() {
  static const bool has = __builtin_cpu_supports("avx512bf16") && (hwy::SupportedTargets() & HWY_AVX3);
  return has;
}

const char* best_cpu_isa_name() {
  for (const auto& isa : cpu_isas())
    if (reject_cpu_isa(isa).empty()) return isa.name;
  return "scalar";
}

}  // namespace strata::tile
