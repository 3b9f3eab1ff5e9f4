#include "runtime/error.h"

namespace strata {
namespace {
thread_local std::string t_last_error;
}  // namespace

void set_last_error(std::string message) { t_last_error = std::move(message); }
const std::string& last_error() { return t_last_error; }

}  // namespace strata

extern "C" {

const char* strata_get_last_error_message(void) { return strata::last_error().c_str(); }
void strata_clear_last_error(void) { strata::set_last_error({}); }

const char* strata_status_name(strata_status status) {
  switch (status) {
    case STRATA_SUCCESS: return "STRATA_SUCCESS";
    case STRATA_ERROR_NULL_POINTER: return "STRATA_ERROR_NULL_POINTER";
    case STRATA_ERROR_INVALID_DEVICE: return "STRATA_ERROR_INVALID_DEVICE";
    case STRATA_ERROR_INVALID_DTYPE: return "STRATA_ERROR_INVALID_DTYPE";
    case STRATA_ERROR_INVALID_SHAPE: return "STRATA_ERROR_INVALID_SHAPE";
    case STRATA_ERROR_INVALID_STRIDE: return "STRATA_ERROR_INVALID_STRIDE";
    case STRATA_ERROR_INVALID_ATTRIBUTE: return "STRATA_ERROR_INVALID_ATTRIBUTE";
    case STRATA_ERROR_INVALID_VALUE: return "STRATA_ERROR_INVALID_VALUE";
    case STRATA_ERROR_WORKSPACE_TOO_SMALL: return "STRATA_ERROR_WORKSPACE_TOO_SMALL";
    case STRATA_ERROR_INVALID_HANDLE: return "STRATA_ERROR_INVALID_HANDLE";
    case STRATA_ERROR_UNSUPPORTED: return "STRATA_ERROR_UNSUPPORTED";
    case STRATA_ERROR_NO_IMPLEMENTATION: return "STRATA_ERROR_NO_IMPLEMENTATION";
    case STRATA_ERROR_DEVICE_UNAVAILABLE: return "STRATA_ERROR_DEVICE_UNAVAILABLE";
    case STRATA_ERROR_OUT_OF_MEMORY: return "STRATA_ERROR_OUT_OF_MEMORY";
    case STRATA_ERROR_RUNTIME: return "STRATA_ERROR_RUNTIME";
    case STRATA_ERROR_LAUNCH_FAILED: return "STRATA_ERROR_LAUNCH_FAILED";
    case STRATA_ERROR_INTERNAL: return "STRATA_ERROR_INTERNAL";
  }
  return "STRATA_ERROR_UNKNOWN";
}

}  // extern "C"
