// ATK harness of chunk_loss: conformance cases, the float64 comparison, benchmark cases.
//
// A case line: "chunk_loss dtype=bf16 N=65 D=64 V=97 bias=1 reduction=mean eps=0.1 scale=1 softcap=0 zloss=0
// mag=3 ignored=0.3 ignore_index=-100 strategy=auto rows=0 vtile=0 mode=fwd gdt=same layout=contiguous G=1
// seed=3".
//   mode   fwd: gradients in the forward call (grad_scale = G); bwd: forward (loss, lse), then chunk_loss_bwd
//          with dloss = G; none: forward only.
//   mag    standard deviation of the logits (30 for "huge logits"); ignored: fraction of ignored rows (1 = all).
//   gdt    same: gradients in the input dtype; f32: f32 gradients (accumulated in place).
//   layout contiguous, or padded (every row stride padded, a descriptor offset; strided target and bias).
// Expectation: the float64 reference (chunk_loss_reference) on the rounded inputs. "Naive": the
// straightforward same-dtype composition (logits rounded to the dtype, CE in f32, dlogits rounded to the dtype,
// GEMMs accumulated in f32 and rounded), i.e. F.linear + cross_entropy + autograd in that dtype.
#include <fmt/format.h>
#include <oneapi/dnnl/dnnl.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#if STRATA_WITH_CUDA
#include <cublas_v2.h>
#endif

#include "ops/loss/chunk_loss/chunk_loss.h"
#include "strata/ops/chunk_loss.h"
#include "testkit/testkit.h"

