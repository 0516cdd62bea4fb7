//! The paths in a launch config. A launched trainer runs in its run directory
//! (`<data dir>/runs/<id>/`), where a relative path means nothing the user meant, so at admission
//! every relative path is resolved against the launch's base directory: the request's
//! `working_dir` (`trainyard submit` sends the directory it runs in), else the server's working
//! directory. The stored config holds the absolute paths the run will use. What the run reads
//! must exist now, or the launch is refused naming the key. A token cache left at its default is
//! the server's one cache, `<data dir>/cache/tokens`, so launched runs share their tokens.

use std::io::ErrorKind;
use std::path::{Path, PathBuf};

use trainer::config::{Config, DataConfig};

use crate::validate::Invalid;

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

/// The server's token cache under its data directory.
pub fn server_token_cache(data_dir: &Path) -> PathBuf {
    data_dir.join("cache").join("tokens")
}

/// Rewrites the config's paths as absolute paths (see the module comment) and checks that what
/// the run reads exists.
pub fn resolve_paths(cfg: &mut Config, base: &Base, token_cache: &Path) -> Result<(), Invalid> {
    let data = &mut cfg.data;
    let dataset = data.dataset.trim().to_string();
    if !matches!(dataset.as_str(), "dummy" | "demo") && !dataset.is_empty() {
        data.dataset = resolve_dataset(&dataset, base)?;
    }
    if !matches!(data.tokenizer.as_str(), "bytes" | "bpe") && !data.tokenizer.trim().is_empty() {
        let written = data.tokenizer.clone();
        let path = base.resolve(&written);
        check_exists("data.tokenizer", &path, Kind::File, &base.how(&written))?;
        data.tokenizer = path.display().to_string();
    }
    data.cache_dir = if data.cache_dir == DataConfig::default().cache_dir {
        token_cache.display().to_string()
    } else {
        base.resolve(&data.cache_dir).display().to_string()
    };
    if let Some(written) = cfg.training.init_from.clone() {
        // `latest` names the run's own newest checkpoint, which a fresh launch cannot have; the
        // trainer says so itself.
        if written != "latest" && !written.trim().is_empty() {
            cfg.training.init_from = Some(resolve_weights("training.init_from", &written, base)?);
        }
    }
    let reference = cfg.training.dpo.reference.clone();
    // `init` is the run's own starting model; anything else is a checkpoint or `hf:` directory.
    if reference.trim() != "init" && !reference.trim().is_empty() {
        cfg.training.dpo.reference = resolve_weights("training.dpo.reference", &reference, base)?;
    }
    Ok(())
}

