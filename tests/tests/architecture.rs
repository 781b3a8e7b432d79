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

/// `cargo metadata --no-deps` of the workspace (no registry, no network).
fn metadata() -> Value {
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
    serde_json::from_slice(&out.stdout).expect("metadata JSON")
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
        let m = metadata();
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
            "pagoda-cuda-testkit",
            &["pagoda-cuda-kernels"],
            "kernels/cuda-testkit: the kernels' emulator, nothing above it",
        ),
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
    for p in g.packages() {
        assert!(
            !g.deps[p].contains("pagoda-cuda-testkit"),
            "{p} depends on pagoda-cuda-testkit (kernels/cuda-testkit: a test dependency only)"
        );
    }
    let core_direct: BTreeSet<String> = g.deps["pagoda-core"].clone();
    let core_allowed = set(&["thiserror", "serde", "serde_json", "inventory", "half"]);
    let extra: Vec<_> = core_direct.difference(&core_allowed).collect();
    assert!(
        extra.is_empty(),
        "pagoda-core depends on {extra:?} (core/: thiserror, serde, serde_json, inventory, half only)"
    );
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

mod module_graph;

/// The library crates' root files (`src/lib.rs`), from the workspace's manifests.
fn library_roots() -> Vec<(String, PathBuf)> {
    let m = metadata();
    let mut roots = Vec::new();
    for p in m["packages"].as_array().unwrap() {
        for t in p["targets"].as_array().unwrap() {
            if t["kind"].as_array().unwrap().iter().any(|k| k == "lib") {
                let name = p["name"].as_str().unwrap().to_string();
                roots.push((name, PathBuf::from(t["src_path"].as_str().unwrap())));
            }
        }
    }
    roots.sort();
    roots
}

/// No module cycles in any library crate (issue 23): a module that uses another is
/// never used back by it, directly or through others, parent and child included, and
/// modules behind `#[cfg(...)]` count (tests/tests/module_graph: what counts as a use).
/// A failure lists each cycle with the uses inside it, the edges to cut.
#[test]
fn no_library_crate_has_a_module_cycle() {
    let roots = library_roots();
    assert!(roots.len() >= 15, "library crates found: {roots:?}");
    let mut report = Vec::new();
    for (name, lib) in &roots {
        let g = module_graph::Graph::read(lib);
        for c in g.cycles() {
            let members: BTreeSet<&str> = c.split(" <-> ").collect();
            let uses: Vec<String> = g
                .edges()
                .into_iter()
                .map(|(a, b)| (module_graph::show(&a), module_graph::show(&b)))
                .filter(|(a, b)| members.contains(a.as_str()) && members.contains(b.as_str()))
                .map(|(a, b)| format!("    {a} -> {b}"))
                .collect();
            report.push(format!("{name}: {c}\n{}", uses.join("\n")));
        }
    }
    assert!(
        report.is_empty(),
        "module cycles (cut them):\n{}",
        report.join("\n")
    );
}

/// The server library reaches the load generator only through its binary: `main.rs`
/// dispatches `pagoda bench` to it (ARCHITECTURE.md, server/).
#[test]
fn only_the_binary_names_the_load_generator() {
    let files = rust_files(&root().join("server/src"));
    let naming: Vec<String> = files
        .iter()
        .filter(|f| {
            std::fs::read_to_string(f)
                .unwrap()
                .contains("pagoda_loadgen")
        })
        .map(|f| f.strip_prefix(root()).unwrap().display().to_string())
        .collect();
    assert_eq!(
        naming,
        ["server/src/main.rs"],
        "files naming pagoda_loadgen"
    );
}

