// chunk_gated_delta_rule on CUDA sm_90 ("cuda.sm90.chunked"): the forward and backward of the full Gated
// DeltaNet operator composed from the CUDA entry points of its sub-operators (ops_gdn_kda.md §3.1, §3.2,
// Appendix A), all on the plan's stream, all scratch in the workspace the plan reported (nothing allocated here).
//
// Forward (fla's chunk_gated_delta_rule_fwd):
//   [l2norm]  qn, kn = q / |q|, k / |k| (row_norm_fwd_cuda, f32 [B, T, H, K], rstd f32 [B, T, H])
//   γ        = chunk_local_cumsum(g)                          f32 [B, T, HV]   (formed by the pre-state kernel itself
//              in the forced form cuda.sm90.fused_fold: gdn::fwd_cuda_prep_head)
//   w, u, A  = prepare_wy_repr_fwd(kn, v, beta, γ)            f32 [B, T, HV, K | V | 64]
//   h, v_new, final_state = chunk_gated_delta_rule_fwd_h(kn, w, u, γ, h0)   h f32 [B, NT, HV, K, V]
//   o        = chunk_fwd_o(qn, kn, v_new, h, γ, scale)
// Fused forward ("cuda.sm90.fused", gdn_cuda_fused_fwd: 16-bit tokens, K <= 128): the same head up to w, u (A is
// not stored), then o and the final state from one state pass (gdn::fwd_cuda_state_o) that never writes h or
// v_new, whose buffers are then not carved.
// With p.saved (session 12) the forward also leaves qn, kn, rq, rk, γ, A, w, h and v_new in that buffer
// (gdn_cuda_saved_layout; by default from the fused pass writing h and v_new: GdnSavedForward) and zeroes its other
// bytes; the backward then reads them instead of re-running the forward.
// Backward (fla's chunk_gated_delta_rule_bwd), without p.saved re-running the forward up to h and v_new first
// (nothing but the inputs is kept between the passes):
//   dv_local = chunk_bwd_dv_local(qn, kn, do, γ)
//   dh, dh0, dv2 = chunk_gated_delta_rule_bwd_dhu(qn, kn, w, do, dv_local, γ, dht)
//     (16-bit tokens, 64 < K <= 128 with bwd_dhu's 64-column tiles: one call, bwd_dhu's tensor-core kernel forming
//     dv_local per chunk itself, the same bits: DhuParams::fuse_dv_local, dhu_fused_dv_local)
//   dq, dk1, dw, dγ1 = chunk_bwd_dqkwg(qn, kn, v_new, do, h, dh, dv2, γ)    (dq, dk summed over the G heads)
//   dk2, dv, dbeta, dγ2 = prepare_wy_repr_bwd(kn, v, beta, A, dw, dv2, γ)   (dk2 summed over the G heads)
//   dk = dk1 + dk2;  dg = reverse chunk_local_cumsum(dγ1 + dγ2)
//   [l2norm]  dq, dk = row_norm_bwd_cuda(qn | kn, rstd, dq | dk)   (dx = rstd (dy - (dy . y) y))
// Every step is a fixed-order computation (no float atomics), so the result is the same bits on every run.
// Intermediates (qn, kn, A, w, u, h, v_new, dv_local, dh, dv2, dw) are stored in the token dtype when q, k, v (and
// do) share one 16-bit dtype, so that every sub-operator runs its tensor-core kernels (fla's precision model), and
// in f32 otherwise (FMA kernels); see Sizes::idt and gdn_cuda_tensor_core_report.
//
// cu_seqlens: the sub-operator kernels clamp every value to [0, T] and never leave their tensors whatever the
// values. To report invalid values as the CPU path does (INVALID_VALUE, nothing written), run() first checks
// them in a one-block kernel and reads the verdict back (one 8-byte copy and a stream synchronisation, only
// with cu_seqlens; fixed-length calls never synchronise). While the stream is being captured into a CUDA graph
// a synchronisation is not allowed: the check is skipped and invalid values give clamped, in-bounds garbage.
#include <cuda_runtime.h>

#include <algorithm>
#include <climits>
#include <cstdint>
#include <string>

#include "ops/linear_attn/chunk_bwd_dqkwg/chunk_bwd_dqkwg.h"
#include "ops/linear_attn/chunk_bwd_dv_local/chunk_bwd_dv_local.h"
#include "ops/linear_attn/chunk_gated_delta_rule/chunk_gated_delta_rule.h"
#include "ops/linear_attn/chunk_gated_delta_rule_bwd_dhu/chunk_gated_delta_rule_bwd_dhu.h"
#include "ops/linear_attn/chunk_local_cumsum/chunk_local_cumsum.h"
#include "ops/linear_attn/gdn_common/gdn_fwd_kernels.h"
#include "ops/linear_attn/prepare_wy_repr_bwd/prepare_wy_repr_bwd.h"
#include "ops/norm/common/row_norm.h"
#include "opbase/row_layout.h"
#include "runtime/error.h"
#include "tile/cuda/check.cuh"

