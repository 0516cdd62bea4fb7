//! Renders a filter as SQL on `runs r`. Every user value goes through a bound parameter; the
//! only text pushed is fixed SQL from this file.

use super::{Attribute, CmpOp, Condition, Expr, Field, LikePart, Literal, Predicate};
use crate::store::sql::{Dialect, Sql};

/// Where a filter is rendered: the statement, and the dialect it is for.
pub(super) struct Out<'a> {
    pub sql: &'a mut Sql,
    pub dialect: Dialect,
}

impl Out<'_> {
    fn sql(&mut self, s: &str) {
        self.sql.push(s);
    }
    fn bind_text(&mut self, v: String) {
        self.sql.arg(v);
    }
    fn bind_real(&mut self, v: f64) {
        self.sql.arg(v);
    }
    fn bind_int(&mut self, v: i64) {
        self.sql.arg(v);
    }
}

pub(super) fn push(expr: &Expr, s: &mut Out) {
    s.sql("(");
    match expr {
        Expr::And(a, b) => {
            push(a, s);
            s.sql(" AND ");
            push(b, s);
        }
        Expr::Or(a, b) => {
            push(a, s);
            s.sql(" OR ");
            push(b, s);
        }
        Expr::Not(a) => {
            s.sql("NOT ");
            push(a, s);
        }
        Expr::Cond(c) => condition(c, s),
    }
    s.sql(")");
}

fn condition(c: &Condition, s: &mut Out) {
    let (table, alias, key) = match &c.field {
        Field::Metric(k) => ("metric_series", "m", k),
        Field::Param(k) => ("run_params", "p", k),
        Field::Tag(k) => ("run_tags", "t", k),
        Field::Attribute(a) => return attribute(*a, &c.predicate, s),
    };
    // Presence tests need no value; every other test requires the key (missing key = false).
    let negate_exists = matches!(c.predicate, Predicate::IsNull { negated: false });
    s.sql(if negate_exists {
        "NOT EXISTS (SELECT 1 FROM "
    } else {
        "EXISTS (SELECT 1 FROM "
    });
    s.sql(table);
    s.sql(" ");
    s.sql(alias);
    s.sql(" WHERE ");
    s.sql(alias);
    s.sql(".run_id = r.id AND ");
    s.sql(alias);
    s.sql(".key = ");
    s.bind_text(key.clone());
    if let Predicate::IsNan { negated } = &c.predicate {
        // The partial index on the NaN points answers this without reading the others.
        s.sql(if *negated { " AND NOT " } else { " AND " });
        s.sql("EXISTS (SELECT 1 FROM metric_points np ");
        s.sql("WHERE np.series_id = m.id AND np.value IS NULL))");
        return;
    }
    // A series of NaN points only has no latest value to compare (its step stays -1).
    if matches!(c.field, Field::Metric(_)) && !matches!(c.predicate, Predicate::IsNull { .. }) {
        s.sql(" AND m.last_step >= 0");
    }
    if !matches!(c.predicate, Predicate::IsNull { .. }) {
        s.sql(" AND ");
        let column = match (&c.field, numeric_literal(&c.predicate)) {
            (Field::Metric(_), _) => "m.last_value",
            (Field::Param(_), true) => "p.num",
            (Field::Param(_), false) => "p.value",
            _ => "t.value",
        };
        predicate(column, &c.predicate, false, s);
    }
    s.sql(")");
}

fn numeric_literal(p: &Predicate) -> bool {
    match p {
        Predicate::Compare { value, .. } => matches!(value, Literal::Number(_)),
        Predicate::In { values, .. } => matches!(values.first(), Some(Literal::Number(_))),
        _ => false,
    }
}

fn attribute(a: Attribute, p: &Predicate, s: &mut Out) {
    let column = match a {
        Attribute::Status => "r.status",
        Attribute::Name => "r.name",
        Attribute::ExperimentId => "r.experiment_id",
        Attribute::RunId => "r.id",
        Attribute::CreatedAt => "r.created_at",
        Attribute::StartedAt => "r.started_at",
        Attribute::EndedAt => "r.ended_at",
        Attribute::User => "(SELECT u.name FROM users u WHERE u.id = r.created_by)",
    };
    if let Predicate::IsNull { negated } = p {
        s.sql(column);
        s.sql(if *negated { " IS NOT NULL" } else { " IS NULL" });
        return;
    }
    // A null column fails every comparison, also under NOT (two-valued, like a missing key).
    let nullable = matches!(
        a,
        Attribute::StartedAt | Attribute::EndedAt | Attribute::User
    );
    if nullable {
        s.sql(column);
        s.sql(" IS NOT NULL AND ");
    }
    predicate(column, p, a.is_numeric(), s);
}

