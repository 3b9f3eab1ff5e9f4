// Runtime (L1): devices, streams, events, the caching allocator, copies, versions, determinism, threads,
// and the last-error text of failing calls. CUDA tests skip when no GPU answers; they run on the GPU
// machine.
#include <gtest/gtest.h>
#include <omp.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <mutex>
#include <numeric>
#include <set>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "runtime/runtime_internal.h"
#include "strata/runtime.h"

#if STRATA_WITH_CUDA
#include <cuda_runtime_api.h>
#endif

namespace {

constexpr strata_device kCpu{STRATA_DEVICE_CPU, 0};
constexpr strata_device kCuda0{STRATA_DEVICE_CUDA, 0};

std::string last_error() { return strata_get_last_error_message(); }

// Expects `call` to fail with `status` and a last-error text that contains `substr`.
#define EXPECT_FAILS_WITH(call, status, substr)                                          \
  do {                                                                                   \
    strata_clear_last_error();                                                           \
    EXPECT_EQ((call), (status)) << #call;                                                \
    EXPECT_NE(last_error().find(substr), std::string::npos)                              \
        << #call << ": message \"" << last_error() << "\" lacks \"" << (substr) << "\""; \
  } while (0)

#define ASSERT_OK(call) ASSERT_EQ((call), STRATA_SUCCESS) << #call << ": " << last_error()
#define EXPECT_OK(call) EXPECT_EQ((call), STRATA_SUCCESS) << #call << ": " << last_error()

int cuda_count() {
  int32_t n = 0;
  return strata_device_count(STRATA_DEVICE_CUDA, &n) == STRATA_SUCCESS ? n : 0;
}

#define SKIP_WITHOUT_GPU() \
  if (cuda_count() == 0) GTEST_SKIP() << "no CUDA device answers"

// Owns a stream or event for the length of a test, so a failed assertion does not leak it.
struct Stream {
  strata_stream s = nullptr;
  Stream(strata_device d, uint32_t flags = 0, int32_t priority = 0) {
    EXPECT_EQ(strata_stream_create(d, flags, priority, &s), STRATA_SUCCESS) << last_error();
  }
  ~Stream() {
    if (s) strata_stream_destroy(s);
  }
  operator strata_stream() const { return s; }
};

struct Event {
  strata_event e = nullptr;
  explicit Event(strata_device d) { EXPECT_EQ(strata_event_create(d, &e), STRATA_SUCCESS) << last_error(); }
  ~Event() {
    if (e) strata_event_destroy(e);
  }
  operator strata_event() const { return e; }
};

void sleep_ms_task(void* ms) { std::this_thread::sleep_for(std::chrono::milliseconds(*static_cast<int*>(ms))); }

strata_memory_stats stats_of(strata_device d) {
  strata_memory_stats s{};
  EXPECT_EQ(strata_memory_get_stats(d, &s), STRATA_SUCCESS) << last_error();
  return s;
}

// ---------------------------------------------------------------- versions, devices

TEST(Runtime, VersionStringAndNumber) {
  EXPECT_STREQ(strata_get_version_string(), "0.1.0");
  EXPECT_EQ(strata_get_version(), 100);
  EXPECT_EQ(strata_get_version(), STRATA_VERSION_MAJOR * 10000 + STRATA_VERSION_MINOR * 100 + STRATA_VERSION_PATCH);
}

TEST(Runtime, BuiltWithCudaMatchesTheBuild) {
#if STRATA_WITH_CUDA
  EXPECT_EQ(strata_built_with_cuda(), 1);
#else
  EXPECT_EQ(strata_built_with_cuda(), 0);
#endif
}

TEST(Runtime, CpuDeviceProperties) {
  int32_t n = -1;
  ASSERT_OK(strata_device_count(STRATA_DEVICE_CPU, &n));
  EXPECT_EQ(n, 1);

  strata_device_properties p{};
  ASSERT_OK(strata_device_get_properties(kCpu, &p));
  // Name as /proc/cpuinfo gives it.
  std::ifstream cpuinfo("/proc/cpuinfo");
  for (std::string line; std::getline(cpuinfo, line);) {
    if (line.rfind("model name", 0) == 0) {
      EXPECT_NE(line.find(p.name), std::string::npos) << "name \"" << p.name << "\" vs line \"" << line << "\"";
      break;
    }
  }
  EXPECT_GT(std::strlen(p.name), 0u);
  EXPECT_EQ(p.multiprocessor_count, static_cast<int32_t>(std::max(1u, std::thread::hardware_concurrency())));
  EXPECT_EQ(p.sm_major, 0);
  EXPECT_EQ(p.sm_minor, 0);
  const std::string isa = p.isa;
  const std::string base = isa.substr(0, isa.find(','));
  EXPECT_TRUE(base == "avx512" || base == "avx2" || base == "sse4" || base == "generic") << isa;
  EXPECT_EQ(p.total_memory, uint64_t(sysconf(_SC_PHYS_PAGES)) * uint64_t(sysconf(_SC_PAGESIZE)));
  EXPECT_GT(p.l2_cache_bytes, 0u);

  // The UUID is stable, and not all zeros when the machine has an id.
  strata_device_properties q{};
  ASSERT_OK(strata_device_get_properties(kCpu, &q));
  EXPECT_EQ(std::memcmp(p.uuid, q.uuid, 16), 0);
  std::ifstream machine_id("/etc/machine-id");
  std::string id;
  if (std::getline(machine_id, id) && !id.empty()) {
    EXPECT_TRUE(std::any_of(std::begin(p.uuid), std::end(p.uuid), [](uint8_t b) { return b != 0; }));
  }
}

TEST(Runtime, CudaDeviceCountAnswersWithoutError) {
  int32_t n = -1;
  strata_clear_last_error();
  ASSERT_OK(strata_device_count(STRATA_DEVICE_CUDA, &n));
  EXPECT_GE(n, 0);
  if (!strata_built_with_cuda()) {
    EXPECT_EQ(n, 0);
  }
  if (n == 0) {
    // A valid request this machine cannot serve.
    strata_device_properties p{};
    EXPECT_FAILS_WITH(strata_device_get_properties(kCuda0, &p), STRATA_ERROR_DEVICE_UNAVAILABLE, "cuda:0");
    void* ptr = nullptr;
    EXPECT_FAILS_WITH(strata_malloc(kCuda0, 16, nullptr, &ptr), STRATA_ERROR_DEVICE_UNAVAILABLE, "strata_malloc");
    EXPECT_EQ(ptr, nullptr);
  }
}

TEST(Runtime, InternalDeviceHelpers) {
  EXPECT_EQ(strata::rt::device_str(kCpu), "cpu");
  EXPECT_EQ(strata::rt::device_str({STRATA_DEVICE_CUDA, 3}), "cuda:3");
  EXPECT_EQ(strata::rt::check_device(kCpu, "test"), STRATA_SUCCESS);
  EXPECT_FAILS_WITH(strata::rt::check_device({STRATA_DEVICE_CPU, 1}, "l2norm_fwd: x"), STRATA_ERROR_INVALID_DEVICE,
                    "l2norm_fwd: x");
  EXPECT_FAILS_WITH(strata::rt::check_device({5, 0}, "op"), STRATA_ERROR_INVALID_DEVICE, "device type 5");
  const int n = cuda_count();
  if (!strata_built_with_cuda()) {
    EXPECT_FAILS_WITH(strata::rt::check_device(kCuda0, "op"), STRATA_ERROR_DEVICE_UNAVAILABLE, "built without CUDA");
    EXPECT_EQ(strata::rt::cuda_set_device(0), STRATA_SUCCESS);  // a no-op without CUDA
  } else if (n > 0) {
    EXPECT_EQ(strata::rt::check_device(kCuda0, "op"), STRATA_SUCCESS);
    EXPECT_FAILS_WITH(strata::rt::check_device({STRATA_DEVICE_CUDA, n}, "strata_malloc"), STRATA_ERROR_INVALID_DEVICE,
                      "does not exist (" + std::to_string(n) + " CUDA device");
    EXPECT_GT(strata::rt::cuda_sm_version(0), 0);
    EXPECT_EQ(strata::rt::cuda_set_device(0), STRATA_SUCCESS);
  }
  if (n == 0) {
    EXPECT_EQ(strata::rt::cuda_sm_version(0), 0);
  }
}

// ---------------------------------------------------------------- streams

TEST(Runtime, CpuStreamKeepsOrder) {
  Stream s(kCpu);
  std::vector<int> seen;  // touched only by the worker until synchronize returns
  for (int i = 0; i < 1000; ++i) {
    ASSERT_OK(strata::rt::submit_host(s, [&seen, i] { seen.push_back(i); }));
  }
  ASSERT_OK(strata_stream_synchronize(s));
  std::vector<int> expected(1000);
  std::iota(expected.begin(), expected.end(), 0);
  EXPECT_EQ(seen, expected);
  int32_t idle = 0;
  ASSERT_OK(strata_stream_query(s, &idle));
  EXPECT_EQ(idle, 1);
}

TEST(Runtime, CpuStreamRunsTasksOnItsWorker) {
  Stream s(kCpu);
  std::thread::id ran_on;
  ASSERT_OK(strata_stream_enqueue_host(
      s, [](void* p) { *static_cast<std::thread::id*>(p) = std::this_thread::get_id(); }, &ran_on));
  ASSERT_OK(strata_stream_synchronize(s));
  EXPECT_NE(ran_on, std::thread::id{});
  EXPECT_NE(ran_on, std::this_thread::get_id());
}

TEST(Runtime, NullStreamRunsInline) {
  std::thread::id ran_on;
  ASSERT_OK(strata_stream_enqueue_host(
      nullptr, [](void* p) { *static_cast<std::thread::id*>(p) = std::this_thread::get_id(); }, &ran_on));
  EXPECT_EQ(ran_on, std::this_thread::get_id());  // already done when the call returns
  int value = 0;
  ASSERT_OK(strata::rt::submit_host(nullptr, [&] { value = 7; }));
  EXPECT_EQ(value, 7);
  int32_t idle = 0;
  ASSERT_OK(strata_stream_query(nullptr, &idle));
  EXPECT_EQ(idle, 1);
  ASSERT_OK(strata_stream_synchronize(nullptr));
  strata_device d{-1, -1};
  ASSERT_OK(strata_stream_get_device(nullptr, &d));
  EXPECT_TRUE(strata::rt::same_device(d, kCpu));
  EXPECT_TRUE(strata::rt::same_device(strata::rt::stream_device(nullptr), kCpu));
  EXPECT_EQ(strata::rt::cuda_stream_handle(nullptr), nullptr);
}

TEST(Runtime, StreamGetters) {
  Stream s(kCpu, STRATA_STREAM_NON_BLOCKING, -2);
  int32_t priority = 0;
  uint32_t flags = 0;
  strata_device d{-1, -1};
  ASSERT_OK(strata_stream_get_priority(s, &priority));
  ASSERT_OK(strata_stream_get_flags(s, &flags));
  ASSERT_OK(strata_stream_get_device(s, &d));
  EXPECT_EQ(priority, -2);
  EXPECT_EQ(flags, uint32_t{STRATA_STREAM_NON_BLOCKING});
  EXPECT_TRUE(strata::rt::same_device(d, kCpu));
  EXPECT_TRUE(strata::rt::same_device(strata::rt::stream_device(s), kCpu));
  EXPECT_EQ(strata::rt::cuda_stream_handle(s), nullptr);
}

TEST(Runtime, StreamQuerySeesPendingWork) {
  Stream s(kCpu);
  std::atomic<bool> release{false};
  ASSERT_OK(strata::rt::submit_host(s, [&] {
    while (!release) std::this_thread::yield();
  }));
  int32_t idle = 1;
  ASSERT_OK(strata_stream_query(s, &idle));
  EXPECT_EQ(idle, 0);
  release = true;
  ASSERT_OK(strata_stream_synchronize(s));
  ASSERT_OK(strata_stream_query(s, &idle));
  EXPECT_EQ(idle, 1);
}

TEST(Runtime, FailingTaskIsReportedNotFatal) {
  Stream s(kCpu);
  int after = 0;
  ASSERT_OK(strata::rt::submit_host(s, [] { throw std::runtime_error("kernel exploded"); }));
  ASSERT_OK(strata::rt::submit_host(s, [] { throw 42; }));
  ASSERT_OK(strata::rt::submit_host(s, [&] { after = 1; }));
  // The first failure is reported once; the worker keeps running later tasks.
  EXPECT_FAILS_WITH(strata_stream_synchronize(s), STRATA_ERROR_RUNTIME, "kernel exploded");
  EXPECT_EQ(after, 1);
  EXPECT_OK(strata_stream_synchronize(s));
  // Inline on the null stream the failure comes back from the call itself.
  EXPECT_FAILS_WITH(strata::rt::submit_host(nullptr, [] { throw std::runtime_error("inline boom"); }),
                    STRATA_ERROR_RUNTIME, "inline boom");
}

TEST(Runtime, SynchronizingFromOwnTaskIsRefused) {
  Stream s(kCpu);
  std::atomic<int> status{-1};
  strata_stream self = s;
  ASSERT_OK(strata::rt::submit_host(s, [&] { status = strata_stream_synchronize(self); }));
  ASSERT_OK(strata_stream_synchronize(s));
  EXPECT_EQ(status.load(), STRATA_ERROR_INVALID_VALUE);
}

TEST(Runtime, DestroyRunsQueuedTasks) {
  strata_stream s = nullptr;
  ASSERT_OK(strata_stream_create(kCpu, 0, 0, &s));
  std::atomic<int> ran{0};
  int ms = 10;
  ASSERT_OK(strata_stream_enqueue_host(s, sleep_ms_task, &ms));
  for (int i = 0; i < 10; ++i) ASSERT_OK(strata::rt::submit_host(s, [&] { ++ran; }));
  ASSERT_OK(strata_stream_destroy(s));
  EXPECT_EQ(ran.load(), 10);
  // The handle is gone: refused, never dereferenced.
  int32_t idle = 0;
  EXPECT_FAILS_WITH(strata_stream_query(s, &idle), STRATA_ERROR_INVALID_HANDLE, "not a live strata_stream");
  EXPECT_FAILS_WITH(strata::rt::submit_host(s, [] {}), STRATA_ERROR_INVALID_HANDLE, "not a live strata_stream");
  EXPECT_EQ(strata::rt::stream_device(s).type, -1);
}

TEST(Runtime, DeviceSynchronizeWaitsForAllCpuStreams) {
  Stream a(kCpu), b(kCpu);
  std::atomic<int> done{0};
  for (strata_stream s : {a.s, b.s}) {
    ASSERT_OK(strata::rt::submit_host(s, [&] {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
      ++done;
    }));
  }
  ASSERT_OK(strata_device_synchronize(kCpu));
  EXPECT_EQ(done.load(), 2);
  ASSERT_OK(strata::rt::submit_host(b, [] { throw std::runtime_error("late failure"); }));
  EXPECT_FAILS_WITH(strata_device_synchronize(kCpu), STRATA_ERROR_RUNTIME, "late failure");
}

// ---------------------------------------------------------------- events

TEST(Runtime, CpuEventsMeasureElapsedTime) {
  Stream s(kCpu);
  Event start(kCpu), end(kCpu);
  int ms = 20;
  ASSERT_OK(strata_event_record(start, s));
  ASSERT_OK(strata_stream_enqueue_host(s, sleep_ms_task, &ms));
  ASSERT_OK(strata_event_record(end, s));
  ASSERT_OK(strata_event_synchronize(end));
  float elapsed = 0;
  ASSERT_OK(strata_event_elapsed_time(&elapsed, start, end));
  EXPECT_GE(elapsed, 15.0f);
  EXPECT_LT(elapsed, 2000.0f);
}

TEST(Runtime, EventQuery) {
  Stream s(kCpu);
  Event e(kCpu);
  int32_t done = 0;
  ASSERT_OK(strata_event_query(e, &done));
  EXPECT_EQ(done, 1);  // never recorded
  std::atomic<bool> release{false};
  ASSERT_OK(strata::rt::submit_host(s, [&] {
    while (!release) std::this_thread::yield();
  }));
  ASSERT_OK(strata_event_record(e, s));
  ASSERT_OK(strata_event_query(e, &done));
  EXPECT_EQ(done, 0);
  release = true;
  ASSERT_OK(strata_event_synchronize(e));
  ASSERT_OK(strata_event_query(e, &done));
  EXPECT_EQ(done, 1);
  // On the null stream the record completes inline.
  ASSERT_OK(strata_event_record(e, nullptr));
  ASSERT_OK(strata_event_query(e, &done));
  EXPECT_EQ(done, 1);
}

TEST(Runtime, ElapsedTimeNeedsCompletedRecords) {
  Event a(kCpu), b(kCpu);
  float ms = 0;
  EXPECT_FAILS_WITH(strata_event_elapsed_time(&ms, a, b), STRATA_ERROR_INVALID_VALUE, "start event was never recorded");
  ASSERT_OK(strata_event_record(a, nullptr));
  EXPECT_FAILS_WITH(strata_event_elapsed_time(&ms, a, b), STRATA_ERROR_INVALID_VALUE, "end event was never recorded");
  Stream s(kCpu);
  std::atomic<bool> release{false};
  ASSERT_OK(strata::rt::submit_host(s, [&] {
    while (!release) std::this_thread::yield();
  }));
  ASSERT_OK(strata_event_record(b, s));
  EXPECT_FAILS_WITH(strata_event_elapsed_time(&ms, a, b), STRATA_ERROR_INVALID_VALUE, "end event has not completed");
  release = true;
  ASSERT_OK(strata_event_synchronize(b));
  ASSERT_OK(strata_event_elapsed_time(&ms, a, b));
  EXPECT_GE(ms, 0.0f);
  ASSERT_OK(strata_event_elapsed_time(&ms, a, a));
  EXPECT_EQ(ms, 0.0f);
  EXPECT_FAILS_WITH(strata_event_elapsed_time(nullptr, a, b), STRATA_ERROR_NULL_POINTER, "ms");
}

// The producer stream sets `value` to `to` after a 30 ms sleep, then records `ready`; the consumer waits on
// `ready` and reads `value`. Unless the wait orders the two streams, the read sees the old value.
void expect_wait_orders(strata_stream producer, strata_stream consumer, strata_event ready, int to) {
  std::atomic<int> value{0};
  int seen = -1;
  ASSERT_OK(strata::rt::submit_host(producer, [&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(30));
    value = to;
  }));
  ASSERT_OK(strata_event_record(ready, producer));
  ASSERT_OK(strata_stream_wait_event(consumer, ready));
  ASSERT_OK(strata::rt::submit_host(consumer, [&] { seen = value; }));
  ASSERT_OK(strata_stream_synchronize(consumer));
  EXPECT_EQ(seen, to);
}

