// Thread-local last-error text and the helpers every layer uses to fail with a message.
//
// A failing call sets the text and returns its status:
//   return strata::fail(STRATA_ERROR_INVALID_SHAPE, "l2norm_fwd: y must have shape {} (like x), got {}", a, b);
// The text names the op and argument and gives expected vs actual (ARCHITECTURE.md §3).
#pragma once

#include <fmt/format.h>

#include <string>

#include "strata/runtime.h"

namespace strata {

void set_last_error(std::string message);
const std::string& last_error();

template <class... Args>
strata_status fail(strata_status status, fmt::format_string<Args...> f, Args&&... args) {
  set_last_error(fmt::format(f, std::forward<Args>(args)...));
  return status;
}

// Early-return helper: STRATA_RETURN_IF_ERROR(expr) returns expr's status when it is not SUCCESS.
#define STRATA_RETURN_IF_ERROR(expr)                      \
  do {                                                    \
    const strata_status strata_status_ = (expr);          \
    if (strata_status_ != STRATA_SUCCESS) return strata_status_; \
  } while (0)

}  // namespace strata
