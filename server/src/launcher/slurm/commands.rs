//! Talking to Slurm through its own commands (`sbatch`, `scontrol`, `sacct`, `scancel`,
//! `sinfo`), never its internals: what a user could type is what the executor does. Running a
//! command is behind a small trait, and reading its output is plain functions, so the parsing
//! is tested on recorded outputs without a cluster.

use async_trait::async_trait;
use std::collections::BTreeMap;
use std::path::Path;
use std::process::Stdio;

/// What a command printed and whether it succeeded.
#[derive(Debug, Clone, Default)]
pub struct Output {
    pub success: bool,
    pub stdout: String,
    pub stderr: String,
}

/// Runs one Slurm command. `env`, when given, is the whole environment of the command (sbatch
/// hands it to the job); otherwise the command gets the server's harmless variables.
#[async_trait]
pub trait Runner: Send + Sync + 'static {
    async fn run(
        &self,
        program: &str,
        args: &[String],
        env: Option<&BTreeMap<String, String>>,
    ) -> std::io::Result<Output>;
}

/// The real commands, found on PATH.
pub struct System;

/// Slurm's client settings pass through to every command (where the cluster's config is);
/// they are no secret of the server's.
const SLURM_CLIENT_VARS: &[&str] = &["SLURM_CONF", "SLURM_CLUSTERS"];

#[async_trait]
impl Runner for System {
    async fn run(
        &self,
        program: &str,
        args: &[String],
        env: Option<&BTreeMap<String, String>>,
    ) -> std::io::Result<Output> {
        let mut cmd = tokio::process::Command::new(program);
        // Never the server's own environment (database URL, admin token): see `launcher::env`.
        cmd.args(args)
            .stdin(Stdio::null())
            .env_clear()
            .envs(crate::launcher::env::inherited(std::env::vars_os()))
            .kill_on_drop(true);
        for name in SLURM_CLIENT_VARS {
            if let Some(v) = std::env::var_os(name) {
                cmd.env(name, v);
            }
        }
        if let Some(env) = env {
            cmd.envs(env);
        }
        let out = cmd.output().await.map_err(|e| {
            std::io::Error::new(
                e.kind(),
                format!("cannot run `{program}` (is Slurm's client installed and on PATH?): {e}"),
            )
        })?;
        Ok(Output {
            success: out.status.success(),
            stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        })
    }
}

fn failed(program: &str, out: &Output) -> std::io::Error {
    let text = out.stderr.trim();
    let text = if text.is_empty() {
        out.stdout.trim()
    } else {
        text
    };
    std::io::Error::other(format!("`{program}` failed: {text}"))
}

/// The state of a job as Slurm names it (`JobState`), sorted into what the executor does
/// with it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Phase {
    /// Waiting for resources or being set up: the run stays `queued`.
    Waiting,
    /// Running (or finishing): the run is `running`.
    Running,
    /// COMPLETED.
    Completed,
    /// CANCELLED (scancel, an administrator, a deleted reservation).
    Cancelled,
    /// Every other end (FAILED, TIMEOUT, NODE_FAIL, PREEMPTED, OUT_OF_MEMORY, BOOT_FAIL,
    /// DEADLINE, ...): a failure, restarted within `max_restarts`.
    Failed,
}

pub fn phase(state: &str) -> Phase {
    match state {
        "PENDING" | "CONFIGURING" | "REQUEUED" | "REQUEUE_HOLD" | "REQUEUE_FED"
        | "RESV_DEL_HOLD" => Phase::Waiting,
        "RUNNING" | "COMPLETING" | "SIGNALING" | "STAGE_OUT" | "SUSPENDED" | "STOPPED"
        | "RESIZING" => Phase::Running,
        "COMPLETED" => Phase::Completed,
        "CANCELLED" => Phase::Cancelled,
        _ => Phase::Failed,
    }
}

/// What Slurm tells about one job.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JobInfo {
    /// `JobState`, e.g. `RUNNING` (`CANCELLED by 0` is cut to `CANCELLED`).
    pub state: String,
    /// Why it waits or ended (`Resources`, `NonZeroExitCode`, ...); empty when `None`.
    pub reason: String,
    /// `ExitCode=code:signal` once it ended.
    pub exit: Option<(i32, i32)>,
    /// Where it runs (empty while pending).
    pub nodes: String,
    pub partition: String,
}

