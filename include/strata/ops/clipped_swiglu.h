/* Strata operators: clipped_swiglu (C API). Included by strata/ops.h; compiles alone. */
#ifndef STRATA_OPS_CLIPPED_SWIGLU_H_
#define STRATA_OPS_CLIPPED_SWIGLU_H_

#include "strata/ops.h"

#ifdef __cplusplus
extern "C" {
#endif

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* STRATA_OPS_CLIPPED_SWIGLU_H_ */
