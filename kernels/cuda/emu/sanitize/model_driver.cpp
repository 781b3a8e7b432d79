// Runs model.cu's kernels once each on small shapes for the sanitizers (called by
// kernels_main.cpp): vector and scalar row paths, add_rms_norm's cross-thread residual
// reads, RoPE with bias, GQA and a padded slot, argmax's block reduction, a multi-block
// cast. Buffers are exact-size heap vectors, so ASan sees any read or write past a row.
#include <cstdint>
#include <vector>

#include "../../cu/params.h"

extern "C" int pg_emu_embed(const PgEmbedParams*, int, int);
extern "C" int pg_emu_rms_norm(const PgNormParams*, int, int);
extern "C" int pg_emu_add_rms_norm(const PgNormParams*, int, int);
extern "C" int pg_emu_rope_kv(const PgRopeKvParams*, int, int);
extern "C" int pg_emu_silu_mul(const PgGluParams*, int);
extern "C" int pg_emu_gelu_tanh_mul(const PgGluParams*, int);
extern "C" int pg_emu_gather_rows(const PgGatherParams*, int);
extern "C" int pg_emu_argmax(const PgArgmaxParams*, int);
extern "C" int pg_emu_cast(const PgCastParams*, int, int);

int run_model_kernels() {
  int rc = 0;
  const uint16_t bf16_half = 0x3f00;  // 0.5
  // Norms: f32 rows of 64 (16-byte vectors), bf16 rows of 36 (scalar: not whole vectors).
  for (int dim : {64, 36}) {
    const int rows = 3;
    std::vector<float> xf(rows * dim, 0.5f), res(rows * dim, 1.0f), w(dim, 1.0f), outf(rows * dim);
    std::vector<uint16_t> xb(rows * dim, bf16_half), outb(rows * dim);
    PgNormParams p{xf.data(), nullptr, w.data(), outf.data(), rows, dim, 1e-5f, 0.0f};
    rc |= pg_emu_rms_norm(&p, PG_F32, PG_F32);
    p.x = xb.data(); p.out = outb.data();
    rc |= pg_emu_rms_norm(&p, PG_BF16, PG_BF16);
    p.residual = res.data();
    rc |= pg_emu_add_rms_norm(&p, PG_BF16, PG_BF16);
    p.x = xf.data(); p.out = outf.data();
    rc |= pg_emu_add_rms_norm(&p, PG_F32, PG_F32);
  }
  {  // embed: bf16 table [5, 40] -> f32 rows.
    std::vector<uint16_t> table(5 * 40, bf16_half);
    std::vector<int32_t> ids = {4, 0, 2};
    std::vector<float> out(3 * 40);
    PgEmbedParams p{ids.data(), table.data(), out.data(), 3, 40, 1.0f, 0};
    rc |= pg_emu_embed(&p, PG_BF16, PG_F32);
  }
  {  // rope: 4 q heads, 2 kv heads, d 16, bias, slot -1 on row 1; 2 blocks of 2.
    const int T = 3, H = 4, KVH = 2, D = 16, width = (H + 2 * KVH) * D, max_pos = 4;
    std::vector<uint16_t> qkv(T * width, bf16_half), q(T * H * D);
    std::vector<float> bias(width, 0.25f), cs(max_pos * D / 2, 0.5f), sn(cs.size(), 0.5f);
    std::vector<float> kp(2 * 2 * KVH * D), vp(kp.size());
    std::vector<int32_t> pos = {0, 3, 1}, slots = {3, -1, 0};
    PgRopeKvParams p{qkv.data(), bias.data(), pos.data(), cs.data(), sn.data(), slots.data(),
                     q.data(), kp.data(), vp.data(), T, H, KVH, D};
    rc |= pg_emu_rope_kv(&p, PG_BF16, PG_F32);
  }
  {  // silu / gelu over rows [gate | up] of 2 x 40.
    std::vector<uint16_t> gu(2 * 80, bf16_half), out(2 * 40);
    PgGluParams p{gu.data(), out.data(), 2, 40};
    rc |= pg_emu_silu_mul(&p, PG_BF16);
    rc |= pg_emu_gelu_tanh_mul(&p, PG_BF16);
  }
  {  // gather: f32 rows of 24 (vectors) and bf16 rows of 20 (scalar).
    std::vector<float> x(4 * 24, 1.0f), out(2 * 24);
    std::vector<uint16_t> xb(4 * 20, bf16_half), outb(2 * 20);
    std::vector<int32_t> rows = {3, 0};
    PgGatherParams p{x.data(), rows.data(), out.data(), 2, 24};
    rc |= pg_emu_gather_rows(&p, PG_F32);
    PgGatherParams b{xb.data(), rows.data(), outb.data(), 2, 20};
    rc |= pg_emu_gather_rows(&b, PG_BF16);
  }
  {  // argmax: f32 vocab 256 (vectors), bf16 vocab 300 (scalar).
    std::vector<float> lf(2 * 256, 1.0f), vals(2);
    std::vector<uint16_t> lb(2 * 300, bf16_half);
    std::vector<int32_t> ids(2);
    PgArgmaxParams p{lf.data(), ids.data(), vals.data(), 2, 256};
    rc |= pg_emu_argmax(&p, PG_F32);
    p.logits = lb.data(); p.vocab = 300;
    rc |= pg_emu_argmax(&p, PG_BF16);
  }
  {  // cast: 1000 f32 -> bf16 (4 blocks of 256).
    std::vector<float> src(1000, 0.3f);
    std::vector<uint16_t> dst(1000);
    PgCastParams p{src.data(), dst.data(), 1000};
    rc |= pg_emu_cast(&p, PG_F32, PG_BF16);
  }
  return rc;
}
