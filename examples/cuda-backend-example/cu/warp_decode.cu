// warp_decode: one warp per (decode row, head). The example CUDA backend's kernel
// (docs/new-backend.md): it lives in this crate, not in pagoda-cuda-kernels.
//
// Each of the 32 lanes holds head_dim / 32 elements of q (pre-scaled) and of the output
// row. Keys are taken one at a time in position order: the dot product is a butterfly
// sum over the lanes (the same order on every launch, so every lane holds the same
// score), then an online-softmax update. A row's arithmetic depends on its own keys
// only, never on the batch it is in: the backend declares batch invariance. Decode
// rows only (one query token per sequence, at position seq_len - 1); sliding windows
// and logit soft caps with naive.cu's semantics (params.h). Slow for long contexts
// (one key per step, no split-KV): it is a template, not a fast path.
#include "common.cuh"

namespace {
constexpr unsigned kLanes = 32;
// Head dims up to 256 (8 elements per lane), multiples of 32.
constexpr int kMaxPerLane = 8;

template <class T>
__device__ __forceinline__ void warp_decode_body(const PgAttnParams& p) {
  const int seq = p.seq_begin + int(blockIdx.x);
  const int head = blockIdx.y;
  const int D = p.head_dim, per_lane = D / int(kLanes);
  const unsigned lane = threadIdx.x;
  const int row = p.query_start_loc[seq];
  const int pos = p.seq_lens[seq] - 1;
  const int k_begin = pg::window_start(pos, p.sliding_window), k_end = pos + 1;
  const int kvh = head / (p.num_heads / p.num_kv_heads);
  const int64_t kv_row = int64_t(p.num_kv_heads) * D;
  const int32_t* blocks = p.block_table + int64_t(seq) * p.max_blocks_per_seq;
  const T* q = static_cast<const T*>(p.q) + (int64_t(row) * p.num_heads + head) * D;
  const T* kc = static_cast<const T*>(p.key_cache) + int64_t(kvh) * D;
  const T* vc = static_cast<const T*>(p.value_cache) + int64_t(kvh) * D;

  // Lane `lane` owns elements lane, lane + 32, ...: neighbouring lanes read
  // neighbouring elements (coalesced).
  // Loops over kMaxPerLane, unrolled, with a guard: indices known at compile time keep
  // both arrays in registers (a runtime bound would put them in local memory).
  float qs[kMaxPerLane], acc[kMaxPerLane];
#pragma unroll
  for (int i = 0; i < kMaxPerLane; ++i) {
    if (i >= per_lane) break;
    qs[i] = pg::Dt<T>::to(q[i * int(kLanes) + int(lane)]) * p.scale;
    acc[i] = 0.0f;
  }
  const float cap = p.soft_cap, inv_cap = cap > 0.0f ? 1.0f / cap : 0.0f;
  float m = pg::kNegInf, l = 0.0f;  // identical in every lane
  for (int j = k_begin; j < k_end; ++j) {
    const int64_t slot = int64_t(blocks[j / p.block_size]) * p.block_size + j % p.block_size;
    const T* k = kc + slot * kv_row;
    const T* v = vc + slot * kv_row;
    float dot = 0.0f;
#pragma unroll
    for (int i = 0; i < kMaxPerLane; ++i)
      if (i < per_lane) dot += qs[i] * pg::Dt<T>::to(k[i * int(kLanes) + int(lane)]);
    float s = pg::warp_sum(dot);
    if (cap > 0.0f) s = pg::soft_cap(s, cap, inv_cap);
    const float m_new = fmaxf(m, s);
    const float alpha = __expf(m - m_new), pj = __expf(s - m_new);
    l = l * alpha + pj;
#pragma unroll
    for (int i = 0; i < kMaxPerLane; ++i)
      if (i < per_lane) acc[i] = acc[i] * alpha + pj * pg::Dt<T>::to(v[i * int(kLanes) + int(lane)]);
    m = m_new;
  }
  T* out = static_cast<T*>(p.out) + (int64_t(row) * p.num_heads + head) * D;
  const float inv_l = 1.0f / l;
#pragma unroll
  for (int i = 0; i < kMaxPerLane; ++i)
    if (i < per_lane) out[i * int(kLanes) + int(lane)] = pg::Dt<T>::from(acc[i] * inv_l);
  if (p.lse != nullptr && lane == 0) p.lse[int64_t(row) * p.num_heads + head] = m + __logf(l);
}
}  // namespace

extern "C" __global__ void __launch_bounds__(kLanes) pg_warp_decode_f32(PgAttnParams p) {
  warp_decode_body<float>(p);
}
extern "C" __global__ void __launch_bounds__(kLanes) pg_warp_decode_bf16(PgAttnParams p) {
  warp_decode_body<pg::bf16>(p);
}
extern "C" __global__ void __launch_bounds__(kLanes) pg_warp_decode_f16(PgAttnParams p) {
  warp_decode_body<pg::f16>(p);
}

#if PG_HOST_ONLY
// One block of one warp per (sequence, head); no shared memory.
extern "C" PgLaunch pg_warp_decode_launch(const PgAttnParams* p) {
  return PgLaunch{{uint32_t(p->seq_end - p->seq_begin), uint32_t(p->num_heads), 1}, {kLanes, 1, 1}, 0};
}

// The emulator's entry: 0, or 1 for a dtype or head dim with no instantiation.
extern "C" int pg_emu_warp_decode(const PgAttnParams* p, int dtype) {
  if (p->head_dim <= 0 || p->head_dim % int(kLanes) != 0 || p->head_dim > int(kLanes) * kMaxPerLane) return 1;
  const PgLaunch l = pg_warp_decode_launch(p);
  const dim3 grid(l.grid[0], l.grid[1], l.grid[2]), block(l.block[0], l.block[1], l.block[2]);
  switch (dtype) {
    case PG_F32: pagoda_emu::launch(grid, block, l.shared_bytes, pg_warp_decode_f32, *p); return 0;
    case PG_BF16: pagoda_emu::launch(grid, block, l.shared_bytes, pg_warp_decode_bf16, *p); return 0;
    case PG_F16: pagoda_emu::launch(grid, block, l.shared_bytes, pg_warp_decode_f16, *p); return 0;
    default: return 1;
  }
}
#endif
