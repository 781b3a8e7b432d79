//! Prints this machine's memory bandwidth and f32 GEMM rate:
//! `cargo run --release -p pagoda-benches --bin ceilings`.

fn main() {
    let threads = rayon::current_num_threads();
    let c = pagoda_benches::ceilings::measure();
    println!("threads:            {threads}");
    println!(
        "read bandwidth:     {:.1} GB/s (1 GiB parallel sum)",
        c.read_gbps
    );
    println!(
        "copy bandwidth:     {:.1} GB/s (512 MiB -> 512 MiB, read + write bytes)",
        c.copy_gbps
    );
    println!(
        "f32 GEMM:           {:.1} GFLOP/s (2048^3, gemm crate, {threads} threads)",
        c.gemm_gflops
    );
}
