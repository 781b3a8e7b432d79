// common.cuh: what every kernel file includes. Under nvcc (__CUDACC__) it is the CUDA
// headers plus inline PTX; under g++ it is the SIMT emulator (../emu/simt.h), so one
// kernel source builds both ways. Kernels use only what this file and simt.h provide.
#pragma once

#ifdef __CUDACC__
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <stdint.h>
#define PG_DYN_SHARED(T, name) extern __shared__ uint4 pg_dyn_smem_[]; T* name = reinterpret_cast<T*>(pg_dyn_smem_)
#else
#include "../emu/simt.h"
#endif

#include "params.h"

namespace pg {

using bf16 = __nv_bfloat16;
using f16 = __half;

// dtype traits: to/from f32 and the raw 16 bits (for packing mma operands).
template <class T>
struct Dt;
template <>
struct Dt<float> {
  static __device__ __forceinline__ float to(float x) { return x; }
  static __device__ __forceinline__ float from(float x) { return x; }
};
template <>
struct Dt<bf16> {
  static __device__ __forceinline__ float to(bf16 x) { return __bfloat162float(x); }
  static __device__ __forceinline__ bf16 from(float x) { return __float2bfloat16(x); }
  static __device__ __forceinline__ uint32_t bits(bf16 x) { return __bfloat16_as_ushort(x); }
};
template <>
struct Dt<f16> {
  static __device__ __forceinline__ float to(f16 x) { return __half2float(x); }
  static __device__ __forceinline__ f16 from(float x) { return __float2half(x); }
  static __device__ __forceinline__ uint32_t bits(f16 x) { return __half_as_ushort(x); }
};

// Two 16-bit elements in one register, `lo` in the low half (the mma operand order).
template <class T>
__device__ __forceinline__ uint32_t pack2(T lo, T hi) {
  return Dt<T>::bits(lo) | (Dt<T>::bits(hi) << 16);
}
template <class T>
__device__ __forceinline__ uint32_t pack2f(float lo, float hi) {
  return pack2<T>(Dt<T>::from(lo), Dt<T>::from(hi));
}

// 16 bytes = 16 / sizeof(T) elements, converted to f32. On the GPU `p` must be 16-byte
// aligned (the caller guarantees it: row starts are multiples of 16 bytes).
template <class T>
struct Vec {
  static constexpr int N = 16 / sizeof(T);
};
template <class T>
__device__ __forceinline__ void load16(const T* __restrict__ p, float* out) {
  T elems[Vec<T>::N];
#ifdef __CUDACC__
  *reinterpret_cast<uint4*>(elems) = *reinterpret_cast<const uint4*>(p);
#else
  pagoda_emu::check_aligned16(p);  // the GPU's uint4 load faults when misaligned
  std::memcpy(elems, p, 16);
#endif
#pragma unroll
  for (int i = 0; i < Vec<T>::N; ++i) out[i] = Dt<T>::to(elems[i]);
}
// Raw 16-byte copy (global -> shared tiles).
__device__ __forceinline__ void copy16(void* dst, const void* src) {
#ifdef __CUDACC__
  *reinterpret_cast<uint4*>(dst) = *reinterpret_cast<const uint4*>(src);
#else
  pagoda_emu::check_aligned16(dst);
  pagoda_emu::check_aligned16(src);
  std::memcpy(dst, src, 16);
#endif
}

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// atomicMax for f32 (CUDA has none): CAS on the bits, NaN-free inputs assumed.
__device__ __forceinline__ float atomic_max_f32(float* addr, float v) {
  int* a = reinterpret_cast<int*>(addr);
  int old = *a;
  while (__int_as_float(old) < v) {
    int seen = atomicCAS(a, old, __float_as_int(v));
    if (seen == old) break;
    old = seen;
  }
  return __int_as_float(old);
}

// D = A(16x16) * B(16x8) + C on tensor cores, f32 accumulate; fragments in the PTX
// layout (see simt.h's a_loc/b_loc/c_loc). T = bf16 or f16.
template <class T>
__device__ __forceinline__ void mma_m16n8k16(float d[4], const uint32_t a[4], const uint32_t b[2],
                                             const float c[4]) {
#ifdef __CUDACC__
#if defined(__CUDA_ARCH__)
  if constexpr (__is_same(T, bf16)) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
        "{%8,%9}, {%10,%11,%12,%13};\n"
        : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]), "f"(c[0]), "f"(c[1]),
          "f"(c[2]), "f"(c[3]));
  } else {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
        "{%8,%9}, {%10,%11,%12,%13};\n"
        : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]), "f"(c[0]), "f"(c[1]),
          "f"(c[2]), "f"(c[3]));
  }
