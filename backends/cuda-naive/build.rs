//! Builds `cu/naive.cu`: for the emulator always, to a fatbin in the CUDA build.
fn main() {
    pagoda_cuda_build::backend(&["naive"]);
}
