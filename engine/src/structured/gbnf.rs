//! GBNF (llama.cpp's grammar format, `name ::= ...`, starting at `root`) into
//! llguidance's Lark dialect, which is what the `llguidance` crate compiles; vLLM's
//! `structured_outputs.grammar` takes either (its llguidance backend converts GBNF
//! the same way).
//!
//! Each GBNF rule becomes one Lark rule on one line (GBNF rules may span lines):
//! rule names are lowercased (`root` becomes `start`), string literals are decoded
//! and re-quoted as JSON strings, character classes `[...]` and `.` become regexes,
//! and `*`, `+`, `?`, `{m,n}`, `|` and parentheses carry over.

/// Whether `text` looks like GBNF rather than Lark.
pub fn is_gbnf(text: &str) -> bool {
    text.contains("::=")
}

#[derive(Debug, Clone, PartialEq)]
enum Tok {
    Ident(String),
    Define,
    /// A decoded string literal.
    Str(String),
    /// The inside of a character class, brackets excluded.
    Class(String),
    Dot,
    Op(char),
    /// `{m}`, `{m,}`, `{m,n}` or `{,n}`, braces excluded.
    Repeat(String),
}

/// Converts a GBNF grammar to Lark; the error says where the GBNF is malformed.
pub fn to_lark(gbnf: &str) -> Result<String, String> {
    let toks = lex(gbnf)?;
    let mut rules: Vec<(String, Vec<Tok>)> = Vec::new();
    let mut i = 0;
    while i < toks.len() {
        match (&toks[i], toks.get(i + 1)) {
            (Tok::Ident(name), Some(Tok::Define)) => {
                rules.push((name.clone(), Vec::new()));
                i += 2;
            }
            (t, _) => {
                let Some((_, body)) = rules.last_mut() else {
                    return Err(format!("GBNF: expected `name ::=` first, found {t:?}"));
                };
                body.push(t.clone());
                i += 1;
            }
        }
    }
    if !rules.iter().any(|(n, _)| n == "root") {
        return Err("GBNF: the grammar has no `root` rule".into());
    }
    let mut out = String::new();
    for (name, body) in &rules {
        if body.is_empty() {
            return Err(format!("GBNF: rule `{name}` is empty"));
        }
        out.push_str(&rule_name(name));
        out.push(':');
        for t in body {
            out.push(' ');
            match t {
                Tok::Ident(n) => out.push_str(&rule_name(n)),
                Tok::Str(s) => out.push_str(&serde_json::to_string(s).map_err(|e| e.to_string())?),
                Tok::Class(c) => {
                    out.push_str("/[");
                    out.push_str(&class_to_regex(c));
                    out.push_str("]/");
                }
                Tok::Dot => out.push_str("/(?s:.)/"),
                Tok::Op(c) => out.push(*c),
                Tok::Repeat(r) => {
                    out.push('{');
                    if r.starts_with(',') {
                        out.push('0');
                    }
                    out.push_str(r);
                    out.push('}');
                }
                Tok::Define => return Err("GBNF: unexpected `::=`".into()),
            }
        }
        out.push('\n');
    }
    Ok(out)
}

/// Lark rule names are lowercase; `root` is Lark's `start` (and a GBNF rule
/// called `start` steps aside).
fn rule_name(name: &str) -> String {
    if name == "root" {
        return "start".into();
    }
    let lower = name.to_ascii_lowercase();
    if lower == "start" {
        "gbnf-start".into()
    } else if lower.starts_with(|c: char| c.is_ascii_lowercase()) {
        lower
    } else {
        format!("r-{lower}")
    }
}

/// A GBNF class body as a Rust-regex class body: `/` (Lark's regex delimiter),
/// `[`, `&` and `~` (Rust-regex class set syntax) are escaped; GBNF's escapes
/// (`\n`, `\t`, `\xHH`, `\uHHHH`, `\]`, `\\`, `\-`) mean the same in Rust regex.
fn class_to_regex(c: &str) -> String {
    let mut out = String::with_capacity(c.len());
    let mut chars = c.chars();
    while let Some(ch) = chars.next() {
        match ch {
            '\\' => {
                out.push('\\');
                if let Some(n) = chars.next() {
                    out.push(n);
                }
            }
            '/' | '[' | '&' | '~' => {
                out.push('\\');
                out.push(ch);
            }
            _ => out.push(ch),
        }
    }
    out
}

