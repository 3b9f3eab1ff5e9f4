// visit_kernel_dtype: the twin of visit_float_dtype (opbase/dtype.h) over the dtypes the typed CPU kernels are
// instantiated for, f32 / bf16 / f16 (callers send f64 to the reference; any other dtype is visited as float).
// A header of its own: dtype.h is included by every translation unit.
#pragma once

#include <cstdint>

#include "opbase/dtype.h"

namespace strata {

template <class Fn>
decltype(auto) visit_kernel_dtype(int32_t dtype, Fn&& fn) {
  switch (dtype) {
    case STRATA_DTYPE_BF16: return fn(bf16_t{});
    case STRATA_DTYPE_F16: return fn(f16_t{});
    default: return fn(float{});
  }
}

}  // namespace strata
