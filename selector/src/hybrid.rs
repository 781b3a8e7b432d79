//! A backend composed of a decode backend and a prefill backend.
//!
//! Decode rows come first in every batch, so the split is one index: the hybrid
//! plans each part on its own sub-descriptor and runs each on its slice of the
//! token buffers.

use pagoda_core::{
    AttentionBackend, BatchDescriptor, CoreError, GraphLimits, GraphSupport, LayerIo,
};

/// Runs decode rows on one backend and prefill rows on another.
pub struct HybridBackend {
    decode: Box<dyn AttentionBackend>,
    prefill: Box<dyn AttentionBackend>,
    name: String,
    num_decode_tokens: usize,
    num_tokens: usize,
    has_decode: bool,
    has_prefill: bool,
}

impl HybridBackend {
    pub fn new(decode: Box<dyn AttentionBackend>, prefill: Box<dyn AttentionBackend>) -> Self {
        let name = format!("decode={},prefill={}", decode.name(), prefill.name());
        HybridBackend {
            decode,
            prefill,
            name,
            num_decode_tokens: 0,
            num_tokens: 0,
            has_decode: false,
            has_prefill: false,
        }
    }
}

impl AttentionBackend for HybridBackend {
    fn name(&self) -> &str {
        &self.name
    }

    fn plan(&mut self, batch: &BatchDescriptor) -> Result<(), CoreError> {
        let (d, p) = batch.split_decode_prefill();
        self.num_decode_tokens = batch.num_decode_tokens();
        self.num_tokens = batch.num_tokens();
        self.has_decode = d.num_reqs() > 0;
        self.has_prefill = p.num_reqs() > 0;
        if self.has_decode {
            self.decode.plan(&d)?;
        }
        if self.has_prefill {
            self.prefill.plan(&p)?;
        }
        Ok(())
    }

    fn run(&mut self, io: LayerIo<'_>) -> Result<(), CoreError> {
        let LayerIo {
            q,
            k_cache,
            v_cache,
            out,
            lse,
        } = io;
        if self.num_tokens == 0 {
            return Ok(());
        }
        let row = q.len() / self.num_tokens;
        let split = self.num_decode_tokens * row;
        if out.len() != q.len() || split > q.len() {
            return Err(CoreError::ShapeMismatch {
                name: "out",
                expected: q.len(),
                actual: out.len(),
            });
        }
        let (q_d, q_p) = q.split_at(split)?;
        let (o_d, o_p) = out.split_at(split)?;
        let (l_d, l_p) = match lse {
            Some(l) => {
                let heads = l.len() / self.num_tokens;
                let (a, b) = l.split_at(self.num_decode_tokens * heads)?;
                (Some(a), Some(b))
            }
            None => (None, None),
        };
        let io = |q, out, lse| LayerIo {
            q,
            k_cache,
            v_cache,
            out,
            lse,
        };
        if self.has_decode {
            self.decode.run(io(q_d, o_d, l_d))?;
        }
        if self.has_prefill {
            self.prefill.run(io(q_p, o_p, l_p))?;
        }
        Ok(())
    }

    /// Invariant when both parts run the same named arithmetic: a row then gets
    /// the same bits as a decode row and as a prefill row.
    fn batch_invariant(&self) -> Option<&'static str> {
        let d = self.decode.batch_invariant()?;
        (self.prefill.batch_invariant() == Some(d)).then_some(d)
    }

    /// A graph step is decode-only: the decode backend's support.
    fn graph_support(&self) -> GraphSupport {
        self.decode.graph_support()
    }

    fn plan_graph(
        &mut self,
        batch: &BatchDescriptor,
        limits: &GraphLimits,
    ) -> Result<(), CoreError> {
        self.has_decode = false;
        self.has_prefill = false;
        self.num_tokens = 0;
        self.decode.plan_graph(batch, limits)?;
        self.num_decode_tokens = batch.num_tokens();
        self.num_tokens = batch.num_tokens();
        self.has_decode = batch.num_reqs() > 0;
        Ok(())
    }
}
