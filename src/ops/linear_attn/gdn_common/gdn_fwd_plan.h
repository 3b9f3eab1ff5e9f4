// The plan builder shared by the six GDN forward operators: each op's C function lists its tensors
// (TensorSpec + the GdnFwdParams field each binds to) and attributes, and gets validation, the implementation
// list (cuda.sm90.<kernel>, cpu.<isa>, reference), workspace (the chunk offsets of a varlen pack), the plan
// cache and dispatch from here.
#pragma once

#include <vector>

#include "opbase/plan.h"
#include "ops/linear_attn/gdn_common/gdn_fwd_kernels.h"
#include "ops/linear_attn/gdn_common/gdn_validate.h"

namespace strata::linear_attn::gdn {

// Where run-time pointer i goes.
enum class Slot { kQ, kK, kV, kG, kBeta, kAkk, kA, kW, kU, kH, kH0, kHt, kVNew, kO, kCu };

struct FwdTensor {
  TensorSpec spec;
  Slot slot;
};

// Validates (validate_gdn with the given chunk sizes), then builds or fetches the cached plan.
// `scale` is stored in the shape (chunk_fwd_o); `h_chunks_slot`: true when the op has h (varlen NT check).
strata_status make_fwd_plan(FwdOp op, const std::vector<FwdTensor>& tensors, int64_t chunk_size,
                            std::initializer_list<int64_t> chunk_sizes, float scale, strata_plan* plan);

// Registers the op for `strata info` (one per op file).
std::vector<std::string> fwd_impl_names(FwdOp op);

}  // namespace strata::linear_attn::gdn