impl JobInfo {
    pub fn phase(&self) -> Phase {
        phase(&self.state)
    }
}

/// The first word of a state (`CANCELLED by 0` → `CANCELLED`), upper case.
fn state_word(text: &str) -> String {
    text.split_whitespace()
        .next()
        .unwrap_or("")
        .trim_end_matches('+')
        .to_ascii_uppercase()
}

fn parse_exit(text: &str) -> Option<(i32, i32)> {
    let (code, signal) = text.split_once(':')?;
    Some((code.trim().parse().ok()?, signal.trim().parse().ok()?))
}

fn clean_reason(text: &str) -> String {
    match text.trim() {
        "None" | "(null)" => String::new(),
        other => other.to_string(),
    }
}

/// `scontrol show job -o <id>`: one line of `Key=Value` pairs separated by spaces.
pub fn parse_scontrol_job(text: &str) -> Option<JobInfo> {
    let line = text.lines().find(|l| l.contains("JobState="))?;
    let fields: BTreeMap<&str, &str> = line
        .split_whitespace()
        .filter_map(|kv| kv.split_once('='))
        .collect();
    Some(JobInfo {
        state: state_word(fields.get("JobState")?),
        reason: clean_reason(fields.get("Reason").copied().unwrap_or("")),
        exit: fields.get("ExitCode").and_then(|e| parse_exit(e)),
        nodes: fields
            .get("NodeList")
            .map(|n| clean_reason(n))
            .unwrap_or_default(),
        partition: fields.get("Partition").copied().unwrap_or("").to_string(),
    })
}

/// `sacct -n -P -X -j <id> -o State,ExitCode,Reason,NodeList,Partition`: `|`-separated.
pub fn parse_sacct(text: &str) -> Option<JobInfo> {
    let line = text.lines().find(|l| !l.trim().is_empty())?;
    let cols: Vec<&str> = line.split('|').collect();
    let state = state_word(cols.first()?);
    if state.is_empty() {
        return None;
    }
    Some(JobInfo {
        state,
        exit: cols.get(1).and_then(|e| parse_exit(e)),
        reason: clean_reason(cols.get(2).copied().unwrap_or("")),
        nodes: clean_reason(cols.get(3).copied().unwrap_or("")),
        partition: cols.get(4).copied().unwrap_or("").to_string(),
    })
}

/// `sbatch --parsable`: `<job id>` or `<job id>;<cluster>`.
pub fn parse_sbatch(text: &str) -> Option<String> {
    let line = text.lines().map(str::trim).find(|l| !l.is_empty())?;
    let id = line.split(';').next()?.trim();
    (!id.is_empty() && id.chars().all(|c| c.is_ascii_digit() || c == '_')).then(|| id.to_string())
}

/// `sinfo -h -o %R`: one partition name per line (several lines per partition when its nodes
/// differ; duplicates are dropped).
pub fn parse_partitions(text: &str) -> Vec<String> {
    let mut names: Vec<String> = text
        .lines()
        .map(|l| l.trim().trim_end_matches('*').to_string())
        .filter(|l| !l.is_empty())
        .collect();
    names.sort();
    names.dedup();
    names
}

/// The Slurm commands the executor uses.
#[derive(Clone)]
pub struct Slurm {
    runner: std::sync::Arc<dyn Runner>,
}

impl Slurm {
    pub fn new(runner: std::sync::Arc<dyn Runner>) -> Self {
        Slurm { runner }
    }

    fn args(list: &[&str]) -> Vec<String> {
        list.iter().map(|s| s.to_string()).collect()
    }

    /// Submits a batch script with exactly `env` as the job's environment; returns the job id.
    pub async fn submit(
        &self,
        script: &Path,
        env: &BTreeMap<String, String>,
    ) -> std::io::Result<String> {
        let args = vec![
            "--parsable".to_string(),
            // The job gets the environment sbatch was started with, which is the run's alone.
            "--export=ALL".to_string(),
            script.display().to_string(),
        ];
        let out = self.runner.run("sbatch", &args, Some(env)).await?;
        if !out.success {
            return Err(failed("sbatch", &out));
        }
        parse_sbatch(&out.stdout).ok_or_else(|| {
            std::io::Error::other(format!("sbatch printed no job id: {}", out.stdout.trim()))
        })
    }

