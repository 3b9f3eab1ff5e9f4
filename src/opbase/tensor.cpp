#include "opbase/tensor.h"

#include <fmt/format.h>

#include "runtime/error.h"
#include "runtime/runtime_internal.h"

namespace strata {

int64_t numel(const strata_tensor_desc& t) {
  int64_t n = 1;
  for (int i = 0; i < t.rank; ++i) n *= t.shape[i];
  return n;
}

bool is_contiguous(const strata_tensor_desc& t) {
  int64_t expect = 1;
  for (int i = t.rank - 1; i >= 0; --i) {
    if (t.shape[i] != 1 && t.strides[i] != expect) return false;
    expect *= t.shape[i];
  }
  return true;
}

std::string shape_str(std::span<const int64_t> shape) { return fmt::format("[{}]", fmt::join(shape, ", ")); }
std::string shape_str(const strata_tensor_desc& t) {
  return shape_str(std::span<const int64_t>(t.shape, static_cast<size_t>(t.rank)));
}
std::string strides_str(const strata_tensor_desc& t) {
  return fmt::format("({})", fmt::join(std::span<const int64_t>(t.strides, static_cast<size_t>(t.rank)), ", "));
}
std::string desc_str(const strata_tensor_desc& t) {
  std::string s = fmt::format("{}{}", dtype_name(t.dtype), shape_str(t));
  if (!is_contiguous(t)) s += fmt::format(":s{}", strides_str(t));
  if (t.offset) s += fmt::format("+{}", t.offset);
  return s;
}
std::vector<int64_t> shape_of(const strata_tensor_desc& t) { return {t.shape, t.shape + t.rank}; }

strata_tensor_desc make_desc(int32_t dtype, std::span<const int64_t> shape, strata_device device) {
  strata_tensor_desc d{};
  strata_tensor_desc_init(&d, dtype, static_cast<int32_t>(shape.size()), shape.data(), nullptr, 0, device);
  return d;
}

strata_status check_desc(const char* op, const char* arg, const strata_tensor_desc* t) {
  if (!t) return fail(STRATA_ERROR_NULL_POINTER, "{}: {} must not be NULL", op, arg);
  if (t->rank < 0 || t->rank > STRATA_MAX_RANK)
    return fail(STRATA_ERROR_INVALID_SHAPE, "{}: {} has rank {}, expected 0..{}", op, arg, t->rank, STRATA_MAX_RANK);
  for (int i = 0; i < t->rank; ++i)
    if (t->shape[i] < 0)
      return fail(STRATA_ERROR_INVALID_SHAPE, "{}: {} has a negative size {} in dimension {}", op, arg, t->shape[i], i);
  if (t->offset < 0) return fail(STRATA_ERROR_INVALID_STRIDE, "{}: {} has a negative offset {}", op, arg, t->offset);
  return STRATA_SUCCESS;
}

strata_status check_same_device(const char* op, const char* arg, const strata_tensor_desc& t,
                                const strata_tensor_desc& like, const char* like_arg) {
  const std::string what = fmt::format("{}: {}", op, arg);
  STRATA_RETURN_IF_ERROR(rt::check_device(t.device, what.c_str()));
  if (!rt::same_device(t.device, like.device))
    return fail(STRATA_ERROR_INVALID_DEVICE, "{}: {} is on {}, expected {} (the device of {})", op, arg,
                rt::device_str(t.device), rt::device_str(like.device), like_arg);
  return STRATA_SUCCESS;
}

strata_status check_dtype_in(const char* op, const char* arg, const strata_tensor_desc& t,
                             std::initializer_list<int32_t> allowed) {
  for (int32_t d : allowed)
    if (t.dtype == d) return STRATA_SUCCESS;
  std::string names;
  for (int32_t d : allowed) names += fmt::format("{}{}", names.empty() ? "" : ", ", dtype_name(d));
  if (!valid_dtype(t.dtype))
    return fail(STRATA_ERROR_INVALID_DTYPE, "{}: {} has unknown dtype code {}, expected one of {}", op, arg, t.dtype,
                names);
  return fail(STRATA_ERROR_INVALID_DTYPE, "{}: {} has dtype {}, expected one of {}", op, arg, dtype_name(t.dtype),
              names);
}

strata_status check_f64_on_cpu(const char* op, const char* arg, const strata_tensor_desc& t) {
  if (t.dtype == STRATA_DTYPE_F64 && t.device.type != STRATA_DEVICE_CPU)
    return fail(STRATA_ERROR_INVALID_DTYPE, "{}: {} has dtype f64, which only the CPU supports; {} is on {}", op, arg,
                arg, rt::device_str(t.device));
  return STRATA_SUCCESS;
}

strata_status check_shape_eq(const char* op, const char* arg, const strata_tensor_desc& t,
                             std::span<const int64_t> expected, const char* how) {
  bool same = static_cast<size_t>(t.rank) == expected.size();
  for (size_t i = 0; same && i < expected.size(); ++i) same = t.shape[i] == expected[i];
  if (!same)
    return fail(STRATA_ERROR_INVALID_SHAPE, "{}: {} must have shape {} ({}), got {}", op, arg, shape_str(expected),
                how, shape_str(t));
  return STRATA_SUCCESS;
}

strata_status check_rank_in(const char* op, const char* arg, const strata_tensor_desc& t, int lo, int hi) {
  if (t.rank < lo || t.rank > hi) {
    if (lo == hi)
      return fail(STRATA_ERROR_INVALID_SHAPE, "{}: {} must have rank {}, got rank {} {}", op, arg, lo, t.rank,
                  shape_str(t));
    return fail(STRATA_ERROR_INVALID_SHAPE, "{}: {} must have rank {}..{}, got rank {} {}", op, arg, lo, hi, t.rank,
                shape_str(t));
  }
  return STRATA_SUCCESS;
}

strata_status check_strides(const char* op, const char* arg, const strata_tensor_desc& t, bool is_output,
                            bool need_unit_last) {
  if (numel(t) == 0) return STRATA_SUCCESS;  // an empty tensor has no element to misplace
  for (int i = 0; i < t.rank; ++i)
    if (t.strides[i] < 0)
      return fail(STRATA_ERROR_INVALID_STRIDE, "{}: {} has a negative stride {} in dimension {}; strides {}", op, arg,
                  t.strides[i], i, strides_str(t));
  if (need_unit_last && t.rank > 0 && t.shape[t.rank - 1] > 1 && t.strides[t.rank - 1] != 1)
    return fail(STRATA_ERROR_INVALID_STRIDE, "{}: {} must be contiguous in its last dimension (stride 1), got strides {}",
                op, arg, strides_str(t));
  if (is_output)
    for (int i = 0; i < t.rank; ++i)
      if (t.strides[i] == 0 && t.shape[i] > 1)
        return fail(STRATA_ERROR_INVALID_STRIDE,
                    "{}: output {} has stride 0 in dimension {} of size {}: its elements would overlap", op, arg, i,
                    t.shape[i]);
  return STRATA_SUCCESS;
}

}  // namespace strata

