//! The shape of the filter's source (`README.md`, "Layout"): which modules may name which,
//! checked on the files themselves so that a change that breaks the layout fails here rather
//! than in review.
//!
//! - no import cycle among the core's modules (`src/policy/`) nor among the filter's
//!   (`src/filter/`, test modules aside);
//! - a phase is made or changed only in `src/filter/stream.rs`, and `Env` has methods only in
//!   `src/filter/env.rs`;
//! - nothing outside the host adapter (`src/filter/host/`) and the crate root names a
//!   `proxy_wasm` item: the request path speaks pinroute's own types;
//! - nothing outside the native host (`src/filter/host/dynamic/`) names the dynamic-module
//!   ABI.

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
    files.sort();
    files
}

/// The module path of a file below `root` (`host/envoy.rs` is `host::envoy`, `host/mod.rs`
/// is `host`); `None` for test modules.
fn module_of(root: &Path, file: &Path) -> Option<String> {
    let relative = file.strip_prefix(root).unwrap().with_extension("");
    let mut parts: Vec<String> = relative
        .components()
        .map(|c| c.as_os_str().to_string_lossy().to_string())
        .collect();
    if parts.first().is_some_and(|p| p == "tests") {
        return None;
    }
    if parts.last().is_some_and(|p| p == "mod") {
        parts.pop();
    }
    Some(parts.join("::"))
}

/// The module paths that `text` (the code of module `module` of crate module `parent`) names:
/// `super::x`, `super::{x, y::Z}` and `crate::{parent}::x`, each resolved to the longest
/// known module.
fn named_modules(
    text: &str,
    module: &str,
    parent: &str,
    known: &BTreeSet<String>,
) -> BTreeSet<String> {
    let enclosing: Vec<&str> = module.split("::").collect();
    let above = enclosing[..enclosing.len() - 1].join("::");
    let mut paths: Vec<String> = Vec::new();
    let mut after = |prefix: &str, base: &str| {
        for (at, _) in text.match_indices(prefix) {
            let rest = &text[at + prefix.len()..];
            let joined = |tail: &str| match base {
                "" => tail.to_string(),
                base => format!("{base}::{tail}"),
            };
            if let Some(list) = rest.strip_prefix('{') {
                let list = &list[..list.find('}').unwrap_or(list.len())];
                paths.extend(list.split(',').map(|item| joined(item.trim())));
            } else {
                let end = rest
                    .find(|c: char| !(c.is_alphanumeric() || c == '_' || c == ':'))
                    .unwrap_or(rest.len());
                paths.push(joined(&rest[..end]));
            }
        }
    };
    after("super::", &above);
    after(&format!("crate::{parent}::"), "");
    paths
        .iter()
        .filter_map(|path| longest_module(path, known))
        .filter(|named| named != module)
        .collect()
}

fn longest_module(path: &str, known: &BTreeSet<String>) -> Option<String> {
    let parts: Vec<&str> = path.split("::").map(str::trim).collect();
    (1..=parts.len())
        .rev()
        .map(|n| parts[..n].join("::"))
        .find(|candidate| known.contains(candidate))
}

/// Which modules each module below `src/{parent}/` names.
fn imports(parent: &str) -> BTreeMap<String, BTreeSet<String>> {
    let root = src().join(parent);
    let files: Vec<(String, PathBuf)> = rust_files(&root)
        .into_iter()
        .filter_map(|file| Some((module_of(&root, &file)?, file)))
        .collect();
    let known: BTreeSet<String> = files.iter().map(|(module, _)| module.clone()).collect();
    files
        .iter()
        .map(|(module, file)| {
            let named = named_modules(&code(file), module, parent, &known);
            (module.clone(), named)
        })
        .collect()
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

/// The filter's files (test modules aside) whose code matches `needle`.
fn filter_files_naming(needle: impl Fn(&str) -> bool) -> Vec<String> {
    let root = src().join("filter");
    rust_files(&root)
        .into_iter()
        .filter(|file| module_of(&root, file).is_some())
        .filter(|file| needle(&code(file)))
        .map(|file| file.strip_prefix(&root).unwrap().display().to_string())
        .collect()
}

#[test]
fn the_core_has_no_import_cycle() {
    let graph = imports("policy");
    assert!(graph.len() > 10, "{graph:?}");
    assert_eq!(cycle(&graph), None, "src/policy/ imports in a circle");
}

#[test]
fn the_filter_has_no_import_cycle() {
    let graph = imports("filter");
    assert!(graph["stream"].contains("prefill"), "{graph:?}");
    assert!(graph["host::contexts"].contains("stream"), "{graph:?}");
    assert_eq!(
        cycle(&graph),
        None,
        "src/filter/ imports in a circle: {graph:?}"
    );
}

#[test]
fn a_cycle_would_be_found() {
    let known: BTreeSet<String> = ["a", "b", "c", "host", "host::envoy"]
        .map(String::from)
        .into();
    let text = "use super::{b::Thing, c};\nuse crate::filter::host::Flow;";
    assert_eq!(
        named_modules(text, "a", "filter", &known),
        ["b", "c", "host"].map(String::from).into()
    );
    assert_eq!(
        named_modules("use super::Headers;", "host::envoy", "filter", &known),
        ["host"].map(String::from).into()
    );
    let graph = BTreeMap::from([
        ("a".to_string(), BTreeSet::from(["b".to_string()])),
        ("b".to_string(), BTreeSet::from(["c".to_string()])),
        ("c".to_string(), BTreeSet::from(["a".to_string()])),
    ]);
    assert_eq!(cycle(&graph).unwrap(), ["a", "b", "c", "a"]);
}

#[test]
fn only_the_stream_makes_or_changes_a_phase() {
    assert_eq!(
        filter_files_naming(|code| code.contains("Phase::")),
        ["stream.rs"]
    );
}

#[test]
fn env_has_methods_only_in_env_rs() {
    let implements_env = |code: &str| {
        code.lines().any(|line| {
            let line = line.trim_start();
            line.starts_with("impl")
                && line
                    .split_whitespace()
                    .any(|w| w.starts_with("Env<") || w == "Env")
        })
    };
    assert_eq!(filter_files_naming(implements_env), ["env.rs"]);
}

#[test]
fn only_the_host_adapter_names_proxy_wasm() {
    let host = src().join("filter").join("host");
    let outside: Vec<String> = rust_files(&src())
        .into_iter()
        .filter(|path| !path.starts_with(&host) && !path.starts_with(src().join("vendor")))
        .filter(|path| path != &src().join("lib.rs"))
        .filter(|path| code(path).contains("proxy_wasm"))
        .map(|path| path.display().to_string())
        .collect();
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

#[test]
fn only_the_native_host_names_the_dynamic_module_abi() {
    let dynamic = src().join("filter").join("host").join("dynamic");
    let outside: Vec<String> = rust_files(&src())
        .into_iter()
        .filter(|path| !path.starts_with(&dynamic))
        .filter(|path| code(path).contains("envoy_dynamic_module"))
        .map(|path| path.display().to_string())
        .collect();
    assert_eq!(
        outside,
        Vec::<String>::new(),
        "name the dynamic-module ABI outside src/filter/host/dynamic/"
    );
    assert!(
        rust_files(&dynamic)
            .iter()
            .any(|p| code(p).contains("envoy_dynamic_module_callback_"))
    );
}
