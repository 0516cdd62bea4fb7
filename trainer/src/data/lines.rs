//! Line-level cleaning (`data.line_filters`): web-text pipelines drop boilerplate lines inside
//! documents before judging the documents themselves. Three rules, each counted:
//!
//! - symbol lines: no letter or digit at all (`-----`, `* * *`, `|||`);
//! - boilerplate: a menu of three or more short items between separators (`Home | About |
//!   Contact`, `Docs » Guide » Install`), or a short line with a stock phrase ("Skip to
//!   content", "All rights reserved", "Enable JavaScript");
//! - short lines: fewer than `min_words` words.
//!
//! Blank lines are kept (they separate paragraphs); a line is counted under the first rule it
//! breaks, in the order above.

use crate::config::LineFilterConfig;

use super::FilterStats;

/// The enabled line rules.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct LineFilters {
    /// Lines with fewer words are dropped (0 = off).
    pub min_words: usize,
    pub symbol_lines: bool,
    pub boilerplate: bool,
}

/// Items of a navigation menu are at most this many words long.
const MENU_ITEM_WORDS: usize = 3;
/// Stock phrases only mark a line as boilerplate when the line is this short: a sentence that
/// mentions a privacy policy is text.
const PHRASE_LINE_WORDS: usize = 8;
/// Separators of menu items and breadcrumbs.
const MENU_SEPARATORS: &[char] = &['|', '»', '›', '·', '•'];
/// Phrases of page furniture, lower case.
const BOILERPLATE_PHRASES: &[&str] = &[
    "skip to content",
    "skip to main content",
    "all rights reserved",
    "privacy policy",
    "terms of use",
    "terms of service",
    "cookie policy",
    "we use cookies",
    "accept cookies",
    "enable javascript",
    "javascript is disabled",
    "back to top",
    "subscribe to our newsletter",
    "sign up for our newsletter",
    "click here",
    "read more",
    "share this",
    "log in",
    "sign in",
    "powered by",
    "©",
];

/// Why a line was dropped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dropped {
    Symbols,
    Boilerplate,
    Short,
}

impl LineFilters {
    pub fn from_config(cfg: &LineFilterConfig) -> Self {
        LineFilters {
            min_words: cfg.min_words,
            symbol_lines: cfg.symbol_lines,
            boilerplate: cfg.boilerplate,
        }
    }

    pub fn is_active(&self) -> bool {
        self.min_words > 0 || self.symbol_lines || self.boilerplate
    }

    /// Which rule drops `line` (without its line break), if any.
    pub fn judge(&self, line: &str) -> Option<Dropped> {
        let text = line.trim();
        if text.is_empty() {
            return None;
        }
        if self.symbol_lines && !text.chars().any(char::is_alphanumeric) {
            return Some(Dropped::Symbols);
        }
        if self.boilerplate && is_boilerplate(text) {
            return Some(Dropped::Boilerplate);
        }
        if self.min_words > 0 && text.split_whitespace().count() < self.min_words {
            return Some(Dropped::Short);
        }
        None
    }

    /// `text` without the lines the rules drop, counting each in `stats`. Where lines were
    /// dropped between blank lines, one blank line remains.
    pub fn clean(&self, text: &str, stats: &mut FilterStats) -> String {
        let mut out = String::with_capacity(text.len());
        let mut last_kept_blank = false;
        let mut dropped_since = false;
        for line in text.split_inclusive('\n') {
            let bare = line.trim_end_matches(['\n', '\r']);
            match self.judge(bare) {
                Some(why) => {
                    match why {
                        Dropped::Symbols => stats.symbol_lines += 1,
                        Dropped::Boilerplate => stats.boilerplate_lines += 1,
                        Dropped::Short => stats.short_lines += 1,
                    }
                    dropped_since = true;
                }
                None => {
                    let blank = bare.trim().is_empty();
                    if !(blank && last_kept_blank && dropped_since) {
                        out.push_str(line);
                        last_kept_blank = blank;
                    }
                    dropped_since = false;
                }
            }
        }
        out
    }
}

