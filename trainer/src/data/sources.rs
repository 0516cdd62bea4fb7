//! Reading documents from `data.dataset`: one text file, a directory (recursive), a glob, or JSONL.
//!
//! Every file is one document; in JSONL every record is one. Paths are visited in sorted order so
//! the document list does not depend on the file system's listing order.

use std::fs;
use std::path::{Path, PathBuf};

use super::{DataError, Result};
use crate::config::DataConfig;

/// One unit of text: a file or a JSONL record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Document {
    /// Where it came from (`path` or `path:line`), for messages.
    pub origin: String,
    pub text: String,
}

/// Bytes sniffed to tell text from binary when walking a directory.
const SNIFF_BYTES: usize = 8192;

/// Loads every document `data.dataset` names.
pub fn load(data: &DataConfig) -> Result<Vec<Document>> {
    let spec = data.dataset.trim();
    if spec.is_empty() {
        return Err(DataError::invalid(
            "data.dataset",
            "is empty; use `dummy`, `demo`, or a file, directory, glob or .jsonl path",
        ));
    }
    let files = resolve(spec)?;
    let mut docs = Vec::new();
    for file in &files {
        read_file(file, &data.text_column, &mut docs)?;
    }
    if docs.is_empty() {
        return Err(DataError::invalid(
            "data.dataset",
            format!("{spec} holds no text documents"),
        ));
    }
    Ok(docs)
}

/// Loads documents from several inputs (the `tokenizer train --input` list).
pub fn load_paths(inputs: &[PathBuf], text_column: &str) -> Result<Vec<Document>> {
    let mut docs = Vec::new();
    for input in inputs {
        for file in resolve(&input.to_string_lossy())? {
            read_file(&file, text_column, &mut docs)?;
        }
    }
    Ok(docs)
}

/// Expands a dataset spec into an ordered list of files; an explicitly named file is always kept,
/// files found by walking or globbing only when they look like text.
fn resolve(spec: &str) -> Result<Vec<PathBuf>> {
    if spec.contains(['*', '?', '[']) {
        // Hidden files only when the pattern names the dot, as in a directory walk.
        let options = glob::MatchOptions {
            require_literal_leading_dot: true,
            ..glob::MatchOptions::new()
        };
        let paths = glob::glob_with(spec, options).map_err(|e| {
            DataError::invalid("data.dataset", format!("invalid glob `{spec}`: {e}"))
        })?;
        let mut files = Vec::new();
        for entry in paths {
            let path = entry.map_err(|e| {
                let path = e.path().to_path_buf();
                DataError::io("data.dataset", path, e.into())
            })?;
            if path.is_dir() {
                walk(&path, &mut files)?;
            } else if looks_like_text(&path)? {
                files.push(path);
            }
        }
        files.sort();
        files.dedup();
        if files.is_empty() {
            return Err(DataError::invalid(
                "data.dataset",
                format!("no files match glob `{spec}`"),
            ));
        }
        return Ok(files);
    }
    let path = Path::new(spec);
    let meta = fs::metadata(path).map_err(|e| DataError::io("data.dataset", path, e))?;
    if meta.is_dir() {
        let mut files = Vec::new();
        walk(path, &mut files)?;
        files.sort();
        if files.is_empty() {
            return Err(DataError::invalid(
                "data.dataset",
                format!("directory {spec} holds no text files"),
            ));
        }
        Ok(files)
    } else {
        Ok(vec![path.to_path_buf()])
    }
}

/// Collects text-like files under `dir`, skipping hidden entries (`.git`, caches).
fn walk(dir: &Path, out: &mut Vec<PathBuf>) -> Result<()> {
    let entries = fs::read_dir(dir).map_err(|e| DataError::io("data.dataset", dir, e))?;
    for entry in entries {
        let entry = entry.map_err(|e| DataError::io("data.dataset", dir, e))?;
        let path = entry.path();
        if entry.file_name().to_string_lossy().starts_with('.') {
            continue;
        }
        let kind = entry
            .file_type()
            .map_err(|e| DataError::io("data.dataset", &path, e))?;
        if kind.is_dir() {
            walk(&path, out)?;
        } else if looks_like_text(&path)? {
            out.push(path);
        }
    }
    Ok(())
}

/// Text-like = no NUL byte in the first few KiB and valid UTF-8 there (allowing a code point cut
/// at the sniff boundary).
fn looks_like_text(path: &Path) -> Result<bool> {
    use std::io::Read;
    let file = fs::File::open(path).map_err(|e| DataError::io("data.dataset", path, e))?;
    let mut head = Vec::with_capacity(SNIFF_BYTES);
    file.take(SNIFF_BYTES as u64)
        .read_to_end(&mut head)
        .map_err(|e| DataError::io("data.dataset", path, e))?;
    if head.contains(&0) {
        return Ok(false);
    }
    Ok(match std::str::from_utf8(&head) {
        Ok(_) => true,
        Err(e) => e.error_len().is_none() && head.len() == SNIFF_BYTES,
    })
}

fn is_jsonl(path: &Path) -> bool {
    matches!(
        path.extension().and_then(|e| e.to_str()),
        Some("jsonl") | Some("ndjson")
    )
}

fn read_file(path: &Path, text_column: &str, docs: &mut Vec<Document>) -> Result<()> {
    let bytes = fs::read(path).map_err(|e| DataError::io("data.dataset", path, e))?;
    let text = String::from_utf8(bytes).map_err(|e| {
        DataError::invalid(
            "data.dataset",
            format!(
                "{} is not UTF-8 text (invalid byte at offset {})",
                path.display(),
                e.utf8_error().valid_up_to()
            ),
        )
    })?;
    if is_jsonl(path) {
        parse_jsonl(path, &text, text_column, docs)
    } else {
        docs.push(Document {
            origin: path.display().to_string(),
            text,
        });
        Ok(())
    }
}

