//! Chat templates: renders a Hugging Face Jinja chat template (from
//! `tokenizer_config.json` or GGUF `tokenizer.chat_template`) with minijinja.
//!
//! HF renders templates with Jinja2 in a sandbox with `trim_blocks` and
//! `lstrip_blocks`, a `raise_exception` function, and Python string/dict methods
//! (`.strip()`, `.items()`, ...); we mirror those so common templates render the same.

use crate::error::ModelError;
use minijinja::value::{Kwargs, Value, ValueKind};
use minijinja::{context, Environment, Error, ErrorKind, State};
use serde::{Deserialize, Serialize};

/// One chat message as the OpenAI API and HF templates see it.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
pub struct ChatMessage {
    pub role: String,
    pub content: String,
}

/// A compiled chat template.
pub struct ChatTemplate {
    env: Environment<'static>,
    bos: Option<String>,
    eos: Option<String>,
    source: String,
}

impl std::fmt::Debug for ChatTemplate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChatTemplate")
            .field("bos", &self.bos)
            .field("eos", &self.eos)
            .finish_non_exhaustive()
    }
}

impl Clone for ChatTemplate {
    fn clone(&self) -> Self {
        Self::new(self.source.clone(), self.bos.clone(), self.eos.clone())
            .expect("template compiled once already")
    }
}

const NAME: &str = "chat";

fn err(e: impl std::fmt::Display) -> ModelError {
    ModelError::ChatTemplate {
        message: e.to_string(),
    }
}

impl ChatTemplate {
    /// Compiles `source`; `bos`/`eos` are the token strings exposed as `bos_token` and
    /// `eos_token`.
    pub fn new(
        source: String,
        bos: Option<String>,
        eos: Option<String>,
    ) -> Result<Self, ModelError> {
        let mut env = Environment::new();
        env.set_trim_blocks(true);
        env.set_lstrip_blocks(true);
        env.add_function("raise_exception", |msg: String| -> Result<Value, Error> {
            Err(Error::new(ErrorKind::InvalidOperation, msg))
        });
        env.add_function("strftime_now", strftime_now);
        env.set_unknown_method_callback(python_method);
        env.add_template_owned(NAME, source.clone()).map_err(err)?;
        Ok(ChatTemplate {
            env,
            bos,
            eos,
            source,
        })
    }

    /// The template text.
    pub fn source(&self) -> &str {
        &self.source
    }

    /// Renders the conversation; with `add_generation_prompt` the text ends where the
    /// assistant's reply should begin.
    pub fn render(
        &self,
        messages: &[ChatMessage],
        add_generation_prompt: bool,
    ) -> Result<String, ModelError> {
        self.render_with(messages, add_generation_prompt, None)
    }

    /// [`ChatTemplate::render`] with extra template variables (vLLM's
    /// `chat_template_kwargs`, e.g. `enable_thinking`); the standard variables
    /// (`messages`, `add_generation_prompt`, `bos_token`, `eos_token`) win over them.
    pub fn render_with(
        &self,
        messages: &[ChatMessage],
        add_generation_prompt: bool,
        kwargs: Option<&serde_json::Map<String, serde_json::Value>>,
    ) -> Result<String, ModelError> {
        self.render_messages(messages, add_generation_prompt, None, kwargs)
    }

    /// [`ChatTemplate::render_with`] over messages of any shape (OpenAI's, with
    /// `tool_calls`, `tool_call_id`, `name`, ... as tool-use templates read them)
    /// and the request's `tools` (the template variable `tools`: none when
    /// `None`, as HF passes it).
    pub fn render_messages<M: Serialize + ?Sized>(
        &self,
        messages: &M,
        add_generation_prompt: bool,
        tools: Option<&serde_json::Value>,
        kwargs: Option<&serde_json::Map<String, serde_json::Value>>,
    ) -> Result<String, ModelError> {
        let tmpl = self.env.get_template(NAME).map_err(err)?;
        let extra = Value::from_serialize(kwargs.cloned().unwrap_or_default());
        let tools = tools.map(Value::from_serialize);
        tmpl.render(context! {
            messages => Value::from_serialize(messages),
            add_generation_prompt => add_generation_prompt,
            bos_token => self.bos.as_deref().unwrap_or(""),
            eos_token => self.eos.as_deref().unwrap_or(""),
            tools => tools,
            ..extra
        })
        .map_err(err)
    }
}

