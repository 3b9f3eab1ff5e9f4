// Strata operators: clipped_swiglu (C++ API, one function per op). Included by strata/strata.hpp, inside nothing:
// opens namespace strata itself and uses Tensor, Plan, Stream and check from strata.hpp.
#pragma once

#include <utility>

#include "strata/strata.hpp"  // Tensor, Plan, Stream, check (a no-op when strata.hpp includes this file)

namespace strata {

// Constants of clipped_swiglu: GPT-OSS by default; DeepSeek-V4 is {1.0f, 10.0f, 0.0f, false}.
struct ClippedSwigluOptions {
  float alpha = 1.702f, limit = 7.0f, bias = 1.0f;
  bool interleaved = true;
};

// x [..., 2I] -> y [..., I]; probs [...] (per-row multiplier) or nullptr.
inline Tensor clipped_swiglu_fwd(const Tensor& x, const Tensor* probs = nullptr, const ClippedSwigluOptions& o = {},
                                 const Stream* s = nullptr) {
  std::vector<int64_t> ys = x.shape();
  ys.back() /= 2;
  Tensor y = Tensor::empty(x.dtype(), ys, x.device());
  strata_plan p = nullptr;
  check(strata_clipped_swiglu_fwd_plan(&x.desc(), probs ? &probs->desc() : nullptr, &y.desc(), o.alpha, o.limit,
                                       o.bias, o.interleaved ? 1 : 0, &p));
  Plan(p).run({x.data(), probs ? probs->data() : nullptr, y.data()}, x.device(), s);
  return y;
}

// Returns {dx [..., 2I], dprobs (empty without probs)}.
inline std::pair<Tensor, Tensor> clipped_swiglu_bwd(const Tensor& x, const Tensor* probs, const Tensor& dy,
                                                    const ClippedSwigluOptions& o = {}, const Stream* s = nullptr) {
  Tensor dx = Tensor::empty(x.dtype(), x.shape(), x.device());
  Tensor dp;
  if (probs) dp = Tensor::empty(probs->dtype(), probs->shape(), x.device());
  strata_plan p = nullptr;
  check(strata_clipped_swiglu_bwd_plan(&x.desc(), probs ? &probs->desc() : nullptr, &dy.desc(), &dx.desc(),
                                       probs ? &dp.desc() : nullptr, o.alpha, o.limit, o.bias, o.interleaved ? 1 : 0,
                                       &p));
  Plan(p).run({x.data(), probs ? probs->data() : nullptr, dy.data(), dx.data(), probs ? dp.data() : nullptr},
              x.device(), s);
  return {std::move(dx), std::move(dp)};
}

}  // namespace strata
