// Tensor descriptors (strata_tensor_desc) seen from C++: sizes, contiguity, printing, and the validation
// helpers every op uses at its boundary, in the fixed order null -> device -> dtype -> shape -> strides ->
// attributes (ARCHITECTURE.md §3). Each helper sets the last error naming "<op>: <arg>" and expected vs actual.
#pragma once

#include <initializer_list>
#include <span>
#include <string>
#include <vector>

#include "opbase/dtype.h"
#include "strata/ops.h"

namespace strata {

int64_t numel(const strata_tensor_desc& t);
bool is_contiguous(const strata_tensor_desc& t);
std::string shape_str(const strata_tensor_desc& t);    // "[4, 8192, 32]"
std::string strides_str(const strata_tensor_desc& t);  // "(262144, 32, 1)"
std::string desc_str(const strata_tensor_desc& t);     // "bf16[4, 8192, 32]" (+ strides if not contiguous)
std::string shape_str(std::span<const int64_t> shape);
std::vector<int64_t> shape_of(const strata_tensor_desc& t);

// A contiguous descriptor (C++ convenience for tests and tools).
strata_tensor_desc make_desc(int32_t dtype, std::span<const int64_t> shape, strata_device device = {0, 0});
inline strata_tensor_desc make_desc(int32_t dtype, std::initializer_list<int64_t> shape,
                                    strata_device device = {0, 0}) {
  return make_desc(dtype, std::span<const int64_t>(shape.begin(), shape.size()), device);
}

// ---- validation (each returns SUCCESS or sets the last error and returns the failing status) ----
// Structural sanity of a descriptor: rank in range, dtype known, non-negative sizes, offset >= 0.
strata_status check_desc(const char* op, const char* arg, const strata_tensor_desc* t);
// Device must exist and (when `like` is given) equal `like`'s device.
strata_status check_same_device(const char* op, const char* arg, const strata_tensor_desc& t,
                                const strata_tensor_desc& like, const char* like_arg);
strata_status check_dtype_in(const char* op, const char* arg, const strata_tensor_desc& t,
                             std::initializer_list<int32_t> allowed);
strata_status check_shape_eq(const char* op, const char* arg, const strata_tensor_desc& t,
                             std::span<const int64_t> expected, const char* how);
strata_status check_rank_in(const char* op, const char* arg, const strata_tensor_desc& t, int lo, int hi);
// f64 is a CPU-only dtype (for gradient checks); on another device it is a dtype error naming the device.
strata_status check_f64_on_cpu(const char* op, const char* arg, const strata_tensor_desc& t);
// The last dimension must have stride 1 (or size <= 1); strides must be non-negative; an output must not have
// zero strides over a dimension larger than one (two elements would alias).
strata_status check_strides(const char* op, const char* arg, const strata_tensor_desc& t, bool is_output,
                            bool need_unit_last);

}  // namespace strata
