//! Replays the committed seed corpus through every check without a fuzzer: `cargo test`
//! in `fuzz/` catches a property the core stopped keeping on a known input.

use std::path::PathBuf;

use arbitrary::{Arbitrary, Unstructured};

fn seeds(target: &str) -> Vec<(PathBuf, Vec<u8>)> {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("seeds")
        .join(target);
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    files.sort();
    assert!(!files.is_empty(), "no seeds in {}", dir.display());
    files
        .into_iter()
        .map(|path| (path.clone(), std::fs::read(path).unwrap()))
        .collect()
}

fn replay(target: &str, check: impl Fn(&[u8])) {
    for (path, data) in seeds(target) {
        eprintln!("{}", path.display());
        check(&data);
    }
}

fn structured<'a, T: Arbitrary<'a>>(data: &'a [u8]) -> Option<T> {
    T::arbitrary_take_rest(Unstructured::new(data)).ok()
}

#[test]
fn config() {
    replay("config", crate::config::check);
}

#[test]
fn headers() {
    replay("headers", crate::headers::check);
}

#[test]
fn json_object() {
    replay("json_object", crate::json_object::check);
}

#[test]
fn rewrite() {
    replay("rewrite", crate::rewrite::check);
}

#[test]
fn metrics_page() {
    replay("metrics_page", crate::metrics_page::check);
}

#[test]
fn trace() {
    replay("trace", crate::trace::check);
}

#[test]
fn nvext() {
    replay("nvext", |data| {
        structured(data).iter().for_each(crate::nvext::check)
    });
}

#[test]
fn resolve() {
    replay("resolve", |data| {
        structured(data).iter().for_each(crate::resolve::check)
    });
}
