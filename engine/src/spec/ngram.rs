//! N-gram proposals (prompt lookup, vLLM's `"ngram"` method): the longest suffix of
//! the sequence, between `min_n` and `max_n` tokens, that also occurs earlier in it;
//! the tokens that followed its earliest occurrence (up to `k`) are the drafts.
//!
//! [`propose`] finds it in one pass (each position whose token equals the last one
//! is extended backwards up to `max_n`), [`propose_ref`] by trying every length from
//! `max_n` down and scanning from the start; the proptests hold them equal.

/// Up to `k` drafts for `tokens` (empty when no suffix of `min_n..=max_n` tokens
/// recurs with a token after it).
pub fn propose(tokens: &[u32], min_n: usize, max_n: usize, k: usize) -> Vec<u32> {
    let len = tokens.len();
    if k == 0 || min_n == 0 || len < min_n + 1 {
        return Vec::new();
    }
    let last = tokens[len - 1];
    // (match length, end of the earlier occurrence) of the best match so far:
    // longest first, then earliest.
    let mut best: Option<(usize, usize)> = None;
    // An occurrence ending at `end` (exclusive) must leave a token after it and be
    // an earlier one, so `end < len`.
    for end in 1..len {
        if tokens[end - 1] != last {
            continue;
        }
        let reach = max_n.min(end);
        let mut m = 1;
        while m < reach && tokens[end - 1 - m] == tokens[len - 1 - m] {
            m += 1;
        }
        if m >= min_n && best.is_none_or(|(bm, _)| m > bm) {
            best = Some((m, end));
            if m == max_n {
                break; // nothing is longer, and this is the earliest of its length
            }
        }
    }
    best.map_or_else(Vec::new, |(_, end)| tokens[end..len.min(end + k)].to_vec())
}

/// The obvious version: for each length from `max_n` down to `min_n`, the first
/// earlier position where the suffix of that length occurs with a token after it.
pub fn propose_ref(tokens: &[u32], min_n: usize, max_n: usize, k: usize) -> Vec<u32> {
    let len = tokens.len();
    if k == 0 || min_n == 0 {
        return Vec::new();
    }
    for n in (min_n..=max_n).rev() {
        if n + 1 > len {
            continue;
        }
        let suffix = &tokens[len - n..];
        for start in 0..len - n {
            if &tokens[start..start + n] == suffix {
                let end = start + n;
                return tokens[end..len.min(end + k)].to_vec();
            }
        }
    }
    Vec::new()
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn repeats_what_followed() {
        // "a b c d a b" -> suffix "a b" recurs at 0, followed by "c d a b".
        let t = [1, 2, 3, 4, 1, 2];
        assert_eq!(propose(&t, 2, 3, 3), vec![3, 4, 1]);
        assert_eq!(propose(&t, 2, 3, 10), vec![3, 4, 1, 2]);
        assert_eq!(propose(&t, 3, 3, 3), Vec::<u32>::new());
        // The longest match wins over an earlier shorter one.
        let t = [9, 2, 7, 1, 2, 8, 1, 2];
        assert_eq!(propose(&t, 1, 3, 2), vec![8, 1]);
        assert_eq!(propose(&t, 1, 1, 2), vec![7, 1]);
    }

    proptest! {
        /// The one-pass search equals the reference on small alphabets (many matches).
        #[test]
        fn matches_reference(
            tokens in proptest::collection::vec(0u32..4, 0..60),
            min_n in 1usize..4,
            extra in 0usize..4,
            k in 0usize..6,
        ) {
            let max_n = min_n + extra;
            prop_assert_eq!(
                propose(&tokens, min_n, max_n, k),
                propose_ref(&tokens, min_n, max_n, k)
            );
        }
    }
}
