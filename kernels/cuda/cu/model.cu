// model.cu: the model forward's kernels around the GEMMs and attention: token embedding,
// RMSNorm (plain and fused with the residual add), RoPE fused with the paged KV write,
// the gated activations (SwiGLU, GeGLU), row gather, greedy argmax and dtype casts; and
// the families' extras: per-head Q/K norms (Qwen3), the final-logit soft cap (Gemma 2),
// MoE routing and the weighted sum of the experts' outputs (Mixtral).
// Math is f32 inside; each kernel is a template over its dtypes, instantiated for every
// f32/bf16/f16 combination as `extern "C"` entry points `pg_<family>_<dtype>[_<dtype>]`.
// Semantics follow the CPU kernels of pagoda_kernels (kernels/src/{norm,rope,act}.rs),
// which the tests (tests/emu_model.rs) check against an f64 reference.
#include "common.cuh"

namespace {
using pg::bf16;
using pg::Dt;
using pg::f16;

// Threads per block cap (every entry point declares it in __launch_bounds__).
constexpr unsigned kMaxThreads = 1024;
// "No index yet" in the argmax reduction (larger than any column).
constexpr int kNoIndex = 0x7fffffff;

__device__ __forceinline__ bool aligned16(const void* p) {
  return (reinterpret_cast<uintptr_t>(p) & 15u) == 0;
}

// Calls f(i, value as f32) for the elements i of row[0..n) this thread owns. With 16-byte
// alignment and n a multiple of the vector width, a thread owns whole 16-byte vectors
// (one load each); otherwise elements threadIdx.x, +blockDim.x, ... Either way a thread
// sees its indices in increasing order (argmax's first-index rule relies on it).
template <class X, class F>
__device__ __forceinline__ void row_for_each(const X* __restrict__ row, int n, F f) {
  constexpr int N = pg::Vec<X>::N;
  if (n % N == 0 && aligned16(row)) {
    for (int v = threadIdx.x; v < n / N; v += blockDim.x) {
      float e[N];
      pg::load16(row + int64_t(v) * N, e);
#pragma unroll
      for (int j = 0; j < N; ++j) f(v * N + j, e[j]);
    }
  } else {
    for (int i = threadIdx.x; i < n; i += blockDim.x) f(i, Dt<X>::to(row[i]));
  }
}

// ---- embed ----------------------------------------------------------------------------
template <class W, class O>
__device__ __forceinline__ void embed_body(const PgEmbedParams& p) {
  const int t = blockIdx.x;
  const int64_t id = p.ids[t];
  const W* row = static_cast<const W*>(p.table) + id * p.hidden;
  O* out = static_cast<O*>(p.out) + int64_t(t) * p.hidden;
  const float scale = p.scale;
  row_for_each(row, p.hidden, [&](int i, float v) { out[i] = Dt<O>::from(scale * v); });
}

// ---- rms_norm / add_rms_norm ------------------------------------------------------------
// pagoda_kernels::rms_norm's formula and order: inv = 1 / sqrt(sum(v^2) / n + eps), then
// out = v * inv * g (left to right), g = weight + w_offset. Only the order of the sum of
// squares differs (a block reduction).
template <class X, class O>
__device__ __forceinline__ void rms_norm_body(const PgNormParams& p) {
  __shared__ float red[32];
  const int n = p.dim;
  const int64_t r = blockIdx.x;
  const X* x = static_cast<const X*>(p.x) + r * n;
  float ss = 0.0f;
  row_for_each(x, n, [&](int, float v) { ss += v * v; });
  ss = pg::block_sum(ss, red);
  const float inv = 1.0f / sqrtf(ss / float(n) + p.eps);
  O* out = static_cast<O*>(p.out) + r * n;
  const float* w = p.weight;
  const float off = p.w_offset;
  row_for_each(x, n, [&](int i, float v) { out[i] = Dt<O>::from(v * inv * (w[i] + off)); });
}

// pagoda_kernels::add_rms_norm: residual += x (f32), then rms_norm of the new residual.
template <class X, class O>
__device__ __forceinline__ void add_rms_norm_body(const PgNormParams& p) {
  __shared__ float red[32];
  const int n = p.dim;
  const int64_t r = blockIdx.x;
  const X* x = static_cast<const X*>(p.x) + r * n;
  float* res = p.residual + r * n;
  float ss = 0.0f;
  row_for_each(x, n, [&](int i, float v) {
    const float s = res[i] + v;
    res[i] = s;
    ss += s * s;
  });
  // block_sum's __syncthreads also publishes every thread's residual writes to the block,
  // so the second pass may read elements another thread wrote.
  ss = pg::block_sum(ss, red);
  const float inv = 1.0f / sqrtf(ss / float(n) + p.eps);
  O* out = static_cast<O*>(p.out) + r * n;
  const float* w = p.weight;
  const float off = p.w_offset;
  row_for_each(static_cast<const float*>(res), n,
               [&](int i, float v) { out[i] = Dt<O>::from(v * inv * (w[i] + off)); });
}

// ---- rope_write_kv ------------------------------------------------------------------------
// Rotate-half RoPE (kernels/src/rope.rs): for pair i < D/2 of a head,
//   x1' = x1 cos - x2 sin,  x2' = x2 cos + x1 sin  (x1 = h[i], x2 = h[i + D/2]),
// products rounded before the sum (__fmul_rn: no FMA contraction) as the CPU does.
template <class T, class KV>
__device__ __forceinline__ void rope_kv_body(const PgRopeKvParams& p) {
  const int t = blockIdx.x;
  const int d = p.head_dim, half = d / 2, nh = p.num_heads, nkv = p.num_kv_heads;
  const int64_t width = int64_t(nh + 2 * nkv) * d;
  const T* row = static_cast<const T*>(p.qkv) + t * width;
  const float* bias = p.bias;
  const int64_t pos = p.positions[t];
  const float* cs = p.cos + pos * half;
  const float* sn = p.sin + pos * half;
  const int64_t slot = p.slot_mapping[t];
  const int64_t kv_row = int64_t(nkv) * d;
  T* q = static_cast<T*>(p.q_out) + t * int64_t(nh) * d;
  KV* kc = static_cast<KV*>(p.k_pool) + (slot < 0 ? 0 : slot) * kv_row;
  KV* vc = static_cast<KV*>(p.v_pool) + (slot < 0 ? 0 : slot) * kv_row;
  // q heads, then k heads (padding rows: q only).
  const int pairs = (slot < 0 ? nh : nh + nkv) * half;
  for (int j = threadIdx.x; j < pairs; j += blockDim.x) {
    const int h = j / half, i = j - h * half;
    const int64_t a = int64_t(h) * d + i, b = a + half;
    float x1 = Dt<T>::to(row[a]), x2 = Dt<T>::to(row[b]);
    if (bias != nullptr) {
      x1 += bias[a];
      x2 += bias[b];
    }
    const float c = cs[i], s = sn[i];
    const float y1 = __fmul_rn(x1, c) - __fmul_rn(x2, s);
    const float y2 = __fmul_rn(x2, c) + __fmul_rn(x1, s);
    if (h < nh) {
      q[a] = Dt<T>::from(y1);
      q[b] = Dt<T>::from(y2);
    } else {
      const int64_t k = a - int64_t(nh) * d;
      kc[k] = Dt<KV>::from(y1);
      kc[k + half] = Dt<KV>::from(y2);
    }
  }
  if (slot < 0) return;  // no barrier follows
  const T* v = row + int64_t(nh + nkv) * d;
  const float* vb = bias != nullptr ? bias + int64_t(nh + nkv) * d : nullptr;
  for (int j = threadIdx.x; j < kv_row; j += blockDim.x) {
    float x = Dt<T>::to(v[j]);
    if (vb != nullptr) x += vb[j];
    vc[j] = Dt<KV>::from(x);
  }
}

// ---- gated activations -------------------------------------------------------------------
struct Silu {
  // pagoda_kernels::silu_mul: g / (1 + e^-g) * u.
  static __device__ __forceinline__ float apply(float g, float u) { return g / (1.0f + expf(-g)) * u; }
};
struct GeluTanh {
  // pagoda_kernels::gelu_tanh_mul_fused: 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))) u.
  static __device__ __forceinline__ float apply(float x, float u) {
    const float inner = 0.7978846f * (x + 0.044715f * x * x * x);
    return 0.5f * x * (1.0f + tanhf(inner)) * u;
  }
};

template <class T, class Act>
__device__ __forceinline__ void glu_body(const PgGluParams& p) {
  const int64_t r = blockIdx.x;
  const int n = p.inter;
  const T* g = static_cast<const T*>(p.gate_up) + r * 2 * n;
  const T* u = g + n;
  T* out = static_cast<T*>(p.out) + r * n;
  for (int i = threadIdx.x; i < n; i += blockDim.x) {
    out[i] = Dt<T>::from(Act::apply(Dt<T>::to(g[i]), Dt<T>::to(u[i])));
  }
}

// ---- gather_rows ---------------------------------------------------------------------------
template <class X>
__device__ __forceinline__ void gather_body(const PgGatherParams& p) {
  const int i = blockIdx.x;
  const int n = p.dim;
  const X* src = static_cast<const X*>(p.x) + int64_t(p.rows[i]) * n;
  X* dst = static_cast<X*>(p.out) + int64_t(i) * n;
  constexpr int N = pg::Vec<X>::N;
  if (n % N == 0 && aligned16(src) && aligned16(dst)) {
    for (int v = threadIdx.x; v < n / N; v += blockDim.x) pg::copy16(dst + v * N, src + v * N);
  } else {
    for (int j = threadIdx.x; j < n; j += blockDim.x) dst[j] = src[j];  // bits, no conversion
  }
}

// ---- argmax --------------------------------------------------------------------------------
// (value, index) pairs ordered by: has an index, larger value, smaller index. Index sets of
// threads are disjoint, so the merge is a total order and every lane ends with the same pair.
__device__ __forceinline__ void take_better(float& bv, int& bi, float ov, int oi) {
  if (oi == kNoIndex) return;
  if (bi == kNoIndex || ov > bv || (ov == bv && oi < bi)) {
    bv = ov;
    bi = oi;
  }
}

template <class X>
__device__ __forceinline__ void argmax_body(const PgArgmaxParams& p) {
  __shared__ float red_v[32];
  __shared__ int red_i[32];
  const int64_t r = blockIdx.x;
  const X* row = static_cast<const X*>(p.logits) + r * p.vocab;
  float bv = pg::kNegInf;
  int bi = kNoIndex;
  // Indices arrive in increasing order per thread: strict > keeps the first maximum.
  row_for_each(row, p.vocab, [&](int i, float v) {
    if (v == v && (bi == kNoIndex || v > bv)) {  // v == v: not NaN
      bv = v;
      bi = i;
    }
  });
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    const float ov = __shfl_xor_sync(0xffffffffu, bv, o);
    const int oi = __shfl_xor_sync(0xffffffffu, bi, o);
    take_better(bv, bi, ov, oi);
  }
  if (threadIdx.x % 32 == 0) {
    red_v[threadIdx.x / 32] = bv;
    red_i[threadIdx.x / 32] = bi;
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    for (unsigned w = 1; w < blockDim.x / 32; ++w) take_better(bv, bi, red_v[w], red_i[w]);
    p.ids[r] = bi == kNoIndex ? 0 : bi;
    p.values[r] = bi == kNoIndex ? pg::kNegInf : bv;
  }
}

