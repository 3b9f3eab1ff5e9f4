// Events: markers in a stream's order. A CPU event is recorded by a task that stamps
// std::chrono::steady_clock when the stream reaches it; a CUDA event wraps a timing cudaEvent_t.
//
// An event and the stream it is recorded on must be on the same device. Waiting may cross devices: a CPU
// stream waits for a CUDA event with a task that calls cudaEventSynchronize, and a CUDA stream waits for a
// CPU event with a host callback that blocks until the event's task has run.
#include <utility>

#include "runtime/cuda_backend.h"
#include "runtime/error.h"
#include "runtime/handles.h"
#include "runtime/runtime_internal.h"

namespace strata::rt {

uint64_t CpuEventState::begin_record() {
  std::lock_guard lock(mutex);
  return ++recorded;
}

void CpuEventState::complete(uint64_t generation) {
  {
    std::lock_guard lock(mutex);
    // Records may complete out of order when they were made on different streams; the newest one wins.
    if (generation <= completed) return;
    completed = generation;
    stamp = std::chrono::steady_clock::now();
  }
  cv.notify_all();
}

void CpuEventState::wait_for(uint64_t generation) {
  std::unique_lock lock(mutex);
  cv.wait(lock, [&] { return completed >= generation; });
}

CudaEventOwner::~CudaEventOwner() {
  // Reached only when a CPU-stream task held the last reference; a failure here has no caller to go to.
  if (event != nullptr) cuda::event_destroy(device, event, "strata_event_destroy");
}

LiveSet<strata_event_s>& live_events() {
  static auto* set = new LiveSet<strata_event_s>;  // never destroyed, like live_streams()
  return *set;
}

strata_status check_event(strata_event event, const char* what) {
  if (event == nullptr) return fail(STRATA_ERROR_NULL_POINTER, "{} is NULL", what);
  if (!live_events().contains(event)) {
    return fail(STRATA_ERROR_INVALID_HANDLE, "{}: {} is not a live strata_event (destroyed, or never created)", what,
                static_cast<const void*>(event));
  }
  return STRATA_SUCCESS;
}

namespace {

// Where an event stands, read consistently for elapsed-time checks.
struct CpuEventSnapshot {
  uint64_t recorded, completed;
  std::chrono::steady_clock::time_point stamp;
};

CpuEventSnapshot snapshot(CpuEventState& state) {
  std::lock_guard lock(state.mutex);
  return {state.recorded, state.completed, state.stamp};
}

// Fails unless the event has been recorded and its latest record has completed.
strata_status check_timing_ready(bool recorded, bool completed, const char* which) {
  if (!recorded) {
    return fail(STRATA_ERROR_INVALID_VALUE, "strata_event_elapsed_time: {} event was never recorded", which);
  }
  if (!completed) {
    return fail(STRATA_ERROR_INVALID_VALUE,
                "strata_event_elapsed_time: {} event has not completed yet (call strata_event_synchronize first)",
                which);
  }
  return STRATA_SUCCESS;
}

strata_status cuda_timing_ready(strata_event event, const char* which) {
  bool done = false;
  const bool recorded = event->cuda_recorded.load();
  if (recorded) STRATA_RETURN_IF_ERROR(cuda::event_query(event->cuda->event, &done, "strata_event_elapsed_time"));
  return check_timing_ready(recorded, done, which);
}

}  // namespace

}  // namespace strata::rt

using namespace strata;
using namespace strata::rt;

