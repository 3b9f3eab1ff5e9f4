/* Strata operators: rms_norm_gated (C API). Included by strata/ops.h; compiles alone. */
#ifndef STRATA_OPS_RMS_NORM_GATED_H_
#define STRATA_OPS_RMS_NORM_GATED_H_

#include "strata/ops.h"

#ifdef __cplusplus
extern "C" {
#endif

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* STRATA_OPS_RMS_NORM_GATED_H_ */
