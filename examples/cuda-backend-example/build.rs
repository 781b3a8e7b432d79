//! Builds `cu/warp_decode.cu`: for the emulator always, to a fatbin in the CUDA build.
fn main() {
    pagoda_cuda_build::backend(&["warp_decode"]);
}
