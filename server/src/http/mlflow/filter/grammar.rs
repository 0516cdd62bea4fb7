//! MLflow's filter grammar: tokens and clauses (the grammar is in the parent module's comment).

use crate::store::filter::Literal;

use super::super::MlflowError;

#[derive(Debug, Clone, PartialEq)]
pub(super) enum Tok {
    Ident(String),
    /// A name in backquotes or double quotes (after a prefix and a dot).
    Quoted(String),
    Str(String),
    Num(f64),
    Op(&'static str),
    Dot,
    LParen,
    RParen,
    Comma,
}

pub(super) fn invalid(message: impl std::fmt::Display) -> MlflowError {
    MlflowError::invalid("filter", message)
}

pub(super) fn tokenize(input: &str) -> Result<Vec<Tok>, MlflowError> {
    let chars: Vec<char> = input.chars().collect();
    let mut out = Vec::new();
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        match c {
            c if c.is_whitespace() => i += 1,
            '(' | ')' | ',' | '.' => {
                out.push(match c {
                    '(' => Tok::LParen,
                    ')' => Tok::RParen,
                    ',' => Tok::Comma,
                    _ => Tok::Dot,
                });
                i += 1;
            }
            '\'' | '"' | '`' => {
                let mut text = String::new();
                i += 1;
                loop {
                    match chars.get(i) {
                        None => return Err(invalid(format!("a {c} quote is not closed"))),
                        Some(&q) if q == c && chars.get(i + 1) == Some(&c) => {
                            text.push(c);
                            i += 2;
                        }
                        Some(&q) if q == c => {
                            i += 1;
                            break;
                        }
                        Some('\\') if c == '\'' && chars.get(i + 1) == Some(&'\'') => {
                            text.push('\'');
                            i += 2;
                        }
                        Some(&other) => {
                            text.push(other);
                            i += 1;
                        }
                    }
                }
                // Double quotes name a key after `prefix.`, and are a string elsewhere.
                let names_key = out.last() == Some(&Tok::Dot);
                out.push(if c == '`' || (c == '"' && names_key) {
                    Tok::Quoted(text)
                } else {
                    Tok::Str(text)
                });
            }
            '=' => {
                out.push(Tok::Op("="));
                i += 1;
            }
            '!' | '<' | '>' => {
                let next = chars.get(i + 1).copied();
                let (op, len) = match (c, next) {
                    ('!', Some('=')) => ("!=", 2),
                    ('<', Some('>')) => ("!=", 2),
                    ('<', Some('=')) => ("<=", 2),
                    ('>', Some('=')) => (">=", 2),
                    ('<', _) => ("<", 1),
                    ('>', _) => (">", 1),
                    _ => return Err(invalid("`!` must be followed by `=`")),
                };
                out.push(Tok::Op(op));
                i += len;
            }
            c if c.is_ascii_digit()
                || (c == '-'
                    && chars
                        .get(i + 1)
                        .is_some_and(|d| d.is_ascii_digit() || *d == '.')) =>
            {
                let start = i;
                i += 1;
                while i < chars.len()
                    && (chars[i].is_ascii_digit()
                        || matches!(chars[i], '.' | 'e' | 'E')
                        || (matches!(chars[i], '-' | '+') && matches!(chars[i - 1], 'e' | 'E')))
                {
                    i += 1;
                }
                let text: String = chars[start..i].iter().collect();
                let n = text
                    .parse::<f64>()
                    .ok()
                    .filter(|n| n.is_finite())
                    .ok_or_else(|| invalid(format!("`{text}` is not a number")))?;
                out.push(Tok::Num(n));
            }
            c if c.is_alphabetic() || c == '_' => {
                // A bare key may hold the characters metric names use (`train/loss`).
                let start = i;
                while i < chars.len()
                    && (chars[i].is_alphanumeric() || matches!(chars[i], '_' | '-' | '/' | ':'))
                {
                    i += 1;
                }
                out.push(Tok::Ident(chars[start..i].iter().collect()));
            }
            other => return Err(invalid(format!("unexpected character `{other}`"))),
        }
    }
    Ok(out)
}

/// What a clause names.
#[derive(Debug, Clone, PartialEq)]
pub(super) enum Ident {
    Metric(String),
    Param(String),
    Tag(String),
    Attribute(String),
}

#[derive(Debug, Clone, PartialEq)]
pub(super) enum Test {
    Cmp(&'static str, Literal),
    Like {
        pattern: String,
        ci: bool,
        negated: bool,
    },
    In {
        values: Vec<Literal>,
        negated: bool,
    },
    Null {
        negated: bool,
    },
    /// `metrics.<key> IS [NOT] NAN` (Trainyard's; MLflow has no NaN test).
    Nan {
        negated: bool,
    },
}

#[derive(Debug, Clone, PartialEq)]
pub(super) struct Clause {
    pub(super) ident: Ident,
    pub(super) test: Test,
}

pub(super) struct Parser {
    pub(super) toks: Vec<Tok>,
    pub(super) at: usize,
}

impl Parser {
    pub(super) fn peek(&self) -> Option<&Tok> {
        self.toks.get(self.at)
    }

    fn next(&mut self) -> Option<Tok> {
        let t = self.toks.get(self.at).cloned();
        self.at += 1;
        t
    }

    fn keyword(&mut self, word: &str) -> bool {
        match self.peek() {
            Some(Tok::Ident(w)) if w.eq_ignore_ascii_case(word) => {
                self.at += 1;
                true
            }
            _ => false,
        }
    }

