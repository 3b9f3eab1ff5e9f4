// The caching allocator (one pool per device) and pinned host memory.
//
// A request is rounded to a size class: up to 512 B below 1 MiB, up to 2 MiB from 1 MiB on, so that freed
// blocks fit later requests of similar size. A freed block stays cached under the order of the stream it
// was allocated on (a CPU worker or a cudaStream_t) and is reused only by allocations on that stream, whose
// later work cannot overlap the block's last use; after a device synchronize, or once its stream is
// destroyed, any stream may take it. Reuse is best fit among blocks smaller than twice the request, so a
// small request never pins down a huge block. Blocks are never split: every block is one system allocation
// (aligned_alloc with 256-byte alignment on the CPU, cudaMalloc on CUDA, whose blocks are 256-byte aligned).
//
// strata_malloc(size 0) returns a unique, non-null pointer to a block of the smallest class, which
// strata_free accepts like any other. strata_free(NULL) and strata_free_host(NULL) do nothing, like free().
//
// One mutex guards everything: the block map (base -> block, every system allocation cached or in use, and
// pinned host blocks) answers strata_mem_get_address_range and tells memcpy where a pointer lives.
#include <sys/sysinfo.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <map>
#include <mutex>
#include <set>
#include <utility>

#include "runtime/allocator.h"
#include "runtime/cuda_backend.h"
#include "runtime/error.h"
#include "runtime/handles.h"
#include "runtime/runtime_internal.h"

namespace strata::rt {
namespace {

constexpr size_t kAlignment = 256;
constexpr size_t kSmallQuantum = 512;
constexpr size_t kLargeThreshold = size_t{1} << 20;
constexpr size_t kLargeQuantum = size_t{2} << 20;
// Larger requests cannot be rounded without overflow, and no device has that much memory.
constexpr size_t kMaxRequest = SIZE_MAX / 2;

// The order under which a cached block is free for every stream.
const char kAnyStreamTag = 0;
const void* const kAnyStream = &kAnyStreamTag;

size_t round_up(size_t n, size_t quantum) { return (n + quantum - 1) / quantum * quantum; }

size_t size_class(size_t n) {
  if (n == 0) n = 1;  // size 0 still gets a unique block
  return n < kLargeThreshold ? round_up(n, kSmallQuantum) : round_up(n, kLargeQuantum);
}

enum class Origin : uint8_t { device, pinned_cuda, pinned_plain };

struct Block {
  size_t size = 0;
  strata_device device{};
  Origin origin = Origin::device;
  bool in_use = true;
  const void* stream = kAnyStream;  // the order it may be reused in
};

// Ordered so that lower_bound({stream, size, 0}) is the smallest cached block of that stream that fits.
struct CachedKey {
  uintptr_t stream;
  size_t size;
  uintptr_t base;
  auto operator<=>(const CachedKey&) const = default;
};

struct Pool {
  strata_memory_stats stats{};
  std::set<CachedKey> cached;
};

struct Allocator {
  std::mutex mutex;
  std::map<uintptr_t, Block> blocks;
  std::map<std::pair<int32_t, int32_t>, Pool> pools;

  Pool& pool(strata_device d) { return pools[{d.type, d.index}]; }

