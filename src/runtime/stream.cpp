// Streams: in-order queues. A CPU stream is a worker thread (CpuWorker) running tasks in order; a CUDA
// stream wraps a cudaStream_t. The null stream runs CPU work inline on the calling thread, so synchronous
// use costs nothing beyond the call, and means the legacy default stream for CUDA work.
#include <exception>
#include <utility>
#include <vector>

#if defined(__linux__)
#include <pthread.h>
#endif

#include "runtime/allocator.h"
#include "runtime/cuda_backend.h"
#include "runtime/error.h"
#include "runtime/handles.h"
#include "runtime/runtime_internal.h"

namespace strata::rt {

// ---- task failures ----

void FailureSlot::record(std::string message) {
  std::lock_guard lock(mutex_);
  if (failed_) return;
  failed_ = true;
  message_ = std::move(message);
}

std::string FailureSlot::take() {
  std::lock_guard lock(mutex_);
  failed_ = false;
  return std::exchange(message_, {});
}

std::string run_guarded(const std::function<void()>& task) {
  try {
    task();
    return {};
  } catch (const std::exception& e) {
    if (e.what()[0] != '\0') return e.what();
    return "a task threw an exception with no message";
  } catch (...) {
    return "a task threw a non-standard exception";
  }
}

void throw_if_failed(strata_status status) {
  if (status != STRATA_SUCCESS) throw std::runtime_error(last_error());
}

// ---- CPU worker ----

CpuWorker::CpuWorker(std::shared_ptr<FailureSlot> failures)
    : failures_(std::move(failures)), thread_([this] { run(); }), worker_id_(thread_.get_id()) {
#if defined(__linux__)
  pthread_setname_np(thread_.native_handle(), "strata-stream");
#endif
}

CpuWorker::~CpuWorker() { shutdown(); }

void CpuWorker::enqueue(std::function<void()> task) {
  {
    std::lock_guard lock(mutex_);
    queue_.push_back(std::move(task));
    ++submitted_;
  }
  work_cv_.notify_one();
}

void CpuWorker::synchronize() {
  std::unique_lock lock(mutex_);
  const uint64_t target = submitted_;
  done_cv_.wait(lock, [&] { return completed_ >= target; });
}

bool CpuWorker::idle() {
  std::lock_guard lock(mutex_);
  return completed_ == submitted_;
}

void CpuWorker::shutdown() {
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
  }
  work_cv_.notify_one();
  if (thread_.joinable()) thread_.join();
}

void CpuWorker::run() {
  std::unique_lock lock(mutex_);
  for (;;) {
    work_cv_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
    if (queue_.empty()) return;  // stopping, and everything queued has run
    std::function<void()> task = std::move(queue_.front());
    queue_.pop_front();
    lock.unlock();
    std::string failure = run_guarded(task);
    if (!failure.empty()) failures_->record(std::move(failure));
    task = nullptr;  // release what the task captured before it counts as done
    lock.lock();
    ++completed_;
    done_cv_.notify_all();
  }
}

// ---- registry and checks ----

LiveSet<strata_stream_s>& live_streams() {
  // Never destroyed: streams the application leaks may still be looked at during static destruction.
  static auto* set = new LiveSet<strata_stream_s>;
  return *set;
}

strata_status check_stream(strata_stream stream, const char* what) {
  if (stream == nullptr || live_streams().contains(stream)) return STRATA_SUCCESS;
  return fail(STRATA_ERROR_INVALID_HANDLE, "{}: {} is not a live strata_stream (destroyed, or never created)", what,
              static_cast<const void*>(stream));
}

strata_status check_stream_on(strata_stream stream, strata_device device, const char* what) {
  STRATA_RETURN_IF_ERROR(check_stream(stream, what));
  if (stream != nullptr && !same_device(stream->device, device)) {
    return fail(STRATA_ERROR_INVALID_VALUE, "{}: the stream is on {}, the call is for {}", what,
                device_str(stream->device), device_str(device));
  }
  return STRATA_SUCCESS;
}

const void* stream_order_key(strata_stream stream) {
  return stream->worker ? static_cast<const void*>(stream->worker.get()) : stream->cuda;
}

// ---- internal API (runtime_internal.h) ----

