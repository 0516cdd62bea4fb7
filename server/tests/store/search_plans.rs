//! Every search shape reads what its page needs, not the experiment: 1,000 runs in each of two
//! experiments (3 params, 2 metrics, 1 tag each), and each shape's statements checked through
//! the database's own plan, before the store gathered statistics and after. On Postgres the
//! rows each plan node read (`EXPLAIN ANALYZE`: actual rows, and rows removed by a filter,
//! times loops) are counted, on SQLite the plan may hold no `SCAN` of a table and no sort
//! (`USE TEMP B-TREE`): only `SEARCH ... USING INDEX`. A full scan of one experiment would read
//! at least `RUNS` rows of one table.

use crate::metrics::pt;
use crate::runs::tags;
use serde_json::{json, Value};
use trainyard::store::filter::Filter;
use trainyard::store::{DynStore, NewRun, QueryPlan, RunQuery, SortDir, SortKey};

/// Runs per experiment.
const RUNS: usize = 1_000;
/// Runs per page.
const PAGE: usize = 20;
/// The most rows one statement of a page may read on Postgres: the walk to the page's
/// `PAGE + 1` runs, with a filter that keeps one run in ten, and a probe or two per run walked.
const MOST_ROWS_READ: f64 = 700.0;
/// The tables a search may never scan.
const BIG_TABLES: [&str; 4] = ["runs", "run_params", "metric_series", "run_tags"];

const LRS: [f64; 5] = [0.1, 0.01, 0.001, 0.0001, 0.00001];
const OPTS: [&str; 3] = ["adam", "sgd", "lion"];
const TEAMS: [&str; 3] = ["nlp", "vision", "speech"];

/// A latest loss in [0, 1), spread over the runs.
fn loss(i: usize) -> f64 {
    ((i * 7_919) % 1_000) as f64 / 1_000.0
}

async fn load(store: &DynStore, experiment: &str) {
    let mut tasks = tokio::task::JoinSet::new();
    for worker in 0..8 {
        let store = store.clone();
        let experiment = experiment.to_string();
        tasks.spawn(async move {
            for i in (worker..RUNS).step_by(8) {
                let run = store
                    .create_run(NewRun {
                        experiment_id: experiment.clone(),
                        name: Some(format!("run-{i:04}")),
                        config: Some(json!({
                            "lr": LRS[i % LRS.len()],
                            "layers": i % 7,
                            "opt": OPTS[i % OPTS.len()],
                        })),
                        tags: tags(&[("team", TEAMS[i % TEAMS.len()])]),
                        ..Default::default()
                    })
                    .await
                    .expect("run");
                let points = [
                    pt("loss", 0, 2.0),
                    pt("loss", 1, loss(i)),
                    pt("acc", 1, 1.0 - loss(i)),
                ];
                store
                    .append_points(&run.id, &points, 0)
                    .await
                    .expect("points");
            }
        });
    }
    while let Some(done) = tasks.join_next().await {
        done.expect("loader");
    }
}

fn query(experiment: &str, sort: SortKey, dir: SortDir, filter: Option<&str>) -> RunQuery {
    RunQuery {
        experiment_id: Some(experiment.to_string()),
        status: None,
        tag: None,
        filter: filter.map(|f| Filter::parse(f).expect("filter")),
        sort,
        dir,
        limit: PAGE,
        cursor: None,
        visible_experiments: None,
        lifecycle: Default::default(),
    }
}

/// Rows a Postgres plan node and those below it read: what each scan returned or removed,
/// times its loops.
fn rows_read(node: &Value) -> f64 {
    let f = |k: &str| node.get(k).and_then(Value::as_f64).unwrap_or(0.0);
    let mut rows = 0.0;
    if node.get("Relation Name").is_some() || node.get("Index Name").is_some() {
        rows +=
            (f("Actual Rows") + f("Rows Removed by Filter") + f("Rows Removed by Index Recheck"))
                * f("Actual Loops");
    }
    for child in node
        .get("Plans")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        rows += rows_read(child);
    }
    rows
}

