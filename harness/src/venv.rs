//! Project-local Python virtualenvs (`.cache/*-venv`): installing into them once, visibly,
//! with concurrent installs serialised.

use std::fs::{self, File};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use anyhow::{Context, Result, bail};

/// Locks `<venv>.lock` (created with its parent folder) until the file is dropped, so that
/// two processes never install into the same venv at once.
pub fn lock_file(venv: &Path) -> Result<File> {
    let parent = venv.parent().unwrap_or(Path::new("."));
    fs::create_dir_all(parent).with_context(|| format!("creating {}", parent.display()))?;
    let path = venv.with_extension("lock");
    let file = File::create(&path).with_context(|| format!("creating {}", path.display()))?;
    file.lock()
        .with_context(|| format!("locking {}", path.display()))?;
    Ok(file)
}

/// `python -m pip install` without prompts or version nags; the caller adds what to install.
pub fn pip_install(python: &Path) -> Command {
    let mut command = Command::new(python);
    command.args([
        "-m",
        "pip",
        "install",
        "--disable-pip-version-check",
        "--no-input",
    ]);
    command
}

/// Runs an install step with its output on stderr, failing on a non-zero exit.
pub fn run_visibly(command: &mut Command) -> Result<()> {
    let description = format!("{command:?}");
    let status = command
        .stdin(Stdio::null())
        .stdout(std::io::stderr())
        .status()
        .with_context(|| format!("running {description}"))?;
    if status.success() {
        Ok(())
    } else {
        bail!("{description} failed: {status}")
    }
}

/// `path` if it names a file (a binary or interpreter given by an environment variable).
pub fn existing_file(path: PathBuf) -> Result<PathBuf> {
    if path.is_file() {
        Ok(path)
    } else {
        bail!("{} is not a file", path.display())
    }
}

/// Single-quotes a word unless it is made of characters a shell leaves alone.
pub fn shell_quote(word: &str) -> String {
    let plain = |c: char| c.is_ascii_alphanumeric() || "-_./=:,+@%".contains(c);
    if !word.is_empty() && word.chars().all(plain) {
        word.to_owned()
    } else {
        format!("'{}'", word.replace('\'', r"'\''"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quotes_only_what_needs_it() {
        assert_eq!(shell_quote("--port"), "--port");
        assert_eq!(shell_quote(r#"{"a":1}"#), r#"'{"a":1}'"#);
        assert_eq!(shell_quote("it's"), r"'it'\''s'");
        assert_eq!(shell_quote(""), "''");
    }
}
