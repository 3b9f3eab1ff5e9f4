// The runtime's only door to cudart. Every call is checked: a CUDA failure sets the last error to
// "<what>: <cuda call> failed: <cudaGetErrorString>" and returns STRATA_ERROR_RUNTIME (out-of-memory gives
// STRATA_ERROR_OUT_OF_MEMORY). `what` is the C API function on whose behalf the call is made.
//
// The functions exist in every build, so callers need no #if: without CUDA, device_count() is 0 and the
// rest fail with STRATA_ERROR_DEVICE_UNAVAILABLE (callers reach them only for CUDA devices, which
// check_device has already refused). Handles are passed as void* (cudaStream_t, cudaEvent_t) to keep
// cuda_runtime_api.h out of the other runtime files. Calls that take a device switch to it for their
// duration and restore the caller's current device; device -1 means the current device.
#pragma once

#include <cstddef>
#include <string>

#include "strata/runtime.h"

namespace strata::rt::cuda {

// Devices that answer; 0 on any cudaGetDeviceCount error (no driver, insufficient driver, no GPU).
// Queried once per process.
int device_count();
// Why there are no devices, for messages: "" when device_count() > 0.
const std::string& unavailable_reason();

strata_status get_properties(int device, strata_device_properties* props, const char* what);
int sm_version(int device);  // major*10+minor; 0 on error
strata_status set_device(int device, const char* what);
strata_status device_synchronize(int device, const char* what);

// Streams. `stream` == nullptr is the legacy default stream (of `device` where one is taken).
strata_status stream_create(int device, bool non_blocking, int priority, void** stream, const char* what);
strata_status stream_destroy(int device, void* stream, const char* what);
// Actual priority and non-blocking flag of a stream (cudart clamps a priority out of range).
strata_status stream_get_attributes(int device, void* stream, int* priority, bool* non_blocking, const char* what);
strata_status stream_synchronize(int device, void* stream, const char* what);
strata_status stream_query(int device, void* stream, bool* idle, const char* what);
// fn(user) runs on a cudart thread once the stream reaches it; it must not call CUDA.
strata_status launch_host_func(int device, void* stream, void (*fn)(void*), void* user, const char* what);
strata_status stream_wait_event(int device, void* stream, void* event, const char* what);

// Events (timing enabled).
strata_status event_create(int device, void** event, const char* what);
strata_status event_destroy(int device, void* event, const char* what);
strata_status event_record(int device, void* event, void* stream, const char* what);
strata_status event_synchronize(void* event, const char* what);
strata_status event_query(void* event, bool* done, const char* what);
strata_status event_elapsed_ms(float* ms, void* start, void* end, const char* what);

// Memory. malloc gives STRATA_ERROR_OUT_OF_MEMORY (with the size) when the device is full.
strata_status malloc_device(int device, size_t size, void** ptr, const char* what);
strata_status free_device(int device, void* ptr, const char* what);
strata_status malloc_host(size_t size, void** ptr, const char* what);  // pinned, portable
strata_status free_host(void* ptr, const char* what);
// Device index of memory cudart knows as device or managed memory (allocated outside Strata, e.g. by
// torch); -1 for host memory or when there is no CUDA device.
int pointer_device(const void* ptr);
// `device` is made current (the device the copy is issued from); the direction comes from unified
// addressing (cudaMemcpyDefault), so callers only decide that CUDA takes part.
strata_status memcpy(int device, void* dst, const void* src, size_t size, const char* what);
strata_status memcpy_async(int device, void* dst, const void* src, size_t size, void* stream, const char* what);
strata_status memset(int device, void* dst, int value, size_t size, const char* what);
strata_status memset_async(int device, void* dst, int value, size_t size, void* stream, const char* what);

}  // namespace strata::rt::cuda
