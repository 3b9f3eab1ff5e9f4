// prepare_wy_repr_bwd cuda.sm90.mma: every kernel instantiation for f16 token tensors (the pipelined kernel at
// KP = 64..256, the two-per-SM kernel's forms at P = 64, 128), one of the op's two kernel units (cuda_sm90_mma.cuh).
#include "ops/linear_attn/prepare_wy_repr_bwd/cuda_sm90_mma.cuh"

namespace strata::linear_attn::wy_mma {

strata_status launch_f16(const WyBwdParams& p, const int64_t* offs, int64_t items, cudaStream_t stream) {
  return launch_variant<f16_t>(p, offs, items, stream);
}

}  // namespace strata::linear_attn::wy_mma
