//! Text ⇄ token ids: raw bytes, or a byte-level BPE (trained here or loaded from `tokenizer.json`).
//!
//! Raw bytes: id = byte value, vocabulary 256, and the end-of-text separator is id 0 (the NUL
//! byte), which text-like files never contain (directory scans skip files with NUL bytes).
//! BPE: the `tokenizers` crate's BPE with the byte-level pre-tokenizer and decoder (GPT-2 style,
//! no prefix space), with the special token `<|endoftext|>` as separator.

use std::path::{Path, PathBuf};

use tokenizers::models::bpe::{BpeTrainerBuilder, BPE};
use tokenizers::models::TrainerWrapper;
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::{AddedToken, Tokenizer};

use super::{sources, DataError, Result};

/// The end-of-text special token of BPE tokenizers.
pub const EOT_TOKEN: &str = "<|endoftext|>";
/// End-of-text tokens a loaded tokenizer may use, in order of preference.
const END_OF_TEXT_TOKENS: [&str; 3] = [EOT_TOKEN, "</s>", "<|end_of_text|>"];
/// Marker written by `save` for the raw-bytes tokenizer.
const BYTES_MARKER_KEY: &str = "trainyard_tokenizer";
/// A byte-level BPE needs its 256 byte symbols plus the end-of-text token.
pub const MIN_BPE_VOCAB: usize = 257;

/// A tokenizer the trainer can use.
#[derive(Debug, Clone)]
pub enum TextTokenizer {
    /// UTF-8 bytes as ids 0..256; end-of-text is 0 (NUL).
    Bytes,
    /// A `tokenizers` tokenizer with an `<|endoftext|>` token.
    Hf { tokenizer: Box<Tokenizer>, eot: u32 },
}

fn tk_err(context: &str, e: impl std::fmt::Display) -> DataError {
    DataError::invalid("data.tokenizer", format!("{context}: {e}"))
}

impl TextTokenizer {
    /// Wraps a `tokenizers` tokenizer, which must know an end-of-text token: `<|endoftext|>`
    /// (GPT-2 and the BPEs trained here), else `</s>` or `<|end_of_text|>` (Llama families).
    pub fn from_hf(tokenizer: Tokenizer) -> Result<Self> {
        let eot = END_OF_TEXT_TOKENS
            .iter()
            .find_map(|t| tokenizer.token_to_id(t))
            .ok_or_else(|| {
                DataError::invalid(
                    "data.tokenizer",
                    format!(
                        "tokenizer has none of the end-of-text tokens {} to separate documents",
                        END_OF_TEXT_TOKENS.join(", ")
                    ),
                )
            })?;
        Ok(TextTokenizer::Hf {
            tokenizer: Box::new(tokenizer),
            eot,
        })
    }

    pub fn encode(&self, text: &str) -> Result<Vec<u32>> {
        match self {
            TextTokenizer::Bytes => Ok(text.bytes().map(u32::from).collect()),
            TextTokenizer::Hf { tokenizer, .. } => tokenizer
                .encode_fast(text, false)
                .map(|enc| enc.get_ids().to_vec())
                .map_err(|e| tk_err("encoding failed", e)),
        }
    }

    /// Ids back to text; byte sequences that are not valid UTF-8 become U+FFFD, and ids outside
    /// the vocabulary are skipped.
    pub fn decode(&self, ids: &[u32]) -> Result<String> {
        match self {
            TextTokenizer::Bytes => {
                let bytes: Vec<u8> = ids.iter().filter_map(|&id| u8::try_from(id).ok()).collect();
                Ok(String::from_utf8_lossy(&bytes).into_owned())
            }
            TextTokenizer::Hf { tokenizer, .. } => {
                let size = self.vocab_size();
                let known: Vec<u32> = ids
                    .iter()
                    .copied()
                    .filter(|&id| (id as usize) < size)
                    .collect();
                tokenizer
                    .decode(&known, false)
                    .map_err(|e| tk_err("decoding failed", e))
            }
        }
    }

    /// Number of ids, special tokens included; every id is below this.
    pub fn vocab_size(&self) -> usize {
        match self {
            TextTokenizer::Bytes => 256,
            TextTokenizer::Hf { tokenizer, .. } => tokenizer.get_vocab_size(true),
        }
    }

    /// The separator placed between packed documents.
    pub fn eot_id(&self) -> u32 {
        match self {
            TextTokenizer::Bytes => 0,
            TextTokenizer::Hf { eot, .. } => *eot,
        }
    }

