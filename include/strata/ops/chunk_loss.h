/* Strata operators: chunk_loss (C API). Included by strata/ops.h; compiles alone. */
#ifndef STRATA_OPS_CHUNK_LOSS_H_
#define STRATA_OPS_CHUNK_LOSS_H_

#include "strata/ops.h"

#ifdef __cplusplus
extern "C" {
#endif

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* STRATA_OPS_CHUNK_LOSS_H_ */
