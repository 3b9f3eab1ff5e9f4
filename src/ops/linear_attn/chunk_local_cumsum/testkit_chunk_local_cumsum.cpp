// ATK harness of chunk_local_cumsum: conformance cases, the float64 comparison, benchmark cases.
//
// A case line: "chunk_local_cumsum dtype=bf16 odtype=f32 shape=2x65x3x8 chunk=32 reverse=1 scale=0.5
// cu=none layout=padded seed=7". shape is [B, T, H] (scalar gates) or [B, T, H, S] (vector gates); cu is
// "none" or the cu_seqlens values joined by '-' (then B = 1 and T = the last value). Layouts:
//   contiguous  row-major;
//   padded      atk::Layout::kPaddedRows for g and out (every dimension padded; the lanes of vector gates
//               are then strided, those of scalar gates stay dense with padded rows);
//   strided     atk::Layout::kStridedCols for g and out (last dimension stride 2);
//   tpad        g and out dense in (H, S) with token stride H*S + 7, batch padding and an offset (a slice
//               of a wider tensor): the vector path on non-contiguous tensors;
//   transposed  g stored [B, H, T(, S)] and viewed as [B, T, H(, S)]; out contiguous.
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <sstream>

#include "testkit/testkit.h"

namespace strata::atk {
namespace {

constexpr const char* kOp = "chunk_local_cumsum";

std::vector<int64_t> parse_cu(const std::string& s) {
  std::vector<int64_t> v;
  if (s.empty() || s == "none") return v;
  std::stringstream ss(s);
  std::string part;
  while (std::getline(ss, part, '-')) v.push_back(std::stoll(part));
  return v;
}
std::string cu_arg(const std::vector<int64_t>& cu) {
  return cu.empty() ? "none" : fmt::format("{}", fmt::join(cu, "-"));
}

// A host tensor viewing its own storage through the given strides and offset.
HostTensor make_view(int32_t dtype, const std::vector<int64_t>& shape, const std::vector<int64_t>& strides,
                     int64_t offset) {
  HostTensor t;
  t.desc.dtype = dtype;
  t.desc.rank = static_cast<int32_t>(shape.size());
  t.desc.device = {STRATA_DEVICE_CPU, 0};
  t.desc.offset = offset;
  int64_t span = offset + 1;
  for (size_t i = 0; i < shape.size(); ++i) {
    t.desc.shape[i] = shape[i];
    t.desc.strides[i] = strides[i];
    if (shape[i] == 0) span = 0;
    if (span) span += (shape[i] - 1) * strides[i];
  }
  if (span == 0) span = offset + 1;
  t.storage.assign(static_cast<size_t>(span) * dtype_size(dtype), 0);
  return t;
}

HostTensor make_layout(int32_t dtype, const std::vector<int64_t>& shape, const std::string& layout, bool is_g) {
  const int64_t B = shape[0], T = shape[1], H = shape[2], S = shape.size() == 4 ? shape[3] : 1;
  if (layout == "tpad") {
    std::vector<int64_t> st = {T * (H * S + 7) + 3, H * S + 7, S, 1};
    st.resize(shape.size());
    return make_view(dtype, shape, st, 5);
  }
  if (layout == "transposed" && is_g) {
    // storage [B, H, T, S]: token stride S, head stride T * S.
    std::vector<int64_t> st = {H * T * S, S, T * S, 1};
    st.resize(shape.size());
    return make_view(dtype, shape, st, 0);
  }
  if (layout == "padded" || layout == "strided") return HostTensor::make(dtype, shape, layout_from_name(layout));
  return HostTensor::make(dtype, shape);
}

// float64 expectation and the naive same-dtype computation (f32 accumulation, f64 for f64 g, in t order,
// scale after the sum, one rounding to the output dtype), both on the rounded inputs gv [B, T, L] row-major.
void expected(const std::vector<double>& gv, const std::vector<int64_t>& shape, const std::vector<int64_t>& cu,
              int64_t C, bool reverse, double scale, int32_t g_dtype, int32_t out_dtype, std::vector<double>& ref,
              std::vector<double>& naive) {
  const int64_t B = shape[0], T = shape[1], L = shape[2] * (shape.size() == 4 ? shape[3] : 1);
  ref.assign(gv.size(), 0.0);
  naive.assign(gv.size(), 0.0);
  auto scan = [&](int64_t b, int64_t bos, int64_t eos) {
    for (int64_t cs = bos; cs < eos; cs += C) {
      const int64_t ce = std::min(cs + C, eos);
      for (int64_t l = 0; l < L; ++l) {
        double acc = 0.0, acc_naive = 0.0;
        float acc_f32 = 0.f;
        for (int64_t i = 0; i < ce - cs; ++i) {
          const int64_t t = reverse ? ce - 1 - i : cs + i;
          const size_t e = static_cast<size_t>((b * T + t) * L + l);
          acc += gv[e];
          ref[e] = scale * acc;
          if (g_dtype == STRATA_DTYPE_F64) {
            acc_naive += gv[e];
            naive[e] = round_to(out_dtype, acc_naive * scale);
          } else {
            acc_f32 += static_cast<float>(gv[e]);
            naive[e] = round_to(out_dtype, acc_f32 * static_cast<float>(scale));
          }
        }
      }
    }
  };
  if (cu.empty()) {
    for (int64_t b = 0; b < B; ++b) scan(b, 0, T);
  } else {
    for (size_t n = 0; n + 1 < cu.size(); ++n) scan(0, cu[n], cu[n + 1]);
  }
}

class ChunkLocalCumsumHarness final : public OpHarness {
 public:
  std::string op() const override { return kOp; }

