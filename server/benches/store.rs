//! Store benchmark: ingest with 4 concurrent writers and 1,000-point batches, read-back, and a
//! `max_points = 1000` read of a 1,000,000-point series, on SQLite and on Postgres.
//!
//! `cargo bench -p trainyard --bench store --profile dev` (Postgres from `TEST_DATABASE_URL`, default
//! `postgres://postgres@127.0.0.1:5432/postgres`; a scratch database is created and dropped).

#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a failed setup step is a failed test

#[allow(dead_code)]
#[path = "../tests/kit/mod.rs"]
mod kit;

use std::time::{Duration, Instant};
use trainyard::store::{self, DynStore, MetricPoint, NewRun, RunQuery, SortDir, SortKey};

const WRITERS: usize = 4;
const BATCH: usize = 1_000;
const BATCHES_PER_WRITER: usize = 100;
const SERIES_POINTS: i64 = 1_000_000;

async fn run_id(store: &DynStore) -> String {
    store
        .create_run(NewRun {
            experiment_id: "0".into(),
            ..Default::default()
        })
        .await
        .expect("run")
        .id
}

async fn ingest(store: &DynStore) -> f64 {
    let started = Instant::now();
    let mut tasks = Vec::new();
    for _ in 0..WRITERS {
        let store = store.clone();
        tasks.push(tokio::spawn(async move {
            let id = run_id(&store).await;
            for b in 0..BATCHES_PER_WRITER as i64 {
                // 10 keys x 100 steps: what a trainer logging 10 metrics sends.
                let points: Vec<MetricPoint> = (0..BATCH as i64)
                    .map(|i| MetricPoint {
                        key: format!("metric/{}", i % 10),
                        step: b * 100 + i / 10,
                        value: (i as f64).sin(),
                        time: Some(i),
                    })
                    .collect();
                store.append_points(&id, &points, 0).await.expect("append");
            }
            id
        }));
    }
    for t in tasks {
        t.await.expect("writer");
    }
    (WRITERS * BATCHES_PER_WRITER * BATCH) as f64 / started.elapsed().as_secs_f64()
}

async fn series(store: &DynStore) -> (String, Duration) {
    let id = run_id(store).await;
    let started = Instant::now();
    for b in 0..SERIES_POINTS / BATCH as i64 {
        let points: Vec<MetricPoint> = (0..BATCH as i64)
            .map(|i| {
                let step = b * BATCH as i64 + i;
                MetricPoint {
                    key: "train/loss".into(),
                    step,
                    value: 10.0 / (2.0 + step as f64).ln()
                        + if step % 9_973 == 0 { 5.0 } else { 0.0 },
                    time: Some(step),
                }
            })
            .collect();
        store.append_points(&id, &points, 0).await.expect("append");
    }
    (id, started.elapsed())
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

async fn search(store: &DynStore) {
    let backend = store.backend();
    let mut tasks = Vec::new();
    for w in 0..4 {
        let store = store.clone();
        tasks.push(tokio::spawn(async move {
            for i in 0..2_500 {
                let run = store
                    .create_run(NewRun {
                        experiment_id: "0".into(),
                        config: Some(
                            serde_json::json!({"training": {"lr": (i % 7) as f64 * 1e-4}}),
                        ),
                        ..Default::default()
                    })
                    .await
                    .expect("run");
                let p = MetricPoint {
                    key: "val/loss".into(),
                    step: 1,
                    value: ((w * 2_500 + i) % 97) as f64,
                    time: None,
                };
                store.append_points(&run.id, &[p], 0).await.expect("point");
            }
        }));
    }
    for t in tasks {
        t.await.expect("creator");
    }
    let filter = trainyard::store::filter::Filter::parse(
        "metrics.val/loss < 50 and params.training.lr > 0.0002",
    )
    .expect("filter");
    for (label, sort, filter) in [
        ("created_at desc", SortKey::CreatedAt, None),
        (
            "metric val/loss desc",
            SortKey::Metric("val/loss".into()),
            None,
        ),
        (
            "param training.lr desc",
            SortKey::Param("training.lr".into()),
            None,
        ),
        (
            "created_at desc + q filter",
            SortKey::CreatedAt,
            Some(filter),
        ),
    ] {
        let mut q = RunQuery {
            experiment_id: None,
            status: None,
            tag: None,
            filter,
            sort,
            dir: SortDir::Desc,
            limit: 100,
            cursor: None,
            visible_experiments: None,
            lifecycle: Default::default(),
        };
        let mut times = Vec::new();
        for _ in 0..10 {
            let t = Instant::now();
            let page = store.search_runs(&q).await.expect("search");
            times.push(t.elapsed().as_secs_f64() * 1e3);
            q.cursor = page.next_cursor;
        }
        println!(
            "{backend}: search 10,000 runs, 100-run pages, {label}: median {:.1} ms, max {:.1} ms",
            median(times.clone()),
            times.iter().cloned().fold(0.0, f64::max)
        );
    }
}

async fn bench(store: DynStore) {
    let backend = store.backend();
    search(&store).await;
    let ingest_rate = ingest(&store).await;
    println!(
        "{backend}: ingest {WRITERS} writers x {BATCH}-point batches: {ingest_rate:.0} points/s"
    );

    let (id, took) = series(&store).await;
    println!(
        "{backend}: 1,000,000-point series written in {:.1} s ({:.0} points/s, 1 writer)",
        took.as_secs_f64(),
        SERIES_POINTS as f64 / took.as_secs_f64()
    );

    let mut read = 0usize;
    let started = Instant::now();
    let mut after = None;
    loop {
        let page = store
            .points_since(&id, after, None, 50_000)
            .await
            .expect("read");
        let Some(last) = page.last() else { break };
        after = Some(last.seq);
        read += page.len();
    }
    let rate = read as f64 / started.elapsed().as_secs_f64();
    println!(
        "{backend}: read-back of {read} points (points_since pages of 50,000): {rate:.0} points/s"
    );

    let raw = Instant::now();
    let all = store
        .read_series(&id, "train/loss", None, None, 2_000_000)
        .await
        .expect("raw");
    let raw_rate = all.points.len() as f64 / raw.elapsed().as_secs_f64();
    println!(
        "{backend}: read_series of all {} points: {raw_rate:.0} points/s",
        all.points.len()
    );

    for (label, start, end) in [
        ("whole series", None, None),
        ("steps 123,457..=876,543", Some(123_457), Some(876_543)),
    ] {
        let mut times = Vec::new();
        for _ in 0..21 {
            let t = Instant::now();
            let s = store
                .read_series(&id, "train/loss", start, end, 1_000)
                .await
                .expect("downsampled");
            times.push(t.elapsed().as_secs_f64() * 1e3);
            assert!(s.downsampled && s.points.len() <= 1_000);
        }
        println!(
            "{backend}: max_points=1000 over 1M points, {label}: median {:.2} ms, max {:.2} ms",
            median(times.clone()),
            times.iter().cloned().fold(0.0, f64::max)
        );
    }
}

#[tokio::main]
async fn main() {
    let dir = tempfile::tempdir().expect("temp dir");
    let url = format!("sqlite://{}", dir.path().join("bench.db").display());
    bench(store::connect(&url).await.expect("sqlite")).await;

    let db = kit::ScratchDb::create("trainyard_bench").await;
    let store = store::connect(&db.url).await.expect("postgres");
    bench(store.clone()).await;
    drop(store);
}
