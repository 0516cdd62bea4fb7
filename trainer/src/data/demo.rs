//! The `demo` dataset: this project's own documentation and trainer sources, compiled into the
//! binary so a first run needs no download. Every embedded file is one document.

use std::collections::HashMap;

use super::Document;

/// (name, text) of every embedded file; a fixed list so the corpus only changes when it is edited.
const FILES: [(&str, &str); 14] = [
    ("docs/data.md", include_str!("../../../docs/data.md")),
    ("trainer/Cargo.toml", include_str!("../../Cargo.toml")),
    ("trainer/src/lib.rs", include_str!("../lib.rs")),
    ("trainer/src/wire.rs", include_str!("../wire.rs")),
    (
        "trainer/src/config/mod.rs",
        include_str!("../config/mod.rs"),
    ),
    ("trainer/src/data/mod.rs", include_str!("mod.rs")),
    ("trainer/src/data/sources.rs", include_str!("sources.rs")),
    ("trainer/src/data/filters.rs", include_str!("filters.rs")),
    ("trainer/src/data/split.rs", include_str!("split.rs")),
    (
        "trainer/src/data/tokenizer.rs",
        include_str!("tokenizer.rs"),
    ),
    ("trainer/src/data/cache.rs", include_str!("cache.rs")),
    ("trainer/src/data/batches.rs", include_str!("batches.rs")),
    ("trainer/src/data/dummy.rs", include_str!("dummy.rs")),
    ("trainer/src/data/demo.rs", include_str!("demo.rs")),
];

/// The embedded corpus as documents.
pub fn documents() -> Vec<Document> {
    FILES
        .iter()
        .map(|(name, text)| Document {
            origin: format!("demo:{name}"),
            text: (*text).to_string(),
        })
        .collect()
}

/// Total size of the embedded corpus in bytes.
pub fn corpus_bytes() -> usize {
    FILES.iter().map(|(_, text)| text.len()).sum()
}

/// Entropy in nats of the token frequencies in `tokens`: the loss of the best model that ignores
/// context. A language model beating it has learned something beyond symbol counts.
pub fn unigram_entropy(tokens: &[u32]) -> f64 {
    if tokens.is_empty() {
        return 0.0;
    }
    let mut counts: HashMap<u32, usize> = HashMap::new();
    for &t in tokens {
        *counts.entry(t).or_default() += 1;
    }
    let n = tokens.len() as f64;
    counts
        .values()
        .map(|&c| {
            let p = c as f64 / n;
            -p * p.ln()
        })
        .sum()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_demo_corpus_is_at_least_100_kb_of_distinct_text() {
        assert!(corpus_bytes() >= 100_000, "{} bytes", corpus_bytes());
        let docs = documents();
        assert_eq!(docs.len(), FILES.len());
        assert!(docs
            .iter()
            .all(|d| !d.text.trim().is_empty() && !d.text.contains('\0')));
    }

    #[test]
    fn unigram_entropy_matches_hand_computed_values() {
        let cases: [(&[u32], f64); 4] = [
            (&[], 0.0),
            (&[7, 7, 7], 0.0),
            (&[1, 2], std::f64::consts::LN_2),
            (&[1, 2, 3, 4], 4f64.ln()),
        ];
        for (tokens, expected) in cases {
            assert!(
                (unigram_entropy(tokens) - expected).abs() < 1e-12,
                "{tokens:?}"
            );
        }
    }
}
