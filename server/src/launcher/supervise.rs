//! Dispatching queued runs and supervising each one until it ends: spawn, watch (exit, logs,
//! system metrics), decide the final status, restart failed attempts.

use super::logs::{LogEvent, Tailer};
use super::process::{self, LaunchRecord, Outcome, ProcessRecord, SpawnSpec};
use super::queue::Assignment;
use super::sysmetrics::Sampler;
use super::{Active, Inner, STOP_FILE};
use crate::store::{ExitInfo, RunStatus, MAX_POINTS_PER_BATCH};
use trainer::wire::MetricsLine;

/// The trainer's own record of every step (written before the step is sent).
const METRICS_FILE: &str = "metrics.jsonl";
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

/// Log lines kept on a failed run's exit info, and at most this many bytes of them (the exit
/// info shows in every run listing; one runaway line must not make it huge).
pub(crate) const TAIL_LINES: usize = 20;
pub(crate) const TAIL_BYTES: usize = 4 * 1024;
pub(crate) const LOG_POLL: Duration = Duration::from_millis(200);

/// Starts queued runs whenever slots free up; runs for the server's lifetime.
pub(crate) async fn dispatch_loop(inner: Arc<Inner>) {
    loop {
        // Popped and marked active under one lock: a stop never finds the run in neither place.
        let next = {
            let mut st = inner.state();
            let next = st.sched.pop_next();
            if let Some((run_id, _)) = &next {
                st.active.insert(run_id.clone(), Active::default());
            }
            next
        };
        match next {
            Some((run_id, assignment)) => {
                // Wait until this run's process is up and recorded as running before starting
                // the next one, so start order (and the event log) is exactly queue order.
                let (started, is_up) = tokio::sync::oneshot::channel();
                tokio::spawn(supervise(
                    inner.clone(),
                    run_id,
                    assignment,
                    None,
                    Some(started),
                ));
                let _ = is_up.await;
            }
            None => inner.wake.notified().await,
        }
    }
}

/// How the process ended, for a run whose trainer already reported its own final status.
pub(crate) async fn record_exit(inner: &Inner, run_id: &str, exit: ExitInfo) {
    if let Err(e) = inner.store.set_exit(run_id, Some(exit)).await {
        tracing::warn!(run = %run_id, error = %e, "could not record how the process ended");
    }
}

pub(crate) async fn record_exit_cleared(inner: &Inner, run_id: &str) {
    if let Err(e) = inner.store.set_exit(run_id, None).await {
        tracing::warn!(run = %run_id, error = %e, "could not clear the previous exit");
    }
}

pub(crate) async fn record_status(
    inner: &Inner,
    run_id: &str,
    status: RunStatus,
    reason: &str,
    exit: Option<ExitInfo>,
) {
    if let Err(e) = inner.hooks.set_status(run_id, status, reason, exit).await {
        tracing::error!(run = %run_id, %status, error = %e, "could not record a status change");
    }
}

/// Supervises one run from its start (or re-adoption, when `adopted` is given) to its end,
/// then gives its slots back.
// Only the run id goes into the span: the other arguments' debug forms (`Some(Sender { .. })`)
// mean nothing in a log line.
#[tracing::instrument(skip_all, fields(run = %run_id))]
pub(crate) async fn supervise(
    inner: Arc<Inner>,
    run_id: String,
    assignment: Assignment,
    mut adopted: Option<ProcessRecord>,
    mut started: Option<tokio::sync::oneshot::Sender<()>>,
) {
    let dir = inner.run_dir(&run_id);
    match LaunchRecord::load(&dir) {
        Ok(mut record) => {
            supervise_attempts(
                &inner,
                &run_id,
                &assignment,
                &mut record,
                &mut adopted,
                &mut started,
            )
            .await
        }
        Err(e) => {
            let msg = format!("cannot read the run's launch record: {e}");
            record_status(&inner, &run_id, RunStatus::Failed, &msg, None).await;
        }
    }
    inner.logs.publish(&run_id, LogEvent::End);
    inner.logs.close(&run_id);
    {
        let mut st = inner.state();
        st.active.remove(&run_id);
        st.sched.release(&assignment);
    }
    inner.wake.notify_one();
}

