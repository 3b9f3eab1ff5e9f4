// chunk_loss's CPU target (issue 4; src/ops/loss/chunk_loss/README.md "Performance (CPU)"): fwd+bwd at N = 1024,
// D = 1024, V = 32000 at >= 70 % of oneDNN's own dnnl_sgemm rate on the same three GEMMs (Z = H W^T, dH = Z W,
// dW = Z^T H with the [N, V] logits materialised: the peer case of `strata bench --device cpu --op chunk_loss`).
// `strata bench` times its cases one after another, so on a shared machine a load change between the peer's block
// and the op's block moves the ratio; here the three arms (peer, f32, bf16) alternate call by call in one process
// and the ratio is taken per round (session 18, h18/gap4_docs). Not built by CMake:
//   g++ -std=c++20 -O2 -Iinclude bench/chunk_loss_cpu_rate.cpp -o /tmp/chunk_loss_cpu_rate -ldl
//   OMP_NUM_THREADS=1 /tmp/chunk_loss_cpu_rate build/X/libstrata.so 3          # thread CPU time (1 thread)
//   OMP_NUM_THREADS=2 /tmp/chunk_loss_cpu_rate build/X/libstrata.so 3 --wall   # wall time, 2 threads
// dnnl_sgemm is looked up through libstrata.so's handle (the oneDNN that library links). Arms, as the atk cases:
// f32 inputs with f32 dhidden / dweight; bf16 inputs with bf16 dhidden and f32 dweight; mean reduction, no bias.
// Prints per arm best / median ms and GFLOP/s (3 x 2 N V D), with --wall the threads kept busy (process CPU time
// over wall time), the median over rounds of (peer time / arm time),
// the plan's implementation and workspace, how much the process's peak resident memory grows over each arm's
// first call (what the call allocates itself: for chunk_loss beyond its workspace), and the loss of each arm (the
// same inputs, so f32 and bf16 agree to bf16 rounding: a check that the arms computed the loss at all).
#include <dlfcn.h>
#include <time.h>
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <vector>
#include "strata/ops.h"
#include "strata/ops/chunk_loss.h"

namespace {
using sgemm_fn = int (*)(char, char, int64_t, int64_t, int64_t, float, const float*, int64_t, const float*, int64_t,
                         float, float*, int64_t);  // dnnl_sgemm (dnnl_status_t is an int-sized enum)
struct Api {
  void* h = nullptr;
  decltype(&strata_tensor_desc_init) desc_init;
  decltype(&strata_plan_workspace_size) ws_size;
  decltype(&strata_plan_run) run;
  decltype(&strata_plan_impl_name) impl;
  decltype(&strata_chunk_loss_options_init) opt_init;
  decltype(&strata_chunk_loss_plan) plan;
  decltype(&strata_get_last_error_message) err;
  sgemm_fn sgemm;
};
template <class F>
void sym(void* h, F& f, const char* n) {
  f = reinterpret_cast<F>(dlsym(h, n));
  if (!f) { std::fprintf(stderr, "no %s in the library or its dependencies\n", n); std::exit(1); }
}
Api load(const char* path) {
  Api a;
  a.h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
  if (!a.h) { std::fprintf(stderr, "dlopen %s: %s\n", path, dlerror()); std::exit(1); }
  sym(a.h, a.desc_init, "strata_tensor_desc_init");
  sym(a.h, a.ws_size, "strata_plan_workspace_size");
  sym(a.h, a.run, "strata_plan_run");
  sym(a.h, a.impl, "strata_plan_impl_name");
  sym(a.h, a.opt_init, "strata_chunk_loss_options_init");
  sym(a.h, a.plan, "strata_chunk_loss_plan");
  sym(a.h, a.err, "strata_get_last_error_message");
  sym(a.h, a.sgemm, "dnnl_sgemm");
  return a;
}
void ck(const Api& a, strata_status s, const char* what) {
  if (s) { std::fprintf(stderr, "%s: %s\n", what, a.err()); std::exit(1); }
}
uint16_t to_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return static_cast<uint16_t>((u + 0x7fff + ((u >> 16) & 1)) >> 16);
}
double clock_s(clockid_t c) {
  timespec ts;
  clock_gettime(c, &ts);
  return ts.tv_sec + 1e-9 * ts.tv_nsec;
}
double now(bool wall) { return clock_s(wall ? CLOCK_MONOTONIC : CLOCK_THREAD_CPUTIME_ID); }
// VmHWM of /proc/self/status (peak resident set), MiB.
double peak_rss_mib() {
  FILE* f = std::fopen("/proc/self/status", "r");
  char line[256];
  double kib = 0;
  while (f && std::fgets(line, sizeof line, f))
    if (!std::strncmp(line, "VmHWM:", 6)) kib = std::atof(line + 6);
  if (f) std::fclose(f);
  return kib / 1024;
}
}  // namespace

