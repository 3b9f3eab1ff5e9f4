// What a strata_stream and a strata_event are, shared by the runtime's files (stream, event, memory, copy).
//
// Handles are validated against registries of live handles rather than by reading a magic number from
// the pointed-to memory: a destroyed or garbage handle is refused without ever being dereferenced.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_set>

#include "strata/runtime.h"

namespace strata::rt {

// The first failure of a task run off the caller's thread (CPU worker, CUDA host callback), kept until a
// synchronize reports it, as CUDA reports asynchronous errors. Later failures are dropped: the first one
// is the cause.
class FailureSlot {
 public:
  void record(std::string message);
  std::string take();  // "" when nothing failed since the last take

 private:
  std::mutex mutex_;
  bool failed_ = false;
  std::string message_;
};

// Runs a task and returns the message of the exception it threw, "" when it returned normally: a bad task
// cannot end the process.
std::string run_guarded(const std::function<void()>& task);

// Inside a task: throws the thread's last error when `status` is a failure (for run_guarded to catch).
void throw_if_failed(strata_status status);

// An in-order task queue served by one thread: the CPU stream.
class CpuWorker {
 public:
  explicit CpuWorker(std::shared_ptr<FailureSlot> failures);
  CpuWorker(const CpuWorker&) = delete;
  CpuWorker& operator=(const CpuWorker&) = delete;
  ~CpuWorker();  // shutdown()

  void enqueue(std::function<void()> task);
  void synchronize();  // waits until every task enqueued so far has run
  bool idle();
  bool on_worker_thread() const { return std::this_thread::get_id() == worker_id_; }
  // Runs what is queued, then joins the thread. Idempotent; never call it from a task of this worker.
  void shutdown();

 private:
  void run();

  std::shared_ptr<FailureSlot> failures_;
  std::mutex mutex_;
  std::condition_variable work_cv_;  // the worker waits for tasks
  std::condition_variable done_cv_;  // synchronize waits for completion
  std::deque<std::function<void()>> queue_;
  uint64_t submitted_ = 0;
  uint64_t completed_ = 0;
  bool stopping_ = false;
  std::thread thread_;
  std::thread::id worker_id_;  // thread_'s id, kept apart so that a join does not race with readers
};

// The state a CPU event shares with the tasks that complete or wait on it; held by shared_ptr so that a
// task still queued when the event is destroyed keeps it alive. Each record gets a generation number;
// `completed` is the newest generation whose task has run.
struct CpuEventState {
  std::mutex mutex;
  std::condition_variable cv;
  uint64_t recorded = 0;
  uint64_t completed = 0;
  std::chrono::steady_clock::time_point stamp;  // when generation `completed` ran

  uint64_t begin_record();
  void complete(uint64_t generation);
  void wait_for(uint64_t generation);  // until `generation` (or a later one) has run
};

// A cudaEvent_t owned jointly by its strata_event and by CPU-stream tasks that wait on it, so that the
// event outlives a destroy that races with such a task.
struct CudaEventOwner {
  int device = 0;
  void* event = nullptr;
  ~CudaEventOwner();
};

// A set of live handles of one kind.
template <class T>
class LiveSet {
 public:
  void add(const T* h) {
    std::lock_guard lock(mutex_);
    set_.insert(h);
  }
  void remove(const T* h) {
    std::lock_guard lock(mutex_);
    set_.erase(h);
  }
  bool contains(const T* h) {
    std::lock_guard lock(mutex_);
    return set_.count(h) != 0;
  }
  // fn(const T*) for each live handle, under the lock: a handle cannot be destroyed while fn looks at it.
  template <class Fn>
  void for_each(Fn&& fn) {
    std::lock_guard lock(mutex_);
    for (const T* h : set_) fn(h);
  }

 private:
  std::mutex mutex_;
  std::unordered_set<const T*> set_;
};

}  // namespace strata::rt

struct strata_stream_s {
  strata_device device{};
  uint32_t flags = 0;
  int32_t priority = 0;
  std::shared_ptr<strata::rt::FailureSlot> failures;  // task failures, reported by synchronize
  std::shared_ptr<strata::rt::CpuWorker> worker;      // CPU streams
  void* cuda = nullptr;                               // CUDA streams: cudaStream_t (nullptr = legacy default)
  bool owns_cuda = false;                             // false for strata_stream_wrap_cuda
};

struct strata_event_s {
  strata_device device{};
  std::shared_ptr<strata::rt::CpuEventState> cpu;    // CPU events
  std::shared_ptr<strata::rt::CudaEventOwner> cuda;  // CUDA events
  std::atomic<bool> cuda_recorded{false};            // lets elapsed_time name a never-recorded event
};

namespace strata::rt {

LiveSet<strata_stream_s>& live_streams();
LiveSet<strata_event_s>& live_events();

// A null stream is valid (synchronous on the CPU, the legacy default stream on CUDA); anything else must
// be live. `what` names the function and argument: "strata_event_record: stream".
strata_status check_stream(strata_stream stream, const char* what);
strata_status check_event(strata_event event, const char* what);
// check_stream, and a non-null stream must be on `device`.
strata_status check_stream_on(strata_stream stream, strata_device device, const char* what);

// Waits for all work on `device` (its CPU streams, or cudaDeviceSynchronize) and lets every stream reuse
// the device's cached blocks. Task failures stay for the next synchronize to report.
strata_status wait_device(strata_device device, const char* what);

}  // namespace strata::rt
