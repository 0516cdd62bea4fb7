//! The paths in a launch config. A launched trainer runs in its run directory
//! (`<data dir>/runs/<id>/`), where a relative path means nothing the user meant, so at admission
//! every relative path is resolved against the launch's base directory: the request's
//! `working_dir` (`trainyard submit` sends the directory it runs in), else the server's working
//! directory. The stored config holds the absolute paths the run will use. What the run reads
//! must exist now, or the launch is refused naming the key.
//!
//! What the run reads must also lie, symlinks followed, inside a data root
//! (`launcher::roots`), or be a checkpoint of a run its launcher may read (the caller checks
//! that access: see [`RunPath`]); anything else is refused naming the key, the resolved path and
//! the roots. The token cache is the server's one cache, `<data dir>/cache/tokens`, shared by
//! launched runs, or a folder of the run itself (a relative `data.cache_dir`, kept relative:
//! the run starts in its run directory).

use std::io::ErrorKind;
use std::path::{Component, Path, PathBuf};

use trainer::config::{Config, DataConfig};

use crate::launcher::roots::DataRoots;
use crate::validate::Invalid;

/// Most files of a dataset glob checked against the roots at admission (the confinement covers
/// the rest while the run executes).
const MAX_GLOB_CHECKED: usize = 10_000;

/// Where the paths of a launch may point.
pub struct Allowed<'a> {
    pub roots: &'a DataRoots,
    /// `<data dir>/runs`, canonical: a checkpoint of a run there is a [`RunPath`].
    pub runs_dir: &'a Path,
    /// The server's token cache (`<data dir>/cache/tokens`).
    pub token_cache: &'a Path,
}

/// A path of the config inside another run's checkpoints: admitted only when the launcher may
/// read that run, which the caller checks; otherwise it is refused with `refusal`, the same
/// words as any path outside the roots, so a run one may not read is not revealed.
#[derive(Debug, Clone, PartialEq)]
pub struct RunPath {
    pub run_id: String,
    /// The canonical checkpoint directory the run will read.
    pub path: PathBuf,
    pub refusal: Invalid,
}

/// Where relative paths of a launch resolve, and how a message names it.
pub struct Base {
    pub dir: PathBuf,
    /// `the working_dir /home/u/project` or `the server's working directory /srv`.
    pub described: String,
}

impl Base {
    /// The request's `working_dir` (absolute, or refused naming the field), else `server_dir`.
    pub fn of(working_dir: Option<&str>, server_dir: &Path) -> Result<Base, Invalid> {
        match working_dir.map(str::trim) {
            Some(dir) if !dir.is_empty() => {
                if !Path::new(dir).is_absolute() {
                    return Err(Invalid::new(
                        "working_dir",
                        format!("working_dir must be an absolute path, got `{dir}`"),
                    ));
                }
                Ok(Base {
                    dir: PathBuf::from(dir),
                    described: format!("the working_dir {dir}"),
                })
            }
            _ => Ok(Base {
                dir: server_dir.to_path_buf(),
                described: format!("the server's working directory {}", server_dir.display()),
            }),
        }
    }

    /// `path` as an absolute path (itself when already absolute).
    fn resolve(&self, path: &str) -> PathBuf {
        self.dir.join(path)
    }

    /// How `written` became `resolved`, for a message ("" when it was absolute already).
    fn how(&self, written: &str) -> String {
        if Path::new(written).is_absolute() {
            String::new()
        } else {
            format!(" (`{written}` resolved against {})", self.described)
        }
    }
}

