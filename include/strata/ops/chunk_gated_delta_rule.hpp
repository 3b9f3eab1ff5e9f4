// Strata operators: chunk_gated_delta_rule (C++ API, one function per op). Included by strata/strata.hpp, inside nothing:
// opens namespace strata itself and uses Tensor, Plan, Stream and check from strata.hpp.
#pragma once

namespace strata {}  // namespace strata
