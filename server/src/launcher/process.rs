//! Starting a run's process and talking to it afterwards: the wrapper, the environment, the
//! process group, `/proc` inspection and signals.
//!
//! The process runs in its own process group (`process_group(0)`), so a Ctrl-C or a crash of the
//! server never reaches it, and `kill(-pgid)` reaches everything the run started. A pid alone is
//! not an identity (pids are reused): we keep the pid together with the kernel's start time
//! (`/proc/<pid>/stat` field 22) and only treat a process as ours when both match.

use super::queue::Assignment;
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};
use std::process::Stdio;

/// The wrapper around every run's command. It writes the command's exit status to
/// `exit_code` (temp + rename, so a reader never sees half a number): a server that re-adopts
/// a run after a restart is no longer its parent and has no other way to learn how it ended.
/// TERM/INT/HUP are trapped (not ignored) so the shell outlives its child long enough to
/// record the status, while the child still gets default dispositions.
const WRAPPER: &str = r#"trap : TERM INT HUP
"$@"
code=$?
printf '%s\n' "$code" > exit_code.tmp && mv exit_code.tmp exit_code
exit "$code""#;

/// What the launcher persists per launched run (`<run dir>/launch.json`): enough to requeue it,
/// restart it or re-adopt its process after a server restart.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct LaunchRecord {
    pub gpus_requested: usize,
    pub max_restarts: u32,
    /// argv of a custom entrypoint; None = the trainer.
    pub command: Option<Vec<String>>,
    /// Attempts started so far (1 after the first launch).
    pub attempts: u32,
    pub process: Option<ProcessRecord>,
    /// Unix ms of the first attempt's start (step 0 of the `sys/...` series).
    #[serde(default)]
    pub first_started_at_ms: Option<i64>,
    /// The checkpoint directory the next attempt resumes from (a user's resume request);
    /// taken by that attempt. Without it a restart resumes from the latest checkpoint.
    #[serde(default)]
    pub resume_from: Option<PathBuf>,
    /// Attempts before the latest resume request: each resume gets the whole restart budget.
    #[serde(default)]
    pub attempts_before_resume: u32,
    /// Extra variables for the process (a sweep trial's parameters).
    #[serde(default)]
    pub env: std::collections::BTreeMap<String, String>,
    /// Folders outside the data roots the run may read (`LaunchSpec::read`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub read: Vec<PathBuf>,
    /// Where the run executes (a record written before Slurm existed is local).
    #[serde(default)]
    pub executor: super::slurm::Executor,
    /// A Slurm run's options and job ids.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub slurm: Option<super::slurm::SlurmRecord>,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct ProcessRecord {
    /// Pid of the wrapper, which is also the process group id.
    pub pid: i32,
    /// `/proc/<pid>/stat` field 22 (clock ticks since boot).
    pub start_time: u64,
    pub gpus: Vec<u32>,
    pub started_at_ms: i64,
}

pub const LAUNCH_FILE: &str = "launch.json";
pub const LOG_FILE: &str = "output.log";
pub const EXIT_CODE_FILE: &str = "exit_code";
pub const CONFIG_FILE: &str = "config.json";

impl LaunchRecord {
    pub fn load(run_dir: &Path) -> std::io::Result<LaunchRecord> {
        let text = std::fs::read_to_string(run_dir.join(LAUNCH_FILE))?;
        serde_json::from_str(&text).map_err(std::io::Error::other)
    }

    /// Atomic: a crash mid-write leaves the previous record.
    pub fn save(&self, run_dir: &Path) -> std::io::Result<()> {
        let tmp = run_dir.join(format!("{LAUNCH_FILE}.tmp"));
        let text = serde_json::to_vec_pretty(self).map_err(std::io::Error::other)?;
        std::fs::write(&tmp, text)?;
        std::fs::rename(tmp, run_dir.join(LAUNCH_FILE))
    }
}

/// `/proc/<pid>/stat`: state (field 3), process group (5), utime+stime (14, 15), start time
/// (22) and RSS pages (24).
#[derive(Debug, Clone, PartialEq)]
pub struct ProcStat {
    pub pid: i32,
    pub state: char,
    pub pgrp: i32,
    pub cpu_ticks: u64,
    pub start_time: u64,
    pub rss_pages: u64,
}

/// Parses a stat line; the command name (field 2) may hold spaces and parentheses, so fields
/// are counted from the last `)`.
pub fn parse_stat(text: &str) -> Option<ProcStat> {
    let open = text.find('(')?;
    let close = text.rfind(')')?;
    let pid = text[..open].trim().parse().ok()?;
    let rest: Vec<&str> = text[close + 1..].split_whitespace().collect();
    // rest[0] is field 3.
    let field = |n: usize| rest.get(n - 3).copied();
    Some(ProcStat {
        pid,
        state: field(3)?.chars().next()?,
        pgrp: field(5)?.parse().ok()?,
        cpu_ticks: field(14)?.parse::<u64>().ok()? + field(15)?.parse::<u64>().ok()?,
        start_time: field(22)?.parse().ok()?,
        rss_pages: field(24)?.parse().ok()?,
    })
}

