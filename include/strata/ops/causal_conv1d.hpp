// Strata operators: causal_conv1d (C++ API, one function per op). Included by strata/strata.hpp, inside nothing:
// opens namespace strata itself and uses Tensor, Plan, Stream and check from strata.hpp.
#pragma once

#include <tuple>

#include "strata/strata.hpp"  // Tensor, Plan, Stream, check (a no-op when strata.hpp includes this file)

namespace strata {

// Options of causal_conv1d (strata/ops/causal_conv1d.h documents the math and the tensors).
struct CausalConv1dOptions {
  bool silu = true;               // activation: SiLU (true) or none
  int32_t weight_layout = 0;      // 0: weight [D, W]; 1: weight [W, D]
  bool output_final_state = false;
  int32_t state_dtype = -1;       // final_state dtype; -1: initial_state's, else x's
};

// Returns {y [B, T, D], final_state [N, D, W-1] (empty unless output_final_state)}. bias, residual,
// initial_state, cu_seqlens (int32/int64 [N+1], B = 1) and seq_idx (int32/int64 [B, T]) may be nullptr.
inline std::pair<Tensor, Tensor> causal_conv1d_fwd(const Tensor& x, const Tensor& weight, const Tensor* bias = nullptr,
                                                   const Tensor* residual = nullptr,
                                                   const Tensor* initial_state = nullptr,
                                                   const Tensor* cu_seqlens = nullptr, const Tensor* seq_idx = nullptr,
                                                   const CausalConv1dOptions& o = {}, const Stream* s = nullptr) {
  const int64_t D = x.size(-1), W = weight.size(o.weight_layout == 0 ? 1 : 0);
  const int64_t N = cu_seqlens ? cu_seqlens->size(0) - 1 : x.size(0);
  Tensor y = Tensor::empty(x.dtype(), x.shape(), x.device());
  Tensor hT;
  if (o.output_final_state)
    hT = Tensor::empty(o.state_dtype >= 0 ? o.state_dtype : (initial_state ? initial_state->dtype() : x.dtype()),
                       {N, D, W - 1}, x.device());
  strata_plan p = nullptr;
  check(strata_causal_conv1d_fwd_plan(&x.desc(), &weight.desc(), bias ? &bias->desc() : nullptr,
                                      residual ? &residual->desc() : nullptr,
                                      initial_state ? &initial_state->desc() : nullptr,
                                      cu_seqlens ? &cu_seqlens->desc() : nullptr, seq_idx ? &seq_idx->desc() : nullptr,
                                      &y.desc(), o.output_final_state ? &hT.desc() : nullptr, o.silu ? 1 : 0,
                                      o.weight_layout, &p));
  Plan(p).run({x.data(), weight.data(), bias ? bias->data() : nullptr, residual ? residual->data() : nullptr,
               initial_state ? initial_state->data() : nullptr, cu_seqlens ? cu_seqlens->data() : nullptr,
               seq_idx ? seq_idx->data() : nullptr, y.data(), o.output_final_state ? hT.data() : nullptr},
              x.device(), s);
  return {std::move(y), std::move(hT)};
}

// Returns {dx, dweight (weight's layout and dtype), dbias (empty without bias), dinitial_state (empty without
// initial_state)}. dfinal_state may be nullptr (zero); the residual's gradient is dy itself.
inline std::tuple<Tensor, Tensor, Tensor, Tensor> causal_conv1d_bwd(
    const Tensor& x, const Tensor& weight, const Tensor* bias, const Tensor* initial_state,
    const Tensor* cu_seqlens, const Tensor* seq_idx, const Tensor& dy, const Tensor* dfinal_state,
    const CausalConv1dOptions& o = {}, const Stream* s = nullptr) {
  Tensor dx = Tensor::empty(x.dtype(), x.shape(), x.device());
  Tensor dw = Tensor::empty(weight.dtype(), weight.shape(), x.device());
  Tensor db, dh0;
  if (bias) db = Tensor::empty(bias->dtype(), bias->shape(), x.device());
  if (initial_state) dh0 = Tensor::empty(initial_state->dtype(), initial_state->shape(), x.device());
  strata_plan p = nullptr;
  check(strata_causal_conv1d_bwd_plan(
      &x.desc(), &weight.desc(), bias ? &bias->desc() : nullptr, initial_state ? &initial_state->desc() : nullptr,
      cu_seqlens ? &cu_seqlens->desc() : nullptr, seq_idx ? &seq_idx->desc() : nullptr, &dy.desc(),
      dfinal_state ? &dfinal_state->desc() : nullptr, &dx.desc(), &dw.desc(), bias ? &db.desc() : nullptr,
      initial_state ? &dh0.desc() : nullptr, o.silu ? 1 : 0, o.weight_layout, &p));
  Plan(p).run({x.data(), weight.data(), bias ? bias->data() : nullptr, initial_state ? initial_state->data() : nullptr,
               cu_seqlens ? cu_seqlens->data() : nullptr, seq_idx ? seq_idx->data() : nullptr, dy.data(),
               dfinal_state ? dfinal_state->data() : nullptr, dx.data(), dw.data(), bias ? db.data() : nullptr,
               initial_state ? dh0.data() : nullptr},
              x.device(), s);
  return {std::move(dx), std::move(dw), std::move(db), std::move(dh0)};
}

}  // namespace strata