    /// Serialized form: a `tokenizer.json`, or a one-line JSON marker for raw bytes.
    pub fn to_json(&self) -> Result<String> {
        match self {
            TextTokenizer::Bytes => Ok(format!("{{\"{BYTES_MARKER_KEY}\":\"bytes\"}}")),
            TextTokenizer::Hf { tokenizer, .. } => tokenizer
                .to_string(false)
                .map_err(|e| tk_err("cannot serialize tokenizer", e)),
        }
    }

    /// Writes `to_json` to `path` atomically (temp file + rename).
    pub fn save(&self, path: &Path) -> Result<()> {
        let json = self.to_json()?;
        write_atomic(path, json.as_bytes()).map_err(|e| DataError::io("data.tokenizer", path, e))
    }

    /// Reads what `save` wrote, or any `tokenizer.json` with an `<|endoftext|>` token.
    pub fn load(path: &Path) -> Result<Self> {
        let bytes = std::fs::read(path).map_err(|e| DataError::io("data.tokenizer", path, e))?;
        Self::from_json(&bytes).map_err(|e| match e {
            DataError::Invalid { key, message } => DataError::Invalid {
                key,
                message: format!("{}: {message}", path.display()),
            },
            other => other,
        })
    }

    pub fn from_json(bytes: &[u8]) -> Result<Self> {
        let value: serde_json::Value =
            serde_json::from_slice(bytes).map_err(|e| tk_err("not a JSON tokenizer file", e))?;
        if value.get(BYTES_MARKER_KEY).and_then(|v| v.as_str()) == Some("bytes") {
            return Ok(TextTokenizer::Bytes);
        }
        let tokenizer =
            Tokenizer::from_bytes(bytes).map_err(|e| tk_err("not a tokenizer.json", e))?;
        Self::from_hf(tokenizer)
    }

    /// Trains a byte-level BPE with at most `vocab_size` ids on `texts`.
    pub fn train_bpe_on<S: AsRef<str> + Sync>(texts: &[S], vocab_size: usize) -> Result<Self> {
        if vocab_size < MIN_BPE_VOCAB {
            return Err(DataError::invalid(
                "model.vocab_size",
                format!(
                    "a byte-level BPE needs at least {MIN_BPE_VOCAB} ids (256 bytes + {EOT_TOKEN}), got {vocab_size}"
                ),
            ));
        }
        let mut trainer: TrainerWrapper = BpeTrainerBuilder::new()
            .vocab_size(vocab_size)
            .min_frequency(2)
            .show_progress(false)
            .special_tokens(vec![AddedToken::from(EOT_TOKEN, true)])
            .initial_alphabet(ByteLevel::alphabet().into_iter().collect())
            .build()
            .into();
        let mut tokenizer = Tokenizer::new(BPE::default());
        tokenizer.with_pre_tokenizer(Some(ByteLevel::new(false, true, true)));
        tokenizer.with_decoder(Some(ByteLevel::new(false, true, true)));
        tokenizer
            .train(&mut trainer, texts.iter().map(|t| t.as_ref()))
            .map_err(|e| tk_err("BPE training failed", e))?;
        Self::from_hf(tokenizer)
    }
}

/// `trainyard tokenizer train`: trains a byte-level BPE of `vocab_size` on every document in
/// `inputs` (files, directories, globs, JSONL with a `text` field) and saves it to `out`.
pub fn train_bpe(inputs: &[PathBuf], vocab_size: usize, out: &Path) -> Result<TextTokenizer> {
    let docs = sources::load_paths(inputs, "text")?;
    if docs.is_empty() {
        return Err(DataError::invalid("--input", "no text documents found"));
    }
    let texts: Vec<&str> = docs.iter().map(|d| d.text.as_str()).collect();
    let tokenizer = TextTokenizer::train_bpe_on(&texts, vocab_size)?;
    tokenizer.save(out)?;
    Ok(tokenizer)
}

/// Writes a file so readers see the old content or the new, never a half-written one.
pub(crate) fn write_atomic(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    use std::io::Write;
    if let Some(dir) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir)?;
    }
    let mut name = path.file_name().unwrap_or_default().to_os_string();
    name.push(format!(".tmp-{}", std::process::id()));
    let tmp = path.with_file_name(name);
    let mut file = std::fs::File::create(&tmp)?;
    file.write_all(bytes)?;
    file.sync_all()?;
    std::fs::rename(&tmp, path)
}

