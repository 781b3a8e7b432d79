//! Once warm, a decode step of [`Llama::forward`] allocates nothing: a counting
//! global allocator (this test binary only) watches the forward call of a step
//! whose shapes were already seen (and after rayon's workers have started). Decode
//! sizes (m = 1, 3, 8) cover the packed GEMM's partial row blocks (1 and 3 rows of
//! its 6-row micro-kernel) and a full block plus a tail (8), for f32 and bf16
//! weights, with shapes large enough to take the rayon-parallel branches.
//! (Rayon's global injector allocates a small block every 63 jobs pushed from
//! outside the pool; `forward` pushes one per step, so this test stays far below.)

use pagoda_backend_naive::NaiveBackend;
use pagoda_core::{
    AttentionBackend, AttentionConfig, BatchDescriptor, KvCache, KvCacheSpec, StepBatch,
};
use pagoda_models::{
    ForwardScratch, LayerWeights, Llama, LlamaConfig, LlamaWeights, Mat, WeightDtype,
};
use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

struct Counting;
static ARMED: AtomicBool = AtomicBool::new(false);
static ALLOCS: AtomicUsize = AtomicUsize::new(0);

// SAFETY: forwards to the system allocator; only counts.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        // SAFETY: this `unsafe fn`'s `# Safety` contract, upheld by its callers.
        unsafe {
            if ARMED.load(Ordering::Relaxed) {
                ALLOCS.fetch_add(1, Ordering::Relaxed);
            }
            System.alloc(l)
        }
    }
    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        // SAFETY: this `unsafe fn`'s `# Safety` contract, upheld by its callers.
        unsafe { System.dealloc(p, l) }
    }
    unsafe fn realloc(&self, p: *mut u8, l: Layout, new: usize) -> *mut u8 {
        // SAFETY: this `unsafe fn`'s `# Safety` contract, upheld by its callers.
        unsafe {
            if ARMED.load(Ordering::Relaxed) {
                ALLOCS.fetch_add(1, Ordering::Relaxed);
            }
            System.realloc(p, l, new)
        }
    }
}

#[global_allocator]
static A: Counting = Counting;

fn weights(c: &LlamaConfig) -> LlamaWeights {
    let mut s = 1u32;
    let mut mat = |r: usize, k: usize| {
        Mat::new(
            r,
            k,
            (0..r * k)
                .map(|_| {
                    s = s.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
                    ((s >> 8) as f32 / (1u32 << 24) as f32 - 0.5) * 0.1
                })
                .collect(),
        )
    };
    let (h, q, kv, i) = (
        c.hidden_size,
        c.num_heads * c.head_dim,
        c.num_kv_heads * c.head_dim,
        c.intermediate_size,
    );
    let layers = (0..c.num_layers)
        .map(|_| LayerWeights {
            attn_norm: vec![1.0; h],
            wq: mat(q, h),
            wk: mat(kv, h),
            wv: mat(kv, h),
            wo: mat(h, q),
            ffn_norm: vec![1.0; h],
            w_gate: mat(i, h),
            w_up: mat(i, h),
            w_down: mat(h, i),
            extra: Default::default(),
        })
        .collect();
    LlamaWeights {
        embed: mat(c.vocab_size, h),
        layers,
        norm: vec![1.0; h],
        lm_head: None,
    }
}

/// One test for every dtype: the allocation counter is global to this binary, so
/// two tests running at once would count each other's allocations.
#[test]
fn warm_decode_steps_do_not_allocate() {
    check_no_alloc(WeightDtype::F32);
    check_no_alloc(WeightDtype::Bf16);
    // Quantized: the int8 activations live in a per-thread buffer reused across calls.
    check_no_alloc(WeightDtype::Q8_0);
}

fn check_no_alloc(dtype: WeightDtype) {
    let c = LlamaConfig {
        vocab_size: 1000,
        hidden_size: 256,
        intermediate_size: 512,
        num_layers: 2,
        num_heads: 4,
        num_kv_heads: 2,
        head_dim: 64,
        rms_norm_eps: 1e-5,
        rope_theta: 10000.0,
        rope_scaling: None,
        rope_freq_factors: None,
        max_position_embeddings: 256,
        tie_word_embeddings: true,
        arch: Default::default(),
    };
    let model = Llama::new_with_dtype(c.clone(), weights(&c), dtype).unwrap();
    let bs = 16;
    let spec = KvCacheSpec {
        num_layers: 2,
        num_blocks: 64,
        block_size: bs,
        num_kv_heads: 2,
        head_dim: 64,
        dtype: pagoda_core::DType::F32,
    };
    let mut kv = KvCache::new(spec);
    let mut backend = NaiveBackend::new(&AttentionConfig::cpu_f32(4, 2, 64, bs)).unwrap();
    let (mut scratch, mut logits) = (ForwardScratch::default(), Vec::new());
    // Round 0 warms up (scratch growth, rayon's lazily started workers and their
    // thread-locals); the warm rounds after it must not allocate at all. The count
    // covers every thread, and rayon's own job deques can still grow once when the
    // machine is loaded and jobs pile up (outside this code), so a warm shape gets
    // three tries: an allocation of ours would show in every one of them.
    for m in [1usize, 3, 8] {
        let mut warm = Vec::new();
        for round in 0..4 {
            let counts = two_steps(
                &model,
                &mut backend,
                &mut kv,
                &mut scratch,
                &mut logits,
                bs,
                m,
            );
            if round > 0 {
                warm.push(counts);
            }
            if round > 0 && counts == [0, 0] {
                break;
            }
        }
        assert!(
            warm.contains(&[0, 0]),
            "{dtype:?} m = {m}: allocations per warm step in each try: {warm:?}"
        );
    }
}

/// Two decode steps of `m` rows; the allocations counted during each forward.
fn two_steps(
    model: &Llama,
    backend: &mut NaiveBackend,
    kv: &mut KvCache,
    scratch: &mut ForwardScratch,
    logits: &mut Vec<f32>,
    bs: usize,
    m: usize,
) -> [usize; 2] {
    // m decode rows, request r at sequence length 5 + r + step, in its own blocks.
    let tables: Vec<Vec<u32>> = (0..m as u32).map(|r| vec![2 * r, 2 * r + 1]).collect();
    let mut counts = [0; 2];
    for (step, count) in counts.iter_mut().enumerate() {
        let seq: Vec<usize> = (0..m).map(|r| 5 + r + step).collect();
        let rows: Vec<&[u32]> = tables.iter().map(|t| t.as_slice()).collect();
        let batch = BatchDescriptor::new(bs, &vec![1; m], &seq, &rows).unwrap();
        let ids: Vec<u32> = (0..m as u32).map(|r| 7 * r + step as u32).collect();
        let pos: Vec<u32> = seq.iter().map(|&s| s as u32 - 1).collect();
        let out_rows: Vec<usize> = (0..m).collect();
        backend.plan(&batch).unwrap();
        ALLOCS.store(0, Ordering::SeqCst);
        ARMED.store(true, Ordering::SeqCst);
        let r = model.forward(
            &StepBatch {
                input_ids: &ids,
                positions: &pos,
                batch: &batch,
                logits_rows: &out_rows,
            },
            backend,
            kv,
            logits,
            scratch,
        );
        ARMED.store(false, Ordering::SeqCst);
        r.unwrap();
        assert!(logits.iter().all(|v| v.is_finite()));
        *count = ALLOCS.load(Ordering::SeqCst);
    }
    counts
}