/// Sequential scans of the big tables anywhere in a Postgres plan.
fn seq_scans(node: &Value, out: &mut Vec<String>) {
    if node.get("Node Type").and_then(Value::as_str) == Some("Seq Scan") {
        let table = node["Relation Name"].as_str().unwrap_or("").to_string();
        if BIG_TABLES.contains(&table.as_str()) {
            out.push(table);
        }
    }
    for child in node
        .get("Plans")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        seq_scans(child, out);
    }
}

/// A Postgres plan as indented lines: node, index and table, rows and loops.
fn outline(node: &Value, depth: usize, out: &mut String) {
    let s = |k: &str| node.get(k).and_then(Value::as_str);
    let f = |k: &str| node.get(k).and_then(Value::as_f64).unwrap_or(0.0);
    out.push_str(&"  ".repeat(depth));
    out.push_str(s("Node Type").unwrap_or("?"));
    if let Some(index) = s("Index Name") {
        out.push_str(&format!(" using {index}"));
    }
    if let Some(table) = s("Relation Name") {
        out.push_str(&format!(" on {table} {}", s("Alias").unwrap_or("")));
    }
    out.push_str(&format!(
        " (rows={} loops={}",
        f("Actual Rows"),
        f("Actual Loops")
    ));
    if f("Rows Removed by Filter") > 0.0 {
        out.push_str(&format!(" removed={}", f("Rows Removed by Filter")));
    }
    out.push_str(")\n");
    for child in node
        .get("Plans")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        outline(child, depth + 1, out);
    }
}

/// With `TRAINYARD_SEARCH_PLANS=<dir>`, each shape's plans are appended to
/// `<dir>/<backend>.txt` (what `docs/search.md` shows).
fn record(shape: &str, plans: &[QueryPlan], backend: &str) {
    let Ok(dir) = std::env::var("TRAINYARD_SEARCH_PLANS") else {
        return;
    };
    let mut text = format!("## {shape}\n\n");
    for p in plans {
        text.push_str(&format!("{}\n", p.statement));
        if backend == "postgres" {
            let doc: Value = serde_json::from_str(&p.plan).expect("plan JSON");
            outline(&doc[0]["Plan"], 1, &mut text);
        } else {
            for line in p.plan.lines() {
                text.push_str(&format!("  {line}\n"));
            }
        }
        text.push('\n');
    }
    use std::io::Write as _;
    let path = std::path::Path::new(&dir).join(format!("{backend}.txt"));
    let mut file = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .expect("plans file");
    file.write_all(text.as_bytes()).expect("plans written");
}

fn check_plans(shape: &str, plans: &[QueryPlan], backend: &str) {
    assert!(!plans.is_empty(), "{shape}: no statement explained");
    record(shape, plans, backend);
    for p in plans {
        if backend == "postgres" {
            let doc: Value = serde_json::from_str(&p.plan).expect("plan JSON");
            let root = &doc[0]["Plan"];
            let mut scans = Vec::new();
            seq_scans(root, &mut scans);
            assert!(
                scans.is_empty(),
                "{shape}: sequential scan of {scans:?} in\n{}\n{}",
                p.statement,
                p.plan
            );
            let read = rows_read(root);
            assert!(
                read <= MOST_ROWS_READ,
                "{shape}: read {read} rows (at most {MOST_ROWS_READ}) in\n{}\n{}",
                p.statement,
                p.plan
            );
        } else {
            for line in p.plan.lines() {
                let line = line.trim();
                assert!(
                    !line.starts_with("SCAN ") && !line.contains("USE TEMP B-TREE"),
                    "{shape}: `{line}` in\n{}\n{}",
                    p.statement,
                    p.plan
                );
            }
        }
    }
}

