/* Strata operators (layers L2/L3): dtypes, tensor descriptors, and the two-phase operator API.
 *
 * Every operator is called in two phases, like CANN's aclnn but with a reusable plan (oneDNN-style):
 *
 *   strata_plan plan;
 *   strata_l2norm_fwd_plan(&x, &y, &rstd, 1e-6f, &plan);      // validates, picks the implementation;
 *                                                             // launches nothing, allocates nothing
 *   size_t ws; strata_plan_workspace_size(plan, &ws);
 *   void* t[] = {x_ptr, y_ptr, rstd_ptr};                     // the op's tensors, in its documented order
 *   strata_plan_run(plan, t, 3, workspace, ws, stream);       // any number of times, new pointers allowed
 *   strata_plan_destroy(plan);
 *
 * Descriptors carry dtype, shape, element strides, element offset and device; the data pointers are given
 * at run time (the pointer is the base of the storage; the descriptor's offset is added). Plans are cached
 * by op, descriptor metadata, attributes and determinism level, so a repeated shape costs a hash lookup.
 */
#ifndef STRATA_OPS_H_
#define STRATA_OPS_H_

#include "strata/runtime.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum strata_dtype {
  STRATA_DTYPE_F64 = 0,
  STRATA_DTYPE_F32 = 1,
  STRATA_DTYPE_F16 = 2,
  STRATA_DTYPE_BF16 = 3,
  STRATA_DTYPE_I64 = 4,
  STRATA_DTYPE_I32 = 5,
  STRATA_DTYPE_I16 = 6,
  STRATA_DTYPE_I8 = 7,
  STRATA_DTYPE_U8 = 8,
  STRATA_DTYPE_BOOL = 9,
  STRATA_DTYPE_COUNT = 10
} strata_dtype;

STRATA_API const char* strata_dtype_name(int32_t dtype); /* "bf16"; "?" when out of range */
STRATA_API size_t strata_dtype_size(int32_t dtype);      /* bytes; 0 when out of range */

/* Round-to-nearest-even conversions (NaN stays NaN, overflow goes to Inf), exhaustively tested. */
STRATA_API uint16_t strata_f32_to_bf16(float x);
STRATA_API float strata_bf16_to_f32(uint16_t x);
STRATA_API uint16_t strata_f32_to_f16(float x);
STRATA_API float strata_f16_to_f32(uint16_t x);

#define STRATA_MAX_RANK 8

typedef struct strata_tensor_desc {
  int32_t dtype; /* strata_dtype */
  int32_t rank;  /* 0..STRATA_MAX_RANK */
  int64_t shape[STRATA_MAX_RANK];
  int64_t strides[STRATA_MAX_RANK]; /* in elements; may be 0 (broadcast) only where an op says so */
  int64_t offset;                   /* in elements, added to the run-time base pointer */
  strata_device device;
} strata_tensor_desc;

/* Fills a descriptor; strides == NULL means contiguous row-major. */
STRATA_API strata_status strata_tensor_desc_init(strata_tensor_desc* desc, int32_t dtype, int32_t rank,
                                                 const int64_t* shape, const int64_t* strides, int64_t offset,
                                                 strata_device device);

/* ---- plans ---- */
typedef struct strata_plan_s* strata_plan;

STRATA_API strata_status strata_plan_workspace_size(strata_plan plan, size_t* size);
/* Name of the implementation the plan runs, e.g. "cpu.avx512" or "cuda.sm90.warp_per_row". */
STRATA_API const char* strata_plan_impl_name(strata_plan plan);
STRATA_API const char* strata_plan_op_name(strata_plan plan);
/* Runs the plan. tensors[i] is the base pointer of the op's i-th tensor (NULL for an absent optional
 * tensor); workspace must hold at least strata_plan_workspace_size bytes on the plan's device. */
STRATA_API strata_status strata_plan_run(strata_plan plan, void* const* tensors, int32_t num_tensors,
                                         void* workspace, size_t workspace_size, strata_stream stream);
STRATA_API strata_status strata_plan_destroy(strata_plan plan);

/* Pins the implementation for plans created after this call (process-wide; NULL or "" clears it). Overrides
 * the environment variable STRATA_FORCE_IMPL. A name an op does not have is ignored for that op; a name it
 * has but cannot apply to the problem makes plan creation fail with the reason. */
STRATA_API strata_status strata_set_force_impl(const char* name);

/* Plan cache statistics (hits, misses, entries) and its reset. */
STRATA_API void strata_plan_cache_stats(uint64_t* hits, uint64_t* misses, uint64_t* entries);
STRATA_API void strata_plan_cache_clear(void);

