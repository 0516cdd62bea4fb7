//! The token cache: packed token streams written once, memory-mapped on later runs.
//!
//! An entry lives in `data.cache_dir/<key>/` (`train.bin`, `val.bin` as little-endian u16 when
//! the vocabulary fits, else u32; `tokenizer.json`; `meta.json`). The key hashes everything the
//! tokens depend on: the documents' text in order, the filter and split settings and the
//! tokenizer, so a second run with the same inputs reads the cache and any change builds a new
//! entry. Entries are built in a temporary directory and renamed into place, so a crash never
//! leaves a half-written entry behind a valid key.

use std::fs;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use memmap2::Mmap;
use serde::{Deserialize, Serialize};

use super::{DataError, DataStats, Document, Result, TextTokenizer};
use crate::config::DataConfig;

/// Bumped whenever the entry layout or the pipeline's output changes.
// v2: exact dedup compares documents in their dedup form; line filters exist.
const CACHE_VERSION: &str = "trainyard-token-cache v2";

/// A read-only stream of token ids, in memory or memory-mapped from the cache.
#[derive(Debug, Clone)]
pub struct TokenSplit {
    tokens: Tokens,
}

#[derive(Debug, Clone)]
enum Tokens {
    Owned(Arc<[u32]>),
    U16(Arc<Mmap>),
    U32(Arc<Mmap>),
}

impl TokenSplit {
    pub fn from_vec(tokens: Vec<u32>) -> Self {
        TokenSplit {
            tokens: Tokens::Owned(tokens.into()),
        }
    }

