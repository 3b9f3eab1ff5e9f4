// The cpu.avx512_bf16 row-norm instances write bf16 outputs 32 elements at a time in whole 64-byte lines
// (row_norm_cpu-inl.h: ScaleToBf16, ScaledSubScaledToBf16), non-temporal above 4 MiB of output. These tests
// pin that path where the conformance driver's small shapes do not reach: outputs above the streaming
// threshold, rows starting 0, 32 and 2 bytes into a cache line (the peeled 16-element vector, the unaligned
// fallback), row lengths with 16- and 1-element tails, canaries around the output. Forward and factor-mode
// backward values are checked bit for bit against a recomputation from the kernel's own saved rstd (the scaling
// pass's arithmetic, one f32 product rounded to nearest even); the normalize backward against float64.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "opbase/dtype.h"
#include "opbase/tensor.h"
#include "strata/ops.h"
#include "testkit/testkit.h"
#include "tile/cpu/isa.h"

namespace strata {
namespace {

constexpr uint16_t kCanary = 0x5a5a;

struct Case {
  int64_t rows, D, offset;  // offset: elements from a 64-byte aligned start to the output
};
// 8 MiB-ish outputs (above the 4 MiB streaming threshold) and a small one (regular stores).
const Case kCases[] = {{1100, 4096, 0}, {1100, 4096, 16}, {1100, 4096, 1}, {1024, 4117, 0},
                       {1024, 4117, 16}, {7, 4117, 16}, {9, 1031, 1}};

// The build has the cpu.avx512_bf16 instances and this CPU can run them (an AVX2-only host lists the name too):
// the test kit's list of the implementations this host runs.
bool have_native() {
  const std::vector<std::string> impls = atk::impls_for("l2norm_fwd", strata_device{STRATA_DEVICE_CPU, 0});
  return std::find(impls.begin(), impls.end(), tile::kAvx512Bf16Impl) != impls.end();
}

// A bf16 buffer with canaries: `n` elements at `offset` elements past a 64-byte boundary.
struct Out {
  std::vector<uint16_t> buf;
  uint16_t* p;
  int64_t n, offset;
  Out(int64_t n_, int64_t offset_) : buf(n_ + offset_ + 96, kCanary), n(n_), offset(offset_) {
    const uintptr_t a = reinterpret_cast<uintptr_t>(buf.data());
    const int64_t skip = static_cast<int64_t>(((64 - a % 64) % 64) / 2);
    p = buf.data() + skip + offset;
  }
  void expect_canaries(const std::string& what) const {
    for (const uint16_t* q = buf.data(); q < p; ++q) ASSERT_EQ(*q, kCanary) << what << ": wrote before the output";
    for (const uint16_t* q = p + n; q < buf.data() + buf.size(); ++q)
      ASSERT_EQ(*q, kCanary) << what << ": wrote past the output";
  }
};

std::vector<uint16_t> random_bf16(int64_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd;
  std::vector<uint16_t> v(n);
  for (auto& e : v) e = f32_to_bf16_bits(nd(rng));
  return v;
}

class RowNormCpuLines : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!have_native()) GTEST_SKIP() << "this CPU lacks avx512_bf16";
    ASSERT_EQ(strata_set_force_impl("cpu.avx512_bf16"), STRATA_SUCCESS);
  }
  void TearDown() override { strata_set_force_impl(nullptr); }
};