fn predicate(column: &str, p: &Predicate, integer: bool, s: &mut Out) {
    match p {
        Predicate::Compare { op, value } => {
            s.sql(column);
            if s.dialect == Dialect::Postgres && op_orders_text(*op, value) {
                // Code-point order, as SQLite's BINARY collation.
                s.sql(" COLLATE \"C\"");
            }
            s.sql(" ");
            s.sql(op.as_sql());
            s.sql(" ");
            literal(value, integer, s);
        }
        Predicate::In { values, negated } => {
            s.sql(column);
            s.sql(if *negated { " NOT IN (" } else { " IN (" });
            for (i, v) in values.iter().enumerate() {
                if i > 0 {
                    s.sql(", ");
                }
                literal(v, integer, s);
            }
            s.sql(")");
        }
        Predicate::Like {
            pattern,
            case_insensitive,
            negated,
        } => {
            s.sql(column);
            if *negated {
                s.sql(" NOT");
            }
            if s.dialect == Dialect::Postgres {
                s.sql(if *case_insensitive {
                    " ILIKE "
                } else {
                    " LIKE "
                });
                s.bind_text(postgres_like(pattern));
            } else {
                // SQLite's LIKE ignores ASCII case; GLOB is case-sensitive, so both LIKE
                // and ILIKE become GLOB patterns with explicit case classes for ILIKE.
                s.sql(" GLOB ");
                s.bind_text(sqlite_glob(pattern, *case_insensitive));
            }
        }
        Predicate::IsNull { negated } => {
            s.sql(column);
            s.sql(if *negated { " IS NOT NULL" } else { " IS NULL" });
        }
        // Rendered by `condition` (metrics only; the parsers refuse it elsewhere).
        Predicate::IsNan { .. } => s.sql("1 = 0"),
    }
}

fn op_orders_text(op: CmpOp, value: &Literal) -> bool {
    op.is_ordering() && matches!(value, Literal::Text(_))
}

/// Binds a literal; whole numbers on integer columns bind as integers (index-friendly).
fn literal(v: &Literal, integer: bool, s: &mut Out) {
    match v {
        Literal::Text(t) => s.bind_text(t.clone()),
        Literal::Number(n) => {
            if integer && n.fract() == 0.0 && n.abs() < 9.0e15 {
                s.bind_int(*n as i64);
            } else {
                s.bind_real(*n);
            }
        }
    }
}

/// A Postgres LIKE pattern (backslash is Postgres's default escape character).
pub(super) fn postgres_like(parts: &[LikePart]) -> String {
    let mut out = String::new();
    for part in parts {
        match part {
            LikePart::Any => out.push('%'),
            LikePart::One => out.push('_'),
            LikePart::Char(c) => {
                if matches!(c, '%' | '_' | '\\') {
                    out.push('\\');
                }
                out.push(*c);
            }
        }
    }
    out
}

/// A SQLite GLOB pattern matching what the LIKE pattern matches.
pub(super) fn sqlite_glob(parts: &[LikePart], case_insensitive: bool) -> String {
    let mut out = String::new();
    for part in parts {
        match part {
            LikePart::Any => out.push('*'),
            LikePart::One => out.push('?'),
            LikePart::Char(c) => {
                let variants = if case_insensitive {
                    case_variants(*c)
                } else {
                    vec![*c]
                };
                if variants.len() > 1 {
                    out.push('[');
                    out.extend(variants);
                    out.push(']');
                } else if matches!(c, '*' | '?' | '[') {
                    // A one-character class is the literal character.
                    out.push('[');
                    out.push(*c);
                    out.push(']');
                } else {
                    out.push(*c);
                }
            }
        }
    }
    out
}

/// The character with its simple (one-character) lower- and uppercase forms.
fn case_variants(c: char) -> Vec<char> {
    let mut v = vec![c];
    for other in [single(c.to_lowercase()), single(c.to_uppercase())]
        .into_iter()
        .flatten()
    {
        // `]` and `^` have no case, so a class of case variants never needs escaping.
        if !v.contains(&other) {
            v.push(other);
        }
    }
    v
}

fn single(mut it: impl Iterator<Item = char>) -> Option<char> {
    let first = it.next()?;
    it.next().is_none().then_some(first)
}
