//! The data pipeline: raw text in, two packed token streams out.
//!
//! ```text
//! data.dataset ──► sources (files, dirs, globs, JSONL, demo) ──► filters (line filters, min_length,
//! exact and near duplicates) ──► split (content hash) ──► tokenizer (bytes, BPE, tokenizer.json) ──► pack
//! with end-of-text ──► token cache (memory-mapped u16/u32) ──► BatchSampler
//! ```
//!
//! [`prepare`] is the one entry point the training loop calls. A second run with the same sources,
//! filters and tokenizer reads the token cache instead of re-tokenizing.

pub mod batches;
pub mod cache;
pub mod demo;
pub mod dummy;
pub mod filters;
pub mod lines;
pub mod sources;
pub mod split;
pub mod tokenizer;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::config::{Config, DataConfig};
use cache::TokenizerSpec;

pub use batches::{eval_batches, Batch, BatchSampler, SamplerState};
pub use cache::TokenSplit;
pub use dummy::DummyData;
pub use filters::{FilterStats, Filters};
pub use sources::Document;
pub use tokenizer::{train_bpe, TextTokenizer, EOT_TOKEN};

/// Everything the pipeline can refuse, each naming the config key to change.
#[derive(Debug, thiserror::Error)]
pub enum DataError {
    /// A setting or the data it points at is unusable.
    #[error("{key}: {message}")]
    Invalid { key: &'static str, message: String },
    /// A file could not be read or written. The OS error is part of the message and not a
    /// `source`: a caller printing the chain (`{:#}`) would show it twice.
    #[error("{key}: {path}: {error}")]
    Io {
        key: &'static str,
        path: PathBuf,
        error: std::io::Error,
    },
}

impl DataError {
    pub(crate) fn invalid(key: &'static str, message: impl Into<String>) -> Self {
        DataError::Invalid {
            key,
            message: message.into(),
        }
    }

    pub(crate) fn io(key: &'static str, path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        DataError::Io {
            key,
            path: path.into(),
            error: source,
        }
    }

    /// The config key path this error is about (`data.dataset`, `data.tokenizer`, ...).
    pub fn key(&self) -> &'static str {
        match self {
            DataError::Invalid { key, .. } | DataError::Io { key, .. } => key,
        }
    }
}

pub type Result<T, E = DataError> = std::result::Result<T, E>;

/// What `prepare` did, for logs, metrics and tests.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct DataStats {
    /// Documents read from the sources, before filtering.
    pub documents: usize,
    /// Documents dropped by each filter.
    pub filtered: FilterStats,
    pub train_documents: usize,
    pub val_documents: usize,
    pub train_tokens: usize,
    pub val_tokens: usize,
    /// Tokenizer vocabulary (ids are below this).
    pub vocab_size: usize,
    /// True when the token streams were read from the on-disk cache (no tokenization this run).
    pub cache_hit: bool,
    /// Hex key of the cache entry (empty for `dummy`).
    pub cache_key: String,
    /// Preference data (DPO): its pairs and how many repeat an earlier one exactly; `None`
    /// for text. Its counts replace the text's documents and tokens on the run page.
    #[serde(default)]
    pub pairs: Option<PairStats>,
}

/// What a DPO run's preference file held.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct PairStats {
    pub train: usize,
    pub val: usize,
    /// Pairs (prompt, chosen, rejected) identical to an earlier one in the file.
    pub duplicates: usize,
}