TEST_F(RowNormCpuLines, ForwardMatchesItsOwnRstdBitForBit) {
  for (const Case& c : kCases) {
    for (int rms = 0; rms < 2; ++rms) {
      const std::string what = std::string(rms ? "rmsnorm" : "l2norm") + " rows " + std::to_string(c.rows) + " D " +
                               std::to_string(c.D) + " offset " + std::to_string(c.offset);
      const std::vector<uint16_t> x = random_bf16(c.rows * c.D, static_cast<uint32_t>(c.D + c.offset));
      Out y(c.rows * c.D, c.offset);
      std::vector<float> r(c.rows);
      const strata_tensor_desc xd = make_desc(STRATA_DTYPE_BF16, {c.rows, c.D});
      const strata_tensor_desc rd = rms ? make_desc(STRATA_DTYPE_F32, {c.rows, 1}) : make_desc(STRATA_DTYPE_F32, {c.rows});
      strata_plan plan = nullptr;
      ASSERT_EQ(rms ? strata_rmsnorm_without_weight_fwd_plan(&xd, &xd, &rd, 1e-6f, STRATA_RMSNORM_NORMALIZE, &plan)
                    : strata_l2norm_fwd_plan(&xd, &xd, &rd, 1e-6f, &plan),
                STRATA_SUCCESS)
          << strata_get_last_error_message();
      void* t[3] = {const_cast<uint16_t*>(x.data()), y.p, r.data()};
      ASSERT_EQ(strata_plan_run(plan, t, 3, nullptr, 0, nullptr), STRATA_SUCCESS) << what;
      strata_plan_destroy(plan);
      y.expect_canaries(what);
      int64_t bad = 0;
      for (int64_t i = 0; i < c.rows; ++i)
        for (int64_t j = 0; j < c.D; ++j) {
          const uint16_t want = f32_to_bf16_bits(bf16_bits_to_f32(x[i * c.D + j]) * r[i]);
          if (y.p[i * c.D + j] != want && bad++ < 5)
            ADD_FAILURE() << what << ": y[" << i << ", " << j << "] = " << y.p[i * c.D + j] << ", want " << want;
        }
      EXPECT_EQ(bad, 0) << what;
    }
  }
}

// Level 2 (batch invariance): a row's bits must not depend on how many rows come with it, also where the batch
// size crosses the streaming threshold and the rows are not 64-byte aligned (the stores change; the reduction
// order must not). The first 7 rows alone (regular stores) and in a batch of 1100 (above 4 MiB of output).
TEST_F(RowNormCpuLines, ForwardRowsDoNotDependOnTheBatch) {
  for (const int64_t offset : {int64_t{0}, int64_t{16}, int64_t{1}}) {
    const int64_t D = 4096, big = 1100, small = 7;
    const std::vector<uint16_t> x = random_bf16(big * D, 21u);
    std::vector<std::vector<uint16_t>> ys;
    std::vector<std::vector<float>> rs;
    for (const int64_t rows : {small, big}) {
      Out y(rows * D, offset);
      std::vector<float> r(rows);
      const strata_tensor_desc xd = make_desc(STRATA_DTYPE_BF16, {rows, D});
      const strata_tensor_desc rd = make_desc(STRATA_DTYPE_F32, {rows, 1});
      strata_plan plan = nullptr;
      ASSERT_EQ(strata_rmsnorm_without_weight_fwd_plan(&xd, &xd, &rd, 1e-6f, STRATA_RMSNORM_NORMALIZE, &plan),
                STRATA_SUCCESS);
      void* t[3] = {const_cast<uint16_t*>(x.data()), y.p, r.data()};
      ASSERT_EQ(strata_plan_run(plan, t, 3, nullptr, 0, nullptr), STRATA_SUCCESS);
      strata_plan_destroy(plan);
      ys.emplace_back(y.p, y.p + small * D);
      rs.emplace_back(r.begin(), r.begin() + small);
    }
    EXPECT_EQ(std::memcmp(rs[0].data(), rs[1].data(), small * sizeof(float)), 0) << "rstd, offset " << offset;
    EXPECT_EQ(std::memcmp(ys[0].data(), ys[1].data(), small * D * sizeof(uint16_t)), 0) << "y, offset " << offset;
  }
}