    fn clauses(&mut self) -> Result<Vec<Clause>, MlflowError> {
        let mut out = vec![self.clause()?];
        while self.peek().is_some() {
            if self.keyword("and") {
                out.push(self.clause()?);
            } else if self.keyword("or") {
                return Err(invalid(
                    "MLflow's filter grammar has no OR; join conditions with AND (Trainyard's \
                     own search, GET /api/v1/runs?q=..., has OR)",
                ));
            } else {
                return Err(invalid(format!(
                    "expected AND, found {}",
                    describe(self.peek())
                )));
            }
        }
        Ok(out)
    }

    pub(super) fn ident(&mut self) -> Result<Ident, MlflowError> {
        let first = match self.next() {
            Some(Tok::Ident(w)) => w,
            Some(Tok::Quoted(w)) => return Ok(Ident::Attribute(w)),
            other => {
                return Err(invalid(format!(
                    "expected a name such as metrics.loss, found {}",
                    describe(other.as_ref())
                )))
            }
        };
        if self.peek() != Some(&Tok::Dot) {
            return Ok(Ident::Attribute(first));
        }
        self.at += 1;
        // The key: quoted, or bare words joined by dots (`tags.mlflow.source.type`).
        let key = match self.next() {
            Some(Tok::Quoted(k)) => k,
            Some(Tok::Ident(mut k)) => {
                while self.peek() == Some(&Tok::Dot) {
                    self.at += 1;
                    match self.next() {
                        Some(Tok::Ident(more)) => {
                            k.push('.');
                            k.push_str(&more);
                        }
                        other => {
                            return Err(invalid(format!(
                                "expected the rest of the key after `{k}.`, found {}",
                                describe(other.as_ref())
                            )))
                        }
                    }
                }
                k
            }
            other => {
                return Err(invalid(format!(
                    "expected a key after `{first}.`, found {}",
                    describe(other.as_ref())
                )))
            }
        };
        Ok(match first.to_ascii_lowercase().as_str() {
            "metric" | "metrics" => Ident::Metric(key),
            "param" | "params" | "parameter" | "parameters" => Ident::Param(key),
            "tag" | "tags" => Ident::Tag(key),
            "attribute" | "attributes" | "attr" | "run" => Ident::Attribute(key),
            other => {
                return Err(invalid(format!(
                    "`{other}` is not one of metrics, params, tags or attributes"
                )))
            }
        })
    }

    fn value(&mut self) -> Result<Literal, MlflowError> {
        match self.next() {
            Some(Tok::Str(s)) => Ok(Literal::Text(s)),
            Some(Tok::Num(n)) => Ok(Literal::Number(n)),
            other => Err(invalid(format!(
                "expected a value ('text' or a number), found {}",
                describe(other.as_ref())
            ))),
        }
    }

    fn clause(&mut self) -> Result<Clause, MlflowError> {
        let ident = self.ident()?;
        let negated = self.keyword("not");
        let test = if self.keyword("like") || self.keyword("ilike") {
            let ci =
                matches!(&self.toks[self.at - 1], Tok::Ident(w) if w.eq_ignore_ascii_case("ilike"));
            match self.next() {
                Some(Tok::Str(pattern)) => Test::Like {
                    pattern,
                    ci,
                    negated,
                },
                other => {
                    return Err(invalid(format!(
                        "LIKE needs a quoted pattern, found {}",
                        describe(other.as_ref())
                    )))
                }
            }
        } else if self.keyword("in") {
            if self.next() != Some(Tok::LParen) {
                return Err(invalid("IN needs a list in parentheses: IN ('a', 'b')"));
            }
            let mut values = vec![self.value()?];
            loop {
                match self.next() {
                    Some(Tok::Comma) => values.push(self.value()?),
                    Some(Tok::RParen) => break,
                    other => {
                        return Err(invalid(format!(
                            "expected `,` or `)` in the IN list, found {}",
                            describe(other.as_ref())
                        )))
                    }
                }
            }
            Test::In { values, negated }
        } else if !negated && self.keyword("is") {
            let negated = self.keyword("not");
            if self.keyword("nan") {
                Test::Nan { negated }
            } else if self.keyword("null") {
                Test::Null { negated }
            } else {
                return Err(invalid(
                    "IS must be followed by NULL, NOT NULL, NAN or NOT NAN",
                ));
            }
        } else if negated {
            return Err(invalid("NOT must be followed by LIKE, ILIKE or IN"));
        } else {
            match self.next() {
                Some(Tok::Op(op)) => Test::Cmp(op, self.value()?),
                other => {
                    return Err(invalid(format!(
                        "expected a comparison (=, !=, <, <=, >, >=, LIKE, ILIKE, IN), found {}",
                        describe(other.as_ref())
                    )))
                }
            }
        };
        Ok(Clause { ident, test })
    }
}

pub(super) fn describe(t: Option<&Tok>) -> String {
    match t {
        None => "the end of the filter".into(),
        Some(Tok::Ident(w)) => format!("`{w}`"),
        Some(Tok::Quoted(w)) => format!("`{w}`"),
        Some(Tok::Str(s)) => format!("'{s}'"),
        Some(Tok::Num(n)) => format!("{n}"),
        Some(Tok::Op(o)) => format!("`{o}`"),
        Some(Tok::Dot) => "`.`".into(),
        Some(Tok::LParen) => "`(`".into(),
        Some(Tok::RParen) => "`)`".into(),
        Some(Tok::Comma) => "`,`".into(),
    }
}

pub(super) fn parse(input: &str) -> Result<Vec<Clause>, MlflowError> {
    if input.chars().count() > crate::store::filter::MAX_FILTER_CHARS {
        return Err(invalid("the filter is too long"));
    }
    let toks = tokenize(input)?;
    if toks.is_empty() {
        return Ok(Vec::new());
    }
    Parser { toks, at: 0 }.clauses()
}