// ---- cast ----------------------------------------------------------------------------------
template <class S, class D>
__device__ __forceinline__ void cast_body(const PgCastParams& p) {
  const S* src = static_cast<const S*>(p.src);
  D* dst = static_cast<D*>(p.dst);
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < p.n; i += stride) {
    dst[i] = Dt<D>::from(Dt<S>::to(src[i]));
  }
}

// ---- qk_norm (Qwen3) ---------------------------------------------------------------------
// rms_norm_body's formula on one head (blockIdx.y: q heads, then k heads) of one token's
// fused QKV row, in place: each thread reads, then (after the reduction's barrier)
// writes, only its own elements, so no element is read after another thread wrote it.
template <class T>
__device__ __forceinline__ void qk_norm_body(const PgQkNormParams& p) {
  __shared__ float red[32];
  const int d = p.head_dim, nh = p.num_heads, h = blockIdx.y;
  const int64_t width = int64_t(nh + 2 * p.num_kv_heads) * d;
  T* x = static_cast<T*>(p.qkv) + int64_t(blockIdx.x) * width + int64_t(h) * d;
  const float* w = h < nh ? p.q_weight : p.k_weight;
  float ss = 0.0f;
  for (int i = threadIdx.x; i < d; i += blockDim.x) {
    const float v = Dt<T>::to(x[i]);
    ss += v * v;
  }
  ss = pg::block_sum(ss, red);
  const float inv = 1.0f / sqrtf(ss / float(d) + p.eps);
  for (int i = threadIdx.x; i < d; i += blockDim.x) {
    x[i] = Dt<T>::from(Dt<T>::to(x[i]) * inv * w[i]);
  }
}

