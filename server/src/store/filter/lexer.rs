//! Splits a filter into tokens; positions are character offsets.

use super::{CmpOp, FilterError};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Keyword {
    And,
    Or,
    Not,
    Like,
    Ilike,
    In,
    Is,
    Null,
    Nan,
}

#[derive(Debug, Clone, PartialEq)]
pub(super) enum Tok {
    /// A field name, dots included, backquoted parts already unquoted.
    Ident(String),
    Keyword(Keyword),
    Number(f64),
    Str(String),
    Op(CmpOp),
    LParen,
    RParen,
    Comma,
    Eof,
}

#[derive(Debug, Clone, PartialEq)]
pub(super) struct Token {
    pub tok: Tok,
    pub pos: usize,
    /// The token as written (for error messages).
    pub text: String,
}

pub(super) fn is_key_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '/' | '.' | ':')
}

fn keyword(word: &str) -> Option<Keyword> {
    Some(match word.to_ascii_lowercase().as_str() {
        "and" => Keyword::And,
        "or" => Keyword::Or,
        "not" => Keyword::Not,
        "like" => Keyword::Like,
        "ilike" => Keyword::Ilike,
        "in" => Keyword::In,
        "is" => Keyword::Is,
        "null" => Keyword::Null,
        "nan" => Keyword::Nan,
        _ => return None,
    })
}

pub(super) fn tokenize(input: &str) -> Result<Vec<Token>, FilterError> {
    let chars: Vec<char> = input.chars().collect();
    let mut tokens = Vec::new();
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        let start = i;
        if c.is_whitespace() {
            i += 1;
            continue;
        }
        let tok = match c {
            '(' => {
                i += 1;
                Tok::LParen
            }
            ')' => {
                i += 1;
                Tok::RParen
            }
            ',' => {
                i += 1;
                Tok::Comma
            }
            '=' => {
                // `==` is accepted as a synonym.
                i += if chars.get(i + 1) == Some(&'=') { 2 } else { 1 };
                Tok::Op(CmpOp::Eq)
            }
            '!' => {
                if chars.get(i + 1) != Some(&'=') {
                    return Err(FilterError::new(
                        i,
                        "unexpected character `!`; did you mean `!=`?",
                    ));
                }
                i += 2;
                Tok::Op(CmpOp::Ne)
            }
            '<' => match chars.get(i + 1) {
                Some('=') => {
                    i += 2;
                    Tok::Op(CmpOp::Le)
                }
                Some('>') => {
                    i += 2;
                    Tok::Op(CmpOp::Ne)
                }
                _ => {
                    i += 1;
                    Tok::Op(CmpOp::Lt)
                }
            },
            '>' => {
                if chars.get(i + 1) == Some(&'=') {
                    i += 2;
                    Tok::Op(CmpOp::Ge)
                } else {
                    i += 1;
                    Tok::Op(CmpOp::Gt)
                }
            }
            '\'' | '"' => {
                let (s, next) = string(&chars, i)?;
                i = next;
                Tok::Str(s)
            }
            c if c.is_ascii_digit() || matches!(c, '-' | '+' | '.') => {
                let (n, next) = number(&chars, i)?;
                i = next;
                Tok::Number(n)
            }
            c if c.is_ascii_alphabetic() || c == '_' => {
                let (word, quoted, next) = ident(&chars, i)?;
                i = next;
                match keyword(&word).filter(|_| !quoted) {
                    Some(k) => Tok::Keyword(k),
                    None => Tok::Ident(word),
                }
            }
            '`' => {
                return Err(FilterError::new(
                    i,
                    "unexpected backquote: backquotes quote a key after a prefix, as in metrics.`my key`",
                ))
            }
            other => {
                return Err(FilterError::new(
                    i,
                    format!("unexpected character `{}`", other.escape_debug()),
                ))
            }
        };
        tokens.push(Token {
            tok,
            pos: start,
            text: chars[start..i].iter().collect(),
        });
    }
    tokens.push(Token {
        tok: Tok::Eof,
        pos: chars.len(),
        text: String::new(),
    });
    Ok(tokens)
}

