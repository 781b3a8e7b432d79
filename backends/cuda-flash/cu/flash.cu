// flash prefill: tiled online softmax over the paged cache on tensor cores
// (mma.sync m16n8k16, bf16/f16 in, f32 accumulate), FA2-style. Grid
// (ceil(max_q_len / kBM), num_heads, seqs); 4 warps, each owning 16 query rows of the
// 64-row tile. Per KV tile of kBN keys (gathered through the block table into shared
// memory): S = Q K^T into f32 fragments, causal mask with the context offset, row max
// over the quad of lanes sharing a row, P = exp2(S - m) repacked from the S fragments
// straight into the A operand of O += P V (the register reuse that needs the exact
// PTX fragment layout). Returns the LSE (natural log). Variable lengths through
// query_start_loc/seq_lens; GQA by head / (num_heads / num_kv_heads). With a sliding
// window w (params.h) the KV tiles start at the first key the tile's first row sees
// and each row masks the keys before its own window. Scores are soft-capped after the
// scale when asked.
//
// Built twice for the host: normally, and with PAGODA_PLANT_FRAGMENT_BUG (P's middle
// registers swapped, symbols suffixed `_planted`) to prove the emulator catches it.
#include "common.cuh"

#ifdef PAGODA_PLANT_FRAGMENT_BUG
#define PG_SYM(name) name##_planted
#else
#define PG_SYM(name) name
#endif

