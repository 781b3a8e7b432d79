//! The target distribution of one processed row as dense weights, for the rejection
//! sampler: the sampler's temperature, top-k, top-p and min-p rules (the sampler's
//! module doc states them exactly) applied to the whole vocabulary at once, every
//! token outside the kept set weighing 0. Slow (a full sort under top-p) and only
//! used at verified positions of sampled requests; the tests hold its inverse-CDF
//! draw equal to the sampler's own draw.

use pagoda_core::SamplingParams;

/// Unnormalised weights of the kept tokens (`exp(z - z_max)` in f64), 0 elsewhere.
/// `logits` are processed (sampler steps 0-4) and `max` their maximum, finite.
pub fn target_weights(logits: &[f32], max: f32, p: &SamplingParams) -> Vec<f64> {
    let finite = logits.iter().filter(|l| **l > f32::NEG_INFINITY).count();
    let mut threshold = f32::NEG_INFINITY;
    if p.top_k > 0 && (p.top_k as usize) < finite {
        let mut v: Vec<f32> = logits
            .iter()
            .copied()
            .filter(|l| *l > f32::NEG_INFINITY)
            .collect();
        v.sort_unstable_by(|a, b| b.total_cmp(a));
        threshold = v[p.top_k as usize - 1];
    }
    let inv_t = 1.0 / p.temperature as f64;
    let z_max = max as f64 * inv_t;
    let mut w: Vec<f64> = logits
        .iter()
        .map(|&l| {
            if l > f32::NEG_INFINITY && l >= threshold {
                (l as f64 * inv_t - z_max).exp()
            } else {
                0.0
            }
        })
        .collect();
    if p.top_p < 1.0 {
        let total: f64 = w.iter().sum();
        let target = p.top_p as f64 * total;
        let mut order: Vec<(f64, u32)> = w
            .iter()
            .enumerate()
            .filter(|(_, x)| **x > 0.0)
            .map(|(i, &x)| (x, i as u32))
            .collect();
        order.sort_unstable_by(|a, b| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1)));
        let mut cum = 0.0;
        let mut n = order.len();
        for (i, &(x, _)) in order.iter().enumerate() {
            cum += x;
            if cum >= target {
                n = i + 1;
                break;
            }
        }
        let mut kept = vec![0.0; w.len()];
        for &(x, id) in &order[..n] {
            kept[id as usize] = x;
        }
        w = kept;
    }
    let min_p = p.min_p as f64;
    for x in &mut w {
        if *x < min_p {
            *x = 0.0;
        }
    }
    w
}

/// Inverse-CDF draw in ascending id order: the first token whose running weight
/// exceeds `u * total` (the sampler's rule), or the last positive one.
pub fn draw(weights: &[f64], u: f64) -> u32 {
    let total: f64 = weights.iter().filter(|w| **w > 0.0).sum();
    let goal = u * total;
    let mut cum = 0.0;
    let mut last = 0u32;
    for (id, &w) in weights.iter().enumerate() {
        if w > 0.0 {
            cum += w;
            last = id as u32;
            if cum > goal {
                return id as u32;
            }
        }
    }
    last
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sampler::draw_filtered;
    use proptest::prelude::*;

    proptest! {
        /// Drawing from the dense weights gives the sampler's own token for the same
        /// uniform number, under every filter combination.
        #[test]
        fn dense_draw_equals_the_samplers(
            logits in proptest::collection::vec(prop_oneof![4 => -8.0f32..8.0, 1 => Just(f32::NEG_INFINITY), 1 => Just(1.5f32)], 2..40),
            temperature in 0.1f32..2.0,
            top_k in 0i32..8,
            top_p in prop_oneof![Just(1.0f32), 0.05f32..1.0],
            min_p in prop_oneof![Just(0.0f32), 0.0f32..0.5],
            u in 0.0f64..1.0,
        ) {
            let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
            prop_assume!(max > f32::NEG_INFINITY);
            let p = SamplingParams { temperature, top_k, top_p, min_p, ..SamplingParams::default() };
            let w = target_weights(&logits, max, &p);
            prop_assert_eq!(draw(&w, u), draw_filtered(&logits, max, &p, u));
        }
    }
}