/// Python `str`/`dict` methods that HF templates call and minijinja lacks.
fn python_method(
    state: &State<'_, '_>,
    value: &Value,
    method: &str,
    args: &[Value],
) -> Result<Value, Error> {
    let arg_str = |i: usize| args.get(i).and_then(|v| v.as_str().map(str::to_string));
    if let Some(s) = value.as_str() {
        let chars = arg_str(0);
        let trim_set = |c: char| {
            chars
                .as_deref()
                .map_or(c.is_whitespace(), |set| set.contains(c))
        };
        return Ok(match method {
            "strip" => Value::from(s.trim_matches(trim_set)),
            "lstrip" => Value::from(s.trim_start_matches(trim_set)),
            "rstrip" => Value::from(s.trim_end_matches(trim_set)),
            "upper" => Value::from(s.to_uppercase()),
            "lower" => Value::from(s.to_lowercase()),
            "startswith" => Value::from(arg_str(0).is_some_and(|p| s.starts_with(p.as_str()))),
            "endswith" => Value::from(arg_str(0).is_some_and(|p| s.ends_with(p.as_str()))),
            "replace" => match (arg_str(0), arg_str(1)) {
                (Some(a), Some(b)) => Value::from(s.replace(&a, &b)),
                _ => {
                    return Err(Error::new(
                        ErrorKind::InvalidOperation,
                        "replace needs two strings",
                    ))
                }
            },
            "split" => match arg_str(0) {
                Some(sep) => {
                    Value::from(s.split(sep.as_str()).map(Value::from).collect::<Vec<_>>())
                }
                None => Value::from(s.split_whitespace().map(Value::from).collect::<Vec<_>>()),
            },
            _ => return Err(Error::from(ErrorKind::UnknownMethod)),
        });
    }
    if value.kind() == ValueKind::Map {
        return match method {
            "items" => state.apply_filter("items", std::slice::from_ref(value)),
            "keys" => Ok(Value::from(value.try_iter()?.collect::<Vec<_>>())),
            "values" => Ok(Value::from(
                value
                    .try_iter()?
                    .map(|k| value.get_item(&k).unwrap_or_default())
                    .collect::<Vec<_>>(),
            )),
            "get" => {
                let key = args.first().cloned().unwrap_or_default();
                let v = value.get_item(&key).unwrap_or_default();
                Ok(if v.is_undefined() {
                    args.get(1).cloned().unwrap_or(Value::from(()))
                } else {
                    v
                })
            }
            _ => Err(Error::from(ErrorKind::UnknownMethod)),
        };
    }
    Err(Error::from(ErrorKind::UnknownMethod))
}

/// `strftime_now(fmt)` as HF provides it (Llama 3.x templates), UTC, supporting the
/// common `%d %m %Y %b %B %H %M %S` directives.
fn strftime_now(fmt: String, _kw: Kwargs) -> Result<Value, Error> {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    let (y, mo, d) = civil_from_days((secs / 86400) as i64);
    let tod = secs % 86400;
    const MONTHS: [&str; 12] = [
        "January",
        "February",
        "March",
        "April",
        "May",
        "June",
        "July",
        "August",
        "September",
        "October",
        "November",
        "December",
    ];
    let mut out = String::new();
    let mut it = fmt.chars();
    while let Some(c) = it.next() {
        if c != '%' {
            out.push(c);
            continue;
        }
        match it.next() {
            Some('d') => out += &format!("{d:02}"),
            Some('m') => out += &format!("{mo:02}"),
            Some('Y') => out += &format!("{y}"),
            Some('b') => out += &MONTHS[mo as usize - 1][..3],
            Some('B') => out += MONTHS[mo as usize - 1],
            Some('H') => out += &format!("{:02}", tod / 3600),
            Some('M') => out += &format!("{:02}", tod / 60 % 60),
            Some('S') => out += &format!("{:02}", tod % 60),
            Some('%') => out.push('%'),
            Some(o) => {
                return Err(Error::new(
                    ErrorKind::InvalidOperation,
                    format!("strftime_now: unsupported %{o}"),
                ))
            }
            None => out.push('%'),
        }
    }
    Ok(Value::from(out))
}

