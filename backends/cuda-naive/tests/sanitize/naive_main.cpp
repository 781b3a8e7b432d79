// Runs naive.cu once on small shapes under the sanitizers (tests/sanitizers.rs): a
// decode row and a prefill after cached tokens, with a sliding window and a soft cap,
// f32 and bf16. Correctness is emu_naive.rs's job; this only launches.
#include <cstdint>
#include <cstdio>
#include <vector>

#include "params.h"

extern "C" int pg_emu_naive(const PgAttnParams*, int);

int main() {
  const int H = 2, KVH = 1, D = 64, BS = 16, NB = 4, tokens = 19;
  // Two sequences: a decode row (ctx 20) then a prefill of 18 tokens after 6 cached;
  // sequence 0's blocks are 0, 1; sequence 1's are 2, 3.
  std::vector<int32_t> qsl = {0, 1, 19}, seq_lens = {21, 24}, table = {0, 1, 2, 3};
  std::vector<float> qf(tokens * H * D, 0.25f), outf(qf.size()), kf(NB * BS * KVH * D, 0.5f),
      vf(kf.size(), 0.5f), lse(tokens * H);
  std::vector<uint16_t> qb(qf.size(), 0x3f00), outb(qf.size()), kb(kf.size(), 0x3f80),
      vb(kf.size(), 0x3f80);
  PgAttnParams p{};
  p.q = qf.data(); p.key_cache = kf.data(); p.value_cache = vf.data(); p.out = outf.data();
  p.lse = lse.data(); p.query_start_loc = qsl.data(); p.seq_lens = seq_lens.data();
  p.block_table = table.data(); p.num_heads = H; p.num_kv_heads = KVH; p.head_dim = D;
  p.block_size = BS; p.max_blocks_per_seq = 2; p.scale = 0.125f; p.num_splits = 1;
  p.seq_begin = 0; p.seq_end = 2; p.num_rows = tokens; p.max_q_len = 18;
  // A window shorter than the context and a soft cap: their index arithmetic too.
  p.sliding_window = 13; p.soft_cap = 2.0f;
  int rc = pg_emu_naive(&p, PG_F32);
  p.q = qb.data(); p.key_cache = kb.data(); p.value_cache = vb.data(); p.out = outb.data();
  p.sliding_window = 0; p.soft_cap = 0.0f;
  rc |= pg_emu_naive(&p, PG_BF16);
  std::printf(rc == 0 ? "ok\n" : "launch error\n");
  return rc;
}