impl DataStats {
    /// What the run page shows about the data, as metrics at step 0: `data/documents`, the
    /// token counts, and `data/filter/<name>` for each enabled filter (its count may be 0).
    /// Empty for the synthetic `dummy` data, which has no documents.
    pub fn metrics(&self, data: &DataConfig) -> BTreeMap<String, f64> {
        let mut out = BTreeMap::new();
        if data.dataset == "dummy" {
            return out;
        }
        if let Some(pairs) = &self.pairs {
            out.insert("data/pairs".into(), (pairs.train + pairs.val) as f64);
            out.insert("data/train_pairs".into(), pairs.train as f64);
            out.insert("data/val_pairs".into(), pairs.val as f64);
            out.insert("data/duplicate_pairs".into(), pairs.duplicates as f64);
            return out;
        }
        out.insert("data/documents".into(), self.documents as f64);
        out.insert("data/train_tokens".into(), self.train_tokens as f64);
        out.insert("data/val_tokens".into(), self.val_tokens as f64);
        let lines = &data.line_filters;
        let enabled = |name: &str| match name {
            "too_short" => data.min_length > 0,
            "exact_duplicates" => data.dedup,
            "near_duplicates" => data.near_dedup,
            "short_lines" => lines.min_words > 0,
            "symbol_lines" => lines.symbol_lines,
            "boilerplate_lines" => lines.boilerplate,
            _ => lines.min_words > 0 || lines.symbol_lines || lines.boilerplate,
        };
        for (name, count) in self.filtered.named() {
            if enabled(name) {
                out.insert(format!("data/filter/{name}"), count as f64);
            }
        }
        out
    }
}

/// Tokenized, packed, split data ready for batching.
#[derive(Debug)]
pub struct PreparedData {
    pub tokenizer: TextTokenizer,
    pub train: TokenSplit,
    pub val: TokenSplit,
    pub stats: DataStats,
}

/// Builds the training and validation token streams described by `cfg.data`.
///
/// `tokenizer_hint` is a `tokenizer.json` (or bytes marker) to use instead of what
/// `data.tokenizer` says: a resumed run or `init_from` must keep its checkpoint's tokenizer.
#[tracing::instrument(skip_all, fields(dataset = %cfg.data.dataset))]
pub fn prepare(cfg: &Config, tokenizer_hint: Option<&Path>) -> Result<PreparedData> {
    let data = &cfg.data;
    if !(0.0..1.0).contains(&data.val_fraction) || data.val_fraction == 0.0 {
        return Err(DataError::invalid(
            "data.val_fraction",
            format!(
                "must be greater than 0 and less than 1, got {}",
                data.val_fraction
            ),
        ));
    }
    if data.near_dedup && !(data.near_dedup_threshold > 0.0 && data.near_dedup_threshold <= 1.0) {
        return Err(DataError::invalid(
            "data.near_dedup_threshold",
            format!("must be in (0, 1], got {}", data.near_dedup_threshold),
        ));
    }
    match data.dataset.as_str() {
        "dummy" => prepare_dummy(cfg),
        "demo" => {
            let docs = demo::documents();
            prepare_text(cfg, docs, tokenizer_hint)
        }
        _ => {
            let docs = sources::load(data)?;
            prepare_text(cfg, docs, tokenizer_hint)
        }
    }
}

/// Sources → key → cache hit, or filter, split, tokenize, pack and write the entry.
fn prepare_text(
    cfg: &Config,
    docs: Vec<Document>,
    tokenizer_hint: Option<&Path>,
) -> Result<PreparedData> {
    let data = &cfg.data;
    let tokenizer_file = match tokenizer_hint {
        Some(path) => Some(path.to_path_buf()),
        None if matches!(data.tokenizer.as_str(), "bytes" | "bpe") => None,
        None => Some(PathBuf::from(&data.tokenizer)),
    };
    let spec = match (&tokenizer_file, data.tokenizer.as_str()) {
        (Some(path), _) => {
            let bytes =
                std::fs::read(path).map_err(|e| DataError::io("data.tokenizer", path, e))?;
            TokenizerSpec::File {
                hash: blake3::hash(&bytes).to_hex().to_string(),
            }
        }
        (None, "bpe") => TokenizerSpec::Bpe {
            vocab_size: cfg.model.vocab_size,
        },
        (None, _) => TokenizerSpec::Bytes,
    };
    let key = cache::cache_key(&docs, data, &spec);
    let root = cache::cache_root(data);
    if let Some(entry) = cache::read(&root, &key)? {
        tracing::info!(key = %key, "token cache hit");
        check_vocab(cfg, &entry.tokenizer)?;
        return Ok(PreparedData {
            tokenizer: entry.tokenizer,
            train: entry.train,
            val: entry.val,
            stats: entry.stats,
        });
    }

    let documents = docs.len();
    let (kept, filtered) = Filters::from_config(data).apply(docs);
    tracing::info!("filtered {documents} documents: {filtered}");
    let (train_docs, val_docs) = split::split(kept, data.val_fraction)?;
    let tokenizer = match (&tokenizer_file, &spec) {
        (Some(path), _) => TextTokenizer::load(path)?,
        (None, TokenizerSpec::Bpe { vocab_size }) => {
            let texts: Vec<&str> = train_docs.iter().map(|d| d.text.as_str()).collect();
            TextTokenizer::train_bpe_on(&texts, *vocab_size)?
        }
        (None, _) => TextTokenizer::Bytes,
    };
    check_vocab(cfg, &tokenizer)?;
    let train = split::pack(&train_docs, &tokenizer)?;
    let val = split::pack(&val_docs, &tokenizer)?;
    let stats = DataStats {
        documents,
        filtered,
        train_documents: train_docs.len(),
        val_documents: val_docs.len(),
        train_tokens: train.len(),
        val_tokens: val.len(),
        vocab_size: tokenizer.vocab_size(),
        cache_hit: false,
        cache_key: key.clone(),
        pairs: None,
    };
    let (train, val) = cache::write(&root, &key, &tokenizer, &train, &val, &stats)?;
    Ok(PreparedData {
        tokenizer,
        train,
        val,
        stats,
    })
}

