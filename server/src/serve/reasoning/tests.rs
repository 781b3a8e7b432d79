//! The reasoning parsers' properties run in the shared parser kit
//! (`serve::tools::tests`); here, the driver's own edge cases.

use super::{lookup, ReasoningStream};

#[test]
fn a_phase_change_without_bytes_still_parses_the_rest() {
    let mut s = ReasoningStream::new(lookup("deepseek_r1").unwrap());
    let (r, c) = s.push("ab</think>cd", true);
    assert_eq!((r.as_str(), c.as_str()), ("ab", "cd"));
    assert_eq!(s.push("more", true), Default::default());
}
