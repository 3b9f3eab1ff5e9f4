// Strata operators: fused_cross_entropy (C++ API, one function per op). Included by strata/strata.hpp, inside nothing:
// opens namespace strata itself and uses Tensor, Plan, Stream and check from strata.hpp.
#pragma once

#include <cstdint>
#include <vector>

#include "strata/strata.hpp"  // Tensor, Plan, Stream, check (a no-op when strata.hpp includes this file)

namespace strata {

// Options of fused_cross_entropy (ops.h / strata/ops/fused_cross_entropy.h document the math).
struct CrossEntropyOptions {
  strata_loss_reduction reduction = STRATA_LOSS_REDUCTION_MEAN;
  int64_t ignore_index = -100;
  float label_smoothing = 0.f;
  float logit_scale = 1.f;
  float lse_square_scale = 0.f;  // z-loss coefficient
  float softcap = 0.f;           // 0: off
};

struct CrossEntropyResult {
  Tensor loss;    // [] (mean, sum) or [N] (none), f32 (f64 for f64 logits)
  Tensor lse;     // [N]
  Tensor z_loss;  // like loss
};

// Forward. grad: nullptr (loss only), a [N, V] tensor of logits' dtype to receive d(grad_scale * loss)/dlogits,
// or &logits itself (in place: the logits are overwritten by their gradient).
inline CrossEntropyResult fused_cross_entropy_fwd(const Tensor& logits, const Tensor& target,
                                                  const CrossEntropyOptions& o = {}, const Tensor* grad = nullptr,
                                                  float grad_scale = 1.f, const Stream* s = nullptr) {
  const int32_t sd = logits.dtype() == STRATA_DTYPE_F64 ? STRATA_DTYPE_F64 : STRATA_DTYPE_F32;
  const int64_t N = logits.size(0);
  const std::vector<int64_t> ls = o.reduction == STRATA_LOSS_REDUCTION_NONE ? std::vector<int64_t>{N}
                                                                           : std::vector<int64_t>{};
  CrossEntropyResult r{Tensor::empty(sd, ls, logits.device()), Tensor::empty(sd, {N}, logits.device()),
                       Tensor::empty(sd, ls, logits.device())};
  strata_plan p = nullptr;
  check(strata_fused_cross_entropy_fwd_plan(&logits.desc(), &target.desc(), &r.loss.desc(), &r.lse.desc(),
                                            &r.z_loss.desc(), grad ? &grad->desc() : nullptr, o.reduction,
                                            o.ignore_index, o.label_smoothing, o.logit_scale, o.lse_square_scale,
                                            o.softcap, grad_scale, &p));
  Plan(p).run({logits.data(), target.data(), r.loss.data(), r.lse.data(), r.z_loss.data(),
               grad ? grad->data() : nullptr},
              logits.device(), s);
  return r;
}

// Backward from the saved lse: returns dlogits (or writes it into *out, which may be &logits: in place).
inline Tensor fused_cross_entropy_bwd(const Tensor& logits, const Tensor& target, const Tensor& lse,
                                      const Tensor& dloss, const CrossEntropyOptions& o = {},
                                      const Tensor* out = nullptr, const Stream* s = nullptr) {
  Tensor dl = out ? *out : Tensor::empty(logits.dtype(), logits.shape(), logits.device());
  strata_plan p = nullptr;
  check(strata_fused_cross_entropy_bwd_plan(&logits.desc(), &target.desc(), &lse.desc(), &dloss.desc(), &dl.desc(),
                                            o.reduction, o.ignore_index, o.label_smoothing, o.logit_scale,
                                            o.lse_square_scale, o.softcap, &p));
  Plan(p).run({logits.data(), target.data(), lse.data(), dloss.data(), dl.data()}, logits.device(), s);
  return dl;
}

}  // namespace strata
