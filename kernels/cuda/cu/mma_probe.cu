// mma_probe: one warp runs one m16n8k16 mma on A (16x16 row-major), B (16x8 row-major
// K x N) and C (16x8) from global memory, loading the fragments with the PTX layout
// written out here independently of simt.h. On the emulator it checks the host
// fallback against a plain matmul; on the GPU the same inputs check the hardware
// against the emulator (scripts/device-check.sh).
#include "common.cuh"

typedef struct PgMmaProbeParams {
  const void* a;  // [16][16] bf16/f16
  const void* b;  // [16][8] bf16/f16, row k, column n
  const float* c; // [16][8]
  float* d;       // [16][8]
} PgMmaProbeParams;

namespace {
template <class T>
__device__ __forceinline__ void probe_body(const PgMmaProbeParams& p) {
  const T* a = static_cast<const T*>(p.a);
  const T* b = static_cast<const T*>(p.b);
  const int lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  const uint32_t af[4] = {
      pg::pack2<T>(a[g * 16 + 2 * t], a[g * 16 + 2 * t + 1]),
      pg::pack2<T>(a[(g + 8) * 16 + 2 * t], a[(g + 8) * 16 + 2 * t + 1]),
      pg::pack2<T>(a[g * 16 + 2 * t + 8], a[g * 16 + 2 * t + 9]),
      pg::pack2<T>(a[(g + 8) * 16 + 2 * t + 8], a[(g + 8) * 16 + 2 * t + 9]),
  };
  const uint32_t bf[2] = {
      pg::pack2<T>(b[(2 * t) * 8 + g], b[(2 * t + 1) * 8 + g]),
      pg::pack2<T>(b[(2 * t + 8) * 8 + g], b[(2 * t + 9) * 8 + g]),
  };
  const float cf[4] = {p.c[g * 8 + 2 * t], p.c[g * 8 + 2 * t + 1], p.c[(g + 8) * 8 + 2 * t],
                       p.c[(g + 8) * 8 + 2 * t + 1]};
  float d[4];
  pg::mma_m16n8k16<T>(d, af, bf, cf);
  p.d[g * 8 + 2 * t] = d[0];
  p.d[g * 8 + 2 * t + 1] = d[1];
  p.d[(g + 8) * 8 + 2 * t] = d[2];
  p.d[(g + 8) * 8 + 2 * t + 1] = d[3];
}
}  // namespace

extern "C" __global__ void pg_mma_probe_bf16(PgMmaProbeParams p) { probe_body<pg::bf16>(p); }
extern "C" __global__ void pg_mma_probe_f16(PgMmaProbeParams p) { probe_body<pg::f16>(p); }

#if PG_HOST_ONLY
extern "C" int pg_emu_mma_probe(const PgMmaProbeParams* p, int dtype) {
  switch (dtype) {
    case PG_BF16: pagoda_emu::launch(dim3(1), dim3(32), 0, pg_mma_probe_bf16, *p); return 0;
    case PG_F16: pagoda_emu::launch(dim3(1), dim3(32), 0, pg_mma_probe_f16, *p); return 0;
    default: return 1;
  }
}

// Sizes of the parameter structs, so a Rust test can check its #[repr(C)] mirrors.
extern "C" void pg_params_sizes(uint64_t out[4]) {
  out[0] = sizeof(PgWriteKvParams);
  out[1] = sizeof(PgAttnParams);
  out[2] = sizeof(PgLaunch);
  out[3] = sizeof(PgMmaProbeParams);
}
#endif