namespace strata::atk {
namespace {

constexpr const char* kOp = "chunk_loss";

struct Opts {
  strata_chunk_loss_options o;
  std::string mode;
  bool bias, f32_grads, padded;
  double G;
};

Opts opts_of(const Case& c) {
  Opts r;
  strata_chunk_loss_options_init(&r.o);
  r.o.ignore_index = c.get_int("ignore_index", -100);
  r.o.reduction = c.get("reduction", "mean") == "sum" ? STRATA_CHUNK_LOSS_SUM : STRATA_CHUNK_LOSS_MEAN;
  r.o.label_smoothing = static_cast<float>(c.get_double("eps", 0));
  r.o.logit_scale = static_cast<float>(c.get_double("scale", 1));
  r.o.softcap = static_cast<float>(c.get_double("softcap", 0));
  r.o.lse_square_scale = static_cast<float>(c.get_double("zloss", 0));
  const std::string s = c.get("strategy", "auto");
  r.o.strategy = s == "token_chunked" ? STRATA_CHUNK_LOSS_TOKEN_CHUNKED
                 : s == "vocab_tiled" ? STRATA_CHUNK_LOSS_VOCAB_TILED
                                      : STRATA_CHUNK_LOSS_AUTO;
  r.o.chunk_rows = c.get_int("rows", 0);
  r.o.vocab_tile = c.get_int("vtile", 0);
  r.mode = c.get("mode", "fwd");
  r.G = c.get_double("G", 1.0);
  if (r.mode == "fwd") r.o.grad_scale = static_cast<float>(r.G);
  r.bias = c.get_int("bias", 0) != 0;
  r.f32_grads = c.get("gdt", "same") == "f32";
  r.padded = c.get("layout", "contiguous") == "padded";
  return r;
}

// A [rows, cols] (or [rows] when cols < 0) host tensor, optionally with padded strides and an offset.
HostTensor make2(int32_t dt, int64_t rows, int64_t cols, bool padded) {
  HostTensor t;
  t.desc.dtype = dt;
  t.desc.device = {STRATA_DEVICE_CPU, 0};
  t.desc.offset = padded ? 3 : 0;
  if (cols < 0) {
    t.desc.rank = 1;
    t.desc.shape[0] = rows;
    t.desc.strides[0] = padded ? 2 : 1;
  } else {
    t.desc.rank = 2;
    t.desc.shape[0] = rows;
    t.desc.shape[1] = cols;
    t.desc.strides[0] = cols + (padded ? 5 : 0);
    t.desc.strides[1] = 1;
  }
  const int64_t span = t.desc.offset + (cols < 0 ? rows * t.desc.strides[0] : rows * t.desc.strides[0]) + 1;
  t.storage.assign(static_cast<size_t>(span) * dtype_size(dt), 0);
  return t;
}

// Params over host tensors (descriptor offsets applied), for the reference and the naive composition.
loss::ChunkLossParams host_params(const HostTensor& h, const HostTensor& w, const HostTensor* b, const HostTensor& t,
                                  const Opts& op) {
  loss::ChunkLossParams p;
  auto at = [](const HostTensor& x) {
    return static_cast<const void*>(x.storage.data() + x.desc.offset * static_cast<int64_t>(dtype_size(x.desc.dtype)));
  };
  p.hidden = at(h);
  p.weight = at(w);
  p.bias = b ? at(*b) : nullptr;
  p.target = static_cast<const int64_t*>(at(t));
  p.h_dtype = h.desc.dtype;
  p.w_dtype = w.desc.dtype;
  p.N = h.desc.shape[0];
  p.D = h.desc.shape[1];
  p.V = w.desc.shape[0];
  p.ld_h = h.desc.strides[0];
  p.ld_w = w.desc.strides[0];
  p.bias_stride = b ? b->desc.strides[0] : 1;
  p.target_stride = t.desc.strides[0];
  p.ce = loss::ce_consts(loss::CeOptions{op.o.logit_scale, op.o.softcap, op.o.label_smoothing,
                                         op.o.lse_square_scale, op.o.ignore_index},
                         p.V);
  p.reduction = op.o.reduction;
  p.grad_scale = static_cast<float>(op.G);
  return p;
}

struct Expect {
  std::vector<double> loss, lse, dh, dw, db;
};

// float64 truth: the reference on f64 copies of the rounded inputs.
Expect reference(const loss::ChunkLossParams& in, bool grad) {
  const int64_t N = in.N, D = in.D, V = in.V;
  std::vector<double> h(N * D), w(V * D), b(in.bias ? V : 0);
  for (int64_t i = 0; i < N; ++i)
    for (int64_t k = 0; k < D; ++k) h[i * D + k] = load_elem(in.hidden, in.h_dtype, i * in.ld_h + k);
  for (int64_t j = 0; j < V; ++j)
    for (int64_t k = 0; k < D; ++k) w[j * D + k] = load_elem(in.weight, in.w_dtype, j * in.ld_w + k);
  for (int64_t j = 0; j < static_cast<int64_t>(b.size()); ++j) b[j] = load_elem(in.bias, in.w_dtype, j * in.bias_stride);
  Expect e;
  e.loss.resize(1);
  e.lse.resize(N);
  if (grad) {
    e.dh.resize(N * D);
    e.dw.resize(V * D);
    if (in.bias) e.db.resize(V);
  }
  loss::ChunkLossParams p = in;
  p.hidden = h.data();
  p.weight = w.data();
  p.bias = in.bias ? b.data() : nullptr;
  p.h_dtype = p.w_dtype = p.stat_dtype = STRATA_DTYPE_F64;
  p.ld_h = p.ld_w = D;
  p.bias_stride = 1;
  p.loss = e.loss.data();
  p.lse = e.lse.data();
  p.lse_stride = 1;
  if (grad) {
    p.dhidden = e.dh.data();
    p.dweight = e.dw.data();
    p.dbias = in.bias ? e.db.data() : nullptr;
    p.dh_dtype = p.dw_dtype = p.db_dtype = STRATA_DTYPE_F64;
    p.ld_dh = p.ld_dw = D;
    p.db_stride = 1;
  }
  check(loss::chunk_loss_reference(p), "reference");
  return e;
}

// The same-dtype composition (see the file comment).
Expect naive(const loss::ChunkLossParams& in, bool grad, int32_t gdt) {
  const int64_t N = in.N, D = in.D, V = in.V;
  const int32_t dt = in.h_dtype;
  const loss::CeConsts& o = in.ce;
  Expect e;
  e.loss.assign(1, 0.0);
  e.lse.resize(N);
  std::vector<float> z(N * V), dz(N * V, 0.f);
  int64_t valid = 0;
  for (int64_t i = 0; i < N; ++i) valid += in.target[i * in.target_stride] != o.ignore_index;
  const float a = in.reduction == loss::kReduceMean ? (valid ? 1.f / static_cast<float>(valid) : 0.f) : 1.f;
  float total = 0.f;
  for (int64_t i = 0; i < N; ++i) {
    for (int64_t j = 0; j < V; ++j) {
      float s = 0.f;
      for (int64_t k = 0; k < D; ++k)
        s += static_cast<float>(load_elem(in.hidden, dt, i * in.ld_h + k) * load_elem(in.weight, dt, j * in.ld_w + k));
      if (in.bias) s = static_cast<float>(round_to(dt, s)) + static_cast<float>(load_elem(in.bias, dt, j * in.bias_stride));
      z[i * V + j] = static_cast<float>(round_to(dt, s));
    }
    loss::CeRowStats st;
    const int64_t y = in.target[i * in.target_stride];
    for (int64_t j = 0; j < V; ++j) loss::ce_stats_add(st, loss::ce_logit(o, z[i * V + j]), j == y);
    const float lse = loss::ce_lse(st.lse);
    e.lse[i] = lse;
    if (y == o.ignore_index) continue;
    total += loss::ce_row_loss(o, st, V);
    if (!grad) continue;
    const loss::CeGradRow g = loss::ce_grad_row(o, lse, a * in.grad_scale);
    for (int64_t j = 0; j < V; ++j)
      dz[i * V + j] = static_cast<float>(round_to(dt, loss::ce_grad_from_logit(o, g, loss::ce_logit(o, z[i * V + j]), j == y)));
  }
  e.loss[0] = total * a;
  if (!grad) return e;
  e.dh.resize(N * D);
  e.dw.resize(V * D);
  for (int64_t i = 0; i < N; ++i)
    for (int64_t k = 0; k < D; ++k) {
      float s = 0.f;
      for (int64_t j = 0; j < V; ++j) s += dz[i * V + j] * static_cast<float>(load_elem(in.weight, dt, j * in.ld_w + k));
      e.dh[i * D + k] = round_to(gdt, s);
    }
  for (int64_t j = 0; j < V; ++j)
    for (int64_t k = 0; k < D; ++k) {
      float s = 0.f;
      for (int64_t i = 0; i < N; ++i) s += dz[i * V + j] * static_cast<float>(load_elem(in.hidden, dt, i * in.ld_h + k));
      e.dw[j * D + k] = round_to(gdt, s);
    }
  if (in.bias) {
    e.db.resize(V);
    for (int64_t j = 0; j < V; ++j) {
      float s = 0.f;
      for (int64_t i = 0; i < N; ++i) s += dz[i * V + j];
      e.db[j] = round_to(gdt, s);
    }
  }
  return e;
}

class ChunkLossHarness final : public OpHarness {
 public:
  std::string op() const override { return kOp; }