  std::vector<Case> conformance_cases() const override {
    std::vector<Case> cases;
    int64_t seed = 1;
    auto add = [&](const char* dt, const char* odt, const std::vector<int64_t>& shape, int64_t chunk, int reverse,
                   double scale, const std::vector<int64_t>& cu, const char* layout) {
      cases.push_back(Case(kOp)
                          .set("dtype", dt)
                          .set("odtype", odt)
                          .set("shape", shape_arg(shape))
                          .set("chunk", chunk)
                          .set("reverse", reverse)
                          .set("scale", fmt::format("{}", scale))
                          .set("cu", cu_arg(cu))
                          .set("layout", layout)
                          .set("seed", seed++));
    };
    // Every dtype x the bug-catching lengths x the pipeline chunk sizes, both directions; gate kind and
    // layout rotate so each combination of them is met across the sweep.
    const char* layouts[] = {"contiguous", "padded", "tpad", "strided", "transposed"};
    int rot = 0;
    for (const char* dt : {"f32", "bf16", "f16", "f64"})
      for (int64_t T : {1, 15, 63, 64, 65, 127, 1000})
        for (int64_t chunk : {16, 32, 64})
          for (int reverse : {0, 1}) {
            const bool vec = rot % 2 == 1;
            const std::vector<int64_t> shape = vec ? std::vector<int64_t>{2, T, 3, 8} : std::vector<int64_t>{2, T, 5};
            add(dt, std::string(dt) == "f64" ? "f64" : "f32", shape, chunk, reverse, 1.0, {}, layouts[rot % 5]);
            ++rot;
          }
    // Scale (fla's 1/ln 2 and a negative one) and low-precision outputs.
    const double inv_ln2 = 1.0 / std::log(2.0);
    for (const char* dt : {"f32", "bf16", "f16"})
      for (int reverse : {0, 1}) {
        add(dt, "f32", {2, 100, 4, 16}, 64, reverse, inv_ln2, {}, "contiguous");
        add(dt, "bf16", {2, 127, 6}, 32, reverse, -0.5, {}, "contiguous");
        add(dt, "f16", {1, 65, 3, 24}, 16, reverse, inv_ln2, {}, "tpad");
        add(dt, "bf16", {3, 63, 2, 8}, 16, reverse, 1.0, {}, "transposed");
      }
    add("f64", "f32", {2, 65, 3}, 16, 0, inv_ln2, {}, "contiguous");
    // Chunk sizes outside the pipelines' 16/32/64: 1, 2, 8, 128, 1024 (longer than T).
    for (int64_t chunk : {1, 2, 8, 128, 1024})
      for (int reverse : {0, 1}) {
        add("f32", "f32", {2, 300, 3}, chunk, reverse, 1.0, {}, "contiguous");
        add("bf16", "f32", {1, 200, 2, 40}, chunk, reverse, 0.25, {}, "padded");
      }
    // Variable-length packs: zero-length sequences (leading, inner, trailing), single tokens, one sequence,
    // sequences shorter and longer than a chunk, starts misaligned with the windows.
    const std::vector<std::vector<int64_t>> packs = {
        {0, 5, 5, 69, 100, 163},
        {0, 1, 2, 3, 40, 41, 100},
        {0, 15},
        {0, 0, 0, 64, 64, 130, 130},
        {0, 1000},
        {0, 1, 3, 6, 10, 15, 21, 28, 36, 45, 55, 66, 78, 91, 105, 120, 136},
        {0, 63, 127, 129, 192, 300, 301, 302, 500}};
    for (const auto& cu : packs)
      for (int64_t chunk : {16, 32, 64})
        for (int reverse : {0, 1}) {
          const bool vec = rot % 2 == 1;
          const int64_t T = cu.back();
          const char* dt = rot % 3 == 0 ? "f32" : (rot % 3 == 1 ? "bf16" : "f64");
          const std::vector<int64_t> shape = vec ? std::vector<int64_t>{1, T, 2, 12} : std::vector<int64_t>{1, T, 4};
          add(dt, std::string(dt) == "f64" ? "f64" : "f32", shape, chunk, reverse, rot % 4 == 0 ? inv_ln2 : 1.0, cu,
              layouts[rot % 5]);
          ++rot;
        }
    add("f32", "f32", {1, 163, 2}, 1, 0, 1.0, {0, 5, 5, 69, 100, 163}, "contiguous");
    add("f32", "f32", {1, 163, 2}, 1024, 1, 1.0, {0, 5, 5, 69, 100, 163}, "contiguous");
    add("f16", "f16", {1, 100, 3, 8}, 32, 1, 2.0, {0, 1, 2, 3, 40, 41, 100}, "contiguous");
    // f32 outputs of 4 MiB and more take the CPU's non-temporal store paths (rows of 1204 lanes: misaligned).
    add("f32", "f32", {1, 1100, 4, 301}, 64, 0, 1.0, {}, "contiguous");
    add("bf16", "f32", {1, 1100, 4, 301}, 32, 1, inv_ln2, {0, 37, 37, 600, 1100}, "tpad");
    add("f32", "f32", {2, 45000, 12}, 64, 1, 1.0, {}, "contiguous");  // narrow 48-byte rows, some aligned
    // bf16 / f16 outputs of 4 MiB and more stream too (32-byte stores on AVX-512): misaligned wide rows (2408
    // bytes) and narrow 24-byte rows.
    add("bf16", "bf16", {1, 2200, 4, 301}, 64, 1, inv_ln2, {}, "contiguous");
    add("f32", "f16", {2, 90000, 12}, 64, 0, 1.0, {}, "contiguous");
    // Empty tensors: no tokens, no heads, no batch, an empty pack.
    add("f32", "f32", {2, 0, 3}, 64, 0, 1.0, {}, "contiguous");
    add("bf16", "f32", {0, 5, 3, 4}, 64, 1, 1.0, {}, "contiguous");
    add("f32", "f32", {2, 7, 0}, 16, 0, 1.0, {}, "contiguous");
    add("f32", "f32", {1, 0, 3}, 64, 0, 1.0, {0}, "contiguous");
    add("f32", "f32", {1, 0, 2, 4}, 32, 1, 1.0, {0, 0, 0}, "contiguous");
    add("f32", "f32", {1, 10, 0}, 32, 0, 1.0, {0, 4, 10}, "contiguous");
    return cases;
  }

