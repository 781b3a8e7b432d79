//! The module graph of one library crate, read from its source files, for the
//! architecture test's "no module cycles" rule.
//!
//! A module *uses* another when its code names a path into it: `use crate::a::X`,
//! `super::b::f()`, `crate::c::T` in a signature. Paths are resolved through the
//! re-exports a module declares (`pub use child::{X, Y}`), so `crate::Error` counts as a
//! use of the module that defines `Error`. What is not a use: the facade lines themselves
//! (`pub use ...`, `pub mod ...`: declaring a public surface is not depending on it),
//! comments and doc links (a doc link is not a dependency), string literals, and
//! `#[cfg(test)]` blocks (a test may reach anywhere in its crate). A cycle is a strongly
//! connected set of two or more modules, parent and child included: a child that calls
//! back into its parent and a parent that calls into the child are one unit that should
//! be one module, or be cut by moving the shared part down.
//!
//! This is a reader of the crate's text, not of rustc's name resolution: glob imports
//! (`use super::*`) and macros are not followed, so it can miss a cycle but not invent
//! one beyond the paths it sees written.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// The first segment of a re-export from another crate (no module of ours).
const EXTERN: &str = "<extern>";

/// A module's absolute path inside its crate (`[]` is the crate root).
pub type ModPath = Vec<String>;

/// One source module: its file and its text with comments, strings and test blocks removed.
struct Module {
    code: String,
}

/// The modules of one crate and the use edges between them.
pub struct Graph {
    modules: BTreeMap<ModPath, Module>,
    /// Names a module re-exports, to the absolute path they come from.
    reexports: BTreeMap<ModPath, BTreeMap<String, ModPath>>,
}

impl Graph {
    /// Reads the crate whose root file is `root` (its `lib.rs`).
    pub fn read(root: &Path) -> Graph {
        let mut g = Graph {
            modules: BTreeMap::new(),
            reexports: BTreeMap::new(),
        };
        g.add(root, Vec::new(), true);
        let mut all = BTreeMap::new();
        for (path, m) in &g.modules {
            let is_child = |name: &str| {
                let mut c = path.clone();
                c.push(name.to_string());
                g.modules.contains_key(&c)
            };
            all.insert(path.clone(), reexports_of(path, &m.code, &is_child));
        }
        g.reexports = all;
        g
    }

    fn add(&mut self, file: &Path, path: ModPath, owns_dir: bool) {
        let raw = std::fs::read_to_string(file)
            .unwrap_or_else(|e| panic!("reading {}: {e}", file.display()));
        let code = strip_tests(&strip_comments_and_strings(&raw));
        // `a.rs`'s children live in `a/`; `lib.rs`'s and `mod.rs`'s beside them.
        let dir: PathBuf = if owns_dir {
            file.parent().unwrap().to_path_buf()
        } else {
            file.with_extension("")
        };
        for child in declared_mods(&code) {
            let (flat, nested) = (
                dir.join(format!("{child}.rs")),
                dir.join(&child).join("mod.rs"),
            );
            let mut p = path.clone();
            p.push(child);
            if flat.is_file() {
                self.add(&flat, p, false);
            } else if nested.is_file() {
                self.add(&nested, p, true);
            }
            // Otherwise an inline module: its text stays in this file's module.
        }
        self.modules.insert(path, Module { code });
    }

    /// The module an absolute path `p` (a module's or an item's) belongs to, following
    /// re-exports (a few hops: `pub use` chains are short).
    fn owner(&self, p: &[String]) -> Option<ModPath> {
        let mut p: Vec<String> = p.to_vec();
        for _ in 0..8 {
            if p.first().is_some_and(|s| s == EXTERN) {
                return None;
            }
            let mut m: ModPath = Vec::new();
            let mut i = 0;
            while i < p.len() {
                let mut next = m.clone();
                next.push(p[i].clone());
                if self.modules.contains_key(&next) {
                    m = next;
                    i += 1;
                } else {
                    break;
                }
            }
            let Some(name) = p.get(i) else {
                return Some(m);
            };
            match self.reexports.get(&m).and_then(|r| r.get(name)) {
                Some(src) if src.as_slice() != p.as_slice() => {
                    let mut q = src.clone();
                    q.extend(p[i + 1..].iter().cloned());
                    p = q;
                }
                _ => return Some(m),
            }
        }
        None
    }

