// Boundary validation shared by the GDN chunk operators (ARCHITECTURE.md §3: null -> device -> dtype ->
// shape -> strides -> attributes), and the conversion of validated descriptors into GdnShape / GdnTensor.
//
// An op lists its tensors as TensorSpecs (name as in fla's signature, role = layout, optional/output flags),
// in its documented order; validate_gdn checks them all in the fixed order and infers the shape:
//   B, T  from the first [B, T, ...] tensor;  H, K from the first kQK tensor;  HV from the first tensor with a
//   value-head dimension;  K also from kWK / kStates when no q/k is given;  V from kVV / kStates / kState0;
//   N = B, or len(cu_seqlens) - 1 (then B must be 1);  NT = ceil(T / BT), or h.shape[1] in varlen mode.
// Every message names the op and the argument and gives expected vs actual, e.g.
//   "chunk_fwd_o: v must have shape [1, 100, 8, 64] (B, T, HV, V), got [1, 100, 4, 64]".
#pragma once

#include <initializer_list>
#include <span>
#include <string>
#include <vector>

#include "opbase/tensor.h"
#include "ops/linear_attn/gdn_common/gdn_common.h"

namespace strata::linear_attn::gdn {

enum class Role {
  kQK,        // [B, T, H, K]      q, k
  kWK,        // [B, T, HV, K]     w
  kVV,        // [B, T, HV, V]     v, u, v_new, o
  kGate,      // [B, T, HV]        g (γ), beta
  kChunkMat,  // [B, T, HV, BT]    A, Akk
  kStates,    // [B, NT, HV, K, V] h
  kState0,    // [N, HV, K, V]     initial_state, final_state: f32 (f64 on the CPU)
  kCu,        // [N + 1] int64     cu_seqlens
};

struct TensorSpec {
  const char* name;
  const strata_tensor_desc* desc;  // nullptr: absent (allowed only when optional)
  Role role;
  bool optional = false;
  bool output = false;
};

struct GdnValidated {
  GdnShape shape;
  bool varlen = false;
  strata_device device{};
  bool empty = false;  // no token and no state to write
};

// Validates the specs in order (null, device, dtype, shape, strides) and the chunk size (one of
// `chunk_sizes`), fills `out`. `scale` is checked finite when `check_scale`.
strata_status validate_gdn(const char* op, std::span<const TensorSpec> specs, int64_t chunk_size,
                           std::initializer_list<int64_t> chunk_sizes, GdnValidated& out);

// A validated descriptor as a GdnTensor bound to a run-time base pointer (nullptr stays absent).
GdnTensor bind_tensor(const strata_tensor_desc* d, void* base);

// Host check of cu_seqlens values (CPU implementations, before writing): cu[0] == 0, non-decreasing,
// cu[N] == T; and, when `h_chunks` >= 0, that the chunk count matches h.shape[1]. INVALID_VALUE otherwise.
strata_status check_cu_seqlens_host(const char* op, const GdnChunks& m, int64_t h_chunks);

// "k:bf16[2, 64, 4, 128] beta:f32[2, 64, 8] ..." for plan summaries.
std::string specs_summary(std::span<const TensorSpec> specs);

}  // namespace strata::linear_attn::gdn
