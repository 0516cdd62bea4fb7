//! The Slurm executor: a run with `executor: slurm` is not queued here but submitted to a
//! Slurm cluster as a batch job (`sbatch`), followed there (`scontrol show job`, `sacct` for
//! jobs the controller forgot) and stopped there (`scancel`). It gets the same environment as a
//! local run (server URL, run id, run directory, attempt, run-scoped token), so its trainer
//! reports metrics and statuses over HTTP exactly as a local one does.
//!
//! One task per run follows its jobs from submission to the end, polling Slurm every
//! `poll_interval`: Slurm keeps the queue, so there is nothing for us to schedule. Job states
//! map onto run statuses (PENDING → `queued`, RUNNING → `running`, COMPLETED → `finished`,
//! CANCELLED → `stopped`, FAILED/TIMEOUT/NODE_FAIL/PREEMPTED/OUT_OF_MEMORY → `failed`, or a new
//! job resuming from the latest checkpoint while `max_restarts` allows).
//!
//! The run directory must be on a filesystem the compute nodes share with the server: the job
//! writes its log, checkpoints and `exit_code` there. `docs/slurm.md` has the assumptions.

pub mod commands;
pub mod options;
pub mod script;

use super::logs::{LogEvent, Tailer};
use super::process::{self, LaunchRecord, Outcome};
use super::supervise::{self as sup, record_status};
use super::{Inner, STOP_FILE};
use crate::store::{ExitInfo, RunStatus};
use commands::{JobInfo, Phase, Slurm};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

pub use options::{Executor, SlurmOptions};

/// Tags that show a Slurm run's place on the dashboard and in searches.
pub const JOB_TAG: &str = "trainyard.slurm.job_id";
pub const PARTITION_TAG: &str = "trainyard.slurm.partition";
pub const STATE_TAG: &str = "trainyard.slurm.state";

/// Polls in a row in which Slurm knew nothing of a job (and it left no exit file) before the
/// run is given up as lost: a job is known to the controller from submission on, so this only
/// guards against a controller that restarted without its state.
const UNKNOWN_POLLS: u32 = 5;

/// The server's Slurm settings (`serve --executor slurm --slurm-partition ...`).
#[derive(Debug, Clone)]
pub struct SlurmSettings {
    /// Options every Slurm run starts from; a request's `resources.slurm` overrides them.
    pub defaults: SlurmOptions,
    /// The URL jobs report to; None: the server's own listening address (enough when the
    /// nodes reach it, e.g. a single-node cluster).
    pub server_url: Option<String>,
    /// How often each Slurm run's job is looked at.
    pub poll_interval: Duration,
    /// Whether requests may choose `executor: slurm` while the default is local
    /// (`--allow-slurm`); a server started with `--executor slurm` always may. Off otherwise,
    /// so a server nobody pointed at a cluster never submits jobs to one.
    pub allowed: bool,
    /// `extra` options a request from a user who is not an administrator may set
    /// (`--slurm-allow-option`, long names without dashes); none by default.
    pub allowed_options: Vec<String>,
}

impl Default for SlurmSettings {
    fn default() -> Self {
        SlurmSettings {
            defaults: SlurmOptions::default(),
            server_url: None,
            poll_interval: Duration::from_secs(1),
            allowed: false,
            allowed_options: Vec::new(),
        }
    }
}

/// What `launch.json` keeps of a Slurm run.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct SlurmRecord {
    /// The options its jobs are submitted with (request over server defaults).
    pub options: SlurmOptions,
    /// Every job id, one per attempt, oldest first.
    #[serde(default)]
    pub jobs: Vec<String>,
    /// The job of the attempt under way; None once its end is decided (or before the first).
    #[serde(default)]
    pub current_job: Option<String>,
}

