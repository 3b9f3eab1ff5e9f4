// What the caching allocator (memory.cpp) tells the rest of the runtime: where a pointer lives, and
// when blocks held back for one stream may be handed to any stream.
#pragma once

#include <cstddef>

#include "strata/runtime.h"

namespace strata::rt {

// The device that holds [ptr, ptr + size): the allocator's block map first (pinned host blocks are CPU
// memory), then cudart for device memory allocated outside Strata (e.g. by torch); anything else is host
// memory (the CPU device). Fails with STRATA_ERROR_INVALID_VALUE, naming function `fn` and argument `arg`,
// when the range runs past the end of its block or lies in a block that was freed.
strata_status locate(const void* ptr, size_t size, const char* fn, const char* arg, strata_device* device);

// The key a non-null stream's blocks are cached under: its CPU worker or its cudaStream_t, so that two
// wrappers of one cudaStream_t share their cache.
const void* stream_order_key(strata_stream stream);

// After a device synchronize, no queued work uses any cached block of `device`: every stream may reuse them.
void on_device_synchronized(strata_device device);
// The stream behind `key` is gone and its work finished: its blocks, cached or still in use, become
// reusable by any stream once free.
void on_stream_retired(const void* key);

}  // namespace strata::rt
