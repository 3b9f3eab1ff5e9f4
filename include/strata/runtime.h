/* Strata runtime (layer L1): devices, streams, events, memory, versions, errors, determinism.
 *
 * Plain C with a stable ABI, shaped like CANN's acl runtime. Every function returns a strata_status;
 * on failure the thread-local text from strata_get_last_error_message() names the argument and the
 * expected versus actual value. The CPU device always exists; CUDA devices exist when the library was
 * built with CUDA and a GPU answers.
 */
#ifndef STRATA_RUNTIME_H_
#define STRATA_RUNTIME_H_

#include <stddef.h>
#include <stdint.h>

#if defined(_WIN32)
#define STRATA_API __declspec(dllexport)
#else
#define STRATA_API __attribute__((visibility("default")))
#endif

#ifdef __cplusplus
extern "C" {
#endif

/* ---- status codes: stable numbers, grouped by cause (hundreds digit) ---- */
typedef enum strata_status {
  STRATA_SUCCESS = 0,
  /* 1xx: the caller passed something wrong */
  STRATA_ERROR_NULL_POINTER = 100,
  STRATA_ERROR_INVALID_DEVICE = 101,
  STRATA_ERROR_INVALID_DTYPE = 102,
  STRATA_ERROR_INVALID_SHAPE = 103,
  STRATA_ERROR_INVALID_STRIDE = 104,
  STRATA_ERROR_INVALID_ATTRIBUTE = 105,
  STRATA_ERROR_INVALID_VALUE = 106,
  STRATA_ERROR_WORKSPACE_TOO_SMALL = 107,
  STRATA_ERROR_INVALID_HANDLE = 108,
  /* 2xx: valid request this build or machine cannot serve */
  STRATA_ERROR_UNSUPPORTED = 200,
  STRATA_ERROR_NO_IMPLEMENTATION = 201,
  STRATA_ERROR_DEVICE_UNAVAILABLE = 202,
  /* 3xx: the runtime failed underneath */
  STRATA_ERROR_OUT_OF_MEMORY = 300,
  STRATA_ERROR_RUNTIME = 301,
  STRATA_ERROR_LAUNCH_FAILED = 302,
  /* 9xx: a bug in Strata */
  STRATA_ERROR_INTERNAL = 900
} strata_status;

STRATA_API const char* strata_status_name(strata_status status);
/* Text of the last failure on this thread ("" if none since strata_clear_last_error). */
STRATA_API const char* strata_get_last_error_message(void);
STRATA_API void strata_clear_last_error(void);

/* ---- versions ---- */
#define STRATA_VERSION_MAJOR 0
#define STRATA_VERSION_MINOR 1
#define STRATA_VERSION_PATCH 0
STRATA_API const char* strata_get_version_string(void); /* "0.1.0" */
STRATA_API int32_t strata_get_version(void);            /* major*10000 + minor*100 + patch */

/* ---- devices ---- */
typedef enum strata_device_type { STRATA_DEVICE_CPU = 0, STRATA_DEVICE_CUDA = 1 } strata_device_type;

typedef struct strata_device {
  int32_t type;  /* strata_device_type */
  int32_t index; /* 0 for the CPU */
} strata_device;

typedef struct strata_device_properties {
  char name[256];
  uint8_t uuid[16];
  int32_t multiprocessor_count; /* SMs on CUDA, logical cores on CPU */
  int32_t sm_major, sm_minor;   /* CUDA compute capability; 0 on CPU */
  char isa[64];                 /* best SIMD ISA on CPU ("avx512", "avx2", ...); "sm_90" on CUDA */
  uint64_t total_memory;        /* bytes */
  uint64_t l2_cache_bytes;      /* last-level cache (CPU: per socket as the OS reports it) */
} strata_device_properties;

STRATA_API strata_status strata_device_count(int32_t type, int32_t* count);
STRATA_API strata_status strata_device_get_properties(strata_device device, strata_device_properties* props);
/* Whether the library was compiled with CUDA support (1) or not (0). */
STRATA_API int32_t strata_built_with_cuda(void);

/* ---- streams: in-order queues; a CPU stream is a worker thread, a CUDA stream wraps cudaStream_t ----
 * A NULL stream means "synchronous on the calling thread" for the CPU and the legacy default stream for
 * CUDA. */
typedef struct strata_stream_s* strata_stream;
enum { STRATA_STREAM_DEFAULT = 0, STRATA_STREAM_NON_BLOCKING = 1 };

STRATA_API strata_status strata_stream_create(strata_device device, uint32_t flags, int32_t priority,
                                              strata_stream* stream);
/* Wraps a stream owned by someone else (a cudaStream_t, e.g. torch's current stream); never destroyed
 * by Strata's strata_stream_destroy beyond the wrapper itself. */
STRATA_API strata_status strata_stream_wrap_cuda(int32_t device_index, void* cuda_stream, strata_stream* stream);
STRATA_API strata_status strata_stream_destroy(strata_stream stream);
STRATA_API strata_status strata_stream_synchronize(strata_stream stream);
/* *idle = 1 when every task enqueued so far has finished. */
STRATA_API strata_status strata_stream_query(strata_stream stream, int32_t* idle);
STRATA_API strata_status strata_stream_get_priority(strata_stream stream, int32_t* priority);
STRATA_API strata_status strata_stream_get_flags(strata_stream stream, uint32_t* flags);
STRATA_API strata_status strata_stream_get_device(strata_stream stream, strata_device* device);
/* Enqueues fn(user) on the stream (runs on the worker thread for CPU streams; a host callback on CUDA). */
STRATA_API strata_status strata_stream_enqueue_host(strata_stream stream, void (*fn)(void*), void* user);

/* ---- events ---- */
typedef struct strata_event_s* strata_event;
STRATA_API strata_status strata_event_create(strata_device device, strata_event* event);
STRATA_API strata_status strata_event_destroy(strata_event event);
STRATA_API strata_status strata_event_record(strata_event event, strata_stream stream);
STRATA_API strata_status strata_event_synchronize(strata_event event);
/* *done = 1 when the work recorded before the event has completed (or the event was never recorded). */
STRATA_API strata_status strata_event_query(strata_event event, int32_t* done);
STRATA_API strata_status strata_stream_wait_event(strata_stream stream, strata_event event);
STRATA_API strata_status strata_event_elapsed_time(float* ms, strata_event start, strata_event end);

/* ---- memory: a caching allocator per device ---- */
typedef struct strata_memory_stats {
  uint64_t allocated;      /* bytes handed out and not yet freed */
  uint64_t reserved;       /* bytes held from the system (allocated + cached) */
  uint64_t peak_allocated; /* high-water mark of allocated since the last reset */
  uint64_t num_allocs;     /* strata_malloc calls */
  uint64_t num_system_allocs; /* calls that had to go to the system (cache misses) */
} strata_memory_stats;

/* Blocks are 256-byte aligned. A block freed while work on `stream` may still use it is only reused by
 * that stream (or after a device synchronize). NULL stream = default stream. Size 0 gives a unique
 * non-null pointer (to free like any other); strata_free(NULL) does nothing. */
STRATA_API strata_status strata_malloc(strata_device device, size_t size, strata_stream stream, void** ptr);
STRATA_API strata_status strata_free(void* ptr);
STRATA_API strata_status strata_memory_get_stats(strata_device device, strata_memory_stats* stats);
STRATA_API strata_status strata_memory_reset_peak(strata_device device);
STRATA_API strata_status strata_memory_empty_cache(strata_device device); /* returns cached blocks */
/* Base and size of the allocation (from strata_malloc or strata_malloc_host) that holds ptr; the size is
 * the whole block's (the request rounded up to its size class). */
STRATA_API strata_status strata_mem_get_address_range(const void* ptr, void** base, size_t* size);

/* Pinned (page-locked when CUDA is present) host memory. */
STRATA_API strata_status strata_malloc_host(size_t size, void** ptr);
STRATA_API strata_status strata_free_host(void* ptr);

typedef enum strata_memcpy_kind {
  STRATA_MEMCPY_HOST_TO_HOST = 0,
  STRATA_MEMCPY_HOST_TO_DEVICE = 1,
  STRATA_MEMCPY_DEVICE_TO_HOST = 2,
  STRATA_MEMCPY_DEVICE_TO_DEVICE = 3,
  STRATA_MEMCPY_DEFAULT = 4 /* inferred from the pointers */
} strata_memcpy_kind;
STRATA_API strata_status strata_memcpy(void* dst, const void* src, size_t size, int32_t kind);
STRATA_API strata_status strata_memcpy_async(void* dst, const void* src, size_t size, int32_t kind,
                                             strata_stream stream);
/* Sets `size` bytes to `value`. The pointer's device is found from the allocator (host memory otherwise). */
STRATA_API strata_status strata_memset(void* dst, int32_t value, size_t size);
STRATA_API strata_status strata_memset_async(void* dst, int32_t value, size_t size, strata_stream stream);
STRATA_API strata_status strata_device_synchronize(strata_device device);

/* ---- determinism: 0 off, 1 same bits run to run (default), 2 batch- and thread-count-invariant ---- */
STRATA_API strata_status strata_set_determinism(int32_t level);
STRATA_API int32_t strata_get_determinism(void);

/* ---- CPU threads (OpenMP); 0 = all cores. Results never depend on this (fixed work split). ---- */
STRATA_API strata_status strata_set_num_threads(int32_t n);
STRATA_API int32_t strata_get_num_threads(void);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* STRATA_RUNTIME_H_ */
