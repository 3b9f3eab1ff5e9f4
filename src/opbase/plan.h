// Plans and dispatch (ARCHITECTURE.md §3).
//
// An op's plan function validates its descriptors into a Problem (a plain struct with everything the kernels
// need), then walks the op's ordered implementation list: each entry says why it cannot run the problem
// (empty string = it can); the first that can wins, unless STRATA_FORCE_IMPL / strata_set_force_impl pins
// one. The chosen Problem and implementation are frozen into a Plan, cached by op + descriptors + attributes
// + determinism level + forced name, so eager front ends pay a hash lookup for a repeated shape.
#pragma once

#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "opbase/tensor.h"
#include "runtime/error.h"
#include "strata/ops.h"

namespace strata {

// What an implementation's run() receives.
struct Launch {
  void* const* ptrs = nullptr;  // base pointers in the op's tensor order (descriptor offsets not yet applied)
  void* workspace = nullptr;
  size_t workspace_size = 0;
  void* cuda_stream = nullptr;  // cudaStream_t for CUDA plans (nullptr = legacy default stream)
};

// A candidate's verdict during dispatch, kept in the plan for `strata info` and STRATA_VERBOSE=dispatch.
struct Verdict {
  std::string impl;
  std::string reason;  // empty = applicable
};

// Precision model of an implementation (what the conformance harnesses judge its outputs at). kOutputDtype: every
// output at its own dtype's precision. kInputDtype: products of 16-bit input operands whose intermediates are rounded
// to that input dtype before a further product (fla's model, e.g. the gdn_bwd tensor-core kernels), so its f32
// outputs carry the input dtype's rounding and are judged at it.
enum class PrecisionModel : uint8_t { kOutputDtype, kInputDtype };

class Plan {
 public:
  virtual ~Plan() = default;
  virtual strata_status run(const Launch& launch) const = 0;

  std::string op;
  std::string impl;
  std::string summary;  // "x:bf16[4096, 128] y:bf16[4096, 128] rstd:f32[4096] eps=1e-06"
  strata_device device{};
  size_t workspace = 0;
  int num_tensors = 0;
  uint32_t required_mask = 0;  // bit i set: tensor i must be non-NULL at run time
  uint32_t absent_mask = 0;    // bit i set: tensor i was not given to the plan, so it must be NULL at run time
  bool empty = false;          // no element to compute: run() does nothing
  PrecisionModel precision = PrecisionModel::kOutputDtype;  // the chosen implementation's
  std::vector<Verdict> verdicts;
};

template <class Problem>
struct Implementation {
  std::string name;                                            // "cpu.avx512", "cuda.sm90.row_norm", "reference"
  std::function<std::string(const Problem&)> reject;          // "" when it can run the problem, else the reason
  std::function<size_t(const Problem&)> workspace;            // empty: no workspace
  std::function<strata_status(const Problem&, const Launch&)> run;
  PrecisionModel precision = PrecisionModel::kOutputDtype;
};

template <class Problem>
using ImplList = std::vector<Implementation<Problem>>;

// The name pinned by strata_set_force_impl or STRATA_FORCE_IMPL ("" if none).
std::string forced_impl();
// Verbose level from STRATA_VERBOSE: 0 off, 1 one line per run, 2 ("dispatch") also every rejected candidate.
int verbose_level();
void set_verbose_level(int level);  // for tests

// Cache key builder: op name, descriptors (absent ones marked), attributes; determinism and forced name are
// appended by make_plan.
class PlanKey {
 public:
  explicit PlanKey(std::string_view op) : key_(op) { key_.push_back('|'); }
  PlanKey& add(const strata_tensor_desc* t);
  template <class T>
  PlanKey& add_attr(const T& v) {
    static_assert(std::is_trivially_copyable_v<T>);
    key_.append(reinterpret_cast<const char*>(&v), sizeof(T));
    return *this;
  }
  const std::string& str() const { return key_; }

