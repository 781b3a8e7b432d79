//! Structured-output constraints (vLLM's `StructuredOutputsParams`, once called
//! guided decoding) as plain data: which kind of constraint a request carries and
//! its text or schema.
//!
//! Core only checks their shape; compiling a constraint into a token mask needs
//! the tokenizer and happens in the engine (`pagoda_engine::structured`).

use crate::CoreError;
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// The one constraint a request's output must satisfy.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Constraint {
    /// A JSON Schema (an object, or `true` for any JSON value).
    Json(Value),
    /// Any JSON object (`response_format: {"type": "json_object"}`).
    JsonObject,
    /// A regular expression (Rust `regex` syntax) the whole output must match.
    Regex(String),
    /// The output is exactly one of these strings.
    Choice(Vec<String>),
    /// A context-free grammar in llguidance's Lark dialect.
    Grammar(String),
}

impl Constraint {
    /// The field's name in vLLM's `structured_outputs` object.
    pub fn kind(&self) -> &'static str {
        match self {
            Constraint::Json(_) => "json",
            Constraint::JsonObject => "json_object",
            Constraint::Regex(_) => "regex",
            Constraint::Choice(_) => "choice",
            Constraint::Grammar(_) => "grammar",
        }
    }
}

/// A constraint plus vLLM's options for it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StructuredOutputs {
    pub constraint: Constraint,
    /// JSON: no whitespace between tokens (vLLM's `disable_any_whitespace`).
    #[serde(default)]
    pub disable_any_whitespace: bool,
    /// JSON: objects with `properties` get `additionalProperties: false` unless the
    /// schema says otherwise (vLLM's `disable_additional_properties`).
    #[serde(default)]
    pub disable_additional_properties: bool,
    /// JSON: the regex of the whitespace allowed between tokens.
    #[serde(default)]
    pub whitespace_pattern: Option<String>,
}

impl StructuredOutputs {
    /// A constraint with vLLM's default options.
    pub fn new(constraint: Constraint) -> Self {
        StructuredOutputs {
            constraint,
            disable_any_whitespace: false,
            disable_additional_properties: false,
            whitespace_pattern: None,
        }
    }

    /// Checks the shape (not the meaning: the engine compiles it).
    pub fn validate(&self) -> Result<(), CoreError> {
        let bad = |message: String| {
            Err(CoreError::InvalidSamplingParam {
                param: "structured_outputs",
                message,
            })
        };
        match &self.constraint {
            Constraint::Json(Value::Object(_)) | Constraint::Json(Value::Bool(true)) => {}
            Constraint::Json(other) => {
                return bad(format!(
                    "a JSON schema must be an object (or `true`), got {}",
                    json_kind(other)
                ))
            }
            Constraint::Choice(c) if c.is_empty() => {
                return bad("`choice` must list at least one string".into())
            }
            Constraint::Grammar(g) if g.trim().is_empty() => {
                return bad("`grammar` must not be empty".into())
            }
            _ => {}
        }
        if self.whitespace_pattern.as_deref() == Some("") {
            return bad("`whitespace_pattern` must not be empty".into());
        }
        Ok(())
    }
}

fn json_kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn shapes_are_checked() {
        let ok = |c| StructuredOutputs::new(c).validate().is_ok();
        assert!(ok(Constraint::Json(json!({"type": "object"}))));
        assert!(ok(Constraint::Json(json!(true))));
        assert!(!ok(Constraint::Json(json!(false))));
        assert!(!ok(Constraint::Json(json!([1]))));
        assert!(!ok(Constraint::Json(json!("x"))));
        assert!(ok(Constraint::JsonObject));
        assert!(ok(Constraint::Regex("[a-z]+".into())));
        assert!(ok(Constraint::Choice(vec!["a".into()])));
        assert!(!ok(Constraint::Choice(vec![])));
        assert!(!ok(Constraint::Grammar("  ".into())));
        let mut s = StructuredOutputs::new(Constraint::JsonObject);
        s.whitespace_pattern = Some(String::new());
        assert!(s.validate().is_err());
    }

    #[test]
    fn serde_round_trip() {
        let s = StructuredOutputs::new(Constraint::Choice(vec!["yes".into(), "no".into()]));
        let v = serde_json::to_value(&s).unwrap();
        assert_eq!(v["constraint"], json!({"choice": ["yes", "no"]}));
        assert_eq!(serde_json::from_value::<StructuredOutputs>(v).unwrap(), s);
    }
}
