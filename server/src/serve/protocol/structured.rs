//! `response_format` (OpenAI) and `structured_outputs` (vLLM) into core's
//! [`StructuredOutputs`], with vLLM's rules: `response_format` sets its field of
//! `structured_outputs` (`json_object`, or `json` from `json_schema.schema`), and
//! more than one kind of constraint is a 400. Compiling the constraint (and so
//! finding an invalid schema, regex or grammar) is the engine's job.

use super::super::error::ApiError;
use pagoda_core::{Constraint, StructuredOutputs};
use serde_json::Value;

const SO: &str = "structured_outputs";
const RF: &str = "response_format";

/// The structured-output constraint of a request, if any.
pub fn parse(
    response_format: Option<&Value>,
    structured_outputs: Option<&Value>,
) -> Result<Option<StructuredOutputs>, ApiError> {
    let mut kinds: Vec<(&'static str, Constraint)> = Vec::new();
    let mut options = StructuredOutputs::new(Constraint::JsonObject);
    let so = structured_outputs.filter(|v| !v.is_null());
    if let Some(so) = so {
        let obj = so
            .as_object()
            .ok_or_else(|| ApiError::bad(SO, "structured_outputs must be an object"))?;
        for (k, v) in obj {
            if v.is_null() {
                continue;
            }
            match k.as_str() {
                "json" => kinds.push(("json", Constraint::Json(json_schema(v, SO)?))),
                "regex" => kinds.push(("regex", Constraint::Regex(string(v, "regex")?))),
                "grammar" => kinds.push(("grammar", Constraint::Grammar(string(v, "grammar")?))),
                "choice" => kinds.push(("choice", Constraint::Choice(choices(v)?))),
                "json_object" => match v.as_bool() {
                    Some(true) => kinds.push(("json_object", Constraint::JsonObject)),
                    Some(false) => {}
                    None => return Err(type_error("json_object", "a boolean")),
                },
                "disable_any_whitespace" => {
                    options.disable_any_whitespace = boolean(v, "disable_any_whitespace")?
                }
                "disable_additional_properties" => {
                    options.disable_additional_properties =
                        boolean(v, "disable_additional_properties")?
                }
                "whitespace_pattern" => {
                    options.whitespace_pattern = Some(string(v, "whitespace_pattern")?)
                }
                "structural_tag" => {
                    return Err(ApiError::bad(
                        SO,
                        "structured_outputs.structural_tag is not supported by Pagoda (yet)",
                    ))
                }
                other => {
                    return Err(ApiError::bad(
                        SO,
                        format!("Unrecognized structured_outputs argument: {other}"),
                    ))
                }
            }
        }
    }
    // `response_format` replaces its field of `structured_outputs` (vLLM's order).
    if let Some(rf) = response_format.filter(|v| !v.is_null()) {
        let kind = rf.get("type").and_then(Value::as_str);
        let set = |kinds: &mut Vec<(&'static str, Constraint)>, name, c| {
            kinds.retain(|(n, _)| *n != name);
            kinds.push((name, c));
        };
        match kind {
            Some("text") => {}
            Some("json_object") => set(&mut kinds, "json_object", Constraint::JsonObject),
            Some("json_schema") => {
                let schema = rf
                    .get("json_schema")
                    .filter(|v| v.is_object())
                    .ok_or_else(|| {
                        ApiError::bad(
                            RF,
                            "response_format.json_schema must be given (an object with `name` \
                             and `schema`) when type is `json_schema`",
                        )
                    })?
                    .get("schema")
                    .filter(|v| !v.is_null())
                    .ok_or_else(|| {
                        ApiError::bad(RF, "response_format.json_schema.schema must be given")
                    })?;
                set(
                    &mut kinds,
                    "json",
                    Constraint::Json(json_schema(schema, RF)?),
                );
            }
            Some("structural_tag") => {
                return Err(ApiError::bad(
                    RF,
                    "response_format type `structural_tag` is not supported by Pagoda (yet)",
                ))
            }
            _ => {
                return Err(ApiError::bad(
                    RF,
                    "response_format.type must be one of `text`, `json_object`, `json_schema`",
                ))
            }
        }
    }
    match kinds.len() {
        0 if so.is_some() => Err(ApiError::bad(
            SO,
            "You must use one kind of structured outputs constraint but none are specified",
        )),
        0 => Ok(None),
        1 => {
            options.constraint = kinds.remove(0).1;
            options.validate()?;
            Ok(Some(options))
        }
        _ => {
            let names: Vec<&str> = kinds.iter().map(|(n, _)| *n).collect();
            Err(ApiError::bad(
                SO,
                format!(
                    "You can only use one kind of structured outputs constraint but multiple \
                     are specified: {}",
                    names.join(", ")
                ),
            ))
        }
    }
}

/// A JSON schema: an object or `true`, or a string holding one (vLLM accepts both).
fn json_schema(v: &Value, param: &str) -> Result<Value, ApiError> {
    let schema = match v {
        Value::String(s) => serde_json::from_str(s)
            .map_err(|e| ApiError::bad(param, format!("the JSON schema is not valid JSON: {e}")))?,
        other => other.clone(),
    };
    match schema {
        Value::Object(_) | Value::Bool(true) => Ok(schema),
        _ => Err(ApiError::bad(
            param,
            "the JSON schema must be an object (or a string holding one)",
        )),
    }
}

fn type_error(field: &str, what: &str) -> ApiError {
    ApiError::bad(SO, format!("structured_outputs.{field} must be {what}"))
}

fn string(v: &Value, field: &str) -> Result<String, ApiError> {
    v.as_str()
        .map(str::to_string)
        .ok_or_else(|| type_error(field, "a string"))
}

fn boolean(v: &Value, field: &str) -> Result<bool, ApiError> {
    v.as_bool().ok_or_else(|| type_error(field, "a boolean"))
}

fn choices(v: &Value) -> Result<Vec<String>, ApiError> {
    let list = v
        .as_array()
        .ok_or_else(|| type_error("choice", "a list of strings"))?;
    list.iter()
        .map(|c| {
            c.as_str()
                .map(str::to_string)
                .ok_or_else(|| type_error("choice", "a list of strings"))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn ok(rf: Value, so: Value) -> Option<StructuredOutputs> {
        parse(Some(&rf), Some(&so)).unwrap()
    }

    fn err(rf: Value, so: Value) -> (String, String) {
        match parse(Some(&rf), Some(&so)) {
            Err(ApiError::BadRequest { message, param }) => (param.unwrap_or_default(), message),
            other => panic!("expected a 400, got {other:?}"),
        }
    }

    #[test]
    fn each_kind_parses() {
        let c = |so| ok(Value::Null, so).unwrap().constraint;
        let schema = json!({"type": "object", "properties": {"a": {"type": "integer"}}});
        assert_eq!(c(json!({"json": schema})), Constraint::Json(schema.clone()));
        assert_eq!(
            c(json!({"json": schema.to_string()})),
            Constraint::Json(schema)
        );
        assert_eq!(
            c(json!({"regex": "[0-9]+"})),
            Constraint::Regex("[0-9]+".into())
        );
        assert_eq!(
            c(json!({"choice": ["a", "b"]})),
            Constraint::Choice(vec!["a".into(), "b".into()])
        );
        assert_eq!(
            c(json!({"grammar": "start: \"x\""})),
            Constraint::Grammar("start: \"x\"".into())
        );
        assert_eq!(c(json!({"json_object": true})), Constraint::JsonObject);
        let o = ok(
            Value::Null,
            json!({"json_object": true, "disable_any_whitespace": true,
                   "disable_additional_properties": true, "whitespace_pattern": " ?", "regex": null}),
        )
        .unwrap();
        assert!(o.disable_any_whitespace && o.disable_additional_properties);
        assert_eq!(o.whitespace_pattern.as_deref(), Some(" ?"));
    }

    #[test]
    fn response_format_maps_to_a_constraint() {
        let schema = json!({"type": "object"});
        assert_eq!(ok(json!({"type": "text"}), Value::Null), None);
        assert_eq!(
            ok(json!({"type": "json_object"}), Value::Null)
                .unwrap()
                .constraint,
            Constraint::JsonObject
        );
        let rf = json!({"type": "json_schema", "json_schema": {"name": "x", "schema": schema, "strict": true}});
        assert_eq!(
            ok(rf.clone(), Value::Null).unwrap().constraint,
            Constraint::Json(schema.clone())
        );
        // response_format replaces the same field of structured_outputs.
        assert_eq!(
            ok(rf, json!({"json": {"type": "string"}}))
                .unwrap()
                .constraint,
            Constraint::Json(schema)
        );
        assert_eq!(parse(None, None).unwrap(), None);
    }

    #[test]
    fn conflicts_and_bad_shapes_are_400s() {
        let (param, msg) = err(Value::Null, json!({"regex": "a", "choice": ["a"]}));
        assert_eq!(param, "structured_outputs");
        assert!(
            msg.starts_with("You can only use one kind of structured outputs constraint"),
            "{msg}"
        );
        let (_, msg) = err(json!({"type": "json_object"}), json!({"regex": "a"}));
        assert!(msg.contains("multiple"), "{msg}");
        let (_, msg) = err(Value::Null, json!({}));
        assert!(msg.contains("none are specified"), "{msg}");
        for (rf, so, param) in [
            (
                Value::Null,
                json!({"json": "{not json"}),
                "structured_outputs",
            ),
            (Value::Null, json!({"json": [1]}), "structured_outputs"),
            (Value::Null, json!({"choice": "a"}), "structured_outputs"),
            (Value::Null, json!({"choice": []}), "structured_outputs"),
            (Value::Null, json!({"regex": 3}), "structured_outputs"),
            (Value::Null, json!({"frob": 1}), "structured_outputs"),
            (
                Value::Null,
                json!({"structural_tag": "{}"}),
                "structured_outputs",
            ),
            (Value::Null, json!("json"), "structured_outputs"),
            (
                json!({"type": "json_schema"}),
                Value::Null,
                "response_format",
            ),
            (
                json!({"type": "json_schema", "json_schema": {"name": "x"}}),
                Value::Null,
                "response_format",
            ),
            (json!({"type": "yaml"}), Value::Null, "response_format"),
        ] {
            assert_eq!(err(rf.clone(), so.clone()).0, param, "{rf} {so}");
        }
    }
}
