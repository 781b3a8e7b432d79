//! Hooks into the emulator's self-test kernel and its f32 <-> bf16/f16 conversions, for
//! the tests of simt.h itself (tests/emu_simt.rs). Not part of the kernels' API.

extern "C" {
    fn pg_emu_selftest(out: *mut i32, fout: *mut f32);
    fn pg_emu_f32_to_bf16(x: f32) -> u16;
    fn pg_emu_f32_to_f16(x: f32) -> u16;
    fn pg_emu_bf16_to_f32(x: u16) -> f32;
    fn pg_emu_f16_to_f32(x: u16) -> f32;
}

/// Runs the self-test kernel (one 16x4 block); returns its 134 ints and 2 floats.
pub fn run() -> (Vec<i32>, [f32; 2]) {
    let mut out = vec![0i32; 134];
    let mut fout = [0.0f32, -1.0e30];
    // SAFETY: the kernel writes indices < 134 of `out` and two floats of `fout`.
    unsafe { pg_emu_selftest(out.as_mut_ptr(), fout.as_mut_ptr()) };
    (out, fout)
}

/// The emulator's f32 -> bf16 bits.
pub fn f32_to_bf16(x: f32) -> u16 {
    // SAFETY: a pure function of its argument.
    unsafe { pg_emu_f32_to_bf16(x) }
}
/// The emulator's f32 -> f16 bits.
pub fn f32_to_f16(x: f32) -> u16 {
    // SAFETY: a pure function of its argument.
    unsafe { pg_emu_f32_to_f16(x) }
}
/// The emulator's bf16 bits -> f32.
pub fn bf16_to_f32(x: u16) -> f32 {
    // SAFETY: a pure function of its argument.
    unsafe { pg_emu_bf16_to_f32(x) }
}
/// The emulator's f16 bits -> f32.
pub fn f16_to_f32(x: u16) -> f32 {
    // SAFETY: a pure function of its argument.
    unsafe { pg_emu_f16_to_f32(x) }
}
