// Strata C++ API: RAII over the C API, and one function per operator.
//
//   #include <strata/strata.hpp>
//   strata::Tensor x = strata::Tensor::empty(STRATA_DTYPE_BF16, {4096, 128}, strata::Device::cuda(0));
//   auto [y, rstd] = strata::l2norm_fwd(x);          // plan (cached), workspace, launch on the default stream
//
// Failures throw strata::Error carrying the status and the library's message. Header-only: it calls only the
// C functions of runtime.h and ops.h, so it works with any build of libstrata.
#ifndef STRATA_STRATA_HPP_
#define STRATA_STRATA_HPP_

#include <cstdint>
#include <initializer_list>
#include <memory>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "strata/ops.h"
#include "strata/runtime.h"

namespace strata {

class Error : public std::runtime_error {
 public:
  Error(strata_status status, const std::string& what) : std::runtime_error(what), status_(status) {}
  strata_status status() const { return status_; }

 private:
  strata_status status_;
};

inline void check(strata_status s) {
  if (s != STRATA_SUCCESS)
    throw Error(s, std::string(strata_status_name(s)) + ": " + strata_get_last_error_message());
}

struct Device {
  strata_device d{STRATA_DEVICE_CPU, 0};
  static Device cpu() { return {}; }
  static Device cuda(int index = 0) { return Device{{STRATA_DEVICE_CUDA, index}}; }
  static int count(strata_device_type type) {
    int32_t n = 0;
    check(strata_device_count(type, &n));
    return n;
  }
  strata_device_properties properties() const {
    strata_device_properties p{};
    check(strata_device_get_properties(d, &p));
    return p;
  }
  void synchronize() const { check(strata_device_synchronize(d)); }
};

class Stream {
 public:
  explicit Stream(Device dev, uint32_t flags = STRATA_STREAM_DEFAULT, int priority = 0) {
    check(strata_stream_create(dev.d, flags, priority, &s_));
  }
  ~Stream() { strata_stream_destroy(s_); }
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;
  strata_stream get() const { return s_; }
  void synchronize() const { check(strata_stream_synchronize(s_)); }

 private:
  strata_stream s_ = nullptr;
};

class Event {
 public:
  explicit Event(Device dev) { check(strata_event_create(dev.d, &e_)); }
  ~Event() { strata_event_destroy(e_); }
  Event(const Event&) = delete;
  Event& operator=(const Event&) = delete;
  void record(const Stream* s = nullptr) { check(strata_event_record(e_, s ? s->get() : nullptr)); }
  void synchronize() { check(strata_event_synchronize(e_)); }
  float elapsed_ms_since(const Event& start) const {
    float ms = 0;
    check(strata_event_elapsed_time(&ms, start.e_, e_));
    return ms;
  }

 private:
  strata_event e_ = nullptr;
};

// A tensor: descriptor plus data pointer. Owns its memory when made by Tensor::empty (allocator of the
// device); views made with Tensor::view borrow it.
class Tensor {
 public:
  Tensor() = default;
  static Tensor empty(int32_t dtype, std::vector<int64_t> shape, Device dev = Device::cpu()) {
    Tensor t;
    check(strata_tensor_desc_init(&t.desc_, dtype, static_cast<int32_t>(shape.size()), shape.data(), nullptr, 0,
                                  dev.d));
    size_t bytes = strata_dtype_size(dtype);
    for (int64_t s : shape) bytes *= static_cast<size_t>(s);
    void* p = nullptr;
    check(strata_malloc(dev.d, bytes, nullptr, &p));
    t.owner_ = std::shared_ptr<void>(p, [](void* q) { strata_free(q); });
    t.data_ = p;
    return t;
  }
  static Tensor view(void* data, const strata_tensor_desc& desc) {
    Tensor t;
    t.desc_ = desc;
    t.data_ = data;
    return t;
  }
  const strata_tensor_desc& desc() const { return desc_; }
  void* data() const { return data_; }
  int32_t dtype() const { return desc_.dtype; }
  int rank() const { return desc_.rank; }
  int64_t size(int i) const { return desc_.shape[i < 0 ? i + desc_.rank : i]; }
  std::vector<int64_t> shape() const { return {desc_.shape, desc_.shape + desc_.rank}; }
  Device device() const { return Device{desc_.device}; }
  int64_t numel() const {
    int64_t n = 1;
    for (int i = 0; i < desc_.rank; ++i) n *= desc_.shape[i];
    return n;
  }

 private:
  strata_tensor_desc desc_{};
  void* data_ = nullptr;
  std::shared_ptr<void> owner_;
};

// A plan handle (RAII). run() allocates the workspace it needs from the device's caching allocator.
class Plan {
 public:
  explicit Plan(strata_plan p) : p_(p) {}
  ~Plan() { strata_plan_destroy(p_); }
  Plan(const Plan&) = delete;
  Plan& operator=(const Plan&) = delete;
  const char* impl_name() const { return strata_plan_impl_name(p_); }
  size_t workspace_size() const {
    size_t n = 0;
    check(strata_plan_workspace_size(p_, &n));
    return n;
  }
  void run(std::initializer_list<void*> tensors, Device dev, const Stream* s = nullptr) const {
    const size_t ws = workspace_size();
    void* w = nullptr;
    if (ws) check(strata_malloc(dev.d, ws, s ? s->get() : nullptr, &w));
    const std::vector<void*> t(tensors);
    const strata_status st =
        strata_plan_run(p_, t.data(), static_cast<int32_t>(t.size()), w, ws, s ? s->get() : nullptr);
    if (w) strata_free(w);  // stream-ordered reuse: the allocator keeps the block for this stream
    check(st);
  }

