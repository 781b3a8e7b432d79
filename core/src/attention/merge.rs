//! The log-sum-exp merge of two partial attention results.

/// Merges two partial attention results over disjoint KV sets into `out`/`lse`.
///
/// `o_*`: `[rows, head_dim]` flattened; `lse_*`: `[rows]` (natural log). A row with
/// `lse = -inf` (no keys) contributes nothing.
pub fn merge_states(
    o_a: &[f32],
    lse_a: &[f32],
    o_b: &[f32],
    lse_b: &[f32],
    head_dim: usize,
    out: &mut [f32],
    lse_out: &mut [f32],
) {
    for row in 0..lse_a.len() {
        let (la, lb) = (lse_a[row], lse_b[row]);
        let m = la.max(lb);
        let o = &mut out[row * head_dim..(row + 1) * head_dim];
        if m == f32::NEG_INFINITY {
            o.fill(0.0);
            lse_out[row] = f32::NEG_INFINITY;
            continue;
        }
        let wa = (la - m).exp();
        let wb = (lb - m).exp();
        let inv = 1.0 / (wa + wb);
        let a = &o_a[row * head_dim..(row + 1) * head_dim];
        let b = &o_b[row * head_dim..(row + 1) * head_dim];
        for d in 0..head_dim {
            o[d] = (wa * a[d] + wb * b[d]) * inv;
        }
        lse_out[row] = m + (wa + wb).ln();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn merge_of_empty_half_is_identity() {
        let o = [1.0, 2.0];
        let mut out = [0.0; 2];
        let mut lse = [0.0];
        merge_states(
            &o,
            &[0.5],
            &[9.0, 9.0],
            &[f32::NEG_INFINITY],
            2,
            &mut out,
            &mut lse,
        );
        assert_eq!(out, o);
        assert_eq!(lse[0], 0.5);
    }
}
