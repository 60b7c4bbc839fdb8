//! The tiny deterministic Llama model the CPU pair serves, generated locally by
//! `harness/python/make_model.py` (no model hub is reachable) and cached by script version.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use anyhow::{Context, Result, bail};

use super::scripts::{MAKE_MODEL_PY, fingerprint, write_script};

/// The name the CPU pair serves the model under (`--served-model-name`).
pub const TINY_MODEL_NAME: &str = "pinroute-tiny-llama";
/// Where generated models live, relative to the repository root.
pub const MODELS_DIR: &str = ".cache/models";

/// The model folder for the current `make_model.py`, generated with `python` when missing.
/// The folder is written under a temporary name and renamed, so it exists only when complete.
pub fn ensure_model(python: &Path, repo_root: &Path) -> Result<PathBuf> {
    let model = tiny_model_dir(repo_root);
    if model.join("config.json").is_file() {
        return Ok(model);
    }
    let parent = repo_root.join(MODELS_DIR);
    fs::create_dir_all(&parent).with_context(|| format!("creating {}", parent.display()))?;
    let staging = tempfile::Builder::new()
        .prefix(".making-")
        .tempdir_in(&parent)
        .with_context(|| format!("creating a folder in {}", parent.display()))?;
    generate(python, staging.path())?;
    let made = staging.keep();
    if let Err(e) = fs::rename(&made, &model) {
        let _ = fs::remove_dir_all(&made);
        if !model.join("config.json").is_file() {
            return Err(e).with_context(|| format!("moving the model to {}", model.display()));
        }
    }
    Ok(model)
}

/// `<repo_root>/.cache/models/pinroute-tiny-llama-<fingerprint of make_model.py>`.
pub fn tiny_model_dir(repo_root: &Path) -> PathBuf {
    repo_root
        .join(MODELS_DIR)
        .join(format!("{TINY_MODEL_NAME}-{}", fingerprint(MAKE_MODEL_PY)))
}

fn generate(python: &Path, output: &Path) -> Result<()> {
    let started = Instant::now();
    eprintln!(
        "pinroute-harness: generating the tiny model in {}",
        output.display()
    );
    let script = write_script(output, "make_model.py", MAKE_MODEL_PY)?;
    let result = Command::new(python)
        .arg(&script)
        .arg(output)
        .env("HF_HUB_OFFLINE", "1")
        .env("TRANSFORMERS_OFFLINE", "1")
        .output()
        .with_context(|| format!("running {} {}", python.display(), script.display()))?;
    fs::remove_file(&script).with_context(|| format!("removing {}", script.display()))?;
    if !result.status.success() {
        bail!(
            "make_model.py failed ({}):\n{}",
            result.status,
            String::from_utf8_lossy(&result.stderr)
        );
    }
    eprintln!(
        "pinroute-harness: model generated in {:.1?}",
        started.elapsed()
    );
    Ok(())
}
