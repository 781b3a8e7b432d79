// write_kv (vLLM's reshape_and_cache): the step's new K/V rows (f32, bf16 or f16)
// [num_tokens, num_kv_heads, head_dim], into the paged pools
// [num_blocks, block_size, num_kv_heads, head_dim] of f32/bf16/f16 at slot_mapping[token];
// slot -1 (padding) is skipped. One block per token; the pool row of a slot is contiguous
// (slot * num_kv_heads * head_dim), so the copy is a strided-free loop.
#include "common.cuh"

namespace {
constexpr unsigned kThreads = 256;

// Element i of a source row of the given dtype, as f32 (the switch is uniform per launch).
__device__ __forceinline__ float load_src(const void* row, int64_t i, int dtype) {
  switch (dtype) {
    case PG_BF16: return pg::Dt<pg::bf16>::to(static_cast<const pg::bf16*>(row)[i]);
    case PG_F16: return pg::Dt<pg::f16>::to(static_cast<const pg::f16*>(row)[i]);
    default: return static_cast<const float*>(row)[i];
  }
}

template <class T>
__device__ __forceinline__ void write_kv_body(const PgWriteKvParams& p) {
  const int token = blockIdx.x;
  const int64_t slot = p.slot_mapping[token];
  if (slot < 0) return;
  const int64_t row = int64_t(p.num_kv_heads) * p.head_dim;
  const int esz = p.src_dtype == PG_F32 ? 4 : 2;
  const void* k = static_cast<const char*>(p.key) + token * row * esz;
  const void* v = static_cast<const char*>(p.value) + token * row * esz;
  T* kc = static_cast<T*>(p.key_cache) + slot * row;
  T* vc = static_cast<T*>(p.value_cache) + slot * row;
  for (int64_t i = threadIdx.x; i < row; i += blockDim.x) {
    kc[i] = pg::Dt<T>::from(load_src(k, i, p.src_dtype));
    vc[i] = pg::Dt<T>::from(load_src(v, i, p.src_dtype));
  }
}
}  // namespace

extern "C" __global__ void __launch_bounds__(kThreads) pg_write_kv_f32(PgWriteKvParams p) {
  write_kv_body<float>(p);
}
extern "C" __global__ void __launch_bounds__(kThreads) pg_write_kv_bf16(PgWriteKvParams p) {
  write_kv_body<pg::bf16>(p);
}
extern "C" __global__ void __launch_bounds__(kThreads) pg_write_kv_f16(PgWriteKvParams p) {
  write_kv_body<pg::f16>(p);
}

#if PG_HOST_ONLY
extern "C" PgLaunch pg_write_kv_launch(const PgWriteKvParams* p) {
  return PgLaunch{{uint32_t(p->num_tokens), 1, 1}, {kThreads, 1, 1}, 0};
}

extern "C" int pg_emu_write_kv(const PgWriteKvParams* p, int dtype) {
  const PgLaunch l = pg_write_kv_launch(p);
  const dim3 grid(l.grid[0], l.grid[1], l.grid[2]), block(l.block[0], l.block[1], l.block[2]);
  switch (dtype) {
    case PG_F32: pagoda_emu::launch(grid, block, l.shared_bytes, pg_write_kv_f32, *p); return 0;
    case PG_BF16: pagoda_emu::launch(grid, block, l.shared_bytes, pg_write_kv_bf16, *p); return 0;
    case PG_F16: pagoda_emu::launch(grid, block, l.shared_bytes, pg_write_kv_f16, *p); return 0;
    default: return 1;
  }
}
#endif
