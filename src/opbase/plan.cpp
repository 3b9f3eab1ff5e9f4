#include "opbase/plan.h"

#include <fmt/format.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <unordered_map>

#include "runtime/runtime_internal.h"

struct strata_plan_s {
  static constexpr uint32_t kMagic = 0x5354504cu;  // "STPL"
  uint32_t magic = kMagic;
  std::shared_ptr<const strata::Plan> plan;
};

namespace strata {
namespace {

std::mutex g_force_mutex;
std::string g_force;        // set by strata_set_force_impl
bool g_force_set = false;

int parse_verbose() {
  const char* v = std::getenv("STRATA_VERBOSE");
  if (!v || !*v || std::strcmp(v, "0") == 0) return 0;
  if (std::strcmp(v, "dispatch") == 0 || std::strcmp(v, "2") == 0) return 2;
  return 1;
}
std::atomic<int> g_verbose{parse_verbose()};

struct Cache {
  std::mutex mutex;
  std::unordered_map<std::string, std::shared_ptr<const Plan>> plans;
  uint64_t hits = 0, misses = 0;
};
Cache& cache() {
  static Cache c;
  return c;
}

std::vector<OpInfo>& ops_registry() {
  static std::vector<OpInfo> ops;
  return ops;
}

}  // namespace

std::string forced_impl() {
  {
    std::lock_guard<std::mutex> lock(g_force_mutex);
    if (g_force_set) return g_force;
  }
  const char* v = std::getenv("STRATA_FORCE_IMPL");
  return v ? std::string(v) : std::string();
}

int verbose_level() { return g_verbose.load(std::memory_order_relaxed); }
void set_verbose_level(int level) { g_verbose.store(level); }

PlanKey& PlanKey::add(const strata_tensor_desc* t) {
  if (!t) {
    key_.push_back('-');
    return *this;
  }
  key_.push_back('T');
  add_attr(t->dtype).add_attr(t->rank).add_attr(t->offset).add_attr(t->device);
  const int rank = t->rank < 0 ? 0 : (t->rank > STRATA_MAX_RANK ? STRATA_MAX_RANK : t->rank);
  key_.append(reinterpret_cast<const char*>(t->shape), sizeof(int64_t) * rank);
  key_.append(reinterpret_cast<const char*>(t->strides), sizeof(int64_t) * rank);
  return *this;
}

strata_status plan_cached(PlanKey& key, const std::function<strata_status(std::shared_ptr<Plan>&)>& build,
                          strata_plan* out) {
  if (!out) return fail(STRATA_ERROR_NULL_POINTER, "{}: plan (the output handle) must not be NULL",
                        key.str().substr(0, key.str().find('|')));
  *out = nullptr;
  const std::string force = forced_impl();
  key.add_attr(rt::determinism()).add_attr(static_cast<uint32_t>(force.size()));
  std::string k = key.str() + force;
  Cache& c = cache();
  {
    std::lock_guard<std::mutex> lock(c.mutex);
    auto it = c.plans.find(k);
    if (it != c.plans.end()) {
      ++c.hits;
      *out = new strata_plan_s{strata_plan_s::kMagic, it->second};
      return STRATA_SUCCESS;
    }
  }
  std::shared_ptr<Plan> plan;
  STRATA_RETURN_IF_ERROR(build(plan));
  if (verbose_level() >= 2) {
    for (const auto& v : plan->verdicts)
      std::fprintf(stderr, "strata_verbose,dispatch,%s,%s,%s\n", plan->op.c_str(), v.impl.c_str(),
                   v.reason.empty() ? "chosen" : v.reason.c_str());
  }
  std::shared_ptr<const Plan> frozen = std::move(plan);
  {
    std::lock_guard<std::mutex> lock(c.mutex);
    ++c.misses;
    c.plans.emplace(std::move(k), frozen);
  }
  *out = new strata_plan_s{strata_plan_s::kMagic, std::move(frozen)};
  return STRATA_SUCCESS;
}

std::string reject_unless_cpu(strata_device d) {
  return d.type == STRATA_DEVICE_CPU ? std::string() : fmt::format("runs on the CPU, tensors are on {}", rt::device_str(d));
}

std::string reject_unless_cuda(strata_device d, int min_sm) {
  if (d.type != STRATA_DEVICE_CUDA) return fmt::format("runs on CUDA devices, tensors are on {}", rt::device_str(d));
  const int sm = rt::cuda_sm_version(d.index);
  if (sm < min_sm) return fmt::format("needs sm_{} or newer, {} is sm_{}", min_sm, rt::device_str(d), sm);
  return {};
}

uint32_t absent_mask_of(const std::vector<const strata_tensor_desc*>& tensors) {
  uint32_t mask = 0;
  for (size_t i = 0; i < tensors.size() && i < 32; ++i)
    if (!tensors[i]) mask |= 1u << i;
  return mask;
}

uint32_t given_mask_of(const std::vector<const strata_tensor_desc*>& tensors) {
  const uint32_t all = tensors.size() >= 32 ? ~0u : (1u << tensors.size()) - 1u;
  return all & ~absent_mask_of(tensors);
}

uint32_t nonempty_mask_of(const std::vector<const strata_tensor_desc*>& tensors) {
  uint32_t mask = 0;
  for (size_t i = 0; i < tensors.size() && i < 32; ++i)
    if (tensors[i] && numel(*tensors[i]) > 0) mask |= 1u << i;
  return mask;
}

strata_status choose_impl(const PlanInfo& info, const std::vector<std::string>& names,
                          const std::function<std::string(size_t)>& reject, size_t* chosen,
                          std::vector<Verdict>* verdicts) {
  // The masks are 32-bit, and a tensor the plan was made without cannot be required at run time: either would be
  // a mistake in the op's plan function.
  if (info.tensors.size() > 32 || (info.required_mask & ~given_mask_of(info.tensors)) != 0)
    return fail(STRATA_ERROR_INTERNAL, "{}: the required mask {:#x} names a tensor the plan was not given ({} tensors)",
                info.op, info.required_mask, info.tensors.size());
  const std::string force = forced_impl();
  bool force_here = false;
  if (!force.empty())
    for (const auto& n : names) force_here |= (n == force);
  bool found = false;
  for (size_t i = 0; i < names.size(); ++i) {
    std::string reason;
    if (found) {
      reason = "a candidate earlier in the list was chosen";
    } else if (force_here && names[i] != force) {
      reason = fmt::format("STRATA_FORCE_IMPL={} pins another implementation", force);
    } else {
      reason = reject(i);
      if (reason.empty()) {
        found = true;
        *chosen = i;
      }
    }
    verdicts->push_back({names[i], reason});
  }
  if (found) return STRATA_SUCCESS;
  std::string why;
  for (const auto& v : *verdicts)
    if (!(force_here && v.impl != force)) why += fmt::format("; {}: {}", v.impl, v.reason);
  if (force_here)
    return fail(STRATA_ERROR_NO_IMPLEMENTATION, "{}: the forced implementation {} cannot run {}{}", info.op, force,
                info.summary, why);
  return fail(STRATA_ERROR_NO_IMPLEMENTATION, "{}: no implementation can run {} on {}{}", info.op, info.summary,
              rt::device_str(info.device), why);
}

void register_op(const OpInfo& info) { ops_registry().push_back(info); }
const std::vector<OpInfo>& registered_ops() { return ops_registry(); }

const Plan* plan_from_handle(strata_plan handle) {
  if (!handle || handle->magic != strata_plan_s::kMagic) return nullptr;
  return handle->plan.get();
}

namespace {

strata_status run_now(const Plan& plan, const Launch& launch) {
  if (plan.empty) return STRATA_SUCCESS;
  if (verbose_level() == 0) return plan.run(launch);
  const auto t0 = std::chrono::steady_clock::now();
  strata_status s = plan.run(launch);
  if (s == STRATA_SUCCESS && plan.device.type == STRATA_DEVICE_CUDA) {
    // Verbose timing waits for the kernel, like oneDNN's verbose mode: a debugging aid, not a profiler.
    strata_device_synchronize(plan.device);
  }
  const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  std::fprintf(stderr, "strata_verbose,run,%s,%s,%s,%s,ws=%zu,%.4fms,%s\n", plan.op.c_str(), plan.impl.c_str(),
               rt::device_str(plan.device).c_str(), plan.summary.c_str(), plan.workspace, ms,
               s == STRATA_SUCCESS ? "ok" : strata_status_name(s));
  return s;
}

}  // namespace
}  // namespace strata

