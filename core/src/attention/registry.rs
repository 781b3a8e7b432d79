//! The backend registry: one [`BackendRegistration`] per backend, collected by
//! `inventory` from every linked crate.

use super::{AttentionBackend, AttentionConfig, Capabilities, InvalidReason, Role};
use crate::CoreError;

/// A backend's entry in the registry. Declare one per backend crate with
/// [`register_backend!`](crate::register_backend).
pub struct BackendRegistration {
    pub name: &'static str,
    /// Higher is preferred by automatic selection.
    pub priority: i32,
    pub description: &'static str,
    pub capabilities: fn() -> Capabilities,
    /// Checks that capabilities cannot express (e.g. "not compiled with CUDA").
    pub runtime_reasons: fn(&AttentionConfig) -> Vec<InvalidReason>,
    pub create: fn(&AttentionConfig) -> Result<Box<dyn AttentionBackend>, CoreError>,
}

impl BackendRegistration {
    /// Every reason this backend cannot serve `cfg` in `role`; empty = valid.
    pub fn reasons(&self, cfg: &AttentionConfig, role: Role) -> Vec<InvalidReason> {
        let mut r = (self.runtime_reasons)(cfg);
        r.extend((self.capabilities)().reasons(cfg, role));
        r
    }
}

/// No runtime restrictions beyond the capabilities.
pub fn no_runtime_reasons(_: &AttentionConfig) -> Vec<InvalidReason> {
    Vec::new()
}

/// What [`register_backend!`](crate::register_backend) submits: the registration
/// and the module that declared it (so that a duplicate name can name both).
#[doc(hidden)]
pub struct Registered {
    pub registration: BackendRegistration,
    pub module: &'static str,
}

inventory::collect!(Registered);

/// Every linked backend, by descending priority then name; an error
/// ([`CoreError::DuplicateBackend`], naming both modules) if two share a name.
pub fn try_registered_backends() -> Result<Vec<&'static BackendRegistration>, CoreError> {
    let mut v: Vec<&'static Registered> = inventory::iter::<Registered>.into_iter().collect();
    v.sort_by(|a, b| {
        a.registration
            .name
            .cmp(b.registration.name)
            .then(a.module.cmp(b.module))
    });
    if let Some(w) = v
        .windows(2)
        .find(|w| w[0].registration.name == w[1].registration.name)
    {
        return Err(CoreError::DuplicateBackend {
            name: w[0].registration.name,
            first: w[0].module,
            second: w[1].module,
        });
    }
    let mut v: Vec<_> = v.into_iter().map(|r| &r.registration).collect();
    v.sort_by(|a, b| b.priority.cmp(&a.priority).then(a.name.cmp(b.name)));
    Ok(v)
}

/// Every linked registration with the module that declared it (for tests that
/// check which crates are linked).
#[doc(hidden)]
pub fn registered_modules() -> Vec<(&'static str, &'static BackendRegistration)> {
    inventory::iter::<Registered>
        .into_iter()
        .map(|r| (r.module, &r.registration))
        .collect()
}

/// Every linked backend, by descending priority then name.
///
/// # Panics
/// If two linked backends share a name (see [`try_registered_backends`]): the
/// selector checks this at start, so a build with a duplicate fails at once.
pub fn registered_backends() -> Vec<&'static BackendRegistration> {
    try_registered_backends().unwrap_or_else(|e| panic!("{e}"))
}

/// Registers a backend: `register_backend!(BackendRegistration { .. });`
#[macro_export]
macro_rules! register_backend {
    ($reg:expr) => {
        $crate::inventory::submit! {
            $crate::attention::Registered { registration: $reg, module: module_path!() }
        }
    };
}

pub use inventory;