  std::vector<Case> conformance_cases() const override {
    std::vector<Case> cases;
    int64_t seed = 1;
    auto add = [&](const char* dt, int64_t N, int64_t D, int64_t V, const std::string& extra) {
      Case c(kOp);
      c.set("dtype", dt).set("N", N).set("D", D).set("V", V);
      // extra: "k=v k=v" pairs
      size_t pos = 0;
      while (pos < extra.size()) {
        size_t end = extra.find(' ', pos);
        if (end == std::string::npos) end = extra.size();
        const std::string kv = extra.substr(pos, end - pos);
        const size_t eq = kv.find('=');
        if (eq != std::string::npos) c.set(kv.substr(0, eq), kv.substr(eq + 1));
        pos = end + 1;
      }
      c.set("seed", seed++);
      cases.push_back(c);
    };
    // Both strategies (small forced chunks/tiles so several chunks and tiles run, and auto sizes) x every
    // dtype x the awkward sizes: V not a multiple of the tile, V = 1, N = 1, tails.
    for (const char* dt : {"f32", "bf16", "f16"})
      for (const char* strat : {"token_chunked", "vocab_tiled"}) {
        const std::string s = fmt::format("strategy={} ", strat);
        add(dt, 65, 64, 97, s + "rows=16 vtile=40 ignored=0.2");
        add(dt, 63, 48, 1025, s + "ignored=0.1 bias=1");
        add(dt, 1, 32, 97, s + "rows=1 vtile=16");
        add(dt, 33, 16, 1, s + "rows=8 vtile=1 bias=1");
        add(dt, 97, 33, 300, s + "rows=32 vtile=128 mode=bwd G=1.7 bias=1 ignored=0.3");
        add(dt, 40, 64, 250, s + "rows=16 vtile=64 eps=0.1 ignored=0.2");
        add(dt, 40, 64, 250, s + "rows=16 vtile=64 zloss=0.01");
        add(dt, 40, 64, 250, s + "rows=16 vtile=64 softcap=20 mag=30");
        add(dt, 40, 64, 250, s + "rows=16 vtile=64 mag=30");
        add(dt, 40, 64, 250, s + "rows=16 vtile=64 scale=0.5 reduction=sum G=0.25");
        add(dt, 40, 64, 250, s + "rows=16 vtile=64 ignored=1");
        add(dt, 40, 64, 250, s + "rows=16 vtile=64 gdt=f32 bias=1 layout=padded");
        add(dt, 40, 64, 250, s + "rows=16 vtile=64 mode=none layout=padded");
        add(dt, 50, 40, 130, s + "eps=0.05 zloss=0.001 softcap=15 scale=0.7 mag=8 bias=1 ignored=0.25 ignore_index=-1");
      }
    // Plan-chosen strategy and sizes, the backward op with f32 gradients, f64 (the reference only), empty and
    // degenerate problems.
    add("bf16", 70, 64, 500, "strategy=auto bias=1 eps=0.1");
    add("f32", 70, 64, 500, "strategy=auto mode=bwd gdt=f32 G=-2");
    add("f64", 30, 16, 50, "strategy=auto bias=1 eps=0.1 softcap=10 zloss=0.01 ignored=0.2");
    // vocab_tiled with the plan's token block (CUDA bf16: one block of all rows, dW tiles stored directly, the
    // f32 dH accumulator in dweight's last rows with the deferred tiles recomputed at the end; the tile width
    // forced so that several tiles run and only the last ones are deferred).
    add("bf16", 64, 64, 4000, "strategy=vocab_tiled vtile=512 bias=1 eps=0.1 ignored=0.1");
    add("bf16", 64, 64, 4000, "strategy=vocab_tiled vtile=512 mode=bwd G=1.3 ignored=0.2");
    add("bf16", 64, 64, 4000, "strategy=vocab_tiled vtile=1000 softcap=15 mag=8 zloss=0.001");
    add("bf16", 96, 32, 3001, "strategy=vocab_tiled reduction=sum scale=0.8");
    add("f16", 64, 64, 4000, "strategy=vocab_tiled vtile=512 bias=1 eps=0.1");
    // Session 15 (CUDA bf16): D >= the tile width, so dhidden's storage holds a logits tile and tile 0 stays in the
    // workspace tile from the forward to the backward (14 of 32 tiles kept, the forward's others in dhidden).
    add("bf16", 256, 128, 4000, "strategy=vocab_tiled vtile=128 bias=1 eps=0.1 ignored=0.1");
    // Huge logits (ops_fused.md's "a row with huge logits +-1e4"): mag = 3000 gives logits of standard deviation
    // ~3000, the largest ~1e4; each strategy, softcap off and on, every device.
    for (const char* strat : {"token_chunked", "vocab_tiled"})
      for (const char* cap : {"0", "30"}) {
        add("f32", 24, 16, 300, fmt::format("strategy={} rows=8 vtile=128 mag=3000 softcap={} bias=1", strat, cap));
        add("bf16", 24, 16, 300, fmt::format("strategy={} rows=8 vtile=128 mag=3000 softcap={} eps=0.1", strat, cap));
      }
    // CUDA only, the spec's sizes (ops_fused.md §2: D = 4096, V = 151936) in float64, one large dimension at a
    // time: the float64 reference and the naive composition are host loops (N x V x D multiply-adds, three
    // times), so the full N = 32 x D = 4096 x V = 151936 product (6e10 per check, minutes on one core) is not
    // run; D = 4096 (dH, dW and the logits accumulate over the spec's hidden size) and V = 151936 (the row
    // statistics and dH over the spec's vocabulary, many vocabulary tiles) are, each strategy at its auto sizes.
    for (const char* strat : {"token_chunked", "vocab_tiled"}) {
      add("bf16", 32, 4096, 4099, fmt::format("strategy={} bias=1 eps=0.1 ignored=0.1 gpu_only=1", strat));
      add("bf16", 8, 128, 151936, fmt::format("strategy={} ignored=0.1 zloss=0.001 gpu_only=1", strat));
    }
    add("f32", 0, 16, 10, "bias=1");
    add("bf16", 0, 16, 10, "strategy=vocab_tiled mode=bwd bias=1");
    add("f32", 5, 0, 7, "bias=1");
    return cases;
  }