/// Runs a shape's first page and, when `next`, its second, checking every statement.
async fn shape(
    store: &DynStore,
    phase: &str,
    name: &str,
    mut q: RunQuery,
    next: bool,
) -> Vec<String> {
    let name = &format!("{phase}: {name}");
    let backend = store.backend();
    let (page, plans) = store.explain_search(&q).await.expect(name);
    assert_eq!(page.runs.len(), q.limit, "{name}: a full first page");
    check_plans(name, &plans, backend);
    let mut ids: Vec<String> = page.runs.iter().map(|r| r.id.clone()).collect();
    if next {
        q.cursor = Some(page.next_cursor.expect("a next page"));
        let (second, plans) = store.explain_search(&q).await.expect(name);
        assert_eq!(second.runs.len(), q.limit, "{name}: a full second page");
        check_plans(&format!("{name}, next page"), &plans, backend);
        ids.extend(second.runs.iter().map(|r| r.id.clone()));
    }
    let unique: std::collections::HashSet<_> = ids.iter().collect();
    assert_eq!(unique.len(), ids.len(), "{name}: a run on two pages");
    ids
}

async fn every_shape(store: &DynStore, exp: &str, phase: &str) {
    let metric = || SortKey::Metric("loss".into());
    // The runs page as it opens, and its next page.
    shape(
        store,
        phase,
        "first page",
        query(exp, SortKey::CreatedAt, SortDir::Desc, None),
        true,
    )
    .await;
    // MLflow's search: one visible experiment, metric and param filter, ordered by the metric.
    let mut mlflow = query(
        exp,
        metric(),
        SortDir::Asc,
        Some("metrics.loss < 0.5 and params.lr = '0.001'"),
    );
    mlflow.experiment_id = None;
    mlflow.visible_experiments = Some(vec![exp.to_string()]);
    let ids = shape(store, phase, "mlflow filtered search", mlflow, true).await;
    for id in &ids {
        let run = store.get_run(id).await.expect("run");
        assert_eq!(run.params.get("lr").map(String::as_str), Some("0.001"));
        assert!(run.latest_metrics["loss"].value < 0.5);
        assert_eq!(run.experiment_id, exp);
    }
    // A filter on the sort metric that only its last runs pass: the walk starts at the bound.
    let high = query(exp, metric(), SortDir::Asc, Some("metrics.loss > 0.9"));
    for id in shape(store, phase, "sorted by the metric it filters", high, true).await {
        let run = store.get_run(&id).await.expect("run");
        assert!(run.latest_metrics["loss"].value > 0.9);
    }
    let filters = [
        ("filter by a metric", "metrics.loss < 0.5"),
        ("filter by a param", "params.lr = '0.001'"),
        ("filter by a numeric param", "params.layers >= 5"),
        ("filter by a tag", "tags.team = 'nlp'"),
    ];
    for (name, f) in filters {
        let q = query(exp, SortKey::CreatedAt, SortDir::Desc, Some(f));
        shape(store, phase, name, q, true).await;
    }
    let mut tagged = query(exp, SortKey::CreatedAt, SortDir::Desc, None);
    tagged.tag = Some("team=vision".into());
    shape(store, phase, "tag= parameter", tagged, true).await;
    for dir in [SortDir::Asc, SortDir::Desc] {
        let sorts = [
            ("sort by a metric", metric()),
            ("sort by a numeric param", SortKey::Param("lr".into())),
            ("sort by a text param", SortKey::Param("opt".into())),
            ("sort by name", SortKey::Name),
            ("sort by status", SortKey::Status),
        ];
        for (name, sort) in sorts {
            shape(
                store,
                phase,
                &format!("{name} {dir:?}"),
                query(exp, sort, dir, None),
                true,
            )
            .await;
        }
    }
    let mut sorted_filtered = query(exp, metric(), SortDir::Desc, Some("params.opt = 'sgd'"));
    sorted_filtered.limit = 10;
    // The compare page's ten runs: their tags, params and metrics are among the statements.
    shape(
        store,
        phase,
        "ten runs by a metric, filtered",
        sorted_filtered,
        false,
    )
    .await;
}

pub async fn every_search_shape_reads_its_page_not_the_experiment(store: DynStore) {
    let a = store.create_experiment("plans-a").await.expect("exp").id;
    let b = store.create_experiment("plans-b").await.expect("exp").id;
    load(&store, &a).await;
    load(&store, &b).await;
    // Whatever the store has gathered by itself so far, then with fresh statistics.
    every_shape(&store, &a, "as loaded").await;
    store.refresh_statistics().await.expect("statistics");
    every_shape(&store, &a, "analysed").await;
    every_shape(&store, &b, "analysed, the other experiment").await;
}
