// Process-wide settings the kernels read: the determinism level and the OpenMP thread count.
#include <omp.h>

#include <atomic>
#include <cstdlib>
#include <cstring>

#include "runtime/error.h"
#include "runtime/runtime_internal.h"

namespace strata::rt {
namespace {

constexpr int kDefaultDeterminism = 1;

// STRATA_DETERMINISM overrides the default when the level is first needed; a value that is not exactly
// 0, 1 or 2 is ignored, since there is no call to report it to.
int initial_determinism() {
  const char* env = std::getenv("STRATA_DETERMINISM");
  if (env != nullptr && env[0] >= '0' && env[0] <= '2' && env[1] == '\0') return env[0] - '0';
  return kDefaultDeterminism;
}

std::atomic<int>& determinism_level() {
  static std::atomic<int> level{initial_determinism()};
  return level;
}

std::atomic<int>& thread_count() {
  // OpenMP's own default, so OMP_NUM_THREADS is respected; read once, before anything (torch, say) lowers
  // the calling thread's setting.
  static std::atomic<int> count{omp_get_max_threads()};
  return count;
}

// Runs the static initializers at load time, so "the default" is what OpenMP said at startup rather than
// at the first kernel call.
[[maybe_unused]] const bool g_initialized = (determinism_level(), thread_count(), true);

}  // namespace

int determinism() { return determinism_level().load(std::memory_order_relaxed); }
int num_threads() { return thread_count().load(std::memory_order_relaxed); }

}  // namespace strata::rt

using namespace strata;

extern "C" {

strata_status strata_set_determinism(int32_t level) {
  if (level < 0 || level > 2) {
    return fail(STRATA_ERROR_INVALID_VALUE,
                "strata_set_determinism: level must be 0 (off), 1 (run to run) or 2 (batch invariant), got {}", level);
  }
  rt::determinism_level().store(level, std::memory_order_relaxed);
  return STRATA_SUCCESS;
}

int32_t strata_get_determinism(void) { return rt::determinism(); }

strata_status strata_set_num_threads(int32_t n) {
  if (n < 0) {
    return fail(STRATA_ERROR_INVALID_VALUE, "strata_set_num_threads: n must be >= 0 (0 = all cores), got {}", n);
  }
  // Only Strata's kernels read this (through num_threads clauses); omp_set_num_threads would also change
  // the calling thread's setting for the application and for torch.
  rt::thread_count().store(n == 0 ? omp_get_num_procs() : n, std::memory_order_relaxed);
  return STRATA_SUCCESS;
}

int32_t strata_get_num_threads(void) { return rt::num_threads(); }

}  // extern "C"
