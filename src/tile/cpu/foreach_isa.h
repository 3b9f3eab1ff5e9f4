// Include instead of <hwy/foreach_target.h> (after defining HWY_TARGET_INCLUDE, before any other Highway
// header) to compile a kernel file for exactly the Highway targets that tile::cpu_isas() names: AVX3, AVX2,
// SSE4 and the scalar fallback. Highway 1.0 on x86 also builds HWY_SSSE3 by default, which no CPU
// implementation list offers (STRATA_HWY_FOR_TARGET is only ever asked for the cpu_isas() targets), so it
// was a fifth of every such file's compile time for code nothing can reach.
//
// Every translation unit that shares per-target functions with another (a kernel split into several units,
// see ops/norm/common/row_norm_cpu-inl.h) must use this header in all of them: the target sets must match,
// or the link fails with the missing target's symbols.
#ifndef HWY_DISABLED_TARGETS
#define HWY_DISABLED_TARGETS HWY_SSSE3
#endif
#include <hwy/foreach_target.h>  // IWYU pragma: export