/// Starting or reference weights: a checkpoint directory, or `hf:PATH`, a Hugging Face
/// directory, whose path resolves the same way and which must hold the `config.json` the trainer
/// reads the model's shape from. The prefix is kept.
fn resolve_weights(key: &str, written: &str, base: &Base) -> Result<String, Invalid> {
    let Some(rest) = written.strip_prefix(trainer::hf::PREFIX) else {
        let path = base.resolve(written);
        check_exists(key, &path, Kind::Dir, &base.how(written))?;
        return Ok(path.display().to_string());
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
    Ok(format!("{}{}", trainer::hf::PREFIX, path.display()))
}

/// A dataset file, directory or glob, made absolute; a glob must match something.
fn resolve_dataset(written: &str, base: &Base) -> Result<String, Invalid> {
    if !written.contains(['*', '?', '[']) {
        let path = base.resolve(written);
        check_exists("data.dataset", &path, Kind::Any, &base.how(written))?;
        return Ok(path.display().to_string());
    }
    // The base directory is literal text inside the pattern.
    let pattern = if Path::new(written).is_absolute() {
        written.to_string()
    } else {
        let dir = glob::Pattern::escape(&base.dir.display().to_string());
        format!("{}/{written}", dir.trim_end_matches('/'))
    };
    let matched = glob::glob(&pattern)
        .map_err(|e| {
            Invalid::new(
                "data.dataset",
                format!(
                    "data.dataset: `{written}` is not a valid glob pattern: {}",
                    e.msg
                ),
            )
        })?
        .next()
        .is_some();
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
mod tests {
    use super::*;

    fn base(dir: &Path) -> Base {
        Base::of(Some(&dir.display().to_string()), Path::new("/nowhere")).unwrap()
    }

    #[test]
    fn a_hugging_face_directory_keeps_its_prefix_and_resolves_like_other_paths() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join("gpt2")).unwrap();
        std::fs::write(dir.path().join("gpt2/config.json"), "{}").unwrap();
        std::fs::create_dir_all(dir.path().join("empty")).unwrap();
        let root = dir.path().display();
        let mut cfg = Config::default();
        cfg.training.init_from = Some("hf: gpt2".into());
        cfg.training.dpo.reference = "hf:gpt2".into();
        resolve_paths(&mut cfg, &base(dir.path()), Path::new("/c")).unwrap();
        let want = format!("hf:{root}/gpt2");
        assert_eq!(cfg.training.init_from.as_deref(), Some(want.as_str()));
        assert_eq!(cfg.training.dpo.reference, want);
        // An absolute path stays as written.
        cfg.training.init_from = Some(want.clone());
        cfg.training.dpo.reference = "init".into();
        resolve_paths(&mut cfg, &base(dir.path()), Path::new("/c")).unwrap();
        assert_eq!(cfg.training.init_from.as_deref(), Some(want.as_str()));
        assert_eq!(cfg.training.dpo.reference, "init");

        let cases = [
            ("hf:missing", format!("{root}/missing does not exist")),
            (
                "hf:empty",
                format!("{root}/empty/config.json does not exist"),
            ),
            ("hf:gpt2/config.json", "is a file".to_string()),
            ("hf:", "hf: needs the path".to_string()),
        ];
        for (written, needle) in &cases {
            for key in ["training.init_from", "training.dpo.reference"] {
                let mut cfg = Config::default();
                if key == "training.init_from" {
                    cfg.training.init_from = Some(written.to_string());
                } else {
                    cfg.training.dpo.reference = written.to_string();
                }
                let e = resolve_paths(&mut cfg, &base(dir.path()), Path::new("/c")).unwrap_err();
                assert_eq!(e.field, key, "{written}");
                assert!(
                    e.message.contains(needle.as_str()),
                    "{written}: {}",
                    e.message
                );
            }
        }
    }

    #[test]
    fn relative_paths_become_absolute_under_the_base_and_the_default_cache_is_the_servers() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join("corpus")).unwrap();
        std::fs::write(dir.path().join("corpus/a.txt"), "text").unwrap();
        std::fs::write(dir.path().join("tok.json"), "{}").unwrap();
        let mut cfg = Config::default();
        cfg.data.dataset = "corpus/*.txt".into();
        cfg.data.tokenizer = "tok.json".into();
        resolve_paths(&mut cfg, &base(dir.path()), Path::new("/srv/cache/tokens")).unwrap();
        let root = dir.path().display();
        assert_eq!(cfg.data.dataset, format!("{root}/corpus/*.txt"));
        assert_eq!(cfg.data.tokenizer, format!("{root}/tok.json"));
        assert_eq!(cfg.data.cache_dir, "/srv/cache/tokens");

        cfg.data.dataset = "corpus".into();
        cfg.data.cache_dir = "my-cache".into();
        resolve_paths(&mut cfg, &base(dir.path()), Path::new("/srv/cache/tokens")).unwrap();
        assert_eq!(cfg.data.dataset, format!("{root}/corpus"));
        assert_eq!(cfg.data.cache_dir, format!("{root}/my-cache"));
    }

    #[test]
    fn missing_inputs_are_refused_naming_the_key_and_the_resolved_path() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("file.txt"), "text").unwrap();
        let cases: &[(&str, &str, &str, &str)] = &[
            (
                "data.dataset",
                "missing.txt",
                "does not exist",
                "missing.txt",
            ),
            (
                "data.dataset",
                "none/*.txt",
                "no file matches",
                "none/*.txt",
            ),
            ("data.tokenizer", "tok.json", "does not exist", "tok.json"),
            ("data.tokenizer", ".", "is a directory", ""),
            (
                "training.init_from",
                "file.txt",
                "not a checkpoint directory",
                "file.txt",
            ),
        ];
        for (key, value, reason, tail) in cases {
            let mut cfg = Config::default();
            match *key {
                "data.dataset" => cfg.data.dataset = value.to_string(),
                "data.tokenizer" => cfg.data.tokenizer = value.to_string(),
                _ => cfg.training.init_from = Some(value.to_string()),
            }
            let e = resolve_paths(&mut cfg, &base(dir.path()), Path::new("/c")).unwrap_err();
            assert_eq!(e.field, *key, "{value}");
            assert!(e.message.contains(reason), "{value}: {}", e.message);
            let resolved = format!("{}/{tail}", dir.path().display());
            assert!(e.message.contains(&resolved), "{value}: {}", e.message);
        }
    }

    #[test]
    fn a_relative_working_dir_is_refused_and_none_means_the_servers_directory() {
        let e = Base::of(Some("proj"), Path::new("/srv")).err().unwrap();
        assert_eq!(e.field, "working_dir");
        let b = Base::of(None, Path::new("/srv")).unwrap();
        assert_eq!(b.resolve("x.txt"), PathBuf::from("/srv/x.txt"));
        assert!(b.how("x.txt").contains("server's working directory /srv"));
    }
}