TEST(Runtime, StreamWaitEventOrdersTwoCpuStreams) {
  Stream producer(kCpu), consumer(kCpu);
  Event ready(kCpu);
  expect_wait_orders(producer, consumer, ready, 1);
  // Waiting on a completed (or never-recorded) event does not block.
  Event never(kCpu);
  ASSERT_OK(strata_stream_wait_event(consumer, never));
  ASSERT_OK(strata_stream_wait_event(nullptr, ready));
  ASSERT_OK(strata_stream_synchronize(consumer));
}

TEST(Runtime, DestroyedEventIsRejected) {
  strata_event e = nullptr;
  ASSERT_OK(strata_event_create(kCpu, &e));
  ASSERT_OK(strata_event_destroy(e));
  int32_t done = 0;
  EXPECT_FAILS_WITH(strata_event_query(e, &done), STRATA_ERROR_INVALID_HANDLE, "not a live strata_event");
  EXPECT_FAILS_WITH(strata_event_destroy(e), STRATA_ERROR_INVALID_HANDLE, "strata_event_destroy");
  EXPECT_FAILS_WITH(strata_event_record(nullptr, nullptr), STRATA_ERROR_NULL_POINTER, "event is NULL");
}

TEST(Runtime, EventDestroyedWhileItsRecordIsQueued) {
  Stream s(kCpu);
  strata_event e = nullptr;
  ASSERT_OK(strata_event_create(kCpu, &e));
  int ms = 10;
  ASSERT_OK(strata_stream_enqueue_host(s, sleep_ms_task, &ms));
  ASSERT_OK(strata_event_record(e, s));
  ASSERT_OK(strata_event_destroy(e));  // the queued record keeps its state alive
  ASSERT_OK(strata_stream_synchronize(s));
}

