// CPU kernels of fused_cross_entropy, written once with Highway and compiled for every target in
// tile::cpu_isas() (one implementation "cpu.<isa>" each).
//
// A row of V logits is one work item (rows are cut into fixed blocks, tile/cpu/parallel.h, so every row is
// computed the same way whatever the thread count). Per row:
//   statistics (forward): the row is swept in L1-sized pieces of kPiece elements. Each piece is read once
//     from memory: the transformed logits c (scale, softcap) go to an L1 scratch buffer while the piece's
//     maximum and sum of c are accumulated; a second sweep over the scratch adds exp(c - m_piece). The piece
//     is merged into the row's (m, S) with one rescale (lse_add_block), so there is one exponential per
//     element (a per-element online update would need two).
//   gradient (forward with dlogits, or backward): one more sweep, p = exp(c - lse), dz = f (p_coef p -
//     uniform), the target element fixed up afterwards from its saved logit (dz may be the logits buffer). A
//     row of 151936 bf16 logits (297 KiB) is still in L2 from the statistics sweep.
// Every reduction runs in a fixed order (four vector accumulators per piece, pieces in row order), so the
// result depends only on the row: the same bits for any thread count and batch composition.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "ops/loss/fused_cross_entropy/cpu.cpp"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/contrib/math/math-inl.h>
#include <hwy/highway.h>

#include <algorithm>
#include <cstdint>
#include <type_traits>
#include <vector>

#include "ops/loss/fused_cross_entropy/fused_cross_entropy.h"
#include "tile/cpu/isa.h"
#include "tile/cpu/parallel.h"
#include "tile/cpu/math-inl.h"
#include "tile/cpu/vec-inl.h"

HWY_BEFORE_NAMESPACE();
namespace strata::loss::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;
namespace tv = strata::tile::HWY_NAMESPACE;

// Elements per piece of the statistics sweep: 8 KiB of f32 scratch, which stays in L1 with the piece's
// input (4-8 KiB) while the exponentials are summed.
constexpr int64_t kPiece = 2048;

using DF = hn::ScalableTag<float>;

// exp(x) for the softmax terms: the shared vector exp of tile/cpu/math-inl.h (a few ulp over the whole
// float range; one vscalefps for the 2^n on AVX-512). A NaN logit gives NaN terms (lse is NaN anyway).
HWY_INLINE hn::Vec<DF> FastExp(DF df, hn::Vec<DF> x) { return tv::FastExp(df, x); }
// The statistics' terms exp(c - m_piece) have arguments <= 0 (or NaN): FastExpNonPos, the same bits with three
// vector operations fewer per 16 logits.
HWY_INLINE hn::Vec<DF> ExpNonPos(DF df, hn::Vec<DF> x) { return tv::FastExpNonPos(df, x); }

// Bytes of T per vector of f32 lanes (the prefetch step of the streaming loops).
template <class T>
inline constexpr int64_t kStepT = static_cast<int64_t>(hn::MaxLanes(DF()) * sizeof(T));

// c = s z, or cap tanh(s z / cap).
template <bool kSoftcap>
HWY_INLINE hn::Vec<DF> Transform(DF df, hn::Vec<DF> z, const CeConsts& k) {
  const auto u = hn::Mul(z, hn::Set(df, k.scale));
  if constexpr (kSoftcap) return hn::Mul(hn::Set(df, k.cap), hn::Tanh(df, hn::Mul(u, hn::Set(df, k.inv_cap))));
  return u;
}

