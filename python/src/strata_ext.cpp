// strata._C: the Python binding of Strata's C API (layer L5).
//
// The binding never sees a torch tensor and does not link libtorch. Python hands it plain values:
//   a tensor "meta" = (dtype code, device index (-1 = cpu, >= 0 = cuda:N), shape tuple, stride tuple, data ptr)
//   (None for an absent optional tensor), an attribute tuple of numbers, and a stream handle (an int:
//   0 = the NULL stream, else a strata_stream from stream_wrap_cuda). The data pointer already includes
//   the storage offset, so descriptors are built with offset 0.
//
// Ops are called through one generic entry, `execute(op_id, metas, attrs, stream)`: it plans (the C plan
// functions consult Strata's plan cache), and when the plan needs no workspace it runs it and returns
// None; otherwise it returns the Plan so that Python can allocate the workspace with torch and call
// Plan.run(metas, ws_ptr, ws_size, stream). Adding an op = one row in kOps below.
//
// Failures raise strata._C.StrataError (a RuntimeError) or, for 1xx "bad argument" statuses,
// strata._C.StrataValueError (a StrataError and a ValueError); the text is strata_get_last_error_message().
#include <nanobind/nanobind.h>
#include <nanobind/stl/string.h>

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <string_view>

#include "strata/ops.h"
#include "strata/runtime.h"

namespace nb = nanobind;

namespace {

PyObject* g_strata_error = nullptr;        // strata._C.StrataError(RuntimeError)
PyObject* g_strata_value_error = nullptr;  // strata._C.StrataValueError(StrataError, ValueError)

[[noreturn]] void raise_status(strata_status st, std::string_view what) {
  const char* c_msg = strata_get_last_error_message();
  std::string c_text = c_msg ? c_msg : "";
  std::string msg(what);
  msg += ": ";
  msg += c_text.empty() ? std::string("(no message)") : c_text;
  msg += " [";
  msg += strata_status_name(st);
  msg += "]";
  PyObject* type = (static_cast<int>(st) >= 100 && static_cast<int>(st) < 200) ? g_strata_value_error
                                                                                : g_strata_error;
  nb::object exc = nb::borrow(type)(nb::str(msg.c_str()));
  exc.attr("status") = nb::int_(static_cast<int>(st));
  exc.attr("status_name") = nb::str(strata_status_name(st));
  exc.attr("c_message") = nb::str(c_text.c_str());
  PyErr_SetObject(type, exc.ptr());
  throw nb::python_error();
}

inline void check(strata_status st, std::string_view what) {
  if (st != STRATA_SUCCESS) raise_status(st, what);
}

[[noreturn]] void raise_value_error(const std::string& msg) {
  PyErr_SetString(PyExc_ValueError, msg.c_str());
  throw nb::python_error();
}

// ---- fast conversions (raw CPython API: these run on every op call) ----

int64_t as_i64(PyObject* o, const char* what) {
  long long v = PyLong_AsLongLong(o);
  if (v == -1 && PyErr_Occurred()) {
    PyErr_Clear();
    raise_value_error(std::string("strata: expected an integer for ") + what);
  }
  return static_cast<int64_t>(v);
}

uintptr_t as_ptr(PyObject* o, const char* what) {
  unsigned long long v = PyLong_AsUnsignedLongLong(o);
  if (v == static_cast<unsigned long long>(-1) && PyErr_Occurred()) {
    PyErr_Clear();
    raise_value_error(std::string("strata: expected a non-negative integer pointer for ") + what);
  }
  return static_cast<uintptr_t>(v);
}

// A tuple or list seen through PySequence_Fast, released on every exit path (the readers below throw).
// When obj is not a sequence: ValueError "strata: <what> <must_be>", or Python's own TypeError when must_be is
// nullptr. (The message is built only on failure: this runs on every op call.)
class FastSequence {
 public:
  FastSequence(PyObject* obj, const char* what, const char* must_be) : fast_(PySequence_Fast(obj, what)) {
    if (fast_) return;
    if (!must_be) throw nb::python_error();
    PyErr_Clear();
    raise_value_error(std::string("strata: ") + what + " " + must_be);
  }
  ~FastSequence() { Py_DECREF(fast_); }
  FastSequence(const FastSequence&) = delete;
  FastSequence& operator=(const FastSequence&) = delete;
  Py_ssize_t size() const { return PySequence_Fast_GET_SIZE(fast_); }
  PyObject* operator[](Py_ssize_t i) const { return PySequence_Fast_ITEMS(fast_)[i]; }

