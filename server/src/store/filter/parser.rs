//! Recursive-descent parser and validation.
//!
//! ```text
//! filter     := or EOF
//! or         := and (OR and)*
//! and        := unary (AND unary)*
//! unary      := NOT unary | '(' or ')' | condition
//! condition  := field ( op literal | [NOT] (LIKE|ILIKE) string
//!                     | [NOT] IN '(' literal (',' literal)* ')' | IS [NOT] NULL
//!                     | IS [NOT] NAN )           (NAN: metrics only)
//! ```

use super::lexer::{Keyword, Tok, Token};
use super::{
    Attribute, CmpOp, Condition, Expr, Field, FilterError, LikePart, Literal, Predicate, RunStatus,
    MAX_CONDITIONS, MAX_DEPTH, MAX_IN_VALUES,
};

const CONDITION_HELP: &str = "a field such as `metrics.loss`, `(` or NOT";

const FIELD_HELP: &str = "expected metrics.<key>, params.<key>, tags.<key> or one of status, name, experiment_id, run_id, created_at, started_at, ended_at, user";

pub(super) fn parse(tokens: &[Token]) -> Result<Expr, FilterError> {
    let mut p = Parser {
        tokens,
        at: 0,
        depth: 0,
        conditions: 0,
    };
    if p.peek().tok == Tok::Eof {
        return Err(FilterError::new(
            0,
            "expected a condition such as `metrics.loss < 2`, found an empty filter",
        ));
    }
    let expr = p.or()?;
    let next = p.peek();
    if next.tok != Tok::Eof {
        return Err(FilterError::new(
            next.pos,
            format!(
                "expected AND, OR or the end of the filter, found {}",
                describe(next)
            ),
        ));
    }
    Ok(expr)
}

struct Parser<'t> {
    tokens: &'t [Token],
    at: usize,
    depth: usize,
    conditions: usize,
}

fn describe(t: &Token) -> String {
    match t.tok {
        Tok::Eof => "the end of the filter".to_string(),
        _ => format!("`{}`", t.text),
    }
}

