// Package version, from the STRATA_VERSION_* macros of strata/runtime.h.
#include "strata/runtime.h"

#define STRATA_STRINGIFY_(x) #x
#define STRATA_STRINGIFY(x) STRATA_STRINGIFY_(x)

static_assert(STRATA_VERSION_MINOR < 100 && STRATA_VERSION_PATCH < 100,
              "strata_get_version packs minor and patch into two decimal digits each");

extern "C" {

const char* strata_get_version_string(void) {
  return STRATA_STRINGIFY(STRATA_VERSION_MAJOR) "." STRATA_STRINGIFY(STRATA_VERSION_MINOR) "." STRATA_STRINGIFY(
      STRATA_VERSION_PATCH);
}

int32_t strata_get_version(void) {
  return STRATA_VERSION_MAJOR * 10000 + STRATA_VERSION_MINOR * 100 + STRATA_VERSION_PATCH;
}

}  // extern "C"