// ---------------------------------------------------------------- memory

TEST(Runtime, AllocatorReusesFreedBlocks) {
  ASSERT_OK(strata_memory_empty_cache(kCpu));
  const strata_memory_stats before = stats_of(kCpu);
  void* p = nullptr;
  ASSERT_OK(strata_malloc(kCpu, 1000, nullptr, &p));
  ASSERT_NE(p, nullptr);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(p) % 256, 0u);
  strata_memory_stats s = stats_of(kCpu);
  EXPECT_EQ(s.allocated - before.allocated, 1024u);  // rounded to 512 B
  EXPECT_EQ(s.num_allocs - before.num_allocs, 1u);
  EXPECT_EQ(s.num_system_allocs - before.num_system_allocs, 1u);
  std::memset(p, 0xab, 1000);  // the memory is usable
  ASSERT_OK(strata_free(p));
  s = stats_of(kCpu);
  EXPECT_EQ(s.allocated, before.allocated);
  EXPECT_EQ(s.reserved - before.reserved, 1024u);  // cached

  void* q = nullptr;
  ASSERT_OK(strata_malloc(kCpu, 1000, nullptr, &q));
  EXPECT_EQ(q, p);
  s = stats_of(kCpu);
  EXPECT_EQ(s.num_allocs - before.num_allocs, 2u);
  EXPECT_EQ(s.num_system_allocs - before.num_system_allocs, 1u);  // a cache hit
  ASSERT_OK(strata_free(q));
}