impl<'t> Parser<'t> {
    fn peek(&self) -> &'t Token {
        // The token list always ends with Eof, and `bump` never moves past it.
        &self.tokens[self.at.min(self.tokens.len() - 1)]
    }

    fn bump(&mut self) -> &'t Token {
        let t = self.peek();
        if t.tok != Tok::Eof {
            self.at += 1;
        }
        t
    }

    fn eat_keyword(&mut self, k: Keyword) -> bool {
        if self.peek().tok == Tok::Keyword(k) {
            self.bump();
            true
        } else {
            false
        }
    }

    fn or(&mut self) -> Result<Expr, FilterError> {
        let mut left = self.and()?;
        while self.eat_keyword(Keyword::Or) {
            let right = self.and()?;
            left = Expr::Or(Box::new(left), Box::new(right));
        }
        Ok(left)
    }

    fn and(&mut self) -> Result<Expr, FilterError> {
        let mut left = self.unary()?;
        while self.eat_keyword(Keyword::And) {
            let right = self.unary()?;
            left = Expr::And(Box::new(left), Box::new(right));
        }
        Ok(left)
    }

    fn unary(&mut self) -> Result<Expr, FilterError> {
        let t = self.peek();
        self.depth += 1;
        if self.depth > MAX_DEPTH {
            return Err(FilterError::new(
                t.pos,
                format!("filter nests too deeply (at most {MAX_DEPTH} levels)"),
            ));
        }
        let expr = match &t.tok {
            Tok::Keyword(Keyword::Not) => {
                self.bump();
                Expr::Not(Box::new(self.unary()?))
            }
            Tok::LParen => {
                self.bump();
                let inner = self.or()?;
                let close = self.peek();
                if close.tok != Tok::RParen {
                    return Err(FilterError::new(
                        close.pos,
                        format!(
                            "expected `)` to close the `(` at position {}, found {}",
                            t.pos,
                            describe(close)
                        ),
                    ));
                }
                self.bump();
                inner
            }
            Tok::Ident(_) => Expr::Cond(self.condition()?),
            _ => {
                let found = describe(t);
                let message = format!("expected a condition ({CONDITION_HELP}), found {found}");
                return Err(FilterError::new(t.pos, message));
            }
        };
        self.depth -= 1;
        Ok(expr)
    }

    fn condition(&mut self) -> Result<Condition, FilterError> {
        let name_tok = self.bump();
        self.conditions += 1;
        if self.conditions > MAX_CONDITIONS {
            return Err(FilterError::new(
                name_tok.pos,
                format!("filter has too many conditions (at most {MAX_CONDITIONS})"),
            ));
        }
        let field = field(name_tok)?;
        let op_tok = self.bump();
        let predicate = match &op_tok.tok {
            Tok::Op(op) => {
                let (value, at) = self.literal(op_tok)?;
                let value = check_compare(&field, *op, value, op_tok, at)?;
                Predicate::Compare { op: *op, value }
            }
            Tok::Keyword(Keyword::Is) => {
                let negated = self.eat_keyword(Keyword::Not);
                if self.eat_keyword(Keyword::Nan) {
                    if !matches!(field, Field::Metric(_)) {
                        return Err(FilterError::new(
                            op_tok.pos,
                            format!("IS NAN tests a metric, not {}", name_tok.text),
                        ));
                    }
                    Predicate::IsNan { negated }
                } else if self.eat_keyword(Keyword::Null) {
                    Predicate::IsNull { negated }
                } else {
                    let t = self.peek();
                    return Err(FilterError::new(
                        t.pos,
                        format!("expected NULL or NAN after IS, found {}", describe(t)),
                    ));
                }
            }
            Tok::Keyword(Keyword::Not) => {
                let next = self.bump();
                self.like_or_in(&field, next, true)?
            }
            Tok::Keyword(Keyword::Like | Keyword::Ilike | Keyword::In) => {
                self.like_or_in(&field, op_tok, false)?
            }
            _ => {
                return Err(FilterError::new(
                    op_tok.pos,
                    format!(
                        "expected an operator (=, !=, <, <=, >, >=, LIKE, ILIKE, IN, IS) after `{}`, found {}",
                        name_tok.text,
                        describe(op_tok)
                    ),
                ))
            }
        };
        Ok(Condition { field, predicate })
    }

    /// Reads the literal after `after`; returns it with its position.
    fn literal(&mut self, after: &Token) -> Result<(Literal, usize), FilterError> {
        let t = self.bump();
        match &t.tok {
            Tok::Number(n) => Ok((Literal::Number(*n), t.pos)),
            Tok::Str(s) => Ok((Literal::Text(s.clone()), t.pos)),
            _ => Err(FilterError::new(
                t.pos,
                format!(
                    "expected a value (a number or a quoted string) after `{}`, found {}",
                    after.text,
                    describe(t)
                ),
            )),
        }
    }

    fn like_or_in(
        &mut self,
        field: &Field,
        op_tok: &Token,
        negated: bool,
    ) -> Result<Predicate, FilterError> {
        match op_tok.tok {
            Tok::Keyword(k @ (Keyword::Like | Keyword::Ilike)) => {
                if matches!(field, Field::Metric(_)) || is_numeric_attr(field) {
                    return Err(FilterError::new(
                        op_tok.pos,
                        format!(
                            "{} applies to text, but {} is numeric",
                            op_tok.text.to_uppercase(),
                            field_name(field)
                        ),
                    ));
                }
                let t = self.bump();
                let Tok::Str(s) = &t.tok else {
                    return Err(FilterError::new(
                        t.pos,
                        format!(
                            "expected a quoted pattern after `{}`, found {}",
                            op_tok.text,
                            describe(t)
                        ),
                    ));
                };
                Ok(Predicate::Like {
                    pattern: like_pattern(s, t.pos)?,
                    case_insensitive: k == Keyword::Ilike,
                    negated,
                })
            }
            Tok::Keyword(Keyword::In) => {
                let open = self.bump();
                if open.tok != Tok::LParen {
                    return Err(FilterError::new(
                        open.pos,
                        format!("expected `(` after IN, found {}", describe(open)),
                    ));
                }
                let mut values = Vec::new();
                let mut after = open;
                loop {
                    let (value, at) = self.literal(after)?;
                    let value = check_compare(field, CmpOp::Eq, value, op_tok, at)?;
                    if let Some(first) = values.first() {
                        if std::mem::discriminant(first) != std::mem::discriminant(&value) {
                            return Err(FilterError::new(
                                at,
                                "IN list mixes numbers and strings: use one kind",
                            ));
                        }
                    }
                    values.push(value);
                    if values.len() > MAX_IN_VALUES {
                        return Err(FilterError::new(
                            at,
                            format!("IN list is too long (at most {MAX_IN_VALUES} values)"),
                        ));
                    }
                    let sep = self.bump();
                    match sep.tok {
                        Tok::Comma => after = sep,
                        Tok::RParen => break,
                        _ => {
                            return Err(FilterError::new(
                                sep.pos,
                                format!(
                                    "expected `,` or `)` in the IN list, found {}",
                                    describe(sep)
                                ),
                            ))
                        }
                    }
                }
                Ok(Predicate::In { values, negated })
            }
            _ => Err(FilterError::new(
                op_tok.pos,
                format!(
                    "expected LIKE, ILIKE or IN after NOT, found {}",
                    describe(op_tok)
                ),
            )),
        }
    }
}