namespace strata::linear_attn {
namespace {

constexpr int kThreads = 256;
constexpr int64_t kBT = kGdnChunk;  // 64
constexpr int64_t kMaxBlocks = int64_t{1} << 20;  // grid-stride loops cover the rest

size_t align256(size_t x) { return (x + 255) / 256 * 256; }

// ---- workspace layout (one function for the size and the carve: base == nullptr only measures) ----
struct Carver {
  char* base = nullptr;
  size_t off = 0;
  template <class T>
  T* take(int64_t count) {
    return static_cast<T*>(take_bytes(static_cast<size_t>(count < 0 ? 0 : count) * sizeof(T)));
  }
  void* take_bytes(size_t bytes) {
    const size_t o = off;
    off += align256(bytes);
    return base ? base + o : nullptr;
  }
};

// Problem sizes derived from GdnParams.
struct Sizes {
  int64_t qk, rows, gates, wk, uv, amat;  // elements of [B,T,H,K], [B,T,H], [B,T,HV], [B,T,HV,K], [B,T,HV,V], [B,T,HV,64]
  int64_t NTr;    // chunks per batch row, ceil(T / 64)
  int64_t NTh;    // chunk dimension of the h / dh buffers: NTr (fixed length) or ceil(T / 64) + N (varlen bound)
  int64_t rows_h; // leading dimension of h / dh: B (fixed length) or 1 (varlen)
  int64_t hsz;    // elements of h
  // dtype of the token-shaped intermediates (gdn_inter_dtype); γ, rstd, the dq/dk/dγ sums and the states stay f32.
  int32_t idt;
  size_t ies;     // its element size
  size_t tok(int64_t n) const { return static_cast<size_t>(n) * ies; }
};
Sizes sizes_of(const GdnParams& p, bool bwd) {
  Sizes s;
  s.idt = gdn_inter_dtype(p, bwd);
  s.ies = s.idt == STRATA_DTYPE_F32 ? 4 : 2;
  const int64_t BT = p.B * p.T;
  s.qk = BT * p.H * p.K;
  s.rows = BT * p.H;
  s.gates = BT * p.HV;
  s.wk = BT * p.HV * p.K;
  s.uv = BT * p.HV * p.V;
  s.amat = BT * p.HV * kBT;
  s.NTr = (p.T + kBT - 1) / kBT;
  s.NTh = gdn_state_chunks(p);
  s.rows_h = p.cu_seqlens ? 1 : p.B;
  s.hsz = s.rows_h * s.NTh * p.HV * p.K * p.V;
  return s;
}

gdn_bwd::Dims bwd_dims(const GdnParams& p, const Sizes& s) {
  gdn_bwd::Dims d;
  d.B = p.B, d.T = p.T, d.H = p.H, d.HV = p.HV, d.G = p.HV / p.H, d.K = p.K, d.V = p.V, d.N = p.N;
  d.NT = s.NTh;
  d.BT = static_cast<int32_t>(kBT);
  d.cu = p.cu_seqlens;
  d.cu_stride = p.cu_stride;
  return d;
}

// Scratch of the backward sub-operator entry points (they run one after the other). Early: bwd_dv_local and
// bwd_dhu (their chunk offsets), while dv_local (in u's buffer) is live. Late: bwd_dqkwg and prepare_wy_repr_bwd
// (per-value-head dq/dk and dγ tiles), after dv_local is dead: that region starts at u's buffer.
size_t early_scratch_bytes(const GdnParams& p, const Sizes& s) {
  const gdn_bwd::Dims d = bwd_dims(p, s);
  return std::max(chunk_bwd_dv_local_cuda_workspace(d), chunk_gated_delta_rule_bwd_dhu_cuda_workspace(d));
}

// The buffers of one pass. Forward: check | offsets | [qn kn rq rk] | γ | A | w | u | h | v_new.
// Backward: u is followed by whatever the late sub-operator scratch needs beyond u's size (u, then dv_local,
// then that scratch use the same memory, one after the other); dw reuses w (dead after bwd_dhu); then
// dh | dv2 | dq dk1 dk2 (f32 [B,T,H,K]) | dγ1 dγ2 | early sub-operator scratch.
// With p.saved, qn, kn, rq, rk, γ, A, w, h and v_new lie in the saved buffer (gdn_cuda_saved_layout) instead: the
// forward writes them there, the backward only reads them, so dw gets a buffer of its own (after u's).
struct Bufs {
  unsigned long long* check = nullptr;
  int64_t* offs = nullptr;
  void *qn = nullptr, *kn = nullptr;  // sdt
  float *rq = nullptr, *rk = nullptr, *gam = nullptr;
  void *A = nullptr, *w = nullptr, *u = nullptr, *h = nullptr, *vnew = nullptr;  // sdt
  void *dw = nullptr, *dh = nullptr, *dv2 = nullptr;                             // Sizes::idt
  float *dq = nullptr, *dk1 = nullptr, *dk2 = nullptr, *dg1 = nullptr, *dg2 = nullptr;
  void* early = nullptr;  // scratch of bwd_dv_local, bwd_dhu
  void* late = nullptr;   // scratch of bwd_dqkwg, prepare_wy_repr_bwd (starts at u)
  // dtype of the forward's intermediates (qn, kn, A, w, u, h, v_new): Sizes::idt, except in a backward reading
  // the saved buffer, which holds the forward's (gdn_inter_dtype(p, false): it may differ when do does not have
  // q's dtype; the sub-operators then run their FMA kernels, which read every tensor in its own dtype).
  int32_t sdt = STRATA_DTYPE_F32;
  size_t bytes = 0;
};
// carve_with's base for stand-in addresses only (the reject rules read dtypes, presence and shapes, never the
// memory): the saved buffer's parts then get stand-in addresses too.
void* const kAddressesOnly = reinterpret_cast<void*>(uintptr_t{256});
// `late`: bytes of the late scratch (late_scratch_bytes; 0 when only the other addresses are wanted).
// `fused` (forward only): the fused state + output pass runs, so h and v_new are not carved (absent).
// `sums` (backward only): whether dk2 and dγ2 get buffers of their own (false when prepare_wy_repr_bwd's
// tensor-core kernel adds dk1, dγ1 in its epilogue: see gdn_cuda_bwd).
Bufs carve_with(const GdnParams& p, bool bwd, void* base, size_t late, bool fused = false, bool sums = true) {
  const Sizes s = sizes_of(p, bwd);
  const bool saved = p.saved.present();
  Carver c{static_cast<char*>(base)};
  Bufs b;
  b.sdt = saved ? gdn_inter_dtype(p, false) : s.idt;
  b.check = c.take<unsigned long long>(1);
  b.offs = c.take<int64_t>(p.N + 1);
  if (saved) {
    const GdnSavedLayout L = gdn_cuda_saved_layout(p);
    char* const sb = static_cast<char*>(base == kAddressesOnly ? kAddressesOnly : p.saved.data);
    auto at = [&](size_t off) -> void* { return base ? sb + off : nullptr; };
    if (p.l2norm) {
      b.qn = at(L.qn), b.kn = at(L.kn);
      b.rq = static_cast<float*>(at(L.rq)), b.rk = static_cast<float*>(at(L.rk));
    }
    b.gam = static_cast<float*>(at(L.gam));
    b.A = at(L.A), b.w = at(L.w), b.h = at(L.h), b.vnew = at(L.vnew);
  } else {
    if (p.l2norm) {
      b.qn = c.take_bytes(s.tok(s.qk));
      b.kn = c.take_bytes(s.tok(s.qk));
      b.rq = c.take<float>(s.rows);
      b.rk = c.take<float>(s.rows);
    }
    b.gam = c.take<float>(s.gates);
    b.A = c.take_bytes(s.tok(s.amat));
    b.w = c.take_bytes(s.tok(s.wk));
  }
  b.u = c.take_bytes(s.tok(s.uv));
  if (bwd) {
    const size_t u_bytes = align256(s.tok(s.uv));
    if (late > u_bytes) c.take_bytes(late - u_bytes);  // contiguous with u
    b.late = b.u;
  }
  if (!fused && !saved) {
    b.h = c.take_bytes(s.tok(s.hsz));
    b.vnew = c.take_bytes(s.tok(s.uv));
  }
  if (bwd) {
    b.dw = saved ? c.take_bytes(s.tok(s.wk)) : b.w;
    b.dh = c.take_bytes(s.tok(s.hsz));
    b.dv2 = c.take_bytes(s.tok(s.uv));
    b.dq = c.take<float>(s.qk);
    b.dk1 = c.take<float>(s.qk);
    if (sums) b.dk2 = c.take<float>(s.qk);
    b.dg1 = c.take<float>(s.gates);
    if (sums) b.dg2 = c.take<float>(s.gates);
    b.early = c.take<char>(static_cast<int64_t>(early_scratch_bytes(p, s)));
  }
  b.bytes = c.off;
  return b;
}

// ---- tensor views for the sub-operators ----
// The op's strided tensors (GdnTensor: strides of up to four dimensions, unit last stride) as the forward
// sub-operators' GdnTensor (five strides) and the backward sub-operators' View (outer strides).
gdn::GdnTensor fwd_view(const GdnTensor& t) {
  gdn::GdnTensor r;
  r.data = t.data;
  r.dtype = t.dtype;
  for (int i = 0; i < 4; ++i) r.st[i] = t.st[i];
  return r;
}
gdn_bwd::View bwd_view(const GdnTensor& t) {
  gdn_bwd::View r;
  r.p = t.data;
  r.dtype = t.dtype;
  // token tensors [B, T, heads, D]: (b, t, head) strides; gates [B, T, HV]: all three; states [N, HV, K, V]:
  // (n, hv, k) strides — the first three in every case.
  for (int i = 0; i < 3; ++i) r.s[i] = t.st[i];
  return r;
}
// Contiguous workspace tensors of dtype dt: [B, T, heads, D] (D = 0: gates [B, T, heads]).
gdn::GdnTensor fwd_tok(void* ptr, int32_t dt, int64_t T, int64_t heads, int64_t D) {
  gdn::GdnTensor r;
  r.data = ptr;
  r.dtype = dt;
  if (D > 0) {
    r.st[0] = T * heads * D, r.st[1] = heads * D, r.st[2] = D, r.st[3] = 1;
  } else {
    r.st[0] = T * heads, r.st[1] = heads, r.st[2] = 1;
  }
  return r;
}
gdn_bwd::View bwd_tok(void* ptr, int32_t dt, int64_t T, int64_t heads, int64_t D) {
  gdn_bwd::View r;
  r.p = ptr;
  r.dtype = dt;
  if (D > 0) {
    r.s[0] = T * heads * D, r.s[1] = heads * D, r.s[2] = D;
  } else {
    r.s[0] = T * heads, r.s[1] = heads, r.s[2] = 1;
  }
  return r;
}
// h / dh buffers [rows_h, NTh, HV, K, V] of dtype dt.
gdn::GdnTensor fwd_states(void* ptr, int32_t dt, const GdnParams& p, const Sizes& s) {
  gdn::GdnTensor r;
  r.data = ptr;
  r.dtype = dt;
  r.st[4] = 1, r.st[3] = p.V, r.st[2] = p.K * p.V, r.st[1] = p.HV * p.K * p.V, r.st[0] = s.NTh * p.HV * p.K * p.V;
  return r;
}
gdn_bwd::View bwd_states(void* ptr, int32_t dt, const GdnParams& p, const Sizes& s) {
  gdn_bwd::View r;
  r.p = ptr;
  r.dtype = dt;
  r.s[3] = p.V, r.s[2] = p.K * p.V, r.s[1] = p.HV * p.K * p.V, r.s[0] = s.NTh * p.HV * p.K * p.V;
  return r;
}

strata_tensor_desc desc_of(int32_t dtype, std::initializer_list<int64_t> shape, const int64_t* strides) {
  strata_tensor_desc d{};
  d.dtype = dtype;
  d.rank = static_cast<int32_t>(shape.size());
  int i = 0;
  for (int64_t x : shape) d.shape[i++] = x;
  if (strides) {
    for (int j = 0; j < d.rank; ++j) d.strides[j] = strides[j];
  } else {
    int64_t st = 1;
    for (int j = d.rank - 1; j >= 0; --j) {
      d.strides[j] = st;
      st *= d.shape[j] > 0 ? d.shape[j] : 1;
    }
  }
  return d;
}

// ---- small kernels ----

// First index i of cu_seqlens[0..N] that breaks a rule (cu[0] == 0, cu[i] >= cu[i-1], cu[N] == T), or ULLONG_MAX.
// One block; the integer minimum makes the verdict independent of the thread schedule.
__global__ void __launch_bounds__(kThreads) check_cu_kernel(const int64_t* cu, int64_t stride, int64_t N, int64_t T,
                                                           unsigned long long* out) {
  __shared__ unsigned long long first;
  if (threadIdx.x == 0) first = ULLONG_MAX;
  __syncthreads();
  for (int64_t i = threadIdx.x; i <= N; i += blockDim.x) {
    const int64_t x = cu[i * stride];
    bool bad = i == 0 ? x != 0 : x < cu[(i - 1) * stride];
    if (i == N && x != T) bad = true;
    if (bad) atomicMin(&first, static_cast<unsigned long long>(i));
  }
  __syncthreads();
  if (threadIdx.x == 0) *out = first;
}

// out[b, t, h, d] = a[i] + b[i] (b optional) for contiguous f32 a, b [B, T, H, D], stored in out's dtype and
// strides ((b, t, h) strides, unit last stride; D = 1 with gates [B, T, H] uses st[2] as the head stride).
struct AddOut {
  void* p;
  int32_t dtype;
  int64_t st[3];
  int64_t T, H, D;
};
__global__ void __launch_bounds__(kThreads) add_store_kernel(const float* a, const float* b, AddOut o, int64_t total) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t d = i % o.D, r = i / o.D, h = r % o.H, bt = r / o.H, t = bt % o.T, bb = bt / o.T;
    const float x = b ? a[i] + b[i] : a[i];
    gdn::store_f(o.p, o.dtype, bb * o.st[0] + t * o.st[1] + h * o.st[2] + d, x);
  }
}

