// CPU kernel rates of causal_conv1d, rms_norm_gated, clipped_swiglu and fused_cross_entropy through the C API of one or two libstrata.so builds,
// loaded side by side in one process (dlopen RTLD_LOCAL | RTLD_DEEPBIND: each library resolves to itself), so an
// A/B of two builds runs interleaved call by call under the same machine state. Not built by CMake (it needs no
// Strata target; session 13, h13/cpu_fused):
//   g++ -std=c++20 -O2 -Iinclude bench/cpu_op_rates.cpp -o /tmp/cpu_op_rates -ldl
//   OMP_NUM_THREADS=1 /tmp/cpu_op_rates build/X/libstrata.so build/Y/libstrata.so 9 conv_bwd rng_bwd
//   OMP_NUM_THREADS=1 /tmp/cpu_op_rates LIB - 5                       # one library: its rates
//   /tmp/cpu_op_rates LIB - 5 --wall --env STRATA_SOME_VARIANT=0,1   # one library, an environment switch
//   OMP_NUM_THREADS=2 /tmp/cpu_op_rates LIB - 5 --wall --copy 1024 --set atk  # the atk shapes beside a 1 GiB copy
// Timing: the calling thread's CPU time (the default; with OMP_NUM_THREADS=1 the op runs on that thread, so a
// loaded shared VM's time slicing drops out) or wall time (--wall, for several threads on a quiet machine).
// GB/s = the op's bytes (as the testkit counts them: activations read and written) over that time; shapes from
// memory (the atk shapes with fewer rows) and shapes that stay in L2 (the instruction-bound rate); bf16
// activations, f32 weights, SiLU unless named. Prints best / median per arm and the median's change vs arm 0.
#include <dlfcn.h>
#include <time.h>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>
#include <functional>
#include <random>
#include <algorithm>
#include <memory>
#include "strata/ops.h"
#include "strata/ops/causal_conv1d.h"
#include "strata/ops/rms_norm_gated.h"
#include "strata/ops/clipped_swiglu.h"
#include "strata/ops/fused_cross_entropy.h"
#include <thread>
static double cpu_now() { timespec ts; clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts); return ts.tv_sec + 1e-9 * ts.tv_nsec; }
struct Api {
  void* h;
  decltype(&strata_tensor_desc_init) desc_init;
  decltype(&strata_plan_workspace_size) ws_size;
  decltype(&strata_plan_run) run;
  decltype(&strata_plan_impl_name) impl;
  decltype(&strata_causal_conv1d_fwd_plan) conv_fwd;
  decltype(&strata_causal_conv1d_bwd_plan) conv_bwd;
  decltype(&strata_rms_norm_gated_fwd_plan) rng_fwd;
  decltype(&strata_rms_norm_gated_bwd_plan) rng_bwd;
  decltype(&strata_clipped_swiglu_fwd_plan) sw_fwd;
  decltype(&strata_clipped_swiglu_bwd_plan) sw_bwd;
  decltype(&strata_fused_cross_entropy_fwd_plan) ce_fwd;
  decltype(&strata_fused_cross_entropy_bwd_plan) ce_bwd;
  decltype(&strata_get_last_error_message) err;
};
static Api load(const char* path) {
  Api a{};
  a.h = dlopen(path, RTLD_NOW | RTLD_LOCAL | RTLD_DEEPBIND);
  if (!a.h) { std::fprintf(stderr, "dlopen %s: %s\n", path, dlerror()); std::exit(1); }
#define SYM(f, n) a.f = reinterpret_cast<decltype(a.f)>(dlsym(a.h, n)); if (!a.f) { std::fprintf(stderr, "no %s\n", n); std::exit(1); }
  SYM(desc_init, "strata_tensor_desc_init") SYM(ws_size, "strata_plan_workspace_size") SYM(run, "strata_plan_run")
  SYM(impl, "strata_plan_impl_name") SYM(conv_fwd, "strata_causal_conv1d_fwd_plan") SYM(conv_bwd, "strata_causal_conv1d_bwd_plan")
  SYM(rng_fwd, "strata_rms_norm_gated_fwd_plan") SYM(rng_bwd, "strata_rms_norm_gated_bwd_plan") SYM(err, "strata_get_last_error_message")
  SYM(sw_fwd, "strata_clipped_swiglu_fwd_plan") SYM(sw_bwd, "strata_clipped_swiglu_bwd_plan")
  SYM(ce_fwd, "strata_fused_cross_entropy_fwd_plan")
  SYM(ce_bwd, "strata_fused_cross_entropy_bwd_plan")
  return a;
}
static void ck(const Api& a, strata_status s, const char* what) { if (s) { std::fprintf(stderr, "%s: %s\n", what, a.err()); std::exit(1); } }
// Page-aligned buffers (as large allocations come from mmap: every tensor at the same offset mod 4 KiB), the
// op outputs optionally `off` bytes further (--out-offset: the relative alignment of outputs to inputs).
struct ABuf {
  char* p = nullptr; size_t n = 0, off = 0;
  explicit ABuf(size_t n_, size_t off_ = 0) : n(n_), off(off_) { p = static_cast<char*>(std::aligned_alloc(4096, (n + off + 4095) / 4096 * 4096)); std::memset(p, 0, n + off); }
  explicit ABuf(const std::vector<char>& v) : ABuf(v.size()) { std::memcpy(p, v.data(), n); }
  ABuf(const ABuf& o) : ABuf(o.n) { std::memcpy(p, o.p + o.off, n); }
  ~ABuf() { std::free(p); }
  char* data() const { return p + off; }
};
static size_t g_out_off = 0;
// About N(0, 1) (the sum of four uniforms, rescaled): cheap enough for the atk shapes' 64 M elements.
static std::vector<char> bf16_random(size_t n, uint64_t seed) {
  std::vector<char> out(n * 2);
  uint16_t* o = reinterpret_cast<uint16_t*>(out.data());
  uint64_t z = seed * 0x9e3779b97f4a7c15ull + 1;
  for (size_t i = 0; i < n; ++i) {
    z += 0x9e3779b97f4a7c15ull;
    uint64_t h = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull; h = (h ^ (h >> 27)) * 0x94d049bb133111ebull; h ^= h >> 31;
    const float f = (float((h & 0xffff) + ((h >> 16) & 0xffff) + ((h >> 32) & 0xffff) + (h >> 48)) / 65536.f - 2.f) * 1.732f;
    uint32_t u; std::memcpy(&u, &f, 4); o[i] = uint16_t((u + 0x7fff + ((u >> 16) & 1)) >> 16);
  }
  return out;
}
static std::vector<char> f32_fill(size_t n, float lo, float hi, uint64_t seed) {
  std::vector<char> out(n * 4); std::mt19937_64 r(seed); std::uniform_real_distribution<float> d(lo, hi);
  float* o = reinterpret_cast<float*>(out.data()); for (size_t i = 0; i < n; ++i) o[i] = d(r); return out;
}
struct Case { std::string name; double bytes; std::function<std::function<void()>(const Api&)> make; };
int main(int argc, char** argv) {
  if (argc < 4) {
    std::fprintf(stderr, "usage: %s LIB_A LIB_B|- ROUNDS [--wall] [--env NAME=v0,v1,...] [--copy MIB] [--set atk|mem|l2|l2s] [--out-offset BYTES] [case prefix ...]\n", argv[0]);
    return 1;
  }
  Api A = load(argv[1]);
  const bool two = std::strcmp(argv[2], "-") != 0;
  Api B = two ? load(argv[2]) : A;
  const int rounds = std::atoi(argv[3]);
  bool wall = false;
  long copy_mib = 0;
  std::string set = "default";  // --copy MIB: a copy of MIB MiB (read + write counted) as one more arm of every case
  // --env NAME=v0,v1,... (repeatable): arm k sets every named variable to its k-th value.
  std::vector<std::string> env_names, env_vals, want;
  std::vector<std::vector<std::string>> env_sets;
  for (int i = 4; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--wall")) wall = true;
    else if (!std::strcmp(argv[i], "--copy") && i + 1 < argc) copy_mib = std::atol(argv[++i]);
    else if (!std::strcmp(argv[i], "--set") && i + 1 < argc) set = argv[++i];
    else if (!std::strcmp(argv[i], "--out-offset") && i + 1 < argc) g_out_off = std::atol(argv[++i]);
    else if (!std::strcmp(argv[i], "--env") && i + 1 < argc) {
      std::string e = argv[++i];
      env_names.push_back(e.substr(0, e.find('=')));
      env_sets.emplace_back();
      std::string v = e.substr(e.find('=') + 1);
      for (size_t p = 0; p <= v.size();) { size_t q = v.find(',', p); if (q == std::string::npos) q = v.size(); env_sets.back().push_back(v.substr(p, q - p)); p = q + 1; }
      env_vals = env_sets.front();
    } else want.push_back(argv[i]);
  }
  auto now = [&] {
    if (!wall) return cpu_now();
    timespec ts; clock_gettime(CLOCK_MONOTONIC, &ts); return ts.tv_sec + 1e-9 * ts.tv_nsec;
  };
  const strata_device cpu{0, 0};
  std::vector<Case> cases;
  auto wanted = [&](const std::string& name) {
    return want.empty() || std::find(want.begin(), want.end(), name.substr(0, name.find(' '))) != want.end();
  };
  // causal_conv1d [1, T, D] W=4 silu bf16, f32 weight [D, 4] and bias [D]
  auto conv = [&](bool bwd, int64_t T, int64_t D) {
    Case c; c.name = std::string("conv_") + (bwd ? "bwd" : "fwd") + " [1," + std::to_string(T) + "," + std::to_string(D) + "]";
    if (!wanted(c.name)) return;
    const double act = double(T * D) * 2; c.bytes = (bwd ? 3 : 2) * act;
    c.make = [=](const Api& a) -> std::function<void()> {
      auto x = std::make_shared<ABuf>(bf16_random(T * D, 1)), dy = std::make_shared<ABuf>(bf16_random(T * D, 2));
      auto w = std::make_shared<ABuf>(f32_fill(D * 4, -0.5f, 0.5f, 3)), b = std::make_shared<ABuf>(f32_fill(D, -0.5f, 0.5f, 4));
      strata_tensor_desc dx_, dw_, db_, dyd;
      int64_t s3[3] = {1, T, D}, s2[2] = {D, 4}, s1[1] = {D};
      ck(a, a.desc_init(&dx_, STRATA_DTYPE_BF16, 3, s3, nullptr, 0, cpu), "desc");
      ck(a, a.desc_init(&dw_, STRATA_DTYPE_F32, 2, s2, nullptr, 0, cpu), "desc");
      ck(a, a.desc_init(&db_, STRATA_DTYPE_F32, 1, s1, nullptr, 0, cpu), "desc");
      dyd = dx_;
      strata_plan plan;
      auto out = std::make_shared<ABuf>(T * D * 2, g_out_off), gw = std::make_shared<ABuf>(D * 16), gb = std::make_shared<ABuf>(D * 4);
      if (!bwd) ck(a, a.conv_fwd(&dx_, &dw_, &db_, nullptr, nullptr, nullptr, nullptr, &dx_, nullptr, 1, 0, &plan), "plan");
      else ck(a, a.conv_bwd(&dx_, &dw_, &db_, nullptr, nullptr, nullptr, &dyd, nullptr, &dx_, &dw_, &db_, nullptr, 1, 0, &plan), "plan");
      size_t ws = 0; a.ws_size(plan, &ws);
      auto wsb = std::make_shared<ABuf>(ws + 64);
      std::fprintf(stderr, "  %s impl %s\n", c.name.c_str(), a.impl(plan));
      return [=, &a] {
        if (!bwd) { void* t[] = {x->data(), w->data(), b->data(), nullptr, nullptr, nullptr, nullptr, out->data(), nullptr}; ck(a, a.run(plan, t, 9, wsb->data(), ws, nullptr), "run"); }
        else { void* t[] = {x->data(), w->data(), b->data(), nullptr, nullptr, nullptr, dy->data(), nullptr, out->data(), gw->data(), gb->data(), nullptr}; ck(a, a.run(plan, t, 12, wsb->data(), ws, nullptr), "run"); }
      };
    };
    cases.push_back(c);
  };
  auto rng = [&](bool bwd, int64_t rows, int64_t D, int64_t G, int nbg) {
    Case c; c.name = std::string("rng_") + (bwd ? "bwd" : "fwd") + " [" + std::to_string(rows) + "," + std::to_string(D) + "] G" + std::to_string(G) + (nbg ? " nbg" : " gbn");
    if (!wanted(c.name)) return;
    const double n = double(rows * D) * 2; c.bytes = bwd ? 5 * n : 3 * n;
    c.make = [=](const Api& a) -> std::function<void()> {
      auto x = std::make_shared<ABuf>(bf16_random(rows * D, 1)), z = std::make_shared<ABuf>(bf16_random(rows * D, 2)),
           dy = std::make_shared<ABuf>(bf16_random(rows * D, 3));
      auto w = std::make_shared<ABuf>(f32_fill(D, 0.9f, 1.1f, 4)), rs = std::make_shared<ABuf>(f32_fill(rows * (D / G), 0.5f, 2.f, 5));
      strata_tensor_desc xd, wd, rd;
      int64_t s2[2] = {rows, D}, s1[1] = {D}, sr[2] = {rows, D / G};
      ck(a, a.desc_init(&xd, STRATA_DTYPE_BF16, 2, s2, nullptr, 0, cpu), "desc");
      ck(a, a.desc_init(&wd, STRATA_DTYPE_F32, 1, s1, nullptr, 0, cpu), "desc");
      ck(a, a.desc_init(&rd, STRATA_DTYPE_F32, 2, sr, nullptr, 0, cpu), "desc");
      strata_plan plan;
      if (!bwd) ck(a, a.rng_fwd(&xd, &xd, &wd, nullptr, nullptr, &xd, nullptr, &rd, 1e-6f, G, nbg, 0, &plan), "plan");
      else ck(a, a.rng_bwd(&xd, &xd, &wd, nullptr, nullptr, &rd, &xd, nullptr, &xd, &xd, &wd, nullptr, G, nbg, 0, &plan), "plan");
      size_t ws = 0; a.ws_size(plan, &ws);
      auto wsb = std::make_shared<ABuf>(ws + 64);
      auto o1 = std::make_shared<ABuf>(rows * D * 2, g_out_off), o2 = std::make_shared<ABuf>(rows * D * 2, g_out_off), gw = std::make_shared<ABuf>(D * 4);
      auto r2 = std::make_shared<ABuf>(*rs);
      std::fprintf(stderr, "  %s impl %s\n", c.name.c_str(), a.impl(plan));
      return [=, &a] {
        if (!bwd) { void* t[] = {x->data(), z->data(), w->data(), nullptr, nullptr, o1->data(), nullptr, r2->data()}; ck(a, a.run(plan, t, 8, wsb->data(), ws, nullptr), "run"); }
        else { void* t[] = {x->data(), z->data(), w->data(), nullptr, nullptr, rs->data(), dy->data(), nullptr, o1->data(), o2->data(), gw->data(), nullptr}; ck(a, a.run(plan, t, 12, wsb->data(), ws, nullptr), "run"); }
      };
    };
    cases.push_back(c);
  };
  // clipped_swiglu [rows, 2I] -> [rows, I] bf16, GPT-OSS interleaved (alpha 1.702, limit 7, bias 1) or the
  // DeepSeek split layout (alpha 1, limit 10, bias 0); bytes as the testkit counts them.
  auto swiglu = [&](bool bwd, int64_t rows, int64_t I, bool inter) {
    Case c; c.name = std::string("sw_") + (bwd ? "bwd" : "fwd") + " [" + std::to_string(rows) + "," + std::to_string(2 * I) + "]" + (inter ? " inter" : " split");
    if (!wanted(c.name)) return;
    const double n = double(rows * I) * 2; c.bytes = bwd ? 5 * n : 3 * n;
    c.make = [=](const Api& a) -> std::function<void()> {
      std::vector<char> xv = bf16_random(rows * 2 * I, 1);
      for (size_t i = 0; i < xv.size(); i += 2) xv[i + 1] = char(xv[i + 1] + (i % 6 == 0 ? 1 : 0));  // some |x| > limit
      auto x = std::make_shared<ABuf>(xv), dy = std::make_shared<ABuf>(bf16_random(rows * I, 2));
      strata_tensor_desc xd, yd;
      int64_t sx[2] = {rows, 2 * I}, sy[2] = {rows, I};
      ck(a, a.desc_init(&xd, STRATA_DTYPE_BF16, 2, sx, nullptr, 0, cpu), "desc");
      ck(a, a.desc_init(&yd, STRATA_DTYPE_BF16, 2, sy, nullptr, 0, cpu), "desc");
      const float al = inter ? 1.702f : 1.f, lim = inter ? 7.f : 10.f, bi = inter ? 1.f : 0.f;
      strata_plan plan;
      if (!bwd) ck(a, a.sw_fwd(&xd, nullptr, &yd, al, lim, bi, inter, &plan), "plan");
      else ck(a, a.sw_bwd(&xd, nullptr, &yd, &xd, nullptr, al, lim, bi, inter, &plan), "plan");
      auto out = std::make_shared<ABuf>(rows * 2 * I * 2, g_out_off);
      std::fprintf(stderr, "  %s impl %s\n", c.name.c_str(), a.impl(plan));
      return [=, &a] {
        if (!bwd) { void* t[] = {x->data(), nullptr, out->data()}; ck(a, a.run(plan, t, 3, nullptr, 0, nullptr), "run"); }
        else { void* t[] = {x->data(), nullptr, dy->data(), out->data(), nullptr}; ck(a, a.run(plan, t, 5, nullptr, 0, nullptr), "run"); }
      };
    };
    cases.push_back(c);
  };
  // The tensors of a fused_cross_entropy case: bf16 logits [N, V], i64 targets [N], f32 [N] (lse) and f32 [] (the
  // mean loss, or dloss).
  auto ce_descs = [cpu](const Api& a, int64_t N, int64_t V, strata_tensor_desc& zd, strata_tensor_desc& td,
                        strata_tensor_desc& row, strata_tensor_desc& scalar) {
    int64_t sz[2] = {N, V}, sn[1] = {N};
    ck(a, a.desc_init(&zd, STRATA_DTYPE_BF16, 2, sz, nullptr, 0, cpu), "desc");
    ck(a, a.desc_init(&td, STRATA_DTYPE_I64, 1, sn, nullptr, 0, cpu), "desc");
    ck(a, a.desc_init(&row, STRATA_DTYPE_F32, 1, sn, nullptr, 0, cpu), "desc");
    ck(a, a.desc_init(&scalar, STRATA_DTYPE_F32, 0, sn, nullptr, 0, cpu), "desc");
  };
  // fused_cross_entropy bf16 [N, V], mean, fwd+bwd in place (grad) or the loss only; softcap 30 optional.
  auto ce = [&](bool grad, int64_t N, int64_t V, float cap) {
    Case c; c.name = std::string("ce_") + (grad ? "fwdbwd" : "loss") + " [" + std::to_string(N) + "," + std::to_string(V) + "]" + (cap > 0 ? " softcap" : "");
    if (!wanted(c.name)) return;
    const double mat = double(N) * double(V) * 2; c.bytes = (grad ? 2 : 1) * mat + N * 12.0;
    c.make = [=](const Api& a) -> std::function<void()> {
      auto z0 = std::make_shared<ABuf>(bf16_random(N * V, 1));
      std::vector<char> tv(N * 8);
      for (int64_t i = 0; i < N; ++i) { int64_t t = (i * 7919) % V; std::memcpy(tv.data() + i * 8, &t, 8); }
      auto tg = std::make_shared<ABuf>(tv);
      strata_tensor_desc zd, td, ld, sd;
      ce_descs(a, N, V, zd, td, sd, ld);
      strata_plan plan;
      ck(a, a.ce_fwd(&zd, &td, &ld, &sd, nullptr, grad ? &zd : nullptr, 1, -100, 0.f, 1.f, 0.f, cap, 1.f, &plan), "plan");
      size_t ws = 0; a.ws_size(plan, &ws);
      auto wsb = std::make_shared<ABuf>(ws + 64);
      // In place the logits become their gradient (same cost: no data-dependent work).
      auto z = z0;
      auto l = std::make_shared<ABuf>(64), ls = std::make_shared<ABuf>(N * 4);
      std::fprintf(stderr, "  %s impl %s\n", c.name.c_str(), a.impl(plan));
      return [=, &a] {
        void* t[] = {z->data(), tg->data(), l->data(), ls->data(), nullptr, grad ? z->data() : nullptr};
        ck(a, a.run(plan, t, 6, wsb->data(), ws, nullptr), "run");
      };
    };
    cases.push_back(c);
  };
  // fused_cross_entropy backward bf16 [N, V], mean, from a saved lse into a separate dlogits (session 17, h17/cpu_fce2:
  // the gradient sweep alone; bytes: read the logits, write dlogits).
  auto ce_bwd = [&](int64_t N, int64_t V) {
    Case c; c.name = "ce_bwd [" + std::to_string(N) + "," + std::to_string(V) + "]";
    if (!wanted(c.name)) return;
    const double mat = double(N) * double(V) * 2; c.bytes = 2 * mat + N * 12.0;
    c.make = [=](const Api& a) -> std::function<void()> {
      auto z = std::make_shared<ABuf>(bf16_random(N * V, 1)), dz = std::make_shared<ABuf>(N * V * 2, g_out_off);
      std::vector<char> tv(N * 8), lv(N * 4);
      for (int64_t i = 0; i < N; ++i) {
        int64_t t = (i * 7919) % V; std::memcpy(tv.data() + i * 8, &t, 8);
        float l = 12.5f; std::memcpy(lv.data() + i * 4, &l, 4);  // about the lse of V = 151936 N(0, 1) logits
      }
      auto tg = std::make_shared<ABuf>(tv), ls = std::make_shared<ABuf>(lv), dl = std::make_shared<ABuf>(64);
      const float one = 1.f; std::memcpy(dl->data(), &one, 4);
      strata_tensor_desc zd, td, sd, dd;
      ce_descs(a, N, V, zd, td, sd, dd);
      strata_plan plan;
      ck(a, a.ce_bwd(&zd, &td, &sd, &dd, &zd, 1, -100, 0.f, 1.f, 0.f, 0.f, &plan), "plan");
      size_t ws = 0; a.ws_size(plan, &ws);
      auto wsb = std::make_shared<ABuf>(ws + 64);
      std::fprintf(stderr, "  %s impl %s\n", c.name.c_str(), a.impl(plan));
      return [=, &a] {
        void* t[] = {z->data(), tg->data(), ls->data(), dl->data(), dz->data()};
        ck(a, a.run(plan, t, 5, wsb->data(), ws, nullptr), "run");
      };
    };
    cases.push_back(c);
  };
  // --set atk: the shapes of `strata atk --device cpu` (the README's table; from memory on any cache size);
  // mem: from memory on the development VM (the atk shapes with fewer tokens / rows); l2: shapes that stay in L2
  // (the instruction-bound rate); default mem and l2.
  // The from-memory sets: every op at its README shape with `t` conv time steps, `r128` rows of D = 128, `rw` wide
  // rows (D = 5120 / 8192), `sw` swiglu tokens, `cn` cross-entropy rows (`cs` with the softcap).
  auto from_memory = [&](int64_t t, int64_t r128, int64_t rw, int64_t sw, int64_t cn, int64_t cs) {
    conv(false, t, 8192); conv(true, t, 8192);
    rng(false, r128, 128, 128, 1); rng(true, r128, 128, 128, 1);
    rng(false, rw, 5120, 5120, 0); rng(true, rw, 5120, 5120, 0);
    rng(false, rw, 8192, 1024, 0); rng(true, rw, 8192, 1024, 0);
    swiglu(false, sw, 2880, true); swiglu(true, sw, 2880, true);
    swiglu(false, sw, 2048, false); swiglu(true, sw, 2048, false);
    ce(true, cn, 151936, 0.f); ce(false, cn, 151936, 0.f); ce(true, cs, 256000, 30.f);
    ce_bwd(cn, 151936);
  };
  if (set == "atk") from_memory(8192, 262144, 4096, 8192, 1024, 512);
  if (set == "mem" || set == "default") from_memory(2048, 32768, 1024, 1024, 64, 32);
  if (set == "l2" || set == "default") {
  conv(false, 128, 2048); conv(true, 128, 2048);
  // 8 time tiles, of which only the first takes the element-wise start-of-sequence path (1 of 2 above).
  conv(false, 512, 1024); conv(true, 512, 1024);
  rng(false, 2048, 128, 128, 1); rng(true, 2048, 128, 128, 1);
  rng(false, 64, 5120, 5120, 0); rng(true, 64, 5120, 5120, 0);
  rng(false, 48, 8192, 1024, 0); rng(true, 48, 8192, 1024, 0);
  swiglu(false, 32, 2880, true); swiglu(true, 32, 2880, true);
  swiglu(false, 32, 2048, false); swiglu(true, 32, 2048, false);
  ce(true, 2, 151936, 0.f); ce(false, 2, 151936, 0.f); ce(true, 1, 256000, 30.f);
  ce_bwd(2, 151936);
  }
  // --set l2s (session 16, h16/cpu_norm): rms_norm_gated and clipped_swiglu shapes whose tensors all fit the
  // 512 KiB L2 of one Zen 3 core (the AVX2 EPYC CI machine; the l2 set's [2048, 128] rows take 1.5-2.5 MiB there).
  if (set == "l2s") {
    rng(false, 256, 128, 128, 1); rng(true, 256, 128, 128, 1);
    rng(false, 8, 5120, 5120, 0); rng(true, 8, 5120, 5120, 0);
    rng(false, 4, 8192, 1024, 0); rng(true, 4, 8192, 1024, 0);
    swiglu(false, 8, 2880, true); swiglu(true, 8, 2880, true);
    swiglu(false, 8, 2048, false); swiglu(true, 8, 2048, false);
  }
  // The copy arm: copy_mib MiB copied by as many threads as the ops use (OMP_NUM_THREADS, else all), each its
  // slice; first touched here so that no page faults are timed. Thread CPU time counts only the calling thread,
  // so with --copy the time should be wall time unless OMP_NUM_THREADS=1.
  const size_t cb = size_t(copy_mib) << 20;
  const double copy_bytes = 2.0 * double(cb);
  std::shared_ptr<ABuf> csrc, cdst;
  std::function<void()> copy_fn;
  if (copy_mib > 0) {
    csrc = std::make_shared<ABuf>(cb); cdst = std::make_shared<ABuf>(cb);
    std::memset(csrc->data(), 1, cb);
    const char* e = std::getenv("OMP_NUM_THREADS");
    const int nth = std::max(1, e ? std::atoi(e) : int(std::thread::hardware_concurrency()));
    copy_fn = [=] {
      auto part = [&](int i) { const size_t a = cb * i / nth, b = cb * (i + 1) / nth; std::memcpy(cdst->data() + a, csrc->data() + a, b - a); };
      if (nth == 1) { part(0); return; }
      std::vector<std::thread> th;
      for (int i = 1; i < nth; ++i) th.emplace_back(part, i);
      part(0);
      for (auto& x : th) x.join();
    };
    if (!wall && nth > 1) std::fprintf(stderr, "note: --copy with %d threads needs --wall\n", nth);
  }
  if (env_names.size() > 1)
    for (size_t k = 0; k < env_vals.size(); ++k) {
      std::printf("arm%zu:", k);
      for (size_t e = 0; e < env_names.size(); ++e) std::printf(" %s=%s", env_names[e].c_str(), env_sets[e].at(k).c_str());
      std::printf("\n");
    }
  for (auto& c : cases) {
    // Arms: lib A (and lib B), or lib A under each value of the environment variable.
    std::vector<std::function<void()>> run0;
    std::vector<std::string> label;
    run0.push_back(c.make(A));
    if (two) { run0.push_back(c.make(B)); label = {"A", "B"}; }
    else if (!env_vals.empty()) { for (size_t k = 1; k < env_vals.size(); ++k) run0.push_back(run0[0]); for (size_t k = 0; k < env_vals.size(); ++k) label.push_back(env_names.size() == 1 ? env_names[0] + "=" + env_vals[k] : "arm" + std::to_string(k)); }
    else label = {"A"};
    const int reps = std::max(1, int(64e6 / c.bytes));
    const double bytes = c.bytes * reps;
    const size_t n_op = run0.size();
    if (copy_mib > 0) { run0.push_back(copy_fn); label.push_back("copy"); }
    std::vector<std::vector<double>> t(run0.size());
    auto arm = [&](size_t k) {
      if (k < n_op) for (size_t e = 0; e < env_names.size(); ++e) setenv(env_names[e].c_str(), env_sets[e].at(k).c_str(), 1);
      const double t0 = now();
      for (int r = 0; r < (k < n_op ? reps : 1); ++r) run0[k]();
      return now() - t0;
    };
    for (size_t k = 0; k < run0.size(); ++k) arm(k);
    for (int r = 0; r < rounds; ++r)
      for (size_t k = 0; k < run0.size(); ++k) t[k].push_back(arm(k));
    std::printf("%-36s", c.name.c_str());
    // Paired %: per round, the op arm's rate over the copy arm's rate of the same round; the median of those.
    std::vector<double> paired[8];
    if (copy_mib > 0)
      for (size_t k = 0; k < n_op && k < 8; ++k)
        for (int r = 0; r < rounds; ++r) paired[k].push_back((bytes / t[k][r]) / (copy_bytes / t[n_op][r]));
    for (size_t k = 0; k < run0.size(); ++k) {
      const double by = k < n_op ? bytes : copy_bytes;
      std::sort(t[k].begin(), t[k].end());
      const double med = t[k][t[k].size() / 2], med0 = t[0][t[0].size() / 2];
      std::printf(" | %s %.2f/%.2f GB/s", label[k].c_str(), by / t[k][0] / 1e9, by / med / 1e9);
      if (k && k < n_op) std::printf(" (%+.1f%%)", 100 * (med0 / med - 1));
      if (copy_mib > 0 && k < n_op && k < 8) {
        std::sort(paired[k].begin(), paired[k].end());
        std::printf(" = %.0f%% of copy", 100 * paired[k][paired[k].size() / 2]);
      }
    }
    std::printf("  [best/median, %s]\n", wall ? "wall" : "thread CPU time");
    std::fflush(stdout);
  }
}
