// Strata operators: rms_norm_gated (C++ API, one function per op). Included by strata/strata.hpp, inside nothing:
// opens namespace strata itself and uses Tensor, Plan, Stream and check from strata.hpp.
#pragma once

#include <tuple>

#include "strata/strata.hpp"  // Tensor, Plan, Stream, check (a no-op when strata.hpp includes this file)

namespace strata {

// Options of rms_norm_gated (ops.h / strata/ops/rms_norm_gated.h documents the math).
struct RmsNormGatedOptions {
  float eps = 1e-6f;
  int64_t group_size = 0;        // 0: one group of D
  bool norm_before_gate = true;  // fla / GDN; false: Mamba2
  strata_gate_act activation = STRATA_GATE_SILU;
  bool prenorm = false;          // also return residual_out = x (+ residual)
  int32_t residual_out_dtype = -1;  // -1: residual's dtype (x's without a residual); STRATA_DTYPE_F32 for fp32 streams
};

// Returns {y, rstd [..., D / G] f32, residual_out (empty unless prenorm)}. weight, bias, residual may be nullptr.
inline std::tuple<Tensor, Tensor, Tensor> rms_norm_gated_fwd(const Tensor& x, const Tensor& z, const Tensor* weight,
                                                             const Tensor* bias, const Tensor* residual,
                                                             const RmsNormGatedOptions& o = {},
                                                             const Stream* s = nullptr) {
  const int64_t D = x.size(-1), G = o.group_size == 0 ? D : o.group_size;
  std::vector<int64_t> rs = detail::drop_last(x, false);
  rs.push_back(G > 0 ? D / G : 0);
  Tensor y = Tensor::empty(x.dtype(), x.shape(), x.device());
  Tensor rstd = Tensor::empty(detail::saved_dtype(x), rs, x.device());
  Tensor ro;
  if (o.prenorm)
    ro = Tensor::empty(o.residual_out_dtype >= 0 ? o.residual_out_dtype : (residual ? residual->dtype() : x.dtype()),
                       x.shape(), x.device());
  strata_plan p = nullptr;
  check(strata_rms_norm_gated_fwd_plan(&x.desc(), &z.desc(), weight ? &weight->desc() : nullptr,
                                       bias ? &bias->desc() : nullptr, residual ? &residual->desc() : nullptr,
                                       &y.desc(), o.prenorm ? &ro.desc() : nullptr, &rstd.desc(), o.eps, o.group_size,
                                       o.norm_before_gate ? 1 : 0, o.activation, &p));
  Plan(p).run({x.data(), z.data(), weight ? weight->data() : nullptr, bias ? bias->data() : nullptr,
               residual ? residual->data() : nullptr, y.data(), o.prenorm ? ro.data() : nullptr, rstd.data()},
              x.device(), s);
  return {std::move(y), std::move(rstd), std::move(ro)};
}

// Returns {dx, dz, dweight (empty without weight), dbias (empty without bias)}; the residual's gradient is dx.
// dresidual_out: the incoming gradient of residual_out (prenorm), or nullptr.
inline std::tuple<Tensor, Tensor, Tensor, Tensor> rms_norm_gated_bwd(
    const Tensor& x, const Tensor& z, const Tensor* weight, const Tensor* bias, const Tensor* residual,
    const Tensor& rstd, const Tensor& dy, const Tensor* dresidual_out, const RmsNormGatedOptions& o = {},
    const Stream* s = nullptr) {
  Tensor dx = Tensor::empty(x.dtype(), x.shape(), x.device());
  Tensor dz = Tensor::empty(x.dtype(), x.shape(), x.device());
  Tensor dw, db;
  if (weight) dw = Tensor::empty(weight->dtype(), weight->shape(), x.device());
  if (bias) db = Tensor::empty(bias->dtype(), bias->shape(), x.device());
  strata_plan p = nullptr;
  check(strata_rms_norm_gated_bwd_plan(
      &x.desc(), &z.desc(), weight ? &weight->desc() : nullptr, bias ? &bias->desc() : nullptr,
      residual ? &residual->desc() : nullptr, &rstd.desc(), &dy.desc(),
      dresidual_out ? &dresidual_out->desc() : nullptr, &dx.desc(), &dz.desc(), weight ? &dw.desc() : nullptr,
      bias ? &db.desc() : nullptr, o.group_size, o.norm_before_gate ? 1 : 0, o.activation, &p));
  Plan(p).run({x.data(), z.data(), weight ? weight->data() : nullptr, bias ? bias->data() : nullptr,
               residual ? residual->data() : nullptr, rstd.data(), dy.data(),
               dresidual_out ? dresidual_out->data() : nullptr, dx.data(), dz.data(), weight ? dw.data() : nullptr,
               bias ? db.data() : nullptr},
              x.device(), s);
  return {std::move(dx), std::move(dz), std::move(dw), std::move(db)};
}

}  // namespace strata