/* Implementation names of an op, in dispatch order (fastest first, reference last). Fills at most
 * `capacity` entries and returns the total count; NULL op name or unknown op returns -1. */
STRATA_API int32_t strata_op_impl_names(const char* op, const char** names, int32_t capacity);
/* Names of all registered ops ("l2norm_fwd", ...). */
STRATA_API int32_t strata_op_names(const char** names, int32_t capacity);

/* ======================================================================================== */
/* Operators. Tensor order for strata_plan_run is given in brackets after each plan function. */

/* l2norm (docs/reference ops_gdn_kda.md §4.1): rows of length D = x.shape[-1];
 *   rstd = 1 / sqrt(sum(x^2) + eps), y = x * rstd.
 * x, y: [..., D] f32/bf16/f16 (f64 on CPU); y may have another float dtype; rstd: [...] f32 (f64 with f64 x).
 * Tensors: {x, y, rstd}. */
STRATA_API strata_status strata_l2norm_fwd_plan(const strata_tensor_desc* x, const strata_tensor_desc* y,
                                                const strata_tensor_desc* rstd, float eps, strata_plan* plan);
/* dx = rstd * (dy - (dy . y) y). Tensors: {y, rstd, dy, dx}. */
STRATA_API strata_status strata_l2norm_bwd_plan(const strata_tensor_desc* y, const strata_tensor_desc* rstd,
                                                const strata_tensor_desc* dy, const strata_tensor_desc* dx,
                                                strata_plan* plan);

/* rmsnorm_without_weight (ops_fused.md §3): r = 1 / sqrt(mean(x^2) + eps) per row.
 *   mode NORMALIZE: y = x * r (y [..., D]) and the saved r [..., 1];  mode FACTOR: only r [..., 1].
 * Tensors: {x, y (NULL in FACTOR mode), r}. r is f32 (f64 with f64 x), or any float dtype in FACTOR mode. */
typedef enum strata_rmsnorm_mode { STRATA_RMSNORM_NORMALIZE = 0, STRATA_RMSNORM_FACTOR = 1 } strata_rmsnorm_mode;
STRATA_API strata_status strata_rmsnorm_without_weight_fwd_plan(const strata_tensor_desc* x,
                                                                const strata_tensor_desc* y,
                                                                const strata_tensor_desc* r, float eps,
                                                                int32_t mode, strata_plan* plan);
/* NORMALIZE: dx = r (dy - x r^2 mean(dy x));  FACTOR: dx = -dr r^3 x / D.
 * Tensors: {x, r, dout, dx} where dout is dy [..., D] (NORMALIZE) or dr [..., 1] (FACTOR). */
STRATA_API strata_status strata_rmsnorm_without_weight_bwd_plan(const strata_tensor_desc* x,
                                                                const strata_tensor_desc* r,
                                                                const strata_tensor_desc* dout,
                                                                const strata_tensor_desc* dx, int32_t mode,
                                                                strata_plan* plan);

/* chunk_local_cumsum (ops_gdn_kda.md §4.2): per sequence, chunks of chunk_size tokens restart at every
 * sequence start; out[t] = scale * sum of g over [chunk start, t] (reverse: over [t, chunk end)).
 * g, out: [B, T, H] (scalar gates) or [B, T, H, S] (vector gates), g f32/bf16/f16 (f64 on CPU), out any float.
 * cu_seqlens: NULL, or int64 [N+1] on g's device with B == 1 (variable-length packs).
 * chunk_size: a power of two in [1, 1024] (16/32/64 in the GDN/KDA pipelines).
 * Tensors: {g, cu_seqlens (or NULL), out}. */
STRATA_API strata_status strata_chunk_local_cumsum_plan(const strata_tensor_desc* g,
                                                        const strata_tensor_desc* cu_seqlens,
                                                        const strata_tensor_desc* out, int32_t chunk_size,
                                                        int32_t reverse, float scale, strata_plan* plan);

#ifdef __cplusplus
} /* extern "C" */
#endif

/* Operator families, one header each (each compiles alone too). */
#include "strata/ops/gdn_fwd.h"
#include "strata/ops/gdn_bwd.h"
#include "strata/ops/chunk_gated_delta_rule.h"
#include "strata/ops/rms_norm_gated.h"
#include "strata/ops/clipped_swiglu.h"
#include "strata/ops/causal_conv1d.h"
#include "strata/ops/fused_cross_entropy.h"
#include "strata/ops/chunk_loss.h"

#endif /* STRATA_OPS_H_ */