#[cfg(test)]
mod tests {
    use super::*;

    const SAMPLES: [&str; 5] = [
        "",
        "hello world",
        "héllo wörld — ünïcode ✓ 日本語",
        "  leading spaces\n\ttabs and\r\nnewlines  ",
        "fn main() { println!(\"{}\", 1 + 2); }",
    ];

    fn corpus() -> Vec<String> {
        (0..200)
            .map(|i| format!("the quick brown fox {i} jumps over the lazy dog; héllo wörld"))
            .collect()
    }

    #[test]
    fn every_tokenizer_round_trips_text() {
        let bpe = TextTokenizer::train_bpe_on(&corpus(), 300).unwrap();
        for tokenizer in [TextTokenizer::Bytes, bpe] {
            for text in SAMPLES {
                let ids = tokenizer.encode(text).unwrap();
                assert!(ids.iter().all(|&id| (id as usize) < tokenizer.vocab_size()));
                assert_eq!(tokenizer.decode(&ids).unwrap(), text);
            }
        }
    }

    #[test]
    fn raw_bytes_use_byte_values_and_nul_as_end_of_text() {
        let tokenizer = TextTokenizer::Bytes;
        assert_eq!(tokenizer.encode("Aé").unwrap(), [65, 0xC3, 0xA9]);
        assert_eq!(tokenizer.vocab_size(), 256);
        assert_eq!(tokenizer.eot_id(), 0);
        assert_eq!(tokenizer.decode(&[72, 105, 999]).unwrap(), "Hi");
    }

    #[test]
    fn a_trained_bpe_respects_its_vocabulary_and_compresses() {
        let text = corpus().join("\n");
        let tokenizer = TextTokenizer::train_bpe_on(&corpus(), 300).unwrap();
        assert!(tokenizer.vocab_size() <= 300 && tokenizer.vocab_size() > 257);
        assert_eq!(tokenizer.eot_id(), 0, "special tokens come first");
        let ids = tokenizer.encode(&text).unwrap();
        assert!(
            ids.len() * 2 < text.len(),
            "{} ids for {} bytes",
            ids.len(),
            text.len()
        );
    }

    #[test]
    fn too_small_a_bpe_vocabulary_names_model_vocab_size() {
        let err = TextTokenizer::train_bpe_on(&corpus(), 256).unwrap_err();
        assert_eq!(err.key(), "model.vocab_size");
    }

    #[test]
    fn saved_tokenizers_load_back_identically() {
        let dir = tempfile::tempdir().unwrap();
        let bpe = TextTokenizer::train_bpe_on(&corpus(), 280).unwrap();
        for (name, tokenizer) in [("bytes.json", TextTokenizer::Bytes), ("bpe.json", bpe)] {
            let path = dir.path().join(name);
            tokenizer.save(&path).unwrap();
            let loaded = TextTokenizer::load(&path).unwrap();
            assert_eq!(loaded.vocab_size(), tokenizer.vocab_size(), "{name}");
            assert_eq!(loaded.eot_id(), tokenizer.eot_id(), "{name}");
            for text in SAMPLES {
                assert_eq!(
                    loaded.encode(text).unwrap(),
                    tokenizer.encode(text).unwrap()
                );
            }
        }
    }

    #[test]
    fn train_bpe_reads_its_inputs_and_writes_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let input = dir.path().join("corpus.txt");
        std::fs::write(&input, corpus().join("\n")).unwrap();
        let out = dir.path().join("tok/tokenizer.json");
        let trained = train_bpe(&[input], 290, &out).unwrap();
        let loaded = TextTokenizer::load(&out).unwrap();
        assert_eq!(loaded.vocab_size(), trained.vocab_size());
    }

    #[test]
    fn unusable_tokenizer_files_are_refused_with_the_key() {
        let dir = tempfile::tempdir().unwrap();
        let cases = [
            ("garbage.json", "not json", "not a JSON tokenizer file"),
            ("object.json", "{\"a\": 1}", "not a tokenizer.json"),
        ];
        for (name, content, fragment) in cases {
            let path = dir.path().join(name);
            std::fs::write(&path, content).unwrap();
            let err = TextTokenizer::load(&path).unwrap_err();
            assert_eq!(err.key(), "data.tokenizer");
            assert!(err.to_string().contains(fragment), "{name}: {err}");
            assert!(err.to_string().contains(name), "{name}: {err}");
        }
    }
}