strata_device stream_device(strata_stream stream) {
  if (stream == nullptr) return {STRATA_DEVICE_CPU, 0};
  // An invalid handle yields a device that check_device refuses.
  if (!live_streams().contains(stream)) return {-1, -1};
  return stream->device;
}

void* cuda_stream_handle(strata_stream stream) {
  if (stream == nullptr || !live_streams().contains(stream)) return nullptr;
  return stream->cuda;
}

namespace {

// A host callback on a CUDA stream: owns its task and the stream's failure slot (which outlives a
// destroyed stream wrapper).
struct HostCallback {
  std::function<void()> task;
  std::shared_ptr<FailureSlot> failures;
};

void run_host_callback(void* p) {
  std::unique_ptr<HostCallback> cb(static_cast<HostCallback*>(p));
  std::string failure = run_guarded(cb->task);
  if (!failure.empty()) cb->failures->record(std::move(failure));
}

strata_status submit_checked(strata_stream stream, std::function<void()> fn, const char* what) {
  if (stream == nullptr) {
    std::string failure = run_guarded(fn);
    if (!failure.empty()) return fail(STRATA_ERROR_RUNTIME, "{}: a task on the null stream failed: {}", what, failure);
    return STRATA_SUCCESS;
  }
  if (stream->worker) {
    stream->worker->enqueue(std::move(fn));
    return STRATA_SUCCESS;
  }
  auto cb = std::make_unique<HostCallback>(HostCallback{std::move(fn), stream->failures});
  STRATA_RETURN_IF_ERROR(cuda::launch_host_func(stream->device.index, stream->cuda, run_host_callback, cb.get(), what));
  cb.release();  // run_host_callback owns it now
  return STRATA_SUCCESS;
}

// Reports (and clears) the first failure of a task on `stream` since the last report.
strata_status report_failures(strata_stream stream, const char* what) {
  std::string failure = stream->failures->take();
  if (failure.empty()) return STRATA_SUCCESS;
  return fail(STRATA_ERROR_RUNTIME, "{}: a task on the {} stream failed: {}", what, device_str(stream->device),
              failure);
}

// Waiting for a CPU stream from one of its own tasks would wait forever.
strata_status check_not_own_worker(strata_stream stream, const char* what) {
  if (stream->worker && stream->worker->on_worker_thread()) {
    return fail(STRATA_ERROR_INVALID_VALUE, "{}: called from a task of the same stream, which would wait for itself",
                what);
  }
  return STRATA_SUCCESS;
}

}  // namespace

strata_status submit_host(strata_stream stream, std::function<void()> fn) {
  STRATA_RETURN_IF_ERROR(check_stream(stream, "submit_host: stream"));
  return submit_checked(stream, std::move(fn), "submit_host");
}

strata_status wait_device(strata_device device, const char* what) {
  STRATA_RETURN_IF_ERROR(check_device(device, what));
  // Snapshot under the registry lock (a stream cannot be destroyed meanwhile); wait outside it, since
  // tasks may themselves create or look up streams.
  std::vector<std::shared_ptr<CpuWorker>> workers;
  bool waits_for_itself = false;
  live_streams().for_each([&](const strata_stream_s* s) {
    if (!s->worker || !same_device(s->device, device)) return;
    waits_for_itself |= s->worker->on_worker_thread();
    workers.push_back(s->worker);
  });
  if (waits_for_itself) {
    return fail(STRATA_ERROR_INVALID_VALUE, "{}: called from a task of a {} stream, which would wait for itself", what,
                device_str(device));
  }
  for (const auto& w : workers) w->synchronize();
  if (device.type == STRATA_DEVICE_CUDA) STRATA_RETURN_IF_ERROR(cuda::device_synchronize(device.index, what));
  on_device_synchronized(device);
  return STRATA_SUCCESS;
}

}  // namespace strata::rt

using namespace strata;
using namespace strata::rt;