// ---- soft_cap (Gemma 2's final logits) ---------------------------------------------------
// The CPU's `cap * (x / cap).tanh()`: a division, not a multiply by 1 / cap.
__device__ __forceinline__ void soft_cap_body(const PgSoftCapParams& p) {
  const float cap = p.cap;
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < p.n; i += stride) {
    p.x[i] = cap * tanhf(p.x[i] / cap);
  }
}

// ---- moe_route (Mixtral) -----------------------------------------------------------------
// One thread per token, serially in expert order, so the sums and comparisons are the
// CPU's (models/src/moe.rs `route`): max (NaN ignored, as f32::max), total = sum of
// exp(l - max) in expert order; top_k picks, each the largest logit not picked yet (strict
// >, so the first index wins ties); weight exp(l - max) / total; the kept weights' sum in
// pick order divides them. A grid-stride loop: any block size covers every token.
constexpr int kMoeMaxTopK = 32;
__device__ __forceinline__ void moe_route_body(const PgMoeRouteParams& p) {
  const int e_n = p.num_experts, k = p.top_k;
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  for (int64_t t = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; t < p.num_tokens; t += stride) {
    const float* l = p.logits + t * e_n;
    float* w = p.weights + t * e_n;
    float mx = pg::kNegInf;
    for (int e = 0; e < e_n; ++e) mx = fmaxf(mx, l[e]);
    float total = 0.0f;
    for (int e = 0; e < e_n; ++e) total += expf(l[e] - mx);
    for (int e = 0; e < e_n; ++e) w[e] = 0.0f;
    int picked[kMoeMaxTopK];
    float kept_w[kMoeMaxTopK];
    int n = 0;
    for (int j = 0; j < k && j < kMoeMaxTopK; ++j) {
      int best = -1;
      for (int e = 0; e < e_n; ++e) {
        bool taken = false;
        for (int i = 0; i < n; ++i) taken = taken || picked[i] == e;
        if (!taken && (best < 0 || l[e] > l[best])) best = e;
      }
      if (best < 0) break;
      picked[n] = best;
      kept_w[n] = expf(l[best] - mx) / total;
      ++n;
    }
    float kept = 0.0f;
    for (int i = 0; i < n; ++i) kept += kept_w[i];
    for (int i = 0; i < n; ++i) w[picked[i]] = kept_w[i] / kept;
  }
}