  CaseResult run_case(const Case& c, strata_device device) const override {
    const int32_t dt = dtype_from_name(c.get("dtype"));
    const int32_t odt = dtype_from_name(c.get("odtype", "f32"));
    CaseResult r;
    if ((dt == STRATA_DTYPE_F64 || odt == STRATA_DTYPE_F64) && device.type != STRATA_DEVICE_CPU) {
      r.skipped = true;
      r.message = "f64 runs on the CPU only";
      return r;
    }
    const std::vector<int64_t> shape = c.get_shape("shape");
    const std::vector<int64_t> cu = parse_cu(c.get("cu"));
    const int64_t chunk = c.get_int("chunk", 64);
    const bool reverse = c.get_int("reverse") != 0;
    const double scale = static_cast<float>(c.get_double("scale", 1.0));  // the op takes a float
    const std::string layout = c.get("layout", "contiguous");
    std::mt19937_64 rng(static_cast<uint64_t>(c.get_int("seed", 1)));

    // Log-space gates of both signs, magnitudes up to about +-10 (STYLE.md 10), rounded to the dtype.
    HostTensor g = make_layout(dt, shape, layout, true);
    g.fill_normal(rng, -1.0, 3.0);
    HostTensor out = make_layout(odt, shape, layout, false);
    out.poison();
    std::vector<double> ref, naive;
    expected(g.values(), shape, cu, chunk, reverse, scale, dt, odt, ref, naive);

    DeviceTensor d_g(g, device), d_out(out, device);
    std::unique_ptr<DeviceTensor> d_cu;
    if (!cu.empty()) {
      HostTensor h_cu = HostTensor::make(STRATA_DTYPE_I64, {static_cast<int64_t>(cu.size())});
      for (size_t i = 0; i < cu.size(); ++i) h_cu.set(static_cast<int64_t>(i), static_cast<double>(cu[i]));
      d_cu = std::make_unique<DeviceTensor>(h_cu, device);
    }
    strata_plan plan = nullptr;
    check(strata_chunk_local_cumsum_plan(&d_g.desc(), d_cu ? &d_cu->desc() : nullptr, &d_out.desc(),
                                         static_cast<int32_t>(chunk), reverse ? 1 : 0, static_cast<float>(scale),
                                         &plan),
          "plan");
    r.impl = strata_plan_impl_name(plan);
    void* t[] = {d_g.data(), d_cu ? d_cu->data() : nullptr, d_out.data()};
    const strata_status st = strata_plan_run(plan, t, 3, nullptr, 0, nullptr);
    strata_plan_destroy(plan);
    check(st, "run");
    d_out.download(out);
    // Each output sums at most chunk_size inputs.
    const double len = static_cast<double>(std::min<int64_t>(chunk, std::max<int64_t>(shape[1], 1)));
    r.compares.push_back(compare("out", out.values(), ref, naive, odt, len));
    r.pass = r.compares.back().pass;
    return r;
  }