async fn supervise_attempts(
    inner: &Arc<Inner>,
    run_id: &str,
    assignment: &Assignment,
    record: &mut LaunchRecord,
    adopted: &mut Option<ProcessRecord>,
    started: &mut Option<tokio::sync::oneshot::Sender<()>>,
) {
    let dir = inner.run_dir(run_id);
    loop {
        let (proc_rec, child) = match adopted.take() {
            Some(p) => (p, None),
            None => {
                if dir.join(STOP_FILE).exists() {
                    record_status(inner, run_id, RunStatus::Stopped, "stopped by user", None).await;
                    return;
                }
                match start_attempt(inner, run_id, assignment, record).await {
                    Ok(attempt) => attempt,
                    Err(e) => {
                        let msg = format!("could not start the process: {e}");
                        let exit = ExitInfo {
                            message: Some(msg.clone()),
                            ..ExitInfo::default()
                        };
                        record_status(inner, run_id, RunStatus::Failed, &msg, Some(exit)).await;
                        return;
                    }
                }
            }
        };
        set_active(inner, run_id, &proc_rec);
        // A stop that arrived while the process was being spawned found no pid to signal.
        if dir.join(STOP_FILE).exists() {
            terminate(inner, run_id, proc_rec.pid, proc_rec.start_time);
        }
        if let Some(tx) = started.take() {
            let _ = tx.send(());
        }
        let epoch = record.first_started_at_ms.unwrap_or(proc_rec.started_at_ms);
        let outcome = watch(inner, run_id, &dir, &proc_rec, child, epoch).await;
        if let Some(a) = inner.state().active.get_mut(run_id) {
            a.pgid = None;
        }
        // Before the terminal status is recorded, so a watcher that sees `finished` finds every
        // step the trainer wrote, however its last HTTP batch fared.
        backfill_metrics(inner, run_id, &dir).await;
        let tail = super::logs::read_tail(&dir.join(process::LOG_FILE), TAIL_LINES)
            .map(|s| last_bytes(&s.text, TAIL_BYTES).to_string())
            .unwrap_or_default();
        let exit = exit_info(&outcome, &tail);
        let current = inner.store.get_run(run_id).await.map(|r| r.status).ok();
        if dir.join(STOP_FILE).exists() {
            // The trainer reports `stopped` itself after checkpointing; do not record it twice,
            // nor overrule an end it reported first (a terminal status is final).
            if current.is_some_and(RunStatus::is_terminal) {
                record_exit(inner, run_id, exit).await;
            } else {
                let reason = format!("stopped by user ({})", outcome.describe());
                record_status(inner, run_id, RunStatus::Stopped, &reason, Some(exit)).await;
            }
            return;
        }
        if outcome.success() {
            // The trainer may have reported its own terminal status (e.g. `stopped` after a
            // SIGTERM from elsewhere); a clean exit does not overrule it.
            if matches!(current, Some(s) if s.is_terminal()) {
                record_exit(inner, run_id, exit).await;
            } else {
                record_status(
                    inner,
                    run_id,
                    RunStatus::Finished,
                    "exit code 0",
                    Some(exit),
                )
                .await;
            }
            return;
        }
        if current == Some(RunStatus::Finished) {
            // The trainer reported the end of its training (final checkpoint written); a failure
            // while exiting afterwards neither undoes that nor calls for a relaunch.
            tracing::warn!(run = %run_id, outcome = %outcome.describe(), "the process failed after reporting `finished`");
            record_exit(inner, run_id, exit).await;
            return;
        }
        let reason = match outcome {
            Outcome::Unknown => "lost".to_string(),
            _ => outcome.describe(),
        };
        if record.attempts - record.attempts_before_resume.min(record.attempts)
            <= record.max_restarts
        {
            let why = format!(
                "restarting (attempt {} of {}) after: {reason}",
                record.attempts + 1,
                record.max_restarts + 1
            );
            tracing::warn!(run = %run_id, "{why}");
            record_status(inner, run_id, RunStatus::Queued, &why, Some(exit)).await;
            continue;
        }
        if current.is_some_and(RunStatus::is_terminal) {
            // The trainer reported its own end (`failed` with its reason, say) before exiting:
            // that status stands (a terminal status is final), and how the process ended is
            // recorded with it instead of being lost with a refused second `failed`.
            record_exit(inner, run_id, exit).await;
            return;
        }
        record_status(inner, run_id, RunStatus::Failed, &reason, Some(exit)).await;
        return;
    }
}

/// The last `max` bytes of `text`, cut at a character boundary.
pub(crate) fn last_bytes(text: &str, max: usize) -> &str {
    let mut start = text.len().saturating_sub(max);
    while !text.is_char_boundary(start) {
        start += 1;
    }
    &text[start..]
}

