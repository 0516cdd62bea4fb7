//! Metrics reporting: `DIR/metrics.jsonl` always, and with a server, a background thread that
//! posts batches to the metric API at least once per `logging.flush_interval_ms`.
//!
//! The training thread never waits on the network: it hands lines to the reporter thread over a
//! channel. When a post fails the batch is spooled to `DIR/spool/NNNNNNNNNNNN.json`; while the
//! spool is non-empty new batches join its tail, so points reach the server in step order once
//! it is back. The server's API is idempotent on (run, key, step), so a batch resent after a lost
//! response is not doubled.

use std::fs::{self, File, OpenOptions};
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender};
use std::thread::JoinHandle;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{Context, Result};

use crate::wire::{MetricBatch, MetricPoint, MetricsLine, RunPatch, RunStatus};

mod spool;
#[cfg(test)]
mod tests;

use spool::Spool;

/// Unix time in milliseconds.
pub fn unix_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

/// Where and how to reach the tracking server.
#[derive(Debug, Clone)]
pub struct ServerTarget {
    /// Base URL, e.g. `http://127.0.0.1:8080`.
    pub url: String,
    pub run_id: String,
    /// Bearer token (from `TRAINYARD_TOKEN`).
    pub token: Option<String>,
    /// Longest time points wait before being sent.
    pub flush_interval: Duration,
    /// Longest time the final flush may take at exit.
    pub final_flush_timeout: Duration,
}

/// Writes every step's metrics to `metrics.jsonl` and forwards them to the server if any.
pub struct Reporter {
    jsonl: File,
    remote: Option<Remote>,
}

struct Remote {
    tx: Sender<Msg>,
    handle: JoinHandle<()>,
}

enum Msg {
    Points(Vec<MetricPoint>),
    Patch(RunPatch),
    /// Final flush, then exit.
    Finish(RunPatch),
}

impl Reporter {
    /// Opens `DIR/metrics.jsonl`. `keep_until` (a resumed run's step) drops lines after that step
    /// first, so the file holds one line per step; `None` starts the file afresh.
    pub fn open(dir: &Path, keep_until: Option<i64>, server: Option<ServerTarget>) -> Result<Self> {
        fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        let path = dir.join("metrics.jsonl");
        match keep_until {
            Some(step) => truncate_after(&path, step)?,
            None => {
                File::create(&path).with_context(|| format!("creating {}", path.display()))?;
            }
        }
        let jsonl = OpenOptions::new()
            .create(true)
            .append(true)
            .open(&path)
            .with_context(|| format!("opening {}", path.display()))?;
        let remote = match server {
            Some(target) => Some(Remote::spawn(target, dir.join("spool"))?),
            None => None,
        };
        Ok(Reporter { jsonl, remote })
    }

    /// Records one step's metrics (non-finite values are skipped: the API refuses them).
    pub fn log(&mut self, line: &MetricsLine) -> Result<()> {
        let mut line = line.clone();
        line.metrics.retain(|_, v| v.is_finite());
        let mut text = serde_json::to_string(&line)?;
        text.push('\n');
        self.jsonl
            .write_all(text.as_bytes())
            .context("writing metrics.jsonl")?;
        self.jsonl.flush().context("flushing metrics.jsonl")?;
        if let Some(remote) = &self.remote {
            // A dead reporter thread must not stop training: metrics.jsonl still has the data.
            let _ = remote.tx.send(Msg::Points(line.to_points()));
        }
        Ok(())
    }

    /// Sends a run update (status `running` and the resolved config at start).
    pub fn patch(&self, patch: RunPatch) {
        if let Some(remote) = &self.remote {
            let _ = remote.tx.send(Msg::Patch(patch));
        }
    }

    /// Flushes everything (bounded by the final-flush timeout) and reports the final status.
    pub fn finish(self, status: RunStatus, reason: Option<String>) {
        if let Some(remote) = self.remote {
            let patch = RunPatch {
                status: Some(status),
                reason,
                ..RunPatch::default()
            };
            let _ = remote.tx.send(Msg::Finish(patch));
            if remote.handle.join().is_err() {
                tracing::error!("metrics reporter thread panicked");
            }
        }
    }
}

