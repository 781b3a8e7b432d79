// merge_states: combines the partial attention states of a split-KV decode kernel
// (flash-decoding). A library kernel, not a backend's: any split-KV kernel that writes
// its partitions in this layout gets the merge for free (`paged.cu` does; the device
// code path launches it after the split kernel when `num_splits > 1`).
//
// Layout (params.h): partition `s` of (sequence `seq`, query head `head`) is
// `part = ((seq - seq_begin) * num_heads + head) * num_splits + s`; its normalized
// output row is `split_out[part * head_dim ..][..head_dim]` (f32) and its natural-log
// LSE `split_lse[part]` (-inf for an empty partition, which then weighs 0). Grid
// (seqs, num_heads), one block per (sequence, head); the sequence's one query row is
// `query_start_loc[seq]`. Weights exp(lse_s - max lse), summed in partition order, so a
// row's bits depend on its partitions only.
#include "common.cuh"

namespace {
constexpr unsigned kThreads = 128;

template <class T>
__device__ __forceinline__ void merge_body(const PgAttnParams& p) {
  const int seq = p.seq_begin + int(blockIdx.x);
  const int head = blockIdx.y;
  const int row = p.query_start_loc[seq];
  const int D = p.head_dim;
  const int64_t part0 = (int64_t(seq - p.seq_begin) * p.num_heads + head) * p.num_splits;
  float mx = pg::kNegInf;
  for (int s = 0; s < p.num_splits; ++s) mx = fmaxf(mx, p.split_lse[part0 + s]);
  float L = 0.0f;
  for (int s = 0; s < p.num_splits; ++s) L += __expf(p.split_lse[part0 + s] - mx);
  for (int d = threadIdx.x; d < D; d += blockDim.x) {
    float o = 0.0f;
    for (int s = 0; s < p.num_splits; ++s) {
      const float w = __expf(p.split_lse[part0 + s] - mx);
      if (w > 0.0f) o += w * p.split_out[(part0 + s) * D + d];
    }
    static_cast<T*>(p.out)[(int64_t(row) * p.num_heads + head) * D + d] = pg::Dt<T>::from(o / L);
  }
  if (threadIdx.x == 0 && p.lse != nullptr) p.lse[int64_t(row) * p.num_heads + head] = mx + __logf(L);
}
}  // namespace

extern "C" __global__ void __launch_bounds__(kThreads) pg_merge_states_f32(PgAttnParams p) {
  merge_body<float>(p);
}
extern "C" __global__ void __launch_bounds__(kThreads) pg_merge_states_bf16(PgAttnParams p) {
  merge_body<pg::bf16>(p);
}
extern "C" __global__ void __launch_bounds__(kThreads) pg_merge_states_f16(PgAttnParams p) {
  merge_body<pg::f16>(p);
}

#if PG_HOST_ONLY
extern "C" PgLaunch pg_merge_states_launch(const PgAttnParams* p) {
  return PgLaunch{{uint32_t(p->seq_end - p->seq_begin), uint32_t(p->num_heads), 1},
                  {kThreads, 1, 1},
                  0};
}

extern "C" int pg_emu_merge_states(const PgAttnParams* p, int dtype) {
  void (*f)(PgAttnParams) = nullptr;
  switch (dtype) {
    case PG_F32: f = pg_merge_states_f32; break;
    case PG_BF16: f = pg_merge_states_bf16; break;
    case PG_F16: f = pg_merge_states_f16; break;
    default: return 1;
  }
  const PgLaunch l = pg_merge_states_launch(p);
  pagoda_emu::launch(dim3(l.grid[0], l.grid[1], l.grid[2]), dim3(l.block[0], l.block[1], l.block[2]),
                     l.shared_bytes, f, *p);
  return 0;
}
#endif
