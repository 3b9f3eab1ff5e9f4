// chunk_loss's C++ wrapper (include/strata/ops/chunk_loss.hpp) against the C API on the same problem.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>

#include "strata/ops.h"
#include "strata/strata.hpp"
#include "testkit/testkit.h"

namespace strata {
namespace {

using atk::HostTensor;

TEST(ChunkLoss, CppWrapperMatchesCApi) {
  std::mt19937_64 rng(4);
  HostTensor hh = HostTensor::make(STRATA_DTYPE_F32, {20, 32}), ww = HostTensor::make(STRATA_DTYPE_F32, {50, 32});
  HostTensor bb = HostTensor::make(STRATA_DTYPE_F32, {50}), tt = HostTensor::make(STRATA_DTYPE_I64, {20});
  hh.fill_normal(rng, 0, 1);
  ww.fill_normal(rng, 0, 0.3);
  bb.fill_normal(rng, 0, 1);
  for (int64_t i = 0; i < 20; ++i) tt.set(i, static_cast<double>((i * 7) % 50));
  tt.set(3, -100.0);
  strata_chunk_loss_options o;
  strata_chunk_loss_options_init(&o);
  o.label_smoothing = 0.1f;
  // The C API on the host tensors.
  HostTensor loss = HostTensor::make(STRATA_DTYPE_F32, {}), lse = HostTensor::make(STRATA_DTYPE_F32, {20});
  HostTensor dh = HostTensor::make(STRATA_DTYPE_F32, {20, 32}), dw = HostTensor::make(STRATA_DTYPE_F32, {50, 32});
  HostTensor db = HostTensor::make(STRATA_DTYPE_F32, {50});
  strata_plan plan = nullptr;
  ASSERT_EQ(strata_chunk_loss_plan(&hh.desc, &ww.desc, &bb.desc, &tt.desc, &loss.desc, &lse.desc, &dh.desc, &dw.desc,
                                   &db.desc, &o, &plan),
            STRATA_SUCCESS);
  size_t ws = 0;
  strata_plan_workspace_size(plan, &ws);
  std::vector<uint8_t> work(ws);
  void* tp[] = {hh.storage.data(), ww.storage.data(), bb.storage.data(), tt.storage.data(), loss.storage.data(),
                lse.storage.data(), dh.storage.data(), dw.storage.data(), db.storage.data()};
  ASSERT_EQ(strata_plan_run(plan, tp, 9, work.data(), ws, nullptr), STRATA_SUCCESS);
  strata_plan_destroy(plan);
  struct {
    HostTensor h, w, b, t, loss, dw;
  } pr{hh, ww, bb, tt, loss, dw};
  const Tensor h = Tensor::view(pr.h.storage.data(), pr.h.desc), w = Tensor::view(pr.w.storage.data(), pr.w.desc);
  const Tensor b = Tensor::view(pr.b.storage.data(), pr.b.desc), t = Tensor::view(pr.t.storage.data(), pr.t.desc);
  ChunkLossResult r = chunk_loss(h, w, t, &b, true, false, &o);
  EXPECT_EQ(std::memcmp(r.loss.data(), pr.loss.storage.data(), 4), 0);
  EXPECT_EQ(std::memcmp(r.dweight.data(), pr.dw.storage.data(), pr.dw.storage.size()), 0);
  ChunkLossResult g = chunk_loss_bwd(h, w, t, r.lse, nullptr, &b, false, &o);
  for (int64_t e = 0; e < 50 * 32; ++e)
    EXPECT_NEAR(static_cast<const float*>(g.dweight.data())[e], static_cast<const float*>(r.dweight.data())[e], 1e-6);
}

}  // namespace
}  // namespace strata