/// Follows a Slurm run until it ends (also for a run re-adopted after a server restart, or
/// resumed by a user), then tells log followers and forgets it.
#[tracing::instrument(skip_all, fields(run = %run_id))]
pub(crate) async fn supervise(inner: Arc<Inner>, run_id: String) {
    let dir = inner.run_dir(&run_id);
    match LaunchRecord::load(&dir) {
        Ok(mut record) => attempts(&inner, &run_id, &dir, &mut record).await,
        Err(e) => {
            let msg = format!("cannot read the run's launch record: {e}");
            record_status(&inner, &run_id, RunStatus::Failed, &msg, None).await;
        }
    }
    inner.logs.publish(&run_id, LogEvent::End);
    inner.logs.close(&run_id);
    inner.state().active.remove(&run_id);
}

/// Starts following a Slurm run: from `launch` and `resume`, and at start-up for each Slurm
/// run without a final status.
pub(crate) fn follow(inner: &Arc<Inner>, run_id: &str) {
    {
        let mut st = inner.state();
        if st.active.contains_key(run_id) {
            // One follower per run: two would each record the same job's end.
            tracing::warn!(run = %run_id, "already followed");
            return;
        }
        st.active
            .insert(run_id.to_string(), super::Active::default());
    }
    tokio::spawn(supervise(inner.clone(), run_id.to_string()));
}

async fn status_of(inner: &Inner, run_id: &str) -> Option<RunStatus> {
    inner.store.get_run(run_id).await.map(|r| r.status).ok()
}