strata_status add_store(const float* a, const float* b, AddOut o, int64_t total, cudaStream_t stream) {
  if (total <= 0) return STRATA_SUCCESS;
  const int64_t blocks = std::min<int64_t>(cuda::ceil_div(total, kThreads), kMaxBlocks);
  add_store_kernel<<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(a, b, o, total);
  return cuda::check_launch("chunk_gated_delta_rule (add_store)");
}
AddOut add_out_of(const GdnTensor& t, int64_t T, int64_t H, int64_t D) {
  return AddOut{t.data, t.dtype, {t.st[0], t.st[1], t.st[2]}, T, H, D};
}
AddOut add_out_f32(float* ptr, int64_t T, int64_t H, int64_t D) {
  return AddOut{ptr, STRATA_DTYPE_F32, {T * H * D, H * D, D}, T, H, D};
}

// Checks cu_seqlens on the device and reads the verdict back (see the file comment). INVALID_VALUE with the
// CPU path's messages.
strata_status check_cu_seqlens(const char* op, const GdnParams& p, unsigned long long* flag, cudaStream_t stream) {
  if (!p.cu_seqlens) return STRATA_SUCCESS;
  cudaStreamCaptureStatus cap = cudaStreamCaptureStatusNone;
  STRATA_CUDA_TRY(cudaStreamIsCapturing(stream, &cap));
  if (cap != cudaStreamCaptureStatusNone) return STRATA_SUCCESS;  // no synchronisation inside a capture
  check_cu_kernel<<<1, kThreads, 0, stream>>>(p.cu_seqlens, p.cu_stride, p.N, p.T, flag);
  STRATA_RETURN_IF_ERROR(cuda::check_launch("chunk_gated_delta_rule (check cu_seqlens)"));
  unsigned long long first = 0;
  STRATA_CUDA_TRY(cudaMemcpyAsync(&first, flag, sizeof(first), cudaMemcpyDeviceToHost, stream));
  STRATA_CUDA_TRY(cudaStreamSynchronize(stream));
  if (first == ULLONG_MAX) return STRATA_SUCCESS;
  const int64_t i = static_cast<int64_t>(first);
  int64_t vals[2] = {0, 0};  // cu[i - 1], cu[i] (error path only)
  STRATA_CUDA_TRY(cudaMemcpy(&vals[1], p.cu_seqlens + i * p.cu_stride, sizeof(int64_t), cudaMemcpyDeviceToHost));
  if (i > 0)
    STRATA_CUDA_TRY(
        cudaMemcpy(&vals[0], p.cu_seqlens + (i - 1) * p.cu_stride, sizeof(int64_t), cudaMemcpyDeviceToHost));
  if (i == 0) return fail(STRATA_ERROR_INVALID_VALUE, "{}: cu_seqlens[0] must be 0, got {}", op, vals[1]);
  if (vals[1] < vals[0])
    return fail(STRATA_ERROR_INVALID_VALUE,
                "{}: cu_seqlens must be non-decreasing, got cu_seqlens[{}] = {} after cu_seqlens[{}] = {}", op, i,
                vals[1], i - 1, vals[0]);
  return fail(STRATA_ERROR_INVALID_VALUE, "{}: the last entry cu_seqlens[{}] must equal T = {} (q.shape[1]), got {}",
              op, p.N, p.T, vals[1]);
}

// The saved buffer's parts are 256-byte aligned relative to its start (gdn_cuda_saved_layout); the sub-operators'
// vector loads need the start aligned too. Checked before anything is written.
strata_status check_saved_alignment(const char* op, const GdnParams& p) {
  const uintptr_t a = reinterpret_cast<uintptr_t>(p.saved.data);
  if (p.saved.present() && a % 256 != 0)
    return fail(STRATA_ERROR_INVALID_VALUE, "{}: saved must start at a 256-byte aligned address, got {:#x}", op, a);
  return STRATA_SUCCESS;
}

// The saved buffer's bytes that no step writes (GdnSavedLayout's padding; with cu_seqlens the chunk-state slots
// from offs[N], the chunk count, to h's end: h has ceil(T/64) + N slots, a bound), zeroed by the forward so that the
// buffer is the same bits on every run. One launch; the padding is < 256 bytes a part, the slots 16-byte stores.
struct SavedGaps {
  int64_t begin[9], end[9];
  int n = 0;
  const int64_t* offs = nullptr;  // varlen: chunk offsets [N + 1] (device)
  int64_t N = 0, h = 0, h_end = 0, slot = 0;  // h's start and end, bytes per chunk slot
};
__global__ void __launch_bounds__(kThreads) zero_saved_gaps_kernel(unsigned char* base, SavedGaps g) {
  const int64_t tid = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  const int64_t nth = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int r = 0; r < g.n; ++r)
    for (int64_t i = g.begin[r] + tid; i < g.end[r]; i += nth) base[i] = 0;
  if (!g.offs) return;
  const int64_t from = g.h + g.offs[g.N] * g.slot;
  if (((from | g.h_end) & 15) == 0) {
    for (int64_t i = from / 16 + tid; i < g.h_end / 16; i += nth) reinterpret_cast<uint4*>(base)[i] = uint4{0, 0, 0, 0};
  } else {
    for (int64_t i = from + tid; i < g.h_end; i += nth) base[i] = 0;
  }
}
strata_status zero_saved_gaps(const GdnParams& p, const Bufs& b, cudaStream_t stream) {
  if (!p.saved.present()) return STRATA_SUCCESS;
  const GdnSavedLayout L = gdn_cuda_saved_layout(p);
  SavedGaps g;
  for (int i = 0; i < L.pads; ++i) g.begin[i] = static_cast<int64_t>(L.pad_begin[i]), g.end[i] = static_cast<int64_t>(L.pad_end[i]);
  g.n = L.pads;
  if (p.cu_seqlens) {
    g.offs = b.offs, g.N = p.N;
    g.h = static_cast<int64_t>(L.h), g.h_end = static_cast<int64_t>(L.h_end);
    g.slot = p.HV * p.K * p.V * static_cast<int64_t>(gdn_inter_dtype(p, false) == STRATA_DTYPE_F32 ? 4 : 2);
  }
  if (g.n == 0 && !g.offs) return STRATA_SUCCESS;
  zero_saved_gaps_kernel<<<264, kThreads, 0, stream>>>(static_cast<unsigned char*>(p.saved.data), g);
  return cuda::check_launch("chunk_gated_delta_rule (zero the saved buffer's gaps)");
}

// ---- steps ----

// l2norm of q and k into qn, kn (contiguous, dtype b.sdt) with rstd rq, rk (f32); with rq_only, rq alone
// (GdnFusedForm::kNormR: prep and the pass normalise k themselves, the pass scales the raw q's products by rq).
strata_status l2norm_fwd(const GdnParams& p, const Bufs& b, cudaStream_t stream, bool rq_only = false) {
  if (!p.l2norm || p.B * p.T * p.H == 0) return STRATA_SUCCESS;
  const strata_tensor_desc f = desc_of(b.sdt, {p.B, p.T, p.H, p.K}, nullptr);
  const strata_tensor_desc r = desc_of(STRATA_DTYPE_F32, {p.B, p.T, p.H}, nullptr);
  for (int which = 0; which < (rq_only ? 1 : 2); ++which) {
    const GdnTensor& x = which == 0 ? p.q : p.k;
    const strata_tensor_desc xd = desc_of(x.dtype, {p.B, p.T, p.H, p.K}, x.st);
    norm::RowNormFwdParams a;
    a.x = x.data;
    a.y = rq_only ? nullptr : which == 0 ? b.qn : b.kn;
    a.rstd = which == 0 ? b.rq : b.rk;
    a.x_dtype = x.dtype;
    a.y_dtype = b.sdt;
    a.rstd_dtype = STRATA_DTYPE_F32;
    a.rows = p.B * p.T * p.H;
    a.D = p.K;
    a.x_rows = make_row_layout(xd, 1);
    a.y_rows = make_row_layout(f, 1);
    a.rstd_rows = make_row_layout(r, 0);
    a.n_div = 1;
    a.eps = static_cast<float>(kGdnL2Eps);
    STRATA_RETURN_IF_ERROR(static_cast<strata_status>(norm::row_norm_fwd_cuda(a, stream)));
  }
  return STRATA_SUCCESS;
}

