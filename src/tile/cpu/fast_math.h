// Array entry points of the vector exp / sigmoid of tile/cpu/math-inl.h, one per Highway target, so tests
// (tests/cpp/test_tile_fast_math.cpp) can check the exact code every kernel inlines on every ISA.
#pragma once

#include <cstdint>

namespace strata::tile {

using FastMathArrayFn = void (*)(const float* x, float* y, int64_t n);
// y[i] = exp(x[i]) / sigmoid(x[i]) compiled for `hwy_target` (tile::cpu_isas()); nullptr if not compiled.
FastMathArrayFn fast_exp_for(int64_t hwy_target);
FastMathArrayFn fast_sigmoid_for(int64_t hwy_target);
// The reduced-precision ExpLp / SigmoidLp (for bf16/f16 results), likewise.
FastMathArrayFn exp_lp_for(int64_t hwy_target);
FastMathArrayFn sigmoid_lp_for(int64_t hwy_target);
// FastExpNonPos (arguments <= 0 or NaN), likewise.
FastMathArrayFn exp_nonpos_for(int64_t hwy_target);
// ExpSum (softmax terms, arguments <= 0) and ScaledExpLp with factor 1 (bf16/f16 results, arguments <= 0), likewise.
FastMathArrayFn exp_sum_for(int64_t hwy_target);
FastMathArrayFn scaled_exp_lp_for(int64_t hwy_target);
// SigmoidOut16 (a sigmoid rounded straight to bf16/f16), likewise.
FastMathArrayFn sigmoid_out16_for(int64_t hwy_target);
// The four-vector forms of tile/cpu/exp_n-inl.h (FastExpN, ExpSumN, ScaledExpLpN with factor 1), likewise.
FastMathArrayFn fast_exp4_for(int64_t hwy_target);
FastMathArrayFn exp_sum4_for(int64_t hwy_target);
FastMathArrayFn scaled_exp_lp4_for(int64_t hwy_target);

}  // namespace strata::tile
