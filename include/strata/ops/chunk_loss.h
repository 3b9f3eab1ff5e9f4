/* Strata operators: chunk_loss (C API). Included by strata/ops.h; compiles alone.
 *
 * chunk_loss (docs/reference/ops_fused.md §2; src/ops/loss/chunk_loss/README.md): the LM head and the cross
 * entropy fused, so that the [N, V] logits are never stored whole:
 *   z = hidden . weight^T (+ bias)                                           [N, V], by chunks or tiles
 *   per row (not ignored): u = logit_scale z, c = softcap tanh(u / softcap) (softcap > 0) or u,
 *     lse = logsumexp_j c_j, loss_i = lse - (1 - eps) c_y - (eps / V) sum_j c_j + lse_square_scale lse^2
 *   loss = sum_i loss_i / #valid (MEAN; 0 when no row is valid) or sum_i loss_i (SUM)
 * and, in the same call, the gradients of grad_scale * loss: dhidden = dZ . weight, dweight = dZ^T . hidden,
 * dbias = column sums of dZ. Rows whose target equals ignore_index add nothing (loss 0, gradient 0); any
 * other target must be in [0, V) (checked on the CPU before anything is written; on CUDA with one
 * device-to-host read of a two-integer count before anything is written).
 */
#ifndef STRATA_OPS_CHUNK_LOSS_H_
#define STRATA_OPS_CHUNK_LOSS_H_

#include "strata/ops.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum strata_chunk_loss_reduction {
  STRATA_CHUNK_LOSS_MEAN = 0,
  STRATA_CHUNK_LOSS_SUM = 1
} strata_chunk_loss_reduction;

/* How the work is cut (README.md, "Strategy heuristic"):
 *   TOKEN_CHUNKED: chunks of full rows; the gradients are computed in the forward call (3 GEMMs; dweight is
 *                  accumulated in f32 over the chunks: in dweight itself when it is f32, else in workspace).
 *   VOCAB_TILED:   vocabulary tiles with online softmax statistics; gradients by recomputation (4 GEMMs; dhidden
 *                  accumulated in f32 over the tiles: in dhidden when it is f32, else in workspace).
 *   AUTO:          the plan picks (token_chunked when its f32 accumulator and a chunk of useful height fit the
 *                  64 MiB budget, else vocab_tiled). */
typedef enum strata_chunk_loss_strategy {
  STRATA_CHUNK_LOSS_AUTO = 0,
  STRATA_CHUNK_LOSS_TOKEN_CHUNKED = 1,
  STRATA_CHUNK_LOSS_VOCAB_TILED = 2
} strata_chunk_loss_strategy;

typedef struct strata_chunk_loss_options {
  int64_t ignore_index;     /* -100 */
  int32_t reduction;        /* strata_chunk_loss_reduction, MEAN */
  float label_smoothing;    /* eps in [0, 1], 0 */
  float logit_scale;        /* finite, 1 */
  float softcap;            /* 0 (off) or > 0 */
  float lse_square_scale;   /* z-loss coefficient >= 0, 0 */
  float grad_scale;         /* finite; the gradients are those of grad_scale * loss (* dloss), 1 */
  int32_t strategy;         /* strata_chunk_loss_strategy, AUTO */
  int64_t chunk_rows;       /* 0: chosen from the budget; else the token chunk / token block height */
  int64_t vocab_tile;       /* 0: chosen from the budget; else the vocabulary tile width (vocab_tiled) */
} strata_chunk_loss_options;

/* Fills the defaults listed above. */
STRATA_API void strata_chunk_loss_options_init(strata_chunk_loss_options* options);

/* Forward (and, when any gradient output is given, the gradients in the same call).
 * Tensors, in order: {hidden, weight, bias, target, loss, lse, dhidden, dweight, dbias}
 *   hidden  [N, D] f32 | bf16 | f16 (f64 on the CPU), last dim contiguous
 *   weight  [V, D] same dtype as hidden, last dim contiguous; V >= 1
 *   bias    [V] same dtype as weight, or NULL
 *   target  [N] int64
 *   loss    [] or [1] f32 (f64 with f64 inputs)                 output
 *   lse     [N] f32 (f64 with f64 inputs), or NULL                output (needed by chunk_loss_bwd)
 *   dhidden [N, D] f32 or hidden's dtype, or NULL                  output
 *   dweight [V, D] f32 or weight's dtype, or NULL                  output
 *   dbias   [V] f32 or weight's dtype, or NULL (NULL when bias is NULL)  output */
STRATA_API strata_status strata_chunk_loss_plan(const strata_tensor_desc* hidden, const strata_tensor_desc* weight,
                                                const strata_tensor_desc* bias, const strata_tensor_desc* target,
                                                const strata_tensor_desc* loss, const strata_tensor_desc* lse,
                                                const strata_tensor_desc* dhidden,
                                                const strata_tensor_desc* dweight, const strata_tensor_desc* dbias,
                                                const strata_chunk_loss_options* options, strata_plan* plan);

/* Backward by recomputation (the vocab_tiled loop) from the saved lse and the upstream gradient dloss:
 * gradients of grad_scale * dloss * loss. Tensors: {hidden, weight, bias, target, lse, dloss, dhidden,
 * dweight, dbias}; lse [N] f32 (f64 with f64 inputs) from chunk_loss with the same inputs and options,
 * dloss [] or [1] f32 (f64) in device memory, or NULL (= 1). At least one gradient output. */
STRATA_API strata_status strata_chunk_loss_bwd_plan(const strata_tensor_desc* hidden,
                                                    const strata_tensor_desc* weight,
                                                    const strata_tensor_desc* bias, const strata_tensor_desc* target,
                                                    const strata_tensor_desc* lse, const strata_tensor_desc* dloss,
                                                    const strata_tensor_desc* dhidden,
                                                    const strata_tensor_desc* dweight,
                                                    const strata_tensor_desc* dbias,
                                                    const strata_chunk_loss_options* options, strata_plan* plan);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* STRATA_OPS_CHUNK_LOSS_H_ */
