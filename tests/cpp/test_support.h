// Small helpers shared by the per-op C++ tests (validation, gradient and determinism tests beyond the
// conformance driver): forcing an implementation for a scope, random and poisoned host tensors, the check that
// a rejected call wrote nothing, and descriptor / data pointers of optional tensors.
#pragma once

#include <cstdint>
#include <random>
#include <vector>

#include "strata/ops.h"
#include "testkit/testkit.h"

namespace strata::test {

using atk::HostTensor;

inline const strata_device kCpu = {STRATA_DEVICE_CPU, 0};

// STRATA_FORCE_IMPL for the lifetime of the object (nullptr: dispatch picks again).
struct ForceImpl {
  explicit ForceImpl(const char* name) { strata_set_force_impl(name); }
  ~ForceImpl() { strata_set_force_impl(nullptr); }
  ForceImpl(const ForceImpl&) = delete;
  ForceImpl& operator=(const ForceImpl&) = delete;
};

// Normal(mean, sd) values of the dtype, reproducible from the seed.
inline HostTensor rnd(int32_t dtype, const std::vector<int64_t>& shape, uint64_t seed, double mean = 0.0,
                      double sd = 1.0) {
  HostTensor t = HostTensor::make(dtype, shape);
  std::mt19937_64 rng(seed);
  t.fill_normal(rng, mean, sd);
  return t;
}

// Every byte 0xff (NaN for the float dtypes): an output that a rejected call must leave as it is.
inline HostTensor poisoned(int32_t dtype, const std::vector<int64_t>& shape) {
  HostTensor t = HostTensor::make(dtype, shape);
  t.poison();
  return t;
}
inline bool all_poison(const HostTensor& t) {
  for (uint8_t b : t.storage)
    if (b != 0xff) return false;
  return true;
}

// The descriptor and data pointer of an optional tensor (nullptr when absent).
inline const strata_tensor_desc* dsc(const HostTensor* t) { return t ? &t->desc : nullptr; }
inline void* dat(const HostTensor* t) { return t ? const_cast<uint8_t*>(t->storage.data()) : nullptr; }

}  // namespace strata::test