  CaseResult run_case(const Case& c, strata_device device) const override {
    const int32_t dt = dtype_from_name(c.get("dtype"));
    CaseResult r;
    if (dt == STRATA_DTYPE_F64 && device.type != STRATA_DEVICE_CPU) {
      r.skipped = true;
      r.message = "f64 runs on the CPU only";
      return r;
    }
    if (c.get_int("gpu_only", 0) != 0 && device.type == STRATA_DEVICE_CPU) {
      r.skipped = true;
      r.message = "a CUDA-only case (spec-size D or V: the CPU paths are covered by the small ones)";
      return r;
    }
    const Opts op = opts_of(c);
    const int64_t N = c.get_int("N"), D = c.get_int("D"), V = c.get_int("V");
    const double mag = c.get_double("mag", 3.0), ignored = c.get_double("ignored", 0.0);
    std::mt19937_64 rng(static_cast<uint64_t>(c.get_int("seed", 1)));
    const int32_t sdt = dt == STRATA_DTYPE_F64 ? STRATA_DTYPE_F64 : STRATA_DTYPE_F32;
    const int32_t gdt = op.f32_grads ? STRATA_DTYPE_F32 : dt;
    const bool grad = op.mode != "none";

    HostTensor h = make2(dt, N, D, op.padded), w = make2(dt, V, D, op.padded);
    h.fill_normal(rng, 0.0, 1.0);
    w.fill_normal(rng, 0.0, D > 0 ? mag / std::sqrt(static_cast<double>(D)) : 1.0);
    HostTensor b = make2(dt, V, -1, op.padded);
    b.fill_normal(rng, 0.0, 1.0);
    HostTensor t = make2(STRATA_DTYPE_I64, N, -1, op.padded);
    std::uniform_int_distribution<int64_t> cls(0, V - 1);
    std::uniform_real_distribution<double> u01(0.0, 1.0);
    for (int64_t i = 0; i < N; ++i)
      t.set(i, static_cast<double>(u01(rng) < ignored ? op.o.ignore_index : cls(rng)));
    HostTensor loss = HostTensor::make(sdt, {}), lse = make2(sdt, N, -1, op.padded);
    HostTensor dh = make2(gdt, N, D, op.padded), dw = make2(gdt, V, D, op.padded), db = make2(gdt, V, -1, op.padded);
    HostTensor g = HostTensor::make(sdt, {});
    g.set(0, op.G);
    for (HostTensor* x : {&loss, &lse, &dh, &dw, &db}) x->poison();

    const loss::ChunkLossParams hp = host_params(h, w, op.bias ? &b : nullptr, t, op);
    const Expect ref = reference(hp, grad);
    const Expect nv = naive(hp, grad, gdt);

    DeviceTensor d_h(h, device), d_w(w, device), d_b(b, device), d_t(t, device), d_loss(loss, device),
        d_lse(lse, device), d_dh(dh, device), d_dw(dw, device), d_db(db, device), d_g(g, device);
    const strata_tensor_desc* bias_d = op.bias ? &d_b.desc() : nullptr;
    strata_plan plan = nullptr;
    strata_status st = STRATA_SUCCESS;
    auto run_plan = [&](std::vector<void*> ptrs) {
      size_t ws_size = 0;
      strata_plan_workspace_size(plan, &ws_size);
      void* ws = nullptr;
      if (ws_size) check(strata_malloc(device, ws_size, nullptr, &ws), "workspace");
      st = strata_plan_run(plan, ptrs.data(), static_cast<int32_t>(ptrs.size()), ws, ws_size, nullptr);
      strata_device_synchronize(device);
      if (ws) strata_free(ws);
      r.impl = strata_plan_impl_name(plan);
      strata_plan_destroy(plan);
      check(st, "run");
    };
    const bool fwd_grad = op.mode == "fwd";
    check(strata_chunk_loss_plan(&d_h.desc(), &d_w.desc(), bias_d, &d_t.desc(), &d_loss.desc(), &d_lse.desc(),
                                 fwd_grad ? &d_dh.desc() : nullptr, fwd_grad ? &d_dw.desc() : nullptr,
                                 fwd_grad && op.bias ? &d_db.desc() : nullptr, &op.o, &plan),
          "plan");
    // Pointers for the tensors planned only: strata_plan_run rejects one for a tensor the plan was made without.
    void* const bias_p = op.bias ? d_b.data() : nullptr;
    void* const dbias_p = op.bias ? d_db.data() : nullptr;
    run_plan({d_h.data(), d_w.data(), bias_p, d_t.data(), d_loss.data(), d_lse.data(), fwd_grad ? d_dh.data() : nullptr,
              fwd_grad ? d_dw.data() : nullptr, fwd_grad ? dbias_p : nullptr});
    if (op.mode == "bwd") {
      check(strata_chunk_loss_bwd_plan(&d_h.desc(), &d_w.desc(), bias_d, &d_t.desc(), &d_lse.desc(), &d_g.desc(),
                                       &d_dh.desc(), &d_dw.desc(), op.bias ? &d_db.desc() : nullptr, &op.o, &plan),
            "bwd plan");
      run_plan({d_h.data(), d_w.data(), bias_p, d_t.data(), d_lse.data(), d_g.data(), d_dh.data(), d_dw.data(),
                dbias_p});
    }
    d_loss.download(loss);
    d_lse.download(lse);
    const double dd = static_cast<double>(std::max<int64_t>(D, 1)), dv = static_cast<double>(V);
    r.compares.push_back(compare("loss", loss.values(), ref.loss, nv.loss, dt, dv));
    r.compares.push_back(compare("lse", lse.values(), ref.lse, nv.lse, dt, dv));
    if (grad) {
      d_dh.download(dh);
      d_dw.download(dw);
      r.compares.push_back(compare("dhidden", dh.values(), ref.dh, nv.dh, dt, dv));
      r.compares.push_back(compare("dweight", dw.values(), ref.dw, nv.dw, dt, std::max<double>(N, 1)));
      if (op.bias) {
        d_db.download(db);
        r.compares.push_back(compare("dbias", db.values(), ref.db, nv.db, dt, std::max<double>(N, 1)));
      }
      (void)dd;
    }
    r.pass = std::all_of(r.compares.begin(), r.compares.end(), [](const Compare& x) { return x.pass; });
    return r;
  }

