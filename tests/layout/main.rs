//! The shape of the filter's source (issue "one request state machine"): which modules may
//! name which, checked on the files themselves so that a change that breaks the layout fails
//! here rather than in review.
//!
//! - no import cycle among the core's modules (`src/policy/*.rs`);
//! - nothing outside the host adapter (`src/filter/host/`) and the crate root names a
//!   `proxy_wasm` item: the request path speaks pinroute's own types.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

fn src() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../src")
}

/// The code of a file, without its comment lines (doc links name modules they do not use).
fn code(path: &Path) -> String {
    std::fs::read_to_string(path)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
        .lines()
        .filter(|line| !line.trim_start().starts_with("//"))
        .collect::<Vec<_>>()
        .join("\n")
}

/// The modules of a folder: its `.rs` files but `mod.rs`, and its subfolders with a `mod.rs`
/// (each as one module), by name, with every file that makes them up.
fn modules(folder: &Path) -> BTreeMap<String, Vec<PathBuf>> {
    let mut modules = BTreeMap::new();
    for entry in std::fs::read_dir(folder).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_stem().unwrap().to_string_lossy().to_string();
        if path.is_dir() && path.join("mod.rs").exists() && name != "tests" {
            modules.insert(name, rust_files(&path));
        } else if path.extension().is_some_and(|e| e == "rs") && name != "mod" {
            modules.insert(name, vec![path]);
        }
    }
    modules
}

fn rust_files(folder: &Path) -> Vec<PathBuf> {
    let mut files = Vec::new();
    for entry in std::fs::read_dir(folder).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            files.extend(rust_files(&path));
        } else if path.extension().is_some_and(|e| e == "rs") {
            files.push(path);
        }
    }
    files
}

/// Which sibling modules each module of `folder` (the crate path `crate::{parent}`) names.
fn imports(folder: &Path, parent: &str) -> BTreeMap<String, BTreeSet<String>> {
    let modules = modules(folder);
    let names: BTreeSet<String> = modules.keys().cloned().collect();
    modules
        .iter()
        .map(|(name, files)| {
            let text: String = files.iter().map(|f| code(f)).collect();
            let braced = names_in_brace_imports(&text);
            let named = names
                .iter()
                .filter(|other| *other != name)
                .filter(|other| {
                    braced.contains(other.as_str())
                        || [
                            format!("super::{other}::"),
                            format!("super::{other};"),
                            format!("crate::{parent}::{other}::"),
                            format!("crate::{parent}::{other};"),
                        ]
                        .iter()
                        .any(|needle| text.contains(needle))
                })
                .cloned()
                .collect();
            (name.clone(), named)
        })
        .collect()
}

/// The module names in `use super::{a, b::C, ...}` lists.
fn names_in_brace_imports(text: &str) -> BTreeSet<&str> {
    let mut names = BTreeSet::new();
    for (at, _) in text.match_indices("use super::{") {
        let rest = &text[at + "use super::{".len()..];
        let list = &rest[..rest.find("};").unwrap_or(rest.len())];
        for item in list.split(',') {
            let head = item.trim().split("::").next().unwrap_or("").trim();
            names.insert(head);
        }
    }
    names
}

/// A cycle in `graph`, as the modules along it, if there is one.
fn cycle(graph: &BTreeMap<String, BTreeSet<String>>) -> Option<Vec<String>> {
    fn visit(
        node: &str,
        graph: &BTreeMap<String, BTreeSet<String>>,
        path: &mut Vec<String>,
        done: &mut BTreeSet<String>,
    ) -> Option<Vec<String>> {
        if let Some(at) = path.iter().position(|n| n == node) {
            let mut found = path[at..].to_vec();
            found.push(node.to_string());
            return Some(found);
        }
        if done.contains(node) {
            return None;
        }
        path.push(node.to_string());
        for next in graph.get(node).into_iter().flatten() {
            if let Some(found) = visit(next, graph, path, done) {
                return Some(found);
            }
        }
        path.pop();
        done.insert(node.to_string());
        None
    }
    let mut done = BTreeSet::new();
    graph
        .keys()
        .find_map(|node| visit(node, graph, &mut Vec::new(), &mut done))
}

#[test]
fn the_core_has_no_import_cycle() {
    let graph = imports(&src().join("policy"), "policy");
    assert!(graph.len() > 10, "{graph:?}");
    assert_eq!(cycle(&graph), None, "src/policy/ imports in a circle");
}

#[test]
fn a_cycle_would_be_found() {
    let graph = BTreeMap::from([
        ("a".to_string(), BTreeSet::from(["b".to_string()])),
        ("b".to_string(), BTreeSet::from(["c".to_string()])),
        ("c".to_string(), BTreeSet::from(["a".to_string()])),
    ]);
    assert_eq!(cycle(&graph).unwrap(), ["a", "b", "c", "a"]);
    let text = "use super::{config::Settings, registry};\nuse super::hop::Hop;";
    assert_eq!(
        names_in_brace_imports(text),
        BTreeSet::from(["config", "registry"])
    );
}

#[test]
fn only_the_host_adapter_names_proxy_wasm() {
    let filter = src().join("filter");
    let host = filter.join("host");
    let mut outside: Vec<String> = rust_files(&src())
        .into_iter()
        .filter(|path| !path.starts_with(&host) && !path.starts_with(src().join("vendor")))
        .filter(|path| path != &src().join("lib.rs"))
        .filter(|path| code(path).contains("proxy_wasm"))
        .map(|path| path.display().to_string())
        .collect();
    outside.sort();
    assert_eq!(
        outside,
        Vec::<String>::new(),
        "name proxy_wasm outside src/filter/host/"
    );
    assert!(
        rust_files(&host)
            .iter()
            .any(|p| code(p).contains("proxy_wasm::"))
    );
}