  // The block holding address p, or blocks.end().
  std::map<uintptr_t, Block>::iterator containing(uintptr_t p) {
    auto it = blocks.upper_bound(p);
    if (it == blocks.begin()) return blocks.end();
    --it;
    return p < it->first + it->second.size ? it : blocks.end();
  }
};

Allocator& allocator() {
  // Never destroyed: blocks may still be freed from other static destructors, and by then cudart may be
  // unloaded; the system takes the memory back at exit.
  static auto* a = new Allocator;
  return *a;
}

uintptr_t addr(const void* p) { return reinterpret_cast<uintptr_t>(p); }
void* as_ptr(uintptr_t p) { return reinterpret_cast<void*>(p); }

// Requests above this fail at once: on the CPU a block larger than memory and swap together cannot be
// used anyway, and refusing it up front keeps huge requests away from aligned_alloc (which sanitizers
// abort on instead of returning NULL). Read once: sysinfo is a system call, and malloc is a hot path.
size_t max_request(strata_device device) {
  if (device.type != STRATA_DEVICE_CPU) return kMaxRequest;
  static const size_t cpu_limit = [] {
    struct sysinfo info {};
    if (sysinfo(&info) != 0) return kMaxRequest;
    const uint64_t bytes = (uint64_t{info.totalram} + info.totalswap) * info.mem_unit;
    return static_cast<size_t>(std::min<uint64_t>(bytes, kMaxRequest));
  }();
  return cpu_limit;
}

strata_status system_alloc(strata_device device, size_t size, void** p) {
  if (device.type == STRATA_DEVICE_CPU) {
    *p = std::aligned_alloc(kAlignment, size);
    if (*p == nullptr) {
      return fail(STRATA_ERROR_OUT_OF_MEMORY, "strata_malloc: out of memory on cpu: aligned_alloc of {} bytes failed",
                  size);
    }
    return STRATA_SUCCESS;
  }
  return cuda::malloc_device(device.index, size, p, "strata_malloc");
}

strata_status system_free(const Block& b, void* p, const char* what) {
  switch (b.origin) {
    case Origin::device:
      if (b.device.type == STRATA_DEVICE_CPU) break;
      return cuda::free_device(b.device.index, p, what);
    case Origin::pinned_cuda:
      return cuda::free_host(p, what);
    case Origin::pinned_plain:
      break;
  }
  std::free(p);
  return STRATA_SUCCESS;
}

// Takes a cached block for `stream_key` (or one free for any stream) that fits `size` best, or returns 0.
// The block may be larger than `size`. Caller holds the mutex.
uintptr_t take_cached(Allocator& a, Pool& pool, const void* stream_key, size_t size) {
  auto best = pool.cached.end();
  for (const void* key : {stream_key, kAnyStream}) {
    auto it = pool.cached.lower_bound({addr(key), size, 0});
    if (it == pool.cached.end() || it->stream != addr(key) || it->size >= 2 * size) continue;
    if (best == pool.cached.end() || it->size < best->size) best = it;
  }
  if (best == pool.cached.end()) return 0;
  const uintptr_t base = best->base;
  pool.cached.erase(best);
  Block& b = a.blocks.at(base);
  b.in_use = true;
  b.stream = stream_key;
  return base;
}

// Returns the device's cached blocks that any stream may take to the system. Caller holds the mutex.
strata_status release_cached(Allocator& a, Pool& pool, const char* what) {
  strata_status status = STRATA_SUCCESS;
  auto it = pool.cached.lower_bound({addr(kAnyStream), 0, 0});
  while (it != pool.cached.end() && it->stream == addr(kAnyStream)) {
    auto block = a.blocks.find(it->base);
    const strata_status st = system_free(block->second, as_ptr(it->base), what);
    if (status == STRATA_SUCCESS) status = st;
    pool.stats.reserved -= block->second.size;
    a.blocks.erase(block);
    it = pool.cached.erase(it);
  }
  return status;
}

// One attempt: the cache, then the system.
strata_status allocate(strata_device device, size_t size, const void* stream_key, void** ptr) {
  Allocator& a = allocator();
  std::lock_guard lock(a.mutex);
  Pool& pool = a.pool(device);
  uintptr_t base = take_cached(a, pool, stream_key, size);
  if (base == 0) {
    void* p = nullptr;
    STRATA_RETURN_IF_ERROR(system_alloc(device, size, &p));
    base = addr(p);
    a.blocks[base] = Block{size, device, Origin::device, true, stream_key};
    pool.stats.reserved += size;
    ++pool.stats.num_system_allocs;
  }
  // The whole block counts as allocated, as strata_free will give the whole block back.
  pool.stats.allocated += a.blocks.at(base).size;
  pool.stats.peak_allocated = std::max(pool.stats.peak_allocated, pool.stats.allocated);
  ++pool.stats.num_allocs;
  *ptr = as_ptr(base);
  return STRATA_SUCCESS;
}

// Why `ptr`, which is not the base of a live block of `origin`, cannot be freed by `what`.
strata_status refuse_free(Allocator& a, uintptr_t p, const char* what, const char* allocator_name) {
  auto it = a.containing(p);
  if (it == a.blocks.end()) {
    return fail(STRATA_ERROR_INVALID_VALUE, "{}: ptr {} was not allocated by {}", what, as_ptr(p), allocator_name);
  }
  if (it->first != p) {
    return fail(STRATA_ERROR_INVALID_VALUE,
                "{}: ptr {} is {} bytes inside the block at {}; pass the pointer that {} returned", what, as_ptr(p),
                p - it->first, as_ptr(it->first), allocator_name);
  }
  if (it->second.origin == Origin::device) {
    if (!it->second.in_use) return fail(STRATA_ERROR_INVALID_VALUE, "{}: ptr {} was already freed", what, as_ptr(p));
    return fail(STRATA_ERROR_INVALID_VALUE, "{}: ptr {} was allocated by strata_malloc; free it with strata_free", what,
                as_ptr(p));
  }
  return fail(STRATA_ERROR_INVALID_VALUE,
              "{}: ptr {} was allocated by strata_malloc_host; free it with strata_free_host", what, as_ptr(p));
}

}  // namespace

strata_status locate(const void* ptr, size_t size, const char* fn, const char* arg, strata_device* device) {
  const uintptr_t p = addr(ptr);
  {
    Allocator& a = allocator();
    std::lock_guard lock(a.mutex);
    auto it = a.containing(p);
    if (it != a.blocks.end()) {
      const Block& b = it->second;
      if (!b.in_use) {
        return fail(STRATA_ERROR_INVALID_VALUE, "{}: {} ({}) points into a block that was freed", fn, arg, ptr);
      }
      const size_t offset = p - it->first;
      if (size > b.size - offset) {
        return fail(STRATA_ERROR_INVALID_VALUE,
                    "{}: {} bytes at {} run past the end of its block ({} bytes from offset {} of a {}-byte block)", fn,
                    size, arg, b.size - offset, offset, b.size);
      }
      *device = b.origin == Origin::device ? b.device : strata_device{STRATA_DEVICE_CPU, 0};
      return STRATA_SUCCESS;
    }
  }
  const int cuda_device = cuda::pointer_device(ptr);
  *device = cuda_device >= 0 ? strata_device{STRATA_DEVICE_CUDA, cuda_device} : strata_device{STRATA_DEVICE_CPU, 0};
  return STRATA_SUCCESS;
}

void on_device_synchronized(strata_device device) {
  Allocator& a = allocator();
  std::lock_guard lock(a.mutex);
  Pool& pool = a.pool(device);
  std::set<CachedKey> any;
  for (const CachedKey& k : pool.cached) {
    any.insert({addr(kAnyStream), k.size, k.base});
    a.blocks.at(k.base).stream = kAnyStream;
  }
  pool.cached = std::move(any);
}

void on_stream_retired(const void* key) {
  Allocator& a = allocator();
  std::lock_guard lock(a.mutex);
  for (auto& [base, b] : a.blocks) {
    if (b.origin != Origin::device || b.stream != key) continue;
    b.stream = kAnyStream;
    if (b.in_use) continue;
    Pool& pool = a.pool(b.device);
    pool.cached.erase({addr(key), b.size, base});
    pool.cached.insert({addr(kAnyStream), b.size, base});
  }
}

}  // namespace strata::rt

