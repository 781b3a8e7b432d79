//! What both loaders ([`crate::loader`] for GGUF, [`crate::hf`] for HF directories)
//! produce and share: the [`LoadedModel`], its display name and load progress.

use crate::chat::ChatTemplate;
use crate::config::LlamaConfig;
use crate::tokenizer::Tokenizer;
use crate::weights::LlamaWeights;
use std::path::Path;

/// Everything needed to serve a model.
#[derive(Debug)]
pub struct LoadedModel {
    pub config: LlamaConfig,
    pub weights: LlamaWeights,
    pub tokenizer: Tokenizer,
    pub chat_template: Option<ChatTemplate>,
    /// Token ids that end generation (EOS, plus end-of-turn ids when the model has them).
    pub eos_token_ids: Vec<u32>,
    /// Display name: the GGUF file stem or the HF directory name.
    pub name: String,
}

pub(crate) fn display_name(path: &Path) -> String {
    let stem = if path.is_dir() {
        path.file_name()
    } else {
        path.file_stem()
    };
    stem.map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_else(|| path.display().to_string())
}

/// Logs loading progress every 10% of tensors.
pub(crate) struct Progress {
    total: usize,
    done: usize,
    next_decile: usize,
    what: String,
}

impl Progress {
    pub(crate) fn new(total: usize, what: String) -> Self {
        tracing::info!("loading {total} tensors from {what}");
        Progress {
            total,
            done: 0,
            next_decile: 1,
            what,
        }
    }
    pub(crate) fn tick(&mut self) {
        self.done += 1;
        while self.total > 0
            && self.done * 10 >= self.next_decile * self.total
            && self.next_decile <= 10
        {
            tracing::info!(
                "{}: {}% of tensors loaded ({}/{})",
                self.what,
                self.next_decile * 10,
                self.done,
                self.total
            );
            self.next_decile += 1;
        }
    }
}