// Row statistics: m, S (merged piece by piece), sum of c, and c_y.
// scratch: kPiece floats (ebuf == nullptr), or ebuf: V floats that receive e_j = exp(c_j - m_piece) for the whole
// row, with m_piece of piece q in piece_m[q] (the fused gradient then needs no second exponential).
template <bool kSoftcap, class T>
CeRowStats RowStats(const CeConsts& k, const T* HWY_RESTRICT z, int64_t V, int64_t y, float* HWY_RESTRICT scratch,
                    float* HWY_RESTRICT ebuf = nullptr, float* HWY_RESTRICT piece_m = nullptr,
                    float* HWY_RESTRICT tbuf = nullptr) {
  const DF df;
  const int64_t NL = static_cast<int64_t>(hn::Lanes(df));
  CeRowStats st;
  auto vsum_c = hn::Zero(df);
  float tail_sum_c = 0.f;
  for (int64_t j0 = 0; j0 < V; j0 += kPiece) {
    const int64_t n = std::min(kPiece, V - j0);
    if (ebuf) scratch = ebuf + j0;
    const int64_t nv = n / NL * NL;
    auto vmax = hn::Set(df, -INFINITY);
    int64_t j = 0;
    if (kSoftcap && tbuf) {  // also keep t = tanh(s z / cap) for the gradient's (1 - t^2)
      const auto vscale = hn::Set(df, k.scale), vinv = hn::Set(df, k.inv_cap), vcap = hn::Set(df, k.cap);
      for (; j < nv; j += NL) {
        tv::PrefetchAhead<kStepT<T>>(z + j0 + j);
        const auto t = hn::Tanh(df, hn::Mul(hn::Mul(tv::LoadF32(df, z + j0 + j), vscale), vinv));
        const auto c = hn::Mul(vcap, t);
        hn::StoreU(t, df, tbuf + j0 + j);
        hn::StoreU(c, df, scratch + j);
        vmax = hn::Max(vmax, c);
        vsum_c = hn::Add(vsum_c, c);
      }
    }
    for (; j < nv; j += NL) {
      tv::PrefetchAhead<kStepT<T>>(z + j0 + j);  // the logits stream from memory (tile/cpu/vec-inl.h)
      const auto c = Transform<kSoftcap>(df, tv::LoadF32(df, z + j0 + j), k);
      hn::StoreU(c, df, scratch + j);
      vmax = hn::Max(vmax, c);
      vsum_c = hn::Add(vsum_c, c);
    }
    float m = nv > 0 ? hn::GetLane(hn::MaxOfLanes(df, vmax)) : -INFINITY;
    for (; j < n; ++j) {
      const float c = ce_logit(k, to_f32(z[j0 + j]));
      if (kSoftcap && tbuf) tbuf[j0 + j] = ce_tanh(k.scale * to_f32(z[j0 + j]) * k.inv_cap);
      scratch[j] = c;
      m = std::max(m, c);
      tail_sum_c += c;
    }
    const auto vm = hn::Set(df, m);
    auto a0 = hn::Zero(df), a1 = hn::Zero(df);
    j = 0;
    if (ebuf) {  // keep the exponentials
      piece_m[j0 / kPiece] = m;
      for (; j + 2 * NL <= nv; j += 2 * NL) {
        const auto e0 = ExpNonPos(df, hn::Sub(hn::LoadU(df, scratch + j), vm));
        const auto e1 = ExpNonPos(df, hn::Sub(hn::LoadU(df, scratch + j + NL), vm));
        hn::StoreU(e0, df, scratch + j);
        hn::StoreU(e1, df, scratch + j + NL);
        a0 = hn::Add(a0, e0);
        a1 = hn::Add(a1, e1);
      }
      for (; j < nv; j += NL) {
        const auto e0 = ExpNonPos(df, hn::Sub(hn::LoadU(df, scratch + j), vm));
        hn::StoreU(e0, df, scratch + j);
        a0 = hn::Add(a0, e0);
      }
    } else {
      for (; j + 2 * NL <= nv; j += 2 * NL) {
        a0 = hn::Add(a0, ExpNonPos(df, hn::Sub(hn::LoadU(df, scratch + j), vm)));
        a1 = hn::Add(a1, ExpNonPos(df, hn::Sub(hn::LoadU(df, scratch + j + NL), vm)));
      }
      for (; j < nv; j += NL) a0 = hn::Add(a0, ExpNonPos(df, hn::Sub(hn::LoadU(df, scratch + j), vm)));
    }
    float s = hn::GetLane(hn::SumOfLanes(df, hn::Add(a0, a1)));
    for (; j < n; ++j) {
      const float e = ce_exp(scratch[j] - m);
      if (ebuf) scratch[j] = e;
      s += e;
    }
    lse_add_block(st.lse, m, s);
  }
  st.sum_c = hn::GetLane(hn::SumOfLanes(df, vsum_c)) + tail_sum_c;
  if (y >= 0 && y < V) st.c_y = ce_logit(k, to_f32(z[y]));
  return st;
}