using namespace strata;
using namespace strata::rt;

extern "C" {

strata_status strata_malloc(strata_device device, size_t size, strata_stream stream, void** ptr) {
  if (ptr == nullptr) return fail(STRATA_ERROR_NULL_POINTER, "strata_malloc: ptr (the output) is NULL");
  *ptr = nullptr;
  STRATA_RETURN_IF_ERROR(check_device(device, "strata_malloc"));
  STRATA_RETURN_IF_ERROR(check_stream_on(stream, device, "strata_malloc: stream"));
  const size_t limit = max_request(device);
  if (size > limit) {
    return fail(STRATA_ERROR_OUT_OF_MEMORY,
                "strata_malloc: out of memory on {}: {} bytes requested, more than the {} bytes it has",
                device_str(device), size, limit);
  }
  const size_t rounded = size_class(size);
  // The null stream is synchronous on the CPU (a freed block is idle at once) and the legacy default
  // stream on CUDA.
  const void* key = stream != nullptr                  ? stream_order_key(stream)
                    : device.type == STRATA_DEVICE_CPU ? kAnyStream
                                                       : nullptr;
  strata_status status = allocate(device, rounded, key, ptr);
  if (status == STRATA_ERROR_OUT_OF_MEMORY) {
    // Blocks cached for other streams may still be in use by queued work; once the device is idle, all of
    // them can go back to the system, and the request is tried once more.
    STRATA_RETURN_IF_ERROR(wait_device(device, "strata_malloc"));
    {
      Allocator& a = allocator();
      std::lock_guard lock(a.mutex);
      STRATA_RETURN_IF_ERROR(release_cached(a, a.pool(device), "strata_malloc"));
    }
    status = allocate(device, rounded, key, ptr);
  }
  if (status == STRATA_ERROR_OUT_OF_MEMORY) {
    strata_memory_stats stats{};
    strata_memory_get_stats(device, &stats);
    return fail(status, "{} (request {} bytes, rounded to {}; Strata holds {} bytes allocated, {} reserved on {})",
                last_error(), size, rounded, stats.allocated, stats.reserved, device_str(device));
  }
  return status;
}

strata_status strata_free(void* ptr) {
  if (ptr == nullptr) return STRATA_SUCCESS;
  Allocator& a = allocator();
  std::lock_guard lock(a.mutex);
  auto it = a.blocks.find(addr(ptr));
  if (it == a.blocks.end() || it->second.origin != Origin::device || !it->second.in_use) {
    return refuse_free(a, addr(ptr), "strata_free", "strata_malloc");
  }
  Block& b = it->second;
  b.in_use = false;
  Pool& pool = a.pool(b.device);
  pool.stats.allocated -= b.size;
  pool.cached.insert({addr(b.stream), b.size, it->first});
  return STRATA_SUCCESS;
}

strata_status strata_memory_get_stats(strata_device device, strata_memory_stats* stats) {
  if (stats == nullptr) return fail(STRATA_ERROR_NULL_POINTER, "strata_memory_get_stats: stats (the output) is NULL");
  STRATA_RETURN_IF_ERROR(check_device(device, "strata_memory_get_stats"));
  Allocator& a = allocator();
  std::lock_guard lock(a.mutex);
  *stats = a.pool(device).stats;
  return STRATA_SUCCESS;
}

strata_status strata_memory_reset_peak(strata_device device) {
  STRATA_RETURN_IF_ERROR(check_device(device, "strata_memory_reset_peak"));
  Allocator& a = allocator();
  std::lock_guard lock(a.mutex);
  Pool& pool = a.pool(device);
  pool.stats.peak_allocated = pool.stats.allocated;
  return STRATA_SUCCESS;
}

strata_status strata_memory_empty_cache(strata_device device) {
  // Wait first, so that blocks cached for a stream are idle and free for any stream to give back.
  STRATA_RETURN_IF_ERROR(wait_device(device, "strata_memory_empty_cache"));
  Allocator& a = allocator();
  std::lock_guard lock(a.mutex);
  return release_cached(a, a.pool(device), "strata_memory_empty_cache");
}

strata_status strata_mem_get_address_range(const void* ptr, void** base, size_t* size) {
  if (ptr == nullptr) return fail(STRATA_ERROR_NULL_POINTER, "strata_mem_get_address_range: ptr is NULL");
  if (base == nullptr) {
    return fail(STRATA_ERROR_NULL_POINTER, "strata_mem_get_address_range: base (the output) is NULL");
  }
  if (size == nullptr) {
    return fail(STRATA_ERROR_NULL_POINTER, "strata_mem_get_address_range: size (the output) is NULL");
  }
  Allocator& a = allocator();
  std::lock_guard lock(a.mutex);
  auto it = a.containing(addr(ptr));
  if (it == a.blocks.end()) {
    return fail(
        STRATA_ERROR_INVALID_VALUE,
        "strata_mem_get_address_range: ptr {} is not inside an allocation from strata_malloc or strata_malloc_host",
        ptr);
  }
  if (!it->second.in_use) {
    return fail(STRATA_ERROR_INVALID_VALUE, "strata_mem_get_address_range: ptr {} is inside a block that was freed",
                ptr);
  }
  *base = as_ptr(it->first);
  *size = it->second.size;
  return STRATA_SUCCESS;
}

strata_status strata_malloc_host(size_t size, void** ptr) {
  if (ptr == nullptr) return fail(STRATA_ERROR_NULL_POINTER, "strata_malloc_host: ptr (the output) is NULL");
  *ptr = nullptr;
  const strata_device cpu{STRATA_DEVICE_CPU, 0};
  const size_t limit = max_request(cpu);
  if (size > limit) {
    return fail(STRATA_ERROR_OUT_OF_MEMORY,
                "strata_malloc_host: out of memory: {} bytes requested, more than the {} bytes the host has", size,
                limit);
  }
  const size_t rounded = round_up(size == 0 ? 1 : size, kAlignment);
  void* p = nullptr;
  Origin origin = Origin::pinned_plain;
  if (cuda::device_count() > 0) {
    // Page-locked, so that copies to and from the GPU can run asynchronously.
    STRATA_RETURN_IF_ERROR(cuda::malloc_host(rounded, &p, "strata_malloc_host"));
    origin = Origin::pinned_cuda;
  } else {
    p = std::aligned_alloc(kAlignment, rounded);
    if (p == nullptr) {
      return fail(STRATA_ERROR_OUT_OF_MEMORY, "strata_malloc_host: out of memory: aligned_alloc of {} bytes failed",
                  rounded);
    }
  }
  Allocator& a = allocator();
  std::lock_guard lock(a.mutex);
  a.blocks[addr(p)] = Block{rounded, cpu, origin, true, kAnyStream};
  *ptr = p;
  return STRATA_SUCCESS;
}

strata_status strata_free_host(void* ptr) {
  if (ptr == nullptr) return STRATA_SUCCESS;
  Allocator& a = allocator();
  Block block;
  {
    std::lock_guard lock(a.mutex);
    auto it = a.blocks.find(addr(ptr));
    if (it == a.blocks.end() || it->second.origin == Origin::device) {
      return refuse_free(a, addr(ptr), "strata_free_host", "strata_malloc_host");
    }
    block = it->second;
    a.blocks.erase(it);
  }
  return system_free(block, ptr, "strata_free_host");
}

}  // extern "C"