// ---- moe_accumulate (Mixtral) ------------------------------------------------------------
// The CPU's `out += y * w` per expert in expert order (from 0), the product rounded before
// the sum (__fmul_rn: no FMA contraction).
template <class T>
__device__ __forceinline__ void moe_acc_body(const PgMoeAccParams& p) {
  const int64_t t = blockIdx.x;
  const int n = p.hidden;
  const float w = p.weights[t * p.num_experts + p.expert];
  const T* y = static_cast<const T*>(p.y) + t * n;
  float* acc = p.acc + t * n;
  T* out = p.out != nullptr ? static_cast<T*>(p.out) + t * n : nullptr;
  for (int i = threadIdx.x; i < n; i += blockDim.x) {
    float a = p.first ? 0.0f : acc[i];
    if (w != 0.0f) a = a + __fmul_rn(Dt<T>::to(y[i]), w);
    acc[i] = a;
    if (out != nullptr) out[i] = Dt<T>::from(a);
  }
}
}  // namespace

// ---- entry points: one per dtype (pair), in PG_F32, PG_BF16, PG_F16 order -------------------
#define PG_DT_f32 float
#define PG_DT_bf16 pg::bf16
#define PG_DT_f16 pg::f16

#define PG_ENTRY1(fam, body, P, a)                                                   \
  extern "C" __global__ void __launch_bounds__(kMaxThreads) pg_##fam##_##a(P p) { \
    body<PG_DT_##a>(p);                                                              \
  }
