#include "opbase/row_layout.h"

namespace strata {

RowLayout make_row_layout(const strata_tensor_desc& t, int inner_dims) {
  RowLayout l;
  l.base = t.offset;
  l.col_stride = inner_dims >= 1 && t.rank >= 1 ? t.strides[t.rank - 1] : 1;
  if (inner_dims >= 1 && t.rank >= 1 && t.shape[t.rank - 1] <= 1) l.col_stride = 1;
  const int lead = t.rank - inner_dims;
  // Merge from the innermost leading dim outwards: dim i folds into the running dim when
  // stride[i] == stride[running] * size[running]. Size-1 dims are dropped.
  int64_t sizes[STRATA_MAX_RANK];
  int64_t strides[STRATA_MAX_RANK];
  int n = 0;
  for (int i = lead - 1; i >= 0; --i) {
    if (t.shape[i] == 1) continue;
    if (n > 0 && t.strides[i] == strides[n - 1] * sizes[n - 1]) {
      sizes[n - 1] *= t.shape[i];
    } else {
      sizes[n] = t.shape[i];
      strides[n] = t.strides[i];
      ++n;
    }
  }
  if (n == 0) {  // a single row (or none): treat as one dimension of size 1
    l.nd = 1;
    l.sizes[0] = 1;
    l.strides[0] = 0;
    return l;
  }
  l.nd = n;
  for (int i = 0; i < n; ++i) {  // stored outermost first
    l.sizes[i] = sizes[n - 1 - i];
    l.strides[i] = strides[n - 1 - i];
  }
  return l;
}

}  // namespace strata
