// chunk_local_cumsum beyond the conformance driver (ops_gdn_kda.md §4.2): every validation rule (status,
// message, output untouched), the run-time cu_seqlens checks of the CPU implementations, the float64 adjoint
// (the reverse op is the exact transpose; finite differences), determinism (repeated runs, thread counts,
// ISAs), packed-vs-separate equality, exact chunk boundaries for every chunk size, scale after the sum, empty
// tensors and zero-length sequences, plan reuse and the C++ wrapper.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "strata/ops.h"
#include "strata/strata.hpp"
#include "testkit/testkit.h"
#include "test_support.h"

namespace strata {
namespace {

using namespace strata::test;  // ForceImpl, kCpu, poisoned, all_poison, ... (test_support.h)

using atk::HostTensor;

constexpr const char* kOp = "chunk_local_cumsum";

// Pins an implementation for the scope (nullptr: none).

HostTensor make_cu(const std::vector<int64_t>& values) {
  HostTensor cu = HostTensor::make(STRATA_DTYPE_I64, {static_cast<int64_t>(values.size())});
  for (size_t i = 0; i < values.size(); ++i) cu.set(static_cast<int64_t>(i), static_cast<double>(values[i]));
  return cu;
}

HostTensor random_g(int32_t dtype, const std::vector<int64_t>& shape, uint64_t seed,
                    atk::Layout layout = atk::Layout::kContiguous) {
  HostTensor g = HostTensor::make(dtype, shape, layout);
  std::mt19937_64 rng(seed);
  g.fill_normal(rng, -1.0, 3.0);
  return g;
}

HostTensor poisoned(int32_t dtype, const std::vector<int64_t>& shape, atk::Layout layout = atk::Layout::kContiguous) {
  HostTensor t = HostTensor::make(dtype, shape, layout);
  t.poison();
  return t;
}

// Plans and runs on the CPU with the given descriptors over the tensors' storage.
strata_status run_descs(const strata_tensor_desc* g, const strata_tensor_desc* cu, const strata_tensor_desc* out,
                        void* g_data, void* cu_data, void* out_data, int32_t chunk, int32_t reverse, float scale,
                        std::string* impl = nullptr) {
  strata_plan plan = nullptr;
  strata_status s = strata_chunk_local_cumsum_plan(g, cu, out, chunk, reverse, scale, &plan);
  if (s != STRATA_SUCCESS) return s;
  if (impl) *impl = strata_plan_impl_name(plan);
  void* t[] = {g_data, cu_data, out_data};
  s = strata_plan_run(plan, t, 3, nullptr, 0, nullptr);
  strata_plan_destroy(plan);
  return s;
}

strata_status run(const HostTensor& g, const HostTensor* cu, HostTensor& out, int32_t chunk, bool reverse,
                  float scale = 1.f, std::string* impl = nullptr) {
  return run_descs(&g.desc, cu ? &cu->desc : nullptr, &out.desc, const_cast<uint8_t*>(g.storage.data()),
                   cu ? const_cast<uint8_t*>(cu->storage.data()) : nullptr, out.storage.data(), chunk,
                   reverse ? 1 : 0, scale, impl);
}

std::vector<std::string> cpu_impls() { return atk::impls_for(kOp, kCpu); }

// ---------------------------------------------------------------------------------------------- validation

// Valid CPU buffers for g [1, 8, 2] f32, cu_seqlens [0, 3, 8], out poisoned; each rule mutates a descriptor.
struct ValidationSetup {
  HostTensor g = random_g(STRATA_DTYPE_F32, {1, 8, 2}, 1);
  HostTensor cu = make_cu({0, 3, 8});
  HostTensor out = poisoned(STRATA_DTYPE_F32, {1, 8, 2});