  std::vector<BenchCase> bench_cases(strata_device device) const override {
    const bool cuda = device.type == STRATA_DEVICE_CUDA;
    std::vector<BenchCase> out;
    if (cuda) {
#if STRATA_WITH_CUDA
      out.push_back(cublas_peer(device, 8192, 4096, 151936));
#endif
      out.push_back(bench_case(device, STRATA_DTYPE_BF16, 8192, 4096, 151936, false));
      out.push_back(bench_case(device, STRATA_DTYPE_BF16, 8192, 4096, 151936, true));
      // The 3-GEMM loop with chunks of 2048 rows (0.6 GB of bf16 logits: far over the 64 MiB budget), to
      // measure what the recompute of vocab_tiled costs against it.
      out.push_back(bench_case(device, STRATA_DTYPE_BF16, 8192, 4096, 151936, true, STRATA_CHUNK_LOSS_TOKEN_CHUNKED, 2048));
    } else {
      out.push_back(sgemm_peer(1024, 1024, 32000));
      out.push_back(bench_case(device, STRATA_DTYPE_F32, 1024, 1024, 32000, true));
      out.push_back(bench_case(device, STRATA_DTYPE_BF16, 1024, 1024, 32000, true));
    }
    return out;
  }

 private:
  struct BenchState {
    std::unique_ptr<DeviceTensor> h, w, t, loss, lse, dh, dw;
    strata_plan plan = nullptr;
    void* ws = nullptr;
    size_t ws_size = 0;
  };

