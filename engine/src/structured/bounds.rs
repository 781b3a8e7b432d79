//! Cheap static bounds on a structured-output constraint, checked before
//! llguidance sees it, so that no constraint can overflow a compile thread's stack
//! or blow up when its lexer is built.
//!
//! * **Depth.** llguidance compiles JSON schemas and Lark grammars recursively: a
//!   chain of 700 `$ref`s (24 KB) or 1000 Lark rules (12 KB) overflowed a 2 MiB
//!   thread stack, and a stack overflow aborts the whole process. [`schema_depth`]
//!   and [`lark_depth`] measure the longest chain (nesting plus `$ref` edges, or
//!   rule references) with a walk whose own recursion stops at the limit, so the
//!   check itself is safe on any stack; the compile threads' stack is sized so
//!   that a constraint at the limit provably compiles (`tests/structured_bounds.rs`).
//!   Cycles (recursive schemas and grammars) do not count: llguidance expands them
//!   lazily, one level per generated token.
//! * **Regex size.** A repetition multiplies its body: `(a{1000}){1000}` is a
//!   million-state lexeme that failed only after the request was queued, when its
//!   first token was consumed. [`regex_size`] is the size of a regex with every
//!   counted repetition expanded; constraints whose regexes (the `regex`
//!   constraint, `choice`, JSON `pattern`s, `whitespace_pattern`) exceed the limit
//!   are refused.

use serde_json::Value;
use std::collections::{HashMap, HashSet};

/// The chain was longer than the limit (the walk stopped there).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TooDeep;

/// Height of a JSON schema: the longest path from the root through nested
/// objects/arrays and local `$ref`s (`#`, `#/json/pointer`), each object or array
/// counting one level. Refs into a cycle count 0 (they are recursion, expanded
/// lazily). Stops with [`TooDeep`] as soon as a path exceeds `limit`.
pub fn schema_depth(root: &Value, limit: usize) -> Result<usize, TooDeep> {
    let mut walk = SchemaWalk {
        root,
        limit,
        memo: HashMap::new(),
        active: HashSet::new(),
    };
    walk.height(root, 0)
}

struct SchemaWalk<'a> {
    root: &'a Value,
    limit: usize,
    /// Heights of `$ref` targets already measured, by their reference string.
    memo: HashMap<&'a str, usize>,
    /// `$ref` targets on the current path (a ref back into one is a cycle).
    active: HashSet<&'a str>,
}

impl<'a> SchemaWalk<'a> {
    /// Height of `v`, which sits `depth` levels below the root of the walk.
    fn height(&mut self, v: &'a Value, depth: usize) -> Result<usize, TooDeep> {
        let children: Box<dyn Iterator<Item = &'a Value>> = match v {
            Value::Object(o) => Box::new(o.values()),
            Value::Array(a) => Box::new(a.iter()),
            _ => return Ok(0),
        };
        if depth >= self.limit {
            return Err(TooDeep);
        }
        let mut h = 0;
        for c in children {
            h = h.max(self.height(c, depth + 1)?);
        }
        if let Some(r) = v.get("$ref").and_then(Value::as_str) {
            h = h.max(self.ref_height(r, depth + 1)?);
        }
        Ok(h + 1)
    }

    fn ref_height(&mut self, r: &'a str, depth: usize) -> Result<usize, TooDeep> {
        if let Some(&h) = self.memo.get(r) {
            if depth + h > self.limit {
                return Err(TooDeep);
            }
            return Ok(h);
        }
        if self.active.contains(r) {
            return Ok(0);
        }
        let Some(target) = resolve_pointer(self.root, r) else {
            // Remote, anchor or dangling refs: llguidance reports those itself.
            return Ok(0);
        };
        self.active.insert(r);
        let h = self.height(target, depth);
        self.active.remove(r);
        let h = h?;
        self.memo.insert(r, h);
        Ok(h)
    }
}

