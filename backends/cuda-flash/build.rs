//! Builds `cu/flash.cu`: for the emulator always, to a fatbin in the CUDA build; and
//! for the emulator a second time with a planted fragment-layout bug (symbols
//! `*_planted`), for the test that proves the emulator catches such bugs.
fn main() {
    pagoda_cuda_build::backend(&["flash"]);
    pagoda_cuda_build::host_variant("flash", "PAGODA_PLANT_FRAGMENT_BUG");
}
