// paged decode: split-KV flash-decoding over the paged cache (merged by merge.cu).
// For decode rows only (q_len 1). Grid (num_splits, num_kv_heads * head_groups, seqs):
// one CTA serves every query head of a KV head (up to kMaxG of them; more query heads
// per KV head take more CTAs), so each K/V row is read once per CTA, with 16-byte loads.
// A warp takes 32 / (D / VEC) tokens at once (VEC elements per lane, D / VEC lanes per
// token); each lane keeps an online softmax per query head for its token slot; slots,
// then warps, are merged at the end. With num_splits == 1 the CTA writes out/lse
// directly; otherwise partials (f32) go to split_out/split_lse in merge.cu's layout
// and pg_merge_states combines them (log-sum-exp weights). With a sliding window w the
// row sees the last w keys, and the partitions start at the first of them (the plan covers min(seq_len, w)
// keys; a partition past the sequence is empty: lse -inf, weight 0 in the merge).
// Scores are soft-capped after the scale when asked (params.h).
#include "common.cuh"

namespace {
constexpr unsigned kWarps = 4;
constexpr unsigned kThreads = kWarps * 32;
constexpr int kMaxG = 8;

template <class T, int D>
__device__ __forceinline__ void paged_body(const PgAttnParams& p) {
  constexpr int VEC = pg::Vec<T>::N;
  constexpr int LPT = D / VEC;  // lanes per token
  static_assert(D % VEC == 0 && LPT <= 32 && 32 % LPT == 0, "head dim does not fit a warp");
  constexpr int TPW = 32 / LPT;  // token slots per warp
  const int G = p.num_heads / p.num_kv_heads;
  const int groups = (G + kMaxG - 1) / kMaxG;
  const int kvh = blockIdx.y / groups;
  const int g0 = (blockIdx.y % groups) * kMaxG;
  const int ng = pg::imin(kMaxG, G - g0);
  const int split = blockIdx.x;
  const int seq = p.seq_begin + int(blockIdx.z);
  const int row = p.query_start_loc[seq];
  const int seq_len = p.seq_lens[seq];
  // The decode row sits at position seq_len - 1.
  const int k_begin = pg::window_start(seq_len - 1, p.sliding_window) + split * p.partition_size;
  const int k_end = pg::imin(seq_len, k_begin + p.partition_size);
  const unsigned tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
  const int slot_in_warp = lane / LPT, sub = lane % LPT;
  const int64_t kv_row = int64_t(p.num_kv_heads) * D;
  const int32_t* blocks = p.block_table + int64_t(seq) * p.max_blocks_per_seq;
  const T* kc = static_cast<const T*>(p.key_cache) + int64_t(kvh) * D + sub * VEC;
  const T* vc = static_cast<const T*>(p.value_cache) + int64_t(kvh) * D + sub * VEC;
  const int head0 = kvh * G + g0;

  __shared__ float q_s[kMaxG][D];
  __shared__ float w_m[kWarps][kMaxG];
  __shared__ float w_l[kWarps][kMaxG];
  __shared__ float w_acc[kWarps][kMaxG][D];
  const T* q = static_cast<const T*>(p.q) + (int64_t(row) * p.num_heads + head0) * D;
  for (int i = tid; i < ng * D; i += kThreads) q_s[i / D][i % D] = pg::Dt<T>::to(q[i]) * p.scale;
  __syncthreads();
  const float cap = p.soft_cap, inv_cap = cap > 0.0f ? 1.0f / cap : 0.0f;

  float m[kMaxG], l[kMaxG], acc[kMaxG][VEC];
#pragma unroll
  for (int g = 0; g < kMaxG; ++g) {
    m[g] = pg::kNegInf;
    l[g] = 0.0f;
#pragma unroll
    for (int i = 0; i < VEC; ++i) acc[g][i] = 0.0f;
  }
  // kU token groups per warp iteration: their K/V loads are all issued before any is
  // used, so a warp keeps several 16-byte loads in flight (decode is bandwidth-bound).
  // The loop bound is the same for all lanes of a warp, so the shuffles stay converged.
  constexpr int kU = 2;
  for (int base = k_begin + int(warp) * TPW * kU; base < k_end; base += int(kWarps) * TPW * kU) {
    float kf[kU][VEC], vf[kU][VEC];
    bool valid[kU];
#pragma unroll
    for (int u = 0; u < kU; ++u) {
      const int j = base + u * TPW + slot_in_warp;
      valid[u] = j < k_end;
      if (valid[u]) {
        const int64_t slot = int64_t(blocks[j / p.block_size]) * p.block_size + j % p.block_size;
        pg::load16(kc + slot * kv_row, kf[u]);
        pg::load16(vc + slot * kv_row, vf[u]);
      } else {
#pragma unroll
        for (int i = 0; i < VEC; ++i) kf[u][i] = vf[u][i] = 0.0f;
      }
    }
#pragma unroll
    for (int u = 0; u < kU; ++u) {
#pragma unroll
      for (int g = 0; g < kMaxG; ++g) {
        if (g < ng) {  // uniform across the warp
          float s = 0.0f;
#pragma unroll
          for (int i = 0; i < VEC; ++i) s += q_s[g][sub * VEC + i] * kf[u][i];
#pragma unroll
          for (int o = LPT / 2; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
          if (cap > 0.0f) s = pg::soft_cap(s, cap, inv_cap);  // uniform branch
          if (valid[u]) {
            const float m_new = fmaxf(m[g], s);
            const float alpha = __expf(m[g] - m_new);
            const float pj = __expf(s - m_new);
            l[g] = l[g] * alpha + pj;
#pragma unroll
            for (int i = 0; i < VEC; ++i) acc[g][i] = acc[g][i] * alpha + pj * vf[u][i];
            m[g] = m_new;
          }
        }
      }
    }
  }
  // Merge the token slots of the warp (lanes sub, sub + LPT, ... hold the same dims).
#pragma unroll
  for (int o = LPT; o < 32; o <<= 1) {
#pragma unroll
    for (int g = 0; g < kMaxG; ++g) {
      if (g < ng) {
        const float om = __shfl_xor_sync(0xffffffffu, m[g], o);
        const float ol = __shfl_xor_sync(0xffffffffu, l[g], o);
        const float mn = fmaxf(m[g], om);
        const float a = mn == pg::kNegInf ? 0.0f : __expf(m[g] - mn);
        const float b = mn == pg::kNegInf ? 0.0f : __expf(om - mn);
        l[g] = l[g] * a + ol * b;
#pragma unroll
        for (int i = 0; i < VEC; ++i) {
          const float oa = __shfl_xor_sync(0xffffffffu, acc[g][i], o);
          acc[g][i] = acc[g][i] * a + oa * b;
        }
        m[g] = mn;
      }
    }
  }
  if (lane < unsigned(LPT)) {
    for (int g = 0; g < ng; ++g) {
#pragma unroll
      for (int i = 0; i < VEC; ++i) w_acc[warp][g][sub * VEC + i] = acc[g][i];
      if (lane == 0) {
        w_m[warp][g] = m[g];
        w_l[warp][g] = l[g];
      }
    }
  }
  __syncthreads();
  // Merge the warps and write: one thread per (head, dim).
  for (int i = tid; i < ng * D; i += kThreads) {
    const int g = i / D, d = i % D;
    float mx = pg::kNegInf;
    for (unsigned w = 0; w < kWarps; ++w) mx = fmaxf(mx, w_m[w][g]);
    float L = 0.0f, O = 0.0f;
    if (mx != pg::kNegInf) {
      for (unsigned w = 0; w < kWarps; ++w) {
        const float e = __expf(w_m[w][g] - mx);
        L += w_l[w][g] * e;
        O += w_acc[w][g][d] * e;
      }
    }
    const int head = head0 + g;
    const float o = L > 0.0f ? O / L : 0.0f;
    const float lse = L > 0.0f ? mx + __logf(L) : pg::kNegInf;
    if (p.num_splits == 1) {
      static_cast<T*>(p.out)[(int64_t(row) * p.num_heads + head) * D + d] = pg::Dt<T>::from(o);
      if (d == 0 && p.lse != nullptr) p.lse[int64_t(row) * p.num_heads + head] = lse;
    } else {
      const int64_t part = (int64_t(seq - p.seq_begin) * p.num_heads + head) * p.num_splits + split;
      p.split_out[part * D + d] = o;
      if (d == 0) p.split_lse[part] = lse;
    }
  }
}

}  // namespace

#define PG_PAGED(T, NAME, D)                                                                  \
  extern "C" __global__ void __launch_bounds__(kThreads) pg_paged_##NAME##_d##D(PgAttnParams p) { \
    paged_body<T, D>(p);                                                                      \
  }
