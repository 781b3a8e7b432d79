// cutlass_gemm.cu: pagoda-cutlass's tensor-core GEMM, out = x . w^T (cutlass_gemm.h).
//
// One CUTLASS 2.x device-level GEMM per 16-bit dtype (bf16, f16), f32 accumulation,
// sm80 mma.sync m16n8k16 (the same SASS runs on sm90; no wgmma, so no sm_90a needed).
// Layouts: x row-major [m, k] is CUTLASS's A (RowMajor, lda = k); w[n, k] row-major is
// B = w^T [k, n] in ColumnMajor (ldb = k); out row-major [m, n] (ldc = n). Two
// instantiations only: each costs ~10-20 s of nvcc for sm80 + sm90 on CI's 2 cores.
#include "cutlass_gemm.h"

#include <cuda_runtime.h>

#include "cutlass/bfloat16.h"
#include "cutlass/cutlass.h"
#include "cutlass/epilogue/thread/linear_combination.h"
#include "cutlass/gemm/device/gemm.h"
#include "cutlass/half.h"

namespace {

// 128x128 CTA tile, K step 64, 4 warps of 64x64, 3 cp.async stages (96 KiB of shared
// memory: two CTAs per SM on sm80 and sm90). 8-element (128-bit) accesses for A, B and
// the epilogue: the reason for PG_CUTLASS_ALIGN_ELEMS.
template <typename T>
using Gemm = cutlass::gemm::device::Gemm<
    T, cutlass::layout::RowMajor,     // A = x
    T, cutlass::layout::ColumnMajor,  // B = w^T
    T, cutlass::layout::RowMajor,     // C, D = out
    float,                            // accumulator
    cutlass::arch::OpClassTensorOp, cutlass::arch::Sm80,
    cutlass::gemm::GemmShape<128, 128, 64>, cutlass::gemm::GemmShape<64, 64, 64>,
    cutlass::gemm::GemmShape<16, 8, 16>,
    cutlass::epilogue::thread::LinearCombination<T, 128 / cutlass::sizeof_bits<T>::value,
                                                 float, float>,
    cutlass::gemm::threadblock::GemmIdentityThreadblockSwizzle<8>, 3, PG_CUTLASS_ALIGN_ELEMS,
    PG_CUTLASS_ALIGN_ELEMS>;

PgCutlassResult result(int32_t status, int32_t detail = 0, int32_t cuda_error = 0) {
  PgCutlassResult r;
  r.status = status;
  r.detail = detail;
  r.cuda_error = cuda_error;
  return r;
}

PgCutlassResult from_cutlass(cutlass::Status s) {
  if (s == cutlass::Status::kSuccess) return result(PG_CUTLASS_OK);
  if (s == cutlass::Status::kErrorMisalignedOperand)
    return result(PG_CUTLASS_MISALIGNED, static_cast<int32_t>(s));
  if (s == cutlass::Status::kErrorInternal) {
    // CUTLASS reports a failed launch or cudaFuncSetAttribute as kErrorInternal: say which.
    cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess) return result(PG_CUTLASS_CUDA_ERROR, static_cast<int32_t>(s), e);
  }
  return result(PG_CUTLASS_NOT_SUPPORTED, static_cast<int32_t>(s));
}

bool aligned16(uint64_t addr) { return addr % 16 == 0; }

template <typename T>
PgCutlassResult run(const PgCutlassGemmParams *p) {
  using G = Gemm<T>;
  // CUTLASS checks the strides and extents; the base addresses are checked here too so
  // that a misaligned pointer is a clear error rather than a misaligned-address fault.
  if (!aligned16(p->x) || !aligned16(p->w) || !aligned16(p->out))
    return result(PG_CUTLASS_MISALIGNED);
  auto stream = static_cast<cudaStream_t>(p->stream);
  typename G::Arguments args(
      cutlass::gemm::GemmCoord(p->m, p->n, p->k),
      {reinterpret_cast<T const *>(p->x), p->k}, {reinterpret_cast<T const *>(p->w), p->k},
      {reinterpret_cast<T *>(p->out), p->n},  // C: not read (beta = 0)
      {reinterpret_cast<T *>(p->out), p->n}, {1.0f, 0.0f});
  cutlass::Status s = G::can_implement(args);
  if (s != cutlass::Status::kSuccess) return from_cutlass(s);
  // No split-K: the kernel needs no workspace (G::get_workspace_size is 0), so nothing is
  // allocated and the launch can be captured in a CUDA graph.
  G op;
  s = op.initialize(args, nullptr, stream);
  if (s != cutlass::Status::kSuccess) return from_cutlass(s);
  s = op.run(stream);
  if (s != cutlass::Status::kSuccess) return from_cutlass(s);
  cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess) return result(PG_CUTLASS_CUDA_ERROR, 0, e);
  return result(PG_CUTLASS_OK);
}

}  // namespace

extern "C" PgCutlassResult pg_cutlass_gemm(const PgCutlassGemmParams *p) {
  if (p->m <= 0 || p->n <= 0 || p->k <= 0) return result(PG_CUTLASS_BAD_SHAPE);
  switch (p->dtype) {
    case PG_CUTLASS_BF16:
      return run<cutlass::bfloat16_t>(p);
    case PG_CUTLASS_F16:
      return run<cutlass::half_t>(p);
    default:
      return result(PG_CUTLASS_BAD_DTYPE);
  }
}

extern "C" PgCutlassResult pg_cutlass_device_count(int32_t *count) {
  int n = 0;
  cudaError_t e = cudaGetDeviceCount(&n);
  *count = e == cudaSuccess ? n : 0;
  if (e != cudaSuccess) return result(PG_CUTLASS_CUDA_ERROR, 0, e);
  return result(PG_CUTLASS_OK);
}

extern "C" const char *pg_cutlass_cuda_error_name(int32_t error) {
  return cudaGetErrorName(static_cast<cudaError_t>(error));
}

extern "C" const char *pg_cutlass_cuda_error_string(int32_t error) {
  return cudaGetErrorString(static_cast<cudaError_t>(error));
}

extern "C" const char *pg_cutlass_status_string(int32_t status) {
  return cutlass::cutlassGetStatusString(static_cast<cutlass::Status>(status));
}
