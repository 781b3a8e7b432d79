//! `tools` and `tool_choice` of a chat request, checked, and what each choice
//! asks of the output: `auto` reads it with the `--tool-call-parser`;
//! `required` and a named function constrain it through structured outputs (a
//! JSON schema built from the tools' parameters, as vLLM builds it), so the
//! arguments always validate, and read it with the parsers below.

use super::{json_call, Cursor, JsonCall, Mode, Step, ToolParser};
use crate::serve::error::ApiError;
use serde_json::{json, Value};

/// One function tool of the request.
#[derive(Debug, Clone, PartialEq)]
pub struct ToolSpec {
    pub name: String,
    /// Its JSON schema (`{"type": "object", "properties": {}}` when absent).
    pub parameters: Value,
}

/// `tool_choice`.
#[derive(Debug, Clone, PartialEq)]
pub enum ToolChoice {
    None,
    Auto,
    Required,
    Named(String),
}

/// Checks `tools`: a list of `{"type": "function", "function": {"name", ...}}`.
pub fn parse_tools(v: Option<&Value>) -> Result<Vec<ToolSpec>, ApiError> {
    let Some(v) = v.filter(|v| !v.is_null()) else {
        return Ok(Vec::new());
    };
    let list = v
        .as_array()
        .ok_or_else(|| ApiError::bad("tools", "tools must be a list"))?;
    list.iter()
        .enumerate()
        .map(|(i, t)| {
            let kind = t.get("type").and_then(Value::as_str);
            if kind != Some("function") {
                return Err(ApiError::bad(
                    "tools",
                    format!("tools[{i}].type must be \"function\""),
                ));
            }
            let f = t.get("function").filter(|f| f.is_object()).ok_or_else(|| {
                ApiError::bad("tools", format!("tools[{i}].function must be an object"))
            })?;
            let name = f
                .get("name")
                .and_then(Value::as_str)
                .filter(|n| !n.is_empty())
                .ok_or_else(|| {
                    ApiError::bad(
                        "tools",
                        format!("tools[{i}].function.name must be a non-empty string"),
                    )
                })?;
            let parameters = match f.get("parameters") {
                None | Some(Value::Null) => json!({"type": "object", "properties": {}}),
                Some(p @ Value::Object(_)) => p.clone(),
                Some(_) => {
                    return Err(ApiError::bad(
                        "tools",
                        format!("tools[{i}].function.parameters must be a JSON schema object"),
                    ))
                }
            };
            Ok(ToolSpec {
                name: name.to_string(),
                parameters,
            })
        })
        .collect()
}

/// Checks `tool_choice` against the tools; its default is `auto` with tools and
/// `none` without, as in vLLM.
pub fn parse_choice(v: Option<&Value>, tools: &[ToolSpec]) -> Result<ToolChoice, ApiError> {
    let bad = |m: String| ApiError::bad("tool_choice", m);
    let choice = match v.filter(|v| !v.is_null()) {
        None if tools.is_empty() => ToolChoice::None,
        None => ToolChoice::Auto,
        Some(Value::String(s)) => match s.as_str() {
            "none" => ToolChoice::None,
            "auto" => ToolChoice::Auto,
            "required" => ToolChoice::Required,
            other => {
                return Err(bad(format!(
                    "tool_choice must be \"none\", \"auto\", \"required\" or a named function, got \"{other}\""
                )))
            }
        },
        Some(obj @ Value::Object(_)) => {
            let name = obj
                .get("function")
                .and_then(|f| f.get("name"))
                .and_then(Value::as_str)
                .filter(|_| obj.get("type").and_then(Value::as_str) == Some("function"))
                .ok_or_else(|| {
                    bad("a named tool_choice is {\"type\": \"function\", \"function\": {\"name\": ...}}".into())
                })?;
            ToolChoice::Named(name.to_string())
        }
        Some(_) => return Err(bad("tool_choice must be a string or an object".into())),
    };
    match &choice {
        ToolChoice::Required | ToolChoice::Auto if tools.is_empty() && v.is_some() => {
            Err(bad("When using `tool_choice`, `tools` must be set.".into()))
        }
        ToolChoice::Named(n) if !tools.iter().any(|t| &t.name == n) => {
            Err(bad(format!("Tool '{n}' has not been passed in `tools`.")))
        }
        _ => Ok(choice),
    }
}

