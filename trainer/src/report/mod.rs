//! Metrics reporting: `DIR/metrics.jsonl` always, and with a server, a background thread that
//! posts batches to the metric API at least once per `logging.flush_interval_ms`.
//!
//! The training thread never waits on the network: it hands lines to the reporter thread over a
//! channel. When a post fails the batch is spooled to `DIR/spool/NNNNNNNNNNNN.json`; while the
//! spool is non-empty new batches join its tail, so points reach the server in step order once
//! it is back. The server's API is idempotent on (run, key, step), so a batch resent after a lost
//! response is not doubled.
//!
//! No request carries more than the server's [`MAX_POINTS_PER_BATCH`] points: however long the
//! flush interval, pending points go out in batches of at most that many. A batch the server
//! still refuses for its size (413, or 422 on the `points` field) is split and sent again,
//! never dropped.
//!
//! Beside it a heartbeat thread tells the server every `logging.heartbeat_interval_secs` that
//! the run is alive (`server.rs`), so a killed trainer's run does not stay `running`.

use std::fs::{self, File, OpenOptions};
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};

use crate::wire::{
    MetricBatch, MetricPoint, MetricsLine, RunPatch, RunStatus, MAX_POINTS_PER_BATCH,
    MAX_REASON_LEN,
};

mod server;
mod spool;
#[cfg(test)]
mod tests;

use server::Heartbeat;
pub use server::{create_run, run_page, NewRun};
use spool::Spool;

pub use crate::wire::unix_ms;

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
    /// Time between heartbeats (`logging.heartbeat_interval_secs`).
    pub heartbeat_interval: Duration,
}

/// Writes every step's metrics to `metrics.jsonl` and forwards them to the server if any.
pub struct Reporter {
    jsonl: File,
    /// The text of the line being written, reused from step to step.
    text: Vec<u8>,
    remote: Option<Remote>,
}

struct Remote {
    tx: Sender<Msg>,
    handle: JoinHandle<()>,
    heartbeat: Option<Heartbeat>,
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
        Ok(Reporter {
            jsonl,
            text: Vec::new(),
            remote,
        })
    }

    /// Records one step's metrics (non-finite values are skipped: the API refuses them).
    pub fn log(&mut self, line: &MetricsLine) -> Result<()> {
        // Called every step: the line is copied only when it has values to drop, and its text
        // goes through one buffer kept across steps, written with one system call.
        let filtered;
        let line = if line.metrics.values().all(|v| v.is_finite()) {
            line
        } else {
            let mut copy = line.clone();
            copy.metrics.retain(|_, v| v.is_finite());
            filtered = copy;
            &filtered
        };
        self.text.clear();
        serde_json::to_writer(&mut self.text, line)?;
        self.text.push(b'\n');
        self.jsonl
            .write_all(&self.text)
            .context("writing metrics.jsonl")?;
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
            if let Some(heartbeat) = remote.heartbeat {
                heartbeat.stop();
            }
            let patch = RunPatch {
                status: Some(status),
                // A longer reason would be refused, and the final status with it.
                reason: reason.map(|r| shorten(r, MAX_REASON_LEN)),
                ..RunPatch::default()
            };
            let _ = remote.tx.send(Msg::Finish(patch));
            if remote.handle.join().is_err() {
                tracing::error!("metrics reporter thread panicked");
            }
        }
    }
}

/// `text` cut to at most `max` bytes at a character boundary, marked with `…` when cut.
fn shorten(mut text: String, max: usize) -> String {
    if text.len() <= max {
        return text;
    }
    let mut end = max.saturating_sub('…'.len_utf8());
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    text.truncate(end);
    text.push('…');
    text
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
        let mut sender = Worker::new(client, target.clone(), spool_dir)?;
        let handle = std::thread::Builder::new()
            .name("metrics-reporter".into())
            .spawn(move || sender.run(rx))
            .context("starting the metrics reporter thread")?;
        // Without heartbeats the run still reports; the server just cannot tell it is alive.
        let heartbeat = match Heartbeat::spawn(&target) {
            Ok(h) => Some(h),
            Err(e) => {
                tracing::warn!("sending no heartbeats: {e:#}");
                None
            }
        };
        Ok(Remote {
            tx,
            handle,
            heartbeat,
        })
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
    /// Points per request: the server's limit, halved each time it refuses a batch as too large.
    batch_limit: usize,
}

enum Outcome {
    Sent,
    /// The server refused the request for good (4xx): retrying cannot help.
    Rejected(String),
    /// The server refused the batch for its size: smaller batches will pass.
    TooLarge(String),
    /// Unreachable or a server error: try again later.
    Retry(String),
}