namespace {
constexpr unsigned kWarps = 4;
constexpr unsigned kThreads = kWarps * 32;
constexpr int kBM = 64;  // query rows per CTA (16 per warp)

// Shared memory (dynamic): the Q tile and two K/V stages of 64 keys (double buffering:
// tile i+1 is copied by cp.async while tile i is computed). 45 KiB at d64, 85 KiB at d128
// (above the 48 KiB default: the CUDA side raises the kernel's dynamic shared memory
// limit when it loads the module; two CTAs per SM fit on sm_80 and sm_90).
template <class T, int D>
struct Tile {
  static constexpr int BN = 64;               // keys per KV tile
  static constexpr int STRIDE = D + 8;        // +16 bytes per row against bank conflicts
  static constexpr int QE = kBM * STRIDE;     // elements of the Q tile
  static constexpr int KVE = BN * STRIDE;     // elements of one K (or V) tile
  static constexpr int STAGE = 2 * KVE;       // K then V
  static constexpr int S0 = QE, S1 = QE + STAGE;
  static constexpr int ELEMS = QE + 2 * STAGE;
  static constexpr unsigned BYTES = unsigned(ELEMS * sizeof(T));
};

template <class T, int D>
__device__ __forceinline__ void flash_body(const PgAttnParams& p) {
  using Cfg = Tile<T, D>;
  constexpr int BN = Cfg::BN, STRIDE = Cfg::STRIDE, KVE = Cfg::KVE;
  constexpr int KS = D / 16;   // k-steps of Q K^T
  constexpr int NT = BN / 8;   // n-tiles of S
  constexpr int PK = BN / 16;  // k-steps of P V
  constexpr int DN = D / 8;    // n-tiles of O
  constexpr int CH = D / 8;    // 16-byte chunks per row
  constexpr float kLog2e = 1.4426950408889634f, kLn2 = 0.6931471805599453f;

  const int tile = blockIdx.x, head = blockIdx.y, seq = p.seq_begin + int(blockIdx.z);
  const int q0 = p.query_start_loc[seq];
  const int q_len = p.query_start_loc[seq + 1] - q0;
  if (tile * kBM >= q_len) return;  // the whole CTA leaves together
  const int seq_len = p.seq_lens[seq];
  const int ctx = seq_len - q_len;
  const int kvh = head / (p.num_heads / p.num_kv_heads);
  const int64_t kv_row = int64_t(p.num_kv_heads) * D;
  const int32_t* blocks = p.block_table + int64_t(seq) * p.max_blocks_per_seq;
  const T* qg = static_cast<const T*>(p.q);
  const T* kc = static_cast<const T*>(p.key_cache) + int64_t(kvh) * D;
  const T* vc = static_cast<const T*>(p.value_cache) + int64_t(kvh) * D;

  PG_DYN_SHARED(T, smem);  // Cfg::BYTES, 16-byte aligned
  T* const q_s = smem;
  // Stage i's base (arithmetic, not an array: an indexed local array goes to the stack).
  auto stage = [&](int i) { return smem + ((i & 1) ? Cfg::S1 : Cfg::S0); };
  const unsigned tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
  const int g = lane / 4, t = lane % 4;
  const int r0 = int(warp) * 16 + g;  // this lane holds rows r0 and r0 + 8 of the tile

  for (int c = tid; c < kBM * CH; c += kThreads) {
    const int r = c / CH, cc = c % CH;
    const int qi = tile * kBM + r;
    const bool valid = qi < q_len;
    const T* src = valid ? qg + (int64_t(q0 + qi) * p.num_heads + head) * D + cc * 8 : qg;
    pg::cp_async16(&q_s[r * STRIDE + cc * 8], src, valid);
  }
  pg::cp_async_commit();
  pg::cp_async_wait<0>();
  __syncthreads();
  // Q as A fragments (reg 0 = (r0, 2t..), 1 = (r1, 2t..), 2 = (r0, 2t+8..), 3 = (r1, 2t+8..))
  // by ldmatrix.x4: matrices (rows 0-7 | 8-15) x (cols 0-7 | 8-15) of the warp's 16 rows.
  const int lrow = int(lane % 8) + 8 * int((lane / 8) % 2), lcol = 8 * int(lane / 16);
  uint32_t qa[KS][4];
#pragma unroll
  for (int ks = 0; ks < KS; ++ks)
    pg::ldmatrix_x4<false>(qa[ks], &q_s[(int(warp) * 16 + lrow) * STRIDE + ks * 16 + lcol]);

  const float scale2 = p.scale * kLog2e;  // scores in log2 units: exp2 is one instruction
  // Soft cap in log2 units: cap * tanh(s * scale / cap) * log2(e).
  const bool capped = p.soft_cap > 0.0f;
  const float cap2 = p.soft_cap * kLog2e, scale_cap = capped ? p.scale / p.soft_cap : 0.0f;
  const int qpos0 = ctx + tile * kBM + r0, qpos1 = qpos0 + 8;
  // Each row's first visible key (0 without a window).
  const int lo0 = pg::window_start(qpos0, p.sliding_window);
  const int lo1 = pg::window_start(qpos1, p.sliding_window);
  float m0 = pg::kNegInf, m1 = pg::kNegInf, l0 = 0.0f, l1 = 0.0f;
  float o[DN][4];
#pragma unroll
  for (int dn = 0; dn < DN; ++dn) o[dn][0] = o[dn][1] = o[dn][2] = o[dn][3] = 0.0f;

  // Keys from the first one the tile's first row sees (window) up to the tile's last
  // query position (causal), within the sequence.
  const int k_begin = pg::window_start(ctx + tile * kBM, p.sliding_window);
  const int k_end = pg::imin(seq_len, ctx + pg::imin(q_len, (tile + 1) * kBM));
  // K/V rows kt..kt+BN into a stage (rows past the sequence zero-filled), one commit group.
  auto load_kv = [&](int kt, T* st) {
    for (int c = tid; c < BN * CH; c += kThreads) {
      const int r = c / CH, cc = c % CH;
      const int key = kt + r;
      const bool valid = key < seq_len;
      const int64_t slot =
          valid ? int64_t(blocks[key / p.block_size]) * p.block_size + key % p.block_size : 0;
      pg::cp_async16(&st[r * STRIDE + cc * 8], kc + slot * kv_row + cc * 8, valid);
      pg::cp_async16(&st[KVE + r * STRIDE + cc * 8], vc + slot * kv_row + cc * 8, valid);
    }
    pg::cp_async_commit();
  };
  const int n_tiles = (k_end - k_begin + BN - 1) / BN;  // >= 1: k_begin <= the first row
  load_kv(k_begin, stage(0));
  for (int it = 0; it < n_tiles; ++it) {
    const int kt = k_begin + it * BN;
    if (it + 1 < n_tiles) {
      // Every warp is done with the other stage (tile it - 1) before it is refilled.
      __syncthreads();
      load_kv(kt + BN, stage(it + 1));
      pg::cp_async_wait<1>();  // this thread's copies of tile it have landed
    } else {
      pg::cp_async_wait<0>();
    }
    __syncthreads();  // ... and everyone's
    const T* k_s = stage(it);
    const T* v_s = k_s + KVE;

    // S = Q K^T. B (k = dim, n = key): b0 = K[n=g][2t..], b1 = K[g][2t+8..]. One
    // ldmatrix.x4 loads the B fragments of two k-steps: matrices = dims +0, +8, +16, +24
    // of keys nt*8..nt*8+7 (lane l: key l % 8, dims 8 (l / 8)).
    float s[NT][4];
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) {
      s[nt][0] = s[nt][1] = s[nt][2] = s[nt][3] = 0.0f;
#pragma unroll
      for (int ks = 0; ks < KS; ks += 2) {
        uint32_t kb[4];
        pg::ldmatrix_x4<false>(kb, &k_s[(nt * 8 + int(lane % 8)) * STRIDE + ks * 16 + 8 * int(lane / 8)]);
        const uint32_t b0[2] = {kb[0], kb[1]}, b1[2] = {kb[2], kb[3]};
        pg::mma_m16n8k16<T>(s[nt], qa[ks], b0, s[nt]);
        pg::mma_m16n8k16<T>(s[nt], qa[ks + 1], b1, s[nt]);
      }
    }
    // Scale, mask; element i of s[nt] is row (i < 2 ? r0 : r1), key kt + nt*8 + 2t + i%2.
    float mx0 = pg::kNegInf, mx1 = pg::kNegInf;
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) {
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const int key = kt + nt * 8 + 2 * t + (i & 1);
        const int qpos = i < 2 ? qpos0 : qpos1, lo = i < 2 ? lo0 : lo1;
        const float x = capped ? cap2 * tanhf(s[nt][i] * scale_cap) : s[nt][i] * scale2;
        const float v = (key > qpos || key < lo || key >= seq_len) ? pg::kNegInf : x;
        s[nt][i] = v;
        if (i < 2) mx0 = fmaxf(mx0, v); else mx1 = fmaxf(mx1, v);
      }
    }
    // The four lanes of a quad (same g) hold one row between them.
    mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 1));
    mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 2));
    mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 1));
    mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 2));
    // A real row sees a key of the first KV tile (key 0, or under a window its own
    // window start: the tiles begin at the first row's, at most 63 keys before), so
    // its m is finite from then on; a padding row past q_len may see none under a
    // window (mn = -inf): subtract 0 then, so that a and p are exp2(-inf) = 0, not NaN.
    const float mn0 = fmaxf(m0, mx0), mn1 = fmaxf(m1, mx1);
    const float ms0 = mn0 == pg::kNegInf ? 0.0f : mn0, ms1 = mn1 == pg::kNegInf ? 0.0f : mn1;
    const float a0 = exp2f(m0 - ms0), a1 = exp2f(m1 - ms1);
    m0 = mn0;
    m1 = mn1;
    float ls0 = 0.0f, ls1 = 0.0f;
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) {
      s[nt][0] = exp2f(s[nt][0] - ms0);
      s[nt][1] = exp2f(s[nt][1] - ms0);
      s[nt][2] = exp2f(s[nt][2] - ms1);
      s[nt][3] = exp2f(s[nt][3] - ms1);
      ls0 += s[nt][0] + s[nt][1];
      ls1 += s[nt][2] + s[nt][3];
    }
    l0 = l0 * a0 + ls0;  // per-lane partial sums; the quad is summed once at the end
    l1 = l1 * a1 + ls1;
