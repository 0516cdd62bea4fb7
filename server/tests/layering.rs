//! The server's layering, read from its sources: HTTP is a room of its own. Nothing outside
//! `src/http/` names axum or the `http` module (the use cases, the access rules, the state and
//! the settings know no request or response), apart from `app.rs`, which builds the router; and
//! nothing below `app.rs` imports it back (only the command line that starts the server does).

#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a failed setup step is a failed test

use std::path::{Path, PathBuf};

fn sources(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).expect("read the source folder") {
        let path = entry.expect("a folder entry").path();
        if path.is_dir() {
            sources(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// The file's code without its comments (a `//` to the end of the line; a string holding
/// `//` loses its tail, which only hides text, never adds any).
fn code(text: &str) -> String {
    text.lines()
        .map(|line| line.split("//").next().unwrap_or(""))
        .collect::<Vec<_>>()
        .join("\n")
}

/// Where `path` (`crate::http`, `axum`) is named in `code` as a whole path segment, by line.
fn names(code: &str, path: &str) -> Vec<usize> {
    let mut found = Vec::new();
    for (number, line) in code.lines().enumerate() {
        let mut rest = line;
        while let Some(at) = rest.find(path) {
            let before = rest[..at].chars().next_back();
            let after = rest[at + path.len()..].chars().next();
            let ident = |c: char| c.is_alphanumeric() || c == '_';
            // `::http` after `crate`/`super` is the module; a bare leading `::http` is the crate.
            let starts = before.is_none_or(|c| !ident(c) && c != ':');
            if starts && after.is_none_or(|c| !ident(c)) {
                found.push(number + 1);
                break;
            }
            rest = &rest[at + path.len()..];
        }
    }
    found
}

fn server_src() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("src")
}

fn offenders(forbidden: &[&str], allowed: impl Fn(&Path) -> bool) -> Vec<String> {
    let root = server_src();
    let mut files = Vec::new();
    sources(&root, &mut files);
    assert!(
        files.len() > 50,
        "the sources were not found under {root:?}"
    );
    let mut found = Vec::new();
    for file in files {
        let relative = file.strip_prefix(&root).expect("under src").to_path_buf();
        if allowed(&relative) {
            continue;
        }
        let text = code(&std::fs::read_to_string(&file).expect("read a source file"));
        for path in forbidden {
            for line in names(&text, path) {
                found.push(format!("src/{}:{line} names `{path}`", relative.display()));
            }
        }
    }
    found
}

fn in_http(relative: &Path) -> bool {
    relative.starts_with("http")
}

#[test]
fn nothing_outside_the_http_folder_imports_axum_or_the_http_module() {
    let found = offenders(
        &["axum", "crate::http", "super::http", "super::super::http"],
        |file| in_http(file) || file == Path::new("app.rs"),
    );
    assert!(found.is_empty(), "{}", found.join("\n"));
}

#[test]
fn only_the_command_line_and_the_http_room_import_the_router_module() {
    let found = offenders(&["crate::app", "super::app"], |file| {
        in_http(file)
            || ["app.rs", "cli.rs", "main.rs"]
                .iter()
                .any(|f| file == Path::new(f))
    });
    assert!(found.is_empty(), "{}", found.join("\n"));
}

#[test]
fn the_check_sees_an_import_and_not_a_lookalike() {
    let text = code("use crate::http::error::ApiError;\nuse ::http::Method;\n// crate::http in a comment\nlet x = crate::https;\nuse axum::Router;");
    assert_eq!(names(&text, "crate::http"), vec![1]);
    assert_eq!(names(&text, "axum"), vec![5]);
    assert!(names("use ::http::Uri;", "crate::http").is_empty());
    assert!(names("let axum_like = 1;", "axum").is_empty());
}