#define PG_ENTRY2(fam, body, P, a, b)                                                       \
  extern "C" __global__ void __launch_bounds__(kMaxThreads) pg_##fam##_##a##_##b(P p) { \
    body<PG_DT_##a, PG_DT_##b>(p);                                                          \
  }
#define PG_FAMILY1(fam, body, P) \
  PG_ENTRY1(fam, body, P, f32) PG_ENTRY1(fam, body, P, bf16) PG_ENTRY1(fam, body, P, f16)
#define PG_FAMILY2_ROW(fam, body, P, a) \
  PG_ENTRY2(fam, body, P, a, f32) PG_ENTRY2(fam, body, P, a, bf16) PG_ENTRY2(fam, body, P, a, f16)
#define PG_FAMILY2(fam, body, P)                                        \
  PG_FAMILY2_ROW(fam, body, P, f32) PG_FAMILY2_ROW(fam, body, P, bf16) \
  PG_FAMILY2_ROW(fam, body, P, f16)

namespace {
template <class T>
__device__ __forceinline__ void silu_body(const PgGluParams& p) {
  glu_body<T, Silu>(p);
}
template <class T>
__device__ __forceinline__ void gelu_body(const PgGluParams& p) {
  glu_body<T, GeluTanh>(p);
}
// One-dtype (or no-dtype) shapes of the family kernels for the entry macros.
template <class T>
__device__ __forceinline__ void soft_cap_entry(const PgSoftCapParams& p) {
  soft_cap_body(p);
}
template <class T>
__device__ __forceinline__ void moe_route_entry(const PgMoeRouteParams& p) {
  moe_route_body(p);
}
}  // namespace

PG_FAMILY2(embed, embed_body, PgEmbedParams)
PG_FAMILY2(rms_norm, rms_norm_body, PgNormParams)
PG_FAMILY2(add_rms_norm, add_rms_norm_body, PgNormParams)
PG_FAMILY2(rope_kv, rope_kv_body, PgRopeKvParams)
PG_FAMILY1(silu_mul, silu_body, PgGluParams)
PG_FAMILY1(gelu_tanh_mul, gelu_body, PgGluParams)
PG_FAMILY1(gather_rows, gather_body, PgGatherParams)
PG_FAMILY1(argmax, argmax_body, PgArgmaxParams)
PG_FAMILY2(cast, cast_body, PgCastParams)
PG_FAMILY1(qk_norm, qk_norm_body, PgQkNormParams)
PG_FAMILY1(moe_acc, moe_acc_body, PgMoeAccParams)
// f32 only (logits and router outputs are f32).
PG_ENTRY1(soft_cap, soft_cap_entry, PgSoftCapParams, f32)
PG_ENTRY1(moe_route, moe_route_entry, PgMoeRouteParams, f32)

