//! Every attention backend, linked.
//!
//! `inventory` only sees the registrations of crates that are linked, and a
//! dependency that no code names is not linked. This crate names every backend crate
//! (its `build.rs` turns each `pagoda-backend-*` line of its `[dependencies]` into a
//! `use ... as _;`), so binaries, tests and benches depend on this one crate and
//! write one line:
//!
//! ```
//! use pagoda_backends as _;
//! ```
//!
//! Adding a backend to every binary is one line in `backends/all/Cargo.toml`.

include!(concat!(env!("OUT_DIR"), "/link.rs"));

/// Call this instead of `use pagoda_backends as _;` where a call reads better; it
/// does nothing but name the crate (so that it, and every backend, is linked).
pub fn link() {}