    /// The job's state: from the controller while it remembers the job, else from the
    /// accounting database (`sacct`) where there is one. None: Slurm knows nothing of it.
    pub async fn job(&self, job_id: &str) -> std::io::Result<Option<JobInfo>> {
        let out = self
            .runner
            .run(
                "scontrol",
                &Self::args(&["show", "job", "-o", job_id]),
                None,
            )
            .await?;
        if out.success {
            if let Some(info) = parse_scontrol_job(&out.stdout) {
                return Ok(Some(info));
            }
        } else if !out.stderr.contains("Invalid job id") {
            // The controller does not answer (restarting, unreachable): that says nothing
            // about the job, so the caller asks again later.
            return Err(failed("scontrol", &out));
        }
        let fields = "State,ExitCode,Reason,NodeList,Partition";
        let out = self
            .runner
            .run(
                "sacct",
                &Self::args(&["-n", "-P", "-X", "-j", job_id, "-o", fields]),
                None,
            )
            .await?;
        Ok(if out.success {
            parse_sacct(&out.stdout)
        } else {
            None
        })
    }

    /// `scancel`, with `--signal=<signal> --full` when a signal is given (the batch shell and
    /// everything it started get it, so the trainer can write its checkpoint).
    pub async fn cancel(&self, job_id: &str, signal: Option<&str>) -> std::io::Result<()> {
        let mut args = Vec::new();
        if let Some(sig) = signal {
            args.push(format!("--signal={sig}"));
            args.push("--full".to_string());
        }
        args.push(job_id.to_string());
        let out = self.runner.run("scancel", &args, None).await?;
        if !out.success {
            return Err(failed("scancel", &out));
        }
        Ok(())
    }

    /// The cluster's partitions.
    pub async fn partitions(&self) -> std::io::Result<Vec<String>> {
        let out = self
            .runner
            .run("sinfo", &Self::args(&["-h", "-o", "%R"]), None)
            .await?;
        if !out.success {
            return Err(failed("sinfo", &out));
        }
        Ok(parse_partitions(&out.stdout))
    }

