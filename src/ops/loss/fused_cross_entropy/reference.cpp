// float64 reference of fused_cross_entropy: the ground truth every kernel is tested against (STYLE.md 1).
// Plain loops written from ops_fused.md §1.3/§1.4 in double (it does not use the f32 row math of
// loss/common/ce_row.h, so it cross-checks that too). Any float dtype; the targets were checked by the caller.
#include <algorithm>
#include <cmath>
#include <vector>

#include "ops/loss/fused_cross_entropy/fused_cross_entropy.h"
#include "tile/cpu/parallel.h"

namespace strata::loss {

void ce_scale_host(const CeParams& p, bool f64) {
  // Rows in fixed blocks (the same bits for any thread count: each element is scaled on its own).
  const int64_t es = static_cast<int64_t>(dtype_size(p.dtype));
  tile::parallel_blocks(p.N, tile::block_for_bytes(p.V * es), [&](int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; ++i) {
      const double g = load_elem(p.dloss, p.out_dtype, p.reduction == kCeNone ? i * p.dloss_stride : 0);
      if (g == 1.0 || ce_target(p, i) == p.k.ignore_index) continue;  // as the CUDA kernel: untouched
      const int64_t base = i * p.dlogits_rs;
      if (f64 || p.dtype == STRATA_DTYPE_F64) {
        for (int64_t j = 0; j < p.V; ++j)
          store_elem(p.dlogits, p.dtype, base + j, load_elem(p.dlogits, p.dtype, base + j) * g);
      } else {
        // The f32 product (as the CUDA kernel forms it), then stored in the logits' type. The element and dloss
        // (f32 for f32/bf16/f16 logits) are exact in double, so float(double(x) * g) is the f32 product.
        const float gf = static_cast<float>(g);
        for (int64_t j = 0; j < p.V; ++j)
          store_elem(p.dlogits, p.dtype, base + j,
                     static_cast<double>(static_cast<float>(load_elem(p.dlogits, p.dtype, base + j)) * gf));
      }
    }
  });
}

strata_status fused_cross_entropy_reference(const CeParams& p) {
  const int64_t N = p.N, V = p.V;
  const double s = p.k.scale, cap = p.k.cap, eps = p.k.eps, lambda = p.k.lambda;
  const bool softcap = p.k.softcap_on;
  int64_t count = 0;
  for (int64_t i = 0; i < N; ++i) count += ce_target(p, i) != p.k.ignore_index;
  // Upstream gradient of row i.
  auto upstream = [&](int64_t i) {
    if (p.backward) {
      if (p.reduction == kCeNone) return load_elem(p.dloss, p.out_dtype, i * p.dloss_stride);
      const double G = load_elem(p.dloss, p.out_dtype, 0);
      return p.reduction == kCeMean ? (count > 0 ? G / static_cast<double>(count) : 0.0) : G;
    }
    const double G = p.grad_scale;
    return p.reduction == kCeMean ? (count > 0 ? G / static_cast<double>(count) : 0.0) : G;
  };
  std::vector<double> z(static_cast<size_t>(V)), c(static_cast<size_t>(V)), t(static_cast<size_t>(V));
  double loss_sum = 0.0, z_sum = 0.0;
  for (int64_t i = 0; i < N; ++i) {
    const int64_t y = ce_target(p, i);
    const bool ignored = y == p.k.ignore_index;
    // The whole row is read before anything is written (dlogits may be the logits buffer).
    for (int64_t j = 0; j < V; ++j) {
      z[j] = load_elem(p.logits, p.dtype, i * p.logits_rs + j);
      const double u = s * z[j];
      t[j] = softcap ? std::tanh(u / cap) : 0.0;
      c[j] = softcap ? cap * t[j] : u;
    }
    double lse;
    if (p.backward) {
      lse = load_elem(p.lse_in, p.out_dtype, i * p.lse_in_stride);
    } else {
      double m = -INFINITY;
      for (int64_t j = 0; j < V; ++j) m = std::max(m, c[j]);
      double S = 0.0, sum_c = 0.0;
      for (int64_t j = 0; j < V; ++j) S += std::exp(c[j] - m), sum_c += c[j];
      lse = m + std::log(S);
      const double loss = ignored ? 0.0 : lse - (1.0 - eps) * c[y] - eps / static_cast<double>(V) * sum_c + lambda * lse * lse;
      const double zl = ignored ? 0.0 : lambda * lse * lse;
      if (p.lse) store_elem(p.lse, p.out_dtype, i * p.lse_stride, lse);
      if (p.reduction == kCeNone) {
        store_elem(p.loss, p.out_dtype, i * p.loss_stride, loss);
        if (p.z_loss) store_elem(p.z_loss, p.out_dtype, i * p.z_stride, zl);
      }
      loss_sum += loss;
      z_sum += zl;
    }
    if (!p.dlogits) continue;
    const double g = ignored ? 0.0 : upstream(i);
    for (int64_t j = 0; j < V; ++j) {
      double d = 0.0;
      if (!ignored) {
        const double pj = std::exp(c[j] - lse);
        d = pj * (1.0 + 2.0 * lambda * lse) - eps / static_cast<double>(V) - (j == y ? 1.0 - eps : 0.0);
        d *= g * s * (softcap ? 1.0 - t[j] * t[j] : 1.0);
      }
      store_elem(p.dlogits, p.dtype, i * p.dlogits_rs + j, d);
    }
  }
  if (!p.backward && p.reduction != kCeNone) {
    const double div = p.reduction == kCeMean ? static_cast<double>(count) : 1.0;
    store_elem(p.loss, p.out_dtype, 0, count > 0 || p.reduction == kCeSum ? loss_sum / std::max(div, 1.0) : 0.0);
    if (p.z_loss) store_elem(p.z_loss, p.out_dtype, 0, count > 0 || p.reduction == kCeSum ? z_sum / std::max(div, 1.0) : 0.0);
  }
  return STRATA_SUCCESS;
}

}  // namespace strata::loss
