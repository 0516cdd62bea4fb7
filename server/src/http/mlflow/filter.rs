//! MLflow's search grammar, translated onto Trainyard's own filter (`store::filter`), so both
//! protocols search the same way in the database:
//!
//! ```text
//! filter  := clause (AND clause)*
//! clause  := ident op value | ident [NOT] IN '(' value (',' value)* ')' | ident IS [NOT] NULL
//!          | metric IS [NOT] NAN
//! ident   := [prefix '.'] (name | `quoted` | "quoted")
//! prefix  := metrics | params | tags | attributes (and their singular forms, attr, run)
//! op      := = | != | <> | < | <= | > | >= | LIKE | ILIKE | NOT LIKE | NOT ILIKE
//! ```
//!
//! Run attributes: `run_id`, `run_name`, `status` (MLflow's names), `start_time`, `end_time`,
//! `user_id`; experiments search `name`, `experiment_id`, `creation_time`, `last_update_time`
//! and `tags.<key>`. MLflow has no `OR`; Trainyard's own search (`q=` of `GET /api/v1/runs`)
//! does.

use crate::store::filter::{
    Attribute, CmpOp, Condition, Expr, Field, Filter, LikePart, Literal, Predicate,
};
use crate::store::{SortDir, SortKey};

use super::wire::{MlflowStatus, USER_TAG};
use super::MlflowError;

mod experiments;
mod grammar;
mod models;
#[cfg(test)]
mod tests;

pub use experiments::{experiment_order, ExperimentFilter};
use grammar::{invalid, parse, tokenize, Ident, Parser, Test};
pub use models::RegistryFilter;

fn cmp_op(op: &str) -> CmpOp {
    match op {
        "=" => CmpOp::Eq,
        "!=" => CmpOp::Ne,
        "<" => CmpOp::Lt,
        "<=" => CmpOp::Le,
        ">" => CmpOp::Gt,
        _ => CmpOp::Ge,
    }
}

/// A LIKE pattern as Trainyard's filter holds it (`%` any run, `_` one character, `\` escapes).
pub(super) fn like_parts(pattern: &str) -> Vec<LikePart> {
    let mut out = Vec::new();
    let mut chars = pattern.chars();
    while let Some(c) = chars.next() {
        out.push(match c {
            '%' => LikePart::Any,
            '_' => LikePart::One,
            '\\' => LikePart::Char(chars.next().unwrap_or('\\')),
            other => LikePart::Char(other),
        });
    }
    out
}

fn predicate(test: Test) -> Predicate {
    match test {
        Test::Cmp(op, value) => Predicate::Compare {
            op: cmp_op(op),
            value,
        },
        Test::Like {
            pattern,
            ci,
            negated,
        } => Predicate::Like {
            pattern: like_parts(&pattern),
            case_insensitive: ci,
            negated,
        },
        Test::In { values, negated } => Predicate::In { values, negated },
        Test::Null { negated } => Predicate::IsNull { negated },
        Test::Nan { negated } => Predicate::IsNan { negated },
    }
}

fn cond(field: Field, predicate: Predicate) -> Expr {
    Expr::Cond(Condition { field, predicate })
}

/// `status` compares MLflow's status names, each standing for one or two of ours.
fn status_expr(test: Test) -> Result<Expr, MlflowError> {
    let names = |values: &[Literal]| -> Result<Vec<Literal>, MlflowError> {
        let mut out = Vec::new();
        for v in values {
            let Literal::Text(text) = v else {
                return Err(invalid(
                    "status compares with a quoted status such as 'FINISHED'",
                ));
            };
            let status = MlflowStatus::parse(&text.to_ascii_uppercase()).ok_or_else(|| {
                invalid(format!(
                    "`{text}` is not a status: use RUNNING, SCHEDULED, FINISHED, FAILED or KILLED"
                ))
            })?;
            out.extend(
                status
                    .statuses()
                    .iter()
                    .map(|s| Literal::Text(s.as_str().to_string())),
            );
        }
        Ok(out)
    };
    let (values, negated) = match test {
        Test::Cmp("=", v) => (names(&[v])?, false),
        Test::Cmp("!=", v) => (names(&[v])?, true),
        Test::In { values, negated } => (names(&values)?, negated),
        _ => return Err(invalid("status takes =, != or IN")),
    };
    Ok(cond(
        Field::Attribute(Attribute::Status),
        Predicate::In { values, negated },
    ))
}