fn is_boilerplate(text: &str) -> bool {
    let items: Vec<&str> = text
        .split(MENU_SEPARATORS)
        .flat_map(|part| part.split(" > "))
        .map(str::trim)
        .filter(|item| !item.is_empty())
        .collect();
    let separated = text.contains(MENU_SEPARATORS) || text.contains(" > ");
    if separated
        && items.len() >= 3
        && items
            .iter()
            .all(|item| item.split_whitespace().count() <= MENU_ITEM_WORDS)
    {
        return true;
    }
    if text.split_whitespace().count() > PHRASE_LINE_WORDS {
        return false;
    }
    let lower = text.to_lowercase();
    BOILERPLATE_PHRASES.iter().any(|p| lower.contains(p))
}

/// The text exact deduplication compares: line breaks as `\n`, no trailing spaces on a line, no
/// blank lines at the start or end. Two copies of a document that differ only there (a trailing
/// newline, Windows line endings) are the same document.
pub fn dedup_form(text: &str) -> String {
    let lines: Vec<&str> = text.lines().map(str::trim_end).collect();
    lines.join("\n").trim_matches('\n').to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn all() -> LineFilters {
        LineFilters {
            min_words: 3,
            symbol_lines: true,
            boilerplate: true,
        }
    }

    #[test]
    fn each_line_rule_drops_its_kind_of_line_and_keeps_text() {
        let cases = [
            ("-----", Some(Dropped::Symbols)),
            ("* * * * *", Some(Dropped::Symbols)),
            ("|||", Some(Dropped::Symbols)),
            (
                "Home | About us | Blog | Contact",
                Some(Dropped::Boilerplate),
            ),
            ("Docs » Guide » Install", Some(Dropped::Boilerplate)),
            ("Home > Products > Shoes", Some(Dropped::Boilerplate)),
            ("Skip to main content", Some(Dropped::Boilerplate)),
            (
                "© 2024 Example Ltd. All rights reserved.",
                Some(Dropped::Boilerplate),
            ),
            (
                "Please enable JavaScript to view the comments.",
                Some(Dropped::Boilerplate),
            ),
            ("Chapter 1", Some(Dropped::Short)),
            ("12 likes", Some(Dropped::Short)),
            ("", None),
            ("   ", None),
            ("The fox jumps over the dog.", None),
            (
                "Read the privacy policy of the museum before you plan a long visit there.",
                None,
            ),
            (
                "It costs 3 | 4 of the budget, which was a lot for a school of that size.",
                None,
            ),
        ];
        for (line, want) in cases {
            assert_eq!(all().judge(line), want, "{line:?}");
        }
        let off = LineFilters::default();
        assert!(!off.is_active());
        assert_eq!(off.judge("-----"), None);
    }

    #[test]
    fn cleaning_counts_what_it_drops_and_leaves_one_blank_line_where_lines_went() {
        let text = "Home | News | Sport\r\nThe first paragraph has words.\n\n=====\n\nThe second one too.\nOk\n";
        let mut stats = FilterStats::default();
        let cleaned = all().clean(text, &mut stats);
        assert_eq!(
            cleaned,
            "The first paragraph has words.\n\nThe second one too.\n"
        );
        assert_eq!(
            (
                stats.boilerplate_lines,
                stats.symbol_lines,
                stats.short_lines
            ),
            (1, 1, 1)
        );
    }

    #[test]
    fn the_dedup_form_ignores_line_endings_trailing_spaces_and_outer_blank_lines() {
        let base = "First line\n  indented\n\nlast";
        for variant in [
            "First line\n  indented\n\nlast\n",
            "First line\r\n  indented\r\n\r\nlast\r\n",
            "\n\nFirst line  \n  indented\t\n\nlast\n\n\n",
        ] {
            assert_eq!(dedup_form(variant), dedup_form(base), "{variant:?}");
        }
        assert_ne!(dedup_form("First line\nlast"), dedup_form(base));
        assert_ne!(
            dedup_form("first line\n  indented\n\nlast"),
            dedup_form(base)
        );
    }
}