fn lex(s: &str) -> Result<Vec<Tok>, String> {
    let mut toks = Vec::new();
    let mut it = s.char_indices().peekable();
    while let Some((pos, c)) = it.next() {
        match c {
            c if c.is_whitespace() => {}
            '#' => {
                for (_, c) in it.by_ref() {
                    if c == '\n' {
                        break;
                    }
                }
            }
            '"' => {
                let mut lit = String::new();
                loop {
                    match it.next() {
                        None => return Err(format!("GBNF: unterminated string at {pos}")),
                        Some((_, '"')) => break,
                        Some((p, '\\')) => lit.push(unescape(&mut it, p)?),
                        Some((_, c)) => lit.push(c),
                    }
                }
                toks.push(Tok::Str(lit));
            }
            '[' => {
                let mut class = String::new();
                loop {
                    match it.next() {
                        None => return Err(format!("GBNF: unterminated character class at {pos}")),
                        Some((_, ']')) => break,
                        Some((_, '\\')) => {
                            class.push('\\');
                            if let Some((_, n)) = it.next() {
                                class.push(n);
                            }
                        }
                        Some((_, c)) => class.push(c),
                    }
                }
                toks.push(Tok::Class(class));
            }
            '{' => {
                let mut rep = String::new();
                loop {
                    match it.next() {
                        None => return Err(format!("GBNF: unterminated repetition at {pos}")),
                        Some((_, '}')) => break,
                        Some((_, c)) if c.is_ascii_digit() || c == ',' => rep.push(c),
                        Some((_, c)) if c.is_whitespace() => {}
                        Some((p, c)) => {
                            return Err(format!("GBNF: unexpected {c:?} in a repetition at {p}"))
                        }
                    }
                }
                toks.push(Tok::Repeat(rep));
            }
            ':' => {
                let rest: String = [it.next(), it.next()]
                    .iter()
                    .flatten()
                    .map(|(_, c)| *c)
                    .collect();
                if rest != ":=" {
                    return Err(format!("GBNF: expected `::=` at {pos}"));
                }
                toks.push(Tok::Define);
            }
            '.' => toks.push(Tok::Dot),
            '|' | '(' | ')' | '*' | '+' | '?' => toks.push(Tok::Op(c)),
            c if c.is_ascii_alphanumeric() || c == '-' || c == '_' => {
                let mut name = String::from(c);
                while let Some(&(_, n)) = it.peek() {
                    if n.is_ascii_alphanumeric() || n == '-' || n == '_' {
                        name.push(n);
                        it.next();
                    } else {
                        break;
                    }
                }
                toks.push(Tok::Ident(name));
            }
            c => return Err(format!("GBNF: unexpected {c:?} at {pos}")),
        }
    }
    Ok(toks)
}

/// One escape of a GBNF string literal (after the backslash at `pos`).
fn unescape(
    it: &mut std::iter::Peekable<std::str::CharIndices<'_>>,
    pos: usize,
) -> Result<char, String> {
    fn hex(
        it: &mut std::iter::Peekable<std::str::CharIndices<'_>>,
        n: usize,
        pos: usize,
    ) -> Result<char, String> {
        let digits: String = (0..n).filter_map(|_| it.next().map(|(_, c)| c)).collect();
        u32::from_str_radix(&digits, 16)
            .ok()
            .and_then(char::from_u32)
            .ok_or_else(|| format!("GBNF: bad escape at {pos}"))
    }
    match it.next().map(|(_, c)| c) {
        Some('n') => Ok('\n'),
        Some('r') => Ok('\r'),
        Some('t') => Ok('\t'),
        Some('x') => hex(it, 2, pos),
        Some('u') => hex(it, 4, pos),
        Some('U') => hex(it, 8, pos),
        Some(c @ ('\\' | '"' | '[' | ']')) => Ok(c),
        _ => Err(format!("GBNF: bad escape at {pos}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn converts_rules_literals_classes_and_repetitions() {
        let g = "# a comment\nroot ::= select-stmt\nselect-stmt ::= \"SELECT \" col (\" , \" col)* \" FROM t\\n\"\ncol ::= [a-z_/]{1,8} | \"x\\\"y\" | .\n";
        let lark = to_lark(g).unwrap();
        let expected = r#"start: select-stmt
select-stmt: "SELECT " col ( " , " col ) * " FROM t\n"
col: /[a-z_\/]/ {1,8} | "x\"y" | /(?s:.)/
"#;
        assert_eq!(lark, expected);
        assert_eq!(rule_name("Start"), "gbnf-start");
        assert_eq!(rule_name("start"), "gbnf-start");
        assert_eq!(rule_name("9lives"), "r-9lives");
    }

    #[test]
    fn malformed_gbnf_is_an_error() {
        assert!(to_lark("root ::= \"a").is_err());
        assert!(to_lark("a ::= \"a\"").is_err()); // no root
        assert!(to_lark("\"a\" root ::= b").is_err());
        assert!(to_lark("root ::= [a-").is_err());
        assert!(to_lark("root ::= \"\\q\"").is_err());
        assert!(is_gbnf("root ::= \"a\"") && !is_gbnf("start: \"a\""));
    }
}
