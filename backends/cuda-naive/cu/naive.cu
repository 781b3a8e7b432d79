// naive attention: the GPU reference. One block per (token, head), f32 accumulation,
// any head dim, any block size, causal with the context offset (a query at row i of a
// sequence with q_len new tokens and seq_len in all sits at pos = seq_len - q_len + i and
// sees keys 0..=pos; with a sliding window w only pos - w + 1..=pos), scores soft-capped
// when asked (params.h). Keys are taken in chunks of one per thread: the chunk's scores
// go to shared memory, then an online-softmax update of the output row (kept in shared
// memory, so any head dim fits). Optional LSE: natural log of the sum of exp of the
// (capped) scaled scores.
#include "common.cuh"

namespace {
constexpr unsigned kThreads = 128;
// 8 CTAs per SM: caps the registers at 64. With no minimum ptxas held the bf16/f16
// kernels to 40 registers and spilled once the soft cap's tanhf came in (55-56 now).
constexpr unsigned kMinBlocks = 8;

template <class T>
__device__ __forceinline__ void naive_body(const PgAttnParams& p) {
  const int first_row = p.query_start_loc[p.seq_begin];
  const int row = first_row + int(blockIdx.x);
  const int head = blockIdx.y;
  const int D = p.head_dim;
  // The sequence of this row: the last s with query_start_loc[s] <= row.
  int lo = p.seq_begin, hi = p.seq_end - 1;
  while (lo < hi) {
    const int mid = (lo + hi + 1) / 2;
    if (p.query_start_loc[mid] <= row) lo = mid; else hi = mid - 1;
  }
  const int seq = lo;
  const int q_len = p.query_start_loc[seq + 1] - p.query_start_loc[seq];
  const int seq_len = p.seq_lens[seq];
  const int pos = seq_len - q_len + (row - p.query_start_loc[seq]);
  const int k_begin = pg::window_start(pos, p.sliding_window), k_end = pos + 1;
  const int kvh = head / (p.num_heads / p.num_kv_heads);
  const int64_t kv_row = int64_t(p.num_kv_heads) * D;
  const int32_t* blocks = p.block_table + int64_t(seq) * p.max_blocks_per_seq;
  const T* q = static_cast<const T*>(p.q) + (int64_t(row) * p.num_heads + head) * D;
  const T* kc = static_cast<const T*>(p.key_cache) + int64_t(kvh) * D;
  const T* vc = static_cast<const T*>(p.value_cache) + int64_t(kvh) * D;

  PG_DYN_SHARED(float, smem);
  float* q_s = smem;       // [D] q * scale
  float* acc = smem + D;   // [D] unnormalised output
  __shared__ float p_s[kThreads];
  __shared__ float red[32];
  const unsigned tid = threadIdx.x;
  for (int d = tid; d < D; d += blockDim.x) {
    q_s[d] = pg::Dt<T>::to(q[d]) * p.scale;
    acc[d] = 0.0f;
  }
  __syncthreads();

  const float cap = p.soft_cap, inv_cap = cap > 0.0f ? 1.0f / cap : 0.0f;
  float m = pg::kNegInf, l = 0.0f;  // identical in every thread
  for (int base = k_begin; base < k_end; base += kThreads) {
    const int j = base + int(tid);
    float s = pg::kNegInf;
    if (j < k_end) {
      const int64_t slot = int64_t(blocks[j / p.block_size]) * p.block_size + j % p.block_size;
      const T* k = kc + slot * kv_row;
      float dot = 0.0f;
      for (int d = 0; d < D; ++d) dot += q_s[d] * pg::Dt<T>::to(k[d]);
      s = cap > 0.0f ? pg::soft_cap(dot, cap, inv_cap) : dot;
    }
    const float m_new = fmaxf(m, pg::block_max(s, red));  // finite: key `base` is valid
    const float alpha = __expf(m - m_new);
    const float pj = j < k_end ? __expf(s - m_new) : 0.0f;
    p_s[tid] = pj;
    l = l * alpha + pg::block_sum(pj, red);  // its barriers also publish p_s
    const int chunk = pg::imin(int(kThreads), k_end - base);
    for (int d = tid; d < D; d += blockDim.x) {
      float a = acc[d] * alpha;
      for (int jj = 0; jj < chunk; ++jj) {
        const int key = base + jj;
        const int64_t slot = int64_t(blocks[key / p.block_size]) * p.block_size + key % p.block_size;
        a += p_s[jj] * pg::Dt<T>::to(vc[slot * kv_row + d]);
      }
      acc[d] = a;
    }
    m = m_new;
    __syncthreads();  // p_s is rewritten by the next chunk
  }
  T* out = static_cast<T*>(p.out) + (int64_t(row) * p.num_heads + head) * D;
  const float inv_l = 1.0f / l;
  for (int d = tid; d < D; d += blockDim.x) out[d] = pg::Dt<T>::from(acc[d] * inv_l);
  if (p.lse != nullptr && tid == 0) p.lse[int64_t(row) * p.num_heads + head] = m + __logf(l);
}
}  // namespace

extern "C" __global__ void __launch_bounds__(kThreads, kMinBlocks) pg_naive_f32(PgAttnParams p) {
  naive_body<float>(p);
}
extern "C" __global__ void __launch_bounds__(kThreads, kMinBlocks) pg_naive_bf16(PgAttnParams p) {
  naive_body<pg::bf16>(p);
}
extern "C" __global__ void __launch_bounds__(kThreads, kMinBlocks) pg_naive_f16(PgAttnParams p) {
  naive_body<pg::f16>(p);
}

#if PG_HOST_ONLY
extern "C" PgLaunch pg_naive_launch(const PgAttnParams* p) {
  return PgLaunch{{uint32_t(p->num_rows), uint32_t(p->num_heads), 1},
                  {kThreads, 1, 1},
                  uint32_t(2 * p->head_dim * sizeof(float))};
}

extern "C" int pg_emu_naive(const PgAttnParams* p, int dtype) {
  const PgLaunch l = pg_naive_launch(p);
  const dim3 grid(l.grid[0], l.grid[1], l.grid[2]), block(l.block[0], l.block[1], l.block[2]);
  switch (dtype) {
    case PG_F32: pagoda_emu::launch(grid, block, l.shared_bytes, pg_naive_f32, *p); return 0;
    case PG_BF16: pagoda_emu::launch(grid, block, l.shared_bytes, pg_naive_bf16, *p); return 0;
    case PG_F16: pagoda_emu::launch(grid, block, l.shared_bytes, pg_naive_f16, *p); return 0;
    default: return 1;
  }
}
#endif