// dx = rstd (dy - (dy . y) y) from the f32 dy buffer into the output dx (y contiguous, dtype y_dt); nothing without
// dy (dq written final by chunk_bwd_dqkwg: gdn_cuda_bwd's dq_final).
strata_status l2norm_bwd(const GdnParams& p, const void* y, int32_t y_dt, const float* rstd, const float* dy,
                         const GdnTensor& dx, cudaStream_t stream) {
  if (!dy || p.B * p.T * p.H == 0) return STRATA_SUCCESS;
  const strata_tensor_desc fy = desc_of(y_dt, {p.B, p.T, p.H, p.K}, nullptr);
  const strata_tensor_desc f = desc_of(STRATA_DTYPE_F32, {p.B, p.T, p.H, p.K}, nullptr);
  const strata_tensor_desc r = desc_of(STRATA_DTYPE_F32, {p.B, p.T, p.H}, nullptr);
  const strata_tensor_desc xd = desc_of(dx.dtype, {p.B, p.T, p.H, p.K}, dx.st);
  norm::RowNormBwdParams a;
  a.src = y;
  a.rstd = rstd;
  a.dout = dy;
  a.dx = dx.data;
  a.src_dtype = y_dt;
  a.rstd_dtype = a.dout_dtype = STRATA_DTYPE_F32;
  a.dx_dtype = dx.dtype;
  a.rows = p.B * p.T * p.H;
  a.D = p.K;
  a.src_rows = make_row_layout(fy, 1);
  a.dout_rows = make_row_layout(f, 1);
  a.rstd_rows = make_row_layout(r, 0);
  a.dx_rows = make_row_layout(xd, 1);
  a.n_div = 1;
  a.kind = norm::RowNormBwdKind::kNormalizedSrc;
  return static_cast<strata_status>(norm::row_norm_bwd_cuda(a, stream));
}

// Chunk-local cumsum over the gates [B, T, HV] (forward: γ from g; reverse: dg from dγ).
strata_status gate_cumsum(const GdnParams& p, const void* in, int32_t in_dtype, const int64_t* in_st, void* out,
                          int32_t out_dtype, const int64_t* out_st, bool reverse, cudaStream_t stream) {
  if (p.B * p.T * p.HV == 0) return STRATA_SUCCESS;
  ChunkCumsumParams c;
  c.g = in;
  c.out = out;
  c.cu_seqlens = p.cu_seqlens;
  c.cu_stride = p.cu_stride;
  c.g_dtype = in_dtype;
  c.out_dtype = out_dtype;
  c.B = p.B, c.T = p.T, c.H = p.HV, c.S = 1, c.lanes = p.HV;
  for (int i = 0; i < 3; ++i) c.g_strides[i] = in_st[i], c.out_strides[i] = out_st[i];
  c.g_strides[3] = c.out_strides[3] = 0;
  c.lanes_contiguous = (p.HV == 1 || in_st[2] == 1) && (p.HV == 1 || out_st[2] == 1);
  c.num_seqs = p.N;
  c.chunk_size = static_cast<int32_t>(kBT);
  c.reverse = reverse;
  c.scale = 1.f;
  return static_cast<strata_status>(chunk_local_cumsum_cuda(c, stream));
}

// The forward sub-operator params: shape, chunks (device offsets), q/k (normalised or the inputs), γ.
gdn::GdnFwdParams fwd_params(const GdnParams& p, const Bufs& b, const Sizes& s) {
  gdn::GdnFwdParams f;
  gdn::GdnShape& sh = f.shape;
  sh.B = p.B, sh.T = p.T, sh.H = p.H, sh.HV = p.HV, sh.G = p.HV / p.H, sh.K = p.K, sh.V = p.V, sh.BT = kBT;
  sh.N = p.N, sh.NTr = s.NTr, sh.NT = s.NTh, sh.scale = p.scale;
  gdn::GdnChunks& m = f.chunks;
  m.cu = p.cu_seqlens;
  m.cu_stride = p.cu_stride;
  m.offsets = p.cu_seqlens ? b.offs : nullptr;
  m.B = p.B, m.T = p.T, m.N = p.N, m.BT = kBT, m.NTr = s.NTr;
  f.q = p.l2norm ? fwd_tok(b.qn, b.sdt, p.T, p.H, p.K) : fwd_view(p.q);
  f.k = p.l2norm ? fwd_tok(b.kn, b.sdt, p.T, p.H, p.K) : fwd_view(p.k);
  f.v = fwd_view(p.v);
  f.beta = fwd_view(p.beta);
  f.g = fwd_tok(b.gam, STRATA_DTYPE_F32, p.T, p.HV, 0);
  return f;
}

// The parameters of every sub-operator call of one pass (built once; run() and the tensor-core report use them).
struct Calls {
  gdn::GdnFwdParams wy, fwdh, fwdo;  // prepare_wy_repr_fwd, chunk_gated_delta_rule_fwd_h, chunk_fwd_o
  DvLocalParams dvp;
  DhuParams dhp;
  DqkwgParams qp;
  WyBwdParams wp;
};
Calls make_calls(const GdnParams& p, const Bufs& b, const Sizes& s, bool bwd) {
  Calls c;
  gdn::GdnFwdParams f = fwd_params(p, b, s);
  f.w = fwd_tok(b.w, b.sdt, p.T, p.HV, p.K);
  f.u = fwd_tok(b.u, b.sdt, p.T, p.HV, p.V);
  f.A = fwd_tok(b.A, b.sdt, p.T, p.HV, kBT);
  c.wy = f;
  f.h = fwd_states(b.h, b.sdt, p, s);
  f.h0 = fwd_view(p.h0);
  f.ht = bwd ? gdn::GdnTensor{} : fwd_view(p.ht);  // the backward's re-run needs no final state
  f.v_new = fwd_tok(b.vnew, b.sdt, p.T, p.HV, p.V);
  c.fwdh = f;
  f.v = f.v_new;  // chunk_fwd_o reads the corrected values
  f.o = fwd_view(p.o);
  c.fwdo = f;
  if (!bwd) return c;

  const gdn_bwd::Dims d = bwd_dims(p, s);
  const gdn_bwd::View q = p.l2norm ? bwd_tok(b.qn, b.sdt, p.T, p.H, p.K) : bwd_view(p.q);
  const gdn_bwd::View k = p.l2norm ? bwd_tok(b.kn, b.sdt, p.T, p.H, p.K) : bwd_view(p.k);
  const gdn_bwd::View gam = bwd_tok(b.gam, STRATA_DTYPE_F32, p.T, p.HV, 0), dout = bwd_view(p.do_);
  void* dvl = b.u;  // u is dead after the state pass (or never written: saved)
  void* dw = b.dw;  // w's buffer (dead after bwd_dhu), or its own with the saved buffer (read-only)

  DvLocalParams& dvp = c.dvp;
  dvp.d = d;
  dvp.q = q, dvp.k = k, dvp.dout = dout, dvp.g = gam;
  dvp.dv = bwd_tok(dvl, s.idt, p.T, p.HV, p.V);
  dvp.scale = p.scale;

  DhuParams& dhp = c.dhp;
  dhp.d = d;
  dhp.q = q, dhp.k = k, dhp.w = bwd_tok(b.w, b.sdt, p.T, p.HV, p.K), dhp.dout = dout;
  dhp.dv = bwd_tok(dvl, s.idt, p.T, p.HV, p.V);
  dhp.g = gam;
  dhp.dht = bwd_view(p.dht);
  dhp.dh = bwd_states(b.dh, s.idt, p, s);
  dhp.dh0 = bwd_view(p.dh0);
  dhp.dv2 = bwd_tok(b.dv2, s.idt, p.T, p.HV, p.V);
  dhp.scale = p.scale;

  DqkwgParams& qp = c.qp;
  qp.d = d;
  qp.q = q, qp.k = k, qp.v = bwd_tok(b.vnew, b.sdt, p.T, p.HV, p.V), qp.dout = dout;
  qp.h = bwd_states(b.h, b.sdt, p, s);
  qp.dh = bwd_states(b.dh, s.idt, p, s);
  qp.dv = bwd_tok(b.dv2, s.idt, p.T, p.HV, p.V);
  qp.g = gam;
  // without l2norm dq is final here
  qp.dq = p.l2norm ? bwd_tok(b.dq, STRATA_DTYPE_F32, p.T, p.H, p.K) : bwd_view(p.dq);
  qp.dk = bwd_tok(b.dk1, STRATA_DTYPE_F32, p.T, p.H, p.K);
  qp.dw = bwd_tok(dw, s.idt, p.T, p.HV, p.K);
  qp.dg = bwd_tok(b.dg1, STRATA_DTYPE_F32, p.T, p.HV, 0);
  qp.scale = p.scale;

  WyBwdParams& wp = c.wp;
  wp.d = d;
  wp.k = k, wp.v = bwd_view(p.v), wp.beta = bwd_view(p.beta);
  wp.A = bwd_tok(b.A, b.sdt, p.T, p.HV, kBT);
  wp.dw = bwd_tok(dw, s.idt, p.T, p.HV, p.K);
  wp.du = bwd_tok(b.dv2, s.idt, p.T, p.HV, p.V);
  wp.g = gam;
  wp.dk = bwd_tok(b.dk2, STRATA_DTYPE_F32, p.T, p.H, p.K);
  wp.dv = bwd_view(p.dv);
  wp.dbeta = bwd_view(p.dbeta);
  wp.dg = bwd_tok(b.dg2, STRATA_DTYPE_F32, p.T, p.HV, 0);
  return c;
}

