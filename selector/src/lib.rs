//! The attention-backend selector.
//!
//! Given an [`AttentionConfig`] (device, dtypes, model shape, block size) and an
//! optional override, it picks a backend for decode rows and one for prefill rows
//! from the inventory registry, by priority among the valid ones. One backend may
//! serve both; otherwise [`HybridBackend`] composes the two (decode rows first).
//!
//! Rules: a forced backend that is invalid is an error with its reasons, never a
//! silent fallback; an unknown name is an error listing the registered names; if
//! nothing is valid, the error lists every backend's reasons.
//!
//! Architecture invariant: the selector knows the registry, not any backend crate;
//! whoever links the backends (binaries, tests, benches) decides what exists.

mod hybrid;

pub use hybrid::HybridBackend;

use pagoda_core::{
    registered_backends, AttentionBackend, AttentionConfig, BackendRegistration, InvalidReason,
    Role,
};
use std::fmt;
use thiserror::Error;

/// Errors of backend selection.
#[derive(Debug, Error, Clone, PartialEq)]
pub enum SelectorError {
    #[error("unknown attention backend `{name}` (registered: {})", .registered.join(", "))]
    UnknownBackend {
        name: String,
        registered: Vec<String>,
    },
    #[error("attention backend `{name}` cannot serve {role} rows of this model: {}{}", join(.reasons), suffix(.hint))]
    ForcedInvalid {
        name: String,
        role: Role,
        reasons: Vec<InvalidReason>,
        /// What to pass instead, when the backend serves one kind of rows only.
        hint: Option<String>,
    },
    #[error("no valid attention backend for {role} rows: {}", .verdicts.iter().map(|(n, r)| format!("{n}: {}", join(r))).collect::<Vec<_>>().join(" | "))]
    NoValidBackend {
        role: Role,
        verdicts: Vec<(String, Vec<InvalidReason>)>,
    },
    #[error("invalid --attention-backend value `{value}`: {message}")]
    BadOverride { value: String, message: String },
    #[error("creating attention backend `{name}`: {message}")]
    Create { name: String, message: String },
    #[error("attention backend `{name}` is not batch-invariant: {why}")]
    NotBatchInvariant { name: String, why: String },
    #[error("{0}")]
    Registry(pagoda_core::CoreError),
}

fn suffix(hint: &Option<String>) -> String {
    hint.as_ref().map(|h| format!(". {h}")).unwrap_or_default()
}

fn join(r: &[InvalidReason]) -> String {
    r.iter()
        .map(|x| x.to_string())
        .collect::<Vec<_>>()
        .join("; ")
}

/// A parsed `--attention-backend` value.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct BackendOverride {
    pub decode: Option<String>,
    pub prefill: Option<String>,
}

impl BackendOverride {
    /// Parses `NAME`, `decode=NAME`, `prefill=NAME` or `decode=A,prefill=B`
    /// (`auto` = no override).
    pub fn parse(value: &str) -> Result<Self, SelectorError> {
        let v = value.trim();
        if v.is_empty() || v == "auto" {
            return Ok(Self::default());
        }
        if !v.contains('=') {
            return Ok(BackendOverride {
                decode: Some(v.to_string()),
                prefill: Some(v.to_string()),
            });
        }
        let mut o = BackendOverride::default();
        for part in v.split(',') {
            let (k, name) = part
                .split_once('=')
                .ok_or_else(|| SelectorError::BadOverride {
                    value: value.into(),
                    message: format!("`{part}` is not `decode=NAME` or `prefill=NAME`"),
                })?;
            let name = name.trim();
            if name.is_empty() {
                return Err(SelectorError::BadOverride {
                    value: value.into(),
                    message: format!("empty name in `{part}`"),
                });
            }
            let slot = match k.trim() {
                "decode" => &mut o.decode,
                "prefill" => &mut o.prefill,
                other => {
                    return Err(SelectorError::BadOverride {
                        value: value.into(),
                        message: format!("unknown key `{other}` (use decode= or prefill=)"),
                    })
                }
            };
            if name != "auto" {
                *slot = Some(name.to_string());
            }
        }
        Ok(o)
    }
}

/// The chosen backends and why.
#[derive(Clone)]
pub struct Selection {
    pub decode: &'static BackendRegistration,
    pub prefill: &'static BackendRegistration,
    pub forced: bool,
}

impl Selection {
    /// `naive`, or `decode=paged,prefill=flash`.
    pub fn name(&self) -> String {
        if self.decode.name == self.prefill.name {
            self.decode.name.to_string()
        } else {
            format!("decode={},prefill={}", self.decode.name, self.prefill.name)
        }
    }

    /// Builds the backend the model runner uses (a [`HybridBackend`] when two differ).
    pub fn build(&self, cfg: &AttentionConfig) -> Result<Box<dyn AttentionBackend>, SelectorError> {
        let create = |r: &BackendRegistration| {
            (r.create)(cfg).map_err(|e| SelectorError::Create {
                name: r.name.into(),
                message: e.to_string(),
            })
        };
        if self.decode.name == self.prefill.name {
            create(self.decode)
        } else {
            Ok(Box::new(HybridBackend::new(
                create(self.decode)?,
                create(self.prefill)?,
            )))
        }
    }

