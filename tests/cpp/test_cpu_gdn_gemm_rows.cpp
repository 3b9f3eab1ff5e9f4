// The per-row epilogue scales of the CPU GEMM micro-kernel (tile::GemmF32Args::row_alpha / row_beta, session 12),
// on every ISA this host runs, against a float64 product: C_i = row_alpha[i] (op(A) op(B))_i + row_beta[i] C_in_i,
// rows with row_beta == 0 must not read C_in (NaN there), widths with an edge (N % lanes) and both layouts of A.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "tile/cpu/gemm.h"
#include "tile/cpu/isa.h"

namespace strata::tile {
namespace {

TEST(TileGemm, PerRowAlphaBetaOnEveryIsa) {
  std::mt19937 rng(11);
  std::normal_distribution<float> nd;
  const int64_t sizes[][3] = {{128, 128, 128}, {128, 100, 100}, {13, 37, 9}, {1, 16, 3}};
  for (const CpuIsa& isa : cpu_isas()) {
    if (!reject_cpu_isa(isa).empty()) continue;
    const GemmF32Fn fn = gemm_f32_for(isa.hwy_target);
    ASSERT_NE(fn, nullptr) << isa.name;
    for (const auto& s : sizes)
      for (int ta = 0; ta < 2; ++ta) {
        const int64_t M = s[0], N = s[1], K = s[2];
        const int64_t lda = (ta ? M : K) + 1, ldb = N + 5, ldc = N + 2, ldcin = N + 3;
        std::vector<float> A((ta ? K : M) * lda), B(K * ldb), C(M * ldc, NAN), Cin(M * ldcin), ra(M), rb(M);
        for (auto& v : A) v = nd(rng);
        for (auto& v : B) v = nd(rng);
        for (auto& v : Cin) v = nd(rng);
        for (int64_t i = 0; i < M; ++i) {
          ra[i] = nd(rng);
          rb[i] = i % 3 == 0 ? 0.f : nd(rng);
          if (rb[i] == 0.f)
            for (int64_t j = 0; j < N; ++j) Cin[i * ldcin + j] = NAN;  // must not be read
        }
        GemmF32Args g{ta == 1, false, M, N, K, 7.f, A.data(), lda, B.data(), ldb, 3.f, C.data(), ldc};
        g.C_in = Cin.data();
        g.ldc_in = ldcin;
        g.row_alpha = ra.data();
        g.row_beta = rb.data();
        fn(g);
        double num = 0, den = 0;
        for (int64_t i = 0; i < M; ++i)
          for (int64_t j = 0; j < N; ++j) {
            double ref = 0;
            for (int64_t k = 0; k < K; ++k)
              ref += static_cast<double>(ta ? A[k * lda + i] : A[i * lda + k]) * B[k * ldb + j];
            ref = ra[i] * ref + (rb[i] != 0.f ? rb[i] * static_cast<double>(Cin[i * ldcin + j]) : 0.0);
            ASSERT_TRUE(std::isfinite(C[i * ldc + j])) << isa.name << " i=" << i << " j=" << j;
            const double d = C[i * ldc + j] - ref;
            num += d * d;
            den += ref * ref;
          }
        EXPECT_LT(std::sqrt(num / den), 8 * std::sqrt(static_cast<double>(K)) * 0x1p-24)
            << isa.name << " M=" << M << " N=" << N << " K=" << K << " ta=" << ta;
      }
  }
}

}  // namespace
}  // namespace strata::tile
