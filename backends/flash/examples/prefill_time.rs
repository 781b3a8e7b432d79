//! Times one layer of `flash` prefill attention on the SmolLM2 shape (9/3 heads,
//! dim 64, block 16, f32 cache): best and median of N `run`s, on this thread's
//! rayon pool (`RAYON_NUM_THREADS=1` for one core). Where the prefill cost of
//! batch invariance shows; `perf record` it to see which part of a row's
//! arithmetic the time goes to.
//!
//! `cargo run --release -p pagoda-backend-flash --example prefill_time -- [tokens] [prefix] [reps]`

use pagoda_core::{
    AttentionBackend, AttentionConfig, BatchDescriptor, Device, HostVec, LayerIo, Shape, Storage,
    TensorMut, TensorRef,
};
use std::time::Instant;

fn fill(n: usize, salt: usize) -> Vec<f32> {
    (0..n)
        .map(|i| ((i + salt).wrapping_mul(2_654_435_761) % 1_000_003) as f32 / 1_000_003.0 - 0.5)
        .collect()
}

fn main() {
    let arg = |i: usize, d: usize| {
        std::env::args()
            .nth(i)
            .and_then(|s| s.parse().ok())
            .unwrap_or(d)
    };
    let (tokens, prefix, reps) = (arg(1, 1024), arg(2, 0), arg(3, 20));
    let (nh, nkv, hd, bs) = (9, 3, 64, 16);
    let cfg = AttentionConfig::cpu_f32(nh, nkv, hd, bs);
    let seq = tokens + prefix;
    let nb = seq.div_ceil(bs);
    // Blocks in a scrambled order, as a real pool hands them out.
    let table: Vec<u32> = (0..nb as u32).map(|j| (j * 7919) % nb as u32).collect();
    let batch = BatchDescriptor::new(bs, &[tokens], &[seq], &[table.as_slice()]).unwrap();
    let pool = nb * bs * nkv * hd;
    let k =
        Storage::from_host(Device::Cpu, HostVec::F32(fill(pool, 1)), Shape::flat(pool)).unwrap();
    let v =
        Storage::from_host(Device::Cpu, HostVec::F32(fill(pool, 2)), Shape::flat(pool)).unwrap();
    let q = fill(tokens * nh * hd, 3);
    let mut out = vec![0f32; tokens * nh * hd];
    let mut be = pagoda_backend_flash::FlashBackend::new(&cfg).unwrap();
    be.plan(&batch).unwrap();
    let mut times = Vec::new();
    for _ in 0..reps + 1 {
        let t = Instant::now();
        be.run(LayerIo {
            q: TensorRef::cpu(&q),
            k_cache: k.view(),
            v_cache: v.view(),
            out: TensorMut::cpu(&mut out),
            lse: None,
        })
        .unwrap();
        times.push(t.elapsed().as_secs_f64() * 1e3);
    }
    times.remove(0);
    times.sort_by(f64::total_cmp);
    let sum: f64 = out.iter().map(|&x| x as f64).sum();
    println!(
        "flash prefill tokens={tokens} prefix={prefix} threads={}: best {:.3} ms, median {:.3} ms (checksum {sum:.6})",
        rayon::current_num_threads(),
        times[0],
        times[times.len() / 2]
    );
}