 private:
  strata_plan p_;
};

namespace detail {
inline std::vector<int64_t> drop_last(const Tensor& x, bool keep_one) {
  std::vector<int64_t> s = x.shape();
  s.pop_back();
  if (keep_one) s.push_back(1);
  return s;
}
inline int32_t saved_dtype(const Tensor& x) {
  return x.dtype() == STRATA_DTYPE_F64 ? STRATA_DTYPE_F64 : STRATA_DTYPE_F32;
}
}  // namespace detail

// ---- operators (ops.h documents the math; each returns new tensors on x's device) ----

inline std::pair<Tensor, Tensor> l2norm_fwd(const Tensor& x, float eps = 1e-6f, const Stream* s = nullptr) {
  Tensor y = Tensor::empty(x.dtype(), x.shape(), x.device());
  Tensor rstd = Tensor::empty(detail::saved_dtype(x), detail::drop_last(x, false), x.device());
  strata_plan p = nullptr;
  check(strata_l2norm_fwd_plan(&x.desc(), &y.desc(), &rstd.desc(), eps, &p));
  Plan(p).run({x.data(), y.data(), rstd.data()}, x.device(), s);
  return {std::move(y), std::move(rstd)};
}

inline Tensor l2norm_bwd(const Tensor& y, const Tensor& rstd, const Tensor& dy, const Stream* s = nullptr) {
  Tensor dx = Tensor::empty(dy.dtype(), y.shape(), y.device());
  strata_plan p = nullptr;
  check(strata_l2norm_bwd_plan(&y.desc(), &rstd.desc(), &dy.desc(), &dx.desc(), &p));
  Plan(p).run({y.data(), rstd.data(), dy.data(), dx.data()}, y.device(), s);
  return dx;
}

// NORMALIZE: returns {y, r}; FACTOR: returns {empty, r} with r [..., 1] of dtype r_dtype (default x's).
inline std::pair<Tensor, Tensor> rmsnorm_without_weight_fwd(const Tensor& x, float eps = 1e-6f,
                                                            strata_rmsnorm_mode mode = STRATA_RMSNORM_NORMALIZE,
                                                            int32_t r_dtype = -1, const Stream* s = nullptr) {
  const bool factor = mode == STRATA_RMSNORM_FACTOR;
  if (r_dtype < 0) r_dtype = factor ? x.dtype() : detail::saved_dtype(x);
  Tensor y = factor ? Tensor() : Tensor::empty(x.dtype(), x.shape(), x.device());
  Tensor r = Tensor::empty(r_dtype, detail::drop_last(x, true), x.device());
  strata_plan p = nullptr;
  check(strata_rmsnorm_without_weight_fwd_plan(&x.desc(), factor ? nullptr : &y.desc(), &r.desc(), eps, mode, &p));
  Plan(p).run({x.data(), y.data(), r.data()}, x.device(), s);
  return {std::move(y), std::move(r)};
}

inline Tensor rmsnorm_without_weight_bwd(const Tensor& x, const Tensor& r, const Tensor& dout,
                                         strata_rmsnorm_mode mode = STRATA_RMSNORM_NORMALIZE,
                                         const Stream* s = nullptr) {
  Tensor dx = Tensor::empty(x.dtype(), x.shape(), x.device());
  strata_plan p = nullptr;
  check(strata_rmsnorm_without_weight_bwd_plan(&x.desc(), &r.desc(), &dout.desc(), &dx.desc(), mode, &p));
  Plan(p).run({x.data(), r.data(), dout.data(), dx.data()}, x.device(), s);
  return dx;
}

// g [B, T, H] or [B, T, H, S]; cu_seqlens: an int64 [N+1] tensor or nullptr.
inline Tensor chunk_local_cumsum(const Tensor& g, int chunk_size, bool reverse = false, float scale = 1.0f,
                                 const Tensor* cu_seqlens = nullptr, int32_t out_dtype = STRATA_DTYPE_F32,
                                 const Stream* s = nullptr) {
  Tensor out = Tensor::empty(out_dtype, g.shape(), g.device());
  strata_plan p = nullptr;
  check(strata_chunk_local_cumsum_plan(&g.desc(), cu_seqlens ? &cu_seqlens->desc() : nullptr, &out.desc(),
                                       chunk_size, reverse ? 1 : 0, scale, &p));
  Plan(p).run({g.data(), cu_seqlens ? cu_seqlens->data() : nullptr, out.data()}, g.device(), s);
  return out;
}

}  // namespace strata

// Operator families, one header each.
#include "strata/ops/gdn_fwd.hpp"
#include "strata/ops/gdn_bwd.hpp"
#include "strata/ops/chunk_gated_delta_rule.hpp"
#include "strata/ops/rms_norm_gated.hpp"
#include "strata/ops/clipped_swiglu.hpp"
#include "strata/ops/causal_conv1d.hpp"
#include "strata/ops/fused_cross_entropy.hpp"
#include "strata/ops/chunk_loss.hpp"

namespace strata {

inline std::string version() { return strata_get_version_string(); }

}  // namespace strata

#endif  // STRATA_STRATA_HPP_
