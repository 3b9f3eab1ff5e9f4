// Array entry points of the sigmoids of tile/cpu/sigmoid_rcp-inl.h, one per Highway target, so that
// tests/cpp/test_tile_sigmoid_rcp.cpp checks the exact code the kernels inline on every ISA.
#pragma once

#include "tile/cpu/fast_math.h"

namespace strata::tile {

// y[i] = SigmoidLpRcp(x[i]) / SigmoidOut16Rcp(x[i]) compiled for `hwy_target` (tile::cpu_isas()); nullptr if not
// compiled.
FastMathArrayFn sigmoid_lp_rcp_for(int64_t hwy_target);
FastMathArrayFn sigmoid_out16_rcp_for(int64_t hwy_target);

}  // namespace strata::tile
