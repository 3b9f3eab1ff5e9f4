/* Strata operators: fused_cross_entropy (C API). Included by strata/ops.h; compiles alone. */
#ifndef STRATA_OPS_FUSED_CROSS_ENTROPY_H_
#define STRATA_OPS_FUSED_CROSS_ENTROPY_H_

#include "strata/ops.h"

#ifdef __cplusplus
extern "C" {
#endif

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* STRATA_OPS_FUSED_CROSS_ENTROPY_H_ */