extern "C" {

strata_status strata_stream_create(strata_device device, uint32_t flags, int32_t priority, strata_stream* stream) {
  if (stream == nullptr) return fail(STRATA_ERROR_NULL_POINTER, "strata_stream_create: stream (the output) is NULL");
  STRATA_RETURN_IF_ERROR(check_device(device, "strata_stream_create"));
  if ((flags & ~uint32_t{STRATA_STREAM_NON_BLOCKING}) != 0) {
    return fail(STRATA_ERROR_INVALID_VALUE,
                "strata_stream_create: flags 0x{:x} has unknown bits (expected 0 or STRATA_STREAM_NON_BLOCKING = 1)",
                flags);
  }
  auto s = std::make_unique<strata_stream_s>();
  s->device = device;
  s->flags = flags;
  s->priority = priority;  // a CPU stream keeps it for the getter; its worker runs at normal priority
  s->failures = std::make_shared<FailureSlot>();
  if (device.type == STRATA_DEVICE_CPU) {
    s->worker = std::make_shared<CpuWorker>(s->failures);
  } else {
    const bool non_blocking = (flags & STRATA_STREAM_NON_BLOCKING) != 0;
    STRATA_RETURN_IF_ERROR(cuda::stream_create(device.index, non_blocking, priority, &s->cuda, "strata_stream_create"));
    s->owns_cuda = true;
    bool nb = false;
    // cudart clamps the priority into the device's range; report what the stream really has.
    const strata_status st =
        cuda::stream_get_attributes(device.index, s->cuda, &s->priority, &nb, "strata_stream_create");
    if (st != STRATA_SUCCESS) {
      cuda::stream_destroy(device.index, s->cuda, "strata_stream_create");
      return st;
    }
  }
  live_streams().add(s.get());
  *stream = s.release();
  return STRATA_SUCCESS;
}

strata_status strata_stream_wrap_cuda(int32_t device_index, void* cuda_stream, strata_stream* stream) {
  if (stream == nullptr) return fail(STRATA_ERROR_NULL_POINTER, "strata_stream_wrap_cuda: stream (the output) is NULL");
  const strata_device device{STRATA_DEVICE_CUDA, device_index};
  STRATA_RETURN_IF_ERROR(check_device(device, "strata_stream_wrap_cuda"));
  auto s = std::make_unique<strata_stream_s>();
  s->device = device;
  s->failures = std::make_shared<FailureSlot>();
  s->cuda = cuda_stream;  // nullptr wraps the legacy default stream (torch's default stream is that)
  bool non_blocking = false;
  STRATA_RETURN_IF_ERROR(
      cuda::stream_get_attributes(device_index, cuda_stream, &s->priority, &non_blocking, "strata_stream_wrap_cuda"));
  s->flags = non_blocking ? STRATA_STREAM_NON_BLOCKING : STRATA_STREAM_DEFAULT;
  live_streams().add(s.get());
  *stream = s.release();
  return STRATA_SUCCESS;
}

strata_status strata_stream_destroy(strata_stream stream) {
  if (stream == nullptr) {
    return fail(STRATA_ERROR_NULL_POINTER,
                "strata_stream_destroy: stream is NULL (the null stream is not created, so it cannot be destroyed)");
  }
  STRATA_RETURN_IF_ERROR(check_stream(stream, "strata_stream_destroy: stream"));
  STRATA_RETURN_IF_ERROR(check_not_own_worker(stream, "strata_stream_destroy"));
  live_streams().remove(stream);
  std::unique_ptr<strata_stream_s> s(stream);
  strata_status status = STRATA_SUCCESS;
  if (s->worker) {
    s->worker->shutdown();  // runs what is queued first, as cudaStreamDestroy lets queued work finish
    on_stream_retired(stream_order_key(s.get()));
  } else if (s->owns_cuda) {
    // Synchronize first: once the cudaStream_t is gone its handle value may be reused by a new stream, and
    // the blocks cached for it must not be reused before its work is done.
    status = cuda::stream_synchronize(s->device.index, s->cuda, "strata_stream_destroy");
    const strata_status destroyed = cuda::stream_destroy(s->device.index, s->cuda, "strata_stream_destroy");
    if (status == STRATA_SUCCESS) status = destroyed;
    on_stream_retired(stream_order_key(s.get()));
  }
  if (status != STRATA_SUCCESS) return status;
  return report_failures(s.get(), "strata_stream_destroy");
}

strata_status strata_stream_synchronize(strata_stream stream) {
  STRATA_RETURN_IF_ERROR(check_stream(stream, "strata_stream_synchronize: stream"));
  if (stream == nullptr) {
    // CPU work on the null stream is already done; CUDA work on it went to the legacy default stream of
    // the current device.
    if (cuda::device_count() == 0) return STRATA_SUCCESS;
    return cuda::stream_synchronize(-1, nullptr, "strata_stream_synchronize");
  }
  STRATA_RETURN_IF_ERROR(check_not_own_worker(stream, "strata_stream_synchronize"));
  if (stream->worker) {
    stream->worker->synchronize();
  } else {
    STRATA_RETURN_IF_ERROR(cuda::stream_synchronize(stream->device.index, stream->cuda, "strata_stream_synchronize"));
  }
  return report_failures(stream, "strata_stream_synchronize");
}

strata_status strata_stream_query(strata_stream stream, int32_t* idle) {
  if (idle == nullptr) return fail(STRATA_ERROR_NULL_POINTER, "strata_stream_query: idle (the output) is NULL");
  STRATA_RETURN_IF_ERROR(check_stream(stream, "strata_stream_query: stream"));
  bool done = true;
  if (stream == nullptr) {
    if (cuda::device_count() > 0) STRATA_RETURN_IF_ERROR(cuda::stream_query(-1, nullptr, &done, "strata_stream_query"));
  } else if (stream->worker) {
    done = stream->worker->idle();
  } else {
    STRATA_RETURN_IF_ERROR(cuda::stream_query(stream->device.index, stream->cuda, &done, "strata_stream_query"));
  }
  *idle = done ? 1 : 0;
  return STRATA_SUCCESS;
}

strata_status strata_stream_get_priority(strata_stream stream, int32_t* priority) {
  if (priority == nullptr) {
    return fail(STRATA_ERROR_NULL_POINTER, "strata_stream_get_priority: priority (the output) is NULL");
  }
  STRATA_RETURN_IF_ERROR(check_stream(stream, "strata_stream_get_priority: stream"));
  *priority = stream ? stream->priority : 0;
  return STRATA_SUCCESS;
}

strata_status strata_stream_get_flags(strata_stream stream, uint32_t* flags) {
  if (flags == nullptr) return fail(STRATA_ERROR_NULL_POINTER, "strata_stream_get_flags: flags (the output) is NULL");
  STRATA_RETURN_IF_ERROR(check_stream(stream, "strata_stream_get_flags: stream"));
  *flags = stream ? stream->flags : uint32_t{STRATA_STREAM_DEFAULT};
  return STRATA_SUCCESS;
}

strata_status strata_stream_get_device(strata_stream stream, strata_device* device) {
  if (device == nullptr) {
    return fail(STRATA_ERROR_NULL_POINTER, "strata_stream_get_device: device (the output) is NULL");
  }
  STRATA_RETURN_IF_ERROR(check_stream(stream, "strata_stream_get_device: stream"));
  *device = stream ? stream->device : strata_device{STRATA_DEVICE_CPU, 0};
  return STRATA_SUCCESS;
}

strata_status strata_stream_enqueue_host(strata_stream stream, void (*fn)(void*), void* user) {
  if (fn == nullptr) return fail(STRATA_ERROR_NULL_POINTER, "strata_stream_enqueue_host: fn is NULL");
  STRATA_RETURN_IF_ERROR(check_stream(stream, "strata_stream_enqueue_host: stream"));
  return submit_checked(
      stream, [fn, user] { fn(user); }, "strata_stream_enqueue_host");
}

strata_status strata_device_synchronize(strata_device device) {
  STRATA_RETURN_IF_ERROR(wait_device(device, "strata_device_synchronize"));
  // Every stream of the device has drained: report the first task failure among them.
  std::string failure;
  live_streams().for_each([&](const strata_stream_s* s) {
    if (failure.empty() && same_device(s->device, device)) failure = s->failures->take();
  });
  if (!failure.empty()) {
    return fail(STRATA_ERROR_RUNTIME, "strata_device_synchronize: a task on a {} stream failed: {}", device_str(device),
                failure);
  }
  return STRATA_SUCCESS;
}

}  // extern "C"