#pragma unroll
    for (int dn = 0; dn < DN; ++dn) {
      o[dn][0] *= a0;
      o[dn][1] *= a0;
      o[dn][2] *= a1;
      o[dn][3] *= a1;
    }
    // P as A fragments of k-step kk (keys kk*16..): S tiles 2kk (keys +0..7) and 2kk+1 (+8..15).
    uint32_t pa[PK][4];
#pragma unroll
    for (int kk = 0; kk < PK; ++kk) {
      pa[kk][0] = pg::pack2f<T>(s[2 * kk][0], s[2 * kk][1]);          // (r0, 2t..)
      pa[kk][1] = pg::pack2f<T>(s[2 * kk][2], s[2 * kk][3]);          // (r1, 2t..)
      pa[kk][2] = pg::pack2f<T>(s[2 * kk + 1][0], s[2 * kk + 1][1]);  // (r0, 2t+8..)
      pa[kk][3] = pg::pack2f<T>(s[2 * kk + 1][2], s[2 * kk + 1][3]);  // (r1, 2t+8..)
#ifdef PAGODA_PLANT_FRAGMENT_BUG
      const uint32_t tmp = pa[kk][1];  // the classic a2a3 <-> a4a5 confusion
      pa[kk][1] = pa[kk][2];
      pa[kk][2] = tmp;
#endif
    }
    // O += P V. B (k = key, n = dim): b0 = V[2t..2t+1][g], b1 = V[2t+8..2t+9][g]: V is
    // stored [key][dim], so ldmatrix.x4.trans; matrices = (keys +0 | +8) x (dims dn | dn+1)
    // (lane l: key kk*16 + l % 8 + 8 ((l / 8) % 2), dims 8 (dn + l / 16)).
