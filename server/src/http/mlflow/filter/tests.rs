//! The translation checked case by case.

use super::*;
use crate::store::Experiment;

#[test]
fn mlflow_filters_become_trainyard_filters() {
    let cases = [
        "metrics.acc > 0.9 AND params.lr = '0.01'",
        "tags.\"mlflow.parentRunId\" = 'abc'",
        "tags.mlflow.source.type = 'LOCAL'",
        "metrics.`val loss` <= 2 and attributes.run_name LIKE 'gpt%'",
        "attributes.status IN ('FINISHED', 'FAILED')",
        "params.opt ILIKE 'ADAM%' AND run_name != 'x'",
        "attribute.start_time >= 1700000000000",
        "metrics.train/loss < 3",
        "user_id = 'alice'",
    ];
    for case in cases {
        let f = run_filter(case).unwrap_or_else(|e| panic!("{case}: {}", e.message));
        assert!(f.is_some(), "{case}");
    }
    assert!(run_filter("").expect("empty").is_none());
}

#[test]
fn filters_outside_the_grammar_are_refused_with_the_reason() {
    let cases = [
        ("metrics.a > 1 OR metrics.b > 1", "no OR"),
        ("attributes.status = 'DONE'", "is not a status"),
        ("foo.bar = 1", "is not one of"),
        ("metrics.a >", "expected a value"),
        ("metrics.a = 'x'", "compares with numbers"),
        ("params.a = 'x", "not closed"),
        ("attributes.artifact_uri = 'x'", "not a run attribute"),
    ];
    for (case, want) in cases {
        let e = run_filter(case).expect_err(case);
        assert!(e.message.contains(want), "{case}: {}", e.message);
        assert!(e.message.starts_with("filter: "), "{case}: {}", e.message);
    }
}

#[test]
fn status_names_stand_for_the_statuses_that_read_as_them() {
    let f = run_filter("status = 'FAILED'")
        .expect("filter")
        .expect("some");
    let Expr::Cond(c) = f.expr() else {
        panic!("one condition")
    };
    assert_eq!(
        c.predicate,
        Predicate::In {
            values: vec![Literal::Text("failed".into()), Literal::Text("lost".into())],
            negated: false,
        }
    );
}

#[test]
fn order_by_entries_name_a_key_and_a_direction() {
    assert_eq!(
        run_order("metrics.`val/loss` DESC").expect("order"),
        (SortKey::Metric("val/loss".into()), SortDir::Desc)
    );
    assert_eq!(
        run_order("attributes.start_time").expect("order"),
        (SortKey::CreatedAt, SortDir::Asc)
    );
    assert!(run_order("tags.x").is_err());
    assert!(experiment_order("name DESC").is_ok());
    assert!(experiment_order("size").is_err());
}

#[test]
fn experiment_filters_test_names_tags_and_times() {
    let e = Experiment {
        id: "3".into(),
        name: "Moe-Search".into(),
        created_at: 100,
        updated_at: 200,
        deleted_at: None,
        tags: [("team".to_string(), "nlp".to_string())].into(),
    };
    let yes = [
        "name = 'Moe-Search'",
        "name ILIKE 'moe%'",
        "name LIKE '%Search'",
        "tags.team = 'nlp' AND creation_time < 150",
        "last_update_time >= 200",
        "name != 'x'",
    ];
    for f in yes {
        assert!(ExperimentFilter::parse(f).expect(f).matches(&e), "{f}");
    }
    let no = ["name LIKE 'moe%'", "tags.team = 'cv'", "tags.other = 'x'"];
    for f in no {
        assert!(!ExperimentFilter::parse(f).expect(f).matches(&e), "{f}");
    }
    assert!(ExperimentFilter::parse("metrics.x > 1").is_err());
}