int main(int argc, char** argv) {
  if (argc < 3) {
    std::fprintf(stderr, "usage: %s LIBSTRATA ROUNDS [--wall] [--peer-first] [N D V]\n", argv[0]);
    return 1;
  }
  const Api a = load(argv[1]);
  const int rounds = std::max(1, std::atoi(argv[2]));
  bool wall = false, peer_first = false;
  std::vector<int64_t> dims;
  for (int i = 3; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--wall")) wall = true;
    else if (!std::strcmp(argv[i], "--peer-first")) peer_first = true;
    else dims.push_back(std::atoll(argv[i]));
  }
  const int64_t N = dims.size() == 3 ? dims[0] : 1024, D = dims.size() == 3 ? dims[1] : 1024,
                V = dims.size() == 3 ? dims[2] : 32000;
  // Inputs as the atk cases: hidden N(0, 1); a block of 4096 weight rows of N(0, 3 / sqrt(D)) repeated over V;
  // targets (i * 7919) mod V.
  std::vector<float> h(N * D), w(V * D);
  std::mt19937_64 rng(7);
  std::normal_distribution<float> nd(0.f, 1.f);
  for (float& x : h) x = nd(rng);
  const int64_t blk = std::min<int64_t>(V, 4096);
  for (int64_t i = 0; i < blk * D; ++i) w[i] = nd(rng) * 3.f / std::sqrt(static_cast<float>(D));
  for (int64_t r0 = blk; r0 < V; r0 += blk) std::memcpy(&w[r0 * D], &w[0], std::min(blk, V - r0) * D * 4);
  std::vector<uint16_t> hb(h.size()), wb(w.size());
  for (size_t i = 0; i < h.size(); ++i) hb[i] = to_bf16(h[i]);
  for (size_t i = 0; i < w.size(); ++i) wb[i] = to_bf16(w[i]);
  std::vector<int64_t> tg(N);
  for (int64_t i = 0; i < N; ++i) tg[i] = (i * 7919) % V;

  const strata_device cpu{0, 0};
  auto desc = [&](int32_t dt, std::vector<int64_t> shape) {
    strata_tensor_desc d;
    ck(a, a.desc_init(&d, dt, static_cast<int32_t>(shape.size()), shape.data(), nullptr, 0, cpu), "desc");
    return d;
  };
  struct Arm {
    std::string name;
    std::function<void()> run;
    float* loss = nullptr;
  };
  std::vector<Arm> arms;
  // Peer: the three f32 GEMMs with the logits materialised (what `strata bench` times as the target's ceiling).
  auto z = std::make_shared<std::vector<float>>(N * V), pdh = std::make_shared<std::vector<float>>(N * D),
       pdw = std::make_shared<std::vector<float>>(V * D);
  arms.push_back({"peer: dnnl_sgemm x3, materialised logits", [&, z, pdh, pdw] {
                    a.sgemm('N', 'T', N, V, D, 1.f, h.data(), D, w.data(), D, 0.f, z->data(), V);
                    a.sgemm('N', 'N', N, D, V, 1.f, z->data(), V, w.data(), D, 0.f, pdh->data(), D);
                    a.sgemm('T', 'N', V, D, N, 1.f, z->data(), V, h.data(), D, 0.f, pdw->data(), D);
                  }});
  // chunk_loss fwd+bwd in one call (the plan's strategy), dweight f32, dhidden in the input dtype.
  for (const int32_t dt : {STRATA_DTYPE_F32, STRATA_DTYPE_BF16}) {
    const bool f32 = dt == STRATA_DTYPE_F32;
    const strata_tensor_desc hd = desc(dt, {N, D}), wd = desc(dt, {V, D}), td = desc(STRATA_DTYPE_I64, {N}),
                             ld = desc(STRATA_DTYPE_F32, {}), sd = desc(STRATA_DTYPE_F32, {N}),
                             dhd = desc(dt, {N, D}), dwd = desc(STRATA_DTYPE_F32, {V, D});
    strata_chunk_loss_options o;
    a.opt_init(&o);
    strata_plan plan;
    ck(a, a.plan(&hd, &wd, nullptr, &td, &ld, &sd, &dhd, &dwd, nullptr, &o, &plan), "plan");
    size_t ws = 0;
    a.ws_size(plan, &ws);
    auto buf = std::make_shared<std::vector<char>>(ws + N * 4 + 64 + N * D * (f32 ? 4 : 2) + V * D * 4);
    char* p = buf->data();
    float* loss = reinterpret_cast<float*>(p);
    void* lse = p + 64;
    void* dh = p + 64 + N * 4;
    void* dw = static_cast<char*>(dh) + N * D * (f32 ? 4 : 2);
    void* wsp = ws ? static_cast<char*>(dw) + V * D * 4 : nullptr;
    void* hp = f32 ? static_cast<void*>(h.data()) : static_cast<void*>(hb.data());
    void* wp = f32 ? static_cast<void*>(w.data()) : static_cast<void*>(wb.data());
    const std::string name = std::string("chunk_loss ") + (f32 ? "f32, f32 gradients" : "bf16, dhidden bf16, dweight f32");
    std::printf("%s: impl %s, workspace %.1f MiB (gradients %.1f MiB)\n", name.c_str(), a.impl(plan), ws / 1048576.0,
                (N * D * (f32 ? 4.0 : 2.0) + V * D * 4.0) / 1048576.0);
    arms.push_back({name, [&a, plan, buf, hp, wp, tg = tg.data(), loss, lse, dh, dw, wsp, ws] {
                      void* t[] = {hp, wp, nullptr, tg, loss, lse, dh, dw, nullptr};
                      ck(a, a.run(plan, t, 9, wsp, ws, nullptr), "run");
                    },
                    loss});
  }
  const double flop = 3.0 * 2.0 * N * V * D;
  // busy: with --wall, the process's CPU time over the wall time of each call = threads kept busy (2 threads on an
  // idle machine: ~2 when the whole call is parallel; a serial part or threads waiting at barriers lower it).
  std::vector<std::vector<double>> t(arms.size()), busy(arms.size());
  std::printf("N=%lld D=%lld V=%lld, %d rounds, %s (%.1f GFLOP per call)\n", static_cast<long long>(N),
              static_cast<long long>(D), static_cast<long long>(V), rounds, wall ? "wall time" : "thread CPU time",
              flop / 1e9);
  std::fflush(stdout);
  // Warm-up (page faults, oneDNN's kernel generation), chunk_loss's arms first: every buffer above is allocated and
  // touched, so what the process's peak resident memory gains over a first call is what that call allocates itself
  // (the target: peak <= gradients + 64 MiB, i.e. the workspace plus this <= 64 MiB).
  // --peer-first: the peer's first call before them instead (what dnnl_sgemm itself allocates shows there).
  std::vector<size_t> order;
  if (peer_first) order.push_back(0);
  for (size_t k = 1; k < arms.size(); ++k) order.push_back(k);
  if (!peer_first) order.push_back(0);
  for (const size_t k : order) {
    const double hwm0 = peak_rss_mib();
    arms[k].run();
    std::printf("first call of %s: peak resident memory +%.1f MiB\n", arms[k].name.c_str(), peak_rss_mib() - hwm0);
    std::fflush(stdout);
  }
  for (int r = 0; r < rounds; ++r) {
    std::printf("  round %d:", r + 1);
    for (size_t k = 0; k < arms.size(); ++k) {
      const double t0 = now(wall), c0 = clock_s(CLOCK_PROCESS_CPUTIME_ID);
      arms[k].run();
      t[k].push_back(now(wall) - t0);
      busy[k].push_back((clock_s(CLOCK_PROCESS_CPUTIME_ID) - c0) / t[k].back());
      std::printf(" %.1f ms%s", 1e3 * t[k].back(), k ? "" : " (peer)");
    }
    std::printf("\n");
    std::fflush(stdout);  // a run cut by a time limit keeps its finished rounds
  }
  auto median = [](const std::vector<double>& v) {  // v sorted; the mean of the middle two for an even count
    return 0.5 * (v[(v.size() - 1) / 2] + v[v.size() / 2]);
  };
  for (size_t k = 0; k < arms.size(); ++k) {
    std::vector<double> ratio;  // per round: the peer's time over this arm's time = this arm's rate / the peer's
    for (int r = 0; r < rounds; ++r) ratio.push_back(t[0][r] / t[k][r]);
    std::sort(ratio.begin(), ratio.end());
    std::vector<double> s = t[k], b = busy[k];
    std::sort(s.begin(), s.end());
    std::sort(b.begin(), b.end());
    const double med = median(s);
    std::printf("  %-44s best %8.1f ms  median %8.1f ms  %6.1f GFLOP/s", arms[k].name.c_str(), 1e3 * s[0], 1e3 * med,
                flop / med / 1e9);
    if (wall) std::printf("  busy %.2f", median(b));
    if (k) std::printf("  = %3.0f%% of the peer's rate (median of rounds; min %.0f%%, max %.0f%%)  loss %.6f",
                       100 * median(ratio), 100 * ratio.front(), 100 * ratio.back(), *arms[k].loss);
    std::printf("\n");
  }
  return 0;
}