extern "C" {

strata_status strata_event_create(strata_device device, strata_event* event) {
  if (event == nullptr) return fail(STRATA_ERROR_NULL_POINTER, "strata_event_create: event (the output) is NULL");
  STRATA_RETURN_IF_ERROR(check_device(device, "strata_event_create"));
  auto e = std::make_unique<strata_event_s>();
  e->device = device;
  if (device.type == STRATA_DEVICE_CPU) {
    e->cpu = std::make_shared<CpuEventState>();
  } else {
    void* handle = nullptr;
    STRATA_RETURN_IF_ERROR(cuda::event_create(device.index, &handle, "strata_event_create"));
    e->cuda = std::make_shared<CudaEventOwner>();
    e->cuda->device = device.index;
    e->cuda->event = handle;
  }
  live_events().add(e.get());
  *event = e.release();
  return STRATA_SUCCESS;
}

strata_status strata_event_destroy(strata_event event) {
  STRATA_RETURN_IF_ERROR(check_event(event, "strata_event_destroy: event"));
  live_events().remove(event);
  std::unique_ptr<strata_event_s> e(event);
  if (e->cuda && e->cuda.use_count() == 1) {
    // No task holds it: destroy it here, where a failure can be reported.
    void* handle = std::exchange(e->cuda->event, nullptr);
    return cuda::event_destroy(e->device.index, handle, "strata_event_destroy");
  }
  return STRATA_SUCCESS;
}

strata_status strata_event_record(strata_event event, strata_stream stream) {
  STRATA_RETURN_IF_ERROR(check_event(event, "strata_event_record: event"));
  STRATA_RETURN_IF_ERROR(check_stream_on(stream, event->device, "strata_event_record: stream"));
  if (event->cpu) {
    const uint64_t generation = event->cpu->begin_record();
    return submit_host(stream, [state = event->cpu, generation] { state->complete(generation); });
  }
  // The null stream is the legacy default stream of the event's device.
  STRATA_RETURN_IF_ERROR(cuda::event_record(event->device.index, event->cuda->event, stream ? stream->cuda : nullptr,
                                            "strata_event_record"));
  event->cuda_recorded = true;
  return STRATA_SUCCESS;
}

strata_status strata_event_synchronize(strata_event event) {
  STRATA_RETURN_IF_ERROR(check_event(event, "strata_event_synchronize: event"));
  if (event->cpu) {
    event->cpu->wait_for(snapshot(*event->cpu).recorded);
    return STRATA_SUCCESS;
  }
  return cuda::event_synchronize(event->cuda->event, "strata_event_synchronize");
}

strata_status strata_event_query(strata_event event, int32_t* done) {
  if (done == nullptr) return fail(STRATA_ERROR_NULL_POINTER, "strata_event_query: done (the output) is NULL");
  STRATA_RETURN_IF_ERROR(check_event(event, "strata_event_query: event"));
  bool complete = true;
  if (event->cpu) {
    const CpuEventSnapshot s = snapshot(*event->cpu);
    complete = s.completed >= s.recorded;
  } else {
    STRATA_RETURN_IF_ERROR(cuda::event_query(event->cuda->event, &complete, "strata_event_query"));
  }
  *done = complete ? 1 : 0;
  return STRATA_SUCCESS;
}

strata_status strata_stream_wait_event(strata_stream stream, strata_event event) {
  STRATA_RETURN_IF_ERROR(check_stream(stream, "strata_stream_wait_event: stream"));
  STRATA_RETURN_IF_ERROR(check_event(event, "strata_stream_wait_event: event"));
  const char* what = "strata_stream_wait_event";
  if (event->cpu) {
    const CpuEventSnapshot s = snapshot(*event->cpu);
    if (s.completed >= s.recorded) return STRATA_SUCCESS;  // nothing outstanding to wait for
    // On a CUDA stream this blocks a cudart callback thread until the CPU task has run: the CPU side
    // must not itself wait for that CUDA stream.
    return submit_host(stream, [state = event->cpu, generation = s.recorded] { state->wait_for(generation); });
  }
  if (stream != nullptr && stream->worker) {
    if (!event->cuda_recorded) return STRATA_SUCCESS;
    // cudaEventSynchronize waits for the event's latest record when the task runs, which is this one or
    // a later one: never less than what was asked.
    return submit_host(stream,
                       [owner = event->cuda, what] { throw_if_failed(cuda::event_synchronize(owner->event, what)); });
  }
  // A CUDA stream, or the null stream: the legacy default stream of the event's device.
  const int device = stream ? stream->device.index : event->device.index;
  return cuda::stream_wait_event(device, stream ? stream->cuda : nullptr, event->cuda->event, what);
}

strata_status strata_event_elapsed_time(float* ms, strata_event start, strata_event end) {
  if (ms == nullptr) return fail(STRATA_ERROR_NULL_POINTER, "strata_event_elapsed_time: ms (the output) is NULL");
  STRATA_RETURN_IF_ERROR(check_event(start, "strata_event_elapsed_time: start"));
  STRATA_RETURN_IF_ERROR(check_event(end, "strata_event_elapsed_time: end"));
  if (!same_device(start->device, end->device)) {
    return fail(STRATA_ERROR_INVALID_VALUE, "strata_event_elapsed_time: start is on {} but end is on {}",
                device_str(start->device), device_str(end->device));
  }
  if (start->cpu) {
    // One event at a time: start and end may be the same event.
    const CpuEventSnapshot a = snapshot(*start->cpu);
    STRATA_RETURN_IF_ERROR(check_timing_ready(a.recorded > 0, a.completed >= a.recorded, "start"));
    const CpuEventSnapshot b = snapshot(*end->cpu);
    STRATA_RETURN_IF_ERROR(check_timing_ready(b.recorded > 0, b.completed >= b.recorded, "end"));
    *ms = std::chrono::duration<float, std::milli>(b.stamp - a.stamp).count();
    return STRATA_SUCCESS;
  }
  STRATA_RETURN_IF_ERROR(cuda_timing_ready(start, "start"));
  STRATA_RETURN_IF_ERROR(cuda_timing_ready(end, "end"));
  return cuda::event_elapsed_ms(ms, start->cuda->event, end->cuda->event, "strata_event_elapsed_time");
}

}  // extern "C"