// The gate cumsum folded into the pre-state kernel (gdn::fwd_cuda_prep_head): the raw g in, γ written into the
// buffer the other sub-operators read, instead of the chunk_local_cumsum launch; forced by GdnFusedForm::kFold
// ("cuda.sm90.fused_fold") only. kFoldHead would make every pass fold it where it applies (prep_wgmma's rule): measured
// slower in GPU run s11run2 (H200, bf16 B = 4 T = 8192 H = 16 HV = 32 K = V = 128: prep_wgmma w, u 0.431 -> 0.510 ms
// for a 0.009 ms cumsum launch; forward 1.309 -> 1.352 ms; the backward's forward WY 0.66 -> 0.78 ms), so it is off.
// Folding the l2norm of q, k as well was slower still (s11run1) and was removed: ../gdn_common/README.md, "The
// forward's kernels and the folded gate cumsum".
constexpr bool kFoldHead = false;
gdn::GdnFwdHead fold_head(const GdnParams& p) {
  gdn::GdnFwdHead hd;
  hd.g_in = fwd_view(p.g);
  return hd;
}

// Shared head of every pass: cu_seqlens check, l2norm, γ, chunk offsets, WY factors.
// `prep` (the fused forward's kPrep form): w, u and its Pqk from gdn::fwd_cuda_prep instead of prepare_wy_repr_fwd.
// `fold`: γ formed by the pre-state kernel (fold_head) where it takes c.wy.
// `probe` (timing tests): marks "l2norm" and "cumsum" after their launches (the caller marks the WY step).
void mark(const GdnStepProbe* probe, const char* step) {
  if (probe && probe->fn) probe->fn(probe->ctx, step);
}
strata_status forward_wy(const char* op, const GdnParams& p, const Bufs& b, const Sizes& s, const Calls& c,
                         cudaStream_t stream, bool fold, const gdn::GdnFwdParams* prep = nullptr,
                         const GdnStepProbe* probe = nullptr) {
  STRATA_RETURN_IF_ERROR(check_cu_seqlens(op, p, b.check, stream));
  const gdn::GdnFwdHead head = fold_head(p);
  fold = fold && !prep && gdn::fwd_cuda_prep_head_reject(c.wy, head).empty();
  STRATA_RETURN_IF_ERROR(l2norm_fwd(p, b, stream));
  mark(probe, "l2norm");
  if (!fold) {
    const int64_t gst[3] = {p.T * p.HV, p.HV, 1};
    STRATA_RETURN_IF_ERROR(gate_cumsum(p, p.g.data, p.g.dtype, p.g.st, b.gam, STRATA_DTYPE_F32, gst, false, stream));
  }
  mark(probe, "cumsum");
  STRATA_RETURN_IF_ERROR(static_cast<strata_status>(gdn::gdn_chunk_offsets_cuda(c.wy.chunks, b.offs, stream)));
  if (fold) return static_cast<strata_status>(gdn::fwd_cuda_prep_head(c.wy, head, stream));
  if (prep) return static_cast<strata_status>(gdn::fwd_cuda_prep(*prep, stream));
  return static_cast<strata_status>(gdn::fwd_cuda(gdn::FwdOp::kPrepareWY, c.wy, stream));
}

// forward_wy, then the state pass (h, v_new and, in the forward, the final state).
strata_status forward_states(const char* op, const GdnParams& p, const Bufs& b, const Sizes& s, const Calls& c,
                             cudaStream_t stream) {
  STRATA_RETURN_IF_ERROR(forward_wy(op, p, b, s, c, stream, kFoldHead));
  return static_cast<strata_status>(gdn::fwd_cuda(gdn::FwdOp::kFwdH, c.fwdh, stream));
}

// Which kernel the two late sub-operators run (their tensor-core kernels when their reject rule is empty, as
// their automatic entry points decide) and so how much scratch they need: the FMA kernels of chunk_bwd_dqkwg
// keep per-value-head dq, dk in f32 ([B, T, HV, K] each), the tensor-core ones do not.
bool dqkwg_mma(const Calls& c) { return chunk_bwd_dqkwg_cuda_mma_reject(c.qp).empty(); }
// With l2norm (session 16, GdnBwdDq::kStaged): chunk_bwd_dqkwg writing the final dq through dq's l2norm backward
// (chunk_bwd_dqkwg_cuda_wgmma_dq_norm: its rows staged in shared memory at each item's end), so that neither the f32
// dq head sums (b.dq) nor the tail's row_norm_bwd pass over them exist. Its call: dq the output, rstd rq.
DqkwgParams dq_fold_call(const GdnParams& p, const Calls& c) {
  DqkwgParams qp = c.qp;
  qp.dq = bwd_view(p.dq);
  return qp;
}
gdn_bwd::View dq_fold_rstd(const GdnParams& p, const Bufs& b) { return bwd_tok(b.rq, STRATA_DTYPE_F32, p.T, p.H, 0); }
// GdnBwdDq::kAuto: the staged fold where it runs. GPU run s17run1 (H200, 2026-12-01, bf16 H = 16 HV = 32 K = V = 128,
// l2norm, composed backward reading saved, median of 9 interleaved): B = 4 T = 8192 3.222 -> 3.133 ms, B = 1 T = 32768
// 4.189 -> 4.127 ms (dqkwg 1.18 -> 1.30 ms, the tail 0.33 -> 0.17 ms).
constexpr GdnBwdDq kGdnBwdDqAuto = GdnBwdDq::kStaged;
// Whether bwd_dhu's tensor-core kernel forms dv_local itself (DhuParams::fuse_dv_local: no chunk_bwd_dv_local pass,
// no dv_local tensor): when both sub-operators would run their tensor-core kernels (then the fused kernel gives
// the same bits: it repeats dv_local's products, summation order and rounding) and bwd_dhu runs its 64-column
// one-stage tiles (64 < K <= 128, not dhu_narrow_tiles). Measured on the H200 (GPU run s6run2, bf16, HV = 32,
// K = V = 128): 64-column tiles (B = 4, T = 8192) 1.252 ms fused against 1.420 ms for dv_local + bwd_dhu; 32-column
// tiles (B = 1, T = 32768: each of the four V-tile blocks forms K Qᵀ) 2.847 ms fused against 2.546 ms, so those
// keep the two calls, as do K <= 64 (other tile shapes, not timed).
// With bwd_dhu's warpgroup-MMA kernel (chunk_gated_delta_rule_bwd_dhu_takes_wgmma: kDhuWgmma forced, or its
// automatic choice; any column width), kFuseDvLocalInWgmmaDhu decides (it forms P = K Qᵀ and Bm dO beside the
// recurrence's products; not the same bits as chunk_bwd_dv_local, within the tolerance of the float64 checks).
// GPU run s9run2 (H200, bf16, HV = 32, K = V = 128): fused 0.929 ms against 0.416 + 1.007 ms for dv_local + the dv-read
// kernel (B = 4, T = 8192), 2.202 against 0.414 + 2.118 ms (B = 1, T = 32768).
constexpr bool kFuseDvLocalInDhu = true;
constexpr bool kFuseDvLocalInWgmmaDhu = true;
bool dhu_fused_dv_local(const Calls& c, int dhu_variant) {
  const gdn_bwd::Dims& d = c.dhp.d;
  if (!chunk_bwd_dv_local_cuda_mma_reject(c.dvp).empty() || !chunk_gated_delta_rule_bwd_dhu_cuda_mma_reject(c.dhp).empty())
    return false;
  DhuParams f = c.dhp;
  f.mma_variant = dhu_variant;
  f.fuse_dv_local = true;
  f.dv = gdn_bwd::View{};
  if (chunk_gated_delta_rule_bwd_dhu_takes_wgmma(f)) return kFuseDvLocalInWgmmaDhu;
  return kFuseDvLocalInDhu && d.K > 64 && d.K <= 128 && !dhu_narrow_tiles(d, ::strata::cuda::current_sm_count()) &&
         chunk_gated_delta_rule_bwd_dhu_fuses_dv_local(c.dhp);
}
bool wy_bwd_mma(const Calls& c) { return prepare_wy_repr_bwd_cuda_mma_reject(c.wp).empty(); }
// prepare_wy_repr_bwd's tensor-core call (form `variant`, WyBwdParams::mma_variant). It adds dk1 and dγ1 in its
// epilogue (dk = dk1 + dk2, dγ1 = dγ1 + dγ2, one f32 addition per element as add_store does: the same bits, without
// the extra pass over two f32 [B, T, H, K] tensors): dk straight into the output (into dk1 in place with l2norm), dγ
// in place into dγ1.
WyBwdParams wy_bwd_call(const GdnParams& p, const Bufs& b, const Calls& c, int variant) {
  WyBwdParams wp = c.wp;
  wp.mma_variant = variant;
  wp.dk_add = bwd_tok(b.dk1, STRATA_DTYPE_F32, p.T, p.H, p.K);
  wp.dk = p.l2norm ? wp.dk_add : bwd_view(p.dk);
  wp.dg_add = wp.dg = bwd_tok(b.dg1, STRATA_DTYPE_F32, p.T, p.HV, 0);
  return wp;
}
// With l2norm: the same call writing the final dk through dk's l2norm backward (WyBwdParams::dk_rstd = rk; the
// kWyFinStaged form), so that the tail's row_norm_bwd pass over the f32 dk1 is not run. Taken where
// prepare_wy_repr_bwd_cuda_mma_reject accepts it (K and V rounding up to the same multiple of 64, at most 128).
WyBwdParams wy_bwd_dk_fold(const GdnParams& p, const Bufs& b, WyBwdParams wp) {
  wp.dk_rstd = bwd_tok(b.rk, STRATA_DTYPE_F32, p.T, p.H, 0);
  wp.dk = bwd_view(p.dk);
  return wp;
}
size_t late_scratch_bytes(const GdnParams& p, const Sizes& s) {
  const Bufs fake = carve_with(p, true, kAddressesOnly, 0);  // addresses only
  const Calls c = make_calls(p, fake, s, true);
  const gdn_bwd::Dims d = bwd_dims(p, s);
  // The tensor-core path: chunk_bwd_dqkwg_cuda's wgmma kernel or its mma.sync one (the same workspace).
  const size_t q = dqkwg_mma(c) ? std::max(chunk_bwd_dqkwg_cuda_wgmma_workspace(d), chunk_bwd_dqkwg_cuda_mma_workspace(d))
                                : chunk_bwd_dqkwg_cuda_fma_workspace(d);
  const size_t w = wy_bwd_mma(c) ? prepare_wy_repr_bwd_cuda_mma_workspace(d) : prepare_wy_repr_bwd_cuda_fma_workspace(d);
  return std::max(q, w);
}
// Whether the backward runs prepare_wy_repr_bwd's tensor-core kernel (which then also forms dk = dk1 + dk2 and
// dγ1 + dγ2, so dk2 and dγ2 need no buffers).
bool bwd_fused_sums(const GdnParams& p) {
  const Bufs fake = carve_with(p, true, kAddressesOnly, 0);  // addresses only
  return wy_bwd_mma(make_calls(p, fake, sizes_of(p, true), true));
}
Bufs carve(const GdnParams& p, bool bwd, void* base) {
  if (!bwd) return carve_with(p, false, base, 0);
  return carve_with(p, true, base, late_scratch_bytes(p, sizes_of(p, true)), /*fused=*/false,
                    /*sums=*/!bwd_fused_sums(p));
}

}  // namespace

