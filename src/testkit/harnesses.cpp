// The list of op harnesses (one factory per op, defined next to the op in src/ops/<family>/<op>/testkit_*.cpp).
// The foundation ops are listed here; every other operator family lists its factories in
// testkit/lists/<family>.inc as STRATA_HARNESS(make_<op>_harness) lines, included twice below (declarations,
// then the list). The list is explicit because harness objects in a static library are linked only when
// referenced.
#include "testkit/testkit.h"

namespace strata::atk {

std::unique_ptr<OpHarness> make_l2norm_fwd_harness();
std::unique_ptr<OpHarness> make_l2norm_bwd_harness();
std::unique_ptr<OpHarness> make_rmsnorm_without_weight_fwd_harness();
std::unique_ptr<OpHarness> make_rmsnorm_without_weight_bwd_harness();
std::unique_ptr<OpHarness> make_chunk_local_cumsum_harness();

#define STRATA_HARNESS(factory) std::unique_ptr<OpHarness> factory();
#include "testkit/lists/gdn_fwd.inc"
#include "testkit/lists/gdn_bwd.inc"
#include "testkit/lists/chunk_gated_delta_rule.inc"
#include "testkit/lists/rms_norm_gated.inc"
#include "testkit/lists/clipped_swiglu.inc"
#include "testkit/lists/causal_conv1d.inc"
#include "testkit/lists/fused_cross_entropy.inc"
#include "testkit/lists/chunk_loss.inc"
#undef STRATA_HARNESS

std::vector<std::unique_ptr<OpHarness>> all_harnesses() {
  std::vector<std::unique_ptr<OpHarness>> h;
  h.push_back(make_l2norm_fwd_harness());
  h.push_back(make_l2norm_bwd_harness());
  h.push_back(make_rmsnorm_without_weight_fwd_harness());
  h.push_back(make_rmsnorm_without_weight_bwd_harness());
  h.push_back(make_chunk_local_cumsum_harness());
#define STRATA_HARNESS(factory) h.push_back(factory());
#include "testkit/lists/gdn_fwd.inc"
#include "testkit/lists/gdn_bwd.inc"
#include "testkit/lists/chunk_gated_delta_rule.inc"
#include "testkit/lists/rms_norm_gated.inc"
#include "testkit/lists/clipped_swiglu.inc"
#include "testkit/lists/causal_conv1d.inc"
#include "testkit/lists/fused_cross_entropy.inc"
#include "testkit/lists/chunk_loss.inc"
#undef STRATA_HARNESS
  return h;
}

}  // namespace strata::atk