  // The ceiling of the CPU target: oneDNN's own (multi-threaded) dnnl_sgemm on the same three GEMMs with the
  // [N, V] logits materialised: Z = H W^T, dH = Z W, dW = Z^T H.
  static BenchCase sgemm_peer(int64_t N, int64_t D, int64_t V) {
    struct Bufs {
      std::vector<float> h, w, z, dh, dw;
    };
    auto b = std::make_shared<Bufs>();
    BenchCase c;
    c.label = fmt::format("chunk_loss peer: oneDNN dnnl_sgemm x3 (materialised logits) N={} D={} V={}", N, D, V);
    c.flops = 3.0 * 2.0 * static_cast<double>(N) * static_cast<double>(V) * static_cast<double>(D);
    c.bytes = 4.0 * static_cast<double>(N * D + V * D) * 2;
    c.setup = [=] {
      std::mt19937_64 rng(3);
      std::normal_distribution<float> nd(0.f, 1.f);
      b->h.resize(N * D);
      b->w.resize(V * D);
      for (float& x : b->h) x = nd(rng);
      for (float& x : b->w) x = nd(rng) * 0.03f;
      b->z.assign(N * V, 0.f);
      b->dh.assign(N * D, 0.f);
      b->dw.assign(V * D, 0.f);
    };
    c.run = [=] {
      dnnl_sgemm('N', 'T', N, V, D, 1.f, b->h.data(), D, b->w.data(), D, 0.f, b->z.data(), V);
      dnnl_sgemm('N', 'N', N, D, V, 1.f, b->z.data(), V, b->w.data(), D, 0.f, b->dh.data(), D);
      dnnl_sgemm('T', 'N', V, D, N, 1.f, b->z.data(), V, b->h.data(), D, 0.f, b->dw.data(), D);
    };
    c.teardown = [=] { *b = Bufs{}; };
    return c;
  }

#if STRATA_WITH_CUDA
  // The ceiling of the CUDA target: cuBLAS alone on the same three GEMMs with the [N, V] logits materialised
  // in bf16 (2.5 GB: no memory bound, no epilogue): Z = H W^T, dH = Z W, dW = Z^T H, bf16 operands and
  // outputs with f32 accumulation (what chunk_loss's GEMMs do). Each GEMM's share is a third of the FLOPs.
  static BenchCase cublas_peer(strata_device device, int64_t N, int64_t D, int64_t V) {
    struct Bufs {
      std::unique_ptr<DeviceTensor> h, w;
      void *z = nullptr, *dh = nullptr, *dw = nullptr;
      cublasHandle_t handle = nullptr;
    };
    auto b = std::make_shared<Bufs>();
    BenchCase c;
    c.label = fmt::format("chunk_loss peer: cuBLAS bf16 GEMMs x3 (materialised bf16 logits) N={} D={} V={}", N, D, V);
    c.flops = 3.0 * 2.0 * static_cast<double>(N) * static_cast<double>(V) * static_cast<double>(D);
    c.bytes = 2.0 * static_cast<double>(N * D + V * D) * 2;
    c.setup = [=] {
      HostTensor h = HostTensor::make(STRATA_DTYPE_BF16, {N, D}), w = HostTensor::make(STRATA_DTYPE_BF16, {V, D});
      std::mt19937_64 rng(7);
      h.fill_normal(rng, 0.0, 1.0);
      const int64_t blk = std::min<int64_t>(V, 4096);  // a random block of weight rows repeated (as bench_case)
      HostTensor wb = HostTensor::make(STRATA_DTYPE_BF16, {blk, D});
      wb.fill_normal(rng, 0.0, 3.0 / std::sqrt(static_cast<double>(D)));
      for (int64_t r0 = 0; r0 < V; r0 += blk)
        std::memcpy(w.storage.data() + r0 * D * 2, wb.storage.data(), static_cast<size_t>(std::min(blk, V - r0) * D) * 2);
      b->h = std::make_unique<DeviceTensor>(h, device);
      b->w = std::make_unique<DeviceTensor>(w, device);
      check(strata_malloc(device, static_cast<size_t>(N * V) * 2, nullptr, &b->z), "peer logits");
      check(strata_malloc(device, static_cast<size_t>(N * D) * 2, nullptr, &b->dh), "peer dhidden");
      check(strata_malloc(device, static_cast<size_t>(V * D) * 2, nullptr, &b->dw), "peer dweight");
      if (cublasCreate(&b->handle) != CUBLAS_STATUS_SUCCESS) check(STRATA_ERROR_RUNTIME, "peer cublasCreate");
    };
    c.run = [=] {
      const float one = 1.f, zero = 0.f;
      const int n = static_cast<int>(N), d = static_cast<int>(D), v = static_cast<int>(V);
      const void *H = b->h->data(), *W = b->w->data();
      // Row-major C[M, K'] = op(A) op(B) as the column-major C^T = op(B)^T op(A)^T (as the backend does).
      cublasStatus_t st = cublasGemmEx(b->handle, CUBLAS_OP_T, CUBLAS_OP_N, v, n, d, &one, W, CUDA_R_16BF, d, H,
                                       CUDA_R_16BF, d, &zero, b->z, CUDA_R_16BF, v, CUBLAS_COMPUTE_32F,
                                       CUBLAS_GEMM_DEFAULT);  // Z = H W^T
      if (st == CUBLAS_STATUS_SUCCESS)
        st = cublasGemmEx(b->handle, CUBLAS_OP_N, CUBLAS_OP_N, d, n, v, &one, W, CUDA_R_16BF, d, b->z, CUDA_R_16BF, v,
                          &zero, b->dh, CUDA_R_16BF, d, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);  // dH = Z W
      if (st == CUBLAS_STATUS_SUCCESS)
        st = cublasGemmEx(b->handle, CUBLAS_OP_N, CUBLAS_OP_T, d, v, n, &one, H, CUDA_R_16BF, d, b->z, CUDA_R_16BF, v,
                          &zero, b->dw, CUDA_R_16BF, d, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);  // dW = Z^T H
      if (st != CUBLAS_STATUS_SUCCESS) check(STRATA_ERROR_RUNTIME, "peer cublasGemmEx");
    };
    c.teardown = [=] {
      if (b->handle) cublasDestroy(b->handle);
      for (void* p : {b->z, b->dh, b->dw})
        if (p) strata_free(p);
      *b = Bufs{};
    };
    return c;
  }
#endif