TEST(Runtime, AllocatorSizeClasses) {
  struct Case {
    size_t request, block;
  };
  const size_t MiB = size_t{1} << 20;
  for (const Case c : {Case{1, 512}, Case{512, 512}, Case{513, 1024}, Case{MiB - 1, MiB}, Case{MiB, 2 * MiB},
                       Case{2 * MiB + 1, 4 * MiB}}) {
    ASSERT_OK(strata_memory_empty_cache(kCpu));
    void* p = nullptr;
    ASSERT_OK(strata_malloc(kCpu, c.request, nullptr, &p));
    void* base = nullptr;
    size_t size = 0;
    ASSERT_OK(strata_mem_get_address_range(p, &base, &size));
    EXPECT_EQ(base, p);
    EXPECT_EQ(size, c.block) << "request " << c.request;
    ASSERT_OK(strata_free(p));
  }
}

TEST(Runtime, AllocatorBestFitSkipsFarLargerBlocks) {
  ASSERT_OK(strata_memory_empty_cache(kCpu));
  void *small = nullptr, *big = nullptr;
  ASSERT_OK(strata_malloc(kCpu, 4096, nullptr, &small));
  ASSERT_OK(strata_malloc(kCpu, 8 << 20, nullptr, &big));
  ASSERT_OK(strata_free(small));
  ASSERT_OK(strata_free(big));
  const strata_memory_stats base = stats_of(kCpu);
  void* p = nullptr;
  ASSERT_OK(strata_malloc(kCpu, 3000, nullptr, &p));
  EXPECT_EQ(p, small);                                          // the 4 KiB block fits best
  EXPECT_EQ(stats_of(kCpu).allocated - base.allocated, 4096u);  // the whole block counts
  void* r = nullptr;
  ASSERT_OK(strata_malloc(kCpu, 1 << 20, nullptr, &r));
  EXPECT_NE(r, big);  // 2 MiB requested: an 8 MiB block would waste too much
  ASSERT_OK(strata_free(p));
  ASSERT_OK(strata_free(r));
  EXPECT_EQ(stats_of(kCpu).allocated, base.allocated);
}

TEST(Runtime, AllocatorPeakAndReset) {
  ASSERT_OK(strata_memory_empty_cache(kCpu));
  ASSERT_OK(strata_memory_reset_peak(kCpu));
  const strata_memory_stats base = stats_of(kCpu);
  const size_t MiB = size_t{1} << 20;
  void *a = nullptr, *b = nullptr;
  ASSERT_OK(strata_malloc(kCpu, 2 * MiB, nullptr, &a));
  ASSERT_OK(strata_malloc(kCpu, 4 * MiB, nullptr, &b));
  ASSERT_OK(strata_free(b));
  strata_memory_stats s = stats_of(kCpu);
  EXPECT_EQ(s.allocated - base.allocated, 2 * MiB);
  EXPECT_EQ(s.peak_allocated - base.allocated, 6 * MiB);
  EXPECT_EQ(s.reserved - base.reserved, 6 * MiB);
  ASSERT_OK(strata_memory_reset_peak(kCpu));
  s = stats_of(kCpu);
  EXPECT_EQ(s.peak_allocated, s.allocated);
  ASSERT_OK(strata_free(a));
  s = stats_of(kCpu);
  EXPECT_EQ(s.peak_allocated - base.allocated, 2 * MiB);  // the high-water mark stays until the next reset
}

TEST(Runtime, EmptyCacheReturnsCachedBlocks) {
  ASSERT_OK(strata_memory_empty_cache(kCpu));
  const strata_memory_stats base = stats_of(kCpu);
  EXPECT_EQ(base.reserved, base.allocated);  // nothing cached
  void *a = nullptr, *b = nullptr;
  ASSERT_OK(strata_malloc(kCpu, 3 << 20, nullptr, &a));
  ASSERT_OK(strata_malloc(kCpu, 10000, nullptr, &b));
  ASSERT_OK(strata_free(a));
  strata_memory_stats s = stats_of(kCpu);
  EXPECT_EQ(s.reserved - base.reserved, (4u << 20) + 10240u);
  ASSERT_OK(strata_memory_empty_cache(kCpu));
  s = stats_of(kCpu);
  EXPECT_EQ(s.reserved - base.reserved, 10240u);  // b is still in use
  // The freed block is gone from the map too.
  void* range_base = nullptr;
  size_t range_size = 0;
  EXPECT_EQ(strata_mem_get_address_range(b, &range_base, &range_size), STRATA_SUCCESS);
  ASSERT_OK(strata_free(b));
}

TEST(Runtime, AllocatorReuseFollowsStreams) {
  ASSERT_OK(strata_memory_empty_cache(kCpu));
  Stream s1(kCpu), s2(kCpu);
  void* p = nullptr;
  ASSERT_OK(strata_malloc(kCpu, 5000, s1, &p));
  ASSERT_OK(strata_free(p));
  // Work queued on s1 may still use the block: s2 must not get it.
  void* q = nullptr;
  ASSERT_OK(strata_malloc(kCpu, 5000, s2, &q));
  EXPECT_NE(q, p);
  ASSERT_OK(strata_free(q));
  void* r = nullptr;
  ASSERT_OK(strata_malloc(kCpu, 5000, s1, &r));
  EXPECT_EQ(r, p);
  ASSERT_OK(strata_free(r));
  // After a device synchronize any stream may take it.
  ASSERT_OK(strata_device_synchronize(kCpu));
  void* t = nullptr;
  ASSERT_OK(strata_malloc(kCpu, 5000, nullptr, &t));
  EXPECT_TRUE(t == p || t == q);
  ASSERT_OK(strata_free(t));
}

