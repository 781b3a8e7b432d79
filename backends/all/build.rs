//! Writes `$OUT_DIR/link.rs`: one `use <crate> as _;` per `pagoda-backend-*` line of
//! this crate's `[dependencies]`, and the list of their names, so that adding a
//! backend to the binaries is one line in `Cargo.toml`.

use std::fmt::Write as _;

fn main() {
    println!("cargo:rerun-if-changed=Cargo.toml");
    let dir = std::env::var("CARGO_MANIFEST_DIR").expect("set by cargo");
    let manifest = std::fs::read_to_string(format!("{dir}/Cargo.toml")).expect("Cargo.toml");
    let mut section = "";
    let mut crates = Vec::new();
    for line in manifest.lines().map(str::trim) {
        if line.starts_with('[') {
            section = line;
        } else if section == "[dependencies]" && line.starts_with("pagoda-backend-") {
            let name: String = line
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '-' || *c == '_')
                .collect();
            crates.push(name.replace('-', "_"));
        }
    }
    let mut out = String::new();
    for c in &crates {
        writeln!(out, "use {c} as _;").unwrap();
    }
    writeln!(
        out,
        "/// The backend crates this crate links (from its `Cargo.toml`).\npub const LINKED_CRATES: &[&str] = &[{}];",
        crates.iter().map(|c| format!("{c:?}")).collect::<Vec<_>>().join(", ")
    )
    .unwrap();
    let out_dir = std::env::var("OUT_DIR").expect("set by cargo");
    std::fs::write(format!("{out_dir}/link.rs"), out).expect("write link.rs");
}