 private:
  std::string key_;
};

// Looks `key` up in the plan cache; on a miss calls build() (which validates and dispatches, returning a
// status and, on success, a plan) and caches the result. Wraps the plan in a handle for the caller.
strata_status plan_cached(PlanKey& key, const std::function<strata_status(std::shared_ptr<Plan>&)>& build,
                          strata_plan* out);

// Helpers for reject() functions.
std::string reject_unless_cpu(strata_device d);
std::string reject_unless_cuda(strata_device d, int min_sm);

template <class Problem>
class PlanOf final : public Plan {
 public:
  PlanOf(Problem p, Implementation<Problem> impl) : problem_(std::move(p)), impl_(impl) {}
  strata_status run(const Launch& launch) const override { return impl_.run(problem_, launch); }
  const Problem& problem() const { return problem_; }

 private:
  Problem problem_;
  Implementation<Problem> impl_;
};

// Dispatch: picks the implementation for a validated problem and fills `out`.
// `info` carries the op name, the descriptors, required mask, device and summary for the plan.
struct PlanInfo {
  const char* op;
  // The plan function's descriptors in the op's tensor order (its strata_plan_run order), NULL where the caller
  // gave none. Their count is the op's tensor count, and the NULL ones are the plan's absent mask: strata_plan_run
  // rejects a non-NULL pointer there, since a kernel would otherwise bind it and write an optional output (e.g. a
  // weight gradient) that the plan's problem and workspace were not made for. A given-but-empty tensor counts as
  // given (its pointer may be anything, NULL included).
  std::vector<const strata_tensor_desc*> tensors;
  uint32_t required_mask;  // subset of the given tensors whose pointers must be non-NULL (see Plan::required_mask)
  strata_device device;
  std::string summary;
  bool empty;
};
// Bit i set where tensors[i] is NULL / given / given with at least one element (the required mask of ops whose
// kernels never touch an empty tensor, so that frameworks may pass NULL for one).
uint32_t absent_mask_of(const std::vector<const strata_tensor_desc*>& tensors);
uint32_t given_mask_of(const std::vector<const strata_tensor_desc*>& tensors);
uint32_t nonempty_mask_of(const std::vector<const strata_tensor_desc*>& tensors);
strata_status choose_impl(const PlanInfo& info, const std::vector<std::string>& names,
                          const std::function<std::string(size_t)>& reject, size_t* chosen,
                          std::vector<Verdict>* verdicts);

template <class Problem>
strata_status dispatch(const PlanInfo& info, Problem problem, const ImplList<Problem>& impls,
                       std::shared_ptr<Plan>& out) {
  std::vector<std::string> names;
  names.reserve(impls.size());
  for (const auto& i : impls) names.push_back(i.name);
  size_t chosen = 0;
  std::vector<Verdict> verdicts;
  STRATA_RETURN_IF_ERROR(choose_impl(
      info, names, [&](size_t i) { return impls[i].reject(problem); }, &chosen, &verdicts));
  auto plan = std::make_shared<PlanOf<Problem>>(std::move(problem), impls[chosen]);
  plan->op = info.op;
  plan->impl = info.empty ? std::string("empty") : impls[chosen].name;
  plan->summary = info.summary;
  plan->device = info.device;
  plan->num_tensors = static_cast<int>(info.tensors.size());
  plan->required_mask = info.required_mask;
  plan->absent_mask = absent_mask_of(info.tensors);
  plan->empty = info.empty;
  plan->precision = impls[chosen].precision;
  plan->verdicts = std::move(verdicts);
  plan->workspace = (!info.empty && impls[chosen].workspace) ? impls[chosen].workspace(plan->problem()) : 0;
  out = std::move(plan);
  return STRATA_SUCCESS;
}

// ---- op registry: names, implementation lists, and a probe for `strata info` ----
struct OpInfo {
  const char* name;
  std::vector<std::string> (*impl_names)();
  // Creates a plan for a representative problem on `device` (for `strata info`): the plan's verdicts say
  // which implementation this machine picks and why the others were rejected.
  strata_status (*probe)(strata_device device, strata_plan* plan);
};
void register_op(const OpInfo& info);
const std::vector<OpInfo>& registered_ops();
struct OpRegistrar {
  explicit OpRegistrar(const OpInfo& info) { register_op(info); }
};

// Access to the Plan behind a handle (nullptr when the handle is invalid).
const Plan* plan_from_handle(strata_plan handle);

template <class Problem>
std::vector<std::string> impl_names_of(const ImplList<Problem>& impls) {
  std::vector<std::string> out;
  for (const auto& i : impls) out.push_back(i.name);
  return out;
}

}  // namespace strata
