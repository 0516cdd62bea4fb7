//! Tracking-server throughput through the real HTTP API (issue 2), on SQLite and Postgres.
//!
//! `cargo bench -p trainyard --bench ingest`
//!
//! Starts the application in-process on a loopback port, then measures:
//! - ingest: 4 concurrent clients, each with its own connection, posting batches of 1,000
//!   points (2,000,000 points in all by default). Clients 0 and 1 write two halves of one
//!   1,000,000-point series concurrently; clients 2 and 3 each write their own run.
//! - read-back: the same 4 clients reading every point back (full-resolution windows of
//!   100,000 steps, the most one request returns).
//! - the `max_points=1000` query over the 1,000,000-point series (median and p95).
//!
//! Environment: `TRAINYARD_BENCH_POINTS` (total points, default 2000000),
//! `TRAINYARD_BENCH_BACKENDS` (default `sqlite,postgres`), `TRAINYARD_BENCH_QUERY_REPEATS`
//! (default 50), `TEST_DATABASE_URL` (Postgres server; a fresh database is created and dropped).

#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a failed setup step is a failed test

#[allow(dead_code)]
#[path = "../tests/kit/mod.rs"]
mod kit;

use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context};
use tokio::sync::oneshot;
use trainer::wire::{MetricBatch, MetricPoint};
use trainyard::app::{Application, Settings};
use trainyard::store::{MetricKey, Series};

const CLIENTS: usize = 4;
const BATCH: usize = 1_000;
const READ_WINDOW: usize = 100_000;
const KEY: &str = "train/loss";

struct Outcome {
    backend: &'static str,
    points: usize,
    ingest: Duration,
    batch_p50: Duration,
    batch_p95: Duration,
    read: Duration,
    query_points: usize,
    query_median: Duration,
    query_p95: Duration,
    /// One-minute load average before and after (the machine may be shared).
    load: (String, String),
}

/// The one-minute load average, where the system reports one (Linux).
fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|l| l.split_whitespace().next().map(str::to_string))
        .unwrap_or_else(|| "n/a".into())
}

fn env_usize(name: &str, default: usize) -> anyhow::Result<usize> {
    match std::env::var(name) {
        Ok(v) => v
            .parse()
            .with_context(|| format!("{name} must be a positive integer, got `{v}`")),
        Err(_) => Ok(default),
    }
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let total = env_usize("TRAINYARD_BENCH_POINTS", 2_000_000)?;
    let repeats = env_usize("TRAINYARD_BENCH_QUERY_REPEATS", 50)?.max(1);
    // Whole batches for every client.
    let per_client = total / (CLIENTS * BATCH) * BATCH;
    ensure!(
        per_client > 0,
        "TRAINYARD_BENCH_POINTS must be at least {}",
        CLIENTS * BATCH
    );
    let backends =
        std::env::var("TRAINYARD_BENCH_BACKENDS").unwrap_or_else(|_| "sqlite,postgres".into());
    let mut outcomes = Vec::new();
    for backend in backends.split(',').map(str::trim) {
        let outcome = match backend {
            "sqlite" => on_sqlite(per_client, repeats).await?,
            "postgres" => on_postgres(per_client, repeats).await?,
            other => bail!("unknown backend `{other}` in TRAINYARD_BENCH_BACKENDS"),
        };
        print_row(&outcome, true);
        outcomes.push(outcome);
    }
    println!();
    print_header();
    for o in &outcomes {
        print_row(o, false);
    }
    Ok(())
}

async fn on_sqlite(per_client: usize, repeats: usize) -> anyhow::Result<Outcome> {
    let dir = tempfile::tempdir().context("creating a temporary data directory")?;
    run_backend("sqlite", None, dir.path(), per_client, repeats).await
}

async fn on_postgres(per_client: usize, repeats: usize) -> anyhow::Result<Outcome> {
    let db = kit::ScratchDb::create("trainyard_bench").await;
    let dir = tempfile::tempdir()?;
    run_backend(
        "postgres",
        Some(db.url.clone()),
        dir.path(),
        per_client,
        repeats,
    )
    .await
}

