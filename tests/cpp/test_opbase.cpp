// Op base: descriptors, plan cache, forced implementations, verbose dispatch, empty tensors, CPU streams.
#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

#include "opbase/plan.h"
#include "opbase/row_layout.h"
#include "opbase/tensor.h"
#include "strata/ops.h"

namespace strata {
namespace {

TEST(OpBase, DescInitContiguousAndErrors) {
  strata_tensor_desc d{};
  const int64_t shape[] = {2, 3, 4};
  ASSERT_EQ(strata_tensor_desc_init(&d, STRATA_DTYPE_BF16, 3, shape, nullptr, 0, {0, 0}), STRATA_SUCCESS);
  EXPECT_EQ(d.strides[0], 12);
  EXPECT_EQ(d.strides[2], 1);
  EXPECT_TRUE(is_contiguous(d));
  EXPECT_EQ(strata_tensor_desc_init(&d, STRATA_DTYPE_BF16, 9, shape, nullptr, 0, {0, 0}), STRATA_ERROR_INVALID_SHAPE);
  EXPECT_EQ(strata_tensor_desc_init(&d, 42, 3, shape, nullptr, 0, {0, 0}), STRATA_ERROR_INVALID_DTYPE);
  EXPECT_NE(std::string(strata_get_last_error_message()).find("unknown dtype code 42"), std::string::npos);
  EXPECT_EQ(strata_tensor_desc_init(nullptr, STRATA_DTYPE_BF16, 3, shape, nullptr, 0, {0, 0}),
            STRATA_ERROR_NULL_POINTER);
}

TEST(OpBase, RowLayoutMergesAndIndexes) {
  // [2, 3, 4] padded to strides (18, 5, 1) with offset 2: rows are not evenly spaced.
  strata_tensor_desc d = make_desc(STRATA_DTYPE_F32, {2, 3, 4});
  d.strides[0] = 18, d.strides[1] = 5, d.offset = 2;
  const RowLayout l = make_row_layout(d, 1);
  EXPECT_EQ(l.nd, 2);
  for (int64_t r = 0; r < 6; ++r) EXPECT_EQ(l.row_offset(r), 2 + (r / 3) * 18 + (r % 3) * 5) << r;
  const RowLayout c = make_row_layout(make_desc(STRATA_DTYPE_F32, {2, 3, 4}), 1);
  EXPECT_EQ(c.nd, 1);
  EXPECT_EQ(c.row_offset(5), 20);
}

TEST(OpBase, PlanCacheHitsAndReuseWithNewPointers) {
  strata_plan_cache_clear();
  const auto x = make_desc(STRATA_DTYPE_F32, {3, 16}), r = make_desc(STRATA_DTYPE_F32, {3});
  strata_plan a = nullptr, b = nullptr;
  ASSERT_EQ(strata_l2norm_fwd_plan(&x, &x, &r, 1e-6f, &a), STRATA_SUCCESS);
  ASSERT_EQ(strata_l2norm_fwd_plan(&x, &x, &r, 1e-6f, &b), STRATA_SUCCESS);
  uint64_t hits = 0, misses = 0, entries = 0;
  strata_plan_cache_stats(&hits, &misses, &entries);
  EXPECT_EQ(misses, 1u);
  EXPECT_EQ(hits, 1u);
  EXPECT_EQ(entries, 1u);
  strata_plan c = nullptr;  // another eps is another plan
  ASSERT_EQ(strata_l2norm_fwd_plan(&x, &x, &r, 1e-5f, &c), STRATA_SUCCESS);
  strata_plan_cache_stats(&hits, &misses, &entries);
  EXPECT_EQ(misses, 2u);
  for (int k = 0; k < 3; ++k) {  // one plan, three sets of buffers
    std::vector<float> xv(48, static_cast<float>(k + 1)), yv(48), rv(3);
    void* t[] = {xv.data(), yv.data(), rv.data()};
    ASSERT_EQ(strata_plan_run(a, t, 3, nullptr, 0, nullptr), STRATA_SUCCESS);
    EXPECT_NEAR(yv[0], 0.25f, 1e-6f);
    EXPECT_NEAR(rv[2], 1.f / (4.f * (k + 1)), 1e-6f);
  }
  strata_plan_destroy(a);
  strata_plan_destroy(b);
  strata_plan_destroy(c);
}

TEST(OpBase, ForcedImplementationAndReasons) {
  const auto x = make_desc(STRATA_DTYPE_F32, {3, 16}), r = make_desc(STRATA_DTYPE_F32, {3});
  ASSERT_EQ(strata_set_force_impl("reference"), STRATA_SUCCESS);
  strata_plan p = nullptr;
  ASSERT_EQ(strata_l2norm_fwd_plan(&x, &x, &r, 1e-6f, &p), STRATA_SUCCESS);
  EXPECT_STREQ(strata_plan_impl_name(p), "reference");
  const Plan* plan = plan_from_handle(p);
  ASSERT_NE(plan, nullptr);
  bool saw_pinned = false;
  for (const auto& v : plan->verdicts) saw_pinned |= v.reason.find("pins another implementation") != std::string::npos;
  EXPECT_TRUE(saw_pinned);
  strata_plan_destroy(p);
  // A name the op lacks is ignored for that op.
  ASSERT_EQ(strata_set_force_impl("cuda.sm90.no_such_kernel"), STRATA_SUCCESS);
  ASSERT_EQ(strata_l2norm_fwd_plan(&x, &x, &r, 1e-6f, &p), STRATA_SUCCESS);
  EXPECT_STRNE(strata_plan_impl_name(p), "reference");
  strata_plan_destroy(p);
  // A name it has that cannot run the problem fails with every reason.
  ASSERT_EQ(strata_set_force_impl("cpu.scalar"), STRATA_SUCCESS);
  const auto x64 = make_desc(STRATA_DTYPE_F64, {3, 16}), r64 = make_desc(STRATA_DTYPE_F64, {3});
  EXPECT_EQ(strata_l2norm_fwd_plan(&x64, &x64, &r64, 1e-6f, &p), STRATA_ERROR_NO_IMPLEMENTATION);
  EXPECT_NE(std::string(strata_get_last_error_message()).find("cpu.scalar: handles f32/bf16/f16"), std::string::npos);
  strata_set_force_impl(nullptr);
}

TEST(OpBase, VerboseLinesNameOpImplShapesAndTime) {
  const auto x = make_desc(STRATA_DTYPE_F32, {2, 8}), r = make_desc(STRATA_DTYPE_F32, {2});
  strata_plan_cache_clear();
  set_verbose_level(2);
  testing::internal::CaptureStderr();
  strata_plan p = nullptr;
  ASSERT_EQ(strata_l2norm_fwd_plan(&x, &x, &r, 1e-6f, &p), STRATA_SUCCESS);
  std::vector<float> xv(16, 1.f), yv(16), rv(2);
  void* t[] = {xv.data(), yv.data(), rv.data()};
  ASSERT_EQ(strata_plan_run(p, t, 3, nullptr, 0, nullptr), STRATA_SUCCESS);
  const std::string err = testing::internal::GetCapturedStderr();
  set_verbose_level(0);
  strata_plan_destroy(p);
  EXPECT_NE(err.find("strata_verbose,dispatch,l2norm_fwd,reference,a candidate earlier in the list was chosen"),
            std::string::npos) << err;
  EXPECT_NE(err.find("strata_verbose,run,l2norm_fwd,cpu."), std::string::npos) << err;
  EXPECT_NE(err.find("x:f32[2, 8]"), std::string::npos) << err;
  EXPECT_NE(err.find("ms,ok"), std::string::npos) << err;
}

TEST(OpBase, EmptyTensorsArePlannedAndRunAsNoOps) {
  const auto x = make_desc(STRATA_DTYPE_F32, {0, 8}), r = make_desc(STRATA_DTYPE_F32, {0});
  strata_plan p = nullptr;
  ASSERT_EQ(strata_l2norm_fwd_plan(&x, &x, &r, 1e-6f, &p), STRATA_SUCCESS);
  EXPECT_STREQ(strata_plan_impl_name(p), "empty");
  void* t[] = {nullptr, nullptr, nullptr};
  EXPECT_EQ(strata_plan_run(p, t, 3, nullptr, 0, nullptr), STRATA_SUCCESS);
  strata_plan_destroy(p);
}

TEST(OpBase, RunsInOrderOnCpuStreams) {
  strata_stream s = nullptr;
  ASSERT_EQ(strata_stream_create({STRATA_DEVICE_CPU, 0}, 0, 0, &s), STRATA_SUCCESS);
  const auto x = make_desc(STRATA_DTYPE_F32, {64, 32}), r = make_desc(STRATA_DTYPE_F32, {64});
  strata_plan p = nullptr;
  ASSERT_EQ(strata_l2norm_fwd_plan(&x, &x, &r, 0.f, &p), STRATA_SUCCESS);
  std::vector<float> a(64 * 32, 3.f), b(64 * 32), rv(64), c(64 * 32);
  void* t1[] = {a.data(), b.data(), rv.data()};
  void* t2[] = {b.data(), c.data(), rv.data()};  // reads what the first run wrote
  ASSERT_EQ(strata_plan_run(p, t1, 3, nullptr, 0, s), STRATA_SUCCESS);
  ASSERT_EQ(strata_plan_run(p, t2, 3, nullptr, 0, s), STRATA_SUCCESS);
  ASSERT_EQ(strata_stream_synchronize(s), STRATA_SUCCESS);
  EXPECT_NEAR(c[5], 1.f / std::sqrt(32.f), 1e-6f);
  EXPECT_NEAR(rv[0], 1.f, 1e-5f);  // the second run's rstd: rows of b have norm 1
  strata_plan_destroy(p);
  strata_stream_destroy(s);
}

TEST(OpBase, OpRegistryListsOpsAndImplementations) {
  const char* ops[32];
  const int n = strata_op_names(ops, 32);
  ASSERT_GE(n, 4);
  bool has_l2 = false;
  for (int i = 0; i < n && i < 32; ++i) has_l2 |= std::string(ops[i]) == "l2norm_fwd";
  EXPECT_TRUE(has_l2);
  const char* impls[16];
  const int m = strata_op_impl_names("l2norm_fwd", impls, 16);
  ASSERT_GE(m, 2);
  EXPECT_STREQ(impls[m - 1], "reference");
  EXPECT_EQ(strata_op_impl_names("no_such_op", impls, 16), -1);
}

}  // namespace
}  // namespace strata
