// cudart behind the runtime (see cuda_backend.h). Compiled by the host compiler against
// cuda_runtime_api.h; without STRATA_WITH_CUDA every entry point answers that the build has no CUDA.
#include "runtime/cuda_backend.h"

#include <cstring>

#include "runtime/error.h"

#if STRATA_WITH_CUDA
#include <cuda_runtime_api.h>
#endif

namespace strata::rt::cuda {

#if STRATA_WITH_CUDA

namespace {

strata_status cuda_fail(cudaError_t err, const char* what, const char* call) {
  // Clears a non-sticky error so that it does not resurface in an unrelated later call.
  cudaGetLastError();
  return fail(STRATA_ERROR_RUNTIME, "{}: {} failed: {} ({})", what, call, cudaGetErrorString(err),
              cudaGetErrorName(err));
}

// CUDA_CALL(what, cudaFoo, args...): returns STRATA_ERROR_RUNTIME, with the message, when cudaFoo fails.
// `#fn` stringifies the name before the per-thread-stream macros of cuda_runtime_api.h rename it.
#define CUDA_CALL(what, fn, ...)                                                        \
  do {                                                                                  \
    const cudaError_t strata_cuda_err_ = fn(__VA_ARGS__);                               \
    if (strata_cuda_err_ != cudaSuccess) return cuda_fail(strata_cuda_err_, what, #fn); \
  } while (0)

// Makes a device current for one call and puts the caller's device back, so that the runtime never
// changes which device the application (or torch) has selected.
class DeviceGuard {
 public:
  DeviceGuard() = default;
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;
  ~DeviceGuard() {
    // Unchecked: a destructor has no status to return, and a failure would overwrite the message of the
    // call being guarded; the device was current a moment ago, so switching back does not fail in practice.
    if (switched_) cudaSetDevice(previous_);
  }
  strata_status enter(int device, const char* what) {
    if (device < 0) return STRATA_SUCCESS;  // the current device
    CUDA_CALL(what, cudaGetDevice, &previous_);
    if (previous_ != device) {
      CUDA_CALL(what, cudaSetDevice, device);
      switched_ = true;
    }
    return STRATA_SUCCESS;
  }

 private:
  int previous_ = 0;
  bool switched_ = false;
};

#define ENTER_DEVICE(device, what) \
  DeviceGuard guard_;              \
  STRATA_RETURN_IF_ERROR(guard_.enter(device, what))

cudaStream_t as_stream(void* s) { return static_cast<cudaStream_t>(s); }
cudaEvent_t as_event(void* e) { return static_cast<cudaEvent_t>(e); }

struct Probe {
  int count = 0;
  std::string reason;
};

const Probe& probe() {
  static const Probe p = [] {
    Probe r;
    int n = 0;
    const cudaError_t err = cudaGetDeviceCount(&n);
    if (err != cudaSuccess) {
      // Without a GPU cudart answers cudaErrorInsufficientDriver (35) or cudaErrorNoDevice (100), among
      // others; every error means "no usable device", not a failure of the caller.
      cudaGetLastError();
      r.reason = fmt::format("cudaGetDeviceCount failed: {} ({})", cudaGetErrorString(err), cudaGetErrorName(err));
    } else if (n == 0) {
      r.reason = "no CUDA device found";
    } else {
      r.count = n;
    }
    return r;
  }();
  return p;
}

}  // namespace

int device_count() { return probe().count; }
const std::string& unavailable_reason() { return probe().reason; }

strata_status get_properties(int device, strata_device_properties* props, const char* what) {
  cudaDeviceProp p{};
  CUDA_CALL(what, cudaGetDeviceProperties, &p, device);
  std::memset(props, 0, sizeof(*props));
  static_assert(sizeof(props->name) >= sizeof(p.name));
  std::memcpy(props->name, p.name, sizeof(p.name));
  props->name[sizeof(props->name) - 1] = '\0';
  static_assert(sizeof(props->uuid) == sizeof(p.uuid.bytes));
  std::memcpy(props->uuid, p.uuid.bytes, sizeof(props->uuid));
  props->multiprocessor_count = p.multiProcessorCount;
  props->sm_major = p.major;
  props->sm_minor = p.minor;
  fmt::format_to_n(props->isa, sizeof(props->isa) - 1, "sm_{}{}", p.major, p.minor);
  props->total_memory = p.totalGlobalMem;
  props->l2_cache_bytes = static_cast<uint64_t>(p.l2CacheSize);
  return STRATA_SUCCESS;
}

int sm_version(int device) {
  int major = 0, minor = 0;
  if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) != cudaSuccess ||
      cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return major * 10 + minor;
}

strata_status set_device(int device, const char* what) {
  CUDA_CALL(what, cudaSetDevice, device);
  return STRATA_SUCCESS;
}

strata_status device_synchronize(int device, const char* what) {
  ENTER_DEVICE(device, what);
  CUDA_CALL(what, cudaDeviceSynchronize);
  return STRATA_SUCCESS;
}

strata_status stream_create(int device, bool non_blocking, int priority, void** stream, const char* what) {
  ENTER_DEVICE(device, what);
  cudaStream_t s = nullptr;
  CUDA_CALL(what, cudaStreamCreateWithPriority, &s, non_blocking ? cudaStreamNonBlocking : cudaStreamDefault, priority);
  *stream = s;
  return STRATA_SUCCESS;
}

strata_status stream_destroy(int device, void* stream, const char* what) {
  ENTER_DEVICE(device, what);
  CUDA_CALL(what, cudaStreamDestroy, as_stream(stream));
  return STRATA_SUCCESS;
}

strata_status stream_get_attributes(int device, void* stream, int* priority, bool* non_blocking, const char* what) {
  ENTER_DEVICE(device, what);
  unsigned flags = 0;
  CUDA_CALL(what, cudaStreamGetPriority, as_stream(stream), priority);
  CUDA_CALL(what, cudaStreamGetFlags, as_stream(stream), &flags);
  *non_blocking = (flags & cudaStreamNonBlocking) != 0;
  return STRATA_SUCCESS;
}

strata_status stream_synchronize(int device, void* stream, const char* what) {
  ENTER_DEVICE(device, what);
  CUDA_CALL(what, cudaStreamSynchronize, as_stream(stream));
  return STRATA_SUCCESS;
}

strata_status stream_query(int device, void* stream, bool* idle, const char* what) {
  ENTER_DEVICE(device, what);
  const cudaError_t err = cudaStreamQuery(as_stream(stream));
  if (err == cudaErrorNotReady) {
    cudaGetLastError();
    *idle = false;
    return STRATA_SUCCESS;
  }
  if (err != cudaSuccess) return cuda_fail(err, what, "cudaStreamQuery");
  *idle = true;
  return STRATA_SUCCESS;
}

strata_status launch_host_func(int device, void* stream, void (*fn)(void*), void* user, const char* what) {
  ENTER_DEVICE(device, what);
  CUDA_CALL(what, cudaLaunchHostFunc, as_stream(stream), fn, user);
  return STRATA_SUCCESS;
}

strata_status stream_wait_event(int device, void* stream, void* event, const char* what) {
  ENTER_DEVICE(device, what);
  CUDA_CALL(what, cudaStreamWaitEvent, as_stream(stream), as_event(event), 0);
  return STRATA_SUCCESS;
}

strata_status event_create(int device, void** event, const char* what) {
  ENTER_DEVICE(device, what);
  cudaEvent_t e = nullptr;
  CUDA_CALL(what, cudaEventCreateWithFlags, &e, cudaEventDefault);
  *event = e;
  return STRATA_SUCCESS;
}

strata_status event_destroy(int device, void* event, const char* what) {
  ENTER_DEVICE(device, what);
  CUDA_CALL(what, cudaEventDestroy, as_event(event));
  return STRATA_SUCCESS;
}

strata_status event_record(int device, void* event, void* stream, const char* what) {
  ENTER_DEVICE(device, what);
  CUDA_CALL(what, cudaEventRecord, as_event(event), as_stream(stream));
  return STRATA_SUCCESS;
}

strata_status event_synchronize(void* event, const char* what) {
  CUDA_CALL(what, cudaEventSynchronize, as_event(event));
  return STRATA_SUCCESS;
}

strata_status event_query(void* event, bool* done, const char* what) {
  const cudaError_t err = cudaEventQuery(as_event(event));
  if (err == cudaErrorNotReady) {
    cudaGetLastError();
    *done = false;
    return STRATA_SUCCESS;
  }
  if (err != cudaSuccess) return cuda_fail(err, what, "cudaEventQuery");
  *done = true;
  return STRATA_SUCCESS;
}

strata_status event_elapsed_ms(float* ms, void* start, void* end, const char* what) {
  CUDA_CALL(what, cudaEventElapsedTime, ms, as_event(start), as_event(end));
  return STRATA_SUCCESS;
}

strata_status malloc_device(int device, size_t size, void** ptr, const char* what) {
  ENTER_DEVICE(device, what);
  const cudaError_t err = cudaMalloc(ptr, size);
  if (err == cudaErrorMemoryAllocation) {
    cudaGetLastError();
    size_t free_bytes = 0, total_bytes = 0;
    if (cudaMemGetInfo(&free_bytes, &total_bytes) != cudaSuccess) cudaGetLastError();
    return fail(STRATA_ERROR_OUT_OF_MEMORY,
                "{}: out of memory on cuda:{}: cudaMalloc of {} bytes failed ({} bytes free of {})", what, device, size,
                free_bytes, total_bytes);
  }
  if (err != cudaSuccess) return cuda_fail(err, what, "cudaMalloc");
  return STRATA_SUCCESS;
}

strata_status free_device(int device, void* ptr, const char* what) {
  ENTER_DEVICE(device, what);
  CUDA_CALL(what, cudaFree, ptr);
  return STRATA_SUCCESS;
}

strata_status malloc_host(size_t size, void** ptr, const char* what) {
  const cudaError_t err = cudaHostAlloc(ptr, size, cudaHostAllocPortable);
  if (err == cudaErrorMemoryAllocation) {
    cudaGetLastError();
    return fail(STRATA_ERROR_OUT_OF_MEMORY, "{}: out of memory: cudaHostAlloc of {} pinned bytes failed", what, size);
  }
  if (err != cudaSuccess) return cuda_fail(err, what, "cudaHostAlloc");
  return STRATA_SUCCESS;
}

strata_status free_host(void* ptr, const char* what) {
  CUDA_CALL(what, cudaFreeHost, ptr);
  return STRATA_SUCCESS;
}

int pointer_device(const void* ptr) {
  if (device_count() == 0) return -1;
  cudaPointerAttributes attr{};
  if (cudaPointerGetAttributes(&attr, ptr) != cudaSuccess) {
    cudaGetLastError();
    return -1;
  }
  return (attr.type == cudaMemoryTypeDevice || attr.type == cudaMemoryTypeManaged) ? attr.device : -1;
}

strata_status memcpy(int device, void* dst, const void* src, size_t size, const char* what) {
  ENTER_DEVICE(device, what);
  CUDA_CALL(what, cudaMemcpy, dst, src, size, cudaMemcpyDefault);
  return STRATA_SUCCESS;
}

strata_status memcpy_async(int device, void* dst, const void* src, size_t size, void* stream, const char* what) {
  ENTER_DEVICE(device, what);
  CUDA_CALL(what, cudaMemcpyAsync, dst, src, size, cudaMemcpyDefault, as_stream(stream));
  return STRATA_SUCCESS;
}

strata_status memset(int device, void* dst, int value, size_t size, const char* what) {
  ENTER_DEVICE(device, what);
  CUDA_CALL(what, cudaMemset, dst, value, size);
  return STRATA_SUCCESS;
}

strata_status memset_async(int device, void* dst, int value, size_t size, void* stream, const char* what) {
  ENTER_DEVICE(device, what);
  CUDA_CALL(what, cudaMemsetAsync, dst, value, size, as_stream(stream));
  return STRATA_SUCCESS;
}

#else  // !STRATA_WITH_CUDA

namespace {
strata_status unavailable(const char* what) {
  return fail(STRATA_ERROR_DEVICE_UNAVAILABLE, "{}: CUDA is unavailable: Strata was built without CUDA", what);
}
}  // namespace

int device_count() { return 0; }
const std::string& unavailable_reason() {
  static const std::string reason = "Strata was built without CUDA";
  return reason;
}
strata_status get_properties(int, strata_device_properties*, const char* what) { return unavailable(what); }
int sm_version(int) { return 0; }
strata_status set_device(int, const char* what) { return unavailable(what); }
strata_status device_synchronize(int, const char* what) { return unavailable(what); }
strata_status stream_create(int, bool, int, void**, const char* what) { return unavailable(what); }
strata_status stream_destroy(int, void*, const char* what) { return unavailable(what); }
strata_status stream_get_attributes(int, void*, int*, bool*, const char* what) { return unavailable(what); }
strata_status stream_synchronize(int, void*, const char* what) { return unavailable(what); }
strata_status stream_query(int, void*, bool*, const char* what) { return unavailable(what); }
strata_status launch_host_func(int, void*, void (*)(void*), void*, const char* what) { return unavailable(what); }
strata_status stream_wait_event(int, void*, void*, const char* what) { return unavailable(what); }
strata_status event_create(int, void**, const char* what) { return unavailable(what); }
strata_status event_destroy(int, void*, const char* what) { return unavailable(what); }
strata_status event_record(int, void*, void*, const char* what) { return unavailable(what); }
strata_status event_synchronize(void*, const char* what) { return unavailable(what); }
strata_status event_query(void*, bool*, const char* what) { return unavailable(what); }
strata_status event_elapsed_ms(float*, void*, void*, const char* what) { return unavailable(what); }
strata_status malloc_device(int, size_t, void**, const char* what) { return unavailable(what); }
strata_status free_device(int, void*, const char* what) { return unavailable(what); }
strata_status malloc_host(size_t, void**, const char* what) { return unavailable(what); }
strata_status free_host(void*, const char* what) { return unavailable(what); }
int pointer_device(const void*) { return -1; }
strata_status memcpy(int, void*, const void*, size_t, const char* what) { return unavailable(what); }
strata_status memcpy_async(int, void*, const void*, size_t, void*, const char* what) { return unavailable(what); }
strata_status memset(int, void*, int, size_t, const char* what) { return unavailable(what); }
strata_status memset_async(int, void*, int, size_t, void*, const char* what) { return unavailable(what); }

#endif  // STRATA_WITH_CUDA

}  // namespace strata::rt::cuda
