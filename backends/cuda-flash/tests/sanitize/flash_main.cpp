// Runs flash.cu once on small shapes under the sanitizers (tests/sanitizers.rs): head
// dims 64 and 128 over two KV tiles (both cp.async stages filled; ASan sees the dynamic
// shared memory's exact bounds), and a prefill after cached tokens with a sliding
// window and a soft cap. Correctness is emu_flash.rs's job; this only launches.
#include <cstdint>
#include <cstdio>
#include <vector>

#include "params.h"

extern "C" int pg_emu_flash(const PgAttnParams*, int);

// One sequence of 18 new tokens after `ctx` cached ones, head dim D, blocks in
// reverse order; `window` and `cap` as params.h (0: none).
static int run_flash(int D, int ctx, int window, float cap) {
  const int H = 2, KVH = 1, BS = 16, q_len = 18, seq_len = ctx + q_len;
  const int nb = (seq_len + BS - 1) / BS;
  std::vector<int32_t> qsl = {0, q_len}, lens = {seq_len}, table(nb);
  for (int i = 0; i < nb; ++i) table[i] = nb - 1 - i;
  std::vector<uint16_t> q(q_len * H * D, 0x3e80), out(q.size()), kc(nb * BS * KVH * D, 0x3f00),
      vc(kc.size(), 0x3f80);
  std::vector<float> lse(q_len * H);
  PgAttnParams p{};
  p.q = q.data(); p.key_cache = kc.data(); p.value_cache = vc.data(); p.out = out.data();
  p.lse = lse.data(); p.query_start_loc = qsl.data(); p.seq_lens = lens.data();
  p.block_table = table.data(); p.seq_begin = 0; p.seq_end = 1; p.num_heads = H;
  p.num_kv_heads = KVH; p.head_dim = D; p.block_size = BS; p.max_blocks_per_seq = nb;
  p.max_q_len = q_len; p.num_splits = 1; p.scale = 0.125f; p.num_rows = q_len;
  p.sliding_window = window; p.soft_cap = cap;
  return pg_emu_flash(&p, PG_BF16);
}

int main() {
  int rc = run_flash(64, 60, 0, 0.0f);    // 2 KV tiles of 64
  rc |= run_flash(128, 60, 0, 0.0f);      // 2 KV tiles, 85 KiB of dynamic shared memory
  rc |= run_flash(64, 6, 13, 2.0f);       // unaligned tile starts under a window, a cap
  std::printf(rc == 0 ? "ok\n" : "launch error\n");
  return rc;
}