pub(crate) fn exit_info(outcome: &Outcome, tail: &str) -> ExitInfo {
    let (exit_code, signal) = match outcome {
        Outcome::Exited(c) => (Some(*c), None),
        Outcome::Signaled(s) => (None, Some(*s)),
        Outcome::Unknown => (None, None),
    };
    let message = if outcome.success() {
        None
    } else {
        Some(format!(
            "{}\n--- last lines of output.log ---\n{tail}",
            outcome.describe()
        ))
    };
    ExitInfo {
        exit_code,
        signal,
        message,
    }
}

/// Spawns the next attempt and records it (launch.json, status `running`, attempt tag).
async fn start_attempt(
    inner: &Arc<Inner>,
    run_id: &str,
    assignment: &Assignment,
    record: &mut LaunchRecord,
) -> std::io::Result<(ProcessRecord, Option<tokio::process::Child>)> {
    let dir = inner.run_dir(run_id);
    let server_url = inner.server_url.get().cloned().unwrap_or_default();
    // A user's resume names its checkpoint; a restart resumes from the latest one, and only
    // from one that exists: an attempt that died before its first save starts over.
    let requested = record.resume_from.take();
    let resume = requested.clone().or_else(|| {
        (record.attempts > 0)
            .then(|| latest_checkpoint(&dir))
            .flatten()
    });
    let argv = match &record.command {
        Some(cmd) => cmd.clone(),
        None => process::trainer_argv(
            &inner.trainer_bin(),
            &dir,
            &server_url,
            run_id,
            resume.as_deref(),
        ),
    };
    record.attempts += 1;
    if record.attempts > 1 {
        use std::io::Write;
        let mut log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(dir.join(process::LOG_FILE))?;
        writeln!(log, "=== trainyard: attempt {} ===", record.attempts)?;
    }
    let token = if inner.run_tokens {
        Some(
            inner
                .hooks
                .run_token(run_id)
                .await
                .map_err(std::io::Error::other)?,
        )
    } else {
        None
    };
    let policy = inner.confine_policy(&dir, &record.read, &server_url);
    let spec = SpawnSpec {
        run_id,
        run_dir: &dir,
        argv,
        assignment,
        server_url: &server_url,
        token: token.as_deref(),
        attempt: record.attempts,
        cpu_slots: inner.settings.cpu_slots,
        env: &record.env,
        confine: policy.as_ref(),
    };
    let (child, proc_rec) = process::spawn(&spec)?;
    // Visible to `stop` before anyone can see the run as `running`.
    set_active(inner, run_id, &proc_rec);
    record
        .first_started_at_ms
        .get_or_insert(proc_rec.started_at_ms);
    record.process = Some(proc_rec.clone());
    record.save(&dir)?;
    let place = if assignment.is_cpu() {
        "CPU".to_string()
    } else {
        format!("GPU {}", assignment.cuda_visible_devices())
    };
    let from = |dir: &Path| {
        dir.file_name()
            .map(|n| n.to_string_lossy().to_string())
            .unwrap_or_default()
    };
    let reason = match (record.attempts, &requested, &resume) {
        (n, Some(dir), _) => format!(
            "resumed from checkpoint {} on {place} (attempt {n})",
            from(dir)
        ),
        (1, None, _) => format!("launched on {place} (pid {})", proc_rec.pid),
        (n, None, Some(dir)) => format!(
            "relaunched from its latest checkpoint {} on {place} (attempt {n})",
            from(dir)
        ),
        (n, None, None) => format!("relaunched from the start on {place} (attempt {n})"),
    };
    // The previous attempt's exit belongs to its event; this attempt has not ended.
    record_exit_cleared(inner, run_id).await;
    record_status(inner, run_id, RunStatus::Running, &reason, None).await;
    let tags = BTreeMap::from([(
        "trainyard.attempts".to_string(),
        record.attempts.to_string(),
    )]);
    let update = crate::store::RunUpdate {
        tags: Some(tags),
        ..Default::default()
    };
    if let Err(e) = inner.store.update_run(run_id, update).await {
        tracing::warn!(run = %run_id, error = %e, "could not tag the attempt count");
    }
    Ok((proc_rec, Some(child)))
}

