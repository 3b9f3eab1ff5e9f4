// RowLayout: how to find row r of a tensor viewed as [rows, D] when its leading dimensions are strided.
//
// Row ops (norms, losses) see x[..., D] as rows x D. The leading dimensions are merged where their strides
// allow (so any contiguous or row-padded tensor has nd == 1 and row r starts at r * stride[0]); a view that
// cannot be merged keeps up to 7 dimensions and pays one division per dimension per row. Usable on the host
// and in CUDA kernels (a plain struct passed by value in kernel params).
#pragma once

#include <cstdint>

#include "opbase/dtype.h"
#include "strata/ops.h"

namespace strata {

struct RowLayout {
  int32_t nd = 0;               // merged leading dims (0 for a single row)
  int64_t sizes[STRATA_MAX_RANK - 1] = {};
  int64_t strides[STRATA_MAX_RANK - 1] = {};
  int64_t col_stride = 1;       // stride of the last (row) dimension; 1 for the fast paths
  int64_t base = 0;             // element offset of row 0

  // Element offset of row r (r in [0, rows)).
  STRATA_HD int64_t row_offset(int64_t r) const {
    if (nd == 1) return base + r * strides[0];
    int64_t off = base;
    for (int i = nd - 1; i >= 0; --i) {
      const int64_t q = r / sizes[i];
      off += (r - q * sizes[i]) * strides[i];
      r = q;
    }
    return off;
  }
  // Whether all rows are equally spaced (row r at base + r * row_stride()).
  STRATA_HD bool uniform() const { return nd <= 1; }
  STRATA_HD int64_t row_stride() const { return nd == 1 ? strides[0] : 0; }
};

// Builds the layout of t viewed as [prod(shape[0 .. rank-1-inner_dims)), ...]: the first `rank - inner_dims`
// dimensions are the rows. With inner_dims == 1 the last dimension is the row; inner_dims == 0 treats every
// element as a row (for per-row outputs such as rstd [...]).
RowLayout make_row_layout(const strata_tensor_desc& t, int inner_dims);

}  // namespace strata