/// What sending a run of points achieved.
struct Delivery {
    /// Points dealt with, from the start: sent, or refused for good.
    done: usize,
    /// Why a batch was refused for good, per refused batch.
    refused: Vec<String>,
    /// Set when sending stopped early: the points from `done` on are still to be sent.
    retry: Option<String>,
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
            batch_limit: MAX_POINTS_PER_BATCH,
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
                // A run update is small: "too large" means refused for good here too.
                Outcome::Rejected(why) | Outcome::TooLarge(why) => {
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
            let points = std::mem::take(&mut self.pending);
            let delivery = self.send_points(&points);
            for why in &delivery.refused {
                tracing::error!(%why, "server refused metrics");
            }
            if let Some(why) = delivery.retry {
                self.backoff(&why);
                self.pending = points[delivery.done..].to_vec();
            }
        }
        self.spool_pending();
    }

    /// Sends `points` in order, in batches the server accepts. Stops at the first batch that
    /// must wait (server unreachable); a batch refused for its size is split, never dropped.
    fn send_points(&mut self, points: &[MetricPoint]) -> Delivery {
        let mut delivery = Delivery {
            done: 0,
            refused: Vec::new(),
            retry: None,
        };
        while delivery.done < points.len() {
            let end = points.len().min(delivery.done + self.batch_limit);
            let batch = MetricBatch {
                points: points[delivery.done..end].to_vec(),
            };
            match self.send_batch(&batch) {
                Outcome::Sent => delivery.done = end,
                Outcome::Rejected(why) => {
                    delivery
                        .refused
                        .push(format!("{why} ({} points)", end - delivery.done));
                    delivery.done = end;
                }
                Outcome::TooLarge(why) if batch.points.len() > 1 => {
                    self.batch_limit = (batch.points.len() / 2).max(1);
                    tracing::warn!(%why, limit = self.batch_limit, "server refused a batch as too large; splitting it");
                }
                Outcome::TooLarge(why) => {
                    delivery.refused.push(why);
                    delivery.done = end;
                }
                Outcome::Retry(why) => {
                    delivery.retry = Some(why);
                    break;
                }
            }
        }
        delivery
    }

    /// Moves unsent points to the spool so they survive a crash and keep their order (in files
    /// of at most one batch each).
    fn spool_pending(&mut self) {
        while !self.pending.is_empty() {
            let take = self.pending.len().min(MAX_POINTS_PER_BATCH);
            let batch = MetricBatch {
                points: self.pending[..take].to_vec(),
            };
            if let Err(e) = self.spool.push(&batch) {
                tracing::error!(error = %e, "could not spool metrics; keeping them in memory");
                return;
            }
            self.pending.drain(..take);
        }
    }

    fn drain_spool(&mut self, deadline: Option<Instant>) {
        while let Some((path, batch)) = self.spool.oldest() {
            if deadline.is_some_and(|d| Instant::now() >= d) {
                return;
            }
            // A file may hold more than one batch (written by an older reporter): the points
            // go out in accepted sizes, and a resend after a partial delivery doubles nothing.
            let delivery = self.send_points(&batch.points);
            if let Some(why) = delivery.retry {
                self.backoff(&why);
                return;
            }
            if delivery.refused.is_empty() {
                self.spool.remove(&path);
            } else {
                let why = delivery.refused.join("; ");
                tracing::error!(%why, file = %path.display(), "server refused spooled metrics; moved aside");
                self.spool.reject(&path);
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
        // Everything else first, the final status last: a watcher that sees `finished` must
        // find every step (a flush sends queued patches before points, so the status waits).
        self.flush_until(deadline);
        self.patches.push(status);
        self.flush_until(deadline);
        if !self.spool.is_empty() {
            tracing::warn!(
                dir = %self.spool.dir.display(),
                "some metrics could not be sent; they stay spooled and are resent when this run is resumed"
            );
        }
    }

    /// Flushes until nothing is queued or `deadline` passed (at least one attempt).
    fn flush_until(&mut self, deadline: Instant) {
        loop {
            self.retry_at = None;
            self.flush(Some(deadline));
            let done = self.patches.is_empty() && self.spool.is_empty() && self.pending.is_empty();
            if done || Instant::now() >= deadline {
                return;
            }
            std::thread::sleep(Duration::from_millis(200));
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
            if refused_for_size(status.as_u16(), &body) {
                return Outcome::TooLarge(why);
            }
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

/// 413, or the server's 422 naming the batch's `points` as a whole (a bad point is named
/// `points[i].field`): the same points in smaller batches will be accepted.
fn refused_for_size(status: u16, body: &str) -> bool {
    if status == 413 {
        return true;
    }
    status == 422
        && serde_json::from_str::<serde_json::Value>(body)
            .is_ok_and(|v| v["error"]["field"] == "points")
}
