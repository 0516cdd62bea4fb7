//! Train/validation split by content hash, and packing documents into one token stream.
//!
//! A document goes to validation when the first 8 bytes of its blake3 hash, read as a fraction of
//! 2^64, fall below `val_fraction`: the split depends only on each document's text, never on file
//! order or on which other documents exist.

use super::{DataError, Document, Result, TextTokenizer};
use crate::data::filters::first_8;

/// Position of a text in [0, 1), uniform over contents.
fn hash_fraction(text: &str) -> f64 {
    let h = u64::from_le_bytes(first_8(blake3::hash(text.as_bytes()).as_bytes()));
    (h >> 11) as f64 / (1u64 << 53) as f64
}

/// Splits documents into (train, validation), both non-empty.
///
/// With two or more documents, the hash rule decides and, if one side came out empty, the
/// document nearest the boundary moves over. A single document is cut in two at a line break near
/// the `1 - val_fraction` mark (one big `input.txt` is the common case), or at a character
/// boundary when it has no line break there.
pub fn split(docs: Vec<Document>, val_fraction: f64) -> Result<(Vec<Document>, Vec<Document>)> {
    match docs.len() {
        0 => Err(DataError::invalid(
            "data.dataset",
            "no documents are left after filtering (check data.min_length and the dedup settings)",
        )),
        1 => split_one(docs.into_iter().next(), val_fraction),
        _ => {
            let mut scored: Vec<(f64, Document)> = docs
                .into_iter()
                .map(|d| (hash_fraction(&d.text), d))
                .collect();
            let n_val = scored.iter().filter(|(f, _)| *f < val_fraction).count();
            if n_val == 0 || n_val == scored.len() {
                // Move the document closest to the boundary so both sides exist.
                let pick = if n_val == 0 {
                    position_by(&scored, |a, b| a < b)
                } else {
                    position_by(&scored, |a, b| a > b)
                };
                scored[pick].0 = if n_val == 0 { -1.0 } else { 2.0 };
            }
            let (val, train): (Vec<_>, Vec<_>) =
                scored.into_iter().partition(|(f, _)| *f < val_fraction);
            Ok((
                train.into_iter().map(|(_, d)| d).collect(),
                val.into_iter().map(|(_, d)| d).collect(),
            ))
        }
    }
}

fn position_by(scored: &[(f64, Document)], better: impl Fn(f64, f64) -> bool) -> usize {
    let mut best = 0;
    for (i, (f, _)) in scored.iter().enumerate() {
        if better(*f, scored[best].0) {
            best = i;
        }
    }
    best
}

fn split_one(doc: Option<Document>, val_fraction: f64) -> Result<(Vec<Document>, Vec<Document>)> {
    let Some(doc) = doc else {
        return Err(DataError::invalid("data.dataset", "no documents"));
    };
    let text = &doc.text;
    if text.chars().count() < 2 {
        return Err(DataError::invalid(
            "data.dataset",
            format!(
                "{} is the only document and too short to split into training and validation",
                doc.origin
            ),
        ));
    }
    let mut cut = ((text.len() as f64) * (1.0 - val_fraction)) as usize;
    cut = cut.clamp(1, text.len() - 1);
    while !text.is_char_boundary(cut) {
        cut += 1;
    }
    // Prefer the line break just after the mark, if it keeps both sides non-empty.
    if let Some(nl) = text[cut..].find('\n') {
        let at = cut + nl + 1;
        if at < text.len() {
            cut = at;
        }
    }
    if cut >= text.len() {
        cut = text.char_indices().last().map_or(1, |(i, _)| i);
    }
    let train = Document {
        origin: format!("{} (head)", doc.origin),
        text: text[..cut].to_string(),
    };
    let val = Document {
        origin: format!("{} (tail)", doc.origin),
        text: text[cut..].to_string(),
    };
    Ok((vec![train], vec![val]))
}

/// Concatenates documents into one token stream, each followed by end-of-text.
pub fn pack(docs: &[Document], tokenizer: &TextTokenizer) -> Result<Vec<u32>> {
    let eot = tokenizer.eot_id();
    let mut stream = Vec::new();
    for doc in docs {
        stream.extend(tokenizer.encode(&doc.text)?);
        stream.push(eot);
    }
    Ok(stream)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn docs(n: usize) -> Vec<Document> {
        (0..n)
            .map(|i| Document {
                origin: format!("doc{i}"),
                text: format!("document number {i}"),
            })
            .collect()
    }

    fn val_texts(docs: Vec<Document>, fraction: f64) -> Vec<String> {
        let (_, val) = split(docs, fraction).unwrap();
        let mut texts: Vec<String> = val.into_iter().map(|d| d.text).collect();
        texts.sort();
        texts
    }

    #[test]
    fn the_split_does_not_depend_on_document_order() {
        let forward = val_texts(docs(500), 0.1);
        let mut reversed = docs(500);
        reversed.reverse();
        assert_eq!(val_texts(reversed, 0.1), forward);
        // Roughly the requested share.
        assert!((25..=75).contains(&forward.len()), "{}", forward.len());
    }

    #[test]
    fn adding_documents_never_moves_existing_ones_between_splits() {
        let before = val_texts(docs(100), 0.2);
        let after = val_texts(docs(300), 0.2);
        assert!(before.iter().all(|t| after.contains(t)));
    }

    #[test]
    fn both_sides_are_non_empty_for_any_fraction() {
        for (n, fraction) in [(2, 0.01), (2, 0.99), (3, 0.001), (10, 0.999), (5, 0.5)] {
            let (train, val) = split(docs(n), fraction).unwrap();
            assert!(
                !train.is_empty() && !val.is_empty(),
                "{n} docs at {fraction}"
            );
            assert_eq!(train.len() + val.len(), n);
        }
    }

    #[test]
    fn a_single_document_is_cut_at_a_line_break() {
        let text: String = (0..100).map(|i| format!("line {i}\n")).collect();
        let doc = Document {
            origin: "input.txt".into(),
            text: text.clone(),
        };
        let (train, val) = split(vec![doc], 0.1).unwrap();
        assert_eq!(format!("{}{}", train[0].text, val[0].text), text);
        assert!(train[0].text.ends_with('\n'));
        let share = val[0].text.len() as f64 / text.len() as f64;
        assert!((0.05..0.12).contains(&share), "{share}");
    }

    #[test]
    fn nothing_to_split_is_an_error_naming_the_dataset() {
        let one_char = Document {
            origin: "x".into(),
            text: "é".into(),
        };
        for docs in [vec![], vec![one_char]] {
            let err = split(docs, 0.1).unwrap_err();
            assert_eq!(err.key(), "data.dataset");
        }
    }

    #[test]
    fn packing_puts_end_of_text_after_every_document() {
        let docs = vec![
            Document {
                origin: "a".into(),
                text: "ab".into(),
            },
            Document {
                origin: "b".into(),
                text: "c".into(),
            },
        ];
        assert_eq!(
            pack(&docs, &TextTokenizer::Bytes).unwrap(),
            [97, 98, 0, 99, 0]
        );
    }
}