fn run_attribute(name: &str, test: Test) -> Result<Expr, MlflowError> {
    let attribute = match name {
        "status" => return status_expr(test),
        "run_id" | "run_uuid" => Attribute::RunId,
        "run_name" => Attribute::Name,
        "start_time" | "created" | "Created" => Attribute::CreatedAt,
        "end_time" => Attribute::EndedAt,
        "experiment_id" => Attribute::ExperimentId,
        "user_id" => {
            // The account that created the run, or the user the client reported.
            let p = predicate(test);
            return Ok(Expr::Or(
                Box::new(cond(Field::Attribute(Attribute::User), p.clone())),
                Box::new(cond(Field::Tag(USER_TAG.to_string()), p)),
            ));
        }
        other => {
            return Err(invalid(format!(
                "`{other}` is not a run attribute this server searches: use run_id, run_name, \
                 status, start_time, end_time or user_id"
            )))
        }
    };
    Ok(cond(Field::Attribute(attribute), predicate(test)))
}

/// Translates an MLflow run filter into Trainyard's (`None` for an empty filter).
pub fn run_filter(input: &str) -> Result<Option<Filter>, MlflowError> {
    let mut exprs = Vec::new();
    for clause in parse(input)? {
        if matches!(clause.test, Test::Nan { .. }) && !matches!(clause.ident, Ident::Metric(_)) {
            return Err(invalid("IS NAN tests a metric (metrics.<key> IS NAN)"));
        }
        exprs.push(match clause.ident {
            Ident::Metric(k) => {
                if matches!(&clause.test, Test::Cmp(_, Literal::Text(_))) {
                    return Err(invalid(format!("metrics.{k} compares with numbers")));
                }
                cond(Field::Metric(k), predicate(clause.test))
            }
            Ident::Param(k) => cond(Field::Param(k), predicate(clause.test)),
            Ident::Tag(k) => cond(Field::Tag(k), predicate(clause.test)),
            Ident::Attribute(a) => run_attribute(&a, clause.test)?,
        });
    }
    let Some(first) = exprs.pop() else {
        return Ok(None);
    };
    let expr = exprs
        .into_iter()
        .rev()
        .fold(first, |acc, e| Expr::And(Box::new(e), Box::new(acc)));
    Filter::from_expr(expr)
        .map(Some)
        .map_err(|e| invalid(e.message))
}

/// Translates one `order_by` entry of a run search (`metrics.loss DESC`).
pub fn run_order(entry: &str) -> Result<(SortKey, SortDir), MlflowError> {
    let bad = |why: String| MlflowError::invalid("order_by", why);
    let entry = entry.trim();
    let (name, dir) = split_direction(entry).map_err(bad)?;
    let toks = tokenize(name).map_err(|_| bad(format!("`{entry}` is not a sort key")))?;
    let mut parser = Parser { toks, at: 0 };
    let ident = parser
        .ident()
        .map_err(|_| bad(format!("`{entry}` is not a sort key")))?;
    if parser.peek().is_some() {
        return Err(bad(format!("`{entry}` is not a sort key")));
    }
    let key = match ident {
        Ident::Metric(k) => SortKey::Metric(k),
        Ident::Param(k) => SortKey::Param(k),
        Ident::Attribute(a) => match a.as_str() {
            "start_time" | "created" | "Created" => SortKey::CreatedAt,
            "run_name" => SortKey::Name,
            "status" => SortKey::Status,
            other => {
                return Err(bad(format!(
                    "runs sort by start_time, run_name, status, metrics.<key> or params.<key>, \
                     not `{other}`"
                )))
            }
        },
        Ident::Tag(_) => return Err(bad("runs cannot be sorted by a tag here".into())),
    };
    Ok((key, dir))
}

pub(super) fn split_direction(entry: &str) -> Result<(&str, SortDir), String> {
    let lower = entry.to_ascii_lowercase();
    if lower.ends_with(" desc") {
        Ok((entry[..entry.len() - 5].trim_end(), SortDir::Desc))
    } else if lower.ends_with(" asc") {
        Ok((entry[..entry.len() - 4].trim_end(), SortDir::Asc))
    } else if entry.is_empty() {
        Err("an order_by entry is empty".into())
    } else {
        Ok((entry, SortDir::Asc))
    }
}
