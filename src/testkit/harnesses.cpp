// The list of op harnesses (one factory per op, defined next to the op in src/ops/<family>/<op>/testkit_*.cpp).
#include "testkit/testkit.h"

namespace strata::atk {

std::unique_ptr<OpHarness> make_l2norm_fwd_harness();
std::unique_ptr<OpHarness> make_l2norm_bwd_harness();
std::unique_ptr<OpHarness> make_rmsnorm_without_weight_fwd_harness();
std::unique_ptr<OpHarness> make_rmsnorm_without_weight_bwd_harness();
std::unique_ptr<OpHarness> make_chunk_local_cumsum_harness();

std::vector<std::unique_ptr<OpHarness>> all_harnesses() {
  std::vector<std::unique_ptr<OpHarness>> h;
  h.push_back(make_l2norm_fwd_harness());
  h.push_back(make_l2norm_bwd_harness());
  h.push_back(make_rmsnorm_without_weight_fwd_harness());
  h.push_back(make_rmsnorm_without_weight_bwd_harness());
  h.push_back(make_chunk_local_cumsum_harness());
  return h;
}

}  // namespace strata::atk
