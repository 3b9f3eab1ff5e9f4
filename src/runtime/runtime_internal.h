// What the layers above the runtime (op base, kernels, tools) need from it, beyond the C API.
#pragma once

#include <functional>
#include <string>

#include "strata/runtime.h"

namespace strata::rt {

// Checks that `device` names a device that exists here; on failure sets the last error, naming `what`
// (e.g. "l2norm_fwd: x"), and returns STRATA_ERROR_INVALID_DEVICE or STRATA_ERROR_DEVICE_UNAVAILABLE.
strata_status check_device(strata_device device, const char* what);

// "cpu", "cuda:0".
std::string device_str(strata_device device);
inline bool same_device(strata_device a, strata_device b) { return a.type == b.type && a.index == b.index; }

// Device a stream belongs to; the CPU for a null stream.
strata_device stream_device(strata_stream stream);

// Runs fn in stream order on the CPU: inline on the calling thread for a null stream, else on the stream's
// worker thread after everything enqueued before it. A CUDA stream gets a host callback.
strata_status submit_host(strata_stream stream, std::function<void()> fn);

// The cudaStream_t behind a stream (nullptr = legacy default stream); only for CUDA streams.
void* cuda_stream_handle(strata_stream stream);

// Compute capability of a CUDA device as major*10+minor (90 for H100/H200); 0 without CUDA.
int cuda_sm_version(int device_index);
// Makes `device_index` current on the calling thread (no-op without CUDA).
strata_status cuda_set_device(int device_index);

// Determinism level (0, 1, 2) and the OpenMP thread count the kernels use.
int determinism();
int num_threads();

}  // namespace strata::rt