/// Rewrites `path` keeping only lines for steps <= `step` (atomically: temp file + rename).
fn truncate_after(path: &Path, step: i64) -> Result<()> {
    let Ok(file) = File::open(path) else {
        return Ok(());
    };
    let tmp = path.with_extension("jsonl.tmp");
    let mut out = File::create(&tmp).with_context(|| format!("creating {}", tmp.display()))?;
    for line in BufReader::new(file).lines() {
        let line = line?;
        match serde_json::from_str::<MetricsLine>(&line) {
            Ok(parsed) if parsed.step <= step => writeln!(out, "{line}")?,
            _ => {}
        }
    }
    out.sync_all()?;
    fs::rename(&tmp, path)?;
    Ok(())
}

impl Remote {
    fn spawn(target: ServerTarget, spool_dir: PathBuf) -> Result<Self> {
        fs::create_dir_all(&spool_dir)
            .with_context(|| format!("creating {}", spool_dir.display()))?;
        let client = reqwest::blocking::Client::builder()
            .connect_timeout(Duration::from_secs(2))
            .timeout(Duration::from_secs(10))
            .build()
            .context("building the HTTP client")?;
        let (tx, rx) = mpsc::channel();
        let mut sender = Worker::new(client, target, spool_dir)?;
        let handle = std::thread::Builder::new()
            .name("metrics-reporter".into())
            .spawn(move || sender.run(rx))
            .context("starting the metrics reporter thread")?;
        Ok(Remote { tx, handle })
    }
}

/// The reporter thread's state.
struct Worker {
    client: reqwest::blocking::Client,
    target: ServerTarget,
    spool: Spool,
    pending: Vec<MetricPoint>,
    patches: Vec<RunPatch>,
    /// After a failure, wait before trying again so a down server costs little.
    retry_at: Option<Instant>,
}

enum Outcome {
    Sent,
    /// The server refused the request for good (4xx): retrying cannot help.
    Rejected(String),
    /// Unreachable or a server error: try again later.
    Retry(String),
}

impl Worker {
    fn new(client: reqwest::blocking::Client, target: ServerTarget, dir: PathBuf) -> Result<Self> {
        Ok(Worker {
            client,
            target,
            spool: Spool::open(dir)?,
            pending: Vec::new(),
            patches: Vec::new(),
            retry_at: None,
        })
    }

    fn run(&mut self, rx: Receiver<Msg>) {
        let interval = self.target.flush_interval.max(Duration::from_millis(10));
        let mut next_flush = Instant::now() + interval;
        loop {
            let wait = next_flush.saturating_duration_since(Instant::now());
            match rx.recv_timeout(wait) {
                Ok(Msg::Points(points)) => self.pending.extend(points),
                Ok(Msg::Patch(patch)) => self.patches.push(patch),
                Ok(Msg::Finish(patch)) => {
                    self.final_flush(patch);
                    return;
                }
                Err(RecvTimeoutError::Timeout) => {}
                Err(RecvTimeoutError::Disconnected) => {
                    // The trainer dropped its reporter without finishing: still flush what we have.
                    let deadline = Instant::now() + self.target.final_flush_timeout;
                    self.flush(Some(deadline));
                    return;
                }
            }
            if Instant::now() >= next_flush {
                self.flush(None);
                next_flush = Instant::now() + interval;
            }
        }
    }

    /// Sends queued patches, then the spool in order, then the pending points.
    fn flush(&mut self, deadline: Option<Instant>) {
        if deadline.is_none() {
            if let Some(at) = self.retry_at {
                if Instant::now() < at {
                    self.spool_pending();
                    return;
                }
            }
        }
        self.retry_at = None;
        while let Some(patch) = self.patches.first() {
            match self.send_patch(patch) {
                Outcome::Sent => {
                    self.patches.remove(0);
                }
                Outcome::Rejected(why) => {
                    tracing::warn!(%why, "server refused a run update");
                    self.patches.remove(0);
                }
                Outcome::Retry(why) => {
                    self.backoff(&why);
                    break;
                }
            }
        }
        if self.retry_at.is_none() {
            self.drain_spool(deadline);
        }
        if self.retry_at.is_none() && self.spool.is_empty() && !self.pending.is_empty() {
            let batch = MetricBatch {
                points: std::mem::take(&mut self.pending),
            };
            match self.send_batch(&batch) {
                Outcome::Sent => {}
                Outcome::Rejected(why) => {
                    tracing::error!(%why, points = batch.points.len(), "server refused metrics");
                }
                Outcome::Retry(why) => {
                    self.backoff(&why);
                    self.pending = batch.points;
                }
            }
        }
        self.spool_pending();
    }