fn is_numeric_attr(field: &Field) -> bool {
    matches!(field, Field::Attribute(a) if a.is_numeric())
}

fn field_name(field: &Field) -> String {
    match field {
        Field::Metric(k) => format!("metrics.{k}"),
        Field::Param(k) => format!("params.{k}"),
        Field::Tag(k) => format!("tags.{k}"),
        Field::Attribute(a) => a.as_str().to_string(),
    }
}

fn field(t: &Token) -> Result<Field, FilterError> {
    let Tok::Ident(name) = &t.tok else {
        return Err(FilterError::new(t.pos, FIELD_HELP));
    };
    if let Some((prefix, key)) = name.split_once('.') {
        let make: fn(String) -> Field = match prefix.to_ascii_lowercase().as_str() {
            "metrics" | "metric" => Field::Metric,
            "params" | "param" => Field::Param,
            "tags" | "tag" => Field::Tag,
            "attributes" | "attribute" => {
                return attribute(key, t.pos + prefix.chars().count() + 1)
            }
            _ => {
                return Err(FilterError::new(
                    t.pos,
                    format!("unknown field `{name}`: {FIELD_HELP}"),
                ))
            }
        };
        if key.is_empty() {
            return Err(FilterError::new(
                t.pos + prefix.chars().count() + 1,
                format!("expected a key after `{prefix}.`"),
            ));
        }
        return Ok(make(key.to_string()));
    }
    match name.to_ascii_lowercase().as_str() {
        "metrics" | "metric" | "params" | "param" | "tags" | "tag" => Err(FilterError::new(
            t.pos + name.chars().count(),
            format!("expected `.` and a key after `{name}`"),
        )),
        _ => attribute(name, t.pos),
    }
}

fn attribute(name: &str, pos: usize) -> Result<Field, FilterError> {
    let lower = name.to_ascii_lowercase();
    Attribute::ALL
        .into_iter()
        .find(|a| a.as_str() == lower)
        .map(Field::Attribute)
        .ok_or_else(|| FilterError::new(pos, format!("unknown field `{name}`: {FIELD_HELP}")))
}

/// Checks that a literal suits the field and operator (also used for each IN value); returns
/// it normalized (statuses lowercased).
fn check_compare(
    field: &Field,
    op: CmpOp,
    value: Literal,
    op_tok: &Token,
    at: usize,
) -> Result<Literal, FilterError> {
    let name = field_name(field);
    let numeric = matches!(field, Field::Metric(_)) || is_numeric_attr(field);
    match &value {
        Literal::Text(_) if numeric => Err(FilterError::new(
            at,
            format!("{name} is numeric: expected a number, found a string"),
        )),
        Literal::Number(_) if matches!(field, Field::Tag(_)) => Err(FilterError::new(
            at,
            format!("tag values are text: quote the value to compare {name}"),
        )),
        Literal::Number(_)
            if matches!(
                field,
                Field::Attribute(
                    Attribute::Name
                        | Attribute::RunId
                        | Attribute::ExperimentId
                        | Attribute::Status
                        | Attribute::User
                )
            ) =>
        {
            Err(FilterError::new(
                at,
                format!("{name} is text: quote the value"),
            ))
        }
        Literal::Text(s) if *field == Field::Attribute(Attribute::Status) => {
            if op.is_ordering() {
                return Err(FilterError::new(
                    op_tok.pos,
                    "status can only be compared with =, !=, IN or LIKE",
                ));
            }
            let status: RunStatus = s
                .to_ascii_lowercase()
                .parse()
                .map_err(|e| FilterError::new(at, e))?;
            Ok(Literal::Text(status.as_str().to_string()))
        }
        _ => Ok(value),
    }
}

/// Splits a LIKE pattern into wildcards and literal characters (`\` escapes the next one).
fn like_pattern(s: &str, at: usize) -> Result<Vec<LikePart>, FilterError> {
    let mut parts = Vec::new();
    let mut chars = s.chars();
    while let Some(c) = chars.next() {
        parts.push(match c {
            '%' => LikePart::Any,
            '_' => LikePart::One,
            '\\' => match chars.next() {
                Some(escaped) => LikePart::Char(escaped),
                None => return Err(FilterError::new(
                    at,
                    "LIKE pattern ends with a lone `\\`: write `\\\\\\\\` for a literal backslash",
                )),
            },
            other => LikePart::Char(other),
        });
    }
    Ok(parts)
}