async fn run_backend(
    backend: &'static str,
    database_url: Option<String>,
    data_dir: &Path,
    per_client: usize,
    repeats: usize,
) -> anyhow::Result<Outcome> {
    let load_before = load_average();
    let addr = "127.0.0.1:0".parse()?;
    let mut settings = Settings::new(addr, data_dir);
    settings.database_url = database_url;
    let app = Application::build(settings).await?;
    let base = format!("http://127.0.0.1:{}", app.port());
    let (stop, stopped) = oneshot::channel::<()>();
    let server = tokio::spawn(app.run_until(async {
        let _ = stopped.await;
    }));
    eprintln!("[{backend}] server at {base}; {per_client} points per client");

    let http = client()?;
    let big = create_run(&http, &base, "bench-big").await?;
    let second = create_run(&http, &base, "bench-2").await?;
    let third = create_run(&http, &base, "bench-3").await?;
    // (run, first step) per client: clients 0 and 1 share the big series.
    let plan = [
        (big.clone(), 0),
        (big.clone(), per_client),
        (second, 0),
        (third, 0),
    ];

    // Bodies are serialized before the clock starts: the server is measured, not serde.
    let bodies: Vec<Vec<Vec<u8>>> = plan
        .iter()
        .map(|(_, first)| batches(*first, per_client))
        .collect::<anyhow::Result<_>>()?;
    eprintln!("[{backend}] ingesting {} points", CLIENTS * per_client);
    let started = Instant::now();
    let mut tasks = Vec::new();
    for ((run, _), client_bodies) in plan.iter().cloned().zip(bodies) {
        let base = base.clone();
        tasks.push(tokio::spawn(async move {
            post_all(&base, &run, client_bodies).await
        }));
    }
    let mut latencies = Vec::new();
    for t in tasks {
        latencies.extend(t.await??);
    }
    let ingest = started.elapsed();
    let keys: Vec<MetricKey> = get_json(&http, &format!("{base}/api/v1/runs/{big}/metric-keys"))
        .await
        .and_then(|v: serde_json::Value| Ok(serde_json::from_value(v["keys"].clone())?))?;
    let stored = keys.iter().find(|k| k.key == KEY).map_or(0, |k| k.count);
    ensure!(
        stored as usize == 2 * per_client,
        "big series holds {stored} points, expected {}",
        2 * per_client
    );

    eprintln!("[{backend}] reading back");
    let started = Instant::now();
    let mut tasks = Vec::new();
    for (run, first) in plan.iter().cloned() {
        let base = base.clone();
        tasks.push(tokio::spawn(async move {
            read_all(&base, &run, first, per_client).await
        }));
    }
    for t in tasks {
        let read = t.await??;
        ensure!(
            read == per_client,
            "read back {read} points, expected {per_client}"
        );
    }
    let read = started.elapsed();

    eprintln!("[{backend}] max_points=1000 over {} points", 2 * per_client);
    let url = format!("{base}/api/v1/runs/{big}/metrics?key={KEY}&max_points=1000");
    let mut times = Vec::new();
    let mut query_points = 0;
    for i in 0..repeats + 3 {
        let t = Instant::now();
        let series: Series = get_json(&http, &url).await?;
        let elapsed = t.elapsed();
        ensure!(
            series.total as usize == 2 * per_client && series.points.len() <= 1000,
            "downsampled read returned {} of {} points",
            series.points.len(),
            series.total
        );
        query_points = series.points.len();
        // The first few warm caches and connections.
        if i >= 3 {
            times.push(elapsed);
        }
    }
    let _ = stop.send(());
    server.await??;
    latencies.sort();
    times.sort();
    Ok(Outcome {
        backend,
        points: CLIENTS * per_client,
        ingest,
        batch_p50: percentile(&latencies, 0.50),
        batch_p95: percentile(&latencies, 0.95),
        read,
        query_points,
        query_median: percentile(&times, 0.50),
        query_p95: percentile(&times, 0.95),
        load: (load_before, load_average()),
    })
}

fn client() -> anyhow::Result<reqwest::Client> {
    Ok(reqwest::Client::builder()
        .timeout(Duration::from_secs(120))
        .build()?)
}

