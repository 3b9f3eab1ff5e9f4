/* Strata operators: chunk_gated_delta_rule (C API). Included by strata/ops.h; compiles alone. */
#ifndef STRATA_OPS_CHUNK_GATED_DELTA_RULE_H_
#define STRATA_OPS_CHUNK_GATED_DELTA_RULE_H_

#include "strata/ops.h"

#ifdef __cplusplus
extern "C" {
#endif

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* STRATA_OPS_CHUNK_GATED_DELTA_RULE_H_ */
