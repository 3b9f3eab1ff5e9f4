// The C++ wrappers of the five fused ops (include/strata/ops/*.hpp) on CUDA tensors: each wrapper runs on host
// tensors and on copies of them on CUDA device 0, and every output of the CUDA call must match the CPU call's
// (f32 inputs: max |cuda - cpu| <= 2e-5 x max |cpu|, NaN nowhere). The host-only CppWrapper tests of each op
// (test_<op>.cpp) check the values by hand; these check that the wrappers size, place and run everything on
// the tensors' device (outputs allocated there, the CUDA workspace from the device allocator). Also: a bad
// target through fused_cross_entropy's C++ wrapper on CUDA throws and writes nothing into the in-place logits.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "strata/ops.h"
#include "strata/strata.hpp"
#include "testkit/testkit.h"

namespace strata {
namespace {

const Device kCuda = Device::cuda(0);

size_t bytes_of(const Tensor& t) { return static_cast<size_t>(t.numel()) * strata_dtype_size(t.dtype()); }

// A copy of host tensor h on `dev` (an empty tensor stays empty).
Tensor copy_to(const Tensor& h, Device dev) {
  if (!h.data()) return Tensor();
  Tensor t = Tensor::empty(h.dtype(), h.shape(), dev);
  check(strata_memcpy(t.data(), h.data(), bytes_of(h), STRATA_MEMCPY_DEFAULT));
  return t;
}

// f32 host tensor with deterministic values a * sin(b * i + c).
Tensor wave(std::vector<int64_t> shape, float a, float b, float c) {
  Tensor t = Tensor::empty(STRATA_DTYPE_F32, std::move(shape));
  float* p = static_cast<float*>(t.data());
  for (int64_t i = 0; i < t.numel(); ++i) p[i] = a * std::sin(b * static_cast<float>(i) + c);
  return t;
}

// Output `what` of the CUDA call (device tensor g) against the CPU call's (host tensor c).
void expect_match(const Tensor& c, const Tensor& g, const std::string& what) {
  ASSERT_EQ(c.data() == nullptr, g.data() == nullptr) << what << ": present on one device only";
  if (!c.data()) return;
  ASSERT_EQ(c.shape(), g.shape()) << what;
  ASSERT_EQ(c.dtype(), STRATA_DTYPE_F32) << what;
  EXPECT_EQ(g.device().d.type, STRATA_DEVICE_CUDA) << what << ": output not on the CUDA device";
  std::vector<float> gh(static_cast<size_t>(g.numel()));
  check(strata_device_synchronize(kCuda.d));
  check(strata_memcpy(gh.data(), g.data(), bytes_of(g), STRATA_MEMCPY_DEVICE_TO_HOST));
  const float* cp = static_cast<const float*>(c.data());
  double scale = 0, err = 0;
  for (int64_t i = 0; i < c.numel(); ++i) {
    ASSERT_FALSE(std::isnan(cp[i]) || std::isnan(gh[i])) << what << " element " << i;
    scale = std::max(scale, std::fabs(static_cast<double>(cp[i])));
    err = std::max(err, std::fabs(static_cast<double>(cp[i]) - gh[i]));
  }
  EXPECT_LE(err, 2e-5 * std::max(scale, 1e-30)) << what << ": max |cuda - cpu| " << err << ", max |cpu| " << scale;
}

bool have_cuda_device() {
  int32_t n = 0;
  return strata_device_count(STRATA_DEVICE_CUDA, &n) == STRATA_SUCCESS && n > 0;
}

TEST(RmsNormGated, CppWrapperOnCuda) {
  if (!have_cuda_device()) GTEST_SKIP() << "no CUDA device";
  const Tensor x = wave({5, 32}, 0.3f, 0.37f, 0.1f), z = wave({5, 32}, 0.5f, 0.11f, 0.4f);
  const Tensor w = wave({32}, 0.2f, 0.7f, 1.f), b = wave({32}, 0.1f, 0.3f, 0.f), r = wave({5, 32}, 0.2f, 0.05f, 2.f);
  const Tensor dy = wave({5, 32}, 1.f, 0.13f, 0.7f), dro = wave({5, 32}, 0.5f, 0.21f, 0.3f);
  const Tensor xg = copy_to(x, kCuda), zg = copy_to(z, kCuda), wg = copy_to(w, kCuda), bg = copy_to(b, kCuda);
  const Tensor rg = copy_to(r, kCuda), dyg = copy_to(dy, kCuda), drog = copy_to(dro, kCuda);
  RmsNormGatedOptions o;
  o.group_size = 16;
  o.prenorm = true;
  auto [y, rstd, ro] = rms_norm_gated_fwd(x, z, &w, &b, &r, o);
  auto [yg, rstdg, rog] = rms_norm_gated_fwd(xg, zg, &wg, &bg, &rg, o);
  expect_match(y, yg, "y"), expect_match(rstd, rstdg, "rstd"), expect_match(ro, rog, "residual_out");
  auto [dx, dz, dw, db] = rms_norm_gated_bwd(x, z, &w, &b, &r, rstd, dy, &dro, o);
  auto [dxg, dzg, dwg, dbg] = rms_norm_gated_bwd(xg, zg, &wg, &bg, &rg, rstdg, dyg, &drog, o);
  expect_match(dx, dxg, "dx"), expect_match(dz, dzg, "dz"), expect_match(dw, dwg, "dweight");
  expect_match(db, dbg, "dbias");
}

TEST(ClippedSwiglu, CppWrapperOnCuda) {
  if (!have_cuda_device()) GTEST_SKIP() << "no CUDA device";
  const Tensor x = wave({3, 64}, 9.f, 0.61f, 0.2f), probs = wave({3}, 0.4f, 1.f, 1.f);
  const Tensor dy = wave({3, 32}, 1.f, 0.29f, 0.5f);
  const Tensor xg = copy_to(x, kCuda), pg = copy_to(probs, kCuda), dyg = copy_to(dy, kCuda);
  for (bool interleaved : {true, false}) {
    ClippedSwigluOptions o;
    o.interleaved = interleaved;
    const std::string tag = interleaved ? " (interleaved)" : " (split)";
    expect_match(clipped_swiglu_fwd(x, &probs, o), clipped_swiglu_fwd(xg, &pg, o), "y" + tag);
    auto [dx, dp] = clipped_swiglu_bwd(x, &probs, dy, o);
    auto [dxg, dpg] = clipped_swiglu_bwd(xg, &pg, dyg, o);
    expect_match(dx, dxg, "dx" + tag), expect_match(dp, dpg, "dprobs" + tag);
  }
}

TEST(CausalConv1d, CppWrapperOnCuda) {
  if (!have_cuda_device()) GTEST_SKIP() << "no CUDA device";
  const Tensor x = wave({2, 20, 8}, 1.f, 0.1f, 0.f), w = wave({8, 3}, 0.3f, 0.9f, 0.2f), b = wave({8}, 0.1f, 1.f, 0.f);
  const Tensor h0 = wave({2, 8, 2}, 0.5f, 0.3f, 0.f), dy = wave({2, 20, 8}, 1.f, 0.17f, 0.3f);
  const Tensor dhT = wave({2, 8, 2}, 0.2f, 0.4f, 0.1f);
  const Tensor xg = copy_to(x, kCuda), wg = copy_to(w, kCuda), bg = copy_to(b, kCuda), h0g = copy_to(h0, kCuda);
  const Tensor dyg = copy_to(dy, kCuda), dhTg = copy_to(dhT, kCuda);
  CausalConv1dOptions o;
  o.output_final_state = true;
  auto [y, hT] = causal_conv1d_fwd(x, w, &b, nullptr, &h0, nullptr, nullptr, o);
  auto [yg, hTg] = causal_conv1d_fwd(xg, wg, &bg, nullptr, &h0g, nullptr, nullptr, o);
  expect_match(y, yg, "y"), expect_match(hT, hTg, "final_state");
  auto [dx, dw, db, dh0] = causal_conv1d_bwd(x, w, &b, &h0, nullptr, nullptr, dy, &dhT, o);
  auto [dxg, dwg, dbg, dh0g] = causal_conv1d_bwd(xg, wg, &bg, &h0g, nullptr, nullptr, dyg, &dhTg, o);
  expect_match(dx, dxg, "dx"), expect_match(dw, dwg, "dweight"), expect_match(db, dbg, "dbias");
  expect_match(dh0, dh0g, "dinitial_state");
}

TEST(FusedCrossEntropy, CppWrapperOnCuda) {
  if (!have_cuda_device()) GTEST_SKIP() << "no CUDA device";
  const int64_t N = 6, V = 1000;  // V = 1000 f32: a cluster shape (the default implementation)
  const Tensor x = wave({N, V}, 3.f, 0.013f, 0.1f);
  Tensor y = Tensor::empty(STRATA_DTYPE_I64, {N});
  for (int64_t i = 0; i < N; ++i) static_cast<int64_t*>(y.data())[i] = i == 2 ? -100 : (i * 137 + 5) % V;
  Tensor dloss = Tensor::empty(STRATA_DTYPE_F32, {});
  *static_cast<float*>(dloss.data()) = 0.5f;
  const Tensor xg = copy_to(x, kCuda), yg = copy_to(y, kCuda), dlg = copy_to(dloss, kCuda);
  CrossEntropyOptions o;
  o.label_smoothing = 0.1f;
  o.lse_square_scale = 1e-3f;
  CrossEntropyResult r = fused_cross_entropy_fwd(x, y, o), rg = fused_cross_entropy_fwd(xg, yg, o);
  expect_match(r.loss, rg.loss, "loss"), expect_match(r.lse, rg.lse, "lse"), expect_match(r.z_loss, rg.z_loss, "z");
  expect_match(fused_cross_entropy_bwd(x, y, r.lse, dloss, o), fused_cross_entropy_bwd(xg, yg, rg.lse, dlg, o),
               "dlogits");
  // In place on CUDA: the logits become the gradient of the loss (grad_scale 1, mean), as the backward op gives.
  const Tensor xc = copy_to(x, Device::cpu()), xi = copy_to(x, kCuda);
  fused_cross_entropy_fwd(xc, y, o, &xc);
  fused_cross_entropy_fwd(xi, yg, o, &xi);
  expect_match(xc, xi, "in-place gradient");
  // A bad target through the wrapper on CUDA: throws, the in-place logits keep their values.
  Tensor bad = copy_to(y, Device::cpu());
  static_cast<int64_t*>(bad.data())[4] = V;
  const Tensor badg = copy_to(bad, kCuda), xb = copy_to(x, kCuda);
  try {
    fused_cross_entropy_fwd(xb, badg, o, &xb);
    ADD_FAILURE() << "a target of V on CUDA did not throw";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("target[4] must be in [0, 1000)"), std::string::npos) << e.what();
  }
  expect_match(x, xb, "logits after the rejected in-place call");
}

TEST(ChunkLoss, CppWrapperOnCuda) {
  if (!have_cuda_device()) GTEST_SKIP() << "no CUDA device";
  const int64_t N = 20, D = 32, V = 50;
  const Tensor h = wave({N, D}, 1.f, 0.37f, 0.f), w = wave({V, D}, 0.3f, 0.23f, 0.5f), b = wave({V}, 1.f, 0.7f, 0.f);
  Tensor t = Tensor::empty(STRATA_DTYPE_I64, {N});
  for (int64_t i = 0; i < N; ++i) static_cast<int64_t*>(t.data())[i] = i == 3 ? -100 : (i * 7) % V;
  const Tensor hg = copy_to(h, kCuda), wg = copy_to(w, kCuda), bg = copy_to(b, kCuda), tg = copy_to(t, kCuda);
  strata_chunk_loss_options o;
  strata_chunk_loss_options_init(&o);
  o.label_smoothing = 0.1f;
  for (int32_t strategy : {STRATA_CHUNK_LOSS_TOKEN_CHUNKED, STRATA_CHUNK_LOSS_VOCAB_TILED}) {
    o.strategy = strategy;
    const std::string tag = " (strategy " + std::to_string(strategy) + ")";
    ChunkLossResult r = chunk_loss(h, w, t, &b, true, false, &o), rg = chunk_loss(hg, wg, tg, &bg, true, false, &o);
    expect_match(r.loss, rg.loss, "loss" + tag), expect_match(r.lse, rg.lse, "lse" + tag);
    expect_match(r.dhidden, rg.dhidden, "dhidden" + tag), expect_match(r.dweight, rg.dweight, "dweight" + tag);
    expect_match(r.dbias, rg.dbias, "dbias" + tag);
  }
  ChunkLossResult r = chunk_loss(h, w, t, &b, false, false, &o), rg = chunk_loss(hg, wg, tg, &bg, false, false, &o);
  ChunkLossResult g = chunk_loss_bwd(h, w, t, r.lse, nullptr, &b, false, &o);
  ChunkLossResult gg = chunk_loss_bwd(hg, wg, tg, rg.lse, nullptr, &bg, false, &o);
  expect_match(g.dhidden, gg.dhidden, "chunk_loss_bwd dhidden"), expect_match(g.dweight, gg.dweight, "bwd dweight");
  expect_match(g.dbias, gg.dbias, "chunk_loss_bwd dbias");
}

}  // namespace
}  // namespace strata
