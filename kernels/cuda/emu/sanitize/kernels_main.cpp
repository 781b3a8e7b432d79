// Runs the library's kernels (write_kv, paged with splits + merge_states, with a
// sliding window and a soft cap; model.cu's through model_driver.cpp) once on small
// shapes under the sanitizers: any race between emulated threads (a missing barrier in a
// kernel) or access outside a buffer is reported. Correctness is the Rust tests' job.
// The backend crates' kernels have drivers of their own (their tests/sanitize/).
#include <cstdint>
#include <cstdio>
#include <vector>

#include "../../cu/params.h"

extern "C" int pg_emu_write_kv(const PgWriteKvParams*, int);
extern "C" int pg_emu_paged(const PgAttnParams*, int);
extern "C" int pg_emu_merge_states(const PgAttnParams*, int);
int run_model_kernels();  // model_driver.cpp

int main() {
  const int H = 2, KVH = 1, D = 64, BS = 16, NB = 4;
  // Two sequences: a decode row (ctx 20) then 18 tokens after 6 cached (written only).
  std::vector<int32_t> qsl = {0, 1, 19}, seq_lens = {21, 24}, table = {0, 1, 2, 3};
  const int tokens = 19;
  std::vector<float> kf(tokens * KVH * D), vf(kf.size());
  for (size_t i = 0; i < kf.size(); ++i) kf[i] = float(i % 7) * 0.1f, vf[i] = float(i % 5) * 0.1f;
  std::vector<uint16_t> kc(NB * BS * KVH * D, 0x3f80), vc(kc.size(), 0x3f80);  // bf16 1.0
  std::vector<int64_t> slots(tokens);
  for (int t = 0; t < tokens; ++t) slots[t] = 40 + t;
  PgWriteKvParams w{kf.data(), vf.data(), kc.data(), vc.data(), slots.data(), tokens, KVH, D, BS, PG_F32, 0};
  int rc = pg_emu_write_kv(&w, PG_BF16);

  std::vector<uint16_t> q(tokens * H * D, 0x3f00), out(q.size());
  std::vector<float> lse(tokens * H), split_out(1 * H * 2 * D), split_lse(1 * H * 2);
  PgAttnParams p{};
  p.q = q.data(); p.key_cache = kc.data(); p.value_cache = vc.data(); p.out = out.data();
  p.lse = lse.data(); p.query_start_loc = qsl.data(); p.seq_lens = seq_lens.data();
  p.block_table = table.data(); p.split_out = split_out.data(); p.split_lse = split_lse.data();
  p.num_heads = H; p.num_kv_heads = KVH; p.head_dim = D; p.block_size = BS;
  p.max_blocks_per_seq = 2; p.scale = 0.125f;
  // A sliding window (unaligned partition starts, an empty paged partition)
  // and a soft cap, so that their index arithmetic runs under the sanitizers too.
  p.sliding_window = 13; p.soft_cap = 2.0f;
  // Sequence 0's blocks are 0, 1; sequence 1's are 2, 3.
  p.seq_begin = 0; p.seq_end = 1; p.num_splits = 2; p.partition_size = 16;
  rc |= pg_emu_paged(&p, PG_BF16);
  rc |= pg_emu_merge_states(&p, PG_BF16);
  rc |= run_model_kernels();
  std::printf(rc == 0 ? "ok\n" : "launch error\n");
  return rc;
}