/// The value a local `$ref` (`#` or `#/a/b`, RFC 6901 escapes, percent-encoding)
/// points at; None for any other kind of reference.
fn resolve_pointer<'a>(root: &'a Value, r: &str) -> Option<&'a Value> {
    let frag = r.strip_prefix('#')?;
    if frag.is_empty() {
        return Some(root);
    }
    let frag = frag.strip_prefix('/')?;
    let mut v = root;
    for raw in frag.split('/') {
        let part = percent_decode(raw).replace("~1", "/").replace("~0", "~");
        v = match v {
            Value::Object(o) => o.get(&part)?,
            Value::Array(a) => a.get(part.parse::<usize>().ok()?)?,
            _ => return None,
        };
    }
    Some(v)
}

fn percent_decode(s: &str) -> String {
    if !s.contains('%') {
        return s.to_string();
    }
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        let hex = |c: u8| (c as char).to_digit(16);
        match (
            b[i],
            b.get(i + 1).and_then(|&c| hex(c)),
            b.get(i + 2).and_then(|&c| hex(c)),
        ) {
            (b'%', Some(h), Some(l)) => {
                out.push((h * 16 + l) as u8);
                i += 3;
            }
            (c, _, _) => {
                out.push(c);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Longest chain of rule references in a Lark grammar (llguidance's dialect;
/// GBNF arrives here converted), counting each rule once per chain; references
/// into a cycle count 0. Rules are `name: ...` or `name ::= ...` at the start of a
/// line (continuation lines start with `|`); string literals, `/regex/` literals
/// and comments are skipped. Stops with [`TooDeep`] past `limit`.
pub fn lark_depth(grammar: &str, limit: usize) -> Result<usize, TooDeep> {
    let rules = lark_rules(grammar);
    let index: HashMap<&str, usize> = rules
        .iter()
        .enumerate()
        .map(|(i, (n, _))| (n.as_str(), i))
        .collect();
    let edges: Vec<Vec<usize>> = rules
        .iter()
        .map(|(_, refs)| {
            refs.iter()
                .filter_map(|r| index.get(r.as_str()).copied())
                .collect()
        })
        .collect();
    let mut walk = RuleWalk {
        edges: &edges,
        limit,
        memo: vec![None; edges.len()],
        active: vec![false; edges.len()],
    };
    let mut h = 0;
    for r in 0..edges.len() {
        h = h.max(walk.height(r, 0)?);
    }
    Ok(h)
}

struct RuleWalk<'a> {
    edges: &'a [Vec<usize>],
    limit: usize,
    memo: Vec<Option<usize>>,
    active: Vec<bool>,
}

impl RuleWalk<'_> {
    fn height(&mut self, r: usize, depth: usize) -> Result<usize, TooDeep> {
        if let Some(h) = self.memo[r] {
            return if depth + h > self.limit {
                Err(TooDeep)
            } else {
                Ok(h)
            };
        }
        if self.active[r] {
            return Ok(0);
        }
        if depth >= self.limit {
            return Err(TooDeep);
        }
        self.active[r] = true;
        let mut h = 0;
        let mut result = Ok(());
        for i in 0..self.edges[r].len() {
            match self.height(self.edges[r][i], depth + 1) {
                Ok(c) => h = h.max(c),
                Err(e) => {
                    result = Err(e);
                    break;
                }
            }
        }
        self.active[r] = false;
        result?;
        self.memo[r] = Some(h + 1);
        Ok(h + 1)
    }
}

/// The rules of a Lark grammar with the identifiers their bodies mention.
fn lark_rules(text: &str) -> Vec<(String, Vec<String>)> {
    let mut rules: Vec<(String, Vec<String>)> = Vec::new();
    for line in text.lines() {
        let toks = lark_line_tokens(line);
        // `NAME: ...`, or `NAME.2: ...` (a priority, lexed as a second identifier).
        let head = match toks.as_slice() {
            [LTok::Ident(_), LTok::Define, ..] => 2,
            [LTok::Ident(_), LTok::Ident(p), LTok::Define, ..]
                if p.chars().all(|c| c.is_ascii_digit()) =>
            {
                3
            }
            _ => 0,
        };
        let mut it = toks.into_iter();
        if head > 0 {
            if let Some(LTok::Ident(name)) = it.next() {
                // `?rule` and `!rule` modifiers are not part of the name.
                let name = name.trim_start_matches(['?', '!']).to_string();
                rules.push((name, Vec::new()));
            }
            for _ in 1..head {
                it.next();
            }
        }
        if let Some((_, refs)) = rules.last_mut() {
            refs.extend(it.filter_map(|t| match t {
                LTok::Ident(s) => Some(s),
                LTok::Define | LTok::Regex(_) => None,
            }));
        }
    }
    rules
}

enum LTok {
    Ident(String),
    Define,
    /// The inside of a `/regex/` literal.
    Regex(String),
}

/// Identifiers and `:`/`::=` of one line, outside literals and comments.
fn lark_line_tokens(line: &str) -> Vec<LTok> {
    let chars: Vec<char> = line.chars().collect();
    let mut out = Vec::new();
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        match c {
            '"' | '\'' => i = skip_quoted(&chars, i, c),
            '/' if chars.get(i + 1) == Some(&'/') => break,
            '#' => break,
            '/' => {
                let end = skip_quoted(&chars, i, '/');
                let body = &chars[i + 1..end.saturating_sub(1).max(i + 1)];
                out.push(LTok::Regex(body.iter().collect()));
                i = end;
            }
            ':' => {
                // `::=` (GBNF) or `:` (Lark); `::` alone is not a definition.
                if chars.get(i + 1) == Some(&':') && chars.get(i + 2) == Some(&'=') {
                    i += 3;
                } else {
                    i += 1;
                }
                out.push(LTok::Define);
            }
            c if c.is_alphanumeric() || c == '_' || ((c == '?' || c == '!') && out.is_empty()) => {
                let start = i;
                i += 1;
                while i < chars.len() && (chars[i].is_alphanumeric() || chars[i] == '_') {
                    i += 1;
                }
                out.push(LTok::Ident(chars[start..i].iter().collect()));
            }
            _ => i += 1,
        }
    }
    out
}

/// The `/regex/` literals of a Lark grammar (for [`regex_size`]).
pub fn lark_regexes(grammar: &str) -> Vec<String> {
    grammar
        .lines()
        .flat_map(lark_line_tokens)
        .filter_map(|t| match t {
            LTok::Regex(r) => Some(r),
            _ => None,
        })
        .collect()
}

/// The JSON schemas a Lark grammar embeds (`%json { ... }`), for [`schema_depth`]
/// and [`schema_patterns`]; ones that do not parse are llguidance's to report.
pub fn lark_json_schemas(grammar: &str) -> Vec<Value> {
    let mut out = Vec::new();
    let mut rest = grammar;
    while let Some(at) = rest.find("%json") {
        rest = &rest[at + "%json".len()..];
        let mut it = serde_json::Deserializer::from_str(rest.trim_start()).into_iter::<Value>();
        if let Some(Ok(v)) = it.next() {
            out.push(v);
        }
    }
    out
}

/// Index just past the literal that opens at `i` with `quote` (escapes honoured;
/// an unterminated literal runs to the end of the line).
fn skip_quoted(chars: &[char], i: usize, quote: char) -> usize {
    let mut j = i + 1;
    while j < chars.len() {
        match chars[j] {
            '\\' => j += 2,
            c if c == quote => return j + 1,
            _ => j += 1,
        }
    }
    chars.len()
}

/// Size of `pattern` with every counted repetition expanded (`x{m,n}` counts `n`
/// copies of `x`, `x*`/`x+` one or `m`), in literal characters and classes;
/// saturating. None when `regex-syntax` cannot parse it (llguidance then reports
/// its own error).
pub fn regex_size(pattern: &str) -> Option<u64> {
    let hir = regex_syntax::ParserBuilder::new()
        .nest_limit(1000)
        .build()
        .parse(pattern)
        .ok()?;
    Some(hir_size(&hir))
}

fn hir_size(h: &regex_syntax::hir::Hir) -> u64 {
    use regex_syntax::hir::HirKind;
    match h.kind() {
        HirKind::Empty | HirKind::Look(_) | HirKind::Class(_) => 1,
        HirKind::Literal(l) => l.0.len() as u64,
        HirKind::Repetition(r) => {
            let copies = u64::from(r.max.unwrap_or(r.min).max(r.min).max(1));
            hir_size(&r.sub).saturating_mul(copies)
        }
        HirKind::Capture(c) => hir_size(&c.sub),
        HirKind::Concat(v) | HirKind::Alternation(v) => {
            v.iter().fold(0u64, |a, x| a.saturating_add(hir_size(x)))
        }
    }
}

/// Every regex a JSON schema holds: `pattern` values and `patternProperties` keys.
pub fn schema_patterns(v: &Value, out: &mut Vec<String>) {
    match v {
        Value::Object(o) => {
            if let Some(Value::String(p)) = o.get("pattern") {
                out.push(p.clone());
            }
            if let Some(Value::Object(pp)) = o.get("patternProperties") {
                out.extend(pp.keys().cloned());
            }
            o.values().for_each(|c| schema_patterns(c, out));
        }
        Value::Array(a) => a.iter().for_each(|c| schema_patterns(c, out)),
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn schema_depth_follows_refs_and_ignores_cycles() {
        assert_eq!(schema_depth(&json!({"type": "integer"}), 10), Ok(1));
        let chain = json!({"$defs": {"a": {"$ref": "#/$defs/b"}, "b": {"type": "string"}},
                           "$ref": "#/$defs/a"});
        // root -> `$defs` -> a -> (ref) b = 4 levels.
        assert_eq!(schema_depth(&chain, 10), Ok(4));
        assert_eq!(schema_depth(&chain, 4), Ok(4));
        assert_eq!(schema_depth(&chain, 3), Err(TooDeep));
        let cycle = json!({"$defs": {"n": {"type": "object",
            "properties": {"next": {"$ref": "#/$defs/n"}}}}, "$ref": "#/$defs/n"});
        assert!(schema_depth(&cycle, 10).is_ok());
        // The root once as the root and once as the ref's target; the ref back into
        // it is the cycle and counts 0.
        let selfref = json!({"$ref": "#"});
        assert_eq!(schema_depth(&selfref, 10), Ok(2));
    }

    #[test]
    fn pointers_decode_escapes() {
        let v = json!({"a/b": {"c~d": {"x%25": 1}}, "arr": [5, 6]});
        assert_eq!(resolve_pointer(&v, "#/a~1b/c~0d/x%2525"), Some(&json!(1)));
        assert_eq!(resolve_pointer(&v, "#/arr/1"), Some(&json!(6)));
        assert_eq!(resolve_pointer(&v, "other.json#/a"), None);
    }

    #[test]
    fn lark_depth_counts_rule_chains() {
        let g = "start: a b\na: b | \"a: b\"\nb: /c:d/ // c: d\n  | \"x\"";
        // start -> a -> b.
        assert_eq!(lark_depth(g, 10), Ok(3));
        assert_eq!(lark_depth(g, 2), Err(TooDeep));
        let gbnf = "root ::= x\nx ::= y\ny ::= \"z\"";
        assert_eq!(lark_depth(gbnf, 10), Ok(3));
        let rec = "start: e\ne: e \"+\" e | NUM\nNUM: /[0-9]+/";
        assert_eq!(lark_depth(rec, 10), Ok(3));
    }

    #[test]
    fn lark_literals_and_embedded_schemas_are_found() {
        let g = "start: A b\nA: /(x{100}){100}/ \"q/w\"\nb: %json {\"$ref\": \"#\"}";
        assert_eq!(lark_regexes(g), vec!["(x{100}){100}".to_string()]);
        assert_eq!(lark_json_schemas(g), vec![json!({"$ref": "#"})]);
    }

    #[test]
    fn regex_size_expands_repetitions() {
        assert_eq!(regex_size("abc"), Some(3));
        assert_eq!(regex_size("(a{1000}){1000}"), Some(1_000_000));
        assert_eq!(regex_size("[a-z]{2,5}"), Some(5));
        assert_eq!(regex_size("x*"), Some(1));
        assert_eq!(regex_size("(("), None);
    }
}