  // Expects `status` and a message containing `needle`, and out untouched.
  void expect_rejected(const strata_tensor_desc* gd, const strata_tensor_desc* cud, const strata_tensor_desc* od,
                       int32_t chunk, int32_t reverse, float scale, strata_status status, const std::string& needle) {
    const strata_status s = run_descs(gd, cud, od, g.storage.data(), cu.storage.data(), out.storage.data(), chunk,
                                      reverse, scale);
    const std::string msg = strata_get_last_error_message();
    EXPECT_EQ(s, status) << strata_status_name(s) << ": " << msg;
    EXPECT_NE(msg.find(needle), std::string::npos) << "message: " << msg << "\nexpected to contain: " << needle;
    EXPECT_TRUE(all_poison(out)) << "out was written by a rejected call: " << needle;
  }
};

TEST(ChunkLocalCumsum, NullRules) {
  ValidationSetup v;
  v.expect_rejected(nullptr, &v.cu.desc, &v.out.desc, 4, 0, 1.f, STRATA_ERROR_NULL_POINTER,
                    "chunk_local_cumsum: g must not be NULL");
  v.expect_rejected(&v.g.desc, &v.cu.desc, nullptr, 4, 0, 1.f, STRATA_ERROR_NULL_POINTER, "out must not be NULL");
  EXPECT_EQ(strata_chunk_local_cumsum_plan(&v.g.desc, nullptr, &v.out.desc, 4, 0, 1.f, nullptr),
            STRATA_ERROR_NULL_POINTER);
  EXPECT_NE(std::string(strata_get_last_error_message()).find("plan"), std::string::npos);
  // A plan made with cu_seqlens needs its pointer at run time.
  strata_plan plan = nullptr;
  ASSERT_EQ(strata_chunk_local_cumsum_plan(&v.g.desc, &v.cu.desc, &v.out.desc, 4, 0, 1.f, &plan), STRATA_SUCCESS);
  void* t[] = {v.g.storage.data(), nullptr, v.out.storage.data()};
  EXPECT_EQ(strata_plan_run(plan, t, 3, nullptr, 0, nullptr), STRATA_ERROR_NULL_POINTER);
  EXPECT_NE(std::string(strata_get_last_error_message()).find("tensor 1 must not be NULL"), std::string::npos);
  strata_plan_destroy(plan);
  EXPECT_TRUE(all_poison(v.out));
}

TEST(ChunkLocalCumsum, DeviceRules) {
  ValidationSetup v;
  auto gbad = v.g.desc;
  gbad.device = {7, 0};
  v.expect_rejected(&gbad, &v.cu.desc, &v.out.desc, 4, 0, 1.f, STRATA_ERROR_INVALID_DEVICE, "g");
  auto cu1 = v.cu.desc;
  cu1.device = {STRATA_DEVICE_CPU, 1};
  v.expect_rejected(&v.g.desc, &cu1, &v.out.desc, 4, 0, 1.f, STRATA_ERROR_INVALID_DEVICE,
                    "cu_seqlens: device cpu:1 does not exist");
  auto ocuda = v.out.desc;
  ocuda.device = {STRATA_DEVICE_CUDA, 0};
  const strata_status s =
      run_descs(&v.g.desc, &v.cu.desc, &ocuda, v.g.storage.data(), v.cu.storage.data(), v.out.storage.data(), 4, 0,
                1.f);
  EXPECT_TRUE(s == STRATA_ERROR_INVALID_DEVICE || s == STRATA_ERROR_DEVICE_UNAVAILABLE) << strata_status_name(s);
  EXPECT_NE(std::string(strata_get_last_error_message()).find("out"), std::string::npos);
  EXPECT_TRUE(all_poison(v.out));
}

TEST(ChunkLocalCumsum, DtypeRules) {
  ValidationSetup v;
  auto gi = v.g.desc;
  gi.dtype = STRATA_DTYPE_I32;
  v.expect_rejected(&gi, &v.cu.desc, &v.out.desc, 4, 0, 1.f, STRATA_ERROR_INVALID_DTYPE,
                    "g has dtype i32, expected one of f32, bf16, f16, f64");
  auto oi = v.out.desc;
  oi.dtype = STRATA_DTYPE_I64;
  v.expect_rejected(&v.g.desc, &v.cu.desc, &oi, 4, 0, 1.f, STRATA_ERROR_INVALID_DTYPE, "out has dtype i64");
  auto cu32 = v.cu.desc;
  cu32.dtype = STRATA_DTYPE_I32;
  v.expect_rejected(&v.g.desc, &cu32, &v.out.desc, 4, 0, 1.f, STRATA_ERROR_INVALID_DTYPE,
                    "cu_seqlens has dtype i32, expected one of i64");
  auto gu = v.g.desc;
  gu.dtype = 42;
  v.expect_rejected(&gu, &v.cu.desc, &v.out.desc, 4, 0, 1.f, STRATA_ERROR_INVALID_DTYPE, "unknown dtype code 42");
}

TEST(ChunkLocalCumsum, F64OnCudaIsAValidationError) {
  int32_t n = 0;
  if (strata_device_count(STRATA_DEVICE_CUDA, &n) != STRATA_SUCCESS || n == 0) GTEST_SKIP() << "no CUDA device";
  const strata_device dev = {STRATA_DEVICE_CUDA, 0};
  const auto g64 = make_desc(STRATA_DTYPE_F64, {1, 8, 2}, dev), g32 = make_desc(STRATA_DTYPE_F32, {1, 8, 2}, dev);
  strata_plan plan = nullptr;
  EXPECT_EQ(strata_chunk_local_cumsum_plan(&g64, nullptr, &g32, 4, 0, 1.f, &plan), STRATA_ERROR_INVALID_DTYPE);
  EXPECT_NE(std::string(strata_get_last_error_message()).find("g has dtype f64, which only the CPU supports"),
            std::string::npos)
      << strata_get_last_error_message();
  EXPECT_EQ(strata_chunk_local_cumsum_plan(&g32, nullptr, &g64, 4, 0, 1.f, &plan), STRATA_ERROR_INVALID_DTYPE);
  EXPECT_NE(std::string(strata_get_last_error_message()).find("out has dtype f64"), std::string::npos);
  EXPECT_EQ(plan, nullptr);
}

TEST(ChunkLocalCumsum, ShapeRules) {
  ValidationSetup v;
  const auto g2 = make_desc(STRATA_DTYPE_F32, {8, 2});
  v.expect_rejected(&g2, nullptr, &v.out.desc, 4, 0, 1.f, STRATA_ERROR_INVALID_SHAPE,
                    "g must have rank 3..4, got rank 2 [8, 2]");
  const auto g5 = make_desc(STRATA_DTYPE_F32, {1, 8, 2, 1, 1});
  v.expect_rejected(&g5, nullptr, &v.out.desc, 4, 0, 1.f, STRATA_ERROR_INVALID_SHAPE, "g must have rank 3..4");
  const auto o2 = make_desc(STRATA_DTYPE_F32, {1, 8, 3});
  v.expect_rejected(&v.g.desc, &v.cu.desc, &o2, 4, 0, 1.f, STRATA_ERROR_INVALID_SHAPE,
                    "out must have shape [1, 8, 2] (the shape of g), got [1, 8, 3]");
  auto gneg = v.g.desc;
  gneg.shape[1] = -8;
  v.expect_rejected(&gneg, &v.cu.desc, &v.out.desc, 4, 0, 1.f, STRATA_ERROR_INVALID_SHAPE, "negative size");
  const auto cu2 = make_desc(STRATA_DTYPE_I64, {3, 1});
  v.expect_rejected(&v.g.desc, &cu2, &v.out.desc, 4, 0, 1.f, STRATA_ERROR_INVALID_SHAPE,
                    "cu_seqlens must have rank 1, got rank 2 [3, 1]");
  const auto cu0 = make_desc(STRATA_DTYPE_I64, {0});
  v.expect_rejected(&v.g.desc, &cu0, &v.out.desc, 4, 0, 1.f, STRATA_ERROR_INVALID_SHAPE,
                    "cu_seqlens must have N + 1 >= 1 entries, got shape [0]");
  const auto cu_one = make_desc(STRATA_DTYPE_I64, {1});
  v.expect_rejected(&v.g.desc, &cu_one, &v.out.desc, 4, 0, 1.f, STRATA_ERROR_INVALID_SHAPE,
                    "cu_seqlens [1] holds no sequence (N = 0) but g has T = 8 tokens");
  const auto gb2 = make_desc(STRATA_DTYPE_F32, {2, 4, 2});
  const auto ob2 = make_desc(STRATA_DTYPE_F32, {2, 4, 2});
  v.expect_rejected(&gb2, &v.cu.desc, &ob2, 4, 0, 1.f, STRATA_ERROR_INVALID_SHAPE,
                    "with cu_seqlens (a variable-length pack) g must have B = 1 (g.shape[0]), got g [2, 4, 2]");
}

TEST(ChunkLocalCumsum, StrideRules) {
  ValidationSetup v;
  auto gs = v.g.desc;
  gs.strides[1] = -2;
  v.expect_rejected(&gs, &v.cu.desc, &v.out.desc, 4, 0, 1.f, STRATA_ERROR_INVALID_STRIDE,
                    "g has a negative stride -2 in dimension 1");
  auto os = v.out.desc;
  os.strides[1] = 0;
  v.expect_rejected(&v.g.desc, &v.cu.desc, &os, 4, 0, 1.f, STRATA_ERROR_INVALID_STRIDE,
                    "output out has stride 0 in dimension 1");
  auto cus = v.cu.desc;
  cus.strides[0] = -1;
  v.expect_rejected(&v.g.desc, &cus, &v.out.desc, 4, 0, 1.f, STRATA_ERROR_INVALID_STRIDE,
                    "cu_seqlens has a negative stride");
  auto goff = v.g.desc;
  goff.offset = -1;
  v.expect_rejected(&goff, &v.cu.desc, &v.out.desc, 4, 0, 1.f, STRATA_ERROR_INVALID_STRIDE, "g has a negative offset");
}

TEST(ChunkLocalCumsum, AttributeRules) {
  ValidationSetup v;
  for (int32_t bad : {0, -4, 3, 12, 48, 2048}) {
    v.expect_rejected(&v.g.desc, &v.cu.desc, &v.out.desc, bad, 0, 1.f, STRATA_ERROR_INVALID_ATTRIBUTE,
                      "chunk_local_cumsum: chunk_size must be a power of two in [1, 1024], got " + std::to_string(bad));
  }
  v.expect_rejected(&v.g.desc, &v.cu.desc, &v.out.desc, 4, 2, 1.f, STRATA_ERROR_INVALID_ATTRIBUTE,
                    "reverse must be 0 or 1, got 2");
  v.expect_rejected(&v.g.desc, &v.cu.desc, &v.out.desc, 4, 0, NAN, STRATA_ERROR_INVALID_ATTRIBUTE,
                    "scale must be finite, got nan");
  v.expect_rejected(&v.g.desc, &v.cu.desc, &v.out.desc, 4, 0, -INFINITY, STRATA_ERROR_INVALID_ATTRIBUTE,
                    "scale must be finite, got -inf");
}

// The CPU implementations read cu_seqlens from host memory and check the values before writing anything.
TEST(ChunkLocalCumsum, CuSeqlensValuesCheckedAtRunTimeOnEveryCpuImpl) {
  const HostTensor g = random_g(STRATA_DTYPE_F32, {1, 8, 2, 3}, 2);
  struct Bad {
    std::vector<int64_t> cu;
    std::string needle;
  };
  const std::vector<Bad> bad = {
      {{3, 5, 8}, "chunk_local_cumsum: cu_seqlens[0] must be 0, got 3"},
      {{0, 6, 4, 8}, "cu_seqlens must be non-decreasing, got cu_seqlens[2] = 4 after cu_seqlens[1] = 6"},
      {{0, -1, 8}, "cu_seqlens must be non-decreasing, got cu_seqlens[1] = -1 after cu_seqlens[0] = 0"},
      {{0, 4, 7}, "the last entry cu_seqlens[2] must equal T = 8 (g.shape[1]), got 7"},
      {{0, 4, 9}, "the last entry cu_seqlens[2] must equal T = 8 (g.shape[1]), got 9"},
      {{0, 9, 8}, "non-decreasing"},
  };
  for (const std::string& impl : cpu_impls()) {
    ForceImpl force(impl.c_str());
    for (const Bad& b : bad) {
      const HostTensor cu = make_cu(b.cu);
      HostTensor out = poisoned(STRATA_DTYPE_F32, {1, 8, 2, 3});
      std::string ran;
      EXPECT_EQ(run(g, &cu, out, 4, false, 1.f, &ran), STRATA_ERROR_INVALID_VALUE) << impl;
      EXPECT_EQ(ran, impl);
      const std::string msg = strata_get_last_error_message();
      EXPECT_NE(msg.find(b.needle), std::string::npos) << impl << ": " << msg;
      EXPECT_TRUE(all_poison(out)) << impl << " wrote out for invalid cu_seqlens " << b.needle;
    }
  }
}

TEST(ChunkLocalCumsum, CpuIsaImplsRejectF64WithAReason) {
  const HostTensor g = random_g(STRATA_DTYPE_F64, {1, 8, 2}, 3);
  for (const std::string& impl : cpu_impls()) {
    if (impl == "reference") continue;
    ForceImpl force(impl.c_str());
    for (int32_t odt : {STRATA_DTYPE_F64, STRATA_DTYPE_F32}) {
      HostTensor out = poisoned(odt, {1, 8, 2});
      EXPECT_EQ(run(g, nullptr, out, 4, false), STRATA_ERROR_NO_IMPLEMENTATION) << impl;
      const std::string msg = strata_get_last_error_message();
      EXPECT_NE(msg.find(impl + ": handles f32/bf16/f16 g and out, got g f64"), std::string::npos) << msg;
      EXPECT_TRUE(all_poison(out));
    }
  }
  // Unforced, f64 goes to the reference.
  HostTensor out = poisoned(STRATA_DTYPE_F64, {1, 8, 2});
  std::string ran;
  ASSERT_EQ(run(g, nullptr, out, 4, false, 1.f, &ran), STRATA_SUCCESS);
  EXPECT_EQ(ran, "reference");
}

// ---------------------------------------------------------------------------------------------- float64 adjoint

// The op is linear, out = A g. Its adjoint is the reverse-direction op with the same scale.
struct LinearCase {
  std::vector<int64_t> shape;
  std::vector<int64_t> cu;  // empty: fixed length
  int32_t chunk;
  float scale;
};
const std::vector<LinearCase> kLinearCases = {
    {{2, 11, 2, 3}, {}, 4, 0.7f},
    {{1, 12, 2}, {0, 3, 11, 12}, 4, 0.7f},
    {{2, 37, 3}, {}, 8, -1.25f},
    {{1, 50, 2, 2}, {0, 7, 7, 30, 50}, 16, 1.4426950408889634f},
};

std::vector<double> apply(const LinearCase& c, const std::vector<double>& x, bool reverse) {
  HostTensor g = HostTensor::make(STRATA_DTYPE_F64, c.shape);
  for (int64_t e = 0; e < g.numel(); ++e) g.set(e, x[e]);
  HostTensor out = poisoned(STRATA_DTYPE_F64, c.shape);
  const HostTensor cu = make_cu(c.cu);
  EXPECT_EQ(run(g, c.cu.empty() ? nullptr : &cu, out, c.chunk, reverse, c.scale), STRATA_SUCCESS)
      << strata_get_last_error_message();
  return out.values();
}

double dot(const std::vector<double>& a, const std::vector<double>& b) {
  double s = 0;
  for (size_t i = 0; i < a.size(); ++i) s += a[i] * b[i];
  return s;
}

TEST(ChunkLocalCumsum, ReverseIsTheExactAdjointInFloat64) {
  for (const LinearCase& c : kLinearCases) {
    int64_t n = 1;
    for (int64_t s : c.shape) n *= s;
    // Columns of A and of A' (the reverse op) from unit vectors: A' must be A transposed, exactly (every
    // entry is 0 or scale).
    std::vector<std::vector<double>> a(n), at(n);
    for (int64_t j = 0; j < n; ++j) {
      std::vector<double> e(n, 0.0);
      e[j] = 1.0;
      a[j] = apply(c, e, false);
      at[j] = apply(c, e, true);
    }
    for (int64_t i = 0; i < n; ++i)
      for (int64_t j = 0; j < n; ++j) ASSERT_EQ(a[j][i], at[i][j]) << "A[" << i << "][" << j << "]";
    // And both directions satisfy <A x, w> = <x, A' w> on random vectors.
    std::mt19937_64 rng(11);
    std::normal_distribution<double> nd;
    std::vector<double> x(n), w(n);
    for (auto& v : x) v = nd(rng);
    for (auto& v : w) v = nd(rng);
    for (bool rev : {false, true}) {
      const double lhs = dot(apply(c, x, rev), w), rhs = dot(x, apply(c, w, !rev));
      EXPECT_NEAR(lhs, rhs, 1e-12 * (std::fabs(lhs) + 1.0));
    }
  }
}

TEST(ChunkLocalCumsum, GradientMatchesFloat64FiniteDifferences) {
  // loss(g) = <out(g), w>; dloss/dg = scale * reverse_cumsum(w), the op's own reverse call.
  for (const LinearCase& c : kLinearCases) {
    for (bool rev : {false, true}) {
      int64_t n = 1;
      for (int64_t s : c.shape) n *= s;
      std::mt19937_64 rng(5);
      std::normal_distribution<double> nd;
      std::vector<double> g(n), w(n);
      for (auto& v : g) v = nd(rng);
      for (auto& v : w) v = nd(rng);
      const std::vector<double> grad = apply(c, w, !rev);
      const double h = 1e-4;
      for (int64_t i = 0; i < n; ++i) {
        std::vector<double> gp = g, gm = g;
        gp[i] += h;
        gm[i] -= h;
        const double fd = (dot(apply(c, gp, rev), w) - dot(apply(c, gm, rev), w)) / (2 * h);
        ASSERT_NEAR(fd, grad[i], 1e-8) << "element " << i << (rev ? " (reverse)" : "");
      }
    }
  }
}

// ---------------------------------------------------------------------------------------------- determinism

struct BitsCase {
  int32_t g_dtype, out_dtype;
  std::vector<int64_t> shape;
  std::vector<int64_t> cu;
  int32_t chunk;
  bool reverse;
  atk::Layout layout;
};
// Large enough for several work blocks (so two threads really split the work); cases 4-6 have outputs
// above 4 MiB (the CPU's non-temporal store paths): f32 and bf16 with misaligned wide rows, bf16 narrow rows.
// The last case's f16 outputs (sums of bf16 values, not exact in f16) caught the SSE4 and scalar targets'
// truncating f16 stores (tile/cpu/vec-inl.h StoreF32).
const std::vector<BitsCase> kBitsCases = {
    {STRATA_DTYPE_F32, STRATA_DTYPE_F32, {4, 1000, 64}, {}, 16, false, atk::Layout::kContiguous},
    {STRATA_DTYPE_BF16, STRATA_DTYPE_BF16, {2, 777, 4, 48}, {}, 64, true, atk::Layout::kContiguous},
    {STRATA_DTYPE_F16, STRATA_DTYPE_F32, {1, 3001, 3, 40}, {0, 13, 13, 1000, 1001, 2500, 3001}, 32, false,
     atk::Layout::kContiguous},
    {STRATA_DTYPE_F32, STRATA_DTYPE_F16, {1, 2000, 8, 8}, {0, 700, 1999, 2000}, 64, true, atk::Layout::kPaddedRows},
    {STRATA_DTYPE_BF16, STRATA_DTYPE_F32, {2, 700, 3, 301}, {}, 64, true, atk::Layout::kContiguous},
    {STRATA_DTYPE_F32, STRATA_DTYPE_BF16, {1, 2100, 4, 301}, {}, 64, false, atk::Layout::kContiguous},
    {STRATA_DTYPE_F32, STRATA_DTYPE_BF16, {2, 90000, 12}, {}, 32, true, atk::Layout::kContiguous},
    {STRATA_DTYPE_BF16, STRATA_DTYPE_F16, {2, 9000, 12}, {}, 32, true, atk::Layout::kContiguous},
};

std::vector<uint8_t> bits_of(const BitsCase& c, uint64_t seed) {
  const HostTensor g = random_g(c.g_dtype, c.shape, seed, c.layout);
  HostTensor out = poisoned(c.out_dtype, c.shape, c.layout);
  const HostTensor cu = make_cu(c.cu);
  EXPECT_EQ(run(g, c.cu.empty() ? nullptr : &cu, out, c.chunk, c.reverse), STRATA_SUCCESS)
      << strata_get_last_error_message();
  return out.storage;
}

TEST(ChunkLocalCumsum, BitwiseAcrossRunsAndThreadCounts) {
  const int32_t threads_before = strata_get_num_threads();
  for (const std::string& impl : cpu_impls()) {
    ForceImpl force(impl.c_str());
    for (size_t k = 0; k < kBitsCases.size(); ++k) {
      ASSERT_EQ(strata_set_num_threads(2), STRATA_SUCCESS);
      const std::vector<uint8_t> first = bits_of(kBitsCases[k], 9);
      EXPECT_EQ(bits_of(kBitsCases[k], 9), first) << impl << " case " << k << ": repeated run differs";
      ASSERT_EQ(strata_set_num_threads(1), STRATA_SUCCESS);
      EXPECT_EQ(bits_of(kBitsCases[k], 9), first) << impl << " case " << k << ": 1 vs 2 threads differ";
    }
  }
  strata_set_num_threads(threads_before);
}

// The ISA implementations add in t order in f32 and round once to the output dtype: every ISA gives the same
// bits (the f16 stores of the sse4/scalar targets round to nearest even like F16C).
TEST(ChunkLocalCumsum, EveryCpuIsaGivesTheSameBits) {
  std::vector<std::vector<uint8_t>> expect;
  {
    ForceImpl force("cpu.scalar");
    for (const BitsCase& c : kBitsCases) expect.push_back(bits_of(c, 4));
  }
  for (const std::string& impl : cpu_impls()) {
    if (impl == "reference") continue;
    ForceImpl force(impl.c_str());
    for (size_t k = 0; k < kBitsCases.size(); ++k)
      EXPECT_EQ(bits_of(kBitsCases[k], 4), expect[k]) << impl << " case " << k;
  }
}

// The strided (scalar) path and the contiguous-lane (vector) path give the same values.
TEST(ChunkLocalCumsum, StridedAndContiguousLayoutsGiveTheSameValues) {
  const std::vector<int64_t> shape = {2, 300, 4, 24};
  for (const std::string& impl : cpu_impls()) {
    ForceImpl force(impl.c_str());
    for (bool reverse : {false, true}) {
      std::vector<std::vector<double>> results;
      for (atk::Layout layout : {atk::Layout::kContiguous, atk::Layout::kPaddedRows, atk::Layout::kStridedCols}) {
        const HostTensor g = random_g(STRATA_DTYPE_BF16, shape, 8, layout);  // same values in every layout
        HostTensor out = poisoned(STRATA_DTYPE_F32, shape, layout);
        ASSERT_EQ(run(g, nullptr, out, 64, reverse, 0.75f), STRATA_SUCCESS);
        results.push_back(out.values());
      }
      EXPECT_EQ(results[1], results[0]) << impl << " padded";
      EXPECT_EQ(results[2], results[0]) << impl << " strided";
    }
  }
}

// ---------------------------------------------------------------------------------------------- CUDA

bool have_cuda() {
  int32_t n = 0;
  return strata_device_count(STRATA_DEVICE_CUDA, &n) == STRATA_SUCCESS && n > 0;
}

// Runs a bits case on cuda:0 and returns out's storage.
std::vector<uint8_t> cuda_bits_of(const BitsCase& c, uint64_t seed) {
  const strata_device dev = {STRATA_DEVICE_CUDA, 0};
  const HostTensor g = random_g(c.g_dtype, c.shape, seed, c.layout);
  HostTensor out = poisoned(c.out_dtype, c.shape, c.layout);
  const HostTensor cu = make_cu(c.cu);
  atk::DeviceTensor d_g(g, dev), d_out(out, dev), d_cu(cu, dev);
  strata_plan plan = nullptr;
  EXPECT_EQ(strata_chunk_local_cumsum_plan(&d_g.desc(), c.cu.empty() ? nullptr : &d_cu.desc(), &d_out.desc(),
                                           c.chunk, c.reverse ? 1 : 0, 1.f, &plan),
            STRATA_SUCCESS)
      << strata_get_last_error_message();
  void* t[] = {d_g.data(), c.cu.empty() ? nullptr : d_cu.data(), d_out.data()};  // cu_seqlens only when planned
  EXPECT_EQ(strata_plan_run(plan, t, 3, nullptr, 0, nullptr), STRATA_SUCCESS) << strata_get_last_error_message();
  strata_plan_destroy(plan);
  d_out.download(out);
  return out.storage;
}

// The CUDA kernel sums in the CPU kernels' order: same bits as the CPU, and run to run.
TEST(ChunkLocalCumsum, CudaGivesTheCpuBitsRunToRun) {
  if (!have_cuda()) GTEST_SKIP() << "no CUDA device";
  for (size_t k = 0; k < kBitsCases.size(); ++k) {
    std::vector<uint8_t> cpu;
    {
      ForceImpl force("cpu.scalar");
      cpu = bits_of(kBitsCases[k], 6);
    }
    const std::vector<uint8_t> first = cuda_bits_of(kBitsCases[k], 6);
    EXPECT_EQ(cuda_bits_of(kBitsCases[k], 6), first) << "case " << k << ": repeated CUDA run differs";
    EXPECT_EQ(first, cpu) << "case " << k << ": CUDA and CPU bits differ";
  }
}

// The CUDA path cannot check the cu_seqlens values without a sync; whatever they are, it must stay inside g,
// cu_seqlens and out (run under compute-sanitizer on the GPU machine to see the reads too). out is a view in
// the middle of a poisoned buffer whose margins must stay untouched.
TEST(ChunkLocalCumsum, CudaStaysInBoundsForInvalidCuSeqlens) {
  if (!have_cuda()) GTEST_SKIP() << "no CUDA device";
  const strata_device dev = {STRATA_DEVICE_CUDA, 0};
  const int64_t T = 40, L = 6, margin = 4096;
  const HostTensor g = random_g(STRATA_DTYPE_F32, {1, T, 2, 3}, 12);
  HostTensor out = HostTensor::make(STRATA_DTYPE_F32, {2 * margin + T * L});
  out.poison();
  strata_tensor_desc out_view = make_desc(STRATA_DTYPE_F32, {1, T, 2, 3}, dev);
  out_view.offset = margin;
  const std::vector<std::vector<int64_t>> bad = {
      {5, 3, 100, -7, 40}, {0, 0, 0}, {0, int64_t{1} << 40, 40}, {-5, -5, -5, 40}, {0, 40, 3},
      {0, 17, 9, 33, 12, 80}, {40, 0}, {0, -1}};
  for (const auto& values : bad) {
    const HostTensor cu = make_cu(values);
    atk::DeviceTensor d_g(g, dev), d_out(out, dev), d_cu(cu, dev);
    strata_plan plan = nullptr;
    ASSERT_EQ(strata_chunk_local_cumsum_plan(&d_g.desc(), &d_cu.desc(), &out_view, 16, 0, 1.f, &plan),
              STRATA_SUCCESS);
    void* t[] = {d_g.data(), d_cu.data(), d_out.data()};
    EXPECT_EQ(strata_plan_run(plan, t, 3, nullptr, 0, nullptr), STRATA_SUCCESS) << strata_get_last_error_message();
    strata_plan_destroy(plan);
    HostTensor back = out;
    d_out.download(back);
    for (int64_t i = 0; i < margin; ++i) {
      ASSERT_TRUE(std::isnan(back.get(i))) << "written before out at " << i;
      ASSERT_TRUE(std::isnan(back.get(margin + T * L + i))) << "written after out at " << i;
    }
  }
}

// ---------------------------------------------------------------------------------------------- semantics

// A variable-length pack gives exactly what each sequence gives alone; a fixed-length batch exactly what the
// same rows give as a pack. Zero-length sequences contribute nothing (and must not disturb the neighbours).
TEST(ChunkLocalCumsum, PackedEqualsSeparate) {
  const std::vector<int64_t> cu = {0, 0, 5, 5, 69, 70, 100, 163, 163};
  const int64_t T = cu.back(), L = 2 * 8;
  const HostTensor g = random_g(STRATA_DTYPE_F32, {1, T, 2, 8}, 21);
  const HostTensor h_cu = make_cu(cu);
  for (const std::string& impl : cpu_impls()) {
    ForceImpl force(impl.c_str());
    for (int32_t chunk : {1, 16, 32, 64})
      for (bool reverse : {false, true}) {
        HostTensor packed = poisoned(STRATA_DTYPE_F32, {1, T, 2, 8});
        ASSERT_EQ(run(g, &h_cu, packed, chunk, reverse), STRATA_SUCCESS) << strata_get_last_error_message();
        HostTensor separate = poisoned(STRATA_DTYPE_F32, {1, T, 2, 8});
        for (size_t n = 0; n + 1 < cu.size(); ++n) {
          // Views of sequence n: [1, L_n, 2, 8] at token offset bos.
          strata_tensor_desc gv = g.desc, ov = separate.desc;
          gv.shape[1] = ov.shape[1] = cu[n + 1] - cu[n];
          gv.offset = ov.offset = cu[n] * L;
          ASSERT_EQ(run_descs(&gv, nullptr, &ov, const_cast<uint8_t*>(g.storage.data()), nullptr,
                              separate.storage.data(), chunk, reverse ? 1 : 0, 1.f),
                    STRATA_SUCCESS);
        }
        EXPECT_EQ(packed.storage, separate.storage) << impl << " chunk " << chunk << " reverse " << reverse;
      }
    // Fixed-length [3, 50, 4] == pack [1, 150, 4] with cu = [0, 50, 100, 150].
    const HostTensor gb = random_g(STRATA_DTYPE_BF16, {3, 50, 4}, 22);
    HostTensor batch = poisoned(STRATA_DTYPE_F32, {3, 50, 4}), pack = poisoned(STRATA_DTYPE_F32, {1, 150, 4});
    strata_tensor_desc gp = gb.desc;
    gp.shape[0] = 1;
    gp.shape[1] = 150;
    const HostTensor cu3 = make_cu({0, 50, 100, 150});
    ASSERT_EQ(run(gb, nullptr, batch, 16, false), STRATA_SUCCESS);
    ASSERT_EQ(run_descs(&gp, &cu3.desc, &pack.desc, const_cast<uint8_t*>(gb.storage.data()),
                        const_cast<uint8_t*>(cu3.storage.data()), pack.storage.data(), 16, 0, 1.f),
              STRATA_SUCCESS);
    EXPECT_EQ(batch.storage, pack.storage) << impl;
  }
}

// With g = 1 everywhere, out is scale times the 1-based position inside the chunk (reverse: the number of
// tokens from t to the chunk end), exactly: this pins every chunk boundary, for every chunk size, including
// partial last chunks, boundaries relative to each sequence start, and zero-length sequences.
TEST(ChunkLocalCumsum, ChunkBoundariesAreExactForEveryChunkSize) {
  const std::vector<int64_t> cu = {0, 0, 1, 2, 19, 19, 100, 163, 300, 300};
  const int64_t T = cu.back();
  for (const std::string& impl : cpu_impls()) {
    ForceImpl force(impl.c_str());
    for (int32_t chunk = 1; chunk <= 1024; chunk *= 2)
      for (bool reverse : {false, true})
        for (bool varlen : {false, true}) {
          const std::vector<int64_t> shape = varlen ? std::vector<int64_t>{1, T, 3} : std::vector<int64_t>{2, T, 3};
          HostTensor g = HostTensor::make(STRATA_DTYPE_F32, shape);
          for (int64_t e = 0; e < g.numel(); ++e) g.set(e, 1.0);
          HostTensor out = poisoned(STRATA_DTYPE_F32, shape);
          const HostTensor h_cu = make_cu(cu);
          ASSERT_EQ(run(g, varlen ? &h_cu : nullptr, out, chunk, reverse, 0.5f), STRATA_SUCCESS);
          const std::vector<int64_t> bounds = varlen ? cu : std::vector<int64_t>{0, T};
          for (int64_t b = 0; b < shape[0]; ++b)
            for (size_t n = 0; n + 1 < bounds.size(); ++n)
              for (int64_t t = bounds[n]; t < bounds[n + 1]; ++t) {
                const int64_t k = (t - bounds[n]) % chunk;
                const int64_t len = std::min<int64_t>(chunk, bounds[n + 1] - (t - k));
                const double want = 0.5 * static_cast<double>(reverse ? len - k : k + 1);
                for (int64_t h = 0; h < 3; ++h)
                  ASSERT_EQ(out.get((b * T + t) * 3 + h), want)
                      << impl << " chunk " << chunk << (reverse ? " reverse" : "") << (varlen ? " varlen" : "")
                      << " b " << b << " t " << t;
              }
        }
  }
}

// scale multiplies the f32 sum once, after it: out(scale) == fl(out(1) * scale) bit for bit (the reference
// sums in f64, so this holds for the f32-accumulating implementations).
TEST(ChunkLocalCumsum, ScaleIsAppliedAfterTheSum) {
  const float scale = 1.4426950408889634f;
  const HostTensor g = random_g(STRATA_DTYPE_F32, {2, 130, 3, 5}, 31);
  for (const std::string& impl : cpu_impls()) {
    if (impl == "reference") continue;
    ForceImpl force(impl.c_str());
    for (bool reverse : {false, true}) {
      HostTensor one = poisoned(STRATA_DTYPE_F32, {2, 130, 3, 5}), scaled = poisoned(STRATA_DTYPE_F32, {2, 130, 3, 5});
      ASSERT_EQ(run(g, nullptr, one, 32, reverse, 1.f), STRATA_SUCCESS);
      ASSERT_EQ(run(g, nullptr, scaled, 32, reverse, scale), STRATA_SUCCESS);
      for (int64_t e = 0; e < one.numel(); ++e)
        ASSERT_EQ(static_cast<float>(scaled.get(e)), static_cast<float>(one.get(e)) * scale) << impl << " " << e;
    }
  }
}

TEST(ChunkLocalCumsum, EmptyTensorsAndEmptyPacks) {
  struct Empty {
    std::vector<int64_t> shape, cu;
  };
  for (const Empty& c : std::vector<Empty>{{{2, 0, 3}, {}},
                                           {{0, 5, 3, 4}, {}},
                                           {{2, 7, 0}, {}},
                                           {{1, 0, 3}, {0}},
                                           {{1, 0, 2, 4}, {0, 0, 0}},
                                           {{1, 6, 0, 2}, {0, 2, 6}}}) {
    const auto g = make_desc(STRATA_DTYPE_F32, c.shape), out = make_desc(STRATA_DTYPE_BF16, c.shape);
    const auto cu = make_desc(STRATA_DTYPE_I64, {static_cast<int64_t>(c.cu.size())});
    strata_plan plan = nullptr;
    ASSERT_EQ(strata_chunk_local_cumsum_plan(&g, c.cu.empty() ? nullptr : &cu, &out, 64, 0, 1.f, &plan),
              STRATA_SUCCESS)
        << strata_get_last_error_message();
    EXPECT_STREQ(strata_plan_impl_name(plan), "empty");
    void* t[] = {nullptr, nullptr, nullptr};  // nothing is touched
    EXPECT_EQ(strata_plan_run(plan, t, 3, nullptr, 0, nullptr), STRATA_SUCCESS);
    strata_plan_destroy(plan);
  }
}

TEST(ChunkLocalCumsum, PlanIsReusedWithNewPointers) {
  const HostTensor a = random_g(STRATA_DTYPE_F32, {2, 70, 4}, 41), b = random_g(STRATA_DTYPE_F32, {2, 70, 4}, 42);
  HostTensor oa = poisoned(STRATA_DTYPE_F32, {2, 70, 4}), ob = poisoned(STRATA_DTYPE_F32, {2, 70, 4});
  HostTensor ra = poisoned(STRATA_DTYPE_F32, {2, 70, 4}), rb = poisoned(STRATA_DTYPE_F32, {2, 70, 4});
  ASSERT_EQ(run(a, nullptr, ra, 16, false), STRATA_SUCCESS);
  ASSERT_EQ(run(b, nullptr, rb, 16, false), STRATA_SUCCESS);
  strata_plan plan = nullptr;
  ASSERT_EQ(strata_chunk_local_cumsum_plan(&a.desc, nullptr, &oa.desc, 16, 0, 1.f, &plan), STRATA_SUCCESS);
  void* ta[] = {const_cast<uint8_t*>(a.storage.data()), nullptr, oa.storage.data()};
  void* tb[] = {const_cast<uint8_t*>(b.storage.data()), nullptr, ob.storage.data()};
  ASSERT_EQ(strata_plan_run(plan, ta, 3, nullptr, 0, nullptr), STRATA_SUCCESS);
  ASSERT_EQ(strata_plan_run(plan, tb, 3, nullptr, 0, nullptr), STRATA_SUCCESS);
  strata_plan_destroy(plan);
  EXPECT_EQ(oa.storage, ra.storage);
  EXPECT_EQ(ob.storage, rb.storage);
}

TEST(ChunkLocalCumsum, CppWrapper) {
  Tensor g = Tensor::empty(STRATA_DTYPE_F32, {1, 10, 2});
  float* gp = static_cast<float*>(g.data());
  for (int i = 0; i < 20; ++i) gp[i] = static_cast<float>(i % 3) - 1.f;
  Tensor cu = Tensor::empty(STRATA_DTYPE_I64, {3});
  const int64_t cuv[] = {0, 3, 10};
  std::memcpy(cu.data(), cuv, sizeof(cuv));
  const Tensor out = chunk_local_cumsum(g, 4, /*reverse=*/false, /*scale=*/2.f, &cu, STRATA_DTYPE_F64);
  ASSERT_EQ(out.dtype(), STRATA_DTYPE_F64);
  const double* o = static_cast<const double*>(out.data());
  // Chunks: [0, 3), [3, 7), [7, 10).
  for (int64_t t = 0; t < 10; ++t)
    for (int64_t h = 0; h < 2; ++h) {
      const int64_t start = t < 3 ? 0 : (t < 7 ? 3 : 7);
      double want = 0;
      for (int64_t u = start; u <= t; ++u) want += gp[u * 2 + h];
      EXPECT_EQ(o[t * 2 + h], 2.0 * want) << t << " " << h;
    }
  EXPECT_THROW(chunk_local_cumsum(g, 12), Error);
}

}  // namespace
}  // namespace strata