PG_PAGED(float, f32, 64)
PG_PAGED(float, f32, 128)
PG_PAGED(pg::bf16, bf16, 64)
PG_PAGED(pg::bf16, bf16, 128)
PG_PAGED(pg::bf16, bf16, 256)
PG_PAGED(pg::f16, f16, 64)
PG_PAGED(pg::f16, f16, 128)
PG_PAGED(pg::f16, f16, 256)

#if PG_HOST_ONLY
extern "C" PgLaunch pg_paged_launch(const PgAttnParams* p) {
  const int G = p->num_heads / p->num_kv_heads;
  const int groups = (G + kMaxG - 1) / kMaxG;
  return PgLaunch{{uint32_t(p->num_splits), uint32_t(p->num_kv_heads * groups),
                   uint32_t(p->seq_end - p->seq_begin)},
                  {kThreads, 1, 1},
                  0};
}

namespace {
using PagedFn = void (*)(PgAttnParams);
PagedFn paged_fn(int dtype, int d) {
  switch (dtype * 1000 + d) {
    case PG_F32 * 1000 + 64: return pg_paged_f32_d64;
    case PG_F32 * 1000 + 128: return pg_paged_f32_d128;
    case PG_BF16 * 1000 + 64: return pg_paged_bf16_d64;
    case PG_BF16 * 1000 + 128: return pg_paged_bf16_d128;
    case PG_BF16 * 1000 + 256: return pg_paged_bf16_d256;
    case PG_F16 * 1000 + 64: return pg_paged_f16_d64;
    case PG_F16 * 1000 + 128: return pg_paged_f16_d128;
    case PG_F16 * 1000 + 256: return pg_paged_f16_d256;
    default: return nullptr;
  }
}
}  // namespace

extern "C" int pg_emu_paged(const PgAttnParams* p, int dtype) {
  const PagedFn f = paged_fn(dtype, p->head_dim);
  if (f == nullptr) return 1;
  const PgLaunch l = pg_paged_launch(p);
  pagoda_emu::launch(dim3(l.grid[0], l.grid[1], l.grid[2]), dim3(l.block[0], l.block[1], l.block[2]),
                     l.shared_bytes, f, *p);
  return 0;
}
#endif
