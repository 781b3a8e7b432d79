//! The attention-backend protocol.
//!
//! A backend author needs, in this order:
//! * [`AttentionBackend`] (in [`backend`]): the trait to implement, `plan` once per
//!   step, `run` once per layer, with the buffers of [`LayerIo`];
//! * [`Capabilities`] (in [`config`]): what the backend serves, usually
//!   [`Capabilities::cpu_f32`] plus changes; the selector turns every mismatch with an
//!   [`AttentionConfig`] into an [`InvalidReason`] (in [`reason`], a leaf the
//!   crate's error type names);
//! * [`BatchDescriptor`] (in [`batch`]): one step's batch, valid by construction;
//! * [`register_backend!`](crate::register_backend) and [`BackendRegistration`]
//!   (in [`registry`]): name, priority, capabilities, runtime check, constructor;
//! * [`merge_states`] (in [`merge`]): the log-sum-exp merge that split-KV and
//!   chunked computations share.
//!
//! Per engine step the model runner builds one [`BatchDescriptor`]; the backend
//! turns it into its own metadata once ([`AttentionBackend::plan`]), then runs once
//! per layer ([`AttentionBackend::run`]) with no planning or allocation inside.
//! Writing new K/V into the cache by slot mapping is a separate op
//! ([`AttentionBackend::write_kv`], default [`crate::write_kv`]).

pub mod backend;
pub mod batch;
pub mod config;
pub mod merge;
pub mod reason;
pub mod registry;

pub use backend::{
    AttentionBackend, F32Io, GraphLimits, GraphSupport, HostKvIo, KvPools, LayerIo,
    CPU_SPLIT_ARITHMETIC,
};
pub use batch::BatchDescriptor;
pub use config::{AttentionConfig, Capabilities};
pub use merge::merge_states;
pub use reason::{InvalidReason, Role};
pub use registry::{
    inventory, no_runtime_reasons, registered_backends, try_registered_backends,
    BackendRegistration,
};
#[doc(hidden)]
pub use registry::{registered_modules, Registered};
