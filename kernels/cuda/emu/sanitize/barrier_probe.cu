// TSan probe: each thread writes its shared slot, then reads its neighbour's. Without
// the __syncthreads() (built with -DPLANT_MISSING_SYNC) the read races with the
// neighbour's write, and ThreadSanitizer must say so (tests/tsan.rs).
#include "../../cu/common.cuh"

__global__ void rotate(float* out) {
  __shared__ float buf[64];
  buf[threadIdx.x] = float(threadIdx.x) * 2.0f;
#ifndef PLANT_MISSING_SYNC
  __syncthreads();
#endif
  out[blockIdx.x * 64 + threadIdx.x] = buf[(threadIdx.x + 1) % 64];
}

int main() {
  std::vector<float> out(128);
  pagoda_emu::launch(dim3(2), dim3(64), 0, rotate, out.data());
  for (int i = 0; i < 128; ++i) {
    if (out[i] != float((i + 1) % 64) * 2.0f) {
      std::printf("wrong value at %d (the race showed)\n", i);
      return 0;  // the verdict is TSan's; a wrong value is only a symptom
    }
  }
  std::printf("ok\n");
  return 0;
}