    pub fn len(&self) -> usize {
        match &self.tokens {
            Tokens::Owned(v) => v.len(),
            Tokens::U16(m) => m.len() / 2,
            Tokens::U32(m) => m.len() / 4,
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// True when the ids come from a memory-mapped cache file.
    pub fn is_mapped(&self) -> bool {
        !matches!(self.tokens, Tokens::Owned(_))
    }

    /// Copies ids `start..start + out.len()` into `out`. Panics past the end, like slicing.
    pub fn copy_window(&self, start: usize, out: &mut [u32]) {
        let end = start + out.len();
        match &self.tokens {
            Tokens::Owned(v) => out.copy_from_slice(&v[start..end]),
            Tokens::U16(m) => {
                for (dst, src) in out.iter_mut().zip(m[2 * start..2 * end].chunks_exact(2)) {
                    *dst = u32::from(u16::from_le_bytes([src[0], src[1]]));
                }
            }
            Tokens::U32(m) => {
                for (dst, src) in out.iter_mut().zip(m[4 * start..4 * end].chunks_exact(4)) {
                    *dst = u32::from_le_bytes([src[0], src[1], src[2], src[3]]);
                }
            }
        }
    }

    pub fn to_vec(&self) -> Vec<u32> {
        let mut out = vec![0; self.len()];
        self.copy_window(0, &mut out);
        out
    }

    fn open(path: &Path, wide: bool) -> Result<Self> {
        let file = fs::File::open(path).map_err(|e| DataError::io("data.cache_dir", path, e))?;
        // SAFETY: cache files are written once under a temporary name and renamed into place;
        // nothing writes to them afterwards, so the mapping never changes under us.
        let map =
            unsafe { Mmap::map(&file) }.map_err(|e| DataError::io("data.cache_dir", path, e))?;
        let width = if wide { 4 } else { 2 };
        if map.len() % width != 0 {
            return Err(DataError::invalid(
                "data.cache_dir",
                format!("{} is truncated; delete the cache entry", path.display()),
            ));
        }
        let map = Arc::new(map);
        Ok(TokenSplit {
            tokens: if wide {
                Tokens::U32(map)
            } else {
                Tokens::U16(map)
            },
        })
    }
}

/// How tokens are stored on disk for a vocabulary.
fn is_wide(vocab_size: usize) -> bool {
    vocab_size > 1 << 16
}

fn encode_tokens(tokens: &[u32], wide: bool) -> Vec<u8> {
    if wide {
        tokens.iter().flat_map(|t| t.to_le_bytes()).collect()
    } else {
        // Ids are below the vocabulary size (≤ 65536), so they fit in u16.
        tokens
            .iter()
            .flat_map(|&t| (t as u16).to_le_bytes())
            .collect()
    }
}

/// What the tokenizer of an entry is, for the key (the trained BPE itself is an output).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TokenizerSpec {
    Bytes,
    Bpe {
        vocab_size: usize,
    },
    /// The blake3 hash of a tokenizer file's contents.
    File {
        hash: String,
    },
}

/// The cache key: a hex blake3 hash of everything the token streams depend on.
pub fn cache_key(docs: &[Document], data: &DataConfig, tokenizer: &TokenizerSpec) -> String {
    let mut h = blake3::Hasher::new();
    h.update(CACHE_VERSION.as_bytes());
    h.update(&(docs.len() as u64).to_le_bytes());
    for doc in docs {
        h.update(&(doc.text.len() as u64).to_le_bytes());
        h.update(doc.text.as_bytes());
    }
    let lines = &data.line_filters;
    let settings = format!(
        "min_length={} dedup={} near_dedup={} threshold={} val_fraction={} tokenizer={tokenizer:?} \
         line_min_words={} symbol_lines={} boilerplate={}",
        data.min_length,
        data.dedup,
        data.near_dedup,
        data.near_dedup_threshold,
        data.val_fraction,
        lines.min_words,
        lines.symbol_lines,
        lines.boilerplate
    );
    h.update(settings.as_bytes());
    h.finalize().to_hex().to_string()
}

#[derive(Debug, Serialize, Deserialize)]
struct Meta {
    version: String,
    wide: bool,
    stats: DataStats,
}

/// A complete cache entry read back.
pub struct CachedEntry {
    pub tokenizer: TextTokenizer,
    pub train: TokenSplit,
    pub val: TokenSplit,
    pub stats: DataStats,
}

/// `data.cache_dir` as a path; relative paths are relative to the current directory.
pub fn cache_root(data: &DataConfig) -> PathBuf {
    PathBuf::from(&data.cache_dir)
}

/// Reads the entry for `key`, or `None` when there is none (or it is from another version).
pub fn read(root: &Path, key: &str) -> Result<Option<CachedEntry>> {
    let dir = root.join(key);
    let meta_path = dir.join("meta.json");
    let meta_bytes = match fs::read(&meta_path) {
        Ok(b) => b,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(DataError::io("data.cache_dir", meta_path, e)),
    };
    let Ok(meta) = serde_json::from_slice::<Meta>(&meta_bytes) else {
        return Ok(None);
    };
    if meta.version != CACHE_VERSION {
        return Ok(None);
    }
    let tokenizer = TextTokenizer::load(&dir.join("tokenizer.json"))?;
    let train = TokenSplit::open(&dir.join("train.bin"), meta.wide)?;
    let val = TokenSplit::open(&dir.join("val.bin"), meta.wide)?;
    let mut stats = meta.stats;
    stats.cache_hit = true;
    Ok(Some(CachedEntry {
        tokenizer,
        train,
        val,
        stats,
    }))
}

/// Writes an entry atomically: built under a temporary name, then renamed to `key`. Returns the
/// memory-mapped splits so this run and later ones read the same bytes.
pub fn write(
    root: &Path,
    key: &str,
    tokenizer: &TextTokenizer,
    train: &[u32],
    val: &[u32],
    stats: &DataStats,
) -> Result<(TokenSplit, TokenSplit)> {
    let io = |path: &Path, e| DataError::io("data.cache_dir", path, e);
    fs::create_dir_all(root).map_err(|e| io(root, e))?;
    let tmp = root.join(format!(".{key}.tmp-{}", std::process::id()));
    if tmp.exists() {
        fs::remove_dir_all(&tmp).map_err(|e| io(&tmp, e))?;
    }
    fs::create_dir_all(&tmp).map_err(|e| io(&tmp, e))?;
    let wide = is_wide(tokenizer.vocab_size());
    for (name, tokens) in [("train.bin", train), ("val.bin", val)] {
        let path = tmp.join(name);
        fs::write(&path, encode_tokens(tokens, wide)).map_err(|e| io(&path, e))?;
    }
    tokenizer.save(&tmp.join("tokenizer.json"))?;
    let meta = Meta {
        version: CACHE_VERSION.to_string(),
        wide,
        stats: stats.clone(),
    };
    let meta_json = serde_json::to_vec(&meta)
        .map_err(|e| DataError::invalid("data.cache_dir", format!("cannot encode meta: {e}")))?;
    let meta_path = tmp.join("meta.json");
    fs::write(&meta_path, meta_json).map_err(|e| io(&meta_path, e))?;
    let dir = root.join(key);
    if fs::rename(&tmp, &dir).is_err() {
        // Another process finished the same entry first; its content is identical.
        fs::remove_dir_all(&tmp).map_err(|e| io(&tmp, e))?;
    }
    Ok((
        TokenSplit::open(&dir.join("train.bin"), wide)?,
        TokenSplit::open(&dir.join("val.bin"), wide)?,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn narrow_and_wide_entries_read_back_the_same_ids() {
        let dir = tempfile::tempdir().unwrap();
        let ids = vec![0u32, 1, 255, 256, 65535];
        for (key, wide) in [("narrow", false), ("wide", true)] {
            let path = dir.path().join(key);
            fs::write(&path, encode_tokens(&ids, wide)).unwrap();
            let split = TokenSplit::open(&path, wide).unwrap();
            assert!(split.is_mapped());
            assert_eq!(split.to_vec(), ids, "{key}");
            let mut window = [0u32; 2];
            split.copy_window(2, &mut window);
            assert_eq!(window, [255, 256]);
        }
        let big = [70_000u32, 1];
        let path = dir.path().join("big");
        fs::write(&path, encode_tokens(&big, true)).unwrap();
        assert_eq!(TokenSplit::open(&path, true).unwrap().to_vec(), big);
    }

    #[test]
    fn the_key_changes_with_anything_the_tokens_depend_on() {
        let docs = vec![Document {
            origin: "a".into(),
            text: "hello".into(),
        }];
        let data = DataConfig::default();
        let base = cache_key(&docs, &data, &TokenizerSpec::Bytes);
        assert_eq!(
            base,
            cache_key(&docs, &data, &TokenizerSpec::Bytes),
            "stable"
        );

        let renamed = vec![Document {
            origin: "b".into(),
            text: "hello".into(),
        }];
        assert_eq!(
            base,
            cache_key(&renamed, &data, &TokenizerSpec::Bytes),
            "origin is not content"
        );

        let edited = vec![Document {
            origin: "a".into(),
            text: "hellO".into(),
        }];
        let changes: Vec<(&str, String)> = vec![
            ("text", cache_key(&edited, &data, &TokenizerSpec::Bytes)),
            (
                "min_length",
                cache_key(
                    &docs,
                    &DataConfig {
                        min_length: 3,
                        ..data.clone()
                    },
                    &TokenizerSpec::Bytes,
                ),
            ),
            (
                "dedup",
                cache_key(
                    &docs,
                    &DataConfig {
                        dedup: false,
                        ..data.clone()
                    },
                    &TokenizerSpec::Bytes,
                ),
            ),
            (
                "near_dedup",
                cache_key(
                    &docs,
                    &DataConfig {
                        near_dedup: true,
                        ..data.clone()
                    },
                    &TokenizerSpec::Bytes,
                ),
            ),
            (
                "val_fraction",
                cache_key(
                    &docs,
                    &DataConfig {
                        val_fraction: 0.2,
                        ..data.clone()
                    },
                    &TokenizerSpec::Bytes,
                ),
            ),
            (
                "tokenizer",
                cache_key(&docs, &data, &TokenizerSpec::Bpe { vocab_size: 300 }),
            ),
        ];
        for (name, key) in changes {
            assert_ne!(key, base, "{name}");
        }
    }

    #[test]
    fn a_written_entry_is_read_back_and_leaves_no_temporary_directory() {
        let dir = tempfile::tempdir().unwrap();
        let stats = DataStats {
            train_tokens: 3,
            val_tokens: 2,
            ..DataStats::default()
        };
        assert!(read(dir.path(), "k").unwrap().is_none());
        let (train, val) = write(
            dir.path(),
            "k",
            &TextTokenizer::Bytes,
            &[1, 2, 3],
            &[4, 5],
            &stats,
        )
        .unwrap();
        assert_eq!((train.to_vec(), val.to_vec()), (vec![1, 2, 3], vec![4, 5]));
        let entry = read(dir.path(), "k").unwrap().expect("entry");
        assert!(entry.stats.cache_hit);
        assert_eq!(entry.train.to_vec(), [1, 2, 3]);
        let names: Vec<_> = fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        assert_eq!(names, ["k"]);
    }
}
