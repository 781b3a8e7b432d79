//! `pythonic`: Llama 3.2/4 and others write calls as a Python list,
//! `[get_weather(city="Paris", days=3), now()]`, optionally inside
//! `<|python_start|>`…`<|python_end|>`. Keyword arguments are Python literals
//! (strings, numbers, `True`/`False`/`None`, lists, dicts, tuples), turned into
//! JSON. An output that does not start with the list is content, and so is one
//! whose list turns out not to be calls.

use super::{Cursor, Mode, Step, ToolParser, ToolParserEntry};
use serde_json::{Map, Number, Value};

const START: &str = "<|python_start|>";
const END: &str = "<|python_end|>";

pub struct Pythonic;

inventory::submit! { ToolParserEntry { name: "pythonic", parser: &Pythonic } }

/// Why the text is not (yet) a list of calls.
#[derive(Debug, PartialEq)]
enum Stop {
    /// It ends before the list does.
    Eof,
    /// It can never be one.
    Bad,
}

type R<T> = Result<T, Stop>;

struct P<'a> {
    s: &'a [u8],
    i: usize,
}

impl<'a> P<'a> {
    fn ws(&mut self) {
        while self.i < self.s.len() && self.s[self.i].is_ascii_whitespace() {
            self.i += 1;
        }
    }
    fn peek(&mut self) -> R<u8> {
        self.ws();
        self.s.get(self.i).copied().ok_or(Stop::Eof)
    }
    fn eat(&mut self, c: u8) -> R<()> {
        if self.peek()? == c {
            self.i += 1;
            Ok(())
        } else {
            Err(Stop::Bad)
        }
    }
    /// An identifier; running into the end means it may still grow.
    fn ident(&mut self) -> R<String> {
        self.ws();
        let start = self.i;
        while self.i < self.s.len()
            && (self.s[self.i].is_ascii_alphanumeric() || self.s[self.i] == b'_')
        {
            self.i += 1;
        }
        if self.i == self.s.len() {
            return Err(Stop::Eof);
        }
        if self.i == start || self.s[start].is_ascii_digit() {
            return Err(Stop::Bad);
        }
        Ok(String::from_utf8_lossy(&self.s[start..self.i]).into_owned())
    }

    fn list(&mut self) -> R<Vec<(String, String)>> {
        self.eat(b'[')?;
        let mut calls = Vec::new();
        if self.peek()? == b']' {
            self.i += 1;
            return Ok(calls);
        }
        loop {
            calls.push(self.call()?);
            match self.peek()? {
                b',' => self.i += 1,
                b']' => {
                    self.i += 1;
                    return Ok(calls);
                }
                _ => return Err(Stop::Bad),
            }
        }
    }

    fn call(&mut self) -> R<(String, String)> {
        let mut name = self.ident()?;
        while self.peek()? == b'.' {
            self.i += 1;
            name.push('.');
            name.push_str(&self.ident()?);
        }
        self.eat(b'(')?;
        let mut args = Map::new();
        loop {
            if self.peek()? == b')' {
                self.i += 1;
                return Ok((name, Value::Object(args).to_string()));
            }
            let key = self.ident()?;
            self.eat(b'=')?;
            let v = self.literal()?;
            args.insert(key, v);
            match self.peek()? {
                b',' => self.i += 1,
                b')' => {}
                _ => return Err(Stop::Bad),
            }
        }
    }

