// memcpy and memset, synchronous and stream-ordered.
//
// Where each pointer lives comes from the allocator (runtime/allocator.h), so the kind argument is checked
// rather than trusted: a side the kind calls host memory must not be CUDA memory. "Device" memory of the
// CPU device is host memory, so every kind works between host pointers. When CUDA memory takes part, the
// copy goes through cudart with unified addressing; otherwise it is a plain memmove/memset (on the stream's
// worker for an asynchronous call on a CPU stream, inline for the null stream).
//
// A zero-size call only validates its kind and stream; pointers may then be NULL.
#include <cstring>

#include "runtime/allocator.h"
#include "runtime/cuda_backend.h"
#include "runtime/error.h"
#include "runtime/handles.h"
#include "runtime/runtime_internal.h"

namespace strata::rt {
namespace {

const char* kind_name(int32_t kind) {
  switch (kind) {
    case STRATA_MEMCPY_HOST_TO_HOST:
      return "STRATA_MEMCPY_HOST_TO_HOST";
    case STRATA_MEMCPY_HOST_TO_DEVICE:
      return "STRATA_MEMCPY_HOST_TO_DEVICE";
    case STRATA_MEMCPY_DEVICE_TO_HOST:
      return "STRATA_MEMCPY_DEVICE_TO_HOST";
    case STRATA_MEMCPY_DEVICE_TO_DEVICE:
      return "STRATA_MEMCPY_DEVICE_TO_DEVICE";
    case STRATA_MEMCPY_DEFAULT:
      return "STRATA_MEMCPY_DEFAULT";
  }
  return nullptr;
}

bool is_cuda(strata_device d) { return d.type == STRATA_DEVICE_CUDA; }

// A side the kind says is host memory must not be on a CUDA device.
strata_status check_side(const char* fn, const char* arg, int32_t kind, bool kind_says_host, strata_device where) {
  if (kind_says_host && is_cuda(where)) {
    return fail(STRATA_ERROR_INVALID_VALUE, "{}: kind {} says {} is host memory, but it is on {}", fn, kind_name(kind),
                arg, device_str(where));
  }
  return STRATA_SUCCESS;
}

// `async`: stream-ordered on `stream` (already checked); otherwise complete on return.
strata_status copy(void* dst, const void* src, size_t size, int32_t kind, strata_stream stream, bool async,
                   const char* fn) {
  if (kind_name(kind) == nullptr) {
    return fail(STRATA_ERROR_INVALID_VALUE, "{}: kind {} is not a strata_memcpy_kind (0 to 4)", fn, kind);
  }
  if (size == 0) return STRATA_SUCCESS;
  if (dst == nullptr) return fail(STRATA_ERROR_NULL_POINTER, "{}: dst is NULL ({} bytes to copy)", fn, size);
  if (src == nullptr) return fail(STRATA_ERROR_NULL_POINTER, "{}: src is NULL ({} bytes to copy)", fn, size);

  strata_device dst_at{}, src_at{};
  STRATA_RETURN_IF_ERROR(locate(dst, size, fn, "dst", &dst_at));
  STRATA_RETURN_IF_ERROR(locate(src, size, fn, "src", &src_at));
  const bool src_host = kind == STRATA_MEMCPY_HOST_TO_HOST || kind == STRATA_MEMCPY_HOST_TO_DEVICE;
  const bool dst_host = kind == STRATA_MEMCPY_HOST_TO_HOST || kind == STRATA_MEMCPY_DEVICE_TO_HOST;
  STRATA_RETURN_IF_ERROR(check_side(fn, "src", kind, src_host, src_at));
  STRATA_RETURN_IF_ERROR(check_side(fn, "dst", kind, dst_host, dst_at));

  if (!is_cuda(dst_at) && !is_cuda(src_at)) {
    // memmove: overlapping host ranges are copied as if through a temporary, rather than undefined.
    auto host_copy = [dst, src, size] { std::memmove(dst, src, size); };
    if (!async) {
      host_copy();
      return STRATA_SUCCESS;
    }
    return submit_host(stream, host_copy);
  }
  // Issue from the destination's device when it is a GPU (peer copies pull), else from the source's.
  const int device = is_cuda(dst_at) ? dst_at.index : src_at.index;
  if (!async) return cuda::memcpy(device, dst, src, size, fn);
  if (stream != nullptr && stream->worker) {
    // A CPU stream orders the copy by running it on its worker.
    return submit_host(stream, [=] { throw_if_failed(cuda::memcpy(device, dst, src, size, fn)); });
  }
  return cuda::memcpy_async(stream ? stream->device.index : device, dst, src, size, stream ? stream->cuda : nullptr,
                            fn);
}

strata_status fill(void* dst, int32_t value, size_t size, strata_stream stream, bool async, const char* fn) {
  if (size == 0) return STRATA_SUCCESS;
  if (dst == nullptr) return fail(STRATA_ERROR_NULL_POINTER, "{}: dst is NULL ({} bytes to set)", fn, size);
  strata_device at{};
  STRATA_RETURN_IF_ERROR(locate(dst, size, fn, "dst", &at));
  if (!is_cuda(at)) {
    auto host_fill = [dst, value, size] { std::memset(dst, value, size); };
    if (!async) {
      host_fill();
      return STRATA_SUCCESS;
    }
    return submit_host(stream, host_fill);
  }
  if (!async) return cuda::memset(at.index, dst, value, size, fn);
  if (stream != nullptr && stream->worker) {
    return submit_host(stream, [=] { throw_if_failed(cuda::memset(at.index, dst, value, size, fn)); });
  }
  return cuda::memset_async(stream ? stream->device.index : at.index, dst, value, size, stream ? stream->cuda : nullptr,
                            fn);
}

}  // namespace
}  // namespace strata::rt

using namespace strata;
using namespace strata::rt;

extern "C" {

strata_status strata_memcpy(void* dst, const void* src, size_t size, int32_t kind) {
  return copy(dst, src, size, kind, nullptr, false, "strata_memcpy");
}

strata_status strata_memcpy_async(void* dst, const void* src, size_t size, int32_t kind, strata_stream stream) {
  STRATA_RETURN_IF_ERROR(check_stream(stream, "strata_memcpy_async: stream"));
  return copy(dst, src, size, kind, stream, true, "strata_memcpy_async");
}

strata_status strata_memset(void* dst, int32_t value, size_t size) {
  return fill(dst, value, size, nullptr, false, "strata_memset");
}

strata_status strata_memset_async(void* dst, int32_t value, size_t size, strata_stream stream) {
  STRATA_RETURN_IF_ERROR(check_stream(stream, "strata_memset_async: stream"));
  return fill(dst, value, size, stream, true, "strata_memset_async");
}

}  // extern "C"