TEST_F(RowNormCpuLines, BackwardFactorBitForBitAndNormalizeAgainstFloat64) {
  for (const Case& c : kCases) {
    const std::string what = "rows " + std::to_string(c.rows) + " D " + std::to_string(c.D) + " offset " +
                             std::to_string(c.offset);
    const std::vector<uint16_t> x = random_bf16(c.rows * c.D, 11u + static_cast<uint32_t>(c.D));
    const std::vector<uint16_t> dy = random_bf16(c.rows * c.D, 12u + static_cast<uint32_t>(c.offset));
    const std::vector<uint16_t> dr = random_bf16(c.rows, 13u);
    std::vector<float> r(c.rows);
    for (int64_t i = 0; i < c.rows; ++i) r[i] = 0.5f + 0.01f * static_cast<float>(i % 17);
    const strata_tensor_desc xd = make_desc(STRATA_DTYPE_BF16, {c.rows, c.D});
    const strata_tensor_desc rd = make_desc(STRATA_DTYPE_F32, {c.rows, 1});
    const strata_tensor_desc drd = make_desc(STRATA_DTYPE_BF16, {c.rows, 1});
    const float inv_n = 1.0f / static_cast<float>(c.D);
    // Factor mode: dx = x * (-dr * rstd^3 / D), the kernel's float expression.
    {
      Out dx(c.rows * c.D, c.offset);
      strata_plan plan = nullptr;
      ASSERT_EQ(strata_rmsnorm_without_weight_bwd_plan(&xd, &rd, &drd, &xd, STRATA_RMSNORM_FACTOR, &plan),
                STRATA_SUCCESS)
          << strata_get_last_error_message();
      void* t[4] = {const_cast<uint16_t*>(x.data()), r.data(), const_cast<uint16_t*>(dr.data()), dx.p};
      ASSERT_EQ(strata_plan_run(plan, t, 4, nullptr, 0, nullptr), STRATA_SUCCESS) << what;
      strata_plan_destroy(plan);
      dx.expect_canaries("factor " + what);
      int64_t bad = 0;
      for (int64_t i = 0; i < c.rows; ++i) {
        const float k = -bf16_bits_to_f32(dr[i]) * r[i] * r[i] * r[i] * inv_n;
        for (int64_t j = 0; j < c.D; ++j) {
          const uint16_t want = f32_to_bf16_bits(bf16_bits_to_f32(x[i * c.D + j]) * k);
          if (dx.p[i * c.D + j] != want && bad++ < 5)
            ADD_FAILURE() << "factor " << what << ": dx[" << i << ", " << j << "] = " << dx.p[i * c.D + j]
                          << ", want " << want;
        }
      }
      EXPECT_EQ(bad, 0) << what;
    }
    // Normalize mode: dx = rstd (dy - x rstd^2 dot(dy, x) / D) against float64 (the bf16 dot of the native
    // instance is vdpbf16ps: f32 accurate, so dx is within a bf16 rounding of the float64 value).
    {
      Out dx(c.rows * c.D, c.offset);
      strata_plan plan = nullptr;
      ASSERT_EQ(strata_rmsnorm_without_weight_bwd_plan(&xd, &rd, &xd, &xd, STRATA_RMSNORM_NORMALIZE, &plan),
                STRATA_SUCCESS)
          << strata_get_last_error_message();
      void* t[4] = {const_cast<uint16_t*>(x.data()), r.data(), const_cast<uint16_t*>(dy.data()), dx.p};
      ASSERT_EQ(strata_plan_run(plan, t, 4, nullptr, 0, nullptr), STRATA_SUCCESS) << what;
      strata_plan_destroy(plan);
      dx.expect_canaries("normalize " + what);
      double err2 = 0, ref2 = 0;
      for (int64_t i = 0; i < c.rows; ++i) {
        double dot = 0;
        for (int64_t j = 0; j < c.D; ++j)
          dot += static_cast<double>(bf16_bits_to_f32(dy[i * c.D + j])) * bf16_bits_to_f32(x[i * c.D + j]);
        const double rs = r[i], cc = dot * rs * rs / static_cast<double>(c.D);
        for (int64_t j = 0; j < c.D; ++j) {
          const double want = rs * (bf16_bits_to_f32(dy[i * c.D + j]) - cc * bf16_bits_to_f32(x[i * c.D + j]));
          const double got = bf16_bits_to_f32(dx.p[i * c.D + j]);
          err2 += (got - want) * (got - want);
          ref2 += want * want;
        }
      }
      // bf16 rounding alone gives a relative RMS error of about 2^-9 / sqrt(3) = 1.1e-3.
      EXPECT_LT(std::sqrt(err2 / ref2), 2e-3) << what;
    }
  }
}

}  // namespace
}  // namespace strata
