// CPU instruction sets as implementations: each op lists one CPU implementation per Highway target compiled
// into this build ("cpu.avx512", "cpu.avx2", "cpu.sse4", "cpu.scalar"), best first, so every ISA the host
// supports can be forced and tested (STYLE.md 6). Kernels are written once per op in a file that includes
// hwy/foreach_target.h; `hwy_table_entry` takes the function compiled for one target out of the table that
// HWY_EXPORT makes, instead of the process-wide HWY_DYNAMIC_DISPATCH choice.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace strata::tile {

struct CpuIsa {
  int64_t hwy_target;  // HWY_AVX3, HWY_AVX2, HWY_SSE4, HWY_SCALAR
  const char* name;    // "avx512", "avx2", "sse4", "scalar"
  const char* impl;    // "cpu.avx512", ...
};

// The ISAs this build compiles kernels for, best first.
const std::vector<CpuIsa>& cpu_isas();
// "" if the host can run `isa`, else why not.
std::string reject_cpu_isa(const CpuIsa& isa);
// The best ISA name the host supports ("avx512" on the development machine).
const char* best_cpu_isa_name();

// Whether the CPU has AVX512-BF16 (native f32 -> bf16 rounding); kernels that use it offer an extra
// implementation "cpu.avx512_bf16" (an AVX3 build of the kernel with that instruction).
bool cpu_has_avx512_bf16();
inline constexpr const char* kAvx512Bf16Impl = "cpu.avx512_bf16";

// Index, in a HWY_EXPORT table, of the function compiled for `target`; -1 if this translation unit did not
// compile that target. Must be expanded in the translation unit that owns the table (it reads HWY_TARGETS).
#define STRATA_HWY_TABLE_INDEX(target)                                                               \
  (((target) & HWY_TARGETS) == 0                                                                     \
       ? -1                                                                                          \
       : static_cast<int>(hwy::Num0BitsBelowLS1Bit_Nonzero64(static_cast<uint64_t>(                  \
             (((target) == HWY_SCALAR || (target) == HWY_EMU128) ? HWY_CHOSEN_TARGET_MASK_SCALAR      \
                                                                : HWY_CHOSEN_TARGET_SHIFT(target)) & \
             HWY_CHOSEN_TARGET_MASK_TARGETS))))

// Returns the entry of FUNC's HWY_EXPORT table compiled for `target`, or nullptr.
#define STRATA_HWY_FOR_TARGET(FUNC, target) \
  (STRATA_HWY_TABLE_INDEX(target) < 0 ? nullptr : HWY_DISPATCH_TABLE(FUNC)[STRATA_HWY_TABLE_INDEX(target)])

}  // namespace strata::tile
