// Host side of prepare_wy_repr_bwd's tensor-core kernel ("cuda.sm90.mma"): the reject rules, the workspace and the
// entry points. The kernels (cuda_sm90_mma.cuh: what they compute) are instantiated in cuda_sm90_mma_bf16.cu and
// cuda_sm90_mma_f16.cu, one unit per token dtype, so that they compile in parallel.
#include "ops/linear_attn/prepare_wy_repr_bwd/cuda_sm90_mma.cuh"

namespace strata::linear_attn {
using wy_mma::launch_bf16;
using wy_mma::launch_f16;
using wy_mma::round64;
using gdn_bwd::Dims;
using gdn_bwd::tc::common_16bit_dtype;
using gdn_bwd::cu::chunk_offsets_bytes;
using gdn_bwd::cu::launch_chunk_offsets;

std::string prepare_wy_repr_bwd_cuda_mma_reject(const WyBwdParams& p) {
  if (!common_16bit_dtype({&p.k, &p.v, &p.A, &p.dw, &p.du}))
    return "takes k, v, A, dw, du of one 16-bit dtype (bf16 or f16); f32 runs the FMA kernel";
  if (p.d.K > 256 || p.d.V > 256) return fmt::format("K = {}, V = {}: at most 256 each", p.d.K, p.d.V);
  if ((p.dk_add.present() && p.dk_add.dtype != STRATA_DTYPE_F32) || (p.dg_add.present() && p.dg_add.dtype != STRATA_DTYPE_F32))
    return "dk_add and dg_add are f32";
  if (p.dk_rstd.present()) {  // the folded l2norm backward (wy_store_dk_norm_staged): the two-per-SM kernel
    const int64_t KP = round64(p.d.K);
    const int variant = p.mma_variant == kWyAuto ? prepare_wy_repr_bwd_auto_variant() : p.mma_variant;
    if (KP != round64(p.d.V) || KP > 128)
      return fmt::format("dk_rstd (the folded l2norm backward) needs K and V rounding up to the same multiple of 64, "
                         "at most 128; got K = {}, V = {}", p.d.K, p.d.V);
    if (variant != kWyFinStaged)
      return fmt::format("dk_rstd is folded by the kWyFinStaged form only, not variant {}", variant);
    if (p.dk_rstd.dtype != STRATA_DTYPE_F32) return "dk_rstd is f32";
  }
  return "";
}

size_t prepare_wy_repr_bwd_cuda_mma_workspace(const Dims& d) { return chunk_offsets_bytes(d); }

int prepare_wy_repr_bwd_cuda_mma(const WyBwdParams& p, void* workspace, void* stream_ptr) {
  const std::string why = prepare_wy_repr_bwd_cuda_mma_reject(p);
  if (!why.empty()) return fail(STRATA_ERROR_UNSUPPORTED, "prepare_wy_repr_bwd cuda.sm90.mma: {}", why);
  const cudaStream_t stream = static_cast<cudaStream_t>(stream_ptr);
  const Dims& d = p.d;
  const int64_t items = num_windows(d) * d.H;
  if (items == 0) return STRATA_SUCCESS;
  int64_t* offs = static_cast<int64_t*>(workspace);
  STRATA_RETURN_IF_ERROR(launch_chunk_offsets(d, offs, stream));
  return p.k.dtype == STRATA_DTYPE_BF16 ? launch_bf16(p, offs, items, stream) : launch_f16(p, offs, items, stream);
}

// The automatic choice (the entry point other operators call): tensor cores for 16-bit token tensors.
size_t prepare_wy_repr_bwd_cuda_workspace(const Dims& d) {
  return std::max(prepare_wy_repr_bwd_cuda_mma_workspace(d), prepare_wy_repr_bwd_cuda_fma_workspace(d));
}
int prepare_wy_repr_bwd_cuda(const WyBwdParams& p, void* workspace, void* stream) {
  return prepare_wy_repr_bwd_cuda_mma_reject(p).empty() ? prepare_wy_repr_bwd_cuda_mma(p, workspace, stream)
                                                        : prepare_wy_repr_bwd_cuda_fma(p, workspace, stream);
}

}  // namespace strata::linear_attn