  // Forward + backward in one call (the gradients of the forward, bf16 gradients; f32 dweight with f32_dw).
  // strategy / chunk_rows: forced (0: the plan's choice).
  static BenchCase bench_case(strata_device device, int32_t dt, int64_t N, int64_t D, int64_t V, bool f32_dw,
                              int32_t strategy = 0, int64_t chunk_rows = 0) {
    auto state = std::make_shared<BenchState>();
    BenchCase b;
    b.label = fmt::format("chunk_loss fwd+bwd {} N={} D={} V={} dweight={}{}", dtype_name(dt), N, D, V,
                          f32_dw ? "f32" : dtype_name(dt),
                          strategy ? fmt::format(" forced {} rows={}",
                                                 strategy == STRATA_CHUNK_LOSS_TOKEN_CHUNKED ? "token_chunked"
                                                                                              : "vocab_tiled",
                                                 chunk_rows)
                                   : std::string());
    const double es = static_cast<double>(dtype_size(dt));
    b.bytes = es * static_cast<double>(N * D + V * D) * 2 + static_cast<double>(N) * 8;
    b.flops = 3.0 * 2.0 * static_cast<double>(N) * static_cast<double>(V) * static_cast<double>(D);
    b.setup = [=] {
      HostTensor h = HostTensor::make(dt, {N, D}), w = HostTensor::make(dt, {V, D});
      std::mt19937_64 rng(7);
      h.fill_normal(rng, 0.0, 1.0);
      // A random block of 4096 weight rows repeated over V (drawing 600M normals would take the harness's
      // whole time budget on the host).
      const int64_t blk = std::min<int64_t>(V, 4096);
      HostTensor wb = HostTensor::make(dt, {blk, D});
      wb.fill_normal(rng, 0.0, 3.0 / std::sqrt(static_cast<double>(D)));
      for (int64_t r0 = 0; r0 < V; r0 += blk) {
        const int64_t n = std::min(blk, V - r0);
        std::memcpy(w.storage.data() + r0 * D * static_cast<int64_t>(dtype_size(dt)), wb.storage.data(),
                    static_cast<size_t>(n * D) * dtype_size(dt));
      }
      HostTensor t = HostTensor::make(STRATA_DTYPE_I64, {N});
      for (int64_t i = 0; i < N; ++i) t.set(i, static_cast<double>((i * 7919) % V));
      HostTensor loss = HostTensor::make(STRATA_DTYPE_F32, {}), lse = HostTensor::make(STRATA_DTYPE_F32, {N});
      HostTensor dh = HostTensor::make(dt, {N, D}), dw = HostTensor::make(f32_dw ? STRATA_DTYPE_F32 : dt, {V, D});
      state->h = std::make_unique<DeviceTensor>(h, device);
      state->w = std::make_unique<DeviceTensor>(w, device);
      state->t = std::make_unique<DeviceTensor>(t, device);
      state->loss = std::make_unique<DeviceTensor>(loss, device);
      state->lse = std::make_unique<DeviceTensor>(lse, device);
      state->dh = std::make_unique<DeviceTensor>(dh, device);
      state->dw = std::make_unique<DeviceTensor>(dw, device);
      strata_chunk_loss_options o;
      strata_chunk_loss_options_init(&o);
      o.strategy = strategy;
      o.chunk_rows = chunk_rows;
      check(strata_chunk_loss_plan(&state->h->desc(), &state->w->desc(), nullptr, &state->t->desc(),
                                   &state->loss->desc(), &state->lse->desc(), &state->dh->desc(), &state->dw->desc(),
                                   nullptr, &o, &state->plan),
            "bench plan");
      strata_plan_workspace_size(state->plan, &state->ws_size);
      if (state->ws_size) check(strata_malloc(device, state->ws_size, nullptr, &state->ws), "bench workspace");
      std::fprintf(stderr, "[chunk_loss bench] %s: impl %s, workspace %.1f MiB\n", dtype_name(dt),
                   strata_plan_impl_name(state->plan), static_cast<double>(state->ws_size) / (1 << 20));
    };
    b.run = [state] {
      void* t[] = {state->h->data(), state->w->data(), nullptr, state->t->data(), state->loss->data(),
                   state->lse->data(), state->dh->data(), state->dw->data(), nullptr};
      check(strata_plan_run(state->plan, t, 9, state->ws, state->ws_size, nullptr), "bench run");
    };
    b.teardown = [state] {
      strata_plan_destroy(state->plan);
      if (state->ws) strata_free(state->ws);
      state->h.reset();
      state->w.reset();
      state->t.reset();
      state->loss.reset();
      state->lse.reset();
      state->dh.reset();
      state->dw.reset();
    };
    return b;
  }
};

}  // namespace

std::unique_ptr<OpHarness> make_chunk_loss_harness() { return std::make_unique<ChunkLossHarness>(); }

}  // namespace strata::atk