/// The model must have an embedding row for every id the tokenizer can produce.
fn check_vocab(cfg: &Config, tokenizer: &TextTokenizer) -> Result<()> {
    if tokenizer.vocab_size() > cfg.model.vocab_size {
        return Err(DataError::invalid(
            "model.vocab_size",
            format!(
                "{} is smaller than the tokenizer's vocabulary of {}",
                cfg.model.vocab_size,
                tokenizer.vocab_size()
            ),
        ));
    }
    Ok(())
}

fn prepare_dummy(cfg: &Config) -> Result<PreparedData> {
    let dummy = DummyData::new(cfg.model.vocab_size, cfg.training.seed)?;
    let (train, val) = dummy.splits();
    let stats = DataStats {
        documents: 0,
        filtered: FilterStats::default(),
        train_documents: 0,
        val_documents: 0,
        train_tokens: train.len(),
        val_tokens: val.len(),
        vocab_size: dummy.vocab_size(),
        cache_hit: false,
        cache_key: String::new(),
        pairs: None,
    };
    Ok(PreparedData {
        tokenizer: TextTokenizer::Bytes,
        train: TokenSplit::from_vec(train),
        val: TokenSplit::from_vec(val),
        stats,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(dataset: &str) -> Config {
        let mut cfg = Config::default();
        cfg.data.dataset = dataset.to_string();
        cfg
    }

    type Mutation = fn(&mut Config);

    #[test]
    fn preference_data_reports_its_pairs_and_duplicates_not_text_counts() {
        let stats = DataStats {
            documents: 10,
            pairs: Some(PairStats {
                train: 9,
                val: 1,
                duplicates: 4,
            }),
            ..DataStats::default()
        };
        let m = stats.metrics(&config("pairs.jsonl").data);
        assert_eq!(
            m.keys().map(String::as_str).collect::<Vec<_>>(),
            [
                "data/duplicate_pairs",
                "data/pairs",
                "data/train_pairs",
                "data/val_pairs"
            ]
        );
        assert_eq!((m["data/pairs"], m["data/duplicate_pairs"]), (10.0, 4.0));
    }

    #[test]
    fn out_of_range_settings_are_rejected_with_their_key() {
        let cases: [(&str, Mutation, &str); 4] = [
            (
                "zero val",
                |c| c.data.val_fraction = 0.0,
                "data.val_fraction",
            ),
            (
                "one val",
                |c| c.data.val_fraction = 1.0,
                "data.val_fraction",
            ),
            (
                "nan val",
                |c| c.data.val_fraction = f64::NAN,
                "data.val_fraction",
            ),
            (
                "threshold",
                |c| {
                    c.data.near_dedup = true;
                    c.data.near_dedup_threshold = 1.5
                },
                "data.near_dedup_threshold",
            ),
        ];
        for (name, mutate, key) in cases {
            let mut cfg = config("dummy");
            mutate(&mut cfg);
            let err = prepare(&cfg, None).expect_err(name);
            assert_eq!(err.key(), key, "{name}");
            assert!(err.to_string().starts_with(key), "{name}: {err}");
        }
    }

    #[test]
    fn the_dummy_dataset_gives_two_nonempty_splits_within_the_vocabulary() {
        let prepared = prepare(&config("dummy"), None).expect("dummy");
        assert!(prepared.train.len() > prepared.val.len());
        assert!(!prepared.val.is_empty());
        let vocab = prepared.stats.vocab_size as u32;
        assert!(prepared.train.to_vec().iter().all(|&t| t < vocab));
    }

    #[test]
    fn a_missing_path_names_the_dataset_key() {
        let err = prepare(&config("no/such/file.txt"), None).expect_err("missing");
        assert_eq!(err.key(), "data.dataset");
        assert!(err.to_string().contains("no/such/file.txt"), "{err}");
    }

    fn text_config(dir: &Path, tokenizer: &str) -> Config {
        let mut cfg = config(&dir.join("corpus").display().to_string());
        cfg.data.cache_dir = dir.join("cache").display().to_string();
        cfg.data.tokenizer = tokenizer.to_string();
        cfg.model.vocab_size = 300;
        cfg
    }

    fn write_corpus(dir: &Path, n: usize) {
        let corpus = dir.join("corpus");
        std::fs::create_dir_all(&corpus).unwrap();
        for i in 0..n {
            let text = format!("document {i}: the quick brown fox jumps over the lazy dog\n");
            std::fs::write(corpus.join(format!("{i:03}.txt")), text.repeat(5)).unwrap();
        }
    }

    #[test]
    fn a_second_prepare_reads_the_cache_and_a_data_change_rebuilds_it() {
        for tokenizer in ["bytes", "bpe"] {
            let dir = tempfile::tempdir().unwrap();
            write_corpus(dir.path(), 20);
            let cfg = text_config(dir.path(), tokenizer);

            let first = prepare(&cfg, None).unwrap();
            assert!(!first.stats.cache_hit, "{tokenizer}");
            assert_eq!(first.stats.documents, 20);
            assert!(first.train.is_mapped() && first.stats.val_documents > 0);

            let second = prepare(&cfg, None).unwrap();
            assert!(second.stats.cache_hit, "{tokenizer}");
            assert_eq!(second.train.to_vec(), first.train.to_vec());
            assert_eq!(second.val.to_vec(), first.val.to_vec());
            assert_eq!(
                second.tokenizer.to_json().unwrap(),
                first.tokenizer.to_json().unwrap()
            );

            std::fs::write(dir.path().join("corpus/005.txt"), "an edited document").unwrap();
            let third = prepare(&cfg, None).unwrap();
            assert!(
                !third.stats.cache_hit,
                "{tokenizer}: edited data must re-tokenize"
            );
            assert_ne!(third.stats.cache_key, first.stats.cache_key);
        }
    }

    #[test]
    fn packed_splits_decode_to_the_documents_with_separators() {
        let dir = tempfile::tempdir().unwrap();
        write_corpus(dir.path(), 10);
        let prepared = prepare(&text_config(dir.path(), "bpe"), None).unwrap();
        let tokenizer = &prepared.tokenizer;
        let eot = tokenizer.eot_id();
        let ids = prepared.train.to_vec();
        assert_eq!(ids.last(), Some(&eot));
        let docs: Vec<String> = ids
            .split(|&t| t == eot)
            .filter(|d| !d.is_empty())
            .map(|d| tokenizer.decode(d).unwrap())
            .collect();
        assert_eq!(docs.len(), prepared.stats.train_documents);
        assert!(docs
            .iter()
            .all(|d| d.starts_with("document ") && d.ends_with("dog\n")));
    }

    #[test]
    fn filters_and_duplicates_are_counted_in_the_stats() {
        let dir = tempfile::tempdir().unwrap();
        write_corpus(dir.path(), 6);
        let corpus = dir.path().join("corpus");
        std::fs::copy(corpus.join("000.txt"), corpus.join("copy.txt")).unwrap();
        std::fs::write(corpus.join("short.txt"), "hi").unwrap();
        let mut cfg = text_config(dir.path(), "bytes");
        cfg.data.min_length = 10;
        let stats = prepare(&cfg, None).unwrap().stats;
        assert_eq!(stats.documents, 8);
        assert_eq!(stats.filtered.too_short, 1);
        assert_eq!(stats.filtered.exact_duplicates, 1);
        assert_eq!(stats.train_documents + stats.val_documents, 6);
    }

    #[test]
    fn line_filter_counts_reach_the_stats_and_the_step_zero_metrics() {
        let dir = tempfile::tempdir().unwrap();
        write_corpus(dir.path(), 6);
        let corpus = dir.path().join("corpus");
        std::fs::write(
            corpus.join("menu.txt"),
            "Home | Blog | About\n-----\nOne more line of text.\n",
        )
        .unwrap();
        let mut cfg = text_config(dir.path(), "bytes");
        let plain = prepare(&cfg, None).unwrap().stats;
        assert_eq!(plain.filtered, FilterStats::default());
        assert_eq!(
            plain.metrics(&cfg.data).keys().cloned().collect::<Vec<_>>(),
            [
                "data/documents",
                "data/filter/exact_duplicates",
                "data/train_tokens",
                "data/val_tokens"
            ]
        );
        cfg.data.line_filters.symbol_lines = true;
        cfg.data.line_filters.boilerplate = true;
        let cleaned = prepare(&cfg, None).unwrap().stats;
        assert!(
            !cleaned.cache_hit,
            "line filter settings are part of the cache key"
        );
        assert_eq!(
            (
                cleaned.filtered.symbol_lines,
                cleaned.filtered.boilerplate_lines
            ),
            (1, 1)
        );
        assert!(cleaned.train_tokens + cleaned.val_tokens < plain.train_tokens + plain.val_tokens);
        let m = cleaned.metrics(&cfg.data);
        assert_eq!(m["data/filter/symbol_lines"], 1.0);
        assert_eq!(m["data/filter/boilerplate_lines"], 1.0);
        assert_eq!(m["data/filter/emptied"], 0.0);
        assert_eq!(m["data/documents"], 7.0);
        assert!(
            !m.contains_key("data/filter/short_lines"),
            "that filter is off"
        );
        assert!(
            DataStats::default()
                .metrics(&Config::default().data)
                .is_empty(),
            "dummy"
        );
    }

    #[test]
    fn a_tokenizer_hint_or_file_replaces_training_and_must_fit_the_model() {
        let dir = tempfile::tempdir().unwrap();
        write_corpus(dir.path(), 10);
        let trained = prepare(&text_config(dir.path(), "bpe"), None).unwrap();
        let saved = dir.path().join("tokenizer.json");
        trained.tokenizer.save(&saved).unwrap();

        let from_hint = prepare(&text_config(dir.path(), "bytes"), Some(&saved)).unwrap();
        assert_eq!(
            from_hint.tokenizer.vocab_size(),
            trained.tokenizer.vocab_size()
        );
        assert_eq!(from_hint.train.to_vec(), trained.train.to_vec());

        let mut small = text_config(dir.path(), &saved.display().to_string());
        small.model.vocab_size = 256;
        let err = prepare(&small, None).unwrap_err();
        assert_eq!(err.key(), "model.vocab_size", "{err}");
    }

    #[test]
    fn the_demo_dataset_prepares_with_raw_bytes() {
        let dir = tempfile::tempdir().unwrap();
        let mut cfg = config("demo");
        cfg.data.cache_dir = dir.path().display().to_string();
        let prepared = prepare(&cfg, None).unwrap();
        assert!(prepared.stats.train_tokens + prepared.stats.val_tokens >= 100_000);
        assert!(prepared.stats.val_documents >= 1);
        let entropy = demo::unigram_entropy(&prepared.val.to_vec());
        assert!(entropy > 2.0 && entropy < 256f64.ln(), "{entropy}");
    }
}
