//! Whether the `cuda` runtime is compiled in ([`COMPILED`]) and the exact reasons it
//! gives for being unavailable ([`NOT_COMPILED`], [`NO_DRIVER`], [`NO_DEVICE`]).
//!
//! A leaf below the registration (`runtime.rs`) and the probe of libcuda and the devices
//! (`runtime/device.rs`, feature `cuda`), which both give these reasons, so that the
//! probe does not use its parent back.

/// Whether this build has the CUDA runtime compiled in.
pub const COMPILED: bool = cfg!(feature = "cuda");
/// Reason without the `cuda` feature.
pub const NOT_COMPILED: &str = "not compiled with CUDA";
/// Reason when libcuda cannot be loaded.
pub const NO_DRIVER: &str = "no CUDA driver found";
/// Reason when the driver sees no device.
pub const NO_DEVICE: &str = "no CUDA device";