#if PG_HOST_ONLY
// ---- geometry (shared by the emulator and the CUDA launchers) and the emulator's runs ------
namespace {
constexpr unsigned kMinThreads = 128;
// Threads per block of the elementwise cast, and its grid cap (a grid-stride loop).
constexpr unsigned kCastThreads = 256;
constexpr int64_t kCastMaxBlocks = 4096;

// Threads of a one-block-per-row kernel: enough for `work` items, a multiple of 32,
// between 128 and 1024.
uint32_t row_threads(int64_t work) {
  int64_t t = (work + 31) / 32 * 32;
  if (t < kMinThreads) t = kMinThreads;
  if (t > kMaxThreads) t = kMaxThreads;
  return uint32_t(t);
}
// One block per row; a thread handles ~8 elements (a 16-byte bf16/f16 vector).
PgLaunch rows_launch(int64_t rows, int64_t row_elems) {
  if (rows <= 0 || row_elems <= 0) return PgLaunch{{0, 1, 1}, {kMinThreads, 1, 1}, 0};
  return PgLaunch{{uint32_t(rows), 1, 1}, {row_threads((row_elems + 7) / 8), 1, 1}, 0};
}

template <class P>
using Kernel = void (*)(P);

// The emulator runs one OS thread per CUDA thread, so on the host a row kernel's block
// is capped at two warps: every kernel here strides its row by blockDim.x, so any
// multiple of 32 computes the same values, and two warps still exercise the cross-warp
// reductions. The GPU geometry (up to 1024 threads) is what `*_launch` reports.
constexpr unsigned kEmuMaxThreads = 64;

template <class P>
int run(PgLaunch l, Kernel<P> k, const P* p) {
  if (l.block[1] == 1 && l.block[2] == 1 && l.block[0] > kEmuMaxThreads) l.block[0] = kEmuMaxThreads;
  const dim3 grid(l.grid[0], l.grid[1], l.grid[2]), block(l.block[0], l.block[1], l.block[2]);
  pagoda_emu::launch(grid, block, l.shared_bytes, k, *p);
  return 0;
}
template <class P, size_t N>
int run_one(PgLaunch l, const Kernel<P> (&table)[N], int i, const P* p) {
  if (i < 0 || size_t(i) >= N) return 1;
  return run(l, table[i], p);
}
int pair(int a, int b) {
  return (a < 0 || a > 2 || b < 0 || b > 2) ? -1 : a * 3 + b;
}

#define PG_TABLE1(fam) {pg_##fam##_f32, pg_##fam##_bf16, pg_##fam##_f16}
#define PG_TABLE2_ROW(fam, a) pg_##fam##_##a##_f32, pg_##fam##_##a##_bf16, pg_##fam##_##a##_f16
#define PG_TABLE2(fam) \
  {PG_TABLE2_ROW(fam, f32), PG_TABLE2_ROW(fam, bf16), PG_TABLE2_ROW(fam, f16)}

const Kernel<PgEmbedParams> kEmbed[9] = PG_TABLE2(embed);
const Kernel<PgNormParams> kRmsNorm[9] = PG_TABLE2(rms_norm);
const Kernel<PgNormParams> kAddRmsNorm[9] = PG_TABLE2(add_rms_norm);
const Kernel<PgRopeKvParams> kRopeKv[9] = PG_TABLE2(rope_kv);
const Kernel<PgGluParams> kSilu[3] = PG_TABLE1(silu_mul);
const Kernel<PgGluParams> kGelu[3] = PG_TABLE1(gelu_tanh_mul);
const Kernel<PgGatherParams> kGather[3] = PG_TABLE1(gather_rows);
const Kernel<PgArgmaxParams> kArgmax[3] = PG_TABLE1(argmax);
const Kernel<PgCastParams> kCast[9] = PG_TABLE2(cast);
const Kernel<PgQkNormParams> kQkNorm[3] = PG_TABLE1(qk_norm);
const Kernel<PgMoeAccParams> kMoeAcc[3] = PG_TABLE1(moe_acc);
// Threads per block of the one-thread-per-item family kernels, and their grid cap.
constexpr unsigned kItemThreads = 128;
constexpr int64_t kItemMaxBlocks = 4096;
PgLaunch items_launch(int64_t n) {
  if (n <= 0) return PgLaunch{{0, 1, 1}, {kItemThreads, 1, 1}, 0};
  int64_t blocks = (n + kItemThreads - 1) / kItemThreads;
  if (blocks > kItemMaxBlocks) blocks = kItemMaxBlocks;
  return PgLaunch{{uint32_t(blocks), 1, 1}, {kItemThreads, 1, 1}, 0};
}
}  // namespace