    /// The cluster's node names.
    pub async fn nodes(&self) -> std::io::Result<Vec<String>> {
        let out = self
            .runner
            .run("sinfo", &Self::args(&["-h", "-N", "-o", "%N"]), None)
            .await?;
        if !out.success {
            return Err(failed("sinfo", &out));
        }
        Ok(parse_partitions(&out.stdout))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // Recorded from Slurm 22.05 (Debian 12).
    const RUNNING: &str = "JobId=1 JobName=j.sh UserId=root(0) GroupId=root(0) MCS_label=N/A Priority=4294901759 Nice=0 Account=(null) QOS=(null) JobState=RUNNING Reason=None Dependency=(null) Requeue=1 Restarts=0 BatchFlag=1 Reboot=0 ExitCode=0:0 RunTime=00:00:01 TimeLimit=UNLIMITED TimeMin=N/A SubmitTime=2026-11-25T21:54:10 Partition=debug AllocNode:Sid=localhost:6273 ReqNodeList=(null) ExcNodeList=(null) NodeList=vm BatchHost=vm NumNodes=1 NumCPUs=1 Command=/tmp/sl/j.sh WorkDir=/tmp/sl StdErr=/tmp/sl/out.log StdIn=/dev/null StdOut=/tmp/sl/out.log Power= \n";
    const FAILED: &str = "JobId=1 JobName=j.sh UserId=root(0) JobState=FAILED Reason=NonZeroExitCode Dependency=(null) ExitCode=3:0 RunTime=00:00:01 Partition=debug NodeList=vm BatchHost=vm Power= \n";
    const PENDING: &str = "JobId=7 JobName=trainyard JobState=PENDING Reason=Resources Dependency=(null) ExitCode=0:0 Partition=gpu NodeList=(null) Power= \n";

    #[test]
    fn scontrol_lines_give_state_reason_exit_and_node() {
        let r = parse_scontrol_job(RUNNING).unwrap();
        assert_eq!(
            (r.state.as_str(), r.reason.as_str(), r.nodes.as_str()),
            ("RUNNING", "", "vm")
        );
        assert_eq!(r.phase(), Phase::Running);
        assert_eq!(r.partition, "debug");
        let f = parse_scontrol_job(FAILED).unwrap();
        assert_eq!(f.phase(), Phase::Failed);
        assert_eq!(f.exit, Some((3, 0)));
        assert_eq!(f.reason, "NonZeroExitCode");
        let p = parse_scontrol_job(PENDING).unwrap();
        assert_eq!(
            (p.phase(), p.reason.as_str(), p.nodes.as_str()),
            (Phase::Waiting, "Resources", "")
        );
        assert!(parse_scontrol_job("slurm_load_jobs error: Invalid job id specified").is_none());
    }

    #[test]
    fn sacct_rows_are_read_and_cancelled_by_a_user_is_cancelled() {
        let c = parse_sacct("CANCELLED by 0|0:15|None|node7|gpu\n").unwrap();
        assert_eq!(c.state, "CANCELLED");
        assert_eq!(c.phase(), Phase::Cancelled);
        assert_eq!(c.exit, Some((0, 15)));
        assert_eq!(c.nodes, "node7");
        let t = parse_sacct("TIMEOUT|0:0|TimeLimit|n1|batch\n").unwrap();
        assert_eq!((t.phase(), t.reason.as_str()), (Phase::Failed, "TimeLimit"));
        assert!(parse_sacct("").is_none());
    }

    #[test]
    fn every_slurm_state_maps_to_what_the_run_does() {
        for s in ["PENDING", "CONFIGURING", "REQUEUED"] {
            assert_eq!(phase(s), Phase::Waiting, "{s}");
        }
        for s in ["RUNNING", "COMPLETING", "SUSPENDED"] {
            assert_eq!(phase(s), Phase::Running, "{s}");
        }
        assert_eq!(phase("COMPLETED"), Phase::Completed);
        assert_eq!(phase("CANCELLED"), Phase::Cancelled);
        for s in [
            "FAILED",
            "OUT_OF_MEMORY",
            "NODE_FAIL",
            "TIMEOUT",
            "PREEMPTED",
            "BOOT_FAIL",
            "DEADLINE",
        ] {
            assert_eq!(phase(s), Phase::Failed, "{s}");
        }
    }

    #[test]
    fn sbatch_and_sinfo_outputs_are_parsed() {
        assert_eq!(parse_sbatch("1234\n").as_deref(), Some("1234"));
        assert_eq!(parse_sbatch("1234;cluster-a\n").as_deref(), Some("1234"));
        assert_eq!(
            parse_sbatch("sbatch: error: Batch job submission failed"),
            None
        );
        assert_eq!(
            parse_partitions("debug\ngpu\ndebug\n\n"),
            vec!["debug", "gpu"]
        );
    }

    /// A runner that answers from a table, for the command wiring.
    struct Recorded(Vec<(&'static str, Output)>);

    #[async_trait]
    impl Runner for Recorded {
        async fn run(
            &self,
            program: &str,
            _args: &[String],
            _env: Option<&BTreeMap<String, String>>,
        ) -> std::io::Result<Output> {
            let found = self.0.iter().find(|(p, _)| *p == program);
            Ok(found.map(|(_, o)| o.clone()).unwrap_or_default())
        }
    }

    #[tokio::test]
    async fn a_job_the_controller_forgot_is_looked_up_in_sacct() {
        let forgot = Output {
            success: false,
            stdout: String::new(),
            stderr: "slurm_load_jobs error: Invalid job id specified\n".into(),
        };
        let sacct = Output {
            success: true,
            stdout: "COMPLETED|0:0|None|n1|debug\n".into(),
            stderr: String::new(),
        };
        let slurm = Slurm::new(std::sync::Arc::new(Recorded(vec![
            ("scontrol", forgot),
            ("sacct", sacct),
        ])));
        let info = slurm.job("12").await.unwrap().unwrap();
        assert_eq!(info.phase(), Phase::Completed);
        let down = Output {
            success: false,
            stdout: String::new(),
            stderr: "slurm_load_jobs error: Unable to contact slurm controller\n".into(),
        };
        let slurm = Slurm::new(std::sync::Arc::new(Recorded(vec![("scontrol", down)])));
        assert!(
            slurm.job("12").await.is_err(),
            "an unreachable controller is not a vanished job"
        );
    }
}