/// The JSON schema that `required` or a named function constrains the output
/// to (None for `none` and `auto`).
pub fn schema(choice: &ToolChoice, tools: &[ToolSpec], parallel: bool) -> Option<Value> {
    match choice {
        ToolChoice::None | ToolChoice::Auto => None,
        ToolChoice::Named(n) => tools
            .iter()
            .find(|t| &t.name == n)
            .map(|t| t.parameters.clone()),
        ToolChoice::Required => {
            let any_of: Vec<Value> = tools
                .iter()
                .map(|t| {
                    json!({
                        "properties": {
                            "name": {"type": "string", "enum": [t.name]},
                            "parameters": t.parameters,
                        },
                        "required": ["name", "parameters"],
                    })
                })
                .collect();
            let mut s = json!({
                "type": "array",
                "minItems": 1,
                "items": {"type": "object", "anyOf": any_of},
            });
            if !parallel {
                s["maxItems"] = json!(1);
            }
            Some(s)
        }
    }
}

/// Reads `required`'s output, a JSON list of `{"name", "parameters"}`.
pub struct RequiredParser;

impl ToolParser for RequiredParser {
    fn step(&self, text: &str, cur: &mut Cursor, fin: bool) -> Step {
        let mut s = Step::default();
        let mut pos = 0;
        loop {
            let rest = &text[pos..];
            if cur.mode == Mode::Content {
                s.content(rest);
                pos = text.len();
                break;
            }
            let t = rest
                .trim_start_matches(|c: char| c.is_whitespace() || matches!(c, '[' | ',' | ']'));
            pos += rest.len() - t.len();
            if t.is_empty() {
                break;
            }
            match json_call(t, fin, &mut s) {
                JsonCall::Call(n) => pos += n,
                JsonCall::Wait => break,
                JsonCall::NotACall => cur.mode = Mode::Content,
            }
        }
        s.settled = pos;
        s
    }
}

/// Reads a named function's output: all of it is that call's arguments, which
/// stream as they come (the schema keeps them valid).
pub struct NamedParser(pub String);

impl ToolParser for NamedParser {
    fn step(&self, text: &str, cur: &mut Cursor, _fin: bool) -> Step {
        let mut s = Step::default();
        if cur.mode == Mode::Undecided {
            cur.mode = Mode::Calls;
            s.items.push(super::Item::CallStart {
                name: self.0.clone(),
            });
        }
        if !text.is_empty() {
            s.items.push(super::Item::Args(text.to_string()));
        }
        s.settled = text.len();
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tools() -> Vec<ToolSpec> {
        parse_tools(Some(&json!([
            {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}},
            {"type": "function", "function": {"name": "now"}}
        ])))
        .unwrap()
    }

    #[test]
    fn choices_are_checked() {
        let t = tools();
        assert_eq!(parse_choice(None, &t).unwrap(), ToolChoice::Auto);
        assert_eq!(parse_choice(None, &[]).unwrap(), ToolChoice::None);
        assert_eq!(
            parse_choice(
                Some(&json!({"type": "function", "function": {"name": "now"}})),
                &t
            )
            .unwrap(),
            ToolChoice::Named("now".into())
        );
        for bad in [
            json!("sometimes"),
            json!({"type": "function", "function": {"name": "x"}}),
            json!(3),
        ] {
            let e = parse_choice(Some(&bad), &t).unwrap_err();
            assert_eq!(e.param(), Some("tool_choice"), "{bad}");
        }
        assert!(parse_choice(Some(&json!("required")), &[]).is_err());
        let e = parse_tools(Some(&json!([{"type": "function", "function": {}}]))).unwrap_err();
        assert_eq!(e.param(), Some("tools"));
    }

    #[test]
    fn required_schema_lists_every_tool() {
        let s = schema(&ToolChoice::Required, &tools(), false).unwrap();
        assert_eq!(s["maxItems"], 1);
        assert_eq!(s["items"]["anyOf"].as_array().unwrap().len(), 2);
        assert_eq!(
            s["items"]["anyOf"][1]["properties"]["name"]["enum"][0],
            "now"
        );
        assert!(schema(&ToolChoice::Required, &tools(), true)
            .unwrap()
            .get("maxItems")
            .is_none());
    }
}