 private:
  PyObject* fast_;
};

// Reads a tuple/list of ints into out[0..n); returns n.
int read_dims(PyObject* seq, int64_t* out, const char* what) {
  const FastSequence items(seq, what, "must be a sequence of ints");
  const Py_ssize_t n = items.size();
  if (n > STRATA_MAX_RANK)
    raise_value_error(std::string("strata: rank ") + std::to_string(n) + " exceeds STRATA_MAX_RANK (" +
                      std::to_string(STRATA_MAX_RANK) + ")");
  for (Py_ssize_t i = 0; i < n; ++i) {
    long long v = PyLong_AsLongLong(items[i]);
    if (v == -1 && PyErr_Occurred()) {
      PyErr_Clear();
      raise_value_error(std::string("strata: ") + what + " must hold ints");
    }
    out[i] = v;
  }
  return static_cast<int>(n);
}

constexpr int kMaxTensors = 16;
constexpr int kMaxAttrs = 8;

struct Tensors {
  int n = 0;
  strata_tensor_desc desc[kMaxTensors];
  const strata_tensor_desc* pdesc[kMaxTensors];  // nullptr for an absent (None) tensor
  void* ptr[kMaxTensors];
  strata_device device{STRATA_DEVICE_CPU, 0};  // device of the first present tensor
};

// meta = (dtype, device index (-1 cpu), shape, strides, ptr) or None.
void read_metas(PyObject* metas, Tensors& t) {
  if (!PyTuple_Check(metas) && !PyList_Check(metas)) raise_value_error("strata: metas must be a tuple or list");
  const FastSequence items(metas, "metas", nullptr);
  const Py_ssize_t n = items.size();
  if (n > kMaxTensors) raise_value_error("strata: too many tensors");
  bool have_device = false;
  t.n = static_cast<int>(n);
  for (Py_ssize_t i = 0; i < n; ++i) {
    PyObject* m = items[i];
    if (m == Py_None) {
      t.pdesc[i] = nullptr;
      t.ptr[i] = nullptr;
      continue;
    }
    if (!PyTuple_Check(m) || PyTuple_GET_SIZE(m) != 5)
      raise_value_error("strata: a tensor meta must be (dtype, device, shape, strides, ptr)");
    strata_tensor_desc& d = t.desc[i];
    std::memset(&d, 0, sizeof(d));
    d.dtype = static_cast<int32_t>(as_i64(PyTuple_GET_ITEM(m, 0), "dtype"));
    int64_t dev = as_i64(PyTuple_GET_ITEM(m, 1), "device");
    d.device.type = dev < 0 ? STRATA_DEVICE_CPU : STRATA_DEVICE_CUDA;
    d.device.index = dev < 0 ? 0 : static_cast<int32_t>(dev);
    int rank = read_dims(PyTuple_GET_ITEM(m, 2), d.shape, "shape");
    int srank = read_dims(PyTuple_GET_ITEM(m, 3), d.strides, "strides");
    if (srank != rank) raise_value_error("strata: shape and strides differ in length");
    d.rank = rank;
    d.offset = 0;
    t.ptr[i] = reinterpret_cast<void*>(as_ptr(PyTuple_GET_ITEM(m, 4), "ptr"));
    t.pdesc[i] = &d;
    if (!have_device) {
      t.device = d.device;
      have_device = true;
    }
  }
}

struct Attrs {
  int n = 0;
  double v[kMaxAttrs];
};

void read_attrs(PyObject* attrs, Attrs& a) {
  const FastSequence items(attrs, "attrs", "must be a tuple of numbers");
  const Py_ssize_t n = items.size();
  if (n > kMaxAttrs) raise_value_error("strata: too many attributes");
  for (Py_ssize_t i = 0; i < n; ++i) {
    double v = PyFloat_AsDouble(items[i]);  // also takes ints and bools
    if (v == -1.0 && PyErr_Occurred()) {
      PyErr_Clear();
      raise_value_error("strata: attributes must be numbers");
    }
    a.v[i] = v;
  }
  a.n = static_cast<int>(n);
}

// ---- the op table: one row per C plan function ----

using PlanFn = strata_status (*)(const strata_tensor_desc* const* d, const double* a, strata_plan* plan);

struct OpEntry {
  const char* name;
  int num_tensors;  // also the tensor count given to strata_plan_run, in the same order
  int num_attrs;
  PlanFn plan;
};

const OpEntry kOps[] = {
    {"l2norm_fwd", 3, 1,  // tensors {x, y, rstd}; attrs {eps}
     [](const strata_tensor_desc* const* d, const double* a, strata_plan* p) {
       return strata_l2norm_fwd_plan(d[0], d[1], d[2], static_cast<float>(a[0]), p);
     }},
    {"l2norm_bwd", 4, 0,  // {y, rstd, dy, dx}
     [](const strata_tensor_desc* const* d, const double*, strata_plan* p) {
       return strata_l2norm_bwd_plan(d[0], d[1], d[2], d[3], p);
     }},
    {"rmsnorm_without_weight_fwd", 3, 2,  // {x, y (None in FACTOR mode), r}; {eps, mode}
     [](const strata_tensor_desc* const* d, const double* a, strata_plan* p) {
       return strata_rmsnorm_without_weight_fwd_plan(d[0], d[1], d[2], static_cast<float>(a[0]),
                                                     static_cast<int32_t>(a[1]), p);
     }},
    {"rmsnorm_without_weight_bwd", 4, 1,  // {x, r, dout, dx}; {mode}
     [](const strata_tensor_desc* const* d, const double* a, strata_plan* p) {
       return strata_rmsnorm_without_weight_bwd_plan(d[0], d[1], d[2], d[3], static_cast<int32_t>(a[0]), p);
     }},
    {"chunk_local_cumsum", 3, 3,  // {g, cu_seqlens (or None), out}; {chunk_size, reverse, scale}
     [](const strata_tensor_desc* const* d, const double* a, strata_plan* p) {
       return strata_chunk_local_cumsum_plan(d[0], d[1], d[2], static_cast<int32_t>(a[0]),
                                             static_cast<int32_t>(a[1]), static_cast<float>(a[2]), p);
     }},
// Operator families, one file of rows each.
#include "ops/gdn_fwd.inc"
#include "ops/gdn_bwd.inc"
#include "ops/chunk_gated_delta_rule.inc"
#include "ops/rms_norm_gated.inc"
#include "ops/clipped_swiglu.inc"
#include "ops/causal_conv1d.inc"
#include "ops/fused_cross_entropy.inc"
#include "ops/chunk_loss.inc"
};
constexpr int kNumOps = static_cast<int>(sizeof(kOps) / sizeof(kOps[0]));

const OpEntry& op_entry(int op) {
  if (op < 0 || op >= kNumOps) raise_value_error("strata: unknown op id " + std::to_string(op));
  return kOps[op];
}

// ---- Plan ----

struct Plan {
  strata_plan handle = nullptr;
  size_t workspace_size = 0;
  int op = -1;
  int num_tensors = 0;
  Plan() = default;
  Plan(const Plan&) = delete;
  Plan& operator=(const Plan&) = delete;
  ~Plan() {
    if (handle) strata_plan_destroy(handle);
  }
};

strata_plan make_plan(int op, PyObject* metas, PyObject* attrs, Tensors& t) {
  const OpEntry& e = op_entry(op);
  read_metas(metas, t);
  if (t.n != e.num_tensors)
    raise_value_error(std::string("strata: ") + e.name + " takes " + std::to_string(e.num_tensors) +
                      " tensors, got " + std::to_string(t.n));
  Attrs a;
  read_attrs(attrs, a);
  if (a.n != e.num_attrs)
    raise_value_error(std::string("strata: ") + e.name + " takes " + std::to_string(e.num_attrs) +
                      " attributes, got " + std::to_string(a.n));
  strata_plan h = nullptr;
  check(e.plan(t.pdesc, a.v, &h), e.name);
  return h;
}

void run_plan(strata_plan h, const char* name, const Tensors& t, uintptr_t ws, size_t ws_size, uintptr_t stream) {
  strata_status st;
  {
    nb::gil_scoped_release release;
    st = strata_plan_run(h, t.ptr, t.n, reinterpret_cast<void*>(ws), ws_size,
                         reinterpret_cast<strata_stream>(stream));
  }
  check(st, name);
}

// Reads only the pointers (position 4) from the metas.
void read_ptrs(PyObject* metas, Tensors& t) {
  const FastSequence items(metas, "metas", nullptr);
  const Py_ssize_t n = items.size();
  if (n > kMaxTensors) raise_value_error("strata: too many tensors");
  t.n = static_cast<int>(n);
  for (Py_ssize_t i = 0; i < n; ++i) {
    PyObject* m = items[i];
    if (m == Py_None) {
      t.ptr[i] = nullptr;
    } else if (PyTuple_Check(m) && PyTuple_GET_SIZE(m) == 5) {
      t.ptr[i] = reinterpret_cast<void*>(as_ptr(PyTuple_GET_ITEM(m, 4), "ptr"));
    } else {
      t.ptr[i] = reinterpret_cast<void*>(as_ptr(m, "ptr"));  // plain pointers are fine too
    }
  }
}

nb::dict device_properties_dict(int32_t type, int32_t index) {
  strata_device dev{type, index};
  strata_device_properties p;
  std::memset(&p, 0, sizeof(p));
  check(strata_device_get_properties(dev, &p), "strata_device_get_properties");
  nb::dict d;
  d["type"] = type == STRATA_DEVICE_CPU ? "cpu" : "cuda";
  d["index"] = index;
  d["name"] = nb::str(p.name);
  char uuid[33];
  for (int i = 0; i < 16; ++i) std::snprintf(uuid + 2 * i, 3, "%02x", p.uuid[i]);
  d["uuid"] = nb::str(uuid);
  d["multiprocessor_count"] = p.multiprocessor_count;
  d["sm"] = nb::make_tuple(p.sm_major, p.sm_minor);
  d["isa"] = nb::str(p.isa);
  d["total_memory"] = p.total_memory;
  d["l2_cache_bytes"] = p.l2_cache_bytes;
  return d;
}

}  // namespace