    /// Every use edge (from, to) between two distinct modules.
    pub fn edges(&self) -> BTreeSet<(ModPath, ModPath)> {
        let mut out = BTreeSet::new();
        for (from, m) in &self.modules {
            let is_child = |name: &str| {
                let mut c = from.clone();
                c.push(name.to_string());
                self.modules.contains_key(&c)
            };
            for p in used_paths(from, &m.code, &is_child) {
                let Some(to) = self.owner(&p) else { continue };
                if &to != from {
                    out.insert((from.clone(), to));
                }
            }
        }
        out
    }

    /// The cycles: each strongly connected set of two or more modules, as `a <-> b` text.
    pub fn cycles(&self) -> Vec<String> {
        let edges = self.edges();
        let mut adj: BTreeMap<&ModPath, Vec<&ModPath>> = BTreeMap::new();
        for (a, b) in &edges {
            adj.entry(a).or_default().push(b);
        }
        let reach = |start: &ModPath| -> BTreeSet<ModPath> {
            let mut seen = BTreeSet::new();
            let mut todo = vec![start.clone()];
            while let Some(n) = todo.pop() {
                for &m in adj.get(&n).into_iter().flatten() {
                    if seen.insert(m.clone()) {
                        todo.push(m.clone());
                    }
                }
            }
            seen
        };
        let reach_of: BTreeMap<&ModPath, BTreeSet<ModPath>> =
            self.modules.keys().map(|m| (m, reach(m))).collect();
        let mut done = BTreeSet::new();
        let mut out = Vec::new();
        for m in self.modules.keys() {
            if done.contains(m) {
                continue;
            }
            let scc: Vec<&ModPath> = self
                .modules
                .keys()
                .filter(|n| n == &m || (reach_of[m].contains(*n) && reach_of[*n].contains(m)))
                .collect();
            if scc.len() > 1 {
                let names: Vec<String> = scc.iter().map(|p| show(p)).collect();
                out.push(names.join(" <-> "));
            }
            done.extend(scc.into_iter().cloned());
        }
        out
    }
}

/// `crate` for the root, else `a::b`.
pub fn show(p: &[String]) -> String {
    if p.is_empty() {
        "crate".into()
    } else {
        p.join("::")
    }
}

