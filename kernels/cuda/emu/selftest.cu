// Self-test of the emulator's primitives that the attention kernels do not all use:
// shfl_down/shfl with width, votes, atomics (int, f32 add, f32 max via CAS), dynamic
// shared memory, 2-D blocks, and the bf16/f16 conversions. Host-only (tests/emu_simt.rs).
#include "../cu/common.cuh"

namespace {
// out layout (ints): [0..64) shfl_down sums per lane, [64..128) shfl(width 8) results,
// [128] ballot of odd lanes (warp 0), [129] any, [130] all, [131] atomic int sum,
// [132] 2-D linear-index check, float slots after.
__global__ void selftest(int* out, float* fout) {
  PG_DYN_SHARED(int, dyn);
  const unsigned tid = threadIdx.y * blockDim.x + threadIdx.x;  // 2-D block 16 x 4
  const unsigned lane = tid % 32;
  dyn[tid] = int(tid);
  __syncthreads();
  int v = dyn[(tid + 1) % 64];
  for (int o = 16; o > 0; o >>= 1) v += __shfl_down_sync(0xffffffffu, v, o);
  out[tid] = v;  // lane 0 of each warp: the warp's sum
  out[64 + tid] = __shfl_sync(0xffffffffu, int(lane), 3, 8);  // lane 3 of each 8-lane segment
  const unsigned b = __ballot_sync(0xffffffffu, lane & 1);
  const int any = __any_sync(0xffffffffu, lane == 5);
  const int all = __all_sync(0xffffffffu, lane < 31);
  if (tid == 0) {
    out[128] = int(b);
    out[129] = any;
    out[130] = all;
  }
  atomicAdd(&out[131], int(tid));
  atomicMax(&out[133], int(tid) * 3);
  if (threadIdx.x + 16 * threadIdx.y != tid) out[132] = -1;
  atomicAdd(&fout[0], 0.5f);
  pg::atomic_max_f32(&fout[1], float(tid) - 10.0f);
}
}  // namespace

extern "C" void pg_emu_selftest(int* out, float* fout) {
  pagoda_emu::launch(dim3(1), dim3(16, 4), 64 * sizeof(int), selftest, out, fout);
}
extern "C" uint16_t pg_emu_f32_to_bf16(float x) { return __float2bfloat16(x).x; }
extern "C" uint16_t pg_emu_f32_to_f16(float x) { return __float2half(x).x; }
extern "C" float pg_emu_bf16_to_f32(uint16_t x) { return __bfloat162float({x}); }
extern "C" float pg_emu_f16_to_f32(uint16_t x) { return __half2float({x}); }

// The fault noted by the emulated kernels since the last call (0 = none), cleared
// (`graph::launch` calls it after every emulated launch).
extern "C" int pg_emu_take_fault() {
  const int f = pagoda_emu::tl_fault;
  pagoda_emu::tl_fault = 0;
  return f;
}