extern "C" {

strata_status strata_plan_workspace_size(strata_plan plan, size_t* size) {
  using namespace strata;
  const Plan* p = plan_from_handle(plan);
  if (!p) return fail(STRATA_ERROR_INVALID_HANDLE, "strata_plan_workspace_size: plan is not a valid plan handle");
  if (!size) return fail(STRATA_ERROR_NULL_POINTER, "strata_plan_workspace_size: size must not be NULL");
  *size = p->workspace;
  return STRATA_SUCCESS;
}

const char* strata_plan_impl_name(strata_plan plan) {
  const strata::Plan* p = strata::plan_from_handle(plan);
  return p ? p->impl.c_str() : "";
}

const char* strata_plan_op_name(strata_plan plan) {
  const strata::Plan* p = strata::plan_from_handle(plan);
  return p ? p->op.c_str() : "";
}

strata_status strata_plan_run(strata_plan plan, void* const* tensors, int32_t num_tensors, void* workspace,
                              size_t workspace_size, strata_stream stream) {
  using namespace strata;
  if (!plan || plan->magic != strata_plan_s::kMagic)
    return fail(STRATA_ERROR_INVALID_HANDLE, "strata_plan_run: plan is not a valid plan handle");
  std::shared_ptr<const Plan> p = plan->plan;
  if (num_tensors != p->num_tensors)
    return fail(STRATA_ERROR_INVALID_VALUE, "strata_plan_run: {} takes {} tensors, got num_tensors = {}", p->op,
                p->num_tensors, num_tensors);
  if (num_tensors > 0 && !tensors)
    return fail(STRATA_ERROR_NULL_POINTER, "strata_plan_run: {}: tensors must not be NULL", p->op);
  // Every op (the masks come from the plan's descriptors, plan.h PlanInfo). The absent rule first: a pointer for a
  // tensor the plan does not know is the caller's mistake whatever else the call holds.
  for (int i = 0; i < num_tensors; ++i)
    if ((p->absent_mask >> i & 1u) && tensors[i])
      return fail(STRATA_ERROR_INVALID_VALUE,
                  "strata_plan_run: {}: tensor {} was not given when the plan was made, so it must be NULL", p->op, i);
  if (!p->empty)
    for (int i = 0; i < num_tensors; ++i)
      if ((p->required_mask >> i & 1u) && !tensors[i])
        return fail(STRATA_ERROR_NULL_POINTER, "strata_plan_run: {}: tensor {} must not be NULL", p->op, i);
  if (workspace_size < p->workspace)
    return fail(STRATA_ERROR_WORKSPACE_TOO_SMALL, "strata_plan_run: {} needs a workspace of {} bytes, got {}", p->op,
                p->workspace, workspace_size);
  if (p->workspace > 0 && !workspace)
    return fail(STRATA_ERROR_NULL_POINTER, "strata_plan_run: {} needs a workspace of {} bytes, got NULL", p->op,
                p->workspace);
  if (stream) {
    const strata_device sd = rt::stream_device(stream);
    if (!rt::same_device(sd, p->device))
      return fail(STRATA_ERROR_INVALID_DEVICE, "strata_plan_run: {}: stream is on {}, the plan's tensors on {}", p->op,
                  rt::device_str(sd), rt::device_str(p->device));
  }
  Launch launch{tensors, workspace, workspace_size, nullptr};
  if (p->device.type == STRATA_DEVICE_CUDA) {
    STRATA_RETURN_IF_ERROR(rt::cuda_set_device(p->device.index));
    launch.cuda_stream = rt::cuda_stream_handle(stream);
    return run_now(*p, launch);
  }
  if (!stream) return run_now(*p, launch);
  // CPU stream: the pointers are copied, the plan kept alive until the task ran.
  std::vector<void*> ptrs(tensors, tensors + num_tensors);
  return rt::submit_host(stream, [p, ptrs = std::move(ptrs), workspace, workspace_size]() {
    Launch l{ptrs.data(), workspace, workspace_size, nullptr};
    if (run_now(*p, l) != STRATA_SUCCESS)
      std::fprintf(stderr, "strata: %s failed on a CPU stream: %s\n", p->op.c_str(), strata_get_last_error_message());
  });
}

strata_status strata_plan_destroy(strata_plan plan) {
  if (!plan) return STRATA_SUCCESS;
  if (plan->magic != strata_plan_s::kMagic)
    return strata::fail(STRATA_ERROR_INVALID_HANDLE, "strata_plan_destroy: plan is not a valid plan handle");
  plan->magic = 0;
  delete plan;
  return STRATA_SUCCESS;
}

strata_status strata_set_force_impl(const char* name) {
  std::lock_guard<std::mutex> lock(strata::g_force_mutex);
  strata::g_force = name ? name : "";
  strata::g_force_set = name && *name;
  return STRATA_SUCCESS;
}

void strata_plan_cache_stats(uint64_t* hits, uint64_t* misses, uint64_t* entries) {
  auto& c = strata::cache();
  std::lock_guard<std::mutex> lock(c.mutex);
  if (hits) *hits = c.hits;
  if (misses) *misses = c.misses;
  if (entries) *entries = c.plans.size();
}

void strata_plan_cache_clear(void) {
  auto& c = strata::cache();
  std::lock_guard<std::mutex> lock(c.mutex);
  c.plans.clear();
  c.hits = c.misses = 0;
}

int32_t strata_op_impl_names(const char* op, const char** names, int32_t capacity) {
  if (!op) return -1;
  for (const auto& info : strata::registered_ops()) {
    if (std::strcmp(info.name, op) != 0) continue;
    // Names live as long as the process: keep them in a per-op static store.
    static std::mutex m;
    static std::unordered_map<std::string, std::vector<std::string>> store;
    std::lock_guard<std::mutex> lock(m);
    auto& v = store[op];
    if (v.empty()) v = info.impl_names();
    for (int32_t i = 0; i < capacity && i < static_cast<int32_t>(v.size()); ++i) names[i] = v[i].c_str();
    return static_cast<int32_t>(v.size());
  }
  return -1;
}

int32_t strata_op_names(const char** names, int32_t capacity) {
  const auto& ops = strata::registered_ops();
  for (int32_t i = 0; i < capacity && i < static_cast<int32_t>(ops.size()); ++i) names[i] = ops[i].name;
  return static_cast<int32_t>(ops.size());
}

}  // extern "C"
