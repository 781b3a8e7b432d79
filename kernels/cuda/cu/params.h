/* params.h: the launch parameters of every kernel family, plain C so that Rust mirrors
 * them with #[repr(C)] (kernels/cuda/src/params.rs; a test compares the sizes). Kernels
 * take them by value; pointers are device pointers under CUDA, host pointers on the
 * emulator. Layouts (all row-major, contiguous):
 *   q, out        [num_tokens, num_heads, head_dim]        (dtype)
 *   k/v cache     [num_blocks, block_size, num_kv_heads, head_dim] (dtype)
 *   lse           [num_tokens, num_heads] f32, natural log of the scaled scores' sum-exp
 *   query_start_loc [num_seqs + 1] i32, seq_lens [num_seqs] i32,
 *   block_table   [num_seqs, max_blocks_per_seq] i32, slot_mapping [num_tokens] i64.
 * Batch order is vLLM's: decode rows (q_len 1) first. */
#pragma once
#include <stdint.h>

/* Element types of q/out/K/V. Values are the ABI: Rust's `Dtype` repeats them. */
enum { PG_F32 = 0, PG_BF16 = 1, PG_F16 = 2 };

/* reshape_and_cache: rows [num_tokens, num_kv_heads, head_dim] of src_dtype into the
 * pools (the dtype named at launch) at slot_mapping[token] (block = slot / block_size,
 * offset = slot % block_size); -1 skips. */
typedef struct PgWriteKvParams {
  const void* key;
  const void* value;
  void* key_cache;
  void* value_cache;
  const int64_t* slot_mapping;
  int32_t num_tokens;
  int32_t num_kv_heads;
  int32_t head_dim;
  int32_t block_size;
  int32_t src_dtype; /* PG_F32, PG_BF16 or PG_F16 */
  int32_t pad;
} PgWriteKvParams;

/* One struct for naive, paged and flash attention; each kernel reads what it needs.
 * A launch covers sequences [seq_begin, seq_end); token rows come from query_start_loc.
 * A query at row i of a sequence of q_len new tokens and seq_len total sits at position
 * pos = seq_len - q_len + i and sees keys 0..=pos (causal with the context offset), or
 * with a sliding window w only the last w of them, pos - w + 1..=pos. Scores are
 * scale * q.k, then soft_cap * tanh(score / soft_cap) when soft-capped. Zero-filled
 * (`PgAttnParams p{}`) means no window and no cap. */
typedef struct PgAttnParams {
  const void* q;
  const void* key_cache;
  const void* value_cache;
  void* out;
  float* lse; /* may be null */
  const int32_t* query_start_loc;
  const int32_t* seq_lens;
  const int32_t* block_table;
  /* paged split-KV partials: out [seqs, num_heads, num_splits, head_dim] f32 and
   * lse [seqs, num_heads, num_splits] f32, indexed by seq - seq_begin. */
  float* split_out;
  float* split_lse;
  int32_t seq_begin;
  int32_t seq_end;
  int32_t num_heads;
  int32_t num_kv_heads;
  int32_t head_dim;
  int32_t block_size;
  int32_t max_blocks_per_seq;
  int32_t max_q_len;       /* flash: the longest query among the launched sequences */
  int32_t num_splits;      /* paged: key partitions per sequence (1 = no merge pass) */
  int32_t partition_size;  /* paged: keys per partition, a multiple of block_size; the
                              partitions start at the row's first key in the window */
  float scale;
  int32_t num_rows;        /* naive: token rows of the launched sequences (its grid) */
  int32_t sliding_window;  /* > 0: keys pos - sliding_window + 1..=pos only; 0: all */
  float soft_cap;          /* > 0: scores capped to soft_cap * tanh(s / soft_cap); 0: none */
} PgAttnParams;

/* Grid, block and dynamic shared memory of a launch (computed on the host, from the
 * same code the emulator uses, so the CUDA path launches exactly what the tests ran).
 * The pg_*_launch functions read only the scalar fields: they are safe to call with
 * device pointers in the struct. */
typedef struct PgLaunch {
  uint32_t grid[3];
  uint32_t block[3];
  uint32_t shared_bytes;
} PgLaunch;

/* ---- model.cu: the forward's row and elementwise kernels ------------------------------
 * Integers are i32, norm weights and RoPE tables f32, the residual stream f32; the other
 * tensors take the dtypes named at launch (PG_F32/PG_BF16/PG_F16). All row-major. */

/* embed: out[t, :] = scale * table[ids[t], :]; table [vocab, hidden], out [num_tokens, hidden]. */
typedef struct PgEmbedParams {
  const int32_t* ids;
  const void* table;
  void* out;
  int32_t num_tokens;
  int32_t hidden;
  float scale;
  int32_t pad;
} PgEmbedParams;