#endif
#else
  pagoda_emu::mma_m16n8k16<T>(d, a, b, c);
#endif
}

// ldmatrix .x4 (b16) from shared memory: `row` is this lane's 16-byte row (lane l names
// row l % 8 of matrix l / 8); register i gets matrix i in the mma fragment order (.trans:
// transposed). See simt.h's ldmatrix_x4 for the exact mapping the host reproduces.
template <bool Trans>
__device__ __forceinline__ void ldmatrix_x4(uint32_t r[4], const void* row) {
#ifdef __CUDACC__
#if defined(__CUDA_ARCH__)
  const unsigned addr = static_cast<unsigned>(__cvta_generic_to_shared(row));
  if constexpr (Trans) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr));
  } else {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr));
  }
#endif
#else
  pagoda_emu::ldmatrix_x4<Trans>(r, row);
#endif
}

// cp.async (16 bytes, global -> shared, L2 only) with zero fill when !valid (then `src`
// must still be a valid address; nothing is read). The emulator copies synchronously,
// so a missing cp_async_wait is NOT found on the CPU (docs/gpu.md, limits).
__device__ __forceinline__ void cp_async16(void* dst, const void* src, bool valid) {
#ifdef __CUDACC__
#if defined(__CUDA_ARCH__)
  const unsigned d = static_cast<unsigned>(__cvta_generic_to_shared(dst));
  const int n = valid ? 16 : 0;
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(d), "l"(src), "r"(n));
#endif
#else
  pagoda_emu::check_aligned16(dst);
  if (valid) pagoda_emu::check_aligned16(src);
  if (valid) std::memcpy(dst, src, 16); else std::memset(dst, 0, 16);
#endif
}
__device__ __forceinline__ void cp_async_commit() {
#if defined(__CUDA_ARCH__)
  asm volatile("cp.async.commit_group;\n" ::);
#endif
}
// Waits until at most N of this thread's committed groups are still in flight.
template <int N>
__device__ __forceinline__ void cp_async_wait() {
#if defined(__CUDA_ARCH__)
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
#endif
}

__device__ __forceinline__ int imin(int a, int b) { return a < b ? a : b; }
__device__ __forceinline__ int imax(int a, int b) { return a > b ? a : b; }

// The first key a query at position `pos` sees: 0, or with a sliding window w (> 0)
// pos - w + 1 (the last w positions), never below 0.
__device__ __forceinline__ int window_start(int pos, int window) {
  return window > 0 ? imax(0, pos - window + 1) : 0;
}

// Logit soft-capping of a scaled score: cap * tanh(s / cap), `inv_cap` = 1 / cap. The
// full-precision tanhf, not tanh.approx: its ~2^-11 relative error, times a cap of
// 30-50, would move the softmax weights by more than the f16 tolerance.
__device__ __forceinline__ float soft_cap(float s, float cap, float inv_cap) {
  return cap * tanhf(s * inv_cap);
}

}  // namespace pg

namespace pg {
// Block-wide reductions over all threads (blockDim.x a multiple of 32, at most 1024).
// `red` is a __shared__ float[32] of the caller; every thread gets the result.
__device__ __forceinline__ float block_max(float v, float* red) {
  v = warp_max(v);
  if (threadIdx.x % 32 == 0) red[threadIdx.x / 32] = v;
  __syncthreads();
  float r = red[0];
  for (unsigned w = 1; w < blockDim.x / 32; ++w) r = fmaxf(r, red[w]);
  __syncthreads();  // `red` is free again for the next reduction
  return r;
}
__device__ __forceinline__ float block_sum(float v, float* red) {
  v = warp_sum(v);
  if (threadIdx.x % 32 == 0) red[threadIdx.x / 32] = v;
  __syncthreads();
  float r = 0.0f;
  for (unsigned w = 0; w < blockDim.x / 32; ++w) r += red[w];
  __syncthreads();
  return r;
}
constexpr float kNegInf = -__builtin_huge_valf();
}  // namespace pg

/* Host-only part of a kernel file: the geometry and the emulator's launcher. */
#ifdef __CUDACC__
#define PG_HOST_ONLY 0
#else
#define PG_HOST_ONLY 1
#endif
