// (Session 12) The kernel forms of the GDN pre-state kernel (gdn_fwd_cuda_prep.cu; fwd_cuda_prep_head in
// gdn_fwd_kernels.h runs PrepForm::kAuto), for the tests and benchmarks that time or check one form:
//   kChunk       prep_wgmma: one block per (chunk, value head);
//   kPersistent  prep_wgmma_persist: resident blocks walking (chunk, q/k head) units, the unit's G value heads one
//                after the other with K loaded once, and the next item's K, V, γ, β requested while the current one
//                computes (w, u, A; with p.Pqk present the chunk form runs). The same bits as kChunk.
//   kPersistentTree  kPersistent with the inverse as a tree of merges (invert_tree: 4 block barriers instead of 7,
//                at most 2 split block products in sequence per step); not the same bits (another summation order).
//   kChunkTree   kChunk with invert_tree (also with Pqk).
//   kAuto        kChunkTree (session 12, run 2).
// max_blocks > 0 caps the persistent form's grid (tests: many units per block).
#pragma once

#include "ops/linear_attn/gdn_common/gdn_fwd_kernels.h"

namespace strata::linear_attn::gdn {

#if STRATA_WITH_CUDA
enum class PrepForm : int { kAuto = 0, kChunk, kPersistent, kPersistentTree, kChunkTree };
int fwd_cuda_prep_head(const GdnFwdParams& p, const GdnFwdHead& head, PrepForm form, void* stream,
                       int max_blocks = 0);
#endif

}  // namespace strata::linear_attn::gdn
