//! Document filters: line-level cleaning (`lines.rs`), too short, exact duplicates (blake3 of
//! the text in its dedup form), near duplicates (MinHash over word shingles with LSH banding).
//!
//! Filters keep the first occurrence in source order and drop later ones, so results depend only
//! on the (sorted) document list.

use std::collections::{HashMap, HashSet};

use serde::{Deserialize, Serialize};

use super::lines::{dedup_form, LineFilters};
use super::Document;
use crate::config::DataConfig;

/// How many documents each filter dropped, and how many lines the line filters dropped.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct FilterStats {
    /// Documents shorter than `data.min_length`.
    pub too_short: usize,
    pub exact_duplicates: usize,
    pub near_duplicates: usize,
    /// Lines with fewer than `data.line_filters.min_words` words.
    pub short_lines: usize,
    /// Lines without a letter or digit.
    pub symbol_lines: usize,
    /// Navigation and boilerplate lines.
    pub boilerplate_lines: usize,
    /// Documents left without text by the line filters.
    pub emptied: usize,
}

impl FilterStats {
    /// The counts under their metric names (`data/filter/...`), in a fixed order.
    pub fn named(&self) -> [(&'static str, usize); 7] {
        [
            ("too_short", self.too_short),
            ("exact_duplicates", self.exact_duplicates),
            ("near_duplicates", self.near_duplicates),
            ("short_lines", self.short_lines),
            ("symbol_lines", self.symbol_lines),
            ("boilerplate_lines", self.boilerplate_lines),
            ("emptied", self.emptied),
        ]
    }
}

impl std::fmt::Display for FilterStats {
    /// `9 too short, 2 exact duplicates, ...`: the non-zero counts in plain words.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let parts: Vec<String> = self
            .named()
            .iter()
            .filter(|(_, n)| *n > 0)
            .map(|(name, n)| format!("{n} {}", name.replace('_', " ")))
            .collect();
        if parts.is_empty() {
            f.write_str("nothing dropped")
        } else {
            f.write_str(&parts.join(", "))
        }
    }
}

/// Filter settings taken from `data.*`.
#[derive(Debug, Clone, PartialEq)]
pub struct Filters {
    /// Minimum length in characters.
    pub min_length: usize,
    pub dedup: bool,
    /// `Some(threshold)` turns near-duplicate removal on.
    pub near_dedup: Option<f64>,
    /// Line-level cleaning, before the document filters.
    pub lines: LineFilters,
}

impl Filters {
    pub fn from_config(data: &DataConfig) -> Self {
        Filters {
            min_length: data.min_length,
            dedup: data.dedup,
            near_dedup: data.near_dedup.then_some(data.near_dedup_threshold),
            lines: LineFilters::from_config(&data.line_filters),
        }
    }

    /// Applies every enabled filter in order: lines, length, exact, near.
    pub fn apply(&self, docs: Vec<Document>) -> (Vec<Document>, FilterStats) {
        let mut stats = FilterStats::default();
        let mut seen = HashSet::new();
        let mut near = self.near_dedup.map(NearDuplicates::new);
        let mut kept = Vec::with_capacity(docs.len());
        for mut doc in docs {
            if self.lines.is_active() {
                let had_text = !doc.text.trim().is_empty();
                doc.text = self.lines.clean(&doc.text, &mut stats);
                if had_text && doc.text.trim().is_empty() {
                    stats.emptied += 1;
                    continue;
                }
            }
            if doc.text.chars().count() < self.min_length {
                stats.too_short += 1;
                continue;
            }
            if self.dedup
                && !seen.insert(*blake3::hash(dedup_form(&doc.text).as_bytes()).as_bytes())
            {
                stats.exact_duplicates += 1;
                continue;
            }
            if let Some(near) = near.as_mut() {
                if near.is_duplicate_else_insert(&doc.text) {
                    stats.near_duplicates += 1;
                    continue;
                }
            }
            kept.push(doc);
        }
        (kept, stats)
    }
}

/// Hash functions in a MinHash signature.
const NUM_HASHES: usize = 128;
/// Words per shingle.
const SHINGLE_WORDS: usize = 3;

