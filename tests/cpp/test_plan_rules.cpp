// Run-time pointer rules (docs/DESIGN.md "Run-time pointer rules"): strata_plan_run rejects a non-NULL pointer for
// a tensor the plan was made without, for every op, with STRATA_ERROR_INVALID_VALUE and before any kernel runs.
// A generic test over the op registry, then one per op family on real buffers: a plan made without an optional
// tensor, run with a pointer for it, writes nothing (outputs stay NaN-poisoned); the same call without it runs.
#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <string>
#include <vector>

#include "opbase/plan.h"
#include "strata/ops.h"
#include "testkit/testkit.h"

namespace strata {
namespace {

using atk::HostTensor;

constexpr strata_device kCpu{STRATA_DEVICE_CPU, 0};

std::string last_error() { return strata_get_last_error_message(); }

bool all_poison(const HostTensor& t) {
  return std::all_of(t.storage.begin(), t.storage.end(), [](uint8_t b) { return b == 0xff; });
}

HostTensor filled(int32_t dtype, const std::vector<int64_t>& shape, uint64_t seed) {
  HostTensor t = HostTensor::make(dtype, shape);
  std::mt19937_64 rng(seed);
  t.fill_uniform(rng, -1.0, 1.0);
  return t;
}

HostTensor poisoned(int32_t dtype, const std::vector<int64_t>& shape) {
  HostTensor t = HostTensor::make(dtype, shape);
  t.poison();
  return t;
}

void* dat(HostTensor& t) { return t.storage.data(); }

// Every registered op's probe plan (strata info's representative problem, on the CPU): for each tensor the probe
// did not give, a run whose only non-NULL pointer is that tensor's fails with INVALID_VALUE naming it, and the
// buffer it points at is untouched. (With every given tensor NULL, a run that got past the rule would stop at the
// NULL-pointer rule instead of reaching a kernel: the failure mode of this test is a wrong status, not a crash.)
TEST(PlanRules, EveryOpRejectsAPointerForATensorItsPlanWasMadeWithout) {
  int ops_with_absent = 0;
  for (const OpInfo& op : registered_ops()) {
    SCOPED_TRACE(op.name);
    strata_plan plan = nullptr;
    ASSERT_EQ(op.probe(kCpu, &plan), STRATA_SUCCESS) << last_error();
    const Plan* p = plan_from_handle(plan);
    ASSERT_NE(p, nullptr);
    EXPECT_EQ(p->op, op.name) << "the probe plans another op";  // strata info shows the probe's verdicts
    EXPECT_EQ(p->required_mask & p->absent_mask, 0u);
    std::vector<uint8_t> canary(256, 0x5a);
    for (int i = 0; i < p->num_tensors; ++i) {
      if (!(p->absent_mask >> i & 1u)) continue;
      std::vector<void*> t(static_cast<size_t>(p->num_tensors), nullptr);
      t[static_cast<size_t>(i)] = canary.data();
      EXPECT_EQ(strata_plan_run(plan, t.data(), p->num_tensors, nullptr, 0, nullptr), STRATA_ERROR_INVALID_VALUE)
          << "tensor " << i;
      EXPECT_NE(last_error().find("tensor " + std::to_string(i) + " was not given when the plan was made"),
                std::string::npos)
          << last_error();
    }
    EXPECT_TRUE(std::all_of(canary.begin(), canary.end(), [](uint8_t b) { return b == 0x5a; }));
    ops_with_absent += p->absent_mask != 0;
    strata_plan_destroy(plan);
  }
  // Most probes leave an optional tensor out (l2norm and rmsnorm_without_weight have none in NORMALIZE mode).
  EXPECT_GE(ops_with_absent, static_cast<int>(registered_ops().size()) / 2);
}

// Runs `plan` with `ptrs` plus a pointer to `extra` at `slot` (a tensor the plan was made without): rejected, every
// output and `extra` still poisoned. Then without it: runs, writes the first output and leaves `extra` alone.
void expect_rejected_then_runs(strata_plan plan, std::vector<void*> ptrs, int slot, HostTensor& extra,
                               const std::vector<const HostTensor*>& outputs) {
  ASSERT_NE(plan, nullptr);
  size_t ws = 0;
  ASSERT_EQ(strata_plan_workspace_size(plan, &ws), STRATA_SUCCESS);
  std::vector<uint8_t> work(ws + 1);
  ASSERT_EQ(ptrs[static_cast<size_t>(slot)], nullptr);
  ptrs[static_cast<size_t>(slot)] = dat(extra);
  const auto n = static_cast<int32_t>(ptrs.size());
  EXPECT_EQ(strata_plan_run(plan, ptrs.data(), n, work.data(), ws, nullptr), STRATA_ERROR_INVALID_VALUE);
  EXPECT_NE(last_error().find("tensor " + std::to_string(slot) + " was not given"), std::string::npos)
      << last_error();
  for (const HostTensor* o : outputs) EXPECT_TRUE(all_poison(*o));
  EXPECT_TRUE(all_poison(extra));
  ptrs[static_cast<size_t>(slot)] = nullptr;
  EXPECT_EQ(strata_plan_run(plan, ptrs.data(), n, work.data(), ws, nullptr), STRATA_SUCCESS) << last_error();
  EXPECT_FALSE(all_poison(*outputs.front()));
  EXPECT_TRUE(all_poison(extra));
  strata_plan_destroy(plan);
}

// causal_conv1d backward without dbias: the CPU kernel sums dbias partials per time tile into the workspace, which
// a plan without dbias does not size for them.
TEST(PlanRules, CausalConv1dBackwardWithoutDbias) {
  HostTensor x = filled(STRATA_DTYPE_F32, {1, 8, 4}, 1), w = filled(STRATA_DTYPE_F32, {4, 3}, 2);
  HostTensor dy = filled(STRATA_DTYPE_F32, {1, 8, 4}, 3);
  HostTensor dx = poisoned(STRATA_DTYPE_F32, {1, 8, 4}), dw = poisoned(STRATA_DTYPE_F32, {4, 3});
  HostTensor db = poisoned(STRATA_DTYPE_F32, {4});
  strata_plan plan = nullptr;
  ASSERT_EQ(strata_causal_conv1d_bwd_plan(&x.desc, &w.desc, nullptr, nullptr, nullptr, nullptr, &dy.desc, nullptr,
                                          &dx.desc, &dw.desc, nullptr, nullptr, 1, 0, &plan),
            STRATA_SUCCESS)
      << last_error();
  expect_rejected_then_runs(
      plan, {dat(x), dat(w), nullptr, nullptr, nullptr, nullptr, dat(dy), nullptr, dat(dx), dat(dw), nullptr, nullptr},
      10, db, {&dx, &dw});
}

// chunk_loss forward without gradients, given a dhidden pointer (its test driver used to pass every pointer).
TEST(PlanRules, ChunkLossGradientFreeForwardWithADhiddenPointer) {
  HostTensor h = filled(STRATA_DTYPE_F32, {4, 8}, 1), w = filled(STRATA_DTYPE_F32, {6, 8}, 2);
  HostTensor t = HostTensor::make(STRATA_DTYPE_I64, {4});
  for (int64_t i = 0; i < 4; ++i) t.set(i, static_cast<double>(i + 1));
  HostTensor loss = poisoned(STRATA_DTYPE_F32, {}), lse = poisoned(STRATA_DTYPE_F32, {4});
  HostTensor dh = poisoned(STRATA_DTYPE_F32, {4, 8});
  strata_plan plan = nullptr;
  ASSERT_EQ(strata_chunk_loss_plan(&h.desc, &w.desc, nullptr, &t.desc, &loss.desc, &lse.desc, nullptr, nullptr, nullptr,
                                   nullptr, &plan),
            STRATA_SUCCESS)
      << last_error();
  expect_rejected_then_runs(plan, {dat(h), dat(w), nullptr, dat(t), dat(loss), dat(lse), nullptr, nullptr, nullptr}, 6,
                            dh, {&loss, &lse});
}

// rmsnorm_without_weight in FACTOR mode has no y: a y pointer is rejected.
TEST(PlanRules, RowNormFactorModeWithAYPointer) {
  HostTensor x = filled(STRATA_DTYPE_F32, {3, 16}, 1), r = poisoned(STRATA_DTYPE_F32, {3, 1});
  HostTensor y = poisoned(STRATA_DTYPE_F32, {3, 16});
  strata_plan plan = nullptr;
  ASSERT_EQ(strata_rmsnorm_without_weight_fwd_plan(&x.desc, nullptr, &r.desc, 1e-6f, STRATA_RMSNORM_FACTOR, &plan),
            STRATA_SUCCESS)
      << last_error();
  expect_rejected_then_runs(plan, {dat(x), nullptr, dat(r)}, 1, y, {&r});
}

// A GDN forward sub-op: chunk_gated_delta_rule_fwd_h without final_state (B = 1, T = 20, H = HV = 2, K = V = 16).
TEST(PlanRules, GdnFwdHWithoutFinalState) {
  HostTensor k = filled(STRATA_DTYPE_F32, {1, 20, 2, 16}, 1), w = filled(STRATA_DTYPE_F32, {1, 20, 2, 16}, 2);
  HostTensor u = filled(STRATA_DTYPE_F32, {1, 20, 2, 16}, 3);
  HostTensor h = poisoned(STRATA_DTYPE_F32, {1, 2, 2, 16, 16}), ht = poisoned(STRATA_DTYPE_F32, {1, 2, 16, 16});
  strata_plan plan = nullptr;
  ASSERT_EQ(strata_chunk_gated_delta_rule_fwd_h_plan(&k.desc, &w.desc, &u.desc, nullptr, nullptr, nullptr, &h.desc,
                                                     nullptr, nullptr, 16, &plan),
            STRATA_SUCCESS)
      << last_error();
  expect_rejected_then_runs(plan, {dat(k), dat(w), dat(u), nullptr, nullptr, nullptr, dat(h), nullptr, nullptr}, 8, ht,
                            {&h});
}

// A GDN backward sub-op: chunk_bwd_dv_local without g, given a g pointer (an input: the kernel would read a gate
// the plan's problem does not have).
TEST(PlanRules, GdnBwdDvLocalWithoutGate) {
  HostTensor q = filled(STRATA_DTYPE_F32, {1, 20, 2, 16}, 1), k = filled(STRATA_DTYPE_F32, {1, 20, 2, 16}, 2);
  HostTensor dout = filled(STRATA_DTYPE_F32, {1, 20, 2, 16}, 3), dv = poisoned(STRATA_DTYPE_F32, {1, 20, 2, 16});
  HostTensor g = poisoned(STRATA_DTYPE_F32, {1, 20, 2});
  strata_plan plan = nullptr;
  ASSERT_EQ(strata_chunk_bwd_dv_local_plan(&q.desc, &k.desc, &dout.desc, nullptr, nullptr, &dv.desc, 0.25f, 16, &plan),
            STRATA_SUCCESS)
      << last_error();
  expect_rejected_then_runs(plan, {dat(q), dat(k), dat(dout), nullptr, nullptr, dat(dv)}, 3, g, {&dv});
}

// The full chunk_gated_delta_rule forward without final_state (B = 1, T = 20, H = HV = 2, K = V = 16).
TEST(PlanRules, ChunkGatedDeltaRuleForwardWithoutFinalState) {
  HostTensor q = filled(STRATA_DTYPE_F32, {1, 20, 2, 16}, 1), k = filled(STRATA_DTYPE_F32, {1, 20, 2, 16}, 2);
  HostTensor v = filled(STRATA_DTYPE_F32, {1, 20, 2, 16}, 3), g = filled(STRATA_DTYPE_F32, {1, 20, 2}, 4);
  HostTensor beta = filled(STRATA_DTYPE_F32, {1, 20, 2}, 5);
  for (int64_t i = 0; i < g.numel(); ++i) g.set(i, -0.1 * (1.0 + g.get(i)));
  HostTensor o = poisoned(STRATA_DTYPE_F32, {1, 20, 2, 16}), ht = poisoned(STRATA_DTYPE_F32, {1, 2, 16, 16});
  strata_plan plan = nullptr;
  ASSERT_EQ(strata_chunk_gated_delta_rule_fwd_plan(&q.desc, &k.desc, &v.desc, &g.desc, &beta.desc, nullptr, nullptr,
                                                   &o.desc, nullptr, nullptr, 0.25f, 1, &plan),
            STRATA_SUCCESS)
      << last_error();
  expect_rejected_then_runs(
      plan, {dat(q), dat(k), dat(v), dat(g), dat(beta), nullptr, nullptr, dat(o), nullptr, nullptr}, 8, ht, {&o});
}

// A given-but-empty tensor counts as given: NULL or not, its pointer is accepted. An empty plan (causal_conv1d with
// T = 0) still rejects a pointer for a tensor it was made without; a non-empty one (chunk_gated_delta_rule on the
// CPU with an empty saved buffer, which the CPU implementations ignore) takes any pointer for the empty tensor.
TEST(PlanRules, GivenButEmptyTensorsAcceptAnyPointer) {
  HostTensor x = HostTensor::make(STRATA_DTYPE_F32, {1, 0, 4}), y = HostTensor::make(STRATA_DTYPE_F32, {1, 0, 4});
  HostTensor w = filled(STRATA_DTYPE_F32, {4, 3}, 2), bias = filled(STRATA_DTYPE_F32, {4}, 3);
  HostTensor res = poisoned(STRATA_DTYPE_F32, {1, 8, 4});
  strata_plan plan = nullptr;
  ASSERT_EQ(strata_causal_conv1d_fwd_plan(&x.desc, &w.desc, &bias.desc, nullptr, nullptr, nullptr, nullptr, &y.desc,
                                          nullptr, 1, 0, &plan),
            STRATA_SUCCESS)
      << last_error();
  void* t[] = {nullptr, dat(w), dat(bias), nullptr, nullptr, nullptr, nullptr, nullptr, nullptr};
  EXPECT_EQ(strata_plan_run(plan, t, 9, nullptr, 0, nullptr), STRATA_SUCCESS) << last_error();
  t[0] = dat(x), t[7] = dat(y);
  EXPECT_EQ(strata_plan_run(plan, t, 9, nullptr, 0, nullptr), STRATA_SUCCESS) << last_error();
  t[3] = dat(res);  // residual was not given
  EXPECT_EQ(strata_plan_run(plan, t, 9, nullptr, 0, nullptr), STRATA_ERROR_INVALID_VALUE);
  EXPECT_TRUE(all_poison(res));
  strata_plan_destroy(plan);

  HostTensor q = filled(STRATA_DTYPE_F32, {1, 20, 2, 16}, 1), k = filled(STRATA_DTYPE_F32, {1, 20, 2, 16}, 2);
  HostTensor v = filled(STRATA_DTYPE_F32, {1, 20, 2, 16}, 3), g = filled(STRATA_DTYPE_F32, {1, 20, 2}, 4);
  HostTensor beta = filled(STRATA_DTYPE_F32, {1, 20, 2}, 5), saved = HostTensor::make(STRATA_DTYPE_U8, {0});
  for (int64_t i = 0; i < g.numel(); ++i) g.set(i, -0.1 * (1.0 + g.get(i)));
  HostTensor o = poisoned(STRATA_DTYPE_F32, {1, 20, 2, 16});
  ASSERT_EQ(strata_chunk_gated_delta_rule_fwd_plan(&q.desc, &k.desc, &v.desc, &g.desc, &beta.desc, nullptr, nullptr,
                                                   &o.desc, nullptr, &saved.desc, 0.25f, 1, &plan),
            STRATA_SUCCESS)
      << last_error();
  size_t ws = 0;
  strata_plan_workspace_size(plan, &ws);
  std::vector<uint8_t> work(ws + 1);
  for (void* sp : {static_cast<void*>(nullptr), dat(saved)}) {
    o.poison();
    void* gt[] = {dat(q), dat(k), dat(v), dat(g), dat(beta), nullptr, nullptr, dat(o), nullptr, sp};
    EXPECT_EQ(strata_plan_run(plan, gt, 10, work.data(), ws, nullptr), STRATA_SUCCESS) << last_error();
    EXPECT_FALSE(all_poison(o));
  }
  strata_plan_destroy(plan);
}

}  // namespace
}  // namespace strata
