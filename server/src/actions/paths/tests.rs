//! Path resolution and confinement of launch configs.

use super::*;

fn base(dir: &Path) -> Base {
    Base::of(Some(&dir.display().to_string()), Path::new("/nowhere")).unwrap()
}

/// Paths may lie anywhere in `dir`; the token cache is `cache`.
fn resolve(cfg: &mut Config, dir: &Path, cache: &str) -> Result<Vec<RunPath>, Invalid> {
    let roots = DataRoots::from_canonical(vec![std::fs::canonicalize(dir).unwrap()]);
    let allowed = Allowed {
        roots: &roots,
        runs_dir: Path::new("/nowhere/runs"),
        token_cache: Path::new(cache),
    };
    resolve_paths(cfg, &base(dir), &allowed)
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
    resolve(&mut cfg, dir.path(), "/c").unwrap();
    let want = format!("hf:{root}/gpt2");
    assert_eq!(cfg.training.init_from.as_deref(), Some(want.as_str()));
    assert_eq!(cfg.training.dpo.reference, want);
    // An absolute path stays as written.
    cfg.training.init_from = Some(want.clone());
    cfg.training.dpo.reference = "init".into();
    resolve(&mut cfg, dir.path(), "/c").unwrap();
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
            let e = resolve(&mut cfg, dir.path(), "/c").unwrap_err();
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
    resolve(&mut cfg, dir.path(), "/srv/cache/tokens").unwrap();
    let root = dir.path().display();
    assert_eq!(cfg.data.dataset, format!("{root}/corpus/*.txt"));
    assert_eq!(cfg.data.tokenizer, format!("{root}/tok.json"));
    assert_eq!(cfg.data.cache_dir, "/srv/cache/tokens");

    cfg.data.dataset = "corpus".into();
    cfg.data.cache_dir = "my-cache".into();
    resolve(&mut cfg, dir.path(), "/srv/cache/tokens").unwrap();
    assert_eq!(cfg.data.dataset, format!("{root}/corpus"));
    assert_eq!(cfg.data.cache_dir, "my-cache", "a folder of the run");
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
        let e = resolve(&mut cfg, dir.path(), "/c").unwrap_err();
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

#[test]
fn a_path_outside_the_roots_is_refused_naming_the_key_the_resolved_path_and_the_roots() {
    let root = tempfile::tempdir().unwrap();
    let outside = tempfile::tempdir().unwrap();
    std::fs::write(outside.path().join("secret.txt"), "private").unwrap();
    std::fs::create_dir_all(outside.path().join("ckpt")).unwrap();
    // A symlink inside the root that leads out of it.
    std::os::unix::fs::symlink(outside.path(), root.path().join("link")).unwrap();
    std::fs::create_dir_all(root.path().join("corpus")).unwrap();
    std::os::unix::fs::symlink(
        outside.path().join("secret.txt"),
        root.path().join("corpus/planted.txt"),
    )
    .unwrap();
    let secret = outside.path().join("secret.txt").display().to_string();
    let cases: Vec<(&str, String, String)> = vec![
        ("data.dataset", secret.clone(), secret.clone()),
        (
            "data.dataset",
            "link/secret.txt".into(),
            format!("resolves to {secret}"),
        ),
        (
            "data.dataset",
            "corpus/*.txt".into(),
            format!("resolves to {secret}"),
        ),
        (
            "data.dataset",
            "/proc/self/environ".into(),
            "/proc/self/environ".into(),
        ),
        ("data.tokenizer", secret.clone(), secret.clone()),
        (
            "training.init_from",
            outside.path().join("ckpt").display().to_string(),
            "ckpt".into(),
        ),
    ];
    let roots_shown = std::fs::canonicalize(root.path())
        .unwrap()
        .display()
        .to_string();
    for (key, value, needle) in cases {
        let mut cfg = Config::default();
        match key {
            "data.dataset" => cfg.data.dataset = value.clone(),
            "data.tokenizer" => cfg.data.tokenizer = value.clone(),
            _ => cfg.training.init_from = Some(value.clone()),
        }
        let e = resolve(&mut cfg, root.path(), "/c").unwrap_err();
        assert_eq!(e.field, key, "{value}");
        assert!(
            e.message.contains("outside the data roots"),
            "{value}: {}",
            e.message
        );
        assert!(e.message.contains(&needle), "{value}: {}", e.message);
        assert!(e.message.contains(&roots_shown), "{value}: {}", e.message);
    }
}

#[test]
fn the_cache_may_be_the_servers_token_cache_or_a_folder_of_the_run_and_nothing_else() {
    let dir = tempfile::tempdir().unwrap();
    let cache = dir.path().join("cache/tokens");
    std::fs::create_dir_all(&cache).unwrap();
    let cache_text = cache.display().to_string();
    let accepted = [
        (".trainyard-cache", cache_text.clone()),
        ("my-cache", "my-cache".to_string()),
        ("a/b", "a/b".to_string()),
        (cache_text.as_str(), cache_text.clone()),
    ];
    for (written, want) in accepted {
        let mut cfg = Config::default();
        cfg.data.cache_dir = written.to_string();
        resolve(&mut cfg, dir.path(), &cache_text).unwrap();
        assert_eq!(cfg.data.cache_dir, want, "{written}");
    }
    let other_run = dir
        .path()
        .join("runs/ab12/artifacts/leak")
        .display()
        .to_string();
    for written in [
        "../x",
        "/tmp/elsewhere",
        other_run.as_str(),
        "a/../../b",
        "",
    ] {
        let mut cfg = Config::default();
        cfg.data.cache_dir = written.to_string();
        let e = resolve(&mut cfg, dir.path(), &cache_text).unwrap_err();
        assert_eq!(e.field, "data.cache_dir", "{written}");
        assert!(
            e.message.contains("token cache"),
            "{written}: {}",
            e.message
        );
    }
}

#[test]
fn a_checkpoint_of_a_run_on_this_server_is_returned_for_the_callers_access_check() {
    let data = tempfile::tempdir().unwrap();
    let runs = std::fs::canonicalize(data.path()).unwrap().join("runs");
    let best = runs.join("ab12/checkpoints/best");
    std::fs::create_dir_all(&best).unwrap();
    std::fs::create_dir_all(runs.join("ab12/artifacts/model")).unwrap();
    let roots = DataRoots::from_canonical(vec![data.path().join("datasets")]);
    let allowed = Allowed {
        roots: &roots,
        runs_dir: &runs,
        token_cache: Path::new("/c"),
    };
    let mut cfg = Config::default();
    cfg.training.init_from = Some(best.display().to_string());
    let found = resolve_paths(&mut cfg, &base(data.path()), &allowed).unwrap();
    assert_eq!(found.len(), 1);
    assert_eq!(found[0].run_id, "ab12");
    assert_eq!(found[0].path, best);
    assert_eq!(found[0].refusal.field, "training.init_from");
    // Another folder of a run is not a checkpoint.
    cfg.training.init_from = Some(runs.join("ab12/artifacts/model").display().to_string());
    let e = resolve_paths(&mut cfg, &base(data.path()), &allowed).unwrap_err();
    assert!(
        e.message.contains("outside the data roots"),
        "{}",
        e.message
    );
}
