//! The run-search language (`GET /api/v1/runs?q=...`), MLflow-search style:
//!
//! ```text
//! metrics.val/loss < 2.5 and params.training.learning_rate = 0.001
//! tags.team = 'nlp' or status != 'failed'
//! name LIKE 'gpt%'
//! params.model.activation IN ('gelu', 'swiglu')
//! not (metrics.train/loss >= 3)
//! metrics.`my key` > 1
//! tags.owner IS NULL
//! ```
//!
//! A filter is parsed once ([`Filter::parse`]) and rendered per backend as one boolean SQL
//! condition on the alias `r` (the `runs` table), with every user value bound as a parameter.
//!
//! Semantics (identical on SQLite and Postgres; the backend tests check both):
//! - `metrics.<key>` is the latest value of the key and compares with numbers only.
//! - `params.<key>` compares as text against a quoted literal and numerically (the stored
//!   `num` column) against a number; a numeric comparison never matches a non-numeric value.
//! - `tags.<key>`, `name`, `run_id`, `experiment_id` are text; `status` takes a valid status
//!   (case-insensitive); `created_at`, `started_at`, `ended_at` are unix milliseconds.
//! - A condition on a key the run does not have is false, whatever the operator (`!=` and
//!   `NOT IN` included), as in MLflow; `IS NULL` / `IS NOT NULL` test presence.
//! - Text order is code-point order on both backends (Postgres compares with `COLLATE "C"`).
//! - `LIKE` is case-sensitive and `ILIKE` case-insensitive on both backends: `%` matches any
//!   run of characters, `_` one character, `\` makes the next character literal. SQLite's own
//!   `LIKE` ignores ASCII case, so patterns are rendered there as equivalent `GLOB` patterns.
//!   Non-ASCII case folding for `ILIKE` uses Unicode simple case mapping on SQLite and the
//!   database's locale on Postgres.
//! - Keywords are case-insensitive. Keys may contain ASCII letters, digits and `_ - / . :`;
//!   any other key is written in backquotes (`` metrics.`my key` ``, a backquote doubled).
//! - Strings take single or double quotes; `\\`, `\'`, `\"`, `\n`, `\t`, `\r` are escapes,
//!   a doubled quote is a quote, and any other backslash pair is kept as written (so LIKE
//!   patterns can say `\%`).

use std::fmt;

mod lexer;
mod parser;
mod render;
#[cfg(test)]
mod tests;

pub use trainer::wire::RunStatus;

/// Longest filter accepted, in characters.
pub const MAX_FILTER_CHARS: usize = 10_000;
/// Deepest nesting of parentheses and `not` accepted.
pub const MAX_DEPTH: usize = 32;
/// Most conditions one filter may hold (keeps the SQL and its bound parameters bounded).
pub const MAX_CONDITIONS: usize = 100;
/// Most values one `IN (...)` list may hold.
pub const MAX_IN_VALUES: usize = 1_000;

/// A parsed run filter.
#[derive(Debug, Clone, PartialEq)]
pub struct Filter {
    expr: Expr,
}

/// A filter that could not be parsed: `position` is a 0-based character offset into the input.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FilterError {
    pub position: usize,
    pub message: String,
}

impl fmt::Display for FilterError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} at position {}", self.message, self.position)
    }
}

impl std::error::Error for FilterError {}

impl FilterError {
    pub(crate) fn new(position: usize, message: impl Into<String>) -> Self {
        FilterError {
            position,
            message: message.into(),
        }
    }
}

/// The boolean structure of a filter.
#[derive(Debug, Clone, PartialEq)]
pub enum Expr {
    And(Box<Expr>, Box<Expr>),
    Or(Box<Expr>, Box<Expr>),
    Not(Box<Expr>),
    Cond(Condition),
}

/// One test on one field of a run.
#[derive(Debug, Clone, PartialEq)]
pub struct Condition {
    pub field: Field,
    pub predicate: Predicate,
}

/// What a condition looks at.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Field {
    /// Latest value of a metric key.
    Metric(String),
    Param(String),
    Tag(String),
    Attribute(Attribute),
}

/// A column of the run itself.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Attribute {
    Status,
    Name,
    ExperimentId,
    RunId,
    CreatedAt,
    StartedAt,
    EndedAt,
    /// The name of the user who created the run (`user = alice`).
    User,
}

impl Attribute {
    pub const ALL: [Attribute; 8] = [
        Attribute::Status,
        Attribute::Name,
        Attribute::ExperimentId,
        Attribute::RunId,
        Attribute::CreatedAt,
        Attribute::StartedAt,
        Attribute::EndedAt,
        Attribute::User,
    ];

    /// The name a filter uses.
    pub fn as_str(self) -> &'static str {
        match self {
            Attribute::Status => "status",
            Attribute::Name => "name",
            Attribute::ExperimentId => "experiment_id",
            Attribute::RunId => "run_id",
            Attribute::CreatedAt => "created_at",
            Attribute::StartedAt => "started_at",
            Attribute::EndedAt => "ended_at",
            Attribute::User => "user",
        }
    }

    /// Timestamps compare with numbers; the rest with strings.
    pub fn is_numeric(self) -> bool {
        matches!(
            self,
            Attribute::CreatedAt | Attribute::StartedAt | Attribute::EndedAt
        )
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CmpOp {
    Eq,
    Ne,
    Lt,
    Le,
    Gt,
    Ge,
}

impl CmpOp {
    pub fn as_sql(self) -> &'static str {
        match self {
            CmpOp::Eq => "=",
            CmpOp::Ne => "<>",
            CmpOp::Lt => "<",
            CmpOp::Le => "<=",
            CmpOp::Gt => ">",
            CmpOp::Ge => ">=",
        }
    }

    fn is_ordering(self) -> bool {
        !matches!(self, CmpOp::Eq | CmpOp::Ne)
    }
}