extern "C" strata_status strata_tensor_desc_init(strata_tensor_desc* desc, int32_t dtype, int32_t rank,
                                                 const int64_t* shape, const int64_t* strides, int64_t offset,
                                                 strata_device device) {
  using namespace strata;
  if (!desc) return fail(STRATA_ERROR_NULL_POINTER, "strata_tensor_desc_init: desc must not be NULL");
  if (rank < 0 || rank > STRATA_MAX_RANK)
    return fail(STRATA_ERROR_INVALID_SHAPE, "strata_tensor_desc_init: rank {} is outside 0..{}", rank, STRATA_MAX_RANK);
  if (rank > 0 && !shape) return fail(STRATA_ERROR_NULL_POINTER, "strata_tensor_desc_init: shape must not be NULL");
  if (!valid_dtype(dtype))
    return fail(STRATA_ERROR_INVALID_DTYPE, "strata_tensor_desc_init: unknown dtype code {}", dtype);
  strata_tensor_desc d{};
  d.dtype = dtype;
  d.rank = rank;
  d.offset = offset;
  d.device = device;
  int64_t stride = 1;
  for (int i = rank - 1; i >= 0; --i) {
    if (shape[i] < 0)
      return fail(STRATA_ERROR_INVALID_SHAPE, "strata_tensor_desc_init: shape[{}] = {} is negative", i, shape[i]);
    d.shape[i] = shape[i];
    d.strides[i] = strides ? strides[i] : stride;
    stride *= shape[i] > 0 ? shape[i] : 1;
  }
  *desc = d;
  return STRATA_SUCCESS;
}
