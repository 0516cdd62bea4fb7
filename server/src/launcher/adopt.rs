//! Start-up recovery: the previous server may have left launched runs behind. Queued runs go
//! back in line (oldest first); running runs whose process is still alive (same pid and same
//! kernel start time) are re-adopted and watched through `/proc`; the others end with the
//! status their wrapper's exit marker tells, or `failed` ("lost") when there is none.

use super::process::LaunchRecord;
use super::queue::Assignment;
use super::supervise::supervise;
use super::{Active, Inner};
use crate::store::{ExitInfo, RunStatus};
use std::sync::Arc;

pub(crate) async fn recover(inner: &Arc<Inner>) -> anyhow::Result<()> {
    let mut runs = inner
        .store
        .runs_with_status(&[RunStatus::Queued, RunStatus::Running])
        .await?;
    runs.sort_by(|a, b| a.created_at.cmp(&b.created_at).then(a.id.cmp(&b.id)));
    for run in runs {
        let dir = inner.run_dir(&run.id);
        // Runs without a launch record were started by hand and report for themselves.
        let Ok(record) = LaunchRecord::load(&dir) else {
            continue;
        };
        if record.executor == super::slurm::Executor::Slurm {
            // Slurm keeps its own queue: its job (or the lack of one) tells what to do, even for
            // a job that ended while this server was down.
            tracing::info!(run = %run.id, job = ?record.slurm.as_ref().and_then(|s| s.current_job.as_deref()), "re-adopting a Slurm run");
            super::slurm::follow(inner, &run.id);
            continue;
        }
        match (run.status, record.process) {
            (RunStatus::Running, Some(proc_rec)) => {
                let assignment = Assignment {
                    gpus: proc_rec.gpus.clone(),
                };
                let alive = super::process::is_alive(&proc_rec);
                tracing::info!(run = %run.id, pid = proc_rec.pid, alive, "re-adopting a launched run");
                {
                    let mut st = inner.state();
                    st.sched.claim(&assignment);
                    st.active.insert(run.id.clone(), Active::default());
                }
                // A process that ended meanwhile is handled by the same path: the watcher sees
                // it gone at once and reads its exit marker.
                tokio::spawn(supervise(
                    inner.clone(),
                    run.id.clone(),
                    assignment,
                    Some(proc_rec),
                    None,
                ));
            }
            (RunStatus::Running, None) => {
                let exit = ExitInfo {
                    message: Some("lost: no process was recorded for this run".into()),
                    ..ExitInfo::default()
                };
                inner
                    .hooks
                    .set_status(&run.id, RunStatus::Failed, "lost", Some(exit))
                    .await?;
            }
            (_, _) if record.gpus_requested > inner.gpus.len() => {
                let reason = format!(
                    "needs {} GPUs but this server now has {}",
                    record.gpus_requested,
                    inner.gpus.len()
                );
                inner
                    .hooks
                    .set_status(&run.id, RunStatus::Failed, &reason, None)
                    .await?;
            }
            (_, _) => {
                tracing::info!(run = %run.id, "requeued after restart");
                inner
                    .state()
                    .sched
                    .enqueue(run.id.clone(), record.gpus_requested);
            }
        }
    }
    inner.wake.notify_one();
    Ok(())
}
