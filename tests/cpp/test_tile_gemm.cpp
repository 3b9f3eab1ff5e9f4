// The CPU GEMM micro-kernel (tile/cpu/gemm.h) on every ISA this host runs, against a float64 product:
// all four transpose combinations, tile and non-tile sizes, leading dimensions larger than the width,
// alpha/beta, and beta == 0 ignoring NaN in C; triangular op(A), a separate beta input C_in, and the transpose.
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <random>
#include <vector>

#include "tile/cpu/gemm.h"
#include "tile/cpu/isa.h"

namespace strata::tile {
namespace {

TEST(TileGemm, MatchesFloat64OnEveryIsa) {
  std::mt19937 rng(3);
  std::normal_distribution<float> nd;
  const int64_t sizes[][3] = {{64, 64, 64}, {1, 1, 1}, {63, 65, 97}, {16, 128, 32}, {128, 16, 256}, {5, 33, 7}};
  for (const CpuIsa& isa : cpu_isas()) {
    if (!reject_cpu_isa(isa).empty()) continue;
    const GemmF32Fn fn = gemm_f32_for(isa.hwy_target);
    ASSERT_NE(fn, nullptr) << isa.name;
    for (const auto& s : sizes)
      for (int ta = 0; ta < 2; ++ta)
        for (int tb = 0; tb < 2; ++tb) {
          const int64_t M = s[0], N = s[1], K = s[2];
          const int64_t lda = (ta ? M : K) + 3, ldb = (tb ? K : N) + 5, ldc = N + 2;
          std::vector<float> A((ta ? K : M) * lda), B((tb ? N : K) * ldb), C(M * ldc), C0;
          for (auto& v : A) v = nd(rng);
          for (auto& v : B) v = nd(rng);
          for (auto& v : C) v = nd(rng);
          C0 = C;
          const float alpha = 0.75f, beta = ta ? 0.5f : 0.f;
          if (beta == 0.f)
            for (auto& v : C) v = NAN;  // must not be read
          fn({ta == 1, tb == 1, M, N, K, alpha, A.data(), lda, B.data(), ldb, beta, C.data(), ldc});
          double num = 0, den = 0;
          for (int64_t i = 0; i < M; ++i)
            for (int64_t j = 0; j < N; ++j) {
              double ref = 0;
              for (int64_t k = 0; k < K; ++k)
                ref += static_cast<double>(ta ? A[k * lda + i] : A[i * lda + k]) * (tb ? B[j * ldb + k] : B[k * ldb + j]);
              ref = alpha * ref + beta * static_cast<double>(C0[i * ldc + j]);
              const double d = C[i * ldc + j] - ref;
              num += d * d;
              den += ref * ref;
            }
          // f32 dot products of length K: roundoff grows like sqrt(K) * 2^-24.
          EXPECT_LT(std::sqrt(num / den), 8 * std::sqrt(static_cast<double>(K)) * 0x1p-24)
              << isa.name << " M=" << M << " N=" << N << " K=" << K << " ta=" << ta << " tb=" << tb;
        }
  }
}

// op(A) lower / upper triangular (zeros stored outside), both layouts of A, C_in separate from C (C starts NaN).
TEST(TileGemm, TriangularAAndSeparateBetaInputOnEveryIsa) {
  std::mt19937 rng(5);
  std::normal_distribution<float> nd;
  const int64_t sizes[][3] = {{64, 64, 64}, {64, 128, 64}, {13, 40, 13}, {70, 16, 50}, {50, 33, 70}};
  for (const CpuIsa& isa : cpu_isas()) {
    if (!reject_cpu_isa(isa).empty()) continue;
    const GemmF32Fn fn = gemm_f32_for(isa.hwy_target);
    for (const auto& s : sizes)
      for (int ta = 0; ta < 2; ++ta)
        for (GemmTri tri : {GemmTri::kLower, GemmTri::kUpper}) {
          const int64_t M = s[0], N = s[1], K = s[2];
          const int64_t lda = (ta ? M : K) + 1, ldb = N + 3, ldc = N + 2, ldcin = N + 7;
          std::vector<float> A((ta ? K : M) * lda), B(K * ldb), C(M * ldc, NAN), Cin(M * ldcin);
          auto a_at = [&](int64_t i, int64_t k) -> float& { return ta ? A[k * lda + i] : A[i * lda + k]; };
          for (int64_t i = 0; i < M; ++i)
            for (int64_t k = 0; k < K; ++k)
              a_at(i, k) = (tri == GemmTri::kLower ? k <= i : k >= i) ? nd(rng) : 0.f;
          for (auto& v : B) v = nd(rng);
          for (auto& v : Cin) v = nd(rng);
          GemmF32Args g{ta == 1, false, M, N, K, -0.5f, A.data(), lda, B.data(), ldb, 2.f, C.data(), ldc};
          g.C_in = Cin.data();
          g.ldc_in = ldcin;
          g.tri_a = tri;
          fn(g);
          double num = 0, den = 0;
          for (int64_t i = 0; i < M; ++i)
            for (int64_t j = 0; j < N; ++j) {
              double ref = 0;
              for (int64_t k = 0; k < K; ++k) ref += static_cast<double>(a_at(i, k)) * B[k * ldb + j];
              ref = -0.5 * ref + 2.0 * Cin[i * ldcin + j];
              const double d = C[i * ldc + j] - ref;
              num += d * d;
              den += ref * ref;
            }
          EXPECT_LT(std::sqrt(num / den), 8 * std::sqrt(static_cast<double>(K)) * 0x1p-24)
              << isa.name << " M=" << M << " N=" << N << " K=" << K << " ta=" << ta << " tri=" << static_cast<int>(tri);
        }
  }
}

// Lower-triangular C: the entries on and below the diagonal are right (those above may be left unwritten).
TEST(TileGemm, LowerTriangularCOnEveryIsa) {
  std::mt19937 rng(6);
  std::normal_distribution<float> nd;
  const int64_t sizes[][3] = {{64, 64, 128}, {64, 64, 64}, {70, 50, 9}, {13, 40, 20}, {128, 64, 64}};
  for (const CpuIsa& isa : cpu_isas()) {
    if (!reject_cpu_isa(isa).empty()) continue;
    const GemmF32Fn fn = gemm_f32_for(isa.hwy_target);
    for (const auto& s : sizes)
      for (int tb = 0; tb < 2; ++tb) {
        const int64_t M = s[0], N = s[1], K = s[2];
        const int64_t lda = K + 1, ldb = (tb ? K : N) + 3, ldc = N + 2;
        std::vector<float> A(M * lda), B((tb ? N : K) * ldb), C(M * ldc), C0;
        for (auto& v : A) v = nd(rng);
        for (auto& v : B) v = nd(rng);
        for (auto& v : C) v = nd(rng);
        C0 = C;
        GemmF32Args g{false, tb == 1, M, N, K, 1.5f, A.data(), lda, B.data(), ldb, 0.25f, C.data(), ldc};
        g.tri_c = GemmTri::kLower;
        fn(g);
        double num = 0, den = 0;
        for (int64_t i = 0; i < M; ++i)
          for (int64_t j = 0; j <= std::min(i, N - 1); ++j) {
            double ref = 0;
            for (int64_t k = 0; k < K; ++k)
              ref += static_cast<double>(A[i * lda + k]) * (tb ? B[j * ldb + k] : B[k * ldb + j]);
            ref = 1.5 * ref + 0.25 * C0[i * ldc + j];
            const double d = C[i * ldc + j] - ref;
            num += d * d;
            den += ref * ref;
          }
        EXPECT_LT(std::sqrt(num / den), 8 * std::sqrt(static_cast<double>(K)) * 0x1p-24)
            << isa.name << " M=" << M << " N=" << N << " K=" << K << " tb=" << tb;
      }
  }
}

TEST(TileGemm, TransposeIsExactOnEveryIsa) {
  const int64_t shapes[][2] = {{64, 128}, {128, 128}, {1, 1}, {5, 3}, {17, 35}, {64, 100}};
  for (const CpuIsa& isa : cpu_isas()) {
    if (!reject_cpu_isa(isa).empty()) continue;
    const TransposeF32Fn tr = transpose_f32_for(isa.hwy_target);
    ASSERT_NE(tr, nullptr) << isa.name;
    for (const auto& sh : shapes) {
      const int64_t rows = sh[0], cols = sh[1], lds = cols + 3, ldd = rows + 5;
      std::vector<float> src(rows * lds), dst(cols * ldd, -1.f);
      for (size_t i = 0; i < src.size(); ++i) src[i] = static_cast<float>(i);
      tr(src.data(), lds, rows, cols, dst.data(), ldd);
      for (int64_t c = 0; c < cols; ++c) {
        for (int64_t r = 0; r < rows; ++r)
          ASSERT_EQ(dst[c * ldd + r], src[r * lds + c]) << isa.name << " " << rows << "x" << cols << " at " << r << "," << c;
        for (int64_t r = rows; r < ldd; ++r) ASSERT_EQ(dst[c * ldd + r], -1.f) << isa.name << " wrote past the rows";
      }
    }
  }
}

TEST(TileGemm, DeterministicAcrossCalls) {
  std::vector<float> A(64 * 64), B(64 * 64), C1(64 * 64), C2(64 * 64);
  std::mt19937 rng(9);
  std::normal_distribution<float> nd;
  for (auto& v : A) v = nd(rng);
  for (auto& v : B) v = nd(rng);
  gemm_f32({false, true, 64, 64, 64, 1.f, A.data(), 64, B.data(), 64, 0.f, C1.data(), 64});
  gemm_f32({false, true, 64, 64, 64, 1.f, A.data(), 64, B.data(), 64, 0.f, C2.data(), 64});
  EXPECT_EQ(C1, C2);
}

}  // namespace
}  // namespace strata::tile