extern "C" PgLaunch pg_embed_launch(const PgEmbedParams* p) {
  return rows_launch(p->num_tokens, p->hidden);
}
extern "C" PgLaunch pg_norm_launch(const PgNormParams* p) { return rows_launch(p->rows, p->dim); }
extern "C" PgLaunch pg_rope_kv_launch(const PgRopeKvParams* p) {
  // One thread per rotated pair of q and k (the widest part of the row).
  const int64_t pairs = int64_t(p->num_heads + p->num_kv_heads) * (p->head_dim / 2);
  if (p->num_tokens <= 0 || p->head_dim <= 0) return PgLaunch{{0, 1, 1}, {kMinThreads, 1, 1}, 0};
  return PgLaunch{{uint32_t(p->num_tokens), 1, 1}, {row_threads(pairs), 1, 1}, 0};
}
extern "C" PgLaunch pg_glu_launch(const PgGluParams* p) {
  if (p->rows <= 0 || p->inter <= 0) return PgLaunch{{0, 1, 1}, {kMinThreads, 1, 1}, 0};
  return PgLaunch{{uint32_t(p->rows), 1, 1}, {row_threads((int64_t(p->inter) + 3) / 4), 1, 1}, 0};
}
extern "C" PgLaunch pg_gather_launch(const PgGatherParams* p) {
  return rows_launch(p->num_rows, p->dim);
}
extern "C" PgLaunch pg_argmax_launch(const PgArgmaxParams* p) {
  // vocab 0 still writes (0, -inf) per row: at least one thread's worth of work.
  return rows_launch(p->rows, p->vocab > 0 ? p->vocab : 1);
}
extern "C" PgLaunch pg_cast_launch(const PgCastParams* p) {
  if (p->n <= 0) return PgLaunch{{0, 1, 1}, {kCastThreads, 1, 1}, 0};
  int64_t blocks = (p->n + kCastThreads - 1) / kCastThreads;
  if (blocks > kCastMaxBlocks) blocks = kCastMaxBlocks;
  return PgLaunch{{uint32_t(blocks), 1, 1}, {kCastThreads, 1, 1}, 0};
}