/// The text with `//` and `/* */` comments and the contents of string and char
/// literals blanked (lengths kept, so nothing else moves).
fn strip_comments_and_strings(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i..].starts_with(b"//") {
            while i < b.len() && b[i] != b'\n' {
                i += 1;
                out.push(b' ');
            }
        } else if b[i..].starts_with(b"/*") {
            let mut depth = 0;
            while i < b.len() {
                if b[i..].starts_with(b"/*") {
                    depth += 1;
                    out.extend(b"  ");
                    i += 2;
                } else if b[i..].starts_with(b"*/") {
                    depth -= 1;
                    out.extend(b"  ");
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    out.push(if b[i] == b'\n' { b'\n' } else { b' ' });
                    i += 1;
                }
            }
        } else if b[i] == b'r' && b.get(i + 1).is_some_and(|&c| c == b'"' || c == b'#') {
            // A raw string r"..." or r#"..."#.
            let mut j = i + 1;
            let mut hashes = 0;
            while b.get(j) == Some(&b'#') {
                hashes += 1;
                j += 1;
            }
            if b.get(j) != Some(&b'"') {
                out.push(b[i]);
                i += 1;
                continue;
            }
            let close: Vec<u8> = std::iter::once(b'"')
                .chain(std::iter::repeat_n(b'#', hashes))
                .collect();
            out.resize(out.len() + (j + 1 - i), b' ');
            i = j + 1;
            while i < b.len() && !b[i..].starts_with(&close) {
                out.push(b' ');
                i += 1;
            }
            out.resize(out.len() + close.len().min(b.len() - i), b' ');
            i += close.len();
        } else if b[i] == b'"' {
            out.push(b' ');
            i += 1;
            while i < b.len() && b[i] != b'"' {
                if b[i] == b'\\' {
                    out.push(b' ');
                    i += 1;
                }
                out.push(b' ');
                i += 1;
            }
            out.push(b' ');
            i += 1;
        } else if b[i] == b'\'' && b.get(i + 2) == Some(&b'\'') {
            out.extend(b"   ");
            i += 3;
        } else if b[i] == b'\'' && b.get(i + 1) == Some(&b'\\') {
            // '\n', '\'', '\u{..}'
            let mut j = i + 2;
            while j < b.len() && b[j] != b'\'' {
                j += 1;
            }
            out.resize(out.len() + (j + 1 - i), b' ');
            i = j + 1;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// The text without its `#[cfg(test)]` items (a `mod tests { ... }` block, or the
/// one item that follows the attribute).
fn strip_tests(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut rest = s;
    while let Some(i) = rest.find("#[cfg(test)]") {
        out.push_str(&rest[..i]);
        let after = &rest[i..];
        // The item ends at its matching `}` or at a `;` before any `{`.
        let (semi, brace) = (after.find(';'), after.find('{'));
        let end = match (semi, brace) {
            (Some(s), Some(b)) if s < b => s + 1,
            (_, Some(b)) => {
                let mut depth = 0usize;
                let mut end = after.len();
                for (j, c) in after[b..].char_indices() {
                    match c {
                        '{' => depth += 1,
                        '}' => {
                            depth -= 1;
                            if depth == 0 {
                                end = b + j + 1;
                                break;
                            }
                        }
                        _ => {}
                    }
                }
                end
            }
            (Some(s), None) => s + 1,
            (None, None) => after.len(),
        };
        rest = &after[end..];
    }
    out.push_str(rest);
    out
}

fn is_ident(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '_'
}

/// The modules a file declares with `mod name;` (any visibility, any attributes).
fn declared_mods(code: &str) -> Vec<String> {
    let mut out = Vec::new();
    for stmt in code.split([';', '{', '}']) {
        // Attributes go first: `#[cfg(target_arch = "x86_64")] mod x86;` is a
        // declaration too (its words would otherwise not look like one).
        let stmt = without_attributes(stmt);
        let words: Vec<&str> = stmt.split_whitespace().collect();
        if let Some(k) = words.iter().position(|w| *w == "mod") {
            if let Some(name) = words.get(k + 1) {
                let rest = &words[k + 2..];
                // `mod name;` only: the statement ends right after the name.
                if rest.is_empty() && name.chars().all(is_ident) {
                    let before_ok = words[..k].iter().all(|w| w.starts_with("pub"));
                    let is_decl = code.contains(&format!("mod {name};"));
                    if before_ok && is_decl {
                        out.push(name.to_string());
                    }
                }
            }
        }
    }
    out.dedup();
    out
}

/// `stmt` with its `#[...]` attributes taken out (brackets balanced; strings are
/// blanked already). A statement cut short by the split on `{`/`}`/`;` inside an
/// attribute's arguments leaves an unclosed `#[`, which takes the rest with it.
fn without_attributes(stmt: &str) -> String {
    let mut out = String::with_capacity(stmt.len());
    let mut chars = stmt.chars().peekable();
    while let Some(c) = chars.next() {
        if c == '#' && chars.peek() == Some(&'[') {
            let mut depth = 0usize;
            for d in chars.by_ref() {
                match d {
                    '[' => depth += 1,
                    ']' => {
                        depth -= 1;
                        if depth == 0 {
                            break;
                        }
                    }
                    _ => {}
                }
            }
            out.push(' ');
        } else {
            out.push(c);
        }
    }
    out
}

/// `use` trees flattened into paths: `a::{b, c::d}` -> `a::b`, `a::c::d`.
fn flatten_use(tree: &str) -> Vec<String> {
    let tree: String = tree
        .replace(" as ", "@")
        .chars()
        .filter(|c| !c.is_whitespace())
        .collect();
    fn go(prefix: &str, t: &str, out: &mut Vec<String>) {
        if let Some(open) = t.find('{') {
            let head = &t[..open];
            let inner = &t[open + 1..t.rfind('}').unwrap_or(t.len())];
            let mut depth = 0;
            let mut start = 0;
            for (i, c) in inner.char_indices() {
                match c {
                    '{' => depth += 1,
                    '}' => depth -= 1,
                    ',' if depth == 0 => {
                        go(&format!("{prefix}{head}"), &inner[start..i], out);
                        start = i + 1;
                    }
                    _ => {}
                }
            }
            go(&format!("{prefix}{head}"), &inner[start..], out);
        } else if !t.is_empty() {
            out.push(format!("{prefix}{t}"));
        }
    }
    let mut out = Vec::new();
    go("", &tree, &mut out);
    out
}

/// The absolute path a written path names from module `from`, if it is crate-relative
/// (`crate::`, `super::`, `self::`).
fn absolute(from: &[String], written: &str, is_child: &dyn Fn(&str) -> bool) -> Option<ModPath> {
    let written = written.split('@').next().unwrap_or(written);
    let segs: Vec<&str> = written
        .split("::")
        .map(str::trim)
        .filter(|s| !s.is_empty() && *s != "*")
        .collect();
    let mut base: Vec<String> = match segs.first()? {
        &"crate" => Vec::new(),
        &"self" | &"super" => from.to_vec(),
        // 2018 paths: a first segment naming a child module is relative to this one.
        s if is_child(s) => {
            let mut v = from.to_vec();
            v.push(s.to_string());
            v
        }
        _ => return None,
    };
    let mut rest = &segs[1..];
    if segs[0] == "super" {
        base.pop()?;
    }
    while rest.first() == Some(&"super") {
        base.pop()?;
        rest = &rest[1..];
    }
    base.extend(rest.iter().map(|s| s.to_string()));
    Some(base)
}

/// Every crate-relative path module `from`'s code uses (facade lines excluded):
/// `use` trees, and paths in code that start `crate::`, `super::`, `self::` or with
/// the name of a child module.
fn used_paths(from: &[String], code: &str, is_child: &dyn Fn(&str) -> bool) -> Vec<ModPath> {
    let mut out = Vec::new();
    for stmt in statements(code) {
        let t = stmt.trim_start();
        if t.starts_with("pub use ")
            || t.starts_with("pub(crate) use ")
            || t.starts_with("pub mod ")
        {
            continue;
        }
        if let Some(tree) = t.strip_prefix("use ") {
            let tree = tree.trim_end_matches(';');
            out.extend(
                flatten_use(tree)
                    .iter()
                    .filter_map(|p| absolute(from, p, is_child)),
            );
            continue;
        }
        let chars: Vec<(usize, char)> = t.char_indices().collect();
        let mut k = 0;
        while k < chars.len() {
            let (i, c) = chars[k];
            let prev = if k == 0 { ' ' } else { chars[k - 1].1 };
            if !(c.is_ascii_alphabetic() || c == '_') || is_ident(prev) || prev == ':' {
                k += 1;
                continue;
            }
            let mut j = k;
            while j < chars.len() && (is_ident(chars[j].1) || chars[j].1 == ':') {
                j += 1;
            }
            let end = chars.get(j).map_or(t.len(), |&(e, _)| e);
            let path = t[i..end].trim_end_matches(':');
            if path.contains("::") {
                if let Some(p) = absolute(from, path, is_child) {
                    out.push(p);
                }
            }
            k = j.max(k + 1);
        }
    }
    out
}

/// The text cut into statements at `;` and braces (good enough for `use` lines).
fn statements(code: &str) -> Vec<&str> {
    // A `use` tree holds braces: cut it whole, up to its `;`.
    let mut out = Vec::new();
    let mut rest = code;
    while !rest.is_empty() {
        let t = rest.trim_start();
        let lead = rest.len() - t.len();
        let is_use = ["use ", "pub use ", "pub(crate) use "]
            .iter()
            .any(|p| t.starts_with(p));
        let end = if is_use {
            t.find(';').map_or(t.len(), |i| i + 1)
        } else {
            t.find([';', '{', '}']).map_or(t.len(), |i| i + 1)
        };
        out.push(&rest[lead..lead + end]);
        rest = &rest[lead + end..];
    }
    out
}

/// The names a module re-exports (`pub use` / `pub(crate) use`) and where they come from.
fn reexports_of(
    from: &[String],
    code: &str,
    is_child: &dyn Fn(&str) -> bool,
) -> BTreeMap<String, ModPath> {
    let mut out = BTreeMap::new();
    for stmt in statements(code) {
        let t = stmt.trim_start();
        let tree = t
            .strip_prefix("pub use ")
            .or_else(|| t.strip_prefix("pub(crate) use "));
        let Some(tree) = tree else { continue };
        let tree = tree.trim_end_matches(';');
        for p in flatten_use(tree) {
            // A plain child path (`a::X`) is relative to this module in 2018+ only when
            // `a` is a child; `crate::`/`super::` are absolute.
            // `pub use a::X` of a child `a`, or of another crate ([`EXTERN`]).
            let abs = absolute(from, &p, is_child).or_else(|| Some(vec![EXTERN.to_string()]));
            if let Some(abs) = abs {
                let (path, alias) = p.split_once('@').unwrap_or((&p, ""));
                let name = path.rsplit("::").next().unwrap_or(path).to_string();
                let name = if alias.is_empty() {
                    name
                } else {
                    alias.to_string()
                };
                if name != "*" && name != "self" {
                    out.insert(name, abs);
                }
            }
        }
    }
    out
}
