//! Prefix-stable scanning helpers shared by the tool parsers: whether a JSON
//! value at the start of a text is complete, still growing, or already broken.
//!
//! "Prefix-stable" is what makes streaming equal to the one-shot parse: a
//! `Complete` or `Invalid` answer on a prefix stays the same answer on every
//! extension of it, so a decision taken on a partial output is never revised.

use serde_json::Value;

/// What the start of a text holds.
#[derive(Debug, Clone, PartialEq)]
pub enum Scan {
    /// A whole object or array, and the bytes it (and leading whitespace) took.
    Complete(Value, usize),
    /// Could still become a value: more text is needed.
    Incomplete,
    /// Can never become a value, whatever follows.
    Invalid,
}

/// Scans one JSON object or array at the start of `s` (leading whitespace
/// allowed). Scalars are refused: `12` could still grow into `123`, so only
/// bracketed values are prefix-stable.
pub fn json_value(s: &str) -> Scan {
    let t = s.trim_start();
    match t.as_bytes().first() {
        None => return Scan::Incomplete,
        Some(b'{') | Some(b'[') => {}
        Some(_) => return Scan::Invalid,
    }
    let mut it = serde_json::Deserializer::from_str(s).into_iter::<Value>();
    match it.next() {
        None => Scan::Incomplete,
        Some(Ok(v)) => Scan::Complete(v, it.byte_offset()),
        Some(Err(e)) if e.is_eof() => Scan::Incomplete,
        Some(Err(_)) => Scan::Invalid,
    }
}

/// The length of the longest suffix of `text` that is a proper prefix of `tag`
/// (markup that may be starting: held back until the next delta decides).
pub fn partial_suffix(text: &str, tag: &str) -> usize {
    let max = tag.len().saturating_sub(1).min(text.len());
    (1..=max)
        .rev()
        .find(|&k| {
            text.is_char_boundary(text.len() - k) && tag.starts_with(&text[text.len() - k..])
        })
        .unwrap_or(0)
}

/// The longest of [`partial_suffix`] over several tags.
pub fn partial_suffix_any(text: &str, tags: &[&str]) -> usize {
    tags.iter()
        .map(|t| partial_suffix(text, t))
        .max()
        .unwrap_or(0)
}

/// A JSON value as the `arguments` string of a call: objects and arrays are
/// serialized, a string that holds JSON is kept (some models quote their
/// arguments), anything else is refused.
pub fn arguments_string(v: &Value) -> Option<String> {
    match v {
        Value::Object(_) => Some(v.to_string()),
        Value::String(s) => match serde_json::from_str::<Value>(s) {
            Ok(inner @ Value::Object(_)) => Some(inner.to_string()),
            _ => None,
        },
        Value::Null => Some("{}".to_string()),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_scan_is_prefix_stable() {
        let full = r#" {"a": [1, "}"], "b": {"c": null}} tail"#;
        let Scan::Complete(_, end) = json_value(full) else {
            panic!()
        };
        assert_eq!(&full[end..], " tail");
        for i in 0..full.len() {
            match json_value(&full[..i]) {
                Scan::Incomplete => assert!(i < end, "{i}"),
                Scan::Complete(_, e) => assert_eq!(e, end),
                Scan::Invalid => panic!("prefix {i} invalid"),
            }
        }
        assert_eq!(json_value("{\"a\" 1"), Scan::Invalid);
        assert_eq!(json_value("x"), Scan::Invalid);
        assert_eq!(json_value("  "), Scan::Incomplete);
    }

    #[test]
    fn partial_suffixes() {
        assert_eq!(partial_suffix("abc<tool", "<tool_call>"), 5);
        assert_eq!(partial_suffix("abc<tool_call>", "<tool_call>"), 0);
        assert_eq!(partial_suffix("abc", "<tool_call>"), 0);
        assert_eq!(partial_suffix("é<", "<a>"), 1);
    }
}