/// Each non-blank line is a JSON object whose `text_column` field is a string.
fn parse_jsonl(path: &Path, text: &str, column: &str, docs: &mut Vec<Document>) -> Result<()> {
    for (index, line) in text.lines().enumerate() {
        let line_no = index + 1;
        if line.trim().is_empty() {
            continue;
        }
        let origin = format!("{}:{line_no}", path.display());
        let record: serde_json::Value = serde_json::from_str(line).map_err(|e| {
            DataError::invalid("data.dataset", format!("{origin}: invalid JSON: {e}"))
        })?;
        match record.get(column) {
            Some(serde_json::Value::String(s)) => docs.push(Document {
                origin,
                text: s.clone(),
            }),
            Some(other) => {
                return Err(DataError::invalid(
                    "data.text_column",
                    format!(
                        "{origin}: field `{column}` is {}, expected a string",
                        json_kind(other)
                    ),
                ))
            }
            None => {
                return Err(DataError::invalid(
                    "data.text_column",
                    format!("{origin}: record has no field `{column}`"),
                ))
            }
        }
    }
    Ok(())
}

fn json_kind(value: &serde_json::Value) -> &'static str {
    match value {
        serde_json::Value::Null => "null",
        serde_json::Value::Bool(_) => "a boolean",
        serde_json::Value::Number(_) => "a number",
        serde_json::Value::String(_) => "a string",
        serde_json::Value::Array(_) => "an array",
        serde_json::Value::Object(_) => "an object",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(dataset: &Path) -> DataConfig {
        DataConfig {
            dataset: dataset.display().to_string(),
            ..DataConfig::default()
        }
    }

    fn texts(docs: &[Document]) -> Vec<&str> {
        docs.iter().map(|d| d.text.as_str()).collect()
    }

    #[test]
    fn each_source_kind_yields_its_documents_in_sorted_order() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        fs::create_dir_all(root.join("sub/deeper")).unwrap();
        fs::create_dir_all(root.join(".hidden")).unwrap();
        fs::write(root.join("b.txt"), "bravo").unwrap();
        fs::write(root.join("a.md"), "alpha").unwrap();
        fs::write(root.join("sub/deeper/c.txt"), "charlie").unwrap();
        fs::write(root.join(".hidden/h.txt"), "hidden").unwrap();
        fs::write(root.join("sub/blob.bin"), [0u8, 1, 2, 3]).unwrap();
        fs::write(
            root.join("records.jsonl"),
            "{\"text\": \"one\"}\n\n{\"text\": \"two\", \"id\": 2}\n",
        )
        .unwrap();

        let cases: Vec<(&str, String, Vec<&str>)> = vec![
            (
                "single file",
                root.join("b.txt").display().to_string(),
                vec!["bravo"],
            ),
            (
                "directory",
                root.display().to_string(),
                vec!["alpha", "bravo", "one", "two", "charlie"],
            ),
            (
                "glob",
                root.join("*.txt").display().to_string(),
                vec!["bravo"],
            ),
            (
                "recursive glob",
                root.join("**/*.txt").display().to_string(),
                vec!["bravo", "charlie"],
            ),
            (
                "jsonl",
                root.join("records.jsonl").display().to_string(),
                vec!["one", "two"],
            ),
        ];
        for (name, spec, expected) in cases {
            let cfg = DataConfig {
                dataset: spec,
                ..DataConfig::default()
            };
            let docs = load(&cfg).unwrap_or_else(|e| panic!("{name}: {e}"));
            assert_eq!(texts(&docs), expected, "{name}");
        }
    }

    #[test]
    fn bad_sources_are_refused_with_the_key_and_the_place() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        fs::write(
            root.join("missing.jsonl"),
            "{\"text\": \"ok\"}\n{\"body\": \"x\"}\n",
        )
        .unwrap();
        fs::write(root.join("number.jsonl"), "{\"text\": 5}\n").unwrap();
        fs::write(root.join("broken.jsonl"), "{\"text\": \n").unwrap();
        fs::write(root.join("latin1.txt"), [b'a', 0xE9, b'b']).unwrap();
        fs::create_dir_all(root.join("empty")).unwrap();

        let cases = [
            ("missing.jsonl", "data.text_column", "missing.jsonl:2"),
            ("number.jsonl", "data.text_column", "a number"),
            (
                "broken.jsonl",
                "data.dataset",
                "broken.jsonl:1: invalid JSON",
            ),
            ("latin1.txt", "data.dataset", "not UTF-8"),
            ("empty", "data.dataset", "holds no text files"),
            ("*.csv", "data.dataset", "no files match glob"),
            ("absent.txt", "data.dataset", "absent.txt"),
        ];
        for (name, key, fragment) in cases {
            let err = load(&config(&root.join(name))).expect_err(name);
            assert_eq!(err.key(), key, "{name}: {err}");
            let message = err.to_string();
            assert!(message.starts_with(key), "{name}: {message}");
            assert!(message.contains(fragment), "{name}: {message}");
        }
    }

    #[test]
    fn a_custom_text_column_is_read() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("r.jsonl");
        fs::write(&path, "{\"body\": \"hello\"}\n").unwrap();
        let cfg = DataConfig {
            text_column: "body".into(),
            ..config(&path)
        };
        let docs = load(&cfg).unwrap();
        assert_eq!(docs[0].origin, format!("{}:1", path.display()));
        assert_eq!(texts(&docs), ["hello"]);
    }
}