TEST(Runtime, AllocatorIsThreadSafe) {
  const strata_memory_stats base = stats_of(kCpu);
  std::vector<std::thread> threads;
  std::atomic<int> failures{0};
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      std::vector<void*> held;
      for (int i = 0; i < 2000; ++i) {
        void* p = nullptr;
        const size_t size = static_cast<size_t>((i * 7919 + t * 104729) % 300000);
        if (strata_malloc(kCpu, size, nullptr, &p) != STRATA_SUCCESS) ++failures;
        std::memset(p, t, size);  // no other thread holds this block
        held.push_back(p);
        if (held.size() > 8) {
          if (strata_free(held.front()) != STRATA_SUCCESS) ++failures;
          held.erase(held.begin());
        }
      }
      for (void* p : held) {
        if (strata_free(p) != STRATA_SUCCESS) ++failures;
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(failures.load(), 0);
  const strata_memory_stats s = stats_of(kCpu);
  EXPECT_EQ(s.allocated, base.allocated);
  EXPECT_EQ(s.num_allocs - base.num_allocs, 8000u);
}

TEST(Runtime, MallocSizeZeroGivesUniquePointers) {
  void *a = nullptr, *b = nullptr;
  ASSERT_OK(strata_malloc(kCpu, 0, nullptr, &a));
  ASSERT_OK(strata_malloc(kCpu, 0, nullptr, &b));
  EXPECT_NE(a, nullptr);
  EXPECT_NE(b, nullptr);
  EXPECT_NE(a, b);
  ASSERT_OK(strata_free(a));
  ASSERT_OK(strata_free(b));
  EXPECT_OK(strata_free(nullptr));  // like free(NULL)
}

TEST(Runtime, MallocOutOfMemoryNamesTheSize) {
  void* p = reinterpret_cast<void*>(1);
  const size_t huge = size_t{1} << 60;
  EXPECT_FAILS_WITH(strata_malloc(kCpu, huge, nullptr, &p), STRATA_ERROR_OUT_OF_MEMORY, std::to_string(huge));
  EXPECT_EQ(p, nullptr);
  EXPECT_FAILS_WITH(strata_malloc_host(huge, &p), STRATA_ERROR_OUT_OF_MEMORY, std::to_string(huge));
}

TEST(Runtime, AddressRangeOfInteriorAndForeignPointers) {
  ASSERT_OK(strata_memory_empty_cache(kCpu));  // so that the request gets a block of its own class
  void* p = nullptr;
  ASSERT_OK(strata_malloc(kCpu, 3000, nullptr, &p));
  void* base = nullptr;
  size_t size = 0;
  char* c = static_cast<char*>(p);
  for (size_t off : {size_t{0}, size_t{1}, size_t{2999}, size_t{3071}}) {
    ASSERT_OK(strata_mem_get_address_range(c + off, &base, &size));
    EXPECT_EQ(base, p);
    EXPECT_EQ(size, 3072u);
  }
  int on_stack = 0;
  EXPECT_FAILS_WITH(strata_mem_get_address_range(&on_stack, &base, &size), STRATA_ERROR_INVALID_VALUE,
                    "not inside an allocation");
  std::vector<char> heap(100);
  EXPECT_FAILS_WITH(strata_mem_get_address_range(heap.data(), &base, &size), STRATA_ERROR_INVALID_VALUE,
                    "not inside an allocation");
  EXPECT_FAILS_WITH(strata_mem_get_address_range(p, nullptr, &size), STRATA_ERROR_NULL_POINTER, "base");
  ASSERT_OK(strata_free(p));
  EXPECT_FAILS_WITH(strata_mem_get_address_range(c + 10, &base, &size), STRATA_ERROR_INVALID_VALUE, "freed");
}

TEST(Runtime, FreeRefusesWhatItDidNotAllocate) {
  int on_stack = 0;
  EXPECT_FAILS_WITH(strata_free(&on_stack), STRATA_ERROR_INVALID_VALUE, "was not allocated by strata_malloc");
  void* p = nullptr;
  ASSERT_OK(strata_malloc(kCpu, 4096, nullptr, &p));
  EXPECT_FAILS_WITH(strata_free(static_cast<char*>(p) + 64), STRATA_ERROR_INVALID_VALUE, "64 bytes inside the block");
  ASSERT_OK(strata_free(p));
  EXPECT_FAILS_WITH(strata_free(p), STRATA_ERROR_INVALID_VALUE, "already freed");
  void* h = nullptr;
  ASSERT_OK(strata_malloc_host(100, &h));
  EXPECT_FAILS_WITH(strata_free(h), STRATA_ERROR_INVALID_VALUE, "strata_free_host");
  ASSERT_OK(strata_malloc(kCpu, 4096, nullptr, &p));
  EXPECT_FAILS_WITH(strata_free_host(p), STRATA_ERROR_INVALID_VALUE, "free it with strata_free");
  ASSERT_OK(strata_free(p));
  ASSERT_OK(strata_free_host(h));
  EXPECT_OK(strata_free_host(nullptr));
}

TEST(Runtime, PinnedHostMemory) {
  void* h = nullptr;
  ASSERT_OK(strata_malloc_host(1000, &h));
  ASSERT_NE(h, nullptr);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(h) % 256, 0u);
  std::memset(h, 1, 1000);
  void* base = nullptr;
  size_t size = 0;
  ASSERT_OK(strata_mem_get_address_range(static_cast<char*>(h) + 999, &base, &size));
  EXPECT_EQ(base, h);
  EXPECT_EQ(size, 1024u);
  void* h0 = nullptr;
  ASSERT_OK(strata_malloc_host(0, &h0));
  EXPECT_NE(h0, nullptr);
  EXPECT_NE(h0, h);
  ASSERT_OK(strata_free_host(h0));
  ASSERT_OK(strata_free_host(h));
  EXPECT_FAILS_WITH(strata_mem_get_address_range(h, &base, &size), STRATA_ERROR_INVALID_VALUE, "not inside");
}