/// Every "Shown by" of ARCHITECTURE.md names a check that exists: each backticked
/// `cargo test -p P --test T [NAME]` a test file `tests/T.rs` of package P (holding
/// `fn NAME`), each backticked path a file; and no "Shown by" is a command nobody runs
/// (`cargo tree ... | grep`), since those went stale unnoticed.
#[test]
fn shown_by_names_tests_that_exist() {
    let text = std::fs::read_to_string(root().join("ARCHITECTURE.md")).unwrap();
    let dirs = package_dirs();
    let mut checked = 0;
    for (i, _) in text.match_indices("Shown by") {
        let para_end = text[i..].find("\n\n").map_or(text.len(), |e| i + e);
        // The claim's evidence: up to the end of its sentence-group (next "*" or paragraph end).
        let span = &text[i..para_end];
        let ticks: Vec<&str> = span.split('`').skip(1).step_by(2).collect();
        assert!(!ticks.is_empty(), "a Shown by without a check: {span:.120}");
        let first = ticks[0].split_whitespace().collect::<Vec<_>>().join(" ");
        assert!(
            first.starts_with("cargo test ") || first.ends_with(".rs") || first.ends_with(".sh"),
            "a Shown by that is not a test: `{first}` ({span:.120})"
        );
        for t in ticks {
            let t = t.split_whitespace().collect::<Vec<_>>().join(" ");
            if let Some(rest) = t.strip_prefix("cargo test ") {
                let words: Vec<&str> = rest.split(' ').collect();
                let arg = |flag: &str| {
                    let k = words.iter().position(|w| *w == flag)?;
                    words.get(k + 1).copied()
                };
                let pkg = arg("-p").expect("cargo test -p <package>");
                let dir = dirs.get(pkg).unwrap_or_else(|| panic!("no package {pkg}"));
                if let Some(test) = arg("--test") {
                    let file = dir.join("tests").join(format!("{test}.rs"));
                    let src = std::fs::read_to_string(&file)
                        .unwrap_or_else(|_| panic!("`{t}`: no {}", file.display()));
                    let after = words.iter().position(|w| *w == test).unwrap() + 1;
                    if let Some(name) = words.get(after) {
                        assert!(
                            src.contains(&format!("fn {name}(")),
                            "`{t}`: {} has no test {name}",
                            file.display()
                        );
                    }
                }
                checked += 1;
            } else if (t.ends_with(".rs") || t.ends_with(".sh"))
                && t.contains('/')
                && !t.contains(' ')
                && !t.contains('*')
            {
                assert!(
                    root().join(&t).is_file(),
                    "Shown by names {t}, which is gone"
                );
                checked += 1;
            }
        }
    }
    assert!(
        checked >= 8,
        "only {checked} checks found in ARCHITECTURE.md"
    );
}

/// Package name -> its directory, from the manifests.
fn package_dirs() -> HashMap<String, PathBuf> {
    let m = metadata();
    m["packages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| {
            let manifest = PathBuf::from(p["manifest_path"].as_str().unwrap());
            (
                p["name"].as_str().unwrap().to_string(),
                manifest.parent().unwrap().to_path_buf(),
            )
        })
        .collect()
}

/// Files under the repository root that `git` tracks (`git ls-files`), as paths
/// relative to it.
fn tracked_files() -> Vec<String> {
    let out = Command::new("git")
        .args(["ls-files", "--cached", "--others", "--exclude-standard"])
        .current_dir(root())
        .output()
        .expect("running git ls-files");
    assert!(out.status.success(), "git ls-files failed");
    String::from_utf8(out.stdout)
        .expect("UTF-8 paths")
        .lines()
        .map(str::to_string)
        .collect()
}

/// A CUDA backend is a crate (issue 23): adding `examples/cuda-backend-example` (its
/// `.cu`, its one-line `build.rs`, its registration) touched nothing outside its folder
/// but the one line that links it, `backends/all/Cargo.toml`. Counted over every file
/// of the repository but the documentation (which describes it), this test and
/// `Cargo.lock` (cargo writes it): no
/// enum, table or match elsewhere names the crate, its backend or its kernel.
#[test]
fn the_example_cuda_backend_is_named_only_in_its_folder_and_its_link_line() {
    let folder = "examples/cuda-backend-example/";
    // Built from parts so that this file does not match itself.
    let needles = [
        ["pagoda-backend-", "cuda-example"].concat(),
        ["pagoda_backend_", "cuda_example"].concat(),
        ["cuda-", "warp-decode"].concat(),
        ["warp", "_decode"].concat(),
    ];
    let this = "tests/tests/architecture.rs";
    let (mut inside, mut naming) = (0, Vec::new());
    for f in tracked_files() {
        let Ok(text) = std::fs::read_to_string(root().join(&f)) else {
            continue; // binary or removed
        };
        if !needles.iter().any(|n| text.contains(n.as_str())) {
            continue;
        }
        if f.starts_with(folder) {
            inside += 1;
        } else if !f.ends_with(".md") && f != this && f != "Cargo.lock" {
            naming.push(f);
        }
    }
    assert!(inside >= 4, "the example's own files name it: {inside}");
    assert_eq!(
        naming,
        ["backends/all/Cargo.toml"],
        "files outside {folder} that name the example CUDA backend"
    );
    let link = std::fs::read_to_string(root().join("backends/all/Cargo.toml")).unwrap();
    let lines = link
        .lines()
        .filter(|l| l.contains(needles[0].as_str()))
        .count();
    assert_eq!(lines, 1, "one line links it");
}