/// Rewrites the config's paths as absolute paths and checks that what the run reads exists and
/// lies where runs may read (see the module comment). Returns the other runs' checkpoints the
/// config starts from, whose access the caller checks.
pub fn resolve_paths(
    cfg: &mut Config,
    base: &Base,
    allowed: &Allowed<'_>,
) -> Result<Vec<RunPath>, Invalid> {
    let mut run_paths = Vec::new();
    let data = &mut cfg.data;
    let dataset = data.dataset.trim().to_string();
    if !matches!(dataset.as_str(), "dummy" | "demo") && !dataset.is_empty() {
        data.dataset = resolve_dataset(&dataset, base, allowed.roots)?;
    }
    if !matches!(data.tokenizer.as_str(), "bytes" | "bpe") && !data.tokenizer.trim().is_empty() {
        let written = data.tokenizer.clone();
        let path = base.resolve(&written);
        check_exists("data.tokenizer", &path, Kind::File, &base.how(&written))?;
        check_in_roots("data.tokenizer", &path, allowed.roots)?;
        data.tokenizer = path.display().to_string();
    }
    data.cache_dir = resolve_cache_dir(&data.cache_dir, allowed.token_cache)?;
    if let Some(written) = cfg.training.init_from.clone() {
        // `latest` names the run's own newest checkpoint, which a fresh launch cannot have; the
        // trainer says so itself.
        if written != "latest" && !written.trim().is_empty() {
            let (path, run) = resolve_weights("training.init_from", &written, base, allowed)?;
            cfg.training.init_from = Some(path);
            run_paths.extend(run);
        }
    }
    let reference = cfg.training.dpo.reference.clone();
    // `init` is the run's own starting model; anything else is a checkpoint or `hf:` directory.
    if reference.trim() != "init" && !reference.trim().is_empty() {
        let (path, run) = resolve_weights("training.dpo.reference", &reference, base, allowed)?;
        cfg.training.dpo.reference = path;
        run_paths.extend(run);
    }
    Ok(run_paths)
}

/// `data.cache_dir`: the default is the server's token cache; an absolute path must lie in it;
/// a relative one without `..` is a folder of the run and stays relative.
fn resolve_cache_dir(written: &str, token_cache: &Path) -> Result<String, Invalid> {
    const KEY: &str = "data.cache_dir";
    if written == DataConfig::default().cache_dir {
        return Ok(token_cache.display().to_string());
    }
    let path = Path::new(written.trim());
    let inside_run = !path.as_os_str().is_empty()
        && path.components().all(|c| matches!(c, Component::Normal(_)));
    if inside_run {
        return Ok(written.trim().to_string());
    }
    if path.is_absolute() && canonical_prefix(path).starts_with(canonical_prefix(token_cache)) {
        return Ok(path.display().to_string());
    }
    Err(Invalid::new(
        KEY,
        format!(
            "{KEY}: `{written}` is neither the server's token cache {} nor a folder of the run \
             (a relative path without `..`, such as `cache`)",
            token_cache.display()
        ),
    ))
}

/// The canonical form of the longest existing prefix of `path`, with the rest appended.
fn canonical_prefix(path: &Path) -> PathBuf {
    let mut existing = path.to_path_buf();
    let mut rest = Vec::new();
    loop {
        if let Ok(canonical) = std::fs::canonicalize(&existing) {
            return rest.iter().rev().fold(canonical, |p, c| p.join(c));
        }
        match (
            existing.file_name().map(|n| n.to_os_string()),
            existing.parent(),
        ) {
            (Some(name), Some(parent)) => {
                rest.push(name);
                existing = parent.to_path_buf();
            }
            _ => return path.to_path_buf(),
        }
    }
}

/// An existing path the run reads must resolve, symlinks followed, inside a data root.
fn check_in_roots(key: &str, path: &Path, roots: &DataRoots) -> Result<(), Invalid> {
    let canonical = canonical_prefix(path);
    if roots.contain(&canonical) {
        return Ok(());
    }
    Err(outside_roots(key, path, &canonical, roots))
}

fn outside_roots(key: &str, path: &Path, canonical: &Path, roots: &DataRoots) -> Invalid {
    let resolved = if canonical != path {
        format!(" (it resolves to {})", canonical.display())
    } else {
        String::new()
    };
    Invalid::new(
        key,
        format!(
            "{key}: {}{resolved} is outside the data roots ({}); a launched run may read only \
             files under a data root, which an operator adds with `trainyard serve --data-root \
             DIR`",
            path.display(),
            roots.describe()
        ),
    )
}

/// A checkpoint directory may lie in a data root, or be a checkpoint of a run on this server.
fn check_weights_place(
    key: &str,
    path: &Path,
    allowed: &Allowed<'_>,
) -> Result<Option<RunPath>, Invalid> {
    let canonical = canonical_prefix(path);
    if allowed.roots.contain(&canonical) {
        return Ok(None);
    }
    let refusal = outside_roots(key, path, &canonical, allowed.roots);
    let mut parts = match canonical.strip_prefix(allowed.runs_dir) {
        Ok(rest) => rest.components(),
        Err(_) => return Err(refusal),
    };
    match (parts.next(), parts.next()) {
        (Some(Component::Normal(id)), Some(Component::Normal(folder)))
            if Path::new(folder) == trainer::checkpoint::checkpoints_dir(Path::new("")) =>
        {
            Ok(Some(RunPath {
                run_id: id.to_string_lossy().into_owned(),
                path: canonical,
                refusal,
            }))
        }
        _ => Err(refusal),
    }
}

