use super::render::{postgres_like, sqlite_glob};
use super::*;
use crate::store::sql::{Dialect, Sql};

fn cond(field: Field, predicate: Predicate) -> Expr {
    Expr::Cond(Condition { field, predicate })
}

fn metric(key: &str, op: CmpOp, n: f64) -> Expr {
    cond(
        Field::Metric(key.into()),
        Predicate::Compare {
            op,
            value: Literal::Number(n),
        },
    )
}

fn parse(input: &str) -> Expr {
    match Filter::parse(input) {
        Ok(f) => f.expr().clone(),
        Err(e) => panic!("`{input}` should parse, got: {e}"),
    }
}

fn and(a: Expr, b: Expr) -> Expr {
    Expr::And(Box::new(a), Box::new(b))
}

fn or(a: Expr, b: Expr) -> Expr {
    Expr::Or(Box::new(a), Box::new(b))
}

fn not(a: Expr) -> Expr {
    Expr::Not(Box::new(a))
}

#[test]
fn a_metric_and_a_numeric_param_parse_into_two_comparisons() {
    assert_eq!(
        parse("metrics.val/loss < 2.5 and params.training.lr = 0.001"),
        and(
            metric("val/loss", CmpOp::Lt, 2.5),
            cond(
                Field::Param("training.lr".into()),
                Predicate::Compare {
                    op: CmpOp::Eq,
                    value: Literal::Number(0.001)
                }
            )
        )
    );
}

#[test]
fn and_binds_tighter_than_or() {
    let a = || metric("a", CmpOp::Gt, 1.0);
    let b = || metric("b", CmpOp::Gt, 2.0);
    let c = || metric("c", CmpOp::Gt, 3.0);
    assert_eq!(
        parse("metrics.a > 1 or metrics.b > 2 and metrics.c > 3"),
        or(a(), and(b(), c()))
    );
    assert_eq!(
        parse("metrics.a > 1 and metrics.b > 2 or metrics.c > 3"),
        or(and(a(), b()), c())
    );
    assert_eq!(
        parse("(metrics.a > 1 or metrics.b > 2) and metrics.c > 3"),
        and(or(a(), b()), c())
    );
    assert_eq!(
        parse("not metrics.a > 1 and metrics.b > 2"),
        and(not(a()), b())
    );
    assert_eq!(
        parse("metrics.a > 1 or metrics.b > 2 or metrics.c > 3"),
        or(or(a(), b()), c())
    );
}

#[test]
fn keywords_are_case_insensitive_and_operators_have_synonyms() {
    assert_eq!(
        parse("NOT (metrics.train/loss >= 3) AnD metrics.x == 1 Or metrics.y <> 2"),
        or(
            and(
                not(metric("train/loss", CmpOp::Ge, 3.0)),
                metric("x", CmpOp::Eq, 1.0)
            ),
            metric("y", CmpOp::Ne, 2.0)
        )
    );
}

#[test]
fn every_predicate_form_parses() {
    let tag = |p| cond(Field::Tag("team".into()), p);
    assert_eq!(
        parse("tags.team = 'nlp' or status != 'FAILED'"),
        or(
            tag(Predicate::Compare {
                op: CmpOp::Eq,
                value: Literal::Text("nlp".into())
            }),
            cond(
                Field::Attribute(Attribute::Status),
                Predicate::Compare {
                    op: CmpOp::Ne,
                    value: Literal::Text("failed".into())
                }
            )
        )
    );
    assert_eq!(
        parse("name LIKE 'gpt%'"),
        cond(
            Field::Attribute(Attribute::Name),
            Predicate::Like {
                pattern: vec![
                    LikePart::Char('g'),
                    LikePart::Char('p'),
                    LikePart::Char('t'),
                    LikePart::Any
                ],
                case_insensitive: false,
                negated: false
            }
        )
    );
    assert_eq!(
        parse("tags.team not ilike 'n_'"),
        tag(Predicate::Like {
            pattern: vec![LikePart::Char('n'), LikePart::One],
            case_insensitive: true,
            negated: true
        })
    );
    assert_eq!(
        parse("params.model.activation IN ('gelu', \"swiglu\")"),
        cond(
            Field::Param("model.activation".into()),
            Predicate::In {
                values: vec![Literal::Text("gelu".into()), Literal::Text("swiglu".into())],
                negated: false
            }
        )
    );
    assert_eq!(
        parse("metrics.step NOT IN (1, -2e3)"),
        cond(
            Field::Metric("step".into()),
            Predicate::In {
                values: vec![Literal::Number(1.0), Literal::Number(-2000.0)],
                negated: true
            }
        )
    );
    assert_eq!(
        parse("tags.team is null and tags.team IS NOT NULL"),
        and(
            tag(Predicate::IsNull { negated: false }),
            tag(Predicate::IsNull { negated: true })
        )
    );
    assert_eq!(
        parse("ended_at > 1700000000000"),
        cond(
            Field::Attribute(Attribute::EndedAt),
            Predicate::Compare {
                op: CmpOp::Gt,
                value: Literal::Number(1.7e12)
            }
        )
    );
}