/// Waits for the attempt to end while publishing its new log lines and sampling its system
/// metrics. Our own child is awaited; a re-adopted process is polled through `/proc`.
async fn watch(
    inner: &Arc<Inner>,
    run_id: &str,
    dir: &Path,
    proc_rec: &ProcessRecord,
    mut child: Option<tokio::process::Child>,
    epoch_ms: i64,
) -> Outcome {
    let log_path = dir.join(process::LOG_FILE);
    let mut tailer = Tailer::at_end(&log_path);
    let mut sampler = Some(Sampler::new(proc_rec.pid, proc_rec.gpus.clone(), epoch_ms));
    let mut log_tick = tokio::time::interval(LOG_POLL);
    let mut sys_tick = tokio::time::interval(inner.settings.sys_metrics_interval);
    let mut poll_tick = tokio::time::interval(inner.settings.poll_interval);
    let adopted = child.is_none();
    let outcome = loop {
        let wait_child = async {
            match child.as_mut() {
                Some(c) => c.wait().await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            status = wait_child => {
                break match status {
                    Ok(s) => Outcome::from_status(s),
                    Err(_) => process::read_exit_marker(dir).unwrap_or(Outcome::Unknown),
                };
            }
            _ = poll_tick.tick(), if adopted => {
                if !process::is_alive(proc_rec) {
                    break process::read_exit_marker(dir).unwrap_or(Outcome::Unknown);
                }
            }
            _ = log_tick.tick() => {
                if let Some(ev) = tailer.poll(&log_path, true) {
                    inner.logs.publish(run_id, ev);
                }
            }
            _ = sys_tick.tick() => {
                if let Some(mut s) = sampler.take() {
                    let res = tokio::task::spawn_blocking(move || {
                        let points = s.sample();
                        (s, points)
                    })
                    .await;
                    if let Ok((s, points)) = res {
                        sampler = Some(s);
                        if !points.is_empty() {
                            if let Err(e) = inner.hooks.ingest(run_id, points).await {
                                tracing::warn!(run = %run_id, error = %e, "system metrics not recorded");
                            }
                        }
                    }
                }
            }
        }
    };
    if let Some(ev) = tailer.poll(&log_path, false) {
        inner.logs.publish(run_id, ev);
    }
    outcome
}

/// The newest step checkpoint of the run, if it has one.
pub(crate) fn latest_checkpoint(run_dir: &Path) -> Option<PathBuf> {
    let latest = crate::checkpoints::resolve(run_dir, &crate::checkpoints::ResumePoint::Latest);
    latest.ok().map(|(_, dir)| dir)
}

fn set_active(inner: &Inner, run_id: &str, proc_rec: &ProcessRecord) {
    if let Some(a) = inner.state().active.get_mut(run_id) {
        a.pgid = Some(proc_rec.pid);
        a.start_time = proc_rec.start_time;
    }
}

/// SIGTERM to the run's process group now, SIGKILL if the same process is still there after
/// the grace period.
pub(crate) fn terminate(inner: &Arc<Inner>, run_id: &str, pgid: i32, start_time: u64) {
    process::signal_group(pgid, libc::SIGTERM);
    let inner = inner.clone();
    let id = run_id.to_string();
    tokio::spawn(async move {
        tokio::time::sleep(inner.settings.stop_grace).await;
        let still = inner.state().active.get(&id).cloned();
        if let Some(a) = still {
            if a.pgid == Some(pgid) && a.start_time == start_time {
                tracing::warn!(run = %id, "grace period over: SIGKILL");
                process::signal_group(pgid, libc::SIGKILL);
            }
        }
    });
}

/// A trainer killed between writing a step to `metrics.jsonl` and sending it to the server
/// leaves a gap (its replacement resumes after the checkpoint), and a trainer that exits while
/// its last batch is in flight can leave the tail unsent. The file has every step, so after
/// every attempt its points are sent again; writes are idempotent on (run, key, step), so what
/// the server already has is untouched.
pub(crate) async fn backfill_metrics(inner: &Inner, run_id: &str, dir: &Path) {
    let path = dir.join(METRICS_FILE);
    let lines = tokio::task::spawn_blocking(move || {
        let text = std::fs::read_to_string(path).unwrap_or_default();
        text.lines()
            .filter_map(|l| serde_json::from_str::<MetricsLine>(l).ok())
            .flat_map(|l| l.to_points())
            .filter(|p| p.value.is_finite())
            .collect::<Vec<_>>()
    })
    .await
    .unwrap_or_default();
    for chunk in lines.chunks(MAX_POINTS_PER_BATCH) {
        if let Err(e) = inner.hooks.ingest(run_id, chunk.to_vec()).await {
            tracing::warn!(run = %run_id, error = %e, "metrics.jsonl backfill incomplete");
            return;
        }
    }
}