  std::vector<BenchCase> bench_cases(strata_device device) const override {
    const bool cuda = device.type == STRATA_DEVICE_CUDA;
    // CPU: scalar gates at the GDN size and vector gates of 64 MiB (far beyond L2); CUDA: the GDN / KDA
    // sizes of PERF_TARGETS.md. The varlen case packs 7 sequences of uneven lengths into the vector shape.
    const std::vector<int64_t> scalar = {4, 8192, 32};
    const std::vector<int64_t> vector =
        cuda ? std::vector<int64_t>{4, 8192, 32, 128} : std::vector<int64_t>{1, 8192, 16, 128};
    const std::vector<int64_t> packed = cuda ? std::vector<int64_t>{1, 32768, 32, 128} : vector;
    const int64_t Tp = packed[1];
    const std::vector<int64_t> cu = {0, Tp / 16 + 5, Tp / 4 - 3, Tp / 4 + 1, Tp / 2 + 17, Tp / 2 + 17, 7 * Tp / 8, Tp};
    std::vector<BenchCase> out;
    out.push_back(bench_case(device, scalar, {}, STRATA_DTYPE_F32, false));
    out.push_back(bench_case(device, vector, {}, STRATA_DTYPE_F32, false));
    out.push_back(bench_case(device, packed, cu, STRATA_DTYPE_F32, false));
    if (!cuda) {
      // The backward is the reverse scan (python/strata/_defs.py), and bf16 gates in and out: the CPU's other
      // store and load paths, at the vector shape.
      out.push_back(bench_case(device, vector, {}, STRATA_DTYPE_F32, true));
      out.push_back(bench_case(device, vector, {}, STRATA_DTYPE_BF16, false));
      out.push_back(bench_case(device, vector, {}, STRATA_DTYPE_BF16, true));
    }
    return out;
  }

