//! Compiling one constraint: a request's [`StructuredOutputs`] checked against the
//! static bounds ([`super::bounds`]) and turned into an llguidance [`Matcher`] over
//! the engine's vocabulary, with vLLM's options (closed `additionalProperties`,
//! literal `choice`s). Below the compile pool (`compile`), which runs it on its
//! threads, and above the limits it is built with.

use super::limits::CompileLimits;
use super::{bounds, gbnf};
use crate::EngineError;
use llguidance::api::TopLevelGrammar;
use llguidance::{JsonCompileOptions, Matcher, ParserFactory};
use pagoda_core::{Constraint, StructuredOutputs};
use serde_json::{json, Value};

/// Compiles constraints for one tokenizer and vocabulary.
pub struct GrammarCompiler {
    factory: ParserFactory,
    limits: CompileLimits,
}

impl GrammarCompiler {
    /// Builds llguidance's token trie from `tokenizer`'s vocabulary, with the
    /// model's EOS ids as the grammar's end and `vocab_size` (the model's logits
    /// width, which may exceed the tokenizer's) as its size.
    pub fn new(
        tokenizer: &tokenizers::Tokenizer,
        eos_ids: &[u32],
        vocab_size: usize,
        limits: CompileLimits,
    ) -> Result<Self, EngineError> {
        let fault = |e: String| EngineError::Fault {
            message: format!("structured outputs: {e}"),
        };
        let mut bt = toktrie_hf_tokenizers::ByteTokenizer::from_tokenizer(tokenizer.clone())
            .map_err(|e| fault(e.to_string()))?;
        let n_tok = tokenizer.get_vocab_size(true);
        let eos: Vec<u32> = eos_ids
            .iter()
            .copied()
            .filter(|&t| (t as usize) < n_tok)
            .collect();
        if !eos.is_empty() {
            bt.set_eos_tokens(&eos);
        }
        let env = bt
            .into_tok_env(Some(vocab_size.max(n_tok)))
            .map_err(|e| fault(e.to_string()))?;
        let mut factory = ParserFactory::new_simple(&env).map_err(|e| fault(e.to_string()))?;
        factory.quiet();
        limits.apply(factory.limits_mut());
        Ok(GrammarCompiler { factory, limits })
    }

    /// Checks the bounds, then builds the matcher (no mask yet).
    pub(crate) fn build_matcher(&self, spec: &StructuredOutputs) -> Result<Matcher, EngineError> {
        spec.validate()?;
        check_bounds(spec, &self.limits)?;
        let grammar = top_level_grammar(spec)?;
        let parser = self
            .factory
            .create_parser(grammar)
            .map_err(|e| invalid_grammar(format!("Grammar error: {e}")))?;
        let matcher = Matcher::new(Ok(parser));
        if let Some(e) = matcher.get_error() {
            return Err(invalid_grammar(format!("Grammar error: {e}")));
        }
        Ok(matcher)
    }
}

/// The static bounds of [`bounds`], each refusal naming its flag.
fn check_bounds(spec: &StructuredOutputs, limits: &CompileLimits) -> Result<(), EngineError> {
    let too_deep = |what: &str| {
        invalid_grammar(format!(
            "the {what} nests more than {} levels deep (--structured-outputs-max-depth)",
            limits.max_depth
        ))
    };
    let mut regexes: Vec<String> = spec.whitespace_pattern.iter().cloned().collect();
    match &spec.constraint {
        Constraint::Json(schema) => {
            bounds::schema_depth(schema, limits.max_depth)
                .map_err(|_| too_deep("JSON schema (counting `$ref`s)"))?;
            bounds::schema_patterns(schema, &mut regexes);
        }
        Constraint::JsonObject => {}
        Constraint::Regex(rx) => regexes.push(rx.clone()),
        Constraint::Choice(choices) => {
            let total: u64 = choices.iter().map(|c| c.len() as u64 + 1).sum();
            if total > limits.max_regex_size {
                return Err(invalid_grammar(format!(
                    "`choice` has {} options of {total} bytes in all; the limit is {} bytes \
                     (--structured-outputs-max-regex-size)",
                    choices.len(),
                    limits.max_regex_size
                )));
            }
        }
        Constraint::Grammar(g) => {
            let lark = if gbnf::is_gbnf(g) {
                gbnf::to_lark(g)
                    .map_err(|e| invalid_grammar(format!("Invalid grammar specification: {e}")))?
            } else {
                g.clone()
            };
            bounds::lark_depth(&lark, limits.max_depth)
                .map_err(|_| too_deep("grammar's rule chain"))?;
            regexes.extend(bounds::lark_regexes(&lark));
            for schema in bounds::lark_json_schemas(&lark) {
                bounds::schema_depth(&schema, limits.max_depth)
                    .map_err(|_| too_deep("grammar's embedded JSON schema"))?;
                bounds::schema_patterns(&schema, &mut regexes);
            }
        }
    }
    for rx in &regexes {
        if let Some(size) = bounds::regex_size(rx).filter(|&s| s > limits.max_regex_size) {
            let shown: String = rx.chars().take(60).collect();
            return Err(invalid_grammar(format!(
                "the regex `{shown}` expands to {size} elements once its repetitions are counted; \
                 the limit is {} (--structured-outputs-max-regex-size)",
                limits.max_regex_size
            )));
        }
    }
    Ok(())
}

