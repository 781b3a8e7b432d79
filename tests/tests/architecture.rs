//! ARCHITECTURE.md's checkable invariants, run as a test so that they cannot go
//! stale: which crate may depend on which (the manifests' normal dependencies,
//! closed over the workspace's crates, as `cargo metadata --no-deps` gives them
//! without a registry), core free
//! of CUDA, no backend depending on another, no library outside `backends/` naming
//! a backend, the engine free of HTTP, and the HTTP layer reaching the engine only
//! through its handle. Each assertion names the ARCHITECTURE.md paragraph it checks.

use serde_json::Value;
use std::collections::{BTreeSet, HashMap};
use std::path::{Path, PathBuf};
use std::process::Command;

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("the workspace root")
        .to_path_buf()
}

/// The dependency graph: package name -> names of its normal dependencies.
struct Graph {
    deps: HashMap<String, BTreeSet<String>>,
}

impl Graph {
    /// The workspace's manifests (`cargo metadata --no-deps`: no registry, no
    /// network): each crate's normal, non-optional dependencies (what the default
    /// build links; the `cuda` features' optional crates are left out).
    fn load() -> Graph {
        let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
        let out = Command::new(&cargo)
            .args([
                "metadata",
                "--no-deps",
                "--offline",
                "--format-version",
                "1",
            ])
            .current_dir(root())
            .output()
            .expect("running cargo metadata");
        assert!(
            out.status.success(),
            "cargo metadata: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let m: Value = serde_json::from_slice(&out.stdout).expect("metadata JSON");
        let mut deps = HashMap::new();
        for p in m["packages"].as_array().unwrap() {
            let normal: BTreeSet<String> = p["dependencies"]
                .as_array()
                .unwrap()
                .iter()
                .filter(|d| d["kind"].is_null() && d["optional"] != Value::Bool(true))
                .map(|d| d["name"].as_str().unwrap().to_string())
                .collect();
            deps.insert(p["name"].as_str().unwrap().to_string(), normal);
        }
        Graph { deps }
    }

    /// Every package `name` depends on, directly or not (normal dependencies).
    fn closure(&self, name: &str) -> BTreeSet<String> {
        let mut seen = BTreeSet::new();
        let mut todo = vec![name.to_string()];
        while let Some(n) = todo.pop() {
            for d in self.deps.get(&n).into_iter().flatten() {
                if seen.insert(d.clone()) {
                    todo.push(d.clone());
                }
            }
        }
        seen
    }

    /// The `pagoda*` crates in `name`'s closure.
    fn pagoda_closure(&self, name: &str) -> BTreeSet<String> {
        self.closure(name)
            .into_iter()
            .filter(|d| d.starts_with("pagoda"))
            .collect()
    }

    fn packages(&self) -> impl Iterator<Item = &String> {
        self.deps.keys()
    }
}

fn set(items: &[&str]) -> BTreeSet<String> {
    items.iter().map(|s| s.to_string()).collect()
}

#[test]
fn crates_depend_only_on_what_architecture_md_allows() {
    let g = Graph::load();
    // (crate, the pagoda crates it may reach, the paragraph)
    let rules: &[(&str, &[&str], &str)] = &[
        ("pagoda-core", &[], "core/: no concrete backend, no CUDA"),
        (
            "pagoda-kernels",
            &[],
            "kernels/: no models, requests or backends",
        ),
        (
            "pagoda-cuda-kernels",
            &[],
            "kernels/cuda: no core, no backend",
        ),
        ("pagoda-cutlass", &[], "kernels/cutlass: no pagoda crate"),
        (
            "pagoda-scheduler",
            &["pagoda-core"],
            "scheduler/: token ids only",
        ),
        (
            "pagoda-models",
            &["pagoda-core", "pagoda-kernels"],
            "models/: no scheduling, no HTTP, no concrete backend",
        ),
        (
            "pagoda-selector",
            &["pagoda-core"],
            "selector/: the registry, not a backend",
        ),
    ];
    for (krate, allowed, why) in rules {
        let (got, allowed) = (g.pagoda_closure(krate), set(allowed));
        let extra: Vec<_> = got.difference(&allowed).collect();
        assert!(
            extra.is_empty(),
            "{krate} depends on {extra:?} ({why}; ARCHITECTURE.md)"
        );
    }
    let core = g.closure("pagoda-core");
    for banned in ["cudarc", "tokenizers", "axum", "hyper", "memmap2"] {
        assert!(
            !core.contains(banned),
            "pagoda-core depends on {banned}: core knows nothing of HTTP, tokenizers, model files or CUDA"
        );
    }
    let engine = g.closure("pagoda-engine");
    for banned in ["axum", "hyper"] {
        assert!(
            !engine.contains(banned),
            "pagoda-engine depends on {banned}: the engine has no HTTP"
        );
    }
}

#[test]
fn no_backend_depends_on_another_and_no_library_names_one() {
    let g = Graph::load();
    let backends: Vec<&String> = g
        .packages()
        .filter(|p| p.starts_with("pagoda-backend-") && *p != "pagoda-backend-testkit")
        .collect();
    assert!(backends.len() >= 7, "backend crates found: {backends:?}");
    let allowed = set(&[
        "pagoda-core",
        "pagoda-kernels",
        "pagoda-cuda",
        "pagoda-cuda-kernels",
        "pagoda-cutlass",
    ]);
    for b in &backends {
        let got = g.pagoda_closure(b);
        let extra: Vec<_> = got.difference(&allowed).collect();
        assert!(
            extra.is_empty(),
            "{b} depends on {extra:?}: a backend crate depends on core (and the kernels) only"
        );
    }
    // Only `backends/all` (which links them), the testkit (its oracle, naive) and
    // the binaries, tests and benches that choose what exists may name a backend.
    let may_link = set(&[
        "pagoda-backends",
        "pagoda-backend-testkit",
        "pagoda-server",
        "pagoda-tests",
        "pagoda-benches",
    ]);
    for p in g.packages().filter(|p| p.starts_with("pagoda")) {
        if may_link.contains(p.as_str()) || p.starts_with("pagoda-backend-") {
            continue;
        }
        let named: Vec<_> = g.deps[p]
            .iter()
            .filter(|d| d.starts_with("pagoda-backend"))
            .collect();
        assert!(
            named.is_empty(),
            "{p} depends on {named:?}: no library outside backends/ names a backend"
        );
    }
}

/// Every `.rs` file under `dir`, recursively.
fn rust_files(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut todo = vec![dir.to_path_buf()];
    while let Some(d) = todo.pop() {
        for e in std::fs::read_dir(&d).unwrap().flatten() {
            let p = e.path();
            if p.is_dir() {
                todo.push(p);
            } else if p.extension().is_some_and(|x| x == "rs") {
                out.push(p);
            }
        }
    }
    out
}

#[test]
fn the_http_layer_reaches_the_engine_only_through_its_handle() {
    let banned = ["LLMEngine", "EngineCore", "ModelRunner", "pagoda_scheduler"];
    let files = rust_files(&root().join("server/src/serve"));
    assert!(
        files.len() > 10,
        "server/src/serve has {} files",
        files.len()
    );
    for f in files {
        let text = std::fs::read_to_string(&f).unwrap();
        // vLLM's metric help texts are quoted as they are ("... the LLMEngine ...").
        for (i, line) in text
            .lines()
            .enumerate()
            .filter(|(_, l)| !l.contains("# HELP"))
        {
            for b in banned {
                assert!(
                    !line.contains(b),
                    "{}:{}: names {b}; the HTTP layer reaches the engine only through \
                     EngineHandle (ARCHITECTURE.md, server/)",
                    f.display(),
                    i + 1
                );
            }
        }
    }
}

#[test]
fn core_source_names_no_cuda_crate() {
    for f in rust_files(&root().join("core/src")) {
        let text = std::fs::read_to_string(&f).unwrap();
        assert!(
            !text.contains("cudarc"),
            "{} names cudarc: core is free of CUDA",
            f.display()
        );
    }
}