TEST(Runtime, MemcpyEveryKindOnCpu) {
  constexpr size_t n = 4096;
  void *d1 = nullptr, *d2 = nullptr, *pinned = nullptr;
  ASSERT_OK(strata_malloc(kCpu, n, nullptr, &d1));
  ASSERT_OK(strata_malloc(kCpu, n, nullptr, &d2));
  ASSERT_OK(strata_malloc_host(n, &pinned));
  std::vector<uint8_t> src(n), dst(n);
  for (size_t i = 0; i < n; ++i) src[i] = static_cast<uint8_t>(i * 7 + 3);
  Stream s(kCpu);
  for (int async = 0; async < 2; ++async) {
    auto cpy = [&](void* to, const void* from, int32_t kind) {
      return async ? strata_memcpy_async(to, from, n, kind, s) : strata_memcpy(to, from, n, kind);
    };
    std::fill(dst.begin(), dst.end(), 0);
    ASSERT_OK(strata_memset(d1, 0, n));
    ASSERT_OK(cpy(d1, src.data(), STRATA_MEMCPY_HOST_TO_DEVICE));
    ASSERT_OK(cpy(d2, d1, STRATA_MEMCPY_DEVICE_TO_DEVICE));
    ASSERT_OK(cpy(pinned, d2, STRATA_MEMCPY_DEVICE_TO_HOST));
    ASSERT_OK(cpy(dst.data(), pinned, STRATA_MEMCPY_HOST_TO_HOST));
    ASSERT_OK(strata_stream_synchronize(s));
    EXPECT_EQ(dst, src) << (async ? "async" : "sync");
    std::fill(dst.begin(), dst.end(), 0);
    ASSERT_OK(cpy(d2, src.data(), STRATA_MEMCPY_DEFAULT));
    ASSERT_OK(cpy(dst.data(), d2, STRATA_MEMCPY_DEFAULT));
    ASSERT_OK(strata_stream_synchronize(s));
    EXPECT_EQ(dst, src) << (async ? "async" : "sync") << " DEFAULT";
  }
  // memset, sync and async, on allocator and plain host memory.
  ASSERT_OK(strata_memset(d1, 0x5a, n));
  ASSERT_OK(strata_memset_async(dst.data(), 0x11, n / 2, s));
  ASSERT_OK(strata_memset_async(d2, 0x22, n, s));
  ASSERT_OK(strata_stream_synchronize(s));
  EXPECT_EQ(static_cast<uint8_t*>(d1)[n - 1], 0x5a);
  EXPECT_EQ(static_cast<uint8_t*>(d2)[0], 0x22);
  EXPECT_EQ(dst[0], 0x11);
  EXPECT_EQ(dst[n / 2 - 1], 0x11);
  EXPECT_EQ(dst[n / 2], src[n / 2]);
  // The null stream copies inline.
  ASSERT_OK(strata_memcpy_async(dst.data(), d1, n, STRATA_MEMCPY_DEVICE_TO_HOST, nullptr));
  EXPECT_EQ(dst[5], 0x5a);
  ASSERT_OK(strata_free(d1));
  ASSERT_OK(strata_free(d2));
  ASSERT_OK(strata_free_host(pinned));
}

TEST(Runtime, MemcpyValidatesItsArguments) {
  void* d = nullptr;
  ASSERT_OK(strata_malloc(kCpu, 1000, nullptr, &d));  // a 1024-byte block
  std::vector<char> host(4096);
  EXPECT_FAILS_WITH(strata_memcpy(d, host.data(), 16, 9), STRATA_ERROR_INVALID_VALUE, "kind 9");
  EXPECT_FAILS_WITH(strata_memcpy(nullptr, host.data(), 16, STRATA_MEMCPY_DEFAULT), STRATA_ERROR_NULL_POINTER, "dst");
  EXPECT_FAILS_WITH(strata_memcpy(d, nullptr, 16, STRATA_MEMCPY_DEFAULT), STRATA_ERROR_NULL_POINTER, "src");
  EXPECT_OK(strata_memcpy(nullptr, nullptr, 0, STRATA_MEMCPY_DEFAULT));  // nothing to copy
  EXPECT_FAILS_WITH(strata_memcpy(d, host.data(), 2000, STRATA_MEMCPY_HOST_TO_DEVICE), STRATA_ERROR_INVALID_VALUE,
                    "run past the end");
  EXPECT_FAILS_WITH(strata_memset(static_cast<char*>(d) + 1000, 0, 100), STRATA_ERROR_INVALID_VALUE, "offset 1000");
  EXPECT_FAILS_WITH(strata_memset(nullptr, 0, 1), STRATA_ERROR_NULL_POINTER, "dst");
  strata_stream dead = nullptr;
  ASSERT_OK(strata_stream_create(kCpu, 0, 0, &dead));
  ASSERT_OK(strata_stream_destroy(dead));
  EXPECT_FAILS_WITH(strata_memcpy_async(d, host.data(), 16, STRATA_MEMCPY_DEFAULT, dead), STRATA_ERROR_INVALID_HANDLE,
                    "strata_memcpy_async: stream");
  ASSERT_OK(strata_free(d));
  EXPECT_FAILS_WITH(strata_memcpy(host.data(), d, 16, STRATA_MEMCPY_DEVICE_TO_HOST), STRATA_ERROR_INVALID_VALUE,
                    "freed");
}

// ---------------------------------------------------------------- settings, errors

TEST(Runtime, Determinism) {
  const int32_t initial = strata_get_determinism();
  EXPECT_GE(initial, 0);
  EXPECT_LE(initial, 2);
  if (std::getenv("STRATA_DETERMINISM") == nullptr) {
    EXPECT_EQ(initial, 1);
  }
  for (int32_t level : {0, 2, 1}) {
    ASSERT_OK(strata_set_determinism(level));
    EXPECT_EQ(strata_get_determinism(), level);
    EXPECT_EQ(strata::rt::determinism(), level);
  }
  EXPECT_FAILS_WITH(strata_set_determinism(3), STRATA_ERROR_INVALID_VALUE, "got 3");
  EXPECT_FAILS_WITH(strata_set_determinism(-1), STRATA_ERROR_INVALID_VALUE, "got -1");
  EXPECT_EQ(strata_get_determinism(), 1);  // unchanged by the refused calls
  ASSERT_OK(strata_set_determinism(initial));
}

TEST(Runtime, NumThreads) {
  const int32_t initial = strata_get_num_threads();
  EXPECT_GE(initial, 1);
  ASSERT_OK(strata_set_num_threads(3));
  EXPECT_EQ(strata_get_num_threads(), 3);
  EXPECT_EQ(strata::rt::num_threads(), 3);
  ASSERT_OK(strata_set_num_threads(0));
  EXPECT_EQ(strata_get_num_threads(), omp_get_num_procs());
  EXPECT_FAILS_WITH(strata_set_num_threads(-2), STRATA_ERROR_INVALID_VALUE, "got -2");
  ASSERT_OK(strata_set_num_threads(initial));
}