/// Starting or reference weights: a checkpoint directory, or `hf:PATH`, a Hugging Face
/// directory, whose path resolves the same way and which must hold the `config.json` the trainer
/// reads the model's shape from. The prefix is kept.
fn resolve_weights(
    key: &str,
    written: &str,
    base: &Base,
    allowed: &Allowed<'_>,
) -> Result<(String, Option<RunPath>), Invalid> {
    let Some(rest) = written.strip_prefix(trainer::hf::PREFIX) else {
        let path = base.resolve(written);
        check_exists(key, &path, Kind::Dir, &base.how(written))?;
        let run = check_weights_place(key, &path, allowed)?;
        return Ok((path.display().to_string(), run));
    };
    let rest = rest.trim();
    if rest.is_empty() {
        return Err(Invalid::new(
            key,
            format!("{key}: hf: needs the path of a Hugging Face model directory after it"),
        ));
    }
    let path = base.resolve(rest);
    let how = base.how(rest);
    check_exists(key, &path, Kind::Dir, &how)?;
    check_exists(
        key,
        &path.join(trainer::hf::CONFIG_FILE),
        Kind::File,
        &format!(
            " (a Hugging Face model directory holds {})",
            trainer::hf::CONFIG_FILE
        ),
    )?;
    check_in_roots(key, &path, allowed.roots)?;
    Ok((format!("{}{}", trainer::hf::PREFIX, path.display()), None))
}

/// A dataset file, directory or glob, made absolute; a glob must match something.
fn resolve_dataset(written: &str, base: &Base, roots: &DataRoots) -> Result<String, Invalid> {
    const KEY: &str = "data.dataset";
    if !written.contains(['*', '?', '[']) {
        let path = base.resolve(written);
        check_exists(KEY, &path, Kind::Any, &base.how(written))?;
        check_in_roots(KEY, &path, roots)?;
        return Ok(path.display().to_string());
    }
    // The base directory is literal text inside the pattern.
    let pattern = if Path::new(written).is_absolute() {
        written.to_string()
    } else {
        let dir = glob::Pattern::escape(&base.dir.display().to_string());
        format!("{}/{written}", dir.trim_end_matches('/'))
    };
    let mut matches = glob::glob(&pattern)
        .map_err(|e| {
            Invalid::new(
                KEY,
                format!("{KEY}: `{written}` is not a valid glob pattern: {}", e.msg),
            )
        })?
        .filter_map(Result::ok)
        .take(MAX_GLOB_CHECKED)
        .peekable();
    let matched = matches.peek().is_some();
    // The folder the pattern starts from, and every file it matches now.
    let literal: PathBuf = Path::new(&pattern)
        .components()
        .take_while(|c| !c.as_os_str().to_string_lossy().contains(['*', '?', '[']))
        .collect();
    check_in_roots(KEY, &literal, roots)?;
    for path in matches {
        check_in_roots(KEY, &path, roots)?;
    }
    if !matched {
        return Err(Invalid::new(
            "data.dataset",
            format!(
                "data.dataset: no file matches {}{}",
                base.resolve(written).display(),
                base.how(written)
            ),
        ));
    }
    Ok(base.resolve(written).display().to_string())
}

#[derive(Clone, Copy, PartialEq)]
enum Kind {
    File,
    Dir,
    Any,
}

fn check_exists(key: &str, path: &Path, kind: Kind, how: &str) -> Result<(), Invalid> {
    let shown = path.display();
    let problem = match std::fs::metadata(path) {
        Ok(meta) if kind == Kind::File && meta.is_dir() => {
            format!("{shown} is a directory, not a file")
        }
        Ok(meta) if kind == Kind::Dir && !meta.is_dir() => {
            format!("{shown} is a file, not a checkpoint directory")
        }
        Ok(_) => return Ok(()),
        Err(e) if e.kind() == ErrorKind::NotFound => format!("{shown} does not exist"),
        Err(e) if e.kind() == ErrorKind::PermissionDenied => {
            format!("the server may not read {shown} (permission denied)")
        }
        Err(e) => format!("{shown} cannot be read: {}", e.kind()),
    };
    Err(Invalid::new(key, format!("{key}: {problem}{how}")))
}

#[cfg(test)]
mod tests;