size_t gdn_cuda_fwd_workspace(const GdnParams& p) { return carve(p, false, nullptr).bytes; }
size_t gdn_cuda_fused_fwd_workspace(const GdnParams& p) { return carve_with(p, false, nullptr, 0, true).bytes; }
std::string gdn_cuda_bwd_dq_fold_reject(const GdnParams& p) {
  if (!p.l2norm) return "folds dq's l2norm backward: needs l2norm";
  const Bufs fake = carve_with(p, true, kAddressesOnly, 0);  // addresses only
  const Calls c = make_calls(p, fake, sizes_of(p, true), true);
  return chunk_bwd_dqkwg_cuda_wgmma_dq_norm_reject(dq_fold_call(p, c), dq_fold_rstd(p, fake));
}

namespace {
// The forms with (part of) the l2norm folded into prep and the pass.
bool is_norm_form(GdnFusedForm form) {
  return form == GdnFusedForm::kNorm || form == GdnFusedForm::kNormR || form == GdnFusedForm::kNormCluster;
}
// The fused forward's state-pass params: c.fwdo, plus (pre_p) the gated Q Kᵀ in the A buffer, which the fused
// forward does not otherwise use (wy_mma does not store the inverse there): [B, T, HV, 64] in the token dtype.
gdn::GdnFwdParams fused_state_params(const Calls& c, bool pre_p) {
  gdn::GdnFwdParams f = c.fwdo;
  if (pre_p) f.Pqk = c.wy.A;
  return f;
}
// The kPrep form's gdn::fwd_cuda_prep params: c.wy without the inverse, with q and P into the A buffer.
gdn::GdnFwdParams prep_params(const Calls& c) {
  gdn::GdnFwdParams w = c.wy;
  w.Pqk = c.wy.A;
  w.A = gdn::GdnTensor{};
  return w;
}
// (Session 13, kNorm) f (c.wy without the inverse, or c.fwdo) reading the raw q, k with the l2norm folded in
// (gdn::GdnFwdParams::qk_norm); 1 / |k| of the rows passes from prep to the pass through the rk buffer (f32 [B, T, H]).
// (Session 14) kNormR: 1 / |q| in rq (b.rq, from the rstd-only launch) for the pass.
// (Session 16) kNormCluster: kNormR's params at 32 columns (the width on the current device), kNorm's otherwise, and
// the pass's cluster size (gdn::fwd_cuda_state_o_wgmma_cluster; 0 where none applies: reject says so).
gdn::GdnFwdParams norm_folded(const GdnParams& p, const Bufs& b, gdn::GdnFwdParams f,
                              GdnFusedForm form = GdnFusedForm::kNorm) {
  f.q = fwd_view(p.q), f.k = fwd_view(p.k);
  const int width = form == GdnFusedForm::kNormCluster
                        ? gdn::fwd_cuda_state_o_wgmma_width(f, ::strata::cuda::current_sm_count())
                        : 0;
  if (form == GdnFusedForm::kNormR || (form == GdnFusedForm::kNormCluster && width == 32))
    f.rq = fwd_tok(b.rq, STRATA_DTYPE_F32, p.T, p.H, 0);
  f.A = gdn::GdnTensor{};
  f.qk_norm = true;
  f.qk_norm_eps = static_cast<float>(kGdnL2Eps);
  f.rk = fwd_tok(b.rk, STRATA_DTYPE_F32, p.T, p.H, 0);
  if (form == GdnFusedForm::kNormCluster) f.pass_cluster = gdn::fwd_cuda_state_o_wgmma_cluster(f, width);
  return f;
}
}  // namespace

std::string gdn_cuda_fused_fwd_reject(const GdnParams& p, GdnFusedForm form) {
  if (p.saved.present()) return "does not store the saved residuals (h, v_new, A); cuda.sm90.chunked does";
  const Sizes s = sizes_of(p, false);
  const Bufs b = carve_with(p, false, kAddressesOnly, 0, true);  // addresses only
  const Calls c = make_calls(p, b, s, false);
  std::string r = gdn::fwd_cuda_mma_reject(gdn::FwdOp::kPrepareWY, c.wy);
  if (r.empty()) r = gdn::fwd_cuda_state_o_reject(c.fwdo);
  if (r.empty() && form == GdnFusedForm::kWgmmaSplit) r = gdn::fwd_cuda_state_o_wgmma_reject(c.fwdo);
  if (r.empty() && form == GdnFusedForm::kPrecomputedP) r = gdn::fwd_cuda_qk_gate_reject(fused_state_params(c, true));
  if (r.empty() && form == GdnFusedForm::kPrep)
    r = gdn::fwd_cuda_prep_reject(prep_params(c));
  if (r.empty() && is_norm_form(form)) {
    if (!p.l2norm) return "the folded l2norm needs use_qk_l2norm_in_kernel";
    r = gdn::fwd_cuda_prep_reject(norm_folded(p, b, c.wy));
    if (r.empty()) r = gdn::fwd_cuda_state_o_wgmma_reject(norm_folded(p, b, c.fwdo, form));
    if (r.empty() && form == GdnFusedForm::kNormCluster && norm_folded(p, b, c.fwdo, form).pass_cluster == 0)
      r = "no thread-block cluster of the pass applies (G x column blocks of a q/k head < 2, or no such form)";
    // (The pass's 16-byte rows are a run-time property of the bound views: gdn_cuda_fused_fwd falls back to the
    // l2norm launches when they do not hold. At plan time the pointers are sentinels.)
  }
  if (r.empty() && form == GdnFusedForm::kFold) {
    gdn::GdnFwdParams w = c.wy;
    w.A = gdn::GdnTensor{};
    r = gdn::fwd_cuda_prep_head_reject(w, fold_head(p));
  }
  return r;
}

GdnFusedForm gdn_cuda_fused_fwd_auto_form(const GdnParams& p, int sms) {
  if (!p.l2norm || !gdn_cuda_fused_fwd_reject(p, GdnFusedForm::kNorm).empty()) return GdnFusedForm::kAutoUnfolded;
  const Bufs b = carve_with(p, false, kAddressesOnly, 0, true);  // addresses only
  const Calls c = make_calls(p, b, sizes_of(p, false), false);
  const int width = gdn::fwd_cuda_state_o_wgmma_width(c.fwdo, sms);
  if (width != 128 && width != 32) return GdnFusedForm::kAutoUnfolded;
  const GdnFusedForm folded = width == 128 ? GdnFusedForm::kNorm : GdnFusedForm::kNormR;
  // (Session 17) The folded form's pass in pairs of CTAs sharing K, Q (and W) by multicast where a pair applies at this
  // width. GPU run s17run1 (H200, 2026-12-01, bf16 H = 16 HV = 32 K = V = 128, l2norm, whole forward, median of 9
  // interleaved): B = 4 T = 8192 0.988 against 1.087 ms (kNorm); B = 1 T = 32768 pass alone 1.380 against 1.452 ms
  // (kNormR's pass, 32 columns, the pair sharing W too).
  if (gdn::fwd_cuda_state_o_wgmma_cluster(norm_folded(p, b, c.fwdo, folded), width) > 0) return GdnFusedForm::kNormCluster;
  return folded;
}

size_t gdn_cuda_bwd_workspace(const GdnParams& p) { return carve(p, true, nullptr).bytes; }
std::string gdn_cuda_bwd_dk_fold_reject(const GdnParams& p) {
  if (!p.l2norm) return "folds dk's l2norm backward: needs l2norm";
  const Bufs fake = carve_with(p, true, kAddressesOnly, 0);  // addresses only
  const Calls c = make_calls(p, fake, sizes_of(p, true), true);
  if (!wy_bwd_mma(c))
    return "prepare_wy_repr_bwd's tensor-core kernel does not apply: " + prepare_wy_repr_bwd_cuda_mma_reject(c.wp);
  return prepare_wy_repr_bwd_cuda_mma_reject(wy_bwd_dk_fold(p, fake, wy_bwd_call(p, fake, c, kWyFinStaged)));
}