TEST(Runtime, ErrorMessagesNameTheArgument) {
  strata_stream s = nullptr;
  void* p = nullptr;
  int32_t n = 0;
  // Null outputs.
  EXPECT_FAILS_WITH(strata_malloc(kCpu, 16, nullptr, nullptr), STRATA_ERROR_NULL_POINTER, "strata_malloc: ptr");
  EXPECT_FAILS_WITH(strata_stream_create(kCpu, 0, 0, nullptr), STRATA_ERROR_NULL_POINTER,
                    "strata_stream_create: stream");
  EXPECT_FAILS_WITH(strata_device_count(STRATA_DEVICE_CPU, nullptr), STRATA_ERROR_NULL_POINTER, "count");
  EXPECT_FAILS_WITH(strata_stream_enqueue_host(nullptr, nullptr, nullptr), STRATA_ERROR_NULL_POINTER, "fn is NULL");
  // Devices.
  EXPECT_FAILS_WITH(strata_malloc({STRATA_DEVICE_CPU, 2}, 16, nullptr, &p), STRATA_ERROR_INVALID_DEVICE,
                    "strata_malloc: device cpu:2 does not exist");
  EXPECT_FAILS_WITH(strata_device_count(7, &n), STRATA_ERROR_INVALID_DEVICE, "type 7");
  EXPECT_FAILS_WITH(strata_event_create({9, 0}, nullptr), STRATA_ERROR_NULL_POINTER, "event");
  // Values.
  EXPECT_FAILS_WITH(strata_stream_create(kCpu, 0x8, 0, &s), STRATA_ERROR_INVALID_VALUE, "flags 0x8");
  EXPECT_EQ(s, nullptr);
  // Handles.
  EXPECT_FAILS_WITH(strata_stream_destroy(nullptr), STRATA_ERROR_NULL_POINTER, "stream is NULL");
  auto* garbage = reinterpret_cast<strata_stream>(static_cast<uintptr_t>(0xdeadbeef));
  EXPECT_FAILS_WITH(strata_stream_synchronize(garbage), STRATA_ERROR_INVALID_HANDLE, "not a live strata_stream");
  auto* garbage_event = reinterpret_cast<strata_event>(static_cast<uintptr_t>(0xdeadbeef));
  EXPECT_FAILS_WITH(strata_event_synchronize(garbage_event), STRATA_ERROR_INVALID_HANDLE, "not a live strata_event");
  // A stream of the wrong device.
  Stream cpu_stream(kCpu);
  if (cuda_count() > 0) {
    EXPECT_FAILS_WITH(strata_malloc(kCuda0, 16, cpu_stream, &p), STRATA_ERROR_INVALID_VALUE, "the stream is on cpu");
  }
  // The text is per thread, and clearing empties it.
  std::string other_thread_text = "unset";
  std::thread([&] { other_thread_text = strata_get_last_error_message(); }).join();
  EXPECT_EQ(other_thread_text, "");
  strata_clear_last_error();
  EXPECT_STREQ(strata_get_last_error_message(), "");
  EXPECT_STREQ(strata_status_name(STRATA_ERROR_INVALID_HANDLE), "STRATA_ERROR_INVALID_HANDLE");
}

// ---------------------------------------------------------------- CUDA (skipped without a GPU)

TEST(Runtime, CudaDeviceProperties) {
  SKIP_WITHOUT_GPU();
  strata_device_properties p{};
  ASSERT_OK(strata_device_get_properties(kCuda0, &p));
  EXPECT_GT(std::strlen(p.name), 0u);
  EXPECT_GT(p.multiprocessor_count, 0);
  EXPECT_GE(p.sm_major, 5);
  EXPECT_EQ(std::string(p.isa), "sm_" + std::to_string(p.sm_major) + std::to_string(p.sm_minor));
  EXPECT_EQ(strata::rt::cuda_sm_version(0), p.sm_major * 10 + p.sm_minor);
  EXPECT_GT(p.total_memory, 0u);
  EXPECT_GT(p.l2_cache_bytes, 0u);
  EXPECT_TRUE(std::any_of(std::begin(p.uuid), std::end(p.uuid), [](uint8_t b) { return b != 0; }));
}

TEST(Runtime, CudaStreamKeepsOrder) {
  SKIP_WITHOUT_GPU();
  Stream s(kCuda0, STRATA_STREAM_NON_BLOCKING, 0);
  ASSERT_NE(s.s, nullptr);
  EXPECT_NE(strata::rt::cuda_stream_handle(s), nullptr);
  uint32_t flags = 0;
  ASSERT_OK(strata_stream_get_flags(s, &flags));
  EXPECT_EQ(flags, uint32_t{STRATA_STREAM_NON_BLOCKING});
  std::vector<int> seen;
  for (int i = 0; i < 1000; ++i) ASSERT_OK(strata::rt::submit_host(s, [&seen, i] { seen.push_back(i); }));
  ASSERT_OK(strata_stream_synchronize(s));
  std::vector<int> expected(1000);
  std::iota(expected.begin(), expected.end(), 0);
  EXPECT_EQ(seen, expected);
  int32_t idle = 0;
  ASSERT_OK(strata_stream_query(s, &idle));
  EXPECT_EQ(idle, 1);
  // A failing host task is reported by the next synchronize.
  ASSERT_OK(strata::rt::submit_host(s, [] { throw std::runtime_error("host callback failed"); }));
  EXPECT_FAILS_WITH(strata_stream_synchronize(s), STRATA_ERROR_RUNTIME, "host callback failed");
}

TEST(Runtime, CudaStreamPriorityIsClamped) {
  SKIP_WITHOUT_GPU();
  Stream s(kCuda0, 0, -1000);
  int32_t priority = 0;
  ASSERT_OK(strata_stream_get_priority(s, &priority));
  EXPECT_GT(priority, -1000);  // cudart clamps to the device's greatest priority
  EXPECT_LE(priority, 0);
}

TEST(Runtime, CudaEventsMeasureElapsedTime) {
  SKIP_WITHOUT_GPU();
  Stream s(kCuda0);
  Event start(kCuda0), end(kCuda0);
  float ms = 0;
  EXPECT_FAILS_WITH(strata_event_elapsed_time(&ms, start, end), STRATA_ERROR_INVALID_VALUE, "never recorded");
  int sleep = 20;
  ASSERT_OK(strata_event_record(start, s));
  ASSERT_OK(strata_stream_enqueue_host(s, sleep_ms_task, &sleep));
  ASSERT_OK(strata_event_record(end, s));
  ASSERT_OK(strata_event_synchronize(end));
  int32_t done = 0;
  ASSERT_OK(strata_event_query(end, &done));
  EXPECT_EQ(done, 1);
  ASSERT_OK(strata_event_elapsed_time(&ms, start, end));
  EXPECT_GE(ms, 15.0f);
  // Events and streams of different devices do not mix.
  Stream cpu(kCpu);
  EXPECT_FAILS_WITH(strata_event_record(start, cpu), STRATA_ERROR_INVALID_VALUE, "is on cpu");
}

