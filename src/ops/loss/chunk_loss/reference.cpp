// float64 reference of chunk_loss and chunk_loss_bwd: the ground truth every implementation is tested against
// (STYLE.md 1). Plain loops, one row of logits at a time (a [V] double buffer), any dtypes and strides, written
// from the definition (ops_fused.md §1.3, §1.4, §2.3, §2.4) without the kernels' tiling or online softmax.
// The backward op recomputes lse in double rather than reading the saved one (the true gradient). Host
// vectors hold dweight and dbias in double while the rows are summed.
#include <cmath>
#include <vector>

#include "ops/loss/chunk_loss/chunk_loss.h"
#include "runtime/error.h"

namespace strata::loss {

strata_status chunk_loss_reference(const ChunkLossParams& p) {
  int64_t n_valid = 0;
  STRATA_RETURN_IF_ERROR(check_targets(p, &n_valid));
  const int64_t N = p.N, D = p.D, V = p.V;
  const CeConsts& o = p.ce;
  const double scale = o.scale, cap = o.cap, eps = o.eps, lam = o.lambda;
  const double a = p.reduction == kReduceMean ? (n_valid > 0 ? 1.0 / static_cast<double>(n_valid) : 0.0) : 1.0;
  const double G = p.backward_op && p.dloss ? load_elem(p.dloss, p.stat_dtype, 0) : 1.0;
  const double coef = G * static_cast<double>(p.grad_scale) * a;
  const bool grad = p.wants_grad();
  auto H = [&](int64_t i, int64_t k) { return load_elem(p.hidden, p.h_dtype, i * p.ld_h + k); };
  auto W = [&](int64_t j, int64_t k) { return load_elem(p.weight, p.w_dtype, j * p.ld_w + k); };

  std::vector<double> c(static_cast<size_t>(V)), dz(static_cast<size_t>(V));
  std::vector<double> dW(p.dweight ? static_cast<size_t>(V * D) : 0, 0.0), db(p.dbias ? static_cast<size_t>(V) : 0, 0.0);
  std::vector<double> dh(static_cast<size_t>(D));
  double total = 0.0;
  for (int64_t i = 0; i < N; ++i) {
    const int64_t y = p.target[i * p.target_stride];
    double m = -INFINITY, sumc = 0.0;
    for (int64_t j = 0; j < V; ++j) {
      double z = p.bias ? load_elem(p.bias, p.w_dtype, j * p.bias_stride) : 0.0;
      for (int64_t k = 0; k < D; ++k) z += H(i, k) * W(j, k);
      const double u = scale * z;
      c[j] = cap > 0 ? cap * std::tanh(u / cap) : u;
      m = std::max(m, c[j]);
      sumc += c[j];
    }
    double s = 0.0;
    for (int64_t j = 0; j < V; ++j) s += std::exp(c[j] - m);
    const double lse = m + std::log(s);
    if (!p.backward_op && p.lse) store_elem(p.lse, p.stat_dtype, i * p.lse_stride, lse);
    const bool ignored = y == o.ignore_index;
    if (!ignored) total += lse - (1.0 - eps) * c[y] - eps / static_cast<double>(V) * sumc + lam * lse * lse;
    if (!grad) continue;
    for (int64_t j = 0; j < V; ++j) {
      if (ignored) {
        dz[j] = 0.0;
        continue;
      }
      const double pj = std::exp(c[j] - lse);
      double dc = pj * (1.0 + 2.0 * lam * lse) - eps / static_cast<double>(V) - (j == y ? 1.0 - eps : 0.0);
      double d = coef * scale * dc;
      if (cap > 0) {
        const double t = c[j] / cap;
        d *= 1.0 - t * t;
      }
      dz[j] = d;
    }
    if (p.dhidden) {
      std::fill(dh.begin(), dh.end(), 0.0);
      for (int64_t j = 0; j < V; ++j)
        if (dz[j] != 0.0)
          for (int64_t k = 0; k < D; ++k) dh[k] += dz[j] * W(j, k);
      for (int64_t k = 0; k < D; ++k) store_elem(p.dhidden, p.dh_dtype, i * p.ld_dh + k, dh[k]);
    }
    if (p.dweight)
      for (int64_t j = 0; j < V; ++j)
        for (int64_t k = 0; k < D; ++k) dW[j * D + k] += dz[j] * H(i, k);
    if (p.dbias)
      for (int64_t j = 0; j < V; ++j) db[j] += dz[j];
  }
  if (p.dweight)
    for (int64_t j = 0; j < V; ++j)
      for (int64_t k = 0; k < D; ++k) store_elem(p.dweight, p.dw_dtype, j * p.ld_dw + k, dW[j * D + k]);
  if (p.dbias)
    for (int64_t j = 0; j < V; ++j) store_elem(p.dbias, p.db_dtype, j * p.db_stride, db[j]);
  if (!p.backward_op) store_elem(p.loss, p.stat_dtype, 0, total * a);
  return STRATA_SUCCESS;
}

}  // namespace strata::loss
