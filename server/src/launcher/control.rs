//! Stopping and resuming what this server launched: a stop marks the run directory first
//! (so a stop during a spawn is never lost), then dequeues or signals it; a resume puts an
//! ended run back in line as a new attempt from a checkpoint.

use std::path::PathBuf;
use std::time::Duration;

use super::process::{self, LaunchRecord};
use super::{slurm, supervise, LaunchError, Launcher, StopOutcome, STOP_FILE};
use crate::store::{Run, RunStatus};

impl Launcher {
    /// Stops a queued run at once, or asks a running one to stop (SIGTERM, SIGKILL after the
    /// grace period).
    #[tracing::instrument(skip_all, fields(run = %run_id))]
    pub async fn stop(&self, run_id: &str) -> Result<StopOutcome, LaunchError> {
        let dir = self.inner.run_dir(run_id);
        if !dir.join(process::LAUNCH_FILE).exists() {
            // Not launched here (a run reporting from a terminal): nothing to signal.
            return Err(LaunchError::NotActive(run_id.to_string()));
        }
        // The marker goes first: a supervisor that records its new pid after we look sees the
        // marker and signals by itself, so a stop during a spawn is never lost.
        std::fs::write(dir.join(STOP_FILE), b"")?;
        if let Ok(record) = LaunchRecord::load(&dir) {
            if record.executor == slurm::Executor::Slurm {
                return self.stop_slurm(run_id, &record).await;
            }
        }
        let (was_queued, active) = {
            let mut st = self.inner.state();
            let was_queued = st.sched.remove(run_id);
            (was_queued, st.active.get(run_id).cloned())
        };
        if was_queued {
            self.inner
                .hooks
                .set_status(
                    run_id,
                    RunStatus::Stopped,
                    "stopped by user before it started",
                    None,
                )
                .await
                .map_err(|e| std::io::Error::other(e.to_string()))?;
            return Ok(StopOutcome::Stopped);
        }
        let Some(active) = active else {
            let _ = std::fs::remove_file(dir.join(STOP_FILE));
            return Err(LaunchError::NotActive(run_id.to_string()));
        };
        if let Some(pgid) = active.pgid {
            supervise::terminate(&self.inner, run_id, pgid, active.start_time);
        }
        Ok(StopOutcome::Stopping)
    }

    /// A Slurm run: its job is cancelled (SIGTERM first); one not submitted yet never will be.
    async fn stop_slurm(
        &self,
        run_id: &str,
        record: &LaunchRecord,
    ) -> Result<StopOutcome, LaunchError> {
        let followed = self.inner.state().active.contains_key(run_id);
        if !followed {
            let _ = std::fs::remove_file(self.inner.run_dir(run_id).join(STOP_FILE));
            return Err(LaunchError::NotActive(run_id.to_string()));
        }
        if let Some(job) = record.slurm.as_ref().and_then(|s| s.current_job.as_deref()) {
            slurm::stop_job(&self.inner, run_id, job);
        }
        Ok(StopOutcome::Stopping)
    }

    /// Puts an ended run that this server launched back in line, to continue from `checkpoint`
    /// (a directory of its own) as a new attempt of the same run, on `gpus` GPUs (None: as
    /// before). The run must have ended (finished, failed, stopped or lost).
    #[tracing::instrument(skip(self))]
    pub async fn resume(
        &self,
        run_id: &str,
        checkpoint: PathBuf,
        step: u64,
        gpus: Option<usize>,
    ) -> Result<Run, LaunchError> {
        let dir = self.inner.run_dir(run_id);
        let mut record =
            LaunchRecord::load(&dir).map_err(|_| LaunchError::NotLaunched(run_id.to_string()))?;
        if record.command.is_some() {
            return Err(LaunchError::NotResumable(
                "it runs a custom command, whose checkpoints this server does not know".into(),
            ));
        }
        let gpus = gpus.unwrap_or(record.gpus_requested);
        let on_slurm = record.executor == slurm::Executor::Slurm;
        if on_slurm {
            // The trainer reports `stopped` before its job has ended in Slurm; the follower of
            // that job must finish first, or it would record the old job's end on the resumed
            // run. It takes a poll or two.
            self.wait_unfollowed(run_id).await?;
            record = LaunchRecord::load(&dir)?;
        } else {
            self.check_gpus(gpus)?;
        }
        let status = self.inner.store.get_run(run_id).await?.status;
        if !(status.is_terminal() || status == RunStatus::Lost) {
            return Err(LaunchError::NotResumable(format!(
                "it is {status}; only a finished, failed, stopped or lost run can be resumed"
            )));
        }
        record.resume_from = Some(checkpoint);
        record.attempts_before_resume = record.attempts;
        record.gpus_requested = gpus;
        record.process = None;
        if let Some(s) = record.slurm.as_mut() {
            s.current_job = None;
        }
        let _ = std::fs::remove_file(dir.join(STOP_FILE));
        record.save(&dir)?;
        self.inner
            .hooks
            .set_status(
                run_id,
                RunStatus::Queued,
                &format!("resume from step {step} requested"),
                None,
            )
            .await
            .map_err(|e| std::io::Error::other(e.to_string()))?;
        if on_slurm {
            slurm::follow(&self.inner, run_id);
        } else {
            self.inner.state().sched.enqueue(run_id.to_string(), gpus);
            self.inner.wake.notify_one();
        }
        Ok(self.inner.store.get_run(run_id).await?)
    }

    /// Waits (a little) until no task follows the run's Slurm job any more.
    async fn wait_unfollowed(&self, run_id: &str) -> Result<(), LaunchError> {
        let patience = self.inner.settings.slurm.poll_interval * 10;
        let deadline = tokio::time::Instant::now() + patience.max(Duration::from_secs(10));
        while self.inner.state().active.contains_key(run_id) {
            if tokio::time::Instant::now() > deadline {
                return Err(LaunchError::NotResumable(
                    "its last Slurm job has not ended yet; try again once it has".into(),
                ));
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        Ok(())
    }
}