#pragma unroll
    for (int dn = 0; dn < DN; dn += 2) {
#pragma unroll
      for (int kk = 0; kk < PK; ++kk) {
        uint32_t vb[4];
        pg::ldmatrix_x4<true>(vb, &v_s[(kk * 16 + lrow) * STRIDE + dn * 8 + lcol]);
        const uint32_t b0[2] = {vb[0], vb[1]}, b1[2] = {vb[2], vb[3]};
        pg::mma_m16n8k16<T>(o[dn], pa[kk], b0, o[dn]);
        pg::mma_m16n8k16<T>(o[dn + 1], pa[kk], b1, o[dn + 1]);
      }
    }
  }
  l0 += __shfl_xor_sync(0xffffffffu, l0, 1);
  l0 += __shfl_xor_sync(0xffffffffu, l0, 2);
  l1 += __shfl_xor_sync(0xffffffffu, l1, 1);
  l1 += __shfl_xor_sync(0xffffffffu, l1, 2);
  const float inv0 = 1.0f / l0, inv1 = 1.0f / l1;
  T* out = static_cast<T*>(p.out);
  const int qi0 = tile * kBM + r0, qi1 = qi0 + 8;
#pragma unroll
  for (int dn = 0; dn < DN; ++dn) {
    const int d = dn * 8 + 2 * t;
    if (qi0 < q_len) {
      T* dst = out + (int64_t(q0 + qi0) * p.num_heads + head) * D + d;
      dst[0] = pg::Dt<T>::from(o[dn][0] * inv0);
      dst[1] = pg::Dt<T>::from(o[dn][1] * inv0);
    }
    if (qi1 < q_len) {
      T* dst = out + (int64_t(q0 + qi1) * p.num_heads + head) * D + d;
      dst[0] = pg::Dt<T>::from(o[dn][2] * inv1);
      dst[1] = pg::Dt<T>::from(o[dn][3] * inv1);
    }
  }
  if (p.lse != nullptr && t == 0) {
    if (qi0 < q_len) p.lse[int64_t(q0 + qi0) * p.num_heads + head] = (m0 + __log2f(l0)) * kLn2;
    if (qi1 < q_len) p.lse[int64_t(q0 + qi1) * p.num_heads + head] = (m1 + __log2f(l1)) * kLn2;
  }
}
}  // namespace

#define PG_FLASH(T, NAME, D)                                                            \
  extern "C" __global__ void __launch_bounds__(kThreads, 2)                             \
      PG_SYM(pg_flash_##NAME##_d##D)(PgAttnParams p) {                                  \
    flash_body<T, D>(p);                                                                \
  }
PG_FLASH(pg::bf16, bf16, 64)
PG_FLASH(pg::bf16, bf16, 128)
PG_FLASH(pg::f16, f16, 64)
PG_FLASH(pg::f16, f16, 128)

#if PG_HOST_ONLY
extern "C" PgLaunch PG_SYM(pg_flash_launch)(const PgAttnParams* p) {
  // bf16 and f16 tiles have the same size.
  const unsigned smem = p->head_dim == 64 ? Tile<pg::bf16, 64>::BYTES
                        : p->head_dim == 128 ? Tile<pg::bf16, 128>::BYTES
                                             : 0;
  return PgLaunch{{uint32_t((p->max_q_len + kBM - 1) / kBM), uint32_t(p->num_heads),
                   uint32_t(p->seq_end - p->seq_begin)},
                  {kThreads, 1, 1},
                  smem};
}

extern "C" int PG_SYM(pg_emu_flash)(const PgAttnParams* p, int dtype) {
  void (*f)(PgAttnParams) = nullptr;
  switch (dtype * 1000 + p->head_dim) {
    case PG_BF16 * 1000 + 64: f = PG_SYM(pg_flash_bf16_d64); break;
    case PG_BF16 * 1000 + 128: f = PG_SYM(pg_flash_bf16_d128); break;
    case PG_F16 * 1000 + 64: f = PG_SYM(pg_flash_f16_d64); break;
    case PG_F16 * 1000 + 128: f = PG_SYM(pg_flash_f16_d128); break;
    default: return 1;
  }
  const PgLaunch l = PG_SYM(pg_flash_launch)(p);
  pagoda_emu::launch(dim3(l.grid[0], l.grid[1], l.grid[2]), dim3(l.block[0], l.block[1], l.block[2]),
                     l.shared_bytes, f, *p);
  return 0;
}
#endif