NB_MODULE(_C, m) {
  m.doc() = "Strata C API binding (no libtorch; plain integers in, plans out)";

  // PyErr_NewExceptionWithDoc(name, doc, base (a class or a tuple of classes), dict)
  g_strata_error = PyErr_NewExceptionWithDoc("strata._C.StrataError",
                                             "A Strata C API call failed; .status holds the strata_status code, "
                                             ".c_message the library's last-error text.",
                                             PyExc_RuntimeError, nullptr);
  {
    nb::object bases = nb::make_tuple(nb::handle(g_strata_error), nb::handle(PyExc_ValueError));
    g_strata_value_error = PyErr_NewExceptionWithDoc(
        "strata._C.StrataValueError", "A Strata call rejected an argument (status 1xx).", bases.ptr(), nullptr);
  }
  if (!g_strata_error || !g_strata_value_error) throw nb::python_error();
  m.attr("StrataError") = nb::handle(g_strata_error);
  m.attr("StrataValueError") = nb::handle(g_strata_value_error);

  // ---- ops ----
  nb::dict ops;
  for (int i = 0; i < kNumOps; ++i) ops[kOps[i].name] = i;
  m.attr("OPS") = ops;

  nb::class_<Plan>(m, "Plan")
      .def_ro("workspace_size", &Plan::workspace_size)
      .def_prop_ro("impl_name", [](const Plan& p) { return std::string(strata_plan_impl_name(p.handle)); })
      .def_prop_ro("op_name", [](const Plan& p) { return std::string(strata_plan_op_name(p.handle)); })
      .def(
          "run",
          [](const Plan& p, nb::handle metas, uintptr_t ws, size_t ws_size, uintptr_t stream) {
            Tensors t;
            read_ptrs(metas.ptr(), t);
            if (t.n != p.num_tensors)
              raise_value_error(std::string("strata: ") + kOps[p.op].name + " takes " +
                                std::to_string(p.num_tensors) + " tensors, got " + std::to_string(t.n));
            run_plan(p.handle, kOps[p.op].name, t, ws, ws_size, stream);
          },
          nb::arg("metas"), nb::arg("workspace") = 0, nb::arg("workspace_size") = 0, nb::arg("stream") = 0,
          "Runs the plan on new pointers (metas, or plain ints) with the given workspace and stream.")
      .def("__repr__", [](const Plan& p) {
        return std::string("<strata Plan ") + kOps[p.op].name + " impl=" + strata_plan_impl_name(p.handle) +
               " workspace=" + std::to_string(p.workspace_size) + ">";
      });

  m.def(
      "run",
      [](const Plan& p, nb::handle ptrs, uintptr_t ws, size_t ws_size, uintptr_t stream) {
        Tensors t;
        read_ptrs(ptrs.ptr(), t);
        if (t.n != p.num_tensors)
          raise_value_error(std::string("strata: ") + kOps[p.op].name + " takes " + std::to_string(p.num_tensors) +
                            " tensors, got " + std::to_string(t.n));
        run_plan(p.handle, kOps[p.op].name, t, ws, ws_size, stream);
      },
      nb::arg("plan"), nb::arg("ptrs"), nb::arg("workspace") = 0, nb::arg("workspace_size") = 0,
      nb::arg("stream") = 0, "run(plan, [ptrs...], ws_ptr, ws_size, stream): same as plan.run.");

  m.def(
      "plan",
      [](int op, nb::handle metas, nb::handle attrs) {
        Tensors t;
        auto p = new Plan();
        try {
          p->handle = make_plan(op, metas.ptr(), attrs.ptr(), t);
        } catch (...) {
          delete p;
          throw;
        }
        p->op = op;
        p->num_tensors = t.n;
        size_t ws = 0;
        check(strata_plan_workspace_size(p->handle, &ws), kOps[op].name);
        p->workspace_size = ws;
        return p;
      },
      nb::arg("op"), nb::arg("metas"), nb::arg("attrs"), nb::rv_policy::take_ownership,
      "Plans op (an id from OPS) for the given tensor metas and attributes.");

  // Plan, and run at once when no workspace is needed (returns None), else return the Plan.
  m.def(
      "execute",
      [](int op, nb::handle metas, nb::handle attrs, uintptr_t stream) -> nb::object {
        Tensors t;
        strata_plan h = make_plan(op, metas.ptr(), attrs.ptr(), t);
        size_t ws = 0;
        strata_status st = strata_plan_workspace_size(h, &ws);
        if (st != STRATA_SUCCESS) {
          strata_plan_destroy(h);
          check(st, kOps[op].name);
        }
        if (ws == 0) {
          strata_status rs;
          {
            nb::gil_scoped_release release;
            rs = strata_plan_run(h, t.ptr, t.n, nullptr, 0, reinterpret_cast<strata_stream>(stream));
            strata_plan_destroy(h);
          }
          check(rs, kOps[op].name);
          return nb::none();
        }
        auto p = new Plan();
        p->handle = h;
        p->op = op;
        p->num_tensors = t.n;
        p->workspace_size = ws;
        return nb::cast(p, nb::rv_policy::take_ownership);
      },
      nb::arg("op"), nb::arg("metas"), nb::arg("attrs"), nb::arg("stream") = 0,
      "Plans and, when the plan needs no workspace, runs op; returns None then, else the Plan to run.");

  m.def("op_names", []() {
    const char* names[256];
    int32_t n = strata_op_names(names, 256);
    nb::list out;
    for (int32_t i = 0; i < n && i < 256; ++i) out.append(nb::str(names[i]));
    return out;
  });
  m.def("op_impl_names", [](const std::string& op) {
    const char* names[64];
    int32_t n = strata_op_impl_names(op.c_str(), names, 64);
    if (n < 0) raise_value_error("strata: unknown op '" + op + "'");
    nb::list out;
    for (int32_t i = 0; i < n && i < 64; ++i) out.append(nb::str(names[i]));
    return out;
  });
  m.def("plan_cache_stats", []() {
    uint64_t h = 0, mi = 0, e = 0;
    strata_plan_cache_stats(&h, &mi, &e);
    nb::dict d;
    d["hits"] = h;
    d["misses"] = mi;
    d["entries"] = e;
    return d;
  });
  m.def("plan_cache_clear", []() { strata_plan_cache_clear(); });
  m.def(
      "set_force_impl",
      [](const std::string& name) { check(strata_set_force_impl(name.c_str()), "strata_set_force_impl"); },
      nb::arg("name"), "Pins an implementation for plans created from now on (\"\" clears).");

  // ---- streams ----
  m.def(
      "stream_wrap_cuda",
      [](int32_t device_index, uintptr_t cuda_stream) {
        strata_stream s = nullptr;
        check(strata_stream_wrap_cuda(device_index, reinterpret_cast<void*>(cuda_stream), &s),
              "strata_stream_wrap_cuda");
        return reinterpret_cast<uintptr_t>(s);
      },
      nb::arg("device_index"), nb::arg("cuda_stream"),
      "Wraps a cudaStream_t (e.g. torch.cuda.current_stream().cuda_stream); returns the strata_stream as an int.");
  m.def("stream_destroy", [](uintptr_t s) {
    check(strata_stream_destroy(reinterpret_cast<strata_stream>(s)), "strata_stream_destroy");
  });
  m.def("stream_synchronize", [](uintptr_t s) {
    strata_status st;
    {
      nb::gil_scoped_release release;
      st = strata_stream_synchronize(reinterpret_cast<strata_stream>(s));
    }
    check(st, "strata_stream_synchronize");
  });

  // ---- runtime queries ----
  m.def("version", []() { return std::string(strata_get_version_string()); });
  m.def("version_int", []() { return strata_get_version(); });
  m.def("built_with_cuda", []() { return strata_built_with_cuda() != 0; });
  m.def(
      "device_count",
      [](int32_t type) {
        int32_t n = 0;
        strata_status st = strata_device_count(type, &n);
        if (st != STRATA_SUCCESS) {
          strata_clear_last_error();
          return 0;  // e.g. CUDA without a driver: no device
        }
        return static_cast<int>(n);
      },
      nb::arg("type"));
  m.def("device_properties", &device_properties_dict, nb::arg("type"), nb::arg("index"));
  m.def("set_determinism", [](int32_t level) { check(strata_set_determinism(level), "strata_set_determinism"); });
  m.def("get_determinism", []() { return strata_get_determinism(); });
  m.def("set_num_threads", [](int32_t n) { check(strata_set_num_threads(n), "strata_set_num_threads"); });
  m.def("get_num_threads", []() { return strata_get_num_threads(); });
  m.def("status_name", [](int st) { return std::string(strata_status_name(static_cast<strata_status>(st))); });
  m.def("last_error_message", []() { return std::string(strata_get_last_error_message()); });
  m.def("clear_last_error", []() { strata_clear_last_error(); });
  m.def("dtype_name", [](int32_t dt) { return std::string(strata_dtype_name(dt)); });
  m.def("dtype_size", [](int32_t dt) { return static_cast<size_t>(strata_dtype_size(dt)); });
  // chunk_gated_delta_rule: bytes of the forward's `saved` buffer from the metas (q, k, v, cu_seqlens or None; the
  // pointers are not read, so fake tensors pass 0) and use_qk_l2norm_in_kernel. A pure function of the shapes.
  m.def(
      "chunk_gated_delta_rule_saved_bytes",
      [](nb::handle metas, int32_t l2norm) {
        Tensors t;
        read_metas(metas.ptr(), t);
        if (t.n != 4) raise_value_error("strata: chunk_gated_delta_rule_saved_bytes takes (q, k, v, cu_seqlens)");
        uint64_t n = 0;
        check(strata_chunk_gated_delta_rule_saved_bytes(t.pdesc[0], t.pdesc[1], t.pdesc[2], t.pdesc[3], l2norm, &n),
              "strata_chunk_gated_delta_rule_saved_bytes");
        return n;
      },
      nb::arg("metas"), nb::arg("use_qk_l2norm_in_kernel"));

  m.attr("DEVICE_CPU") = static_cast<int>(STRATA_DEVICE_CPU);
  m.attr("DEVICE_CUDA") = static_cast<int>(STRATA_DEVICE_CUDA);
  m.attr("RMSNORM_NORMALIZE") = static_cast<int>(STRATA_RMSNORM_NORMALIZE);
  m.attr("RMSNORM_FACTOR") = static_cast<int>(STRATA_RMSNORM_FACTOR);
  m.attr("MAX_RANK") = STRATA_MAX_RANK;
}