 private:
  // Several copies of g and out are rotated through so the working set (>= kRotateBytes) exceeds the caches
  // (60 MB L2 on the H200) and a timed run never finds its inputs there.
  static constexpr double kRotateBytes = 512.0 * 1024 * 1024;
  struct BenchState {
    std::vector<std::unique_ptr<DeviceTensor>> g, out;
    std::unique_ptr<DeviceTensor> cu;
    strata_plan plan = nullptr;
    size_t next = 0;
  };

  // dt: g and out; reverse: the backward's scan.
  static BenchCase bench_case(strata_device device, const std::vector<int64_t>& shape, const std::vector<int64_t>& cu,
                              int32_t dt, bool reverse) {
    constexpr int64_t kChunk = 64;
    auto state = std::make_shared<BenchState>();
    BenchCase b;
    int64_t n = 1;
    for (int64_t s : shape) n *= s;
    const double pair_bytes = static_cast<double>(n) * 2 * static_cast<double>(dtype_size(dt));
    b.label = fmt::format("{} {} [{}] chunk={}{}{}", kOp, dtype_name(dt), fmt::join(shape, ", "), kChunk,
                          cu.empty() ? "" : fmt::format(" varlen N={}", cu.size() - 1), reverse ? " reverse" : "");
    b.bytes = pair_bytes + static_cast<double>(cu.size() * sizeof(int64_t));  // read g, write out, read cu
    const int copies = static_cast<int>(std::clamp(std::ceil(kRotateBytes / pair_bytes), 1.0, 64.0));
    b.setup = [=] {
      HostTensor g = HostTensor::make(dt, shape);
      std::mt19937_64 rng(7);
      g.fill_normal(rng, -1.0, 1.0);
      for (int i = 0; i < copies; ++i) {
        state->g.push_back(std::make_unique<DeviceTensor>(g, device));
        state->out.push_back(std::make_unique<DeviceTensor>(g, device));
      }
      if (!cu.empty()) {
        HostTensor h_cu = HostTensor::make(STRATA_DTYPE_I64, {static_cast<int64_t>(cu.size())});
        for (size_t i = 0; i < cu.size(); ++i) h_cu.set(static_cast<int64_t>(i), static_cast<double>(cu[i]));
        state->cu = std::make_unique<DeviceTensor>(h_cu, device);
      }
      check(strata_chunk_local_cumsum_plan(&state->g[0]->desc(), state->cu ? &state->cu->desc() : nullptr,
                                           &state->out[0]->desc(), kChunk, reverse ? 1 : 0, 1.0f, &state->plan),
            "bench plan");
    };
    b.run = [state] {
      const size_t i = state->next++ % state->g.size();
      void* t[] = {state->g[i]->data(), state->cu ? state->cu->data() : nullptr, state->out[i]->data()};
      check(strata_plan_run(state->plan, t, 3, nullptr, 0, nullptr), "bench run");
    };
    b.teardown = [state] {
      strata_plan_destroy(state->plan);
      state->g.clear();
      state->out.clear();
      state->cu.reset();
    };
    return b;
  }
};

}  // namespace

std::unique_ptr<OpHarness> make_chunk_local_cumsum_harness() { return std::make_unique<ChunkLocalCumsumHarness>(); }

}  // namespace strata::atk
