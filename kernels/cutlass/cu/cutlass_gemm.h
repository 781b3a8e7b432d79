/* cutlass_gemm.h: the C interface of pagoda-cutlass's GEMM launcher (cutlass_gemm.cu).
 *
 * Plain C, no CUDA headers: build.rs runs bindgen on this file to generate the Rust FFI.
 * out[m, n] = x[m, k] . w[n, k]^T, all three row-major, f32 accumulation, tensor cores
 * (sm80 mma.sync; runs on sm90 too). Pointers are device addresses; the stream is a
 * CUstream / cudaStream_t (NULL = the legacy default stream). Nothing is allocated and
 * nothing waits on the host: the launch is enqueued on the stream.
 */
#ifndef PAGODA_CUTLASS_GEMM_H
#define PAGODA_CUTLASS_GEMM_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Element types of x, w and out (the discriminants of pagoda-cuda-kernels' Dtype). */
#define PG_CUTLASS_BF16 1
#define PG_CUTLASS_F16 2

/* Status codes (PgCutlassResult.status). */
#define PG_CUTLASS_OK 0
/* dtype is not PG_CUTLASS_BF16 or PG_CUTLASS_F16. */
#define PG_CUTLASS_BAD_DTYPE 1
/* m, n or k not positive. */
#define PG_CUTLASS_BAD_SHAPE 2
/* A pointer not 16-byte aligned, or k or n not a multiple of 8 (CUTLASS's 128-bit accesses). */
#define PG_CUTLASS_MISALIGNED 3
/* Any other refusal of CUTLASS's can_implement/initialize/run (cutlass::Status in detail). */
#define PG_CUTLASS_NOT_SUPPORTED 4
/* A CUDA runtime error (cudaError_t in cuda_error), e.g. no kernel image for this GPU. */
#define PG_CUTLASS_CUDA_ERROR 5

/* Elements every row of x, w and out must be a multiple of (16 bytes of 16-bit values). */
#define PG_CUTLASS_ALIGN_ELEMS 8

typedef struct PgCutlassGemmParams {
  uint64_t x;   /* device address of x[m, k] */
  uint64_t w;   /* device address of w[n, k] */
  uint64_t out; /* device address of out[m, n] */
  int32_t m;
  int32_t n;
  int32_t k;
  int32_t dtype;  /* PG_CUTLASS_BF16 or PG_CUTLASS_F16, for x, w and out */
  void *stream;   /* CUstream */
} PgCutlassGemmParams;

typedef struct PgCutlassResult {
  int32_t status;     /* PG_CUTLASS_* */
  int32_t detail;     /* cutlass::Status for PG_CUTLASS_NOT_SUPPORTED/MISALIGNED, else 0 */
  int32_t cuda_error; /* cudaError_t for PG_CUTLASS_CUDA_ERROR, else 0 */
} PgCutlassResult;

/* Enqueues the GEMM on p->stream; checks shape and alignment first. */
PgCutlassResult pg_cutlass_gemm(const PgCutlassGemmParams *p);

/* cudaGetDeviceCount through the static runtime: a driverless machine gets a CUDA error,
 * never a crash (the runtime opens libcuda at its first call). */
PgCutlassResult pg_cutlass_device_count(int32_t *count);

/* The CUDA runtime's name and description of a cudaError_t (static strings). */
const char *pg_cutlass_cuda_error_name(int32_t error);
const char *pg_cutlass_cuda_error_string(int32_t error);

/* cutlass::cutlassGetStatusString of a cutlass::Status (a static string). */
const char *pg_cutlass_status_string(int32_t status);

#ifdef __cplusplus
}
#endif

#endif /* PAGODA_CUTLASS_GEMM_H */