TEST(Runtime, CudaAndCpuStreamsWaitForEachOther) {
  SKIP_WITHOUT_GPU();
  Stream gpu(kCuda0), cpu(kCpu);
  Event gpu_done(kCuda0), cpu_done(kCpu);
  expect_wait_orders(gpu, cpu, gpu_done, 1);  // GPU -> CPU: a CPU stream waits for a CUDA event
  expect_wait_orders(cpu, gpu, cpu_done, 2);  // CPU -> GPU: a CUDA stream waits for a CPU event
}

TEST(Runtime, CudaAllocator) {
  SKIP_WITHOUT_GPU();
  ASSERT_OK(strata_memory_empty_cache(kCuda0));
  const strata_memory_stats before = stats_of(kCuda0);
  Stream s(kCuda0);
  void* p = nullptr;
  ASSERT_OK(strata_malloc(kCuda0, 3 << 20, s, &p));
  EXPECT_EQ(reinterpret_cast<uintptr_t>(p) % 256, 0u);
  void* base = nullptr;
  size_t size = 0;
  ASSERT_OK(strata_mem_get_address_range(static_cast<char*>(p) + 12345, &base, &size));
  EXPECT_EQ(base, p);
  EXPECT_EQ(size, size_t{4} << 20);
  ASSERT_OK(strata_free(p));
  void* q = nullptr;
  ASSERT_OK(strata_malloc(kCuda0, 3 << 20, s, &q));
  EXPECT_EQ(q, p);
  strata_memory_stats st = stats_of(kCuda0);
  EXPECT_EQ(st.num_system_allocs - before.num_system_allocs, 1u);
  EXPECT_EQ(st.allocated - before.allocated, size_t{4} << 20);
  EXPECT_EQ(st.peak_allocated - before.allocated, size_t{4} << 20);
  ASSERT_OK(strata_free(q));
  ASSERT_OK(strata_memory_empty_cache(kCuda0));
  st = stats_of(kCuda0);
  EXPECT_EQ(st.reserved, before.reserved);
  strata_device_properties props{};
  ASSERT_OK(strata_device_get_properties(kCuda0, &props));
  EXPECT_FAILS_WITH(strata_malloc(kCuda0, props.total_memory * 2, nullptr, &p), STRATA_ERROR_OUT_OF_MEMORY,
                    std::to_string(props.total_memory * 2));
}

TEST(Runtime, CudaMemcpyRoundTrip) {
  SKIP_WITHOUT_GPU();
  constexpr size_t n = 1 << 20;
  std::vector<uint8_t> src(n), dst(n);
  for (size_t i = 0; i < n; ++i) src[i] = static_cast<uint8_t>(i * 13 + 1);
  void *d1 = nullptr, *d2 = nullptr, *pinned = nullptr;
  ASSERT_OK(strata_malloc(kCuda0, n, nullptr, &d1));
  ASSERT_OK(strata_malloc(kCuda0, n, nullptr, &d2));
  ASSERT_OK(strata_malloc_host(n, &pinned));
  // Synchronous, explicit kinds.
  ASSERT_OK(strata_memcpy(d1, src.data(), n, STRATA_MEMCPY_HOST_TO_DEVICE));
  ASSERT_OK(strata_memcpy(d2, d1, n, STRATA_MEMCPY_DEVICE_TO_DEVICE));
  ASSERT_OK(strata_memcpy(dst.data(), d2, n, STRATA_MEMCPY_DEVICE_TO_HOST));
  EXPECT_EQ(dst, src);
  // Asynchronous on a CUDA stream, through pinned memory, inferred kinds.
  Stream s(kCuda0);
  std::memcpy(pinned, src.data(), n);
  ASSERT_OK(strata_memset_async(d1, 0, n, s));
  ASSERT_OK(strata_memcpy_async(d1, pinned, n, STRATA_MEMCPY_DEFAULT, s));
  ASSERT_OK(strata_memset_async(pinned, 0, n, s));  // host memory on a CUDA stream: a host callback
  ASSERT_OK(strata_memcpy_async(pinned, d1, n, STRATA_MEMCPY_DEFAULT, s));
  ASSERT_OK(strata_stream_synchronize(s));
  EXPECT_EQ(std::memcmp(pinned, src.data(), n), 0);
  // Asynchronous on a CPU stream: the copy runs on its worker.
  Stream cpu(kCpu);
  std::fill(dst.begin(), dst.end(), 0);
  ASSERT_OK(strata_memcpy_async(dst.data(), d2, n, STRATA_MEMCPY_DEVICE_TO_HOST, cpu));
  ASSERT_OK(strata_stream_synchronize(cpu));
  EXPECT_EQ(dst, src);
  // memset, then read back.
  ASSERT_OK(strata_memset(d2, 0x3c, n));
  ASSERT_OK(strata_memcpy(dst.data(), d2, n, STRATA_MEMCPY_DEFAULT));
  EXPECT_TRUE(std::all_of(dst.begin(), dst.end(), [](uint8_t b) { return b == 0x3c; }));
  // The kind is checked against where the pointers live.
  EXPECT_FAILS_WITH(strata_memcpy(d1, d2, n, STRATA_MEMCPY_HOST_TO_DEVICE), STRATA_ERROR_INVALID_VALUE,
                    "says src is host memory, but it is on cuda:0");
  ASSERT_OK(strata_free(d1));
  ASSERT_OK(strata_free(d2));
  ASSERT_OK(strata_free_host(pinned));
}

#if STRATA_WITH_CUDA
TEST(Runtime, CudaWrapsForeignStreams) {
  SKIP_WITHOUT_GPU();
  cudaStream_t raw = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&raw, cudaStreamNonBlocking), cudaSuccess);
  strata_stream wrapped = nullptr;
  ASSERT_OK(strata_stream_wrap_cuda(0, raw, &wrapped));
  EXPECT_EQ(strata::rt::cuda_stream_handle(wrapped), raw);
  uint32_t flags = 0;
  ASSERT_OK(strata_stream_get_flags(wrapped, &flags));
  EXPECT_EQ(flags, uint32_t{STRATA_STREAM_NON_BLOCKING});
  int ran = 0;
  ASSERT_OK(strata::rt::submit_host(wrapped, [&] { ran = 1; }));
  ASSERT_OK(strata_stream_destroy(wrapped));
  EXPECT_EQ(cudaStreamSynchronize(raw), cudaSuccess);  // the wrapper left the stream alive
  EXPECT_EQ(ran, 1);
  EXPECT_EQ(cudaStreamDestroy(raw), cudaSuccess);
  // The legacy default stream, as torch's default stream is.
  ASSERT_OK(strata_stream_wrap_cuda(0, nullptr, &wrapped));
  ASSERT_OK(strata_stream_synchronize(wrapped));
  ASSERT_OK(strata_stream_destroy(wrapped));
  EXPECT_FAILS_WITH(strata_stream_wrap_cuda(cuda_count(), nullptr, &wrapped), STRATA_ERROR_INVALID_DEVICE,
                    "does not exist");
}
#endif

}  // namespace