/// Reads a field name; returns it, whether any part was backquoted, and the next index.
fn ident(chars: &[char], mut i: usize) -> Result<(String, bool, usize), FilterError> {
    let mut word = String::new();
    let mut quoted = false;
    while i < chars.len() {
        let c = chars[i];
        if is_key_char(c) {
            word.push(c);
            i += 1;
        } else if c == '`' && word.ends_with('.') {
            quoted = true;
            let open = i;
            i += 1;
            loop {
                match chars.get(i) {
                    None => {
                        return Err(FilterError::new(open, "unterminated backquoted key"));
                    }
                    Some('`') if chars.get(i + 1) == Some(&'`') => {
                        word.push('`');
                        i += 2;
                    }
                    Some('`') => {
                        i += 1;
                        break;
                    }
                    Some(&c) => {
                        reject_control(c, i)?;
                        word.push(c);
                        i += 1;
                    }
                }
            }
        } else {
            break;
        }
    }
    Ok((word, quoted, i))
}

fn reject_control(c: char, at: usize) -> Result<(), FilterError> {
    if c.is_control() && c != '\t' && c != '\n' {
        return Err(FilterError::new(
            at,
            format!("control character `{}` is not allowed", c.escape_debug()),
        ));
    }
    Ok(())
}

fn string(chars: &[char], open: usize) -> Result<(String, usize), FilterError> {
    let quote = chars[open];
    let mut out = String::new();
    let mut i = open + 1;
    loop {
        match chars.get(i) {
            None => {
                return Err(FilterError::new(
                    open,
                    format!("unterminated string: expected a closing {quote}"),
                ))
            }
            Some(&c) if c == quote => {
                if chars.get(i + 1) == Some(&quote) {
                    out.push(quote);
                    i += 2;
                } else {
                    return Ok((out, i + 1));
                }
            }
            Some('\\') => {
                match chars.get(i + 1) {
                    Some('\\') => out.push('\\'),
                    Some('\'') => out.push('\''),
                    Some('"') => out.push('"'),
                    Some('n') => out.push('\n'),
                    Some('t') => out.push('\t'),
                    Some('r') => out.push('\r'),
                    // Kept as written: LIKE patterns use `\%` and `\_`.
                    Some(&other) => {
                        reject_control(other, i + 1)?;
                        out.push('\\');
                        out.push(other);
                    }
                    None => {
                        return Err(FilterError::new(
                            open,
                            format!("unterminated string: expected a closing {quote}"),
                        ))
                    }
                }
                i += 2;
            }
            Some(&c) => {
                reject_control(c, i)?;
                out.push(c);
                i += 1;
            }
        }
    }
}

fn number(chars: &[char], start: usize) -> Result<(f64, usize), FilterError> {
    let mut i = start;
    if matches!(chars.get(i), Some('-' | '+')) {
        i += 1;
    }
    let mut digits = 0;
    while chars.get(i).is_some_and(|c| c.is_ascii_digit()) {
        i += 1;
        digits += 1;
    }
    if chars.get(i) == Some(&'.') {
        i += 1;
        while chars.get(i).is_some_and(|c| c.is_ascii_digit()) {
            i += 1;
            digits += 1;
        }
    }
    if digits == 0 {
        return Err(FilterError::new(
            start,
            format!("unexpected character `{}`", chars[start]),
        ));
    }
    if matches!(chars.get(i), Some('e' | 'E')) {
        i += 1;
        if matches!(chars.get(i), Some('-' | '+')) {
            i += 1;
        }
        let exp_start = i;
        while chars.get(i).is_some_and(|c| c.is_ascii_digit()) {
            i += 1;
        }
        if i == exp_start {
            return Err(FilterError::new(
                start,
                "malformed number: expected digits after the exponent `e`",
            ));
        }
    }
    if chars
        .get(i)
        .is_some_and(|&c| c.is_ascii_alphanumeric() || c == '_' || c == '.')
    {
        return Err(FilterError::new(
            i,
            format!(
                "unexpected character `{}` after a number (quote text values)",
                chars[i]
            ),
        ));
    }
    let text: String = chars[start..i].iter().collect();
    let value: f64 = text
        .parse()
        .map_err(|_| FilterError::new(start, format!("malformed number `{text}`")))?;
    if !value.is_finite() {
        return Err(FilterError::new(
            start,
            format!("number `{text}` is out of range"),
        ));
    }
    Ok((value, i))
}