async fn create_run(http: &reqwest::Client, base: &str, name: &str) -> anyhow::Result<String> {
    let resp = http
        .post(format!("{base}/api/v1/runs"))
        .json(&serde_json::json!({ "experiment": "bench", "name": name }))
        .send()
        .await?;
    ensure!(
        resp.status().is_success(),
        "creating a run: {}",
        resp.status()
    );
    let body: serde_json::Value = resp.json().await?;
    body["id"]
        .as_str()
        .map(str::to_string)
        .context("run response has no id")
}

/// A loss-like curve with noise, so values are not trivially compressible.
fn value(step: usize) -> f64 {
    let s = step as f64;
    2.0 + 8.0 * (-s / 200_000.0).exp() + 0.05 * (s * 0.37).sin()
}

fn batches(first: usize, count: usize) -> anyhow::Result<Vec<Vec<u8>>> {
    let t0 = 1_760_000_000_000_i64;
    (first..first + count)
        .step_by(BATCH)
        .map(|start| {
            let points = (start..start + BATCH)
                .map(|step| MetricPoint {
                    key: KEY.to_string(),
                    step: step as i64,
                    value: value(step),
                    time: Some(t0 + step as i64),
                })
                .collect();
            Ok(serde_json::to_vec(&MetricBatch { points })?)
        })
        .collect()
}

async fn post_all(base: &str, run: &str, bodies: Vec<Vec<u8>>) -> anyhow::Result<Vec<Duration>> {
    let http = client()?;
    let url = format!("{base}/api/v1/runs/{run}/metrics");
    let mut latencies = Vec::with_capacity(bodies.len());
    for body in bodies {
        let t = Instant::now();
        let resp = http
            .post(&url)
            .header("content-type", "application/json")
            .body(body)
            .send()
            .await?;
        let status = resp.status();
        let text = resp.text().await?;
        ensure!(status.is_success(), "posting a batch: {status}: {text}");
        latencies.push(t.elapsed());
    }
    Ok(latencies)
}

async fn read_all(base: &str, run: &str, first: usize, count: usize) -> anyhow::Result<usize> {
    let http = client()?;
    let mut read = 0;
    for start in (first..first + count).step_by(READ_WINDOW) {
        let end = (start + READ_WINDOW).min(first + count) - 1;
        let url = format!(
            "{base}/api/v1/runs/{run}/metrics?key={KEY}&max_points={READ_WINDOW}&start_step={start}&end_step={end}"
        );
        let series: Series = get_json(&http, &url).await?;
        ensure!(!series.downsampled, "a window read was downsampled");
        read += series.points.len();
    }
    Ok(read)
}

async fn get_json<T: serde::de::DeserializeOwned>(
    http: &reqwest::Client,
    url: &str,
) -> anyhow::Result<T> {
    let resp = http.get(url).send().await?;
    let status = resp.status();
    ensure!(status.is_success(), "GET {url}: {status}");
    Ok(resp.json().await?)
}

fn percentile(sorted: &[Duration], q: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let idx = ((sorted.len() - 1) as f64 * q).round() as usize;
    sorted[idx.min(sorted.len() - 1)]
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

fn print_header() {
    println!(
        "| backend  | points    | ingest points/s | ingest s | batch p50 / p95 ms | read points/s | read s | max_points=1000 median / p95 ms | load before / after |"
    );
    println!("|---|---|---|---|---|---|---|---|---|");
}

fn print_row(o: &Outcome, progress: bool) {
    let pps = |d: Duration| o.points as f64 / d.as_secs_f64();
    let row = format!(
        "| {:<8} | {:>9} | {:>15.0} | {:>8.2} | {:>7.1} / {:<7.1} | {:>13.0} | {:>6.2} | {:.1} / {:.1} ({} points) | {} / {} |",
        o.backend,
        o.points,
        pps(o.ingest),
        o.ingest.as_secs_f64(),
        ms(o.batch_p50),
        ms(o.batch_p95),
        pps(o.read),
        o.read.as_secs_f64(),
        ms(o.query_median),
        ms(o.query_p95),
        o.query_points,
        o.load.0,
        o.load.1,
    );
    if progress {
        eprintln!("{row}");
    } else {
        println!("{row}");
    }
}