    /// [`Selection::build`], refusing a backend that does not declare
    /// [`AttentionBackend::batch_invariant`] (for a hybrid: both parts the same
    /// arithmetic), with the reason.
    pub fn build_batch_invariant(
        &self,
        cfg: &AttentionConfig,
    ) -> Result<Box<dyn AttentionBackend>, SelectorError> {
        let b = self.build(cfg)?;
        if b.batch_invariant().is_some() {
            return Ok(b);
        }
        let why = if self.decode.name == self.prefill.name {
            "it declares no batch-invariant arithmetic".to_string()
        } else {
            let (d, p) = (
                (self.decode.create)(cfg)
                    .ok()
                    .and_then(|b| b.batch_invariant()),
                (self.prefill.create)(cfg)
                    .ok()
                    .and_then(|b| b.batch_invariant()),
            );
            format!(
                "decode rows run {} and prefill rows {}, so a row's bits would depend on which ran it",
                d.unwrap_or("a non-invariant arithmetic"),
                p.unwrap_or("a non-invariant arithmetic")
            )
        };
        Err(SelectorError::NotBatchInvariant {
            name: self.name(),
            why,
        })
    }
}

impl fmt::Display for Selection {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} ({})",
            self.name(),
            if self.forced {
                "forced"
            } else {
                "automatic, by priority"
            }
        )
    }
}

/// One backend's verdict for a configuration.
#[derive(Debug, Clone)]
pub struct Verdict {
    pub name: &'static str,
    pub priority: i32,
    pub description: &'static str,
    pub decode_reasons: Vec<InvalidReason>,
    pub prefill_reasons: Vec<InvalidReason>,
}

/// Every registered backend's verdict, by descending priority.
pub fn verdicts(cfg: &AttentionConfig) -> Vec<Verdict> {
    registered_backends()
        .into_iter()
        .map(|r| Verdict {
            name: r.name,
            priority: r.priority,
            description: r.description,
            decode_reasons: r.reasons(cfg, Role::Decode),
            prefill_reasons: r.reasons(cfg, Role::Prefill),
        })
        .collect()
}

/// Names of every linked backend.
pub fn registered_names() -> Vec<String> {
    registered_backends()
        .into_iter()
        .map(|r| r.name.to_string())
        .collect()
}

fn find(name: &str) -> Result<&'static BackendRegistration, SelectorError> {
    registered_backends()
        .into_iter()
        .find(|r| r.name == name)
        .ok_or_else(|| SelectorError::UnknownBackend {
            name: name.into(),
            registered: registered_names(),
        })
}

fn pick(
    cfg: &AttentionConfig,
    role: Role,
    forced: Option<&str>,
) -> Result<&'static BackendRegistration, SelectorError> {
    if let Some(name) = forced {
        let r = find(name)?;
        let reasons = r.reasons(cfg, role);
        if !reasons.is_empty() {
            return Err(SelectorError::ForcedInvalid {
                name: name.into(),
                role,
                reasons,
                hint: None,
            });
        }
        return Ok(r);
    }
    let all = registered_backends();
    if let Some(r) = all.iter().find(|r| r.reasons(cfg, role).is_empty()) {
        return Ok(r);
    }
    Err(SelectorError::NoValidBackend {
        role,
        verdicts: all
            .iter()
            .map(|r| (r.name.to_string(), r.reasons(cfg, role)))
            .collect(),
    })
}

/// For a backend forced alone that serves only one kind of rows of `cfg`: how to
/// compose it with the best backend for the other kind (`None` otherwise).
fn one_role_hint(cfg: &AttentionConfig, r: &BackendRegistration) -> Option<String> {
    let serves = |role| r.reasons(cfg, role).is_empty();
    let (has, lacks) = match (serves(Role::Decode), serves(Role::Prefill)) {
        (true, false) => (Role::Decode, Role::Prefill),
        (false, true) => (Role::Prefill, Role::Decode),
        _ => return None,
    };
    let name = r.name;
    let Some(other) = registered_backends()
        .into_iter()
        .find(|o| o.reasons(cfg, lacks).is_empty())
    else {
        return Some(format!(
            "`{name}` serves {has} rows only, and no linked backend serves {lacks} rows of this model"
        ));
    };
    let (decode, prefill) = match has {
        Role::Decode => (name, other.name),
        _ => (other.name, name),
    };
    Some(format!(
        "`{name}` serves {has} rows only; compose it with a {lacks} backend: \
         `--attention-backend decode={decode},prefill={prefill}` (or `{has}={name}` \
         to pick the {lacks} backend by priority)"
    ))
}

/// Chooses the decode and prefill backends for `cfg`. With a single forced name, that
/// backend must serve both kinds of rows.
pub fn select(
    cfg: &AttentionConfig,
    override_: &BackendOverride,
) -> Result<Selection, SelectorError> {
    // Refuse two backends of one name before anything walks the registry.
    pagoda_core::try_registered_backends().map_err(SelectorError::Registry)?;
    if let (Some(d), Some(p)) = (&override_.decode, &override_.prefill) {
        if d == p {
            let r = find(d)?;
            let reasons = r.reasons(cfg, Role::Both);
            if !reasons.is_empty() {
                return Err(SelectorError::ForcedInvalid {
                    name: d.clone(),
                    role: Role::Both,
                    reasons,
                    hint: one_role_hint(cfg, r),
                });
            }
            return Ok(Selection {
                decode: r,
                prefill: r,
                forced: true,
            });
        }
    }
    let decode = pick(cfg, Role::Decode, override_.decode.as_deref())?;
    let prefill = pick(cfg, Role::Prefill, override_.prefill.as_deref())?;
    Ok(Selection {
        decode,
        prefill,
        forced: override_.decode.is_some() || override_.prefill.is_some(),
    })
}
