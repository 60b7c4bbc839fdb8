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

/// The python of `venv` with `requirements` (a pip requirements file) installed: the venv is
/// made on first use and installed into again whenever the file changes.
pub fn python_with(venv: &Path, requirements: &Path) -> Result<PathBuf> {
    let wanted = fs::read_to_string(requirements)
        .with_context(|| format!("reading {}", requirements.display()))?;
    python_installed(venv, &wanted, |pip| pip.arg("-r").arg(requirements))
}

/// The python of `venv` once `install` (given pip's install command, to which it adds what
/// to install) has run for `wanted`: the venv is made on first use, and `install` runs again
/// whenever `wanted` differs from what the venv records (a copy of it, written after).
pub fn python_installed(
    venv: &Path,
    wanted: &str,
    install: impl FnOnce(&mut Command) -> &mut Command,
) -> Result<PathBuf> {
    const STAMP: &str = "requirements.installed";
    let python = venv.join("bin/python");
    let stamp = venv.join(STAMP);
    let installed = || python.is_file() && fs::read_to_string(&stamp).is_ok_and(|s| s == wanted);
    if installed() {
        return Ok(python);
    }
    let _lock = lock_file(venv)?;
    if installed() {
        return Ok(python);
    }
    if !python.is_file() {
        eprintln!("pinroute: python3 -m venv {}", venv.display());
        run_visibly(Command::new("python3").arg("-m").arg("venv").arg(venv))?;
    }
    let mut pip = pip_install(&python);
    let pip = install(&mut pip);
    eprintln!("pinroute: {pip:?} into {}", venv.display());
    run_visibly(pip)?;
    fs::write(&stamp, wanted).with_context(|| format!("writing {}", stamp.display()))?;
    Ok(python)
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