fn invalid_grammar(message: String) -> EngineError {
    EngineError::InvalidGrammar {
        param: "structured_outputs".into(),
        message,
    }
}

/// llguidance's grammar for a constraint, with vLLM's options applied.
fn top_level_grammar(spec: &StructuredOutputs) -> Result<TopLevelGrammar, EngineError> {
    let json_options = || JsonCompileOptions {
        whitespace_flexible: !spec.disable_any_whitespace,
        whitespace_pattern: spec.whitespace_pattern.clone(),
        ..JsonCompileOptions::default()
    };
    let with_options = |mut schema: Value| -> Value {
        if let Value::Object(o) = &mut schema {
            // A schema's own `x-guidance` options win over the request's.
            if !o.contains_key("x-guidance") {
                if let Ok(opts) = serde_json::to_value(json_options()) {
                    o.insert("x-guidance".into(), opts);
                }
            }
        }
        schema
    };
    Ok(match &spec.constraint {
        Constraint::Json(schema) => {
            let mut schema = match schema {
                Value::Bool(true) => json!({}),
                s => s.clone(),
            };
            if spec.disable_additional_properties {
                no_additional_properties(&mut schema);
            }
            TopLevelGrammar::from_json_schema(with_options(schema))
        }
        Constraint::JsonObject => {
            TopLevelGrammar::from_json_schema(with_options(json!({"type": "object"})))
        }
        Constraint::Regex(rx) => TopLevelGrammar::from_regex(rx),
        Constraint::Choice(choices) => {
            let alternatives: Vec<String> = choices.iter().map(|c| escape_regex(c)).collect();
            TopLevelGrammar::from_regex(&alternatives.join("|"))
        }
        Constraint::Grammar(g) if gbnf::is_gbnf(g) => {
            let lark = gbnf::to_lark(g)
                .map_err(|e| invalid_grammar(format!("Invalid grammar specification: {e}")))?;
            TopLevelGrammar::from_lark(lark)
        }
        Constraint::Grammar(g) => TopLevelGrammar::from_lark_or_grammar_list(g)
            .map_err(|e| invalid_grammar(format!("Invalid grammar specification: {e}")))?,
    })
}

/// vLLM's `disable_additional_properties`: every (sub)schema with `properties`
/// and no `additionalProperties` gets `additionalProperties: false`.
fn no_additional_properties(schema: &mut Value) {
    const MAPS: [&str; 4] = ["properties", "$defs", "definitions", "dependentSchemas"];
    const SUBS: [&str; 11] = [
        "additionalProperties",
        "items",
        "prefixItems",
        "allOf",
        "anyOf",
        "oneOf",
        "not",
        "if",
        "then",
        "else",
        "contains",
    ];
    match schema {
        Value::Object(o) => {
            for k in MAPS {
                if let Some(Value::Object(m)) = o.get_mut(k) {
                    m.values_mut().for_each(no_additional_properties);
                }
            }
            for k in SUBS {
                if let Some(v) = o.get_mut(k) {
                    no_additional_properties(v);
                }
            }
            if o.get("properties").is_some_and(Value::is_object)
                && !o.contains_key("additionalProperties")
            {
                o.insert("additionalProperties".into(), Value::Bool(false));
            }
        }
        Value::Array(a) => a.iter_mut().for_each(no_additional_properties),
        _ => {}
    }
}

/// Escapes regex metacharacters so that `s` matches itself literally.
fn escape_regex(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    for c in s.chars() {
        if "\\.+*?()|[]{}^$#&-~/".contains(c) {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn escape_makes_literals() {
        assert_eq!(escape_regex("a.b"), "a\\.b");
        assert_eq!(escape_regex("(x|y)"), "\\(x\\|y\\)");
        assert_eq!(escape_regex("plain"), "plain");
    }

    #[test]
    fn additional_properties_are_closed_recursively() {
        let mut s = json!({
            "type": "object",
            "properties": {"a": {"type": "object", "properties": {"b": {"type": "integer"}}}},
            "$defs": {"d": {"properties": {}, "additionalProperties": true}}
        });
        no_additional_properties(&mut s);
        assert_eq!(s["additionalProperties"], json!(false));
        assert_eq!(s["properties"]["a"]["additionalProperties"], json!(false));
        assert_eq!(s["$defs"]["d"]["additionalProperties"], json!(true));
    }
}