// dz[0..V) for the row constants r (dz may alias z).
template <bool kSoftcap, class T>
void RowGrad(const CeConsts& k, const CeGradRow& r, const T* z, T* dz, int64_t V, int64_t y) {
  const DF df;
  const int64_t NL = static_cast<int64_t>(hn::Lanes(df));
  // The target element's gradient, from its logit before the sweep can overwrite it.
  const bool has_y = y >= 0 && y < V;
  const float dz_y = has_y ? ce_grad_elem(k, r, to_f32(z[y]), true) : 0.f;
  const auto vscale = hn::Set(df, k.scale), vinv = hn::Set(df, k.inv_cap), vcap = hn::Set(df, k.cap);
  const auto vlse = hn::Set(df, r.lse), vp = hn::Set(df, r.p_coef), vu = hn::Set(df, r.uniform);
  const auto one = hn::Set(df, 1.f);
  int64_t j = 0;
  for (; j + NL <= V; j += NL) {
    tv::PrefetchAhead<kStepT<T>>(z + j);  // from memory in the backward, from L2 after the statistics
    const auto u = hn::Mul(tv::LoadF32(df, z + j), vscale);
    hn::Vec<DF> d;
    if constexpr (kSoftcap) {
      const auto t = hn::Tanh(df, hn::Mul(u, vinv));
      const auto p = FastExp(df, hn::Sub(hn::Mul(vcap, t), vlse));
      d = hn::Mul(hn::NegMulAdd(t, t, one), hn::MulSub(vp, p, vu));
    } else {
      // exp(c - lse) <= 1 goes straight into a dz of T: for bf16/f16 the reduced-precision exp of
      // tile/cpu/math-inl.h (relative error < 4e-6, far below their rounding; the sweep is compute-bound).
      if constexpr (sizeof(T) == 2) d = hn::MulSub(vp, tv::ExpLp(df, hn::Sub(u, vlse)), vu);
      else d = hn::MulSub(vp, FastExp(df, hn::Sub(u, vlse)), vu);
    }
    tv::StoreF32(df, d, dz + j);
  }
  for (; j < V; ++j) dz[j] = from_f32<T>(ce_grad_elem(k, r, to_f32(z[j]), false));
  if (has_y) dz[y] = from_f32<T>(dz_y);
}

// dz[0..V) from the kept exponentials (no softcap): p_j = e_j exp(m_piece - lse), dz = p_coef p_j - uniform;
// dz may alias the logits (they are not read here). dz_y: the target's value, computed by the caller.
// With softcap (tbuf != nullptr): dz = (1 - t_j^2) (p_coef p_j - uniform).
template <class T>
void RowGradFromExp(const CeGradRow& r, const float* HWY_RESTRICT ebuf, const float* HWY_RESTRICT piece_m, T* dz,
                    int64_t V, int64_t y, float dz_y, const float* HWY_RESTRICT tbuf = nullptr) {
  const DF df;
  const int64_t NL = static_cast<int64_t>(hn::Lanes(df));
  const auto vu = hn::Set(df, r.uniform), one = hn::Set(df, 1.f);
  for (int64_t j0 = 0; j0 < V; j0 += kPiece) {
    const int64_t n = std::min(kPiece, V - j0);
    const float sc = r.p_coef * ce_exp(piece_m[j0 / kPiece] - r.lse);
    const auto vs = hn::Set(df, sc);
    const float* e = ebuf + j0;
    T* d = dz + j0;
    int64_t j = 0;
    if (tbuf) {
      const float* t = tbuf + j0;
      for (; j + NL <= n; j += NL) {
        const auto tt = hn::LoadU(df, t + j);
        tv::StoreF32(df, hn::Mul(hn::NegMulAdd(tt, tt, one), hn::MulSub(vs, hn::LoadU(df, e + j), vu)), d + j);
      }
      for (; j < n; ++j) d[j] = from_f32<T>((1.f - t[j] * t[j]) * (sc * e[j] - r.uniform));
      continue;
    }
    for (; j + NL <= n; j += NL) tv::StoreF32(df, hn::MulSub(vs, hn::LoadU(df, e + j), vu), d + j);
    for (; j < n; ++j) d[j] = from_f32<T>(sc * e[j] - r.uniform);
  }
  if (y >= 0 && y < V) dz[y] = from_f32<T>(dz_y);
}