/// Days since 1970-01-01 to (year, month, day) in the proleptic Gregorian calendar
/// (Howard Hinnant's civil-from-days algorithm).
fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    (yoe + era * 400 + i64::from(m <= 2), m, d)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn msg(role: &str, content: &str) -> ChatMessage {
        ChatMessage {
            role: role.into(),
            content: content.into(),
        }
    }

    #[test]
    fn civil_dates() {
        assert_eq!(civil_from_days(0), (1970, 1, 1));
        assert_eq!(civil_from_days(19_782), (2024, 2, 29));
        assert_eq!(civil_from_days(-1), (1969, 12, 31));
    }

    #[test]
    fn python_methods_and_raise() {
        let t = ChatTemplate::new(
            "{% for m in messages %}{{ m['content'].strip() | upper }}|{{ m.role.startswith('us') }}\n{% endfor %}{% if messages | length > 1 %}{{ raise_exception('too many') }}{% endif %}".into(),
            None,
            None,
        )
        .unwrap();
        assert_eq!(
            t.render(&[msg("user", "  hi  ")], false).unwrap(),
            "HI|True\n"
        );
        let e = t
            .render(&[msg("user", "a"), msg("user", "b")], false)
            .unwrap_err();
        assert!(e.to_string().contains("too many"), "{e}");
    }

    #[test]
    fn bad_template_is_an_error() {
        assert!(matches!(
            ChatTemplate::new("{% for %}".into(), None, None),
            Err(ModelError::ChatTemplate { .. })
        ));
    }

    #[test]
    fn bos_eos_and_tojson() {
        let t = ChatTemplate::new(
            "{{ bos_token }}{{ messages[0] | tojson }}{{ eos_token }}".into(),
            Some("<s>".into()),
            Some("</s>".into()),
        )
        .unwrap();
        let out = t.render(&[msg("user", "x")], true).unwrap();
        assert!(
            out.starts_with("<s>{") && out.ends_with("}</s>") && out.contains("\"role\""),
            "{out}"
        );
    }

    /// Tool-use templates read `tools` and the messages' `tool_calls` (arguments
    /// as a mapping) and `tool_call_id`.
    #[test]
    fn tools_and_tool_calls_reach_the_template() {
        let t = ChatTemplate::new(
            "{% if tools %}{% for t in tools %}[{{ t.function.name }}]{% endfor %}{% endif %}\
             {% for m in messages %}{{ m.role }}:{{ m.content }}\
             {% for c in m.tool_calls or [] %}<{{ c.function.name }} {{ c.function.arguments.city }}>{% endfor %}\
             {% if m.tool_call_id %}#{{ m.tool_call_id }}{% endif %};{% endfor %}"
                .into(),
            None,
            None,
        )
        .unwrap();
        let msgs = serde_json::json!([
            {"role": "assistant", "content": "", "tool_calls": [{"id": "c1", "type": "function",
             "function": {"name": "w", "arguments": {"city": "Paris"}}}]},
            {"role": "tool", "content": "sunny", "tool_call_id": "c1"},
        ]);
        let tools = serde_json::json!([{"type": "function", "function": {"name": "w"}}]);
        let out = t.render_messages(&msgs, false, Some(&tools), None).unwrap();
        assert_eq!(out, "[w]assistant:<w Paris>;tool:sunny#c1;");
        let out = t.render_messages(&msgs, false, None, None).unwrap();
        assert!(out.starts_with("assistant:"), "{out}");
    }
}