pub fn read_stat(pid: i32) -> Option<ProcStat> {
    parse_stat(&std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?)
}

/// True while the recorded process still exists and is the same process (a zombie counts as
/// gone: it has finished and only waits to be reaped).
pub fn is_alive(record: &ProcessRecord) -> bool {
    matches!(read_stat(record.pid), Some(st) if st.start_time == record.start_time && st.state != 'Z')
}

/// Every live process of a process group (for RSS/CPU sums).
pub fn group_members(pgid: i32) -> Vec<ProcStat> {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    dir.filter_map(|e| e.ok()?.file_name().to_str()?.parse::<i32>().ok())
        .filter_map(read_stat)
        .filter(|st| st.pgrp == pgid && st.state != 'Z')
        .collect()
}

/// Sends a signal to the whole process group; false when it no longer exists.
pub fn signal_group(pgid: i32, signal: i32) -> bool {
    if pgid <= 1 {
        return false; // never signal init's or our own group by mistake
    }
    // SAFETY: kill(2) has no memory-safety preconditions; a negative pid names a group.
    unsafe { libc::kill(-pgid, signal) == 0 }
}

pub fn signal_name(signal: i32) -> &'static str {
    match signal {
        libc::SIGHUP => "SIGHUP",
        libc::SIGINT => "SIGINT",
        libc::SIGQUIT => "SIGQUIT",
        libc::SIGABRT => "SIGABRT",
        libc::SIGKILL => "SIGKILL",
        libc::SIGSEGV => "SIGSEGV",
        libc::SIGPIPE => "SIGPIPE",
        libc::SIGTERM => "SIGTERM",
        libc::SIGBUS => "SIGBUS",
        libc::SIGFPE => "SIGFPE",
        libc::SIGILL => "SIGILL",
        _ => "signal",
    }
}

/// How a process ended, as far as we can tell.
#[derive(Debug, Clone, PartialEq)]
pub enum Outcome {
    Exited(i32),
    Signaled(i32),
    /// Not our child and no exit marker: nothing is known.
    Unknown,
}

impl Outcome {
    /// A shell reports a child killed by signal N as status 128+N.
    pub fn from_shell_code(code: i32) -> Outcome {
        if (129..=128 + 64).contains(&code) {
            Outcome::Signaled(code - 128)
        } else {
            Outcome::Exited(code)
        }
    }

    pub fn from_status(status: std::process::ExitStatus) -> Outcome {
        use std::os::unix::process::ExitStatusExt;
        match (status.code(), status.signal()) {
            (Some(code), _) => Outcome::from_shell_code(code),
            (None, Some(sig)) => Outcome::Signaled(sig),
            _ => Outcome::Unknown,
        }
    }

    pub fn success(&self) -> bool {
        matches!(self, Outcome::Exited(0))
    }

    pub fn describe(&self) -> String {
        match self {
            Outcome::Exited(code) => format!("exit code {code}"),
            Outcome::Signaled(sig) => format!("killed by signal {sig} ({})", signal_name(*sig)),
            Outcome::Unknown => "lost: the process vanished without an exit status".to_string(),
        }
    }
}

/// The exit marker the wrapper leaves, if any.
pub fn read_exit_marker(run_dir: &Path) -> Option<Outcome> {
    let text = std::fs::read_to_string(run_dir.join(EXIT_CODE_FILE)).ok()?;
    Some(Outcome::from_shell_code(text.trim().parse().ok()?))
}

/// Everything needed to start one attempt.
pub struct SpawnSpec<'a> {
    pub run_id: &'a str,
    pub run_dir: &'a Path,
    pub argv: Vec<String>,
    pub assignment: &'a Assignment,
    pub server_url: &'a str,
    pub token: Option<&'a str>,
    pub attempt: u32,
    /// The server's CPU slots: a CPU run gets its share of the cores.
    pub cpu_slots: usize,
    /// Extra variables (`LaunchRecord::env`).
    pub env: &'a std::collections::BTreeMap<String, String>,
    /// What the process may touch; None: it runs unconfined.
    pub confine: Option<&'a super::confine::Policy>,
}

/// The trainer's argv for a run (resuming from its latest checkpoint after the first attempt).
pub fn trainer_argv(
    bin: &Path,
    run_dir: &Path,
    server_url: &str,
    run_id: &str,
    resume: Option<&Path>,
) -> Vec<String> {
    let mut argv = vec![
        bin.display().to_string(),
        "train".to_string(),
        "--config".to_string(),
        run_dir.join(CONFIG_FILE).display().to_string(),
        "--out".to_string(),
        run_dir.display().to_string(),
        "--server".to_string(),
        server_url.to_string(),
        "--run-id".to_string(),
        run_id.to_string(),
    ];
    if let Some(checkpoint) = resume {
        argv.extend(["--resume".to_string(), checkpoint.display().to_string()]);
    }
    argv
}