/// The MinHash signature of a text: for each of `NUM_HASHES` hash functions, the smallest hash of
/// any of its word shingles. Two signatures agree at a position with probability equal to the
/// Jaccard similarity of the shingle sets.
pub fn minhash(text: &str) -> [u64; NUM_HASHES] {
    let words: Vec<&str> = text.split_whitespace().collect();
    let mut signature = [u64::MAX; NUM_HASHES];
    let mut add = |shingle: &[&str]| {
        let mut hasher = blake3::Hasher::new();
        for word in shingle {
            hasher.update(word.as_bytes());
            hasher.update(b" ");
        }
        let base = u64::from_le_bytes(first_8(hasher.finalize().as_bytes()));
        for (i, slot) in signature.iter_mut().enumerate() {
            // One cheap mix per hash function instead of NUM_HASHES cryptographic hashes.
            let h = splitmix64(base ^ (i as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15));
            *slot = (*slot).min(h);
        }
    };
    if words.len() < SHINGLE_WORDS {
        add(&words);
    } else {
        words.windows(SHINGLE_WORDS).for_each(&mut add);
    }
    signature
}

/// Fraction of positions where two signatures agree: an estimate of Jaccard similarity.
pub fn estimated_jaccard(a: &[u64; NUM_HASHES], b: &[u64; NUM_HASHES]) -> f64 {
    let same = a.iter().zip(b).filter(|(x, y)| x == y).count();
    same as f64 / NUM_HASHES as f64
}

/// Chance that a pair exactly at the threshold becomes an LSH candidate; the estimate decides.
const CANDIDATE_RECALL: f64 = 0.95;

/// Probability that two signatures with Jaccard similarity `j` share at least one band.
fn candidate_probability(j: f64, bands: usize, rows: usize) -> f64 {
    1.0 - (1.0 - j.powi(rows as i32)).powi(bands as i32)
}

/// Bands × rows = NUM_HASHES: the longest bands (fewest spurious candidates) that still make a
/// pair at the threshold a candidate with probability ≥ CANDIDATE_RECALL.
fn banding(threshold: f64) -> (usize, usize) {
    (1..=NUM_HASHES)
        .rev()
        .filter(|rows| NUM_HASHES.is_multiple_of(*rows))
        .map(|rows| (NUM_HASHES / rows, rows))
        .find(|&(bands, rows)| candidate_probability(threshold, bands, rows) >= CANDIDATE_RECALL)
        .unwrap_or((NUM_HASHES, 1))
}

/// Kept documents' signatures, indexed by band.
struct NearDuplicates {
    threshold: f64,
    bands: usize,
    rows: usize,
    signatures: Vec<[u64; NUM_HASHES]>,
    buckets: HashMap<(usize, u64), Vec<usize>>,
}

impl NearDuplicates {
    fn new(threshold: f64) -> Self {
        let (bands, rows) = banding(threshold);
        NearDuplicates {
            threshold,
            bands,
            rows,
            signatures: Vec::new(),
            buckets: HashMap::new(),
        }
    }

    fn band_keys(&self, signature: &[u64; NUM_HASHES]) -> Vec<(usize, u64)> {
        (0..self.bands)
            .map(|band| {
                let rows = &signature[band * self.rows..(band + 1) * self.rows];
                let key = rows.iter().fold(band as u64, |acc, &v| splitmix64(acc ^ v));
                (band, key)
            })
            .collect()
    }

    fn is_duplicate_else_insert(&mut self, text: &str) -> bool {
        let signature = minhash(text);
        let keys = self.band_keys(&signature);
        let duplicate = keys.iter().any(|key| {
            self.buckets.get(key).is_some_and(|ids| {
                ids.iter().any(|&id| {
                    estimated_jaccard(&self.signatures[id], &signature) >= self.threshold
                })
            })
        });
        if !duplicate {
            let id = self.signatures.len();
            self.signatures.push(signature);
            for key in keys {
                self.buckets.entry(key).or_default().push(id);
            }
        }
        duplicate
    }
}

pub(crate) fn splitmix64(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    x = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    x ^ (x >> 31)
}

