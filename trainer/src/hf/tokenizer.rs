//! The tokenizer files of an exported directory: `tokenizer.json` (what `transformers`'
//! `PreTrainedTokenizerFast` and the `tokenizers` library load) and `tokenizer_config.json`.
//!
//! A byte-level BPE trained here is written as it is. The raw-bytes tokenizer (id = byte value,
//! end-of-text = id 0) becomes a byte-level BPE without merges whose vocabulary is the 256
//! byte symbols in byte order, with `<|endoftext|>` in the place of the NUL byte: it encodes
//! every text to the same ids as the trainer.

use anyhow::{Context, Result};
use serde_json::{json, Map, Value};

use crate::data::{TextTokenizer, EOT_TOKEN};

/// GPT-2's reversible map from bytes to printable characters (`bytes_to_unicode`): printable
/// Latin-1 bytes stand for themselves, the others get the characters from U+0100 on, in order.
pub fn byte_symbol(byte: u8) -> char {
    let printable = |b: u8| matches!(b, b'!'..=b'~' | 0xA1..=0xAC | 0xAE..=0xFF);
    if printable(byte) {
        return char::from(byte);
    }
    let before = (0..byte).filter(|&b| !printable(b)).count() as u32;
    char::from_u32(256 + before).unwrap_or(char::REPLACEMENT_CHARACTER)
}

fn byte_level() -> Value {
    json!({"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": true})
}

/// `tokenizer.json` for the raw-bytes tokenizer.
fn bytes_tokenizer_json() -> Value {
    let mut vocab = Map::new();
    vocab.insert(EOT_TOKEN.to_string(), json!(0));
    for b in 1..=255u8 {
        vocab.insert(byte_symbol(b).to_string(), json!(b));
    }
    json!({
        "version": "1.0",
        "truncation": null,
        "padding": null,
        "added_tokens": [{
            "id": 0, "content": EOT_TOKEN, "single_word": false, "lstrip": false,
            "rstrip": false, "normalized": false, "special": true
        }],
        "normalizer": null,
        "pre_tokenizer": byte_level(),
        "post_processor": null,
        "decoder": byte_level(),
        "model": {
            "type": "BPE", "dropout": null, "unk_token": null,
            "continuing_subword_prefix": null, "end_of_word_suffix": null,
            "fuse_unk": false, "byte_fallback": false, "ignore_merges": false,
            "vocab": vocab, "merges": []
        }
    })
}

/// (`tokenizer.json`, `tokenizer_config.json`) for `tokenizer` and a context of `max_len`.
pub fn files(tokenizer: &TextTokenizer, max_len: usize) -> Result<(String, String)> {
    let (tokenizer_json, eot) = match tokenizer {
        TextTokenizer::Bytes => (
            serde_json::to_string_pretty(&bytes_tokenizer_json())?,
            EOT_TOKEN.to_string(),
        ),
        TextTokenizer::Hf { tokenizer: tk, eot } => (
            tokenizer.to_json()?,
            tk.id_to_token(*eot)
                .context("the tokenizer has no token for its end-of-text id")?,
        ),
    };
    let config = json!({
        "tokenizer_class": "PreTrainedTokenizerFast",
        "model_max_length": max_len,
        "bos_token": eot,
        "eos_token": eot,
        "add_prefix_space": false,
        "clean_up_tokenization_spaces": false
    });
    Ok((tokenizer_json, serde_json::to_string_pretty(&config)?))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_byte_symbols_are_gpt2s_and_distinct() {
        assert_eq!(byte_symbol(b'A'), 'A');
        assert_eq!(byte_symbol(b' '), 'Ġ', "GPT-2 writes a space as U+0120");
        assert_eq!(byte_symbol(b'\n'), 'Ċ');
        assert_eq!(byte_symbol(0), 'Ā');
        let all: std::collections::HashSet<char> = (0..=255u8).map(byte_symbol).collect();
        assert_eq!(all.len(), 256);
    }

    #[test]
    fn the_exported_bytes_tokenizer_encodes_text_to_the_trainers_byte_ids() {
        let (json, config) = files(&TextTokenizer::Bytes, 64).unwrap();
        let exported = TextTokenizer::from_json(json.as_bytes()).unwrap();
        for text in ["hello world", "héllo\n\twörld ✓ 日本語", "  two  spaces"] {
            assert_eq!(
                exported.encode(text).unwrap(),
                TextTokenizer::Bytes.encode(text).unwrap(),
                "{text:?}"
            );
            let ids = exported.encode(text).unwrap();
            assert_eq!(exported.decode(&ids).unwrap(), text);
        }
        assert_eq!(exported.eot_id(), 0);
        assert_eq!(exported.vocab_size(), 256);
        let config: Value = serde_json::from_str(&config).unwrap();
        assert_eq!(config["eos_token"], EOT_TOKEN);
        assert_eq!(config["model_max_length"], 64);
    }
}