/// Starts the wrapper in a new process group with output appended to the run's log.
pub fn spawn(spec: &SpawnSpec<'_>) -> std::io::Result<(tokio::process::Child, ProcessRecord)> {
    let log_path: PathBuf = spec.run_dir.join(LOG_FILE);
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&log_path)?;
    let _ = std::fs::remove_file(spec.run_dir.join(EXIT_CODE_FILE));
    let mut cmd = tokio::process::Command::new("sh");
    cmd.arg("-c")
        .arg(WRAPPER)
        .arg("trainyard-run")
        .args(&spec.argv)
        .current_dir(spec.run_dir)
        .stdin(Stdio::null())
        .stdout(Stdio::from(log.try_clone()?))
        .stderr(Stdio::from(log))
        // Never the server's own environment (database URL, admin token...): see `env.rs`.
        .env_clear()
        .envs(super::env::inherited(std::env::vars_os()))
        .envs(spec.env)
        .env("TRAINYARD_SERVER_URL", spec.server_url)
        .env("TRAINYARD_RUN_ID", spec.run_id)
        .env("TRAINYARD_RUN_DIR", spec.run_dir)
        .env("TRAINYARD_ATTEMPT", spec.attempt.to_string())
        .env(
            "CUDA_VISIBLE_DEVICES",
            spec.assignment.cuda_visible_devices(),
        )
        .process_group(0)
        .kill_on_drop(false);
    // A server that requires a token needs one from the run's reports too (the trainer posts
    // its metrics and status with it); a server without one hands out nothing.
    if let Some(token) = spec.token {
        cmd.env("TRAINYARD_TOKEN", token);
    }
    if spec.assignment.is_cpu() {
        let threads = super::env::cpu_threads_per_slot(super::env::cores(), spec.cpu_slots);
        cmd.env(super::env::CPU_THREADS_VAR, threads.to_string());
    }
    if let Some(policy) = spec.confine {
        // A confined run writes only its own directory: its temporary files go there too.
        let tmp = spec.run_dir.join(super::confine::TMP_DIR);
        std::fs::create_dir_all(&tmp)?;
        cmd.env("TMPDIR", tmp);
        super::confine::apply_before_exec(&mut cmd, policy)?;
    }
    let child = cmd.spawn()?;
    let pid = child
        .id()
        .ok_or_else(|| std::io::Error::other("the process exited before its pid was read"))?
        as i32;
    let start_time = read_stat(pid)
        .map(|st| st.start_time)
        .ok_or_else(|| std::io::Error::other(format!("cannot read /proc/{pid}/stat")))?;
    Ok((
        child,
        ProcessRecord {
            pid,
            start_time,
            gpus: spec.assignment.gpus.clone(),
            started_at_ms: crate::store::now_ms(),
        },
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stat_line_with_a_tricky_command_name_is_parsed() {
        let line = "4242 (my (odd) cmd) S 1 4242 4242 0 -1 4194560 100 0 0 0 7 3 0 0 20 0 1 0 987654 1000000 250 18446744073709551615";
        let st = parse_stat(line).unwrap();
        assert_eq!(st.pid, 4242);
        assert_eq!(st.state, 'S');
        assert_eq!(st.pgrp, 4242);
        assert_eq!(st.cpu_ticks, 10);
        assert_eq!(st.start_time, 987654);
        assert_eq!(st.rss_pages, 250);
    }

    #[test]
    fn our_own_process_is_alive_and_a_wrong_start_time_is_not() {
        let me = read_stat(std::process::id() as i32).unwrap();
        let mut rec = ProcessRecord {
            pid: me.pid,
            start_time: me.start_time,
            gpus: vec![],
            started_at_ms: 0,
        };
        assert!(is_alive(&rec));
        rec.start_time += 1;
        assert!(
            !is_alive(&rec),
            "a reused pid must not pass for our process"
        );
    }

    #[test]
    fn shell_codes_above_128_are_signals() {
        assert_eq!(Outcome::from_shell_code(137), Outcome::Signaled(9));
        assert_eq!(Outcome::from_shell_code(3), Outcome::Exited(3));
        assert!(Outcome::Signaled(9).describe().contains("SIGKILL"));
    }

    #[test]
    fn a_launch_record_round_trips_through_its_file() {
        let dir = tempfile::tempdir().unwrap();
        let rec = LaunchRecord {
            gpus_requested: 1,
            max_restarts: 2,
            command: Some(vec!["sh".into(), "x.sh".into()]),
            attempts: 1,
            process: Some(ProcessRecord {
                pid: 12,
                start_time: 34,
                gpus: vec![1],
                started_at_ms: 5,
            }),
            first_started_at_ms: Some(5),
            resume_from: Some(dir.path().join("checkpoints/step-000010")),
            attempts_before_resume: 1,
            env: [("TRAINYARD_PARAMS".to_string(), "{}".to_string())].into(),
            read: vec![dir.path().join("other/checkpoints/best")],
            executor: crate::launcher::slurm::Executor::Slurm,
            slurm: Some(crate::launcher::slurm::SlurmRecord {
                jobs: vec!["41".into(), "42".into()],
                current_job: Some("42".into()),
                ..Default::default()
            }),
        };
        rec.save(dir.path()).unwrap();
        assert_eq!(LaunchRecord::load(dir.path()).unwrap(), rec);
    }
}