#[test]
fn backquoted_keys_and_key_characters_are_kept_verbatim() {
    assert_eq!(
        parse("metrics.`my key` > 1"),
        metric("my key", CmpOp::Gt, 1.0)
    );
    assert_eq!(parse("metrics.`a``b` > 1"), metric("a`b", CmpOp::Gt, 1.0));
    assert_eq!(
        parse("metrics.eval:ppl/x-1.y_z>=.5"),
        metric("eval:ppl/x-1.y_z", CmpOp::Ge, 0.5)
    );
    // A keyword after a prefix is a key, not a keyword.
    assert_eq!(parse("metrics.and < 1"), metric("and", CmpOp::Lt, 1.0));
    assert_eq!(
        parse("attributes.run_id = 'abc'"),
        cond(
            Field::Attribute(Attribute::RunId),
            Predicate::Compare {
                op: CmpOp::Eq,
                value: Literal::Text("abc".into())
            }
        )
    );
}

#[test]
fn string_escapes_are_decoded() {
    let text = |input: &str| match parse(input) {
        Expr::Cond(Condition {
            predicate:
                Predicate::Compare {
                    value: Literal::Text(t),
                    ..
                },
            ..
        }) => t,
        other => panic!("unexpected {other:?}"),
    };
    assert_eq!(text(r"tags.a = 'it\'s'"), "it's");
    assert_eq!(text("tags.a = 'it''s'"), "it's");
    assert_eq!(text(r#"tags.a = "say \"hi\"""#), "say \"hi\"");
    assert_eq!(text(r"tags.a = 'a\\b\nc'"), "a\\b\nc");
    assert_eq!(text(r"tags.a = '50\%'"), "50\\%");
    assert_eq!(text("tags.a = 'été'"), "été");
}

#[test]
fn like_escapes_make_wildcards_literal() {
    let pattern = |input: &str| match parse(input) {
        Expr::Cond(Condition {
            predicate: Predicate::Like { pattern, .. },
            ..
        }) => pattern,
        other => panic!("unexpected {other:?}"),
    };
    assert_eq!(
        pattern(r"name like '5\%_'"),
        vec![LikePart::Char('5'), LikePart::Char('%'), LikePart::One]
    );
    assert_eq!(pattern(r"name like '\\\\'"), vec![LikePart::Char('\\')]);
}

#[test]
fn invalid_filters_are_rejected_with_the_position_and_what_was_expected() {
    // (input, position, part of the message)
    let cases: &[(&str, usize, &str)] = &[
        ("", 0, "expected a condition"),
        ("   ", 0, "expected a condition"),
        ("metrics.val/loss < ", 19, "expected a value"),
        (
            "metrics.val/loss < and",
            19,
            "expected a value (a number or a quoted string) after `<`, found `and`",
        ),
        ("metrics.loss 2", 13, "expected an operator"),
        ("metrics.loss", 12, "expected an operator"),
        ("metrics.loss < 'x'", 15, "metrics.loss is numeric"),
        ("metrics.loss like 'x%'", 13, "LIKE applies to text"),
        ("created_at ilike 'x%'", 11, "ILIKE applies to text"),
        ("metrics. < 1", 8, "expected a key after `metrics.`"),
        ("metrics < 1", 7, "expected `.` and a key"),
        ("foo = 1", 0, "unknown field `foo`"),
        ("x.y = 1", 0, "unknown field `x.y`"),
        ("tags.a = 'x' and bogus = 'y'", 17, "unknown field `bogus`"),
        ("attributes.nope = 'x'", 11, "unknown field `nope`"),
        ("status = 'done'", 9, "unknown status `done`"),
        ("status < 'failed'", 7, "status can only be compared"),
        (
            "status in ('failed', 'weird')",
            21,
            "unknown status `weird`",
        ),
        ("tags.team = 5", 12, "tag values are text"),
        ("name = 5", 7, "name is text"),
        ("name like 5", 10, "expected a quoted pattern after `like`"),
        ("tags.a = 'x", 9, "unterminated string"),
        ("tags.a = 'x\\", 9, "unterminated string"),
        ("metrics.`my key > 1", 8, "unterminated backquoted key"),
        ("`a` = 1", 0, "unexpected backquote"),
        ("metrics.a ! 1", 10, "did you mean `!=`"),
        (
            "metrics.a = 1 & metrics.b = 2",
            14,
            "unexpected character `&`",
        ),
        ("metrics.a = 1e", 12, "malformed number"),
        ("metrics.a = 1e999", 12, "out of range"),
        ("metrics.a = 12abc", 14, "after a number"),
        ("metrics.a = -", 12, "unexpected character `-`"),
        (
            "(metrics.a = 1",
            14,
            "expected `)` to close the `(` at position 0",
        ),
        (
            "metrics.a = 1)",
            13,
            "expected AND, OR or the end of the filter, found `)`",
        ),
        ("metrics.a = 1 metrics.b = 2", 14, "expected AND, OR"),
        ("metrics.a = 1 and", 17, "expected a condition"),
        ("and metrics.a = 1", 0, "expected a condition"),
        ("()", 1, "expected a condition"),
        ("params.a in ()", 13, "expected a value"),
        ("params.a in (1, 'x')", 16, "mixes numbers and strings"),
        ("params.a in (1 2)", 15, "expected `,` or `)`"),
        ("params.a in 1", 12, "expected `(` after IN"),
        (
            "params.a not = 1",
            13,
            "expected LIKE, ILIKE or IN after NOT",
        ),
        ("params.a is 1", 12, "expected NULL or NAN after IS"),
        ("params.a is not", 15, "expected NULL or NAN after IS"),
        ("params.a is nan", 9, "IS NAN tests a metric"),
        ("name like 'x\\\\'", 10, "lone `\\`"),
        ("tags.é = 'x'", 5, "unexpected character `é`"),
        ("tags.a = 'a\u{0}'", 11, "control character"),
        ("metrics.ü < 1 and x", 8, "unexpected character `ü`"),
    ];
    for (input, position, message) in cases {
        match Filter::parse(input) {
            Ok(f) => panic!("`{input}` should fail, parsed as {f:?}"),
            Err(e) => {
                assert!(
                    e.message.contains(message),
                    "`{input}`: message `{}` lacks `{message}`",
                    e.message
                );
                assert_eq!(e.position, *position, "`{input}`: {e}");
                assert!(e.to_string().ends_with(&format!("at position {position}")));
            }
        }
    }
}

#[test]
fn positions_count_characters_not_bytes() {
    let e = Filter::parse("tags.a = 'ééé' and foo = 1").unwrap_err();
    assert_eq!(e.position, 19);
}

#[test]
fn oversized_and_overnested_filters_are_rejected() {
    let deep = format!("{}metrics.a > 1{}", "(".repeat(40), ")".repeat(40));
    let e = Filter::parse(&deep).unwrap_err();
    assert!(e.message.contains("nests too deeply"), "{e}");
    let nots = format!("{}metrics.a > 1", "not ".repeat(40));
    assert!(Filter::parse(&nots)
        .unwrap_err()
        .message
        .contains("nests too deeply"));
    let many = vec!["metrics.a > 1"; MAX_CONDITIONS + 1].join(" or ");
    let e = Filter::parse(&many).unwrap_err();
    assert!(e.message.contains("too many conditions"), "{e}");
    let long = format!("tags.a = '{}'", "x".repeat(MAX_FILTER_CHARS));
    assert!(Filter::parse(&long)
        .unwrap_err()
        .message
        .contains("too long"));
    // Just inside the limits is fine.
    let ok = format!("{}metrics.a > 1{}", "(".repeat(20), ")".repeat(20));
    assert!(Filter::parse(&ok).is_ok());
}

#[test]
fn user_values_never_reach_the_sql_text() {
    let evil = "tags.`x'; DROP TABLE runs; --` = 'y''; DELETE FROM runs; --' or name like '%''--'";
    let f = Filter::parse(evil).unwrap();
    let mut lite = Sql::new("SELECT r.id FROM runs r WHERE ");
    f.push(&mut lite, Dialect::Sqlite);
    let mut pg = Sql::new("SELECT r.id FROM runs r WHERE ");
    f.push(&mut pg, Dialect::Postgres);
    for sql in [lite.text(), pg.text()] {
        assert!(!sql.contains("DROP") && !sql.contains("DELETE"), "{sql}");
        assert!(!sql.contains('\''), "no quoted literal may appear: {sql}");
    }
    assert_eq!(
        pg.text(),
        "SELECT r.id FROM runs r WHERE ((EXISTS (SELECT 1 FROM run_tags t WHERE t.run_id = r.id \
         AND t.key = $1 AND t.value = $2)) OR (r.name LIKE $3))"
    );
}

#[test]
fn sql_uses_the_backend_specific_forms() {
    let f = Filter::parse("params.lr >= 0.1 and tags.a < 'b' and name ilike 'x' and ended_at > 5")
        .unwrap();
    let mut lite = Sql::new("");
    f.push(&mut lite, Dialect::Sqlite);
    let mut pg = Sql::new("");
    f.push(&mut pg, Dialect::Postgres);
    // Parameters are written `$n` for both backends; the forms around them differ.
    assert!(lite.text().contains("p.num >= $2"), "{}", lite.text());
    assert!(lite.text().contains("t.value < $4"), "{}", lite.text());
    assert!(lite.text().contains("r.name GLOB $5"), "{}", lite.text());
    assert!(lite
        .text()
        .contains("r.ended_at IS NOT NULL AND r.ended_at > $6"));
    assert!(
        pg.text().contains("t.value COLLATE \"C\" < $4"),
        "{}",
        pg.text()
    );
    assert!(pg.text().contains("r.name ILIKE $5"), "{}", pg.text());
}

#[test]
fn like_patterns_translate_to_equivalent_backend_patterns() {
    let parts = vec![
        LikePart::Char('A'),
        LikePart::Any,
        LikePart::Char('*'),
        LikePart::Char('%'),
        LikePart::One,
        LikePart::Char('['),
        LikePart::Char('\\'),
        LikePart::Char('é'),
        LikePart::Char('1'),
    ];
    assert_eq!(postgres_like(&parts), "A%*\\%_[\\\\é1");
    assert_eq!(sqlite_glob(&parts, false), "A*[*]%?[[]\\é1");
    assert_eq!(sqlite_glob(&parts, true), "[Aa]*[*]%?[[]\\[éÉ]1");
}

#[test]
fn a_filter_lists_each_param_and_metric_key_it_names_once() {
    use crate::store::KeyKind;
    let f = Filter::parse(
        "(metrics.val/loss < 2 or params.training.lr = 0.1) and not metrics.val/loss > 5 \
         and tags.team = 'a' and name = 'x' and param.model.d_model is null",
    )
    .unwrap();
    assert_eq!(
        f.keys(),
        vec![
            (KeyKind::Metric, "val/loss"),
            (KeyKind::Param, "training.lr"),
            (KeyKind::Param, "model.d_model"),
        ]
    );
}
