// Strata operators: chunk_loss (C++ API, one function per op). Included by strata/strata.hpp, inside nothing:
// opens namespace strata itself and uses Tensor, Plan, Stream and check from strata.hpp.
#pragma once

#include <cstdint>

#include "strata/ops/chunk_loss.h"
#include "strata/strata.hpp"  // Tensor, Plan, Stream (compiling this header alone; #pragma once otherwise)

namespace strata {

// Results of chunk_loss: the loss (f32 scalar, f64 with f64 inputs), lse [N], and the gradients that were asked
// for (empty Tensors otherwise).
struct ChunkLossResult {
  Tensor loss, lse, dhidden, dweight, dbias;
};

// Loss of hidden [N, D] . weight[V, D]^T (+ bias [V]) against target [N] int64 (strata/ops/chunk_loss.h), and,
// with with_grad, the gradients of options.grad_scale * loss in the same call. Gradients are stored in the input
// dtype, or in f32 with grad_f32 (dweight then needs no f32 workspace).
inline ChunkLossResult chunk_loss(const Tensor& hidden, const Tensor& weight, const Tensor& target,
                                  const Tensor* bias = nullptr, bool with_grad = true, bool grad_f32 = false,
                                  const strata_chunk_loss_options* options = nullptr, const Stream* s = nullptr) {
  const int32_t stat = hidden.dtype() == STRATA_DTYPE_F64 ? STRATA_DTYPE_F64 : STRATA_DTYPE_F32;
  const int32_t gdt = grad_f32 ? STRATA_DTYPE_F32 : hidden.dtype();
  ChunkLossResult r;
  r.loss = Tensor::empty(stat, {}, hidden.device());
  r.lse = Tensor::empty(stat, {hidden.size(0)}, hidden.device());
  if (with_grad) {
    r.dhidden = Tensor::empty(gdt, hidden.shape(), hidden.device());
    r.dweight = Tensor::empty(gdt, weight.shape(), weight.device());
    if (bias) r.dbias = Tensor::empty(gdt, bias->shape(), bias->device());
  }
  auto d = [](const Tensor& t) { return t.data() ? &t.desc() : nullptr; };
  strata_plan p = nullptr;
  check(strata_chunk_loss_plan(&hidden.desc(), &weight.desc(), bias ? &bias->desc() : nullptr, &target.desc(),
                               &r.loss.desc(), &r.lse.desc(), d(r.dhidden), d(r.dweight), d(r.dbias), options, &p));
  Plan(p).run({hidden.data(), weight.data(), bias ? bias->data() : nullptr, target.data(), r.loss.data(),
               r.lse.data(), r.dhidden.data(), r.dweight.data(), r.dbias.data()},
              hidden.device(), s);
  return r;
}

// Gradients by recomputation from the saved lse (chunk_loss with with_grad = false): dloss is a scalar tensor
// (or nullptr for 1). Returns {empty loss, empty lse, dhidden, dweight, dbias (with a bias)}.
inline ChunkLossResult chunk_loss_bwd(const Tensor& hidden, const Tensor& weight, const Tensor& target,
                                      const Tensor& lse, const Tensor* dloss = nullptr, const Tensor* bias = nullptr,
                                      bool grad_f32 = false, const strata_chunk_loss_options* options = nullptr,
                                      const Stream* s = nullptr) {
  const int32_t gdt = grad_f32 ? STRATA_DTYPE_F32 : hidden.dtype();
  ChunkLossResult r;
  r.dhidden = Tensor::empty(gdt, hidden.shape(), hidden.device());
  r.dweight = Tensor::empty(gdt, weight.shape(), weight.device());
  if (bias) r.dbias = Tensor::empty(gdt, bias->shape(), bias->device());
  strata_plan p = nullptr;
  check(strata_chunk_loss_bwd_plan(&hidden.desc(), &weight.desc(), bias ? &bias->desc() : nullptr, &target.desc(),
                                   &lse.desc(), dloss ? &dloss->desc() : nullptr, &r.dhidden.desc(),
                                   &r.dweight.desc(), bias ? &r.dbias.desc() : nullptr, options, &p));
  Plan(p).run({hidden.data(), weight.data(), bias ? bias->data() : nullptr, target.data(), lse.data(),
               dloss ? dloss->data() : nullptr, r.dhidden.data(), r.dweight.data(), r.dbias.data()},
              hidden.device(), s);
  return r;
}

}  // namespace strata