std::string gdn_cuda_tensor_core_report(const GdnParams& p, bool bwd) {
  const Sizes s = sizes_of(p, bwd);
  // Buffer addresses only (the reject functions read dtypes, presence and shapes, never the memory).
  const Bufs b = carve(p, bwd, kAddressesOnly);
  const Calls c = make_calls(p, b, s, bwd);
  std::string r;
  auto add = [&r](const char* what, const std::string& why) {
    if (!why.empty()) r += std::string(r.empty() ? "" : "; ") + what + ": " + why;
  };
  add("prepare_wy_repr_fwd", gdn::fwd_cuda_mma_reject(gdn::FwdOp::kPrepareWY, c.wy));
  add("chunk_gated_delta_rule_fwd_h", gdn::fwd_cuda_mma_reject(gdn::FwdOp::kFwdH, c.fwdh));
  if (!bwd) {
    add("chunk_fwd_o", gdn::fwd_cuda_mma_reject(gdn::FwdOp::kFwdO, c.fwdo));
    return r;
  }
  add("chunk_bwd_dv_local", chunk_bwd_dv_local_cuda_mma_reject(c.dvp));
  add("chunk_gated_delta_rule_bwd_dhu", chunk_gated_delta_rule_bwd_dhu_cuda_mma_reject(c.dhp));
  add("chunk_bwd_dqkwg", chunk_bwd_dqkwg_cuda_mma_reject(c.qp));
  add("prepare_wy_repr_bwd", prepare_wy_repr_bwd_cuda_mma_reject(c.wp));
  return r;
}

// The saved forward's automatic form (GdnSavedForward::kAuto): the fused pass writing h where it applies. GPU run
// s12run1 (H200, bf16 H = 16 HV = 32 K = V = 128, l2norm, median of 7): B = 4 T = 8192 1.508 ms against 2.243 ms
// composed (1.174 ms for the forward saving nothing), B = 1 T = 32768 2.493 against 2.860 (2.058); the same saved
// bits (GdnSave.CudaFusedPassFillsTheSameSaved passed there). Since session 18 that pass's CTAs in pairs
// (kFusedPassPair, where a pair applies; the same bits): GPU run s18run1 (H200, 2026-12-02, same shapes, median of 9
// interleaved) B = 4 T = 8192 1.491 ms paired and unpaired (pass 0.867 / 0.878 ms), B = 1 T = 32768 2.410 against
// 2.465 ms (pass 1.786 / 1.851 ms).
constexpr GdnSavedForward kSavedForwardAuto = GdnSavedForward::kFusedPassPair;

namespace {
// (Session 18) The pair size of the saved forward's pass (kFusedPassPair) at the width the pass runs on a device of
// `sms` SMs: gdn::fwd_cuda_state_o_wgmma_cluster of c.fwdo (h present), 0 where no pair applies.
int saved_pass_cluster(const Calls& c, int sms) {
  return gdn::fwd_cuda_state_o_wgmma_cluster(c.fwdo, gdn::fwd_cuda_state_o_wgmma_width(c.fwdo, sms));
}
}  // namespace

int gdn_cuda_fwd_pass_cluster(const GdnParams& p, int sms) {
  const Bufs b = carve(p, false, kAddressesOnly);  // addresses only
  return saved_pass_cluster(make_calls(p, b, sizes_of(p, false), false), sms);
}

strata_status gdn_cuda_fwd(const GdnParams& p, void* workspace, void* stream_ptr, GdnSavedForward form,
                           const GdnStepProbe* probe) {
  const cudaStream_t stream = static_cast<cudaStream_t>(stream_ptr);
  const Sizes s = sizes_of(p, false);
  const Bufs b = carve(p, false, workspace);
  const Calls c = make_calls(p, b, s, false);
  STRATA_RETURN_IF_ERROR(check_saved_alignment("chunk_gated_delta_rule_fwd", p));
  if (form == GdnSavedForward::kAuto) form = kSavedForwardAuto;
  // The fused pass writing o, h, v_new (c.fwdo carries them: h and v_new lie in the saved buffer) after the head's
  // w, u and A (A: read by the backward), where it applies at run time (lean tensors); kFusedPassPair: its CTAs in
  // pairs sharing K, Q (and W) where a pair applies (saved_pass_cluster), else unpaired (the same bits either way).
  const bool fused = form == GdnSavedForward::kFusedPass || form == GdnSavedForward::kFusedPassPair;
  if (p.saved.present() && fused && gdn::fwd_cuda_state_o_wgmma_reject(c.fwdo).empty() &&
      gdn::fwd_cuda_state_o_wgmma_lean(c.fwdo)) {
    STRATA_RETURN_IF_ERROR(forward_wy("chunk_gated_delta_rule_fwd", p, b, s, c, stream, kFoldHead, nullptr, probe));
    mark(probe, "prep");
    STRATA_RETURN_IF_ERROR(zero_saved_gaps(p, b, stream));
    mark(probe, "gaps");
    gdn::GdnFwdParams f = c.fwdo;
    const int sms = ::strata::cuda::current_sm_count();
    if (form == GdnSavedForward::kFusedPassPair) f.pass_cluster = saved_pass_cluster(c, sms);
    STRATA_RETURN_IF_ERROR(static_cast<strata_status>(
        gdn::fwd_cuda_state_o_wgmma(f, gdn::fwd_cuda_state_o_wgmma_width(f, sms), gdn::WgmmaPass::kAuto, stream)));
    mark(probe, "pass");
    return STRATA_SUCCESS;
  }
  STRATA_RETURN_IF_ERROR(forward_states("chunk_gated_delta_rule_fwd", p, b, s, c, stream));
  STRATA_RETURN_IF_ERROR(zero_saved_gaps(p, b, stream));
  return static_cast<strata_status>(gdn::fwd_cuda(gdn::FwdOp::kFwdO, c.fwdo, stream));
}

