//! Benchmark prompts: distinct token-id lists drawn from a seeded RNG over a
//! range of ordinary token ids, optionally behind one shared prefix.
//!
//! Token ids (not text) keep the prompt length exact on every server: text would
//! re-tokenize to a different length, and the vLLM-style and llama.cpp servers
//! both accept `prompt: [ids]`.

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use std::collections::HashSet;

/// How to draw prompts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PromptSpec {
    /// Distinct tokens per prompt (after the shared prefix).
    pub input_len: usize,
    /// Tokens common to all prompts, in front.
    pub shared_prefix_len: usize,
    /// Token ids are drawn uniformly from `lo..hi`.
    pub lo: u32,
    pub hi: u32,
    pub seed: u64,
}

/// Draws prompts in batches; every prompt drawn from one generator is distinct
/// from every other (so later concurrency levels never hit the prefix cache of
/// earlier ones beyond the shared prefix).
pub struct PromptGen {
    spec: PromptSpec,
    rng: ChaCha8Rng,
    prefix: Vec<u32>,
    seen: HashSet<Vec<u32>>,
}

impl PromptGen {
    /// Fails when the id range is empty or there are too few distinct prompts.
    pub fn new(spec: PromptSpec) -> anyhow::Result<Self> {
        anyhow::ensure!(
            spec.lo < spec.hi,
            "empty token id range {}..{}",
            spec.lo,
            spec.hi
        );
        anyhow::ensure!(spec.input_len > 0, "--input-len must be at least 1");
        let mut rng = ChaCha8Rng::seed_from_u64(spec.seed);
        let prefix = (0..spec.shared_prefix_len)
            .map(|_| rng.gen_range(spec.lo..spec.hi))
            .collect();
        Ok(PromptGen {
            spec,
            rng,
            prefix,
            seen: HashSet::new(),
        })
    }

    pub fn prefix(&self) -> &[u32] {
        &self.prefix
    }

    /// The next `n` prompts, each `shared_prefix_len + input_len` ids.
    pub fn take(&mut self, n: usize) -> anyhow::Result<Vec<Vec<u32>>> {
        let mut out = Vec::with_capacity(n);
        for _ in 0..n {
            let mut tries = 0;
            let tail = loop {
                let t: Vec<u32> = (0..self.spec.input_len)
                    .map(|_| self.rng.gen_range(self.spec.lo..self.spec.hi))
                    .collect();
                if self.seen.insert(t.clone()) {
                    break t;
                }
                tries += 1;
                // Only reachable with tiny ranges and lengths.
                anyhow::ensure!(
                    tries < 1000,
                    "cannot draw {n} distinct prompts from this token range"
                );
            };
            let mut p = self.prefix.clone();
            p.extend_from_slice(&tail);
            out.push(p);
        }
        Ok(out)
    }
}

/// Parses `LO..HI` (half-open).
pub fn parse_range(s: &str) -> Result<(u32, u32), String> {
    let (a, b) = s
        .split_once("..")
        .ok_or_else(|| format!("expected LO..HI, got {s:?}"))?;
    let lo: u32 = a
        .trim()
        .parse()
        .map_err(|e| format!("bad LO in {s:?}: {e}"))?;
    let hi: u32 = b
        .trim()
        .parse()
        .map_err(|e| format!("bad HI in {s:?}: {e}"))?;
    if lo >= hi {
        return Err(format!("empty range {s:?}"));
    }
    Ok((lo, hi))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn prompts_are_distinct_in_range_and_share_the_prefix(
            input_len in 2usize..20, prefix in 0usize..10, n in 1usize..40, seed in any::<u64>())
        {
            let spec = PromptSpec { input_len, shared_prefix_len: prefix, lo: 100, hi: 140, seed };
            let mut g = PromptGen::new(spec).unwrap();
            let mut all = g.take(n).unwrap();
            all.extend(g.take(n).unwrap());
            let set: HashSet<_> = all.iter().collect();
            // 40^2 possible tails, at most 80 drawn: distinctness must always be reachable.
            prop_assert_eq!(set.len(), all.len());
            for p in &all {
                prop_assert_eq!(p.len(), prefix + input_len);
                prop_assert_eq!(&p[..prefix], g.prefix());
                prop_assert!(p.iter().all(|&t| (100..140).contains(&t)));
            }
            // Same seed, same prompts.
            let mut g2 = PromptGen::new(spec).unwrap();
            prop_assert_eq!(&g2.take(n).unwrap(), &all[..n].to_vec());
        }
    }

    #[test]
    fn too_small_a_space_is_an_error_not_a_hang() {
        let spec = PromptSpec {
            input_len: 1,
            shared_prefix_len: 0,
            lo: 0,
            hi: 2,
            seed: 1,
        };
        assert!(PromptGen::new(spec).unwrap().take(3).is_err());
        assert!(PromptGen::new(PromptSpec {
            lo: 5,
            hi: 5,
            ..spec
        })
        .is_err());
    }

    #[test]
    fn range_parsing() {
        assert_eq!(parse_range("10..20"), Ok((10, 20)));
        assert!(parse_range("20..10").is_err());
        assert!(parse_range("x").is_err());
    }
}