pub(crate) fn first_8(bytes: &[u8; 32]) -> [u8; 8] {
    let mut out = [0u8; 8];
    out.copy_from_slice(&bytes[..8]);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn doc(text: &str) -> Document {
        Document {
            origin: String::new(),
            text: text.to_string(),
        }
    }

    /// 200 distinct words, so edits change a known share of shingles.
    fn long_text(seed: u64) -> String {
        (0..200)
            .map(|i| format!("w{}", splitmix64(seed * 1000 + i) % 100_000))
            .collect::<Vec<_>>()
            .join(" ")
    }

    #[test]
    fn each_filter_drops_what_it_should_and_counts_it() {
        let base = long_text(1);
        let mut near = base.clone();
        near.push_str(" one more word");
        let other = long_text(2);
        let docs = || vec![doc("tiny"), doc(&base), doc(&base), doc(&near), doc(&other)];
        let cases = [
            (
                "nothing",
                Filters {
                    min_length: 0,
                    dedup: false,
                    near_dedup: None,
                    lines: LineFilters::default(),
                },
                5,
                FilterStats::default(),
            ),
            (
                "length",
                Filters {
                    min_length: 10,
                    dedup: false,
                    near_dedup: None,
                    lines: LineFilters::default(),
                },
                4,
                FilterStats {
                    too_short: 1,
                    ..Default::default()
                },
            ),
            (
                "exact",
                Filters {
                    min_length: 10,
                    dedup: true,
                    near_dedup: None,
                    lines: LineFilters::default(),
                },
                3,
                FilterStats {
                    too_short: 1,
                    exact_duplicates: 1,
                    ..Default::default()
                },
            ),
            (
                "near",
                Filters {
                    min_length: 10,
                    dedup: true,
                    near_dedup: Some(0.8),
                    lines: LineFilters::default(),
                },
                2,
                FilterStats {
                    too_short: 1,
                    exact_duplicates: 1,
                    near_duplicates: 1,
                    ..Default::default()
                },
            ),
        ];
        for (name, filters, kept, stats) in cases {
            let (out, got) = filters.apply(docs());
            assert_eq!(out.len(), kept, "{name}");
            assert_eq!(got, stats, "{name}");
        }
    }

    #[test]
    fn copies_differing_only_in_line_endings_or_a_trailing_newline_are_exact_duplicates() {
        let filters = Filters {
            min_length: 0,
            dedup: true,
            near_dedup: None,
            lines: LineFilters::default(),
        };
        let docs = vec![
            doc("one\ntwo"),
            doc("one\ntwo\n"),
            doc("one\r\ntwo\r\n"),
            doc("one  \ntwo\n\n"),
            doc("one\n\ntwo"),
        ];
        let (kept, stats) = filters.apply(docs);
        assert_eq!(stats.exact_duplicates, 3);
        let texts: Vec<&str> = kept.iter().map(|d| d.text.as_str()).collect();
        assert_eq!(
            texts,
            ["one\ntwo", "one\n\ntwo"],
            "the first copy is kept as it was"
        );
    }

    #[test]
    fn line_filters_run_first_and_count_lines_and_emptied_documents() {
        let filters = Filters {
            min_length: 0,
            dedup: true,
            near_dedup: None,
            lines: LineFilters {
                min_words: 2,
                symbol_lines: true,
                boilerplate: true,
            },
        };
        let docs = vec![
            doc("Home | Shop | Cart\nA real sentence here.\n"),
            doc("A real sentence here.\n-----\n"),
            doc("=====\nOk\n"),
        ];
        let (kept, stats) = filters.apply(docs);
        assert_eq!(kept.len(), 1, "the second is a duplicate once cleaned");
        assert_eq!(kept[0].text, "A real sentence here.\n");
        let want = FilterStats {
            exact_duplicates: 1,
            short_lines: 1,
            symbol_lines: 2,
            boilerplate_lines: 1,
            emptied: 1,
            ..Default::default()
        };
        assert_eq!(stats, want);
        assert_eq!(
            stats.to_string(),
            "1 exact duplicates, 1 short lines, 2 symbol lines, 1 boilerplate lines, 1 emptied"
        );
    }

    #[test]
    fn minhash_estimates_jaccard_similarity() {
        // Two texts sharing the first half of their words: shingle Jaccard = 98/298 ≈ 0.33.
        let a = long_text(3);
        let b_words: Vec<String> = a
            .split(' ')
            .take(100)
            .map(str::to_string)
            .chain(long_text(4).split(' ').take(100).map(str::to_string))
            .collect();
        let b = b_words.join(" ");
        let estimate = estimated_jaccard(&minhash(&a), &minhash(&b));
        assert!(
            (estimate - 98.0 / 298.0).abs() < 0.12,
            "estimate {estimate}"
        );
        assert_eq!(estimated_jaccard(&minhash(&a), &minhash(&a)), 1.0);
        assert!(estimated_jaccard(&minhash(&a), &minhash(&long_text(5))) < 0.1);
    }

    #[test]
    fn banding_finds_pairs_at_the_threshold_without_comparing_everything() {
        for threshold in [0.5, 0.7, 0.8, 0.9, 0.95] {
            let (bands, rows) = banding(threshold);
            assert_eq!(bands * rows, NUM_HASHES);
            assert!(candidate_probability(threshold, bands, rows) >= CANDIDATE_RECALL);
            // Dissimilar pairs rarely become candidates.
            let far = candidate_probability(0.1, bands, rows);
            assert!(far < 0.5, "{threshold}: ({bands}, {rows}) gives {far}");
        }
    }
}
