//! The backend under test ([`Subject`]): its name, capabilities, constructor and
//! placement, with the cap a slow subject puts on its cases ([`CaseLimit`]), and what
//! the macros accept as one ([`IntoSubject`]).
//!
//! Below the case generator and the checks, which read a subject; it uses only the
//! kit's error type and placement.

use crate::error::KitError;
use crate::place::Placement;
use pagoda_core::{
    registered_backends, AttentionBackend, AttentionConfig, BackendRegistration, Capabilities,
    CoreError, InvalidReason, Role,
};

/// A cap on a subject's cases ([`Subject::small_cases`]): the work budget per case
/// (query-key-dim products over heads, at most
/// [`WORK_BUDGET`](crate::gen::WORK_BUDGET); rows are dropped, then the last row's
/// context and query halved, to fit) and the cases per check (at most each check's
/// own number).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CaseLimit {
    pub work: u64,
    pub cases: u32,
}

impl CaseLimit {
    /// What the emulated CUDA backends use: ~20k multiply-adds, 10 cases per check.
    pub const EMULATOR: CaseLimit = CaseLimit {
        work: 20_000,
        cases: 10,
    };
}

type Create = dyn Fn(&AttentionConfig) -> Result<Box<dyn AttentionBackend>, CoreError>;
type Reasons = dyn Fn(&AttentionConfig) -> Vec<InvalidReason>;

/// The backend under test: a name, its capabilities, a constructor, and where its
/// buffers live ([`Subject::on`]; by default the first of cpu, emu, cuda:0 that its
/// capabilities list, with f32 where supported, else its first dtype).
pub struct Subject {
    pub name: String,
    pub capabilities: Capabilities,
    /// Device and dtypes of every case, if chosen.
    pub placement: Option<Placement>,
    /// Smaller cases for a slow subject ([`Subject::small_cases`]).
    pub case_limit: Option<CaseLimit>,
    /// Every case draws the sliding window and soft cap the subject declares
    /// ([`Subject::features_always`]).
    pub features_always: bool,
    runtime_reasons: Box<Reasons>,
    create: Box<Create>,
}

impl Subject {
    /// A subject from a constructor returning a boxed backend.
    pub fn new(
        name: impl Into<String>,
        capabilities: Capabilities,
        create: impl Fn(&AttentionConfig) -> Result<Box<dyn AttentionBackend>, CoreError> + 'static,
    ) -> Self {
        Subject {
            name: name.into(),
            capabilities,
            placement: None,
            case_limit: None,
            features_always: false,
            runtime_reasons: Box::new(|_| Vec::new()),
            create: Box::new(create),
        }
    }

    /// A subject from a typed constructor such as `NaiveBackend::new`.
    pub fn from_ctor<B: AttentionBackend + 'static>(
        name: impl Into<String>,
        capabilities: Capabilities,
        ctor: impl Fn(&AttentionConfig) -> Result<B, CoreError> + 'static,
    ) -> Self {
        Self::new(name, capabilities, move |cfg| {
            Ok(Box::new(ctor(cfg)?) as Box<dyn AttentionBackend>)
        })
    }

    /// The subject a registry entry describes.
    pub fn from_registration(reg: &'static BackendRegistration) -> Self {
        Subject {
            name: reg.name.to_string(),
            capabilities: (reg.capabilities)(),
            placement: None,
            case_limit: None,
            features_always: false,
            runtime_reasons: Box::new(reg.runtime_reasons),
            create: Box::new(reg.create),
        }
    }

    /// Looks `name` up among the linked backends.
    pub fn registered(name: &str) -> Result<Self, KitError> {
        let all = registered_backends();
        match all.iter().find(|r| r.name == name) {
            Some(reg) => Ok(Self::from_registration(reg)),
            None => Err(KitError::NotRegistered {
                name: name.to_string(),
                crate_hint: format!("pagoda_backend_{}", name.replace('-', "_")),
                registered: all.iter().map(|r| r.name).collect::<Vec<_>>().join(", "),
            }),
        }
    }

    /// The same subject with its buffers on `device`, queries (and outputs) of
    /// `q_dtype`, the KV cache of `kv_dtype`: one test body per device and dtype.
    pub fn on(
        mut self,
        device: pagoda_core::Device,
        q_dtype: pagoda_core::DType,
        kv_dtype: pagoda_core::DType,
    ) -> Self {
        self.placement = Some(Placement {
            device,
            q_dtype,
            kv_dtype,
        });
        self
    }

    /// The same subject checked on smaller and fewer cases: for a backend that runs
    /// slowly here (the CUDA kernels through the SIMT emulator), so that its suite
    /// keeps every check and stays within a test's time.
    pub fn small_cases(mut self, limit: CaseLimit) -> Self {
        self.case_limit = Some(limit);
        self
    }

    /// The same subject with a sliding window and a soft cap in every case (those its
    /// capabilities declare; otherwise a quarter of the cases draw each): for a slow
    /// subject whose few cases must still exercise them.
    pub fn features_always(mut self) -> Self {
        self.features_always = true;
        self
    }

    /// Every reason the subject cannot serve `cfg` in `role`.
    pub fn reasons(&self, cfg: &AttentionConfig, role: Role) -> Vec<InvalidReason> {
        let mut r = (self.runtime_reasons)(cfg);
        r.extend(self.capabilities.reasons(cfg, role));
        r
    }

    /// A fresh backend for `cfg`.
    pub fn create(&self, cfg: &AttentionConfig) -> Result<Box<dyn AttentionBackend>, KitError> {
        (self.create)(cfg).map_err(|source| KitError::Backend {
            backend: self.name.clone(),
            stage: "create",
            source,
        })
    }

    /// The role a batch with these query lengths needs.
    pub fn role_of(query_lens: &[usize]) -> Role {
        match (query_lens.contains(&1), query_lens.iter().any(|&q| q > 1)) {
            (true, true) => Role::Both,
            (false, true) => Role::Prefill,
            _ => Role::Decode,
        }
    }
}

/// What the macro accepts as a subject: a registered name or a [`Subject`].
pub trait IntoSubject {
    fn into_subject(self) -> Result<Subject, KitError>;
}

impl IntoSubject for Subject {
    fn into_subject(self) -> Result<Subject, KitError> {
        Ok(self)
    }
}

impl IntoSubject for &str {
    fn into_subject(self) -> Result<Subject, KitError> {
        Subject::registered(self)
    }
}

impl IntoSubject for String {
    fn into_subject(self) -> Result<Subject, KitError> {
        Subject::registered(&self)
    }
}

impl IntoSubject for Result<Subject, KitError> {
    fn into_subject(self) -> Result<Subject, KitError> {
        self
    }
}

impl IntoSubject for &'static BackendRegistration {
    fn into_subject(self) -> Result<Subject, KitError> {
        Ok(Subject::from_registration(self))
    }
}