template <bool kSoftcap, class T>
void Run(const CeParams& p, int64_t count) {
  const T* logits = static_cast<const T*>(p.logits);
  T* dlogits = static_cast<T*>(p.dlogits);
  const CeConsts& k = p.k;
  double* ws = static_cast<double*>(p.workspace);
  const bool reduced = p.reduction != kCeNone;
  const int64_t block = tile::block_for_bytes(p.V * static_cast<int64_t>(sizeof(T)));
  tile::parallel_blocks(p.N, block, [&](int64_t i0, int64_t i1) {
    HWY_ALIGN float scratch[kPiece];
    // Fused forward + gradient without softcap: the row's exponentials are kept (V floats per thread, in L2),
    // so the gradient sweep only scales them: one exponential per element and no second read of the logits.
    // With softcap t = tanh(s z / cap) is kept as well (another V floats), for the (1 - t^2) factor.
    const bool keep_exp = !p.backward && dlogits != nullptr;
    thread_local std::vector<float> row_buf;
    float* ebuf = nullptr;
    float* piece_m = nullptr;
    float* tbuf = nullptr;
    if (keep_exp) {
      const size_t pieces = static_cast<size_t>((p.V + kPiece - 1) / kPiece);
      const size_t need = static_cast<size_t>(p.V) * (kSoftcap ? 2 : 1) + pieces;
      if (row_buf.size() < need) row_buf.resize(need);
      ebuf = row_buf.data();
      piece_m = ebuf + p.V;
      if (kSoftcap) tbuf = piece_m + pieces;
    }
    for (int64_t i = i0; i < i1; ++i) {
      const int64_t y = ce_target(p, i);
      const bool ignored = y == k.ignore_index;
      const T* z = logits + i * p.logits_rs;
      float lse;
      if (keep_exp) {
        const CeRowStats st = RowStats<kSoftcap>(k, z, p.V, y, scratch, ebuf, piece_m, tbuf);
        lse = ce_lse(st.lse);
        const float loss = ignored ? 0.f : ce_row_loss(k, st, p.V);
        const float zl = ignored ? 0.f : ce_row_z_loss(k, lse);
        if (p.lse) static_cast<float*>(p.lse)[i * p.lse_stride] = lse;
        if (reduced) {
          ws[i] = loss;
          ws[p.N + i] = zl;
        } else {
          static_cast<float*>(p.loss)[i * p.loss_stride] = loss;
          if (p.z_loss) static_cast<float*>(p.z_loss)[i * p.z_stride] = zl;
        }
        T* dz = dlogits + i * p.dlogits_rs;
        if (ignored) {
          std::fill(dz, dz + p.V, from_f32<T>(0.f));
          continue;
        }
        const CeGradRow gr = ce_grad_row(k, lse, ce_upstream(p, i, count));
        RowGradFromExp(gr, ebuf, piece_m, dz, p.V, y, ce_grad_elem(k, gr, to_f32(z[y]), true), tbuf);
        continue;
      }
      if (p.backward) {
        lse = static_cast<const float*>(p.lse_in)[i * p.lse_in_stride];
      } else {
        const CeRowStats st = RowStats<kSoftcap>(k, z, p.V, y, scratch);
        lse = ce_lse(st.lse);
        const float loss = ignored ? 0.f : ce_row_loss(k, st, p.V);
        const float zl = ignored ? 0.f : ce_row_z_loss(k, lse);
        if (p.lse) static_cast<float*>(p.lse)[i * p.lse_stride] = lse;
        if (reduced) {
          ws[i] = loss;
          ws[p.N + i] = zl;
        } else {
          static_cast<float*>(p.loss)[i * p.loss_stride] = loss;
          if (p.z_loss) static_cast<float*>(p.z_loss)[i * p.z_stride] = zl;
        }
      }
      if (!dlogits) continue;
      T* dz = dlogits + i * p.dlogits_rs;
      if (ignored) {
        std::fill(dz, dz + p.V, from_f32<T>(0.f));
        continue;
      }
      RowGrad<kSoftcap>(k, ce_grad_row(k, lse, ce_upstream(p, i, count)), z, dz, p.V, y);
    }
  });
}

void FusedCrossEntropy(const CeParams& p, int64_t count) {
  // The plan gives these implementations f32/bf16/f16 only (f64 goes to the reference).
  visit_float_dtype(p.dtype, [&](auto tz) {
    using T = decltype(tz);
    if constexpr (!std::is_same_v<T, double>) {
      if (p.k.softcap_on) Run<true, T>(p, count);
      else Run<false, T>(p, count);
    }
  });
}

}  // namespace strata::loss::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace strata::loss {
HWY_EXPORT(FusedCrossEntropy);

CeCpuFn fused_cross_entropy_cpu(int64_t hwy_target) { return STRATA_HWY_FOR_TARGET(FusedCrossEntropy, hwy_target); }
}  // namespace strata::loss
#endif