    /// Moves unsent points to the spool so they survive a crash and keep their order.
    fn spool_pending(&mut self) {
        if self.pending.is_empty() {
            return;
        }
        let batch = MetricBatch {
            points: std::mem::take(&mut self.pending),
        };
        if let Err(e) = self.spool.push(&batch) {
            tracing::error!(error = %e, "could not spool metrics; keeping them in memory");
            self.pending = batch.points;
        }
    }

    fn drain_spool(&mut self, deadline: Option<Instant>) {
        while let Some((path, batch)) = self.spool.oldest() {
            if deadline.is_some_and(|d| Instant::now() >= d) {
                return;
            }
            match self.send_batch(&batch) {
                Outcome::Sent => self.spool.remove(&path),
                Outcome::Rejected(why) => {
                    tracing::error!(%why, file = %path.display(), "server refused spooled metrics; moved aside");
                    self.spool.reject(&path);
                }
                Outcome::Retry(why) => {
                    self.backoff(&why);
                    return;
                }
            }
        }
    }

    fn backoff(&mut self, why: &str) {
        tracing::warn!(%why, "metrics server unreachable; spooling to disk");
        self.retry_at =
            Some(Instant::now() + self.target.flush_interval.max(Duration::from_millis(250)));
    }

    fn final_flush(&mut self, status: RunPatch) {
        let deadline = Instant::now() + self.target.final_flush_timeout;
        self.patches.push(status);
        loop {
            self.retry_at = None;
            self.flush(Some(deadline));
            let done = self.patches.is_empty() && self.spool.is_empty() && self.pending.is_empty();
            if done || Instant::now() >= deadline {
                break;
            }
            std::thread::sleep(Duration::from_millis(200));
        }
        if !self.spool.is_empty() {
            tracing::warn!(
                dir = %self.spool.dir.display(),
                "some metrics could not be sent; they stay spooled and are resent when this run is resumed"
            );
        }
    }

    fn authorized(
        &self,
        req: reqwest::blocking::RequestBuilder,
    ) -> reqwest::blocking::RequestBuilder {
        match &self.target.token {
            Some(token) => req.bearer_auth(token),
            None => req,
        }
    }

    fn send_batch(&self, batch: &MetricBatch) -> Outcome {
        let url = format!(
            "{}/api/v1/runs/{}/metrics",
            self.target.url.trim_end_matches('/'),
            self.target.run_id
        );
        outcome(self.authorized(self.client.post(url)).json(batch).send())
    }

    fn send_patch(&self, patch: &RunPatch) -> Outcome {
        let url = format!(
            "{}/api/v1/runs/{}",
            self.target.url.trim_end_matches('/'),
            self.target.run_id
        );
        outcome(self.authorized(self.client.patch(url)).json(patch).send())
    }
}

fn outcome(res: reqwest::Result<reqwest::blocking::Response>) -> Outcome {
    match res {
        Ok(resp) if resp.status().is_success() => Outcome::Sent,
        Ok(resp) => {
            let status = resp.status();
            let body = resp.text().unwrap_or_default();
            let why = format!("HTTP {status}: {body}");
            // 408 and 429 are "try later"; other 4xx mean this request will never be accepted.
            if status.is_client_error() && status.as_u16() != 408 && status.as_u16() != 429 {
                Outcome::Rejected(why)
            } else {
                Outcome::Retry(why)
            }
        }
        Err(e) => Outcome::Retry(e.to_string()),
    }
}