// The forward with the fused state + output pass (gdn_cuda_fused_fwd_reject(p, form) must be empty): c.fwdo
// carries q, k, w, u, γ, h0, ht and o; h and v_new are absent (never materialised).
// With the pre-computed P (kPrecomputedP, or kAuto at B = 1-like shapes) the gated Q Kᵀ is formed chunk-parallel
// first (fwd_cuda_qk_gate, once per chunk and q/k head) and read by the state pass (StateOKernel::kPrecomputedP);
// the same bits as inline (StateOKernel::kInline) and as the 16-warp pass blocks (kInline16; kAuto takes them
// where the 8-warp pass would run 128 columns: gdn::fwd_cuda_state_o_auto_block). Session 7 also had wy_mma write
// P with w, u (one launch less): 0.803 ms against 0.594 + 0.181 for wy_mma and qk_gate_mma apart (s7run2, B = 4
// and B = 1), so it was removed.
strata_status gdn_cuda_fused_fwd(const GdnParams& p, GdnFusedForm form, void* workspace, void* stream_ptr,
                                 const GdnStepProbe* probe) {
  const cudaStream_t stream = static_cast<cudaStream_t>(stream_ptr);
  const Sizes s = sizes_of(p, false);
  const Bufs b = carve_with(p, false, workspace, 0, true);
  Calls c = make_calls(p, b, s, false);
  // (The plan passes the form it resolved once: GdnProblem::fused_form in chunk_gated_delta_rule.cpp.)
  if (form == GdnFusedForm::kAuto) form = gdn_cuda_fused_fwd_auto_form(p, ::strata::cuda::current_sm_count());
  // The folded forms need the pass's 16-byte rows of q, k, o as they read them (run time); otherwise the l2norm
  // launches and the same wgmma pass (kAutoUnfolded: kNorm's rules hold, so the pass applies and kAuto's unfolded
  // choice is kWgmmaSplit's path).
  if (is_norm_form(form) && !gdn::fwd_cuda_state_o_wgmma_lean(norm_folded(p, b, c.fwdo, form)))
    form = GdnFusedForm::kAutoUnfolded;
  const bool prep = form == GdnFusedForm::kPrep;
  bool wgmma = form == GdnFusedForm::kWgmmaSplit;
  bool pre_p = form == GdnFusedForm::kPrecomputedP || prep;
  const bool automatic = form == GdnFusedForm::kAutoUnfolded || form == GdnFusedForm::kFold;
  if (automatic) {
    // The split wgmma pass with P inline wherever it applies (gdn::fwd_cuda_state_o_wgmma_pays; s9run2: B = 4 T = 8192
    // 0.610 ms, B = 1 T = 32768 1.535 ms against 0.780 / 1.65 ms for the best mma.sync forms), else the mma.sync pass
    // with its own P rule.
    wgmma = gdn::fwd_cuda_state_o_wgmma_pays(c.fwdo);
    pre_p = !wgmma && gdn::fwd_cuda_state_o_pre_p_pays(c.fwdo) &&
            gdn::fwd_cuda_qk_gate_reject(fused_state_params(c, true)).empty();
  }
  if (is_norm_form(form)) {
    // (kNormR: 1 / |q| into rq), cumsum, prep (forms 1 / |k|), the pass (kNorm: forms 1 / |q|; kNormR: reads rq)
    STRATA_RETURN_IF_ERROR(check_cu_seqlens("chunk_gated_delta_rule_fwd", p, b.check, stream));
    const gdn::GdnFwdParams pass = norm_folded(p, b, c.fwdo, form);
    if (pass.rq.present()) {  // kNormR, kNormCluster at 32 columns
      STRATA_RETURN_IF_ERROR(l2norm_fwd(p, b, stream, /*rq_only=*/true));
      mark(probe, "rq");
    }
    const int64_t gst[3] = {p.T * p.HV, p.HV, 1};
    STRATA_RETURN_IF_ERROR(gate_cumsum(p, p.g.data, p.g.dtype, p.g.st, b.gam, STRATA_DTYPE_F32, gst, false, stream));
    mark(probe, "cumsum");
    STRATA_RETURN_IF_ERROR(static_cast<strata_status>(gdn::gdn_chunk_offsets_cuda(c.wy.chunks, b.offs, stream)));
    STRATA_RETURN_IF_ERROR(static_cast<strata_status>(gdn::fwd_cuda_prep(norm_folded(p, b, c.wy), stream)));
    mark(probe, "prep");
    STRATA_RETURN_IF_ERROR(
        static_cast<strata_status>(gdn::fwd_cuda_state_o_wgmma(pass, 0, gdn::WgmmaPass::kAuto, stream)));
    mark(probe, "pass");
    return STRATA_SUCCESS;
  }
  const gdn::GdnFwdParams f = fused_state_params(c, pre_p);
  const gdn::StateOBlock block = form == GdnFusedForm::kInline16 ? gdn::StateOBlock::k16Warps
                                 : automatic || prep ? gdn::fwd_cuda_state_o_auto_block(c.fwdo)
                                                                       : gdn::StateOBlock::k8Warps;
  if (prep) {
    const gdn::GdnFwdParams w = prep_params(c);
    STRATA_RETURN_IF_ERROR(forward_wy("chunk_gated_delta_rule_fwd", p, b, s, c, stream, false, &w));
    return static_cast<strata_status>(gdn::fwd_cuda_state_o(f, gdn::StateOKernel::kPrecomputedP, block, stream));
  }
  c.wy.A = gdn::GdnTensor{};  // the inverse is not needed past w, u (wy_mma then does not store it)
  const bool fold = form == GdnFusedForm::kFold || (form == GdnFusedForm::kAutoUnfolded && kFoldHead);
  STRATA_RETURN_IF_ERROR(forward_wy("chunk_gated_delta_rule_fwd", p, b, s, c, stream, fold, nullptr, probe));
  mark(probe, "prep");
  if (wgmma) {
    STRATA_RETURN_IF_ERROR(
        static_cast<strata_status>(gdn::fwd_cuda_state_o_wgmma(f, 0, gdn::WgmmaPass::kAuto, stream)));
    mark(probe, "pass");
    return STRATA_SUCCESS;
  }
  if (!pre_p) return static_cast<strata_status>(gdn::fwd_cuda_state_o(f, gdn::StateOKernel::kInline, block, stream));
  STRATA_RETURN_IF_ERROR(static_cast<strata_status>(gdn::fwd_cuda_qk_gate(f, stream)));
  return static_cast<strata_status>(gdn::fwd_cuda_state_o(f, gdn::StateOKernel::kPrecomputedP, block, stream));
}

strata_status gdn_cuda_bwd(const GdnParams& p, void* workspace, void* stream_ptr, const GdnStepProbe* probe,
                           int dhu_variant, int wy_variant) {
  const cudaStream_t stream = static_cast<cudaStream_t>(stream_ptr);
  const Sizes s = sizes_of(p, true);
  Bufs b = carve(p, true, workspace);  // (b.dq: nullptr once dq is final, dq_final below)
  const Calls c = make_calls(p, b, s, true);
  auto mark = [probe](const char* step) {
    if (probe && probe->fn) probe->fn(probe->ctx, step);
  };
  if (p.saved.present()) {
    // qn, kn, rq, rk, γ, w, A, h, v_new come from the forward (the saved buffer): nothing to re-run.
    STRATA_RETURN_IF_ERROR(check_saved_alignment("chunk_gated_delta_rule_bwd", p));
    STRATA_RETURN_IF_ERROR(check_cu_seqlens("chunk_gated_delta_rule_bwd", p, b.check, stream));
  } else {
    // forward_states, split:
    STRATA_RETURN_IF_ERROR(forward_wy("chunk_gated_delta_rule_bwd", p, b, s, c, stream, kFoldHead));
    mark("forward WY");
    STRATA_RETURN_IF_ERROR(static_cast<strata_status>(gdn::fwd_cuda(gdn::FwdOp::kFwdH, c.fwdh, stream)));
    mark("forward states");
  }
  DhuParams dhp = c.dhp;
  dhp.mma_variant = dhu_variant;
  if (dhu_fused_dv_local(c, dhu_variant)) {
    dhp.dv = gdn_bwd::View{};
    dhp.fuse_dv_local = true;
    STRATA_RETURN_IF_ERROR(static_cast<strata_status>(chunk_gated_delta_rule_bwd_dhu_cuda_mma(dhp, b.early, stream)));
  } else {
    STRATA_RETURN_IF_ERROR(static_cast<strata_status>(chunk_bwd_dv_local_cuda(c.dvp, b.early, stream)));
    STRATA_RETURN_IF_ERROR(static_cast<strata_status>(chunk_gated_delta_rule_bwd_dhu_cuda(dhp, b.early, stream)));
  }
  mark("bwd_dhu");
  // b.late overlaps dv_local, dead since bwd_dhu; it is sized for the kernels chosen here (the same rule as the
  // automatic entry points).
  // dq final here (through its l2norm backward: dq_fold_call) where the form asks for it and it runs for these
  // tensors; else the f32 head sums into b.dq and row_norm_bwd in the tail.
  const GdnBwdDq dq_form = p.bwd_dq == GdnBwdDq::kAuto ? kGdnBwdDqAuto : p.bwd_dq;
  const bool dq_final = p.l2norm && dq_form == GdnBwdDq::kStaged &&
                        chunk_bwd_dqkwg_cuda_wgmma_dq_norm_runs(dq_fold_call(p, c), dq_fold_rstd(p, b));
  if (dq_final) {
    STRATA_RETURN_IF_ERROR(static_cast<strata_status>(
        chunk_bwd_dqkwg_cuda_wgmma_dq_norm(dq_fold_call(p, c), dq_fold_rstd(p, b), b.late, stream)));
    b.dq = nullptr;  // no f32 dq: the tail's dq l2norm_bwd does nothing
  } else {
    STRATA_RETURN_IF_ERROR(static_cast<strata_status>(dqkwg_mma(c) ? chunk_bwd_dqkwg_cuda(c.qp, b.late, stream)
                                                                   : chunk_bwd_dqkwg_cuda_fma(c.qp, b.late, stream)));
  }
  mark("dqkwg");
  const int64_t gst[3] = {p.T * p.HV, p.HV, 1};
  bool dk_final = false;  // dk written through its l2norm backward by prepare_wy_repr_bwd (wy_bwd_dk_fold)
  if (wy_bwd_mma(c)) {
    WyBwdParams wp = wy_bwd_call(p, b, c, wy_variant);
    if (p.l2norm) {
      const WyBwdParams wn = wy_bwd_dk_fold(p, b, wp);
      if (prepare_wy_repr_bwd_cuda_mma_reject(wn).empty()) wp = wn, dk_final = true;
    }
    STRATA_RETURN_IF_ERROR(static_cast<strata_status>(prepare_wy_repr_bwd_cuda_mma(wp, b.late, stream)));
  } else {
    STRATA_RETURN_IF_ERROR(static_cast<strata_status>(prepare_wy_repr_bwd_cuda_fma(c.wp, b.late, stream)));
    // dγ1 += dγ2 (in place); dk = dk1 + dk2 (into dk1 with l2norm).
    STRATA_RETURN_IF_ERROR(add_store(b.dg1, b.dg2, add_out_f32(b.dg1, p.T, p.HV, 1), s.gates, stream));
    STRATA_RETURN_IF_ERROR(add_store(b.dk1, b.dk2,
                                     p.l2norm ? add_out_f32(b.dk1, p.T, p.H, p.K) : add_out_of(p.dk, p.T, p.H, p.K),
                                     s.qk, stream));
  }

  mark("wy_bwd");
  // dg = reverse chunk-local cumsum of dγ1 + dγ2 (in dγ1).
  STRATA_RETURN_IF_ERROR(gate_cumsum(p, b.dg1, STRATA_DTYPE_F32, gst, p.dg.data, p.dg.dtype, p.dg.st, true, stream));

  // With l2norm, dq and dk (in dk1) go through the l2norm backward.
  if (p.l2norm) {
    STRATA_RETURN_IF_ERROR(l2norm_bwd(p, b.qn, b.sdt, b.rq, b.dq, p.dq, stream));
    if (!dk_final) STRATA_RETURN_IF_ERROR(l2norm_bwd(p, b.kn, b.sdt, b.rk, b.dk1, p.dk, stream));
  }
  mark("tail");
  return STRATA_SUCCESS;
}

}  // namespace strata::linear_attn