extern "C" PgLaunch pg_qk_norm_launch(const PgQkNormParams* p) {
  // One block per (token, head) of q and k; a head is one row.
  const int64_t heads = int64_t(p->num_heads) + p->num_kv_heads;
  if (p->num_tokens <= 0 || heads <= 0 || p->head_dim <= 0) {
    return PgLaunch{{0, 1, 1}, {kMinThreads, 1, 1}, 0};
  }
  return PgLaunch{{uint32_t(p->num_tokens), uint32_t(heads), 1}, {row_threads(p->head_dim), 1, 1}, 0};
}
extern "C" PgLaunch pg_soft_cap_launch(const PgSoftCapParams* p) { return items_launch(p->n); }
extern "C" PgLaunch pg_moe_route_launch(const PgMoeRouteParams* p) {
  return items_launch(p->num_tokens);
}
extern "C" PgLaunch pg_moe_acc_launch(const PgMoeAccParams* p) {
  return rows_launch(p->num_tokens, p->hidden);
}

// Emulated runs: 0 on success, 1 for a dtype with no kernel.
extern "C" int pg_emu_embed(const PgEmbedParams* p, int w, int o) {
  return run_one(pg_embed_launch(p), kEmbed, pair(w, o), p);
}
extern "C" int pg_emu_rms_norm(const PgNormParams* p, int x, int o) {
  return run_one(pg_norm_launch(p), kRmsNorm, pair(x, o), p);
}
extern "C" int pg_emu_add_rms_norm(const PgNormParams* p, int x, int o) {
  return run_one(pg_norm_launch(p), kAddRmsNorm, pair(x, o), p);
}
extern "C" int pg_emu_rope_kv(const PgRopeKvParams* p, int t, int kv) {
  return run_one(pg_rope_kv_launch(p), kRopeKv, pair(t, kv), p);
}
extern "C" int pg_emu_silu_mul(const PgGluParams* p, int t) {
  return run_one(pg_glu_launch(p), kSilu, t, p);
}
extern "C" int pg_emu_gelu_tanh_mul(const PgGluParams* p, int t) {
  return run_one(pg_glu_launch(p), kGelu, t, p);
}
extern "C" int pg_emu_gather_rows(const PgGatherParams* p, int x) {
  return run_one(pg_gather_launch(p), kGather, x, p);
}
extern "C" int pg_emu_argmax(const PgArgmaxParams* p, int x) {
  return run_one(pg_argmax_launch(p), kArgmax, x, p);
}
extern "C" int pg_emu_cast(const PgCastParams* p, int s, int d) {
  return run_one(pg_cast_launch(p), kCast, pair(s, d), p);
}

extern "C" int pg_emu_qk_norm(const PgQkNormParams* p, int t) {
  return run_one(pg_qk_norm_launch(p), kQkNorm, t, p);
}
extern "C" int pg_emu_moe_acc(const PgMoeAccParams* p, int t) {
  return run_one(pg_moe_acc_launch(p), kMoeAcc, t, p);
}
// f32 only: dtype code 0.
extern "C" int pg_emu_soft_cap(const PgSoftCapParams* p, int x) {
  return x == PG_F32 ? run(pg_soft_cap_launch(p), pg_soft_cap_f32, p) : 1;
}
extern "C" int pg_emu_moe_route(const PgMoeRouteParams* p, int x) {
  return x == PG_F32 ? run(pg_moe_route_launch(p), pg_moe_route_f32, p) : 1;
}

// sizeof of model.cu's parameter structs, for the test against the Rust mirrors:
// [Embed, Norm, RopeKv, Glu, Gather, Argmax, Cast, QkNorm, SoftCap, MoeRoute, MoeAcc].
extern "C" void pg_model_params_sizes(uint64_t out[11]) {
  out[0] = sizeof(PgEmbedParams);
  out[1] = sizeof(PgNormParams);
  out[2] = sizeof(PgRopeKvParams);
  out[3] = sizeof(PgGluParams);
  out[4] = sizeof(PgGatherParams);
  out[5] = sizeof(PgArgmaxParams);
  out[6] = sizeof(PgCastParams);
  out[7] = sizeof(PgQkNormParams);
  out[8] = sizeof(PgSoftCapParams);
  out[9] = sizeof(PgMoeRouteParams);
  out[10] = sizeof(PgMoeAccParams);
}
#endif