    fn literal(&mut self) -> R<Value> {
        match self.peek()? {
            b'"' | b'\'' => self.string().map(Value::String),
            b'[' | b'(' => {
                let close = if self.s[self.i] == b'[' { b']' } else { b')' };
                self.i += 1;
                let mut items = Vec::new();
                loop {
                    if self.peek()? == close {
                        self.i += 1;
                        return Ok(Value::Array(items));
                    }
                    items.push(self.literal()?);
                    match self.peek()? {
                        b',' => self.i += 1,
                        c if c == close => {}
                        _ => return Err(Stop::Bad),
                    }
                }
            }
            b'{' => {
                self.i += 1;
                let mut m = Map::new();
                loop {
                    if self.peek()? == b'}' {
                        self.i += 1;
                        return Ok(Value::Object(m));
                    }
                    let k = match self.literal()? {
                        Value::String(s) => s,
                        other => other.to_string(),
                    };
                    self.eat(b':')?;
                    m.insert(k, self.literal()?);
                    match self.peek()? {
                        b',' => self.i += 1,
                        b'}' => {}
                        _ => return Err(Stop::Bad),
                    }
                }
            }
            b'-' | b'0'..=b'9' => self.number(),
            _ => match self.ident()?.as_str() {
                "True" | "true" => Ok(Value::Bool(true)),
                "False" | "false" => Ok(Value::Bool(false)),
                "None" | "null" => Ok(Value::Null),
                _ => Err(Stop::Bad),
            },
        }
    }

    fn number(&mut self) -> R<Value> {
        let start = self.i;
        self.i += 1;
        while self.i < self.s.len()
            && (self.s[self.i].is_ascii_digit()
                || matches!(self.s[self.i], b'.' | b'e' | b'E' | b'+' | b'-'))
        {
            self.i += 1;
        }
        if self.i == self.s.len() {
            return Err(Stop::Eof);
        }
        let t = std::str::from_utf8(&self.s[start..self.i]).map_err(|_| Stop::Bad)?;
        if let Ok(n) = t.parse::<i64>() {
            return Ok(Value::Number(n.into()));
        }
        t.parse::<f64>()
            .ok()
            .and_then(Number::from_f64)
            .map(Value::Number)
            .ok_or(Stop::Bad)
    }

    fn string(&mut self) -> R<String> {
        let q = self.s[self.i];
        self.i += 1;
        let mut out = Vec::new();
        loop {
            let c = *self.s.get(self.i).ok_or(Stop::Eof)?;
            self.i += 1;
            match c {
                b'\\' => {
                    let e = *self.s.get(self.i).ok_or(Stop::Eof)?;
                    self.i += 1;
                    out.push(match e {
                        b'n' => b'\n',
                        b't' => b'\t',
                        b'r' => b'\r',
                        other => other,
                    });
                }
                c if c == q => return String::from_utf8(out).map_err(|_| Stop::Bad),
                c => out.push(c),
            }
        }
    }
}

/// The list of calls at the start of `t`, and its length.
fn parse_list(t: &str) -> R<(Vec<(String, String)>, usize)> {
    let mut p = P {
        s: t.as_bytes(),
        i: 0,
    };
    let calls = p.list()?;
    Ok((calls, p.i))
}

impl ToolParser for Pythonic {
    fn step(&self, text: &str, cur: &mut Cursor, fin: bool) -> Step {
        let mut s = Step::default();
        let mut pos = 0;
        loop {
            let rest = &text[pos..];
            let t = rest.trim_start();
            let ws = rest.len() - t.len();
            match cur.mode {
                Mode::Undecided => {
                    if t.starts_with(START) {
                        cur.mode = Mode::Calls;
                        pos += ws + START.len();
                    } else if t.starts_with('[') {
                        cur.mode = Mode::Calls;
                        pos += ws;
                    } else if !fin && (t.is_empty() || START.starts_with(t)) {
                        break;
                    } else {
                        cur.mode = Mode::Content;
                    }
                }
                Mode::Calls => match parse_list(rest) {
                    Ok((calls, n)) => {
                        for (name, args) in calls {
                            s.call(name, args);
                        }
                        cur.after_call = true;
                        cur.mode = Mode::Content;
                        pos += n;
                    }
                    Err(Stop::Eof) if !fin => break,
                    Err(_) => cur.mode = Mode::Content,
                },
                Mode::Content if cur.after_call => {
                    if t.starts_with(END) {
                        pos += ws + END.len();
                        cur.after_call = false;
                    } else if !fin && (t.is_empty() || END.starts_with(t)) {
                        break;
                    } else if t.is_empty() {
                        pos = text.len();
                        break;
                    } else {
                        cur.after_call = false;
                    }
                }
                Mode::Content => {
                    s.content(rest);
                    pos = text.len();
                    break;
                }
            }
        }
        s.settled = pos;
        s
    }
}
