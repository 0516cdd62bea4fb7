//! Experiment searches: MLflow's filter on names, ids, times and tags, evaluated per experiment
//! (a server has few experiments), and their sort keys.

use crate::store::filter::{LikePart, Literal};
use crate::store::{Experiment, SortDir};

use super::super::MlflowError;
use super::grammar::{invalid, parse, Clause, Ident, Test};
use super::{like_parts, split_direction};

/// An experiment filter, evaluated on each experiment.
pub struct ExperimentFilter(Vec<Clause>);

impl ExperimentFilter {
    pub fn parse(input: &str) -> Result<ExperimentFilter, MlflowError> {
        let clauses = parse(input)?;
        for c in &clauses {
            match &c.ident {
                Ident::Tag(_) => {}
                Ident::Attribute(a)
                    if matches!(
                        a.as_str(),
                        "name" | "experiment_id" | "creation_time" | "last_update_time"
                    ) => {}
                _ => {
                    return Err(invalid(
                        "experiments are searched by name, experiment_id, creation_time, \
                         last_update_time and tags.<key>",
                    ))
                }
            }
        }
        Ok(ExperimentFilter(clauses))
    }

    pub fn matches(&self, e: &Experiment) -> bool {
        self.0.iter().all(|c| {
            let value: Option<Literal> = match &c.ident {
                Ident::Tag(k) => e.tags.get(k).cloned().map(Literal::Text),
                Ident::Attribute(a) => Some(match a.as_str() {
                    "name" => Literal::Text(e.name.clone()),
                    "experiment_id" => Literal::Text(e.id.clone()),
                    "creation_time" => Literal::Number(e.created_at as f64),
                    _ => Literal::Number(e.updated_at as f64),
                }),
                _ => None,
            };
            test_value(&c.test, value.as_ref())
        })
    }
}

pub(super) fn test_value(test: &Test, value: Option<&Literal>) -> bool {
    let Some(value) = value else {
        return matches!(test, Test::Null { negated: false });
    };
    match test {
        Test::Null { negated } => *negated,
        Test::Cmp(op, want) => match (value, want) {
            (Literal::Number(a), Literal::Number(b)) => compare(op, a.partial_cmp(b)),
            (Literal::Text(a), Literal::Text(b)) => compare(op, Some(a.cmp(b))),
            (Literal::Text(a), Literal::Number(b)) => {
                compare(op, a.parse::<f64>().ok().and_then(|a| a.partial_cmp(b)))
            }
            _ => false,
        },
        Test::Like {
            pattern,
            ci,
            negated,
        } => {
            let Literal::Text(text) = value else {
                return false;
            };
            like(&like_parts(pattern), text, *ci) != *negated
        }
        Test::In { values, negated } => values.contains(value) != *negated,
        // Only metrics can be NaN; run filters take it (`run_filter`).
        Test::Nan { .. } => false,
    }
}

fn compare(op: &str, ord: Option<std::cmp::Ordering>) -> bool {
    use std::cmp::Ordering::*;
    let Some(ord) = ord else { return false };
    match op {
        "=" => ord == Equal,
        "!=" => ord != Equal,
        "<" => ord == Less,
        "<=" => ord != Greater,
        ">" => ord == Greater,
        _ => ord != Less,
    }
}

fn like(pattern: &[LikePart], text: &str, ci: bool) -> bool {
    let fold = |c: char| {
        if ci {
            c.to_lowercase().next().unwrap_or(c)
        } else {
            c
        }
    };
    let text: Vec<char> = text.chars().map(fold).collect();
    fn go(p: &[LikePart], t: &[char], fold: &dyn Fn(char) -> char) -> bool {
        match p.split_first() {
            None => t.is_empty(),
            Some((LikePart::Any, rest)) => (0..=t.len()).any(|i| go(rest, &t[i..], fold)),
            Some((LikePart::One, rest)) => !t.is_empty() && go(rest, &t[1..], fold),
            Some((LikePart::Char(c), rest)) => {
                t.first() == Some(&fold(*c)) && go(rest, &t[1..], fold)
            }
        }
    }
    go(pattern, &text, &fold)
}

/// One `order_by` entry of an experiment search.
pub fn experiment_order(entry: &str) -> Result<(String, SortDir), MlflowError> {
    let (name, dir) =
        split_direction(entry.trim()).map_err(|e| MlflowError::invalid("order_by", e))?;
    let name = name.strip_prefix("attributes.").unwrap_or(name);
    match name {
        "name" | "experiment_id" | "creation_time" | "last_update_time" => {
            Ok((name.to_string(), dir))
        }
        other => Err(MlflowError::invalid(
            "order_by",
            format!(
                "experiments sort by name, experiment_id, creation_time or last_update_time, \
                 not `{other}`"
            ),
        )),
    }
}
