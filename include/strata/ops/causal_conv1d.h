/* Strata operators: causal_conv1d (C API). Included by strata/ops.h; compiles alone. */
#ifndef STRATA_OPS_CAUSAL_CONV1D_H_
#define STRATA_OPS_CAUSAL_CONV1D_H_

#include "strata/ops.h"

#ifdef __cplusplus
extern "C" {
#endif

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* STRATA_OPS_CAUSAL_CONV1D_H_ */
