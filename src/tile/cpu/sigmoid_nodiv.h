// Array entry points of the division-free sigmoids of tile/cpu/sigmoid_nodiv-inl.h, one per Highway target, so
// tests (tests/cpp/test_tile_sigmoid_nodiv.cpp) can check the exact code the rms_norm_gated and clipped_swiglu
// CPU kernels inline on every ISA: the one-vector form and the four-vector (step by step) form.
#pragma once

#include <cstdint>

#include "tile/cpu/fast_math.h"

namespace strata::tile {

// y[i] = sigmoid(x[i]) compiled for `hwy_target` (tile::cpu_isas()); nullptr if not compiled. out16: the
// SigmoidOut16NoDiv accuracy (else SigmoidLpNoDiv); four: the array form over four vectors per step.
FastMathArrayFn sigmoid_nodiv_for(int64_t hwy_target, bool out16, bool four);

}  // namespace strata::tile