async fn attempts(inner: &Arc<Inner>, run_id: &str, dir: &Path, record: &mut LaunchRecord) {
    loop {
        let job = match record.slurm.as_ref().and_then(|s| s.current_job.clone()) {
            Some(job) => job,
            None => {
                if dir.join(STOP_FILE).exists() {
                    let reason = "stopped by user before it was submitted";
                    record_status(inner, run_id, RunStatus::Stopped, reason, None).await;
                    return;
                }
                match submit(inner, run_id, dir, record).await {
                    Ok(job) => job,
                    Err(e) => {
                        let msg = format!("could not submit the job to Slurm: {e}");
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
        // A stop that came while the job was being submitted found no job to cancel.
        if dir.join(STOP_FILE).exists() {
            stop_job(inner, run_id, &job);
        }
        let end = watch(inner, run_id, dir, &job, record.attempts).await;
        if let Some(s) = record.slurm.as_mut() {
            s.current_job = None;
        }
        if let Err(e) = record.save(dir) {
            tracing::warn!(run = %run_id, error = %e, "could not record the job's end");
        }
        if !decide(inner, run_id, dir, &job, record, end).await {
            return;
        }
    }
}

/// How an attempt's job ended.
struct JobEnd {
    info: Option<JobInfo>,
    outcome: Outcome,
}

/// Records the end of an attempt; true when the run goes on with a new job (a restart).
async fn decide(
    inner: &Arc<Inner>,
    run_id: &str,
    dir: &Path,
    job: &str,
    record: &LaunchRecord,
    end: JobEnd,
) -> bool {
    sup::backfill_metrics(inner, run_id, dir).await;
    let tail = super::logs::read_tail(&dir.join(process::LOG_FILE), sup::TAIL_LINES)
        .map(|s| sup::last_bytes(&s.text, sup::TAIL_BYTES).to_string())
        .unwrap_or_default();
    let state = end.info.as_ref().map_or("gone", |i| i.state.as_str());
    let slurm_reason = end
        .info
        .as_ref()
        .filter(|i| !i.reason.is_empty())
        .map(|i| format!(", {}", i.reason))
        .unwrap_or_default();
    let phase = end.info.as_ref().map(JobInfo::phase);
    let mut exit = sup::exit_info(&end.outcome, &tail);
    let mut current = status_of(inner, run_id).await;
    let ran = process::read_exit_marker(dir).is_some()
        || end.info.as_ref().is_some_and(|i| !i.nodes.is_empty());
    if current == Some(RunStatus::Queued) && ran {
        // The job ran and ended between two polls (it had a node, or its script left an exit
        // status): a queued run cannot become `finished` without having been `running`.
        let nodes = end.info.as_ref().map_or("", |i| i.nodes.as_str());
        let on = if nodes.is_empty() { "a node" } else { nodes };
        let reason = format!(
            "ran on {on} as Slurm job {job} (attempt {})",
            record.attempts
        );
        record_status(inner, run_id, RunStatus::Running, &reason, None).await;
        current = status_of(inner, run_id).await;
    }
    set_state_tag(inner, run_id, state).await;
    if dir.join(STOP_FILE).exists() {
        if current.is_some_and(RunStatus::is_terminal) {
            sup::record_exit(inner, run_id, exit).await;
        } else {
            let reason = format!("stopped by user (Slurm job {job} {state})");
            record_status(inner, run_id, RunStatus::Stopped, &reason, Some(exit)).await;
        }
        return false;
    }
    // A time limit or a preemption sends the trainer SIGTERM: it checkpoints, reports `stopped`
    // and exits 0, yet the job did not do its work. Slurm's state says so, not the exit status.
    let slurm_failed = phase == Some(Phase::Failed);
    if end.outcome.success() && !slurm_failed && phase != Some(Phase::Cancelled) {
        if current.is_some_and(RunStatus::is_terminal) {
            sup::record_exit(inner, run_id, exit).await;
        } else {
            let reason = format!("Slurm job {job} {state} (exit code 0)");
            record_status(inner, run_id, RunStatus::Finished, &reason, Some(exit)).await;
        }
        return false;
    }
    if current == Some(RunStatus::Finished) {
        sup::record_exit(inner, run_id, exit).await;
        return false;
    }
    if phase == Some(Phase::Cancelled) {
        // Cancelled in Slurm, not through us: an operator's scancel, a deleted reservation.
        let reason = format!("Slurm job {job} was cancelled outside Trainyard{slurm_reason}");
        if current.is_some_and(RunStatus::is_terminal) {
            sup::record_exit(inner, run_id, exit).await;
        } else {
            record_status(inner, run_id, RunStatus::Stopped, &reason, Some(exit)).await;
        }
        return false;
    }
    let mut reason = format!(
        "Slurm job {job} {state}{slurm_reason}: {}",
        end.outcome.describe()
    );
    let no_exit_file =
        matches!(end.outcome, Outcome::Unknown) && matches!(state, "FAILED" | "gone");
    if no_exit_file || end.outcome == Outcome::Exited(script::NO_RUN_DIR) {
        // No exit file: the script never got to write one in the run directory.
        reason.push_str(
            "; the job left no exit_code in the run directory: is the data directory on a \
             filesystem the compute nodes share?",
        );
    }
    exit.message = Some(format!(
        "{reason}\n--- last lines of output.log ---\n{tail}"
    ));
    let used = record.attempts - record.attempts_before_resume.min(record.attempts);
    if used <= record.max_restarts {
        let why = format!(
            "restarting (attempt {} of {}) after: {reason}",
            record.attempts + 1,
            record.max_restarts + 1
        );
        tracing::warn!(run = %run_id, "{why}");
        if current == Some(RunStatus::Queued) {
            // It failed before we saw it run; a queued run is not queued again.
            sup::record_exit(inner, run_id, exit).await;
        } else {
            record_status(inner, run_id, RunStatus::Queued, &why, Some(exit)).await;
        }
        return true;
    }
    if current.is_some_and(RunStatus::is_terminal) {
        // The trainer reported its own end (`stopped` at a time limit, `failed` on an error);
        // a final status is not replaced, the job's end is kept with it.
        sup::record_exit(inner, run_id, exit).await;
    } else {
        record_status(inner, run_id, RunStatus::Failed, &reason, Some(exit)).await;
    }
    false
}

/// Writes the attempt's batch script and submits it; the job id is in `launch.json` before
/// this returns.
async fn submit(
    inner: &Arc<Inner>,
    run_id: &str,
    dir: &Path,
    record: &mut LaunchRecord,
) -> std::io::Result<String> {
    let server_url = inner
        .settings
        .slurm
        .server_url
        .clone()
        .or_else(|| inner.server_url.get().cloned())
        .unwrap_or_default();
    let requested = record.resume_from.take();
    let resume = requested.clone().or_else(|| {
        (record.attempts > 0)
            .then(|| sup::latest_checkpoint(dir))
            .flatten()
    });
    let argv = match &record.command {
        Some(cmd) => cmd.clone(),
        None => process::trainer_argv(
            &inner.trainer_bin(),
            dir,
            &server_url,
            run_id,
            resume.as_deref(),
        ),
    };
    // Confined on the node through `trainyard confine`, where the node's kernel has Landlock
    // (a node without it runs the job unconfined and says so in the run's log).
    let confined = inner.confine_policy(dir, &record.read, &server_url);
    let argv = match &confined {
        Some(policy) => {
            let mut wrapped = vec![inner.trainer_bin().display().to_string(), "confine".into()];
            wrapped.extend(policy.to_args());
            wrapped.extend(["--best-effort".to_string(), "--".to_string()]);
            wrapped.extend(argv);
            wrapped
        }
        None => argv,
    };
    let attempt = record.attempts + 1;
    let options = record.slurm.clone().unwrap_or_default().options;
    let text = script::render(&script::ScriptSpec {
        run_id,
        run_dir: dir,
        attempt,
        options: &options,
        gpus: record.gpus_requested,
        argv: &argv,
        confined: confined.is_some(),
    });
    let path = dir.join(script::SCRIPT_FILE);
    std::fs::write(&path, text)?;
    if attempt > 1 {
        use std::io::Write;
        let mut log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(dir.join(process::LOG_FILE))?;
        writeln!(log, "=== trainyard: attempt {attempt} ===")?;
    }
    let _ = std::fs::remove_file(dir.join(process::EXIT_CODE_FILE));
    let mut env: BTreeMap<String, String> = super::env::inherited(std::env::vars_os())
        .into_iter()
        .filter_map(|(k, v)| Some((k.into_string().ok()?, v.into_string().ok()?)))
        .collect();
    env.extend(record.env.clone());
    env.insert("TRAINYARD_SERVER_URL".into(), server_url);
    env.insert("TRAINYARD_RUN_ID".into(), run_id.to_string());
    env.insert("TRAINYARD_RUN_DIR".into(), dir.display().to_string());
    env.insert("TRAINYARD_ATTEMPT".into(), attempt.to_string());
    if inner.run_tokens {
        let token = inner
            .hooks
            .run_token(run_id)
            .await
            .map_err(std::io::Error::other)?;
        env.insert("TRAINYARD_TOKEN".into(), token);
    }
    let job = inner.slurm.submit(&path, &env).await?;
    record.attempts = attempt;
    record
        .first_started_at_ms
        .get_or_insert_with(crate::store::now_ms);
    let slurm = record.slurm.get_or_insert_with(SlurmRecord::default);
    slurm.jobs.push(job.clone());
    slurm.current_job = Some(job.clone());
    record.save(dir)?;
    tracing::info!(run = %run_id, job = %job, attempt, "submitted to Slurm");
    let mut tags = BTreeMap::from([
        (JOB_TAG.to_string(), job.clone()),
        ("trainyard.attempts".to_string(), attempt.to_string()),
        (STATE_TAG.to_string(), "PENDING".to_string()),
    ]);
    if let Some(p) = &options.partition {
        tags.insert(PARTITION_TAG.to_string(), p.clone());
    }
    set_tags(inner, run_id, tags).await;
    Ok(job)
}

async fn set_tags(inner: &Inner, run_id: &str, tags: BTreeMap<String, String>) {
    let update = crate::store::RunUpdate {
        tags: Some(tags),
        ..Default::default()
    };
    if let Err(e) = inner.store.update_run(run_id, update).await {
        tracing::warn!(run = %run_id, error = %e, "could not tag the Slurm job");
    }
}

async fn set_state_tag(inner: &Inner, run_id: &str, state: &str) {
    set_tags(
        inner,
        run_id,
        BTreeMap::from([(STATE_TAG.to_string(), state.to_string())]),
    )
    .await;
}

/// Follows one job until it ends: its state (run `running` once Slurm starts it), its new log
/// lines for followers. Errors asking Slurm (a controller restarting) only mean asking again.
async fn watch(inner: &Arc<Inner>, run_id: &str, dir: &Path, job: &str, attempt: u32) -> JobEnd {
    let log_path = dir.join(process::LOG_FILE);
    let mut tailer = Tailer::at_end(&log_path);
    let mut log_tick = tokio::time::interval(sup::LOG_POLL);
    let mut poll_tick = tokio::time::interval(inner.settings.slurm.poll_interval);
    let mut last_state = String::new();
    let mut unknown = 0;
    let info = loop {
        tokio::select! {
            _ = log_tick.tick() => {
                if let Some(ev) = tailer.poll(&log_path, true) {
                    inner.logs.publish(run_id, ev);
                }
            }
            _ = poll_tick.tick() => {
                let info = match inner.slurm.job(job).await {
                    Ok(info) => info,
                    Err(e) => {
                        tracing::warn!(run = %run_id, job, error = %e, "cannot ask Slurm about the job");
                        continue;
                    }
                };
                let Some(info) = info else {
                    // Slurm has forgotten the job (no accounting): its exit file tells the end.
                    unknown += 1;
                    if process::read_exit_marker(dir).is_some() || unknown >= UNKNOWN_POLLS {
                        break None;
                    }
                    continue;
                };
                unknown = 0;
                if info.state != last_state {
                    last_state = info.state.clone();
                    set_state_tag(inner, run_id, &info.state).await;
                }
                match info.phase() {
                    Phase::Waiting => {}
                    Phase::Running => {
                        if status_of(inner, run_id).await == Some(RunStatus::Queued) {
                            let reason = format!(
                                "running on {} as Slurm job {job} (attempt {attempt})",
                                if info.nodes.is_empty() { "a node" } else { &info.nodes }
                            );
                            sup::record_exit_cleared(inner, run_id).await;
                            record_status(inner, run_id, RunStatus::Running, &reason, None).await;
                        }
                    }
                    Phase::Completed | Phase::Cancelled | Phase::Failed => break Some(info),
                }
            }
        }
    };
    if let Some(ev) = tailer.poll(&log_path, false) {
        inner.logs.publish(run_id, ev);
    }
    // The script's own record of its command's exit comes first: Slurm's ExitCode is the
    // script's, and a job killed before the script wrote it has only Slurm's.
    let outcome = process::read_exit_marker(dir)
        .or_else(|| match info.as_ref().and_then(|i| i.exit) {
            Some((code, 0)) => Some(Outcome::from_shell_code(code)),
            Some((_, signal)) => Some(Outcome::Signaled(signal)),
            None => None,
        })
        .unwrap_or(Outcome::Unknown);
    // A job that ended COMPLETED without an exit file did run its script to the end.
    JobEnd { info, outcome }
}

/// Asks the job to stop: SIGTERM to the batch shell and the trainer (which checkpoints and
/// reports `stopped`), then a plain `scancel` after the grace period if it is still there. A job
/// still waiting is simply cancelled.
pub(crate) fn stop_job(inner: &Arc<Inner>, run_id: &str, job: &str) {
    let inner = inner.clone();
    let run_id = run_id.to_string();
    let job = job.to_string();
    tokio::spawn(async move {
        let waiting =
            matches!(inner.slurm.job(&job).await, Ok(Some(i)) if i.phase() == Phase::Waiting);
        let signal = if waiting { None } else { Some("TERM") };
        if let Err(e) = inner.slurm.cancel(&job, signal).await {
            tracing::warn!(run = %run_id, job, error = %e, "scancel failed");
        }
        if waiting {
            return;
        }
        tokio::time::sleep(inner.settings.stop_grace).await;
        let still = matches!(inner.slurm.job(&job).await, Ok(Some(i)) if matches!(i.phase(), Phase::Waiting | Phase::Running));
        if still {
            tracing::warn!(run = %run_id, job, "grace period over: scancel");
            if let Err(e) = inner.slurm.cancel(&job, None).await {
                tracing::warn!(run = %run_id, job, error = %e, "scancel failed");
            }
        }
    });
}

/// At start-up, with `--executor slurm`: Slurm must answer, and a data directory on a local
/// filesystem cannot serve compute nodes other than this machine. Only what can be told is
/// refused: a filesystem of a kind that is never shared, while the cluster has other nodes.
pub(crate) async fn check_cluster(slurm: &Slurm, data_dir: &Path) -> anyhow::Result<()> {
    if !data_dir.is_absolute() {
        anyhow::bail!(
            "the data directory {} must be an absolute path: Slurm jobs run it from elsewhere",
            data_dir.display()
        );
    }
    let nodes = slurm
        .nodes()
        .await
        .map_err(|e| anyhow::anyhow!("--executor slurm: Slurm does not answer: {e}"))?;
    let host = hostname();
    let others: Vec<&String> = nodes
        .iter()
        .filter(|n| host.as_deref() != Some(n.as_str()))
        .collect();
    if others.is_empty() {
        return Ok(());
    }
    if let Some(fs) = filesystem_of(data_dir) {
        if LOCAL_FILESYSTEMS.contains(&fs.as_str()) {
            anyhow::bail!(
                "--executor slurm: the data directory {} is on a local {fs} filesystem, which \
                 the cluster's other nodes ({}) cannot see; put --data-dir on a filesystem the \
                 compute nodes share (NFS, Lustre, GPFS, ...) at the same path",
                data_dir.display(),
                others
                    .iter()
                    .take(5)
                    .map(|s| s.as_str())
                    .collect::<Vec<_>>()
                    .join(", ")
            );
        }
    }
    Ok(())
}

/// Filesystem kinds that are never shared between machines.
const LOCAL_FILESYSTEMS: &[&str] = &[
    "tmpfs", "ramfs", "overlay", "ext2", "ext3", "ext4", "xfs", "btrfs", "f2fs", "vfat",
];

fn hostname() -> Option<String> {
    let name = std::fs::read_to_string("/proc/sys/kernel/hostname").ok()?;
    Some(name.trim().split('.').next()?.to_string())
}

/// The filesystem type of the mount holding `path` (`/proc/self/mounts`, longest match).
fn filesystem_of(path: &Path) -> Option<String> {
    let mounts = std::fs::read_to_string("/proc/self/mounts").ok()?;
    mounts
        .lines()
        .filter_map(|l| {
            let mut f = l.split_whitespace();
            let (_, point, kind) = (f.next()?, f.next()?, f.next()?);
            path.starts_with(point)
                .then(|| (point.len(), kind.to_string()))
        })
        .max_by_key(|(len, _)| *len)
        .map(|(_, kind)| kind)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_root_filesystem_has_a_type() {
        assert!(filesystem_of(Path::new("/")).is_some());
    }

    #[test]
    fn a_record_without_slurm_fields_reads_as_a_local_run() {
        let text =
            r#"{"gpus_requested":0,"max_restarts":0,"command":null,"attempts":1,"process":null}"#;
        let rec: LaunchRecord = serde_json::from_str(text).unwrap();
        assert_eq!(rec.executor, Executor::Local);
        assert!(rec.slurm.is_none());
    }
}