/// A literal value of a filter (numbers are always finite).
#[derive(Debug, Clone, PartialEq)]
pub enum Literal {
    Number(f64),
    Text(String),
}

/// One piece of a LIKE pattern.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LikePart {
    /// `%`: any run of characters.
    Any,
    /// `_`: exactly one character.
    One,
    Char(char),
}

#[derive(Debug, Clone, PartialEq)]
pub enum Predicate {
    Compare {
        op: CmpOp,
        value: Literal,
    },
    Like {
        pattern: Vec<LikePart>,
        case_insensitive: bool,
        negated: bool,
    },
    /// Values are all numbers or all strings.
    In {
        values: Vec<Literal>,
        negated: bool,
    },
    /// `IS NULL` (`negated: false`): the run has no such key / the column is null.
    IsNull {
        negated: bool,
    },
    /// `metrics.<key> IS NAN` (`negated: false`): the run logged a NaN point of the key;
    /// `IS NOT NAN`: it has the key and none of its points is NaN. Metrics only.
    IsNan {
        negated: bool,
    },
}

impl Filter {
    /// Parses and validates a filter.
    pub fn parse(input: &str) -> Result<Filter, FilterError> {
        let char_count = input.chars().count();
        if char_count > MAX_FILTER_CHARS {
            return Err(FilterError::new(
                MAX_FILTER_CHARS,
                format!("filter is too long ({char_count} characters; at most {MAX_FILTER_CHARS})"),
            ));
        }
        let tokens = lexer::tokenize(input)?;
        let expr = parser::parse(&tokens)?;
        Ok(Filter { expr })
    }

    /// A filter built from an expression (another grammar's translation), checked against the
    /// same limits as a parsed one.
    pub fn from_expr(expr: Expr) -> Result<Filter, FilterError> {
        fn walk(e: &Expr, conditions: &mut usize) -> Result<(), FilterError> {
            match e {
                Expr::And(a, b) | Expr::Or(a, b) => {
                    walk(a, conditions)?;
                    walk(b, conditions)
                }
                Expr::Not(inner) => walk(inner, conditions),
                Expr::Cond(c) => {
                    *conditions += 1;
                    match &c.predicate {
                        Predicate::In { values, .. } if values.len() > MAX_IN_VALUES => {
                            Err(FilterError::new(
                                0,
                                format!("an IN list holds at most {MAX_IN_VALUES} values"),
                            ))
                        }
                        _ => Ok(()),
                    }
                }
            }
        }
        let mut conditions = 0;
        walk(&expr, &mut conditions)?;
        if conditions > MAX_CONDITIONS {
            return Err(FilterError::new(
                0,
                format!(
                    "the filter has {conditions} conditions; at most {MAX_CONDITIONS} are allowed"
                ),
            ));
        }
        Ok(Filter { expr })
    }

    /// The parsed expression.
    pub fn expr(&self) -> &Expr {
        &self.expr
    }

    /// The param and metric keys the filter names, each once, in order of appearance.
    pub fn keys(&self) -> Vec<(super::KeyKind, &str)> {
        fn walk<'a>(expr: &'a Expr, out: &mut Vec<(super::KeyKind, &'a str)>) {
            match expr {
                Expr::And(a, b) | Expr::Or(a, b) => {
                    walk(a, out);
                    walk(b, out);
                }
                Expr::Not(e) => walk(e, out),
                Expr::Cond(c) => {
                    let key = match &c.field {
                        Field::Param(k) => (super::KeyKind::Param, k.as_str()),
                        Field::Metric(k) => (super::KeyKind::Metric, k.as_str()),
                        Field::Tag(_) | Field::Attribute(_) => return,
                    };
                    if !out.contains(&key) {
                        out.push(key);
                    }
                }
            }
        }
        let mut out = Vec::new();
        walk(&self.expr, &mut out);
        out
    }

    /// Appends the filter as one parenthesized boolean condition on `runs r`.
    pub fn push(&self, sql: &mut crate::store::sql::Sql, dialect: crate::store::sql::Dialect) {
        render::push(&self.expr, &mut render::Out { sql, dialect });
    }
}

/// A param or metric key as a filter writes it: `params.<key>`, in backquotes (a backquote
/// doubled) when it holds a character a bare key cannot.
pub fn written_key(kind: super::KeyKind, key: &str) -> String {
    if !key.is_empty() && key.chars().all(lexer::is_key_char) {
        format!("{}.{key}", kind.prefix())
    } else {
        format!("{}.`{}`", kind.prefix(), key.replace('`', "``"))
    }
}

impl std::str::FromStr for Filter {
    type Err = FilterError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Filter::parse(s)
    }
}