/* rms_norm / add_rms_norm over rows of `dim`: x [rows, dim]; residual [rows, dim] f32
 * (add_rms_norm only: residual += x, then the norm of residual; null for rms_norm);
 * out[r] = v * (1 / sqrt(mean(v^2) + eps)) * (weight + w_offset), weight [dim] f32. */
typedef struct PgNormParams {
  const void* x;
  float* residual;
  const float* weight;
  void* out;
  int32_t rows;
  int32_t dim;
  float eps;
  float w_offset;
} PgNormParams;

/* rope_write_kv: qkv [num_tokens, (num_heads + 2 num_kv_heads) head_dim] (rows are
 * [q heads | k heads | v heads]) plus bias [(num_heads + 2 num_kv_heads) head_dim] f32
 * (null: none); q and k rotated by the rotate-half (GPT-NeoX) RoPE at positions[t]
 * with cos/sin [max_pos, head_dim / 2] f32; q into q_out [num_tokens, num_heads,
 * head_dim], k and v into the pools [num_blocks, block_size, num_kv_heads, head_dim] at
 * slot_mapping[t] (slot = block * block_size + offset; < 0: padding, K/V not written). */
typedef struct PgRopeKvParams {
  const void* qkv;
  const float* bias;
  const int32_t* positions;
  const float* cos;
  const float* sin;
  const int32_t* slot_mapping;
  void* q_out;
  void* k_pool;
  void* v_pool;
  int32_t num_tokens;
  int32_t num_heads;
  int32_t num_kv_heads;
  int32_t head_dim;
} PgRopeKvParams;

/* silu_mul / gelu_tanh_mul: gate_up [rows, 2 inter] (rows are [gate | up]) -> out
 * [rows, inter] = act(gate) * up. */
typedef struct PgGluParams {
  const void* gate_up;
  void* out;
  int32_t rows;
  int32_t inter;
} PgGluParams;

/* gather_rows: out[i, :] = x[rows[i], :]; x [*, dim], out [num_rows, dim]. */
typedef struct PgGatherParams {
  const void* x;
  const int32_t* rows;
  void* out;
  int32_t num_rows;
  int32_t dim;
} PgGatherParams;

/* argmax per row of logits [rows, vocab]: ids[r] = the first index of the largest
 * non-NaN value, values[r] = that value; a row with no non-NaN value (or vocab 0) gives
 * index 0 and -inf. */
typedef struct PgArgmaxParams {
  const void* logits;
  int32_t* ids;
  float* values;
  int32_t rows;
  int32_t vocab;
} PgArgmaxParams;

/* cast: dst[i] = src[i] converted (round to nearest even), n elements. */
typedef struct PgCastParams {
  const void* src;
  void* dst;
  int64_t n;
} PgCastParams;

/* ---- model.cu: the family extras (Qwen3, Gemma 2, Mixtral) ---------------------------- */

/* qk_norm: per-head RMSNorm in place on the q and k heads of qkv [num_tokens,
 * (num_heads + 2 num_kv_heads) head_dim] (rows [q heads | k heads | v heads]): each q
 * head by q_weight [head_dim], each k head by k_weight [head_dim] (f32), the formula of
 * rms_norm; v untouched. Qwen3's Q/K norms, before RoPE. */
typedef struct PgQkNormParams {
  void* qkv;
  const float* q_weight;
  const float* k_weight;
  int32_t num_tokens;
  int32_t num_heads;
  int32_t num_kv_heads;
  int32_t head_dim;
  float eps;
  int32_t pad;
} PgQkNormParams;

/* soft_cap: x[i] = cap * tanh(x[i] / cap) in place, n f32 elements (Gemma 2's final
 * logits). */
typedef struct PgSoftCapParams {
  float* x;
  int64_t n;
  float cap;
  int32_t pad;
} PgSoftCapParams;

/* moe_route: per token t, the router logits [num_tokens, num_experts] f32 through a
 * softmax; the top_k experts (largest logit first, the smaller index on ties) keep their
 * probabilities, renormalised to sum to 1, in weights [num_tokens, num_experts] f32; the
 * other experts get exactly 0. top_k <= 32. */
typedef struct PgMoeRouteParams {
  const float* logits;
  float* weights;
  int32_t num_tokens;
  int32_t num_experts;
  int32_t top_k;
  int32_t pad;
} PgMoeRouteParams;

/* moe_accumulate: one expert's output y [num_tokens, hidden] (dtype T) into the f32
 * accumulator acc [num_tokens, hidden]: acc[t] = (first ? 0 : acc[t]) + w * y[t] with
 * w = weights[t * num_experts + expert], skipped where w is 0 (the expert was not picked
 * for t); with out non-null (the last expert), out [num_tokens, hidden] (dtype T) gets
 * acc as well. */
typedef struct PgMoeAccParams {
  const void* y;
  const float* weights;
  float* acc;
  void* out;
  int32_t num_tokens;
  int32_t hidden;
  int32_t num_experts;
  int32_t expert;
  int32_t first;
  int32_t pad;
} PgMoeAccParams;
