//! Pagoda's core vocabulary, shared by every other crate.
//!
//! It defines what a request is ([`request`]), what the scheduler hands the model
//! runner each step ([`sched`]), structured-output constraints as data ([`structured`]),
//! stop strings and their matcher ([`stop`]),
//! data with its device and dtype ([`tensor`]) and the owners of device memory
//! ([`device`]), the model kernels a device provides ([`ops`]), how the paged KV cache is laid out ([`kv`]), the FP8 E4M3 element
//! conversions ([`fp8`]; the element of `--kv-cache-dtype fp8`), and the
//! attention-backend protocol with its inventory registry ([`attention`]).
//!
//! Architecture invariant: core knows nothing of HTTP, tokenizers, model files,
//! CUDA or any concrete backend. It is plain data plus traits.

pub mod attention;
pub mod device;
pub mod error;
pub mod fp8;
pub mod kv;
pub mod ops;
pub mod request;
pub mod sched;
pub mod step;
pub mod stop;
pub mod structured;
pub mod tensor;

pub use attention::{
    merge_states, no_runtime_reasons, registered_backends, try_registered_backends,
    AttentionBackend, AttentionConfig, BackendRegistration, BatchDescriptor, Capabilities, F32Io,
    GraphLimits, GraphSupport, HostKvIo, InvalidReason, KvPools, LayerIo, Role,
    CPU_SPLIT_ARITHMETIC,
};
pub use device::{
    device_unavailable, open_device, DeviceRegistration, DeviceRuntime, HostRuntime, MemoryInfo,
};
pub use tensor::{
    DType, Device, DeviceKind, DeviceMemory, DevicePtr, HostElem, HostSlice, HostSliceMut, HostVec,
    Shape, Storage, TensorMut, TensorRef,
};
// Host element types of the f16/bf16 dtypes.
pub use fp8::F8E4M3;
pub use half::{bf16, f16};
// `register_backend!` expands to `$crate::inventory::submit!`, so inventory must be
// reachable from the crate root.
pub use attention::inventory;
pub use error::CoreError;
pub use kv::{write_kv, KvCache, KvCacheDtype, KvCacheSpec, LayerKv};
pub use ops::{
    has_model_ops, open_model_ops, GatedAct, GraphId, ModelOps, ModelOpsRegistration, RopeIo,
    RopeShape, StepInputs, MOE_MAX_TOP_K,
};
pub use request::{
    BlockHash, CheckedParams, FinishReason, Request, RequestId, RequestStatus, SamplingParams,
    StopReason, ALL_PROMPT_LOGPROBS,
};
pub use sched::{
    CachedRequestData, EngineCoreOutput, ModelRunnerOutput, NewRequestData, PromptLogprob,
    PromptLogprobsChunk, ReqHandle, SchedulerOutput, SpecDecodeRow, TokenLogprobs,
};
pub use step::StepBatch;
pub use stop::{StopAutomaton, StopStrings};
pub use structured::{Constraint, StructuredOutputs};
