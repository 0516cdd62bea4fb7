//! The local executor: runs posted with `launch: true` wait in a FIFO queue for whole GPUs (or a
//! CPU slot), start as `trainyard train` (or a user's command) in their own process group, are
//! supervised (logs, system metrics, exit, restarts, stop) and re-adopted after a server restart.
//!
//! Each run owns `<data dir>/runs/<id>/`: `launch.json` (what to run, attempts, pid + start
//! time), `config.json`, `output.log`, the wrapper's `exit_code`, and the trainer's checkpoints.

pub mod adopt;
pub mod confine;
mod control;
pub mod env;
pub mod gpus;
pub mod hooks;
pub mod logs;
pub mod process;
pub mod queue;
pub mod roots;
pub mod slurm;
pub mod supervise;
pub mod sysmetrics;

use crate::store::{DynStore, ExitInfo, MetricPoint, NewRun, Run, RunStatus, StoreError};
use async_trait::async_trait;
use process::LaunchRecord;
use queue::Scheduler;
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;
use tokio::sync::Notify;

/// Marker file: a stop was requested (survives a server restart, unlike memory).
pub const STOP_FILE: &str = "stop_requested";

#[derive(Debug, Clone)]
pub struct LauncherSettings {
    /// Run directories live in `<data_dir>/runs/`.
    pub data_dir: PathBuf,
    /// GPUs to hand out; None = ask nvidia-smi.
    pub gpus: Option<Vec<u32>>,
    /// Concurrent CPU runs (`gpus: 0`).
    pub cpu_slots: usize,
    /// Time between SIGTERM and SIGKILL on stop.
    pub stop_grace: Duration,
    /// The `trainyard` binary that runs `train`; None = this executable.
    pub trainer_bin: Option<PathBuf>,
    /// How often `sys/...` metrics are sampled.
    pub sys_metrics_interval: Duration,
    /// How often a re-adopted (not our child) process is checked.
    pub poll_interval: Duration,
    /// Where runs execute unless their request says (`serve --executor`).
    pub executor: slurm::Executor,
    /// The Slurm executor's defaults and polling.
    pub slurm: slurm::SlurmSettings,
    /// `serve --data-root`: the folders runs may read (empty: `<data dir>/datasets`).
    pub data_roots: Vec<PathBuf>,
    /// `serve --unconfined-runs`: launch runs without confinement.
    pub unconfined_runs: bool,
    /// The data roots as checked at start-up (`Application::build` fills it in).
    pub roots: roots::DataRoots,
    /// Whether launched runs are confined (`Application::build` decides).
    pub confinement: confine::Confinement,
}

impl LauncherSettings {
    pub fn new(data_dir: impl Into<PathBuf>) -> Self {
        LauncherSettings {
            data_dir: data_dir.into(),
            gpus: None,
            cpu_slots: 2,
            stop_grace: Duration::from_secs(30),
            trainer_bin: None,
            sys_metrics_interval: Duration::from_secs(5),
            poll_interval: Duration::from_millis(250),
            executor: slurm::Executor::Local,
            slurm: slurm::SlurmSettings::default(),
            data_roots: Vec::new(),
            unconfined_runs: false,
            roots: roots::DataRoots::default(),
            confinement: confine::Confinement::Off,
        }
    }
}

/// How the launcher records what happens to a run: the server's one status function (event +
/// live notification) and its one metric ingest path; and the token a launched run reports
/// with (`access::issue_run_token`).
#[async_trait]
pub trait RunHooks: Send + Sync + 'static {
    async fn set_status(
        &self,
        run_id: &str,
        status: RunStatus,
        reason: &str,
        exit: Option<ExitInfo>,
    ) -> anyhow::Result<()>;
    async fn ingest(&self, run_id: &str, points: Vec<MetricPoint>) -> anyhow::Result<()>;
    /// A new token for one attempt of run `run_id`: it may report that run only. Returns the
    /// secret.
    async fn run_token(&self, run_id: &str) -> anyhow::Result<String>;
}

/// What a launch request asks for, once its config is validated.
#[derive(Debug, Clone, Default)]
pub struct LaunchSpec {
    pub gpus: usize,
    pub max_restarts: u32,
    /// A custom entrypoint's argv; None runs the trainer on `config`.
    pub command: Option<Vec<String>>,
    /// The resolved config (written to `config.json`).
    pub config: Option<serde_json::Value>,
    /// Variables set for the process beside Trainyard's own (a sweep trial's
    /// `TRAINYARD_PARAMS`).
    pub env: std::collections::BTreeMap<String, String>,
    /// Folders outside the data roots the run may read: the checkpoints of other runs its
    /// config starts from, admitted because its launcher may read them.
    pub read: Vec<PathBuf>,
    /// `resources.executor`; None: the server's (`serve --executor`).
    pub executor: Option<slurm::Executor>,
    /// `resources.slurm`, over the server's defaults for a Slurm run.
    pub slurm: slurm::SlurmOptions,
}

#[derive(Debug, thiserror::Error)]
pub enum LaunchError {
    #[error("the run asks for {requested} GPUs but this server has {available}")]
    TooManyGpus { requested: usize, available: usize },
    #[error("a run needs either a config (to run the trainer) or a command")]
    NothingToRun,
    #[error("run `{0}` is not queued or running")]
    NotActive(String),
    #[error("run `{0}` was not launched by this server, so it cannot be resumed here; resume it where it runs, with `trainyard train --resume`")]
    NotLaunched(String),
    #[error("this run cannot be resumed: {0}")]
    NotResumable(String),
    /// A launch request value that cannot work (a Slurm option, an unknown partition).
    #[error("{}", .0.message)]
    Invalid(crate::validate::Invalid),
    /// Slurm does not answer, so the request cannot be checked or submitted now.
    #[error("{0}")]
    SlurmUnavailable(String),
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error("launcher I/O: {0}")]
    Io(#[from] std::io::Error),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum StopOutcome {
    /// Was queued: taken out of the queue and marked stopped.
    Stopped,
    /// Was running: SIGTERM sent; it becomes `stopped` when it exits.
    Stopping,
}

/// A supervised process, as `stop` needs to see it.
#[derive(Debug, Clone, Default)]
pub(crate) struct Active {
    /// Process group of the current attempt (None between attempts).
    pub pgid: Option<i32>,
    pub start_time: u64,
}

pub(crate) struct State {
    pub sched: Scheduler,
    pub active: HashMap<String, Active>,
}

pub(crate) struct Inner {
    pub settings: LauncherSettings,
    pub store: DynStore,
    pub hooks: Arc<dyn RunHooks>,
    pub gpus: Vec<gpus::Gpu>,
    pub state: Mutex<State>,
    pub wake: Notify,
    pub logs: logs::LogHub,
    pub server_url: OnceLock<String>,
    /// Whether each attempt gets a run-scoped token (`TRAINYARD_TOKEN`): when the server
    /// controls access, a run may report itself and nothing else.
    pub run_tokens: bool,
    /// The Slurm commands (used by Slurm runs only).
    pub slurm: slurm::commands::Slurm,
}

impl Inner {
    pub fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub fn run_dir(&self, run_id: &str) -> PathBuf {
        run_dir(&self.settings.data_dir, run_id)
    }

    /// The server's token cache, shared by launched runs.
    pub fn token_cache(&self) -> PathBuf {
        token_cache(&self.settings.data_dir)
    }

    /// What a run may touch when runs are confined (`confine`); None when they are not.
    /// `read` holds the folders outside the roots it was admitted to read; `server_url` is the
    /// server it reports to.
    pub fn confine_policy(
        &self,
        run_dir: &Path,
        read: &[PathBuf],
        server_url: &str,
    ) -> Option<confine::Policy> {
        if !self.settings.confinement.is_on() {
            return None;
        }
        let server_port = reqwest::Url::parse(server_url)
            .ok()
            .and_then(|u| u.port_or_known_default());
        Some(confine::Policy::for_run(&confine::RunPaths {
            run_dir,
            token_cache: &self.token_cache(),
            trainer_bin: &self.trainer_bin(),
            data_roots: self.settings.roots.paths(),
            extra_read: read,
            server_port,
        }))
    }

    pub fn trainer_bin(&self) -> PathBuf {
        self.settings
            .trainer_bin
            .clone()
            .or_else(|| std::env::current_exe().ok())
            .unwrap_or_else(|| PathBuf::from("trainyard"))
    }
}

/// `<data dir>/cache/tokens`: the token cache launched runs share.
pub fn token_cache(data_dir: &Path) -> PathBuf {
    data_dir.join("cache").join("tokens")
}

/// `<data dir>/runs/<id>`; ids are validated hex, so they are safe path components.
pub fn run_dir(data_dir: &Path, run_id: &str) -> PathBuf {
    data_dir.join("runs").join(run_id)
}

/// Cheap to clone; one per server.
#[derive(Clone)]
pub struct Launcher {
    inner: Arc<Inner>,
}

impl Launcher {
    /// Builds the inventory (blocking nvidia-smi call when no list is given).
    pub fn new(settings: LauncherSettings, store: DynStore, hooks: Arc<dyn RunHooks>) -> Self {
        let gpus = match &settings.gpus {
            Some(list) => list
                .iter()
                .map(|&index| gpus::Gpu {
                    index,
                    name: format!("gpu{index}"),
                    memory_mb: None,
                })
                .collect(),
            None => gpus::discover(),
        };
        let indices: Vec<u32> = gpus.iter().map(|g| g.index).collect();
        let gpu_list: Vec<String> = indices.iter().map(u32::to_string).collect();
        let gpu_list = if gpu_list.is_empty() {
            "none".to_string()
        } else {
            gpu_list.join(",")
        };
        tracing::info!(gpus = %gpu_list, cpu_slots = settings.cpu_slots, "launcher inventory");
        let sched = Scheduler::new(&indices, settings.cpu_slots);
        Launcher {
            inner: Arc::new(Inner {
                settings,
                store,
                hooks,
                gpus,
                state: Mutex::new(State {
                    sched,
                    active: HashMap::new(),
                }),
                wake: Notify::new(),
                logs: logs::LogHub::default(),
                server_url: OnceLock::new(),
                run_tokens: false,
                slurm: slurm::commands::Slurm::new(Arc::new(slurm::commands::System)),
            }),
        }
    }

    /// Gives every attempt its own run-scoped token as `TRAINYARD_TOKEN` (call before
    /// `start`). The token reports that run only, and stops working when the run ends.
    pub fn with_run_tokens(mut self, on: bool) -> Self {
        if let Some(inner) = Arc::get_mut(&mut self.inner) {
            inner.run_tokens = on;
        }
        self
    }

    /// Once the server listens: re-adopts or fails the runs a previous server left, requeues
    /// queued runs, and starts dispatching. Runs launched before `start` wait in the queue.
    pub async fn start(&self, server_url: String) -> anyhow::Result<()> {
        let _ = self.inner.server_url.set(server_url);
        if self.inner.settings.executor == slurm::Executor::Slurm {
            slurm::check_cluster(&self.inner.slurm, &self.inner.settings.data_dir).await?;
        }
        adopt::recover(&self.inner).await?;
        let inner = self.inner.clone();
        tokio::spawn(supervise::dispatch_loop(inner));
        Ok(())
    }

    pub fn gpus(&self) -> &[gpus::Gpu] {
        &self.inner.gpus
    }

    /// Where runs execute unless their request says (`serve --executor`).
    pub fn default_executor(&self) -> slurm::Executor {
        self.inner.settings.executor
    }

    pub fn data_dir(&self) -> &Path {
        &self.inner.settings.data_dir
    }

    /// The folders launched runs may read.
    pub fn roots(&self) -> &roots::DataRoots {
        &self.inner.settings.roots
    }

    /// Whether launched runs are confined.
    pub fn confinement(&self) -> confine::Confinement {
        self.inner.settings.confinement
    }

    /// A run's working directory (logs, checkpoints, launch record).
    pub fn run_dir(&self, run_id: &str) -> PathBuf {
        self.inner.run_dir(run_id)
    }

    pub fn log_path(&self, run_id: &str) -> PathBuf {
        self.inner.run_dir(run_id).join(process::LOG_FILE)
    }

    pub fn logs(&self) -> &logs::LogHub {
        &self.inner.logs
    }

    /// Checks a request against the inventory before anything is created.
    pub fn check(&self, spec: &LaunchSpec) -> Result<(), LaunchError> {
        if spec.command.is_none() && spec.config.is_none() {
            return Err(LaunchError::NothingToRun);
        }
        match self.executor_of(spec) {
            slurm::Executor::Local if spec.slurm != slurm::SlurmOptions::default() => {
                Err(LaunchError::Invalid(crate::validate::Invalid::new(
                    "resources.slurm",
                    "resources.slurm applies to Slurm runs only; this run executes on the \
                     server's machine (set resources.executor to `slurm`)",
                )))
            }
            slurm::Executor::Local => self.check_gpus(spec.gpus),
            slurm::Executor::Slurm
                if self.inner.settings.executor != slurm::Executor::Slurm
                    && !self.inner.settings.slurm.allowed =>
            {
                Err(LaunchError::Invalid(crate::validate::Invalid::new(
                    "resources.executor",
                    "this server does not send runs to Slurm; an operator can turn it on with \
                     `trainyard serve --executor slurm` (or --allow-slurm to keep local runs \
                     the default)",
                )))
            }
            // The cluster's GPUs are Slurm's to count.
            slurm::Executor::Slurm => spec
                .slurm
                .validate("resources.slurm")
                .map_err(LaunchError::Invalid),
        }
    }

    /// `check`, and for a Slurm run whether the cluster has its partition (`sinfo`).
    pub async fn admit(&self, spec: &LaunchSpec) -> Result<(), LaunchError> {
        self.check(spec)?;
        if self.executor_of(spec) != slurm::Executor::Slurm {
            return Ok(());
        }
        let options = self.slurm_options(spec);
        let Some(wanted) = &options.partition else {
            return Ok(());
        };
        let known = self.inner.slurm.partitions().await.map_err(|e| {
            LaunchError::SlurmUnavailable(format!("cannot ask Slurm for its partitions: {e}"))
        })?;
        // `a,b` lets Slurm pick the first partition that can run the job: each must exist.
        for name in wanted.split(',') {
            if !known.iter().any(|k| k == name) {
                let field = if spec.slurm.partition.is_some() {
                    "resources.slurm.partition"
                } else {
                    "--slurm-partition"
                };
                return Err(LaunchError::Invalid(crate::validate::Invalid::new(
                    field,
                    format!(
                        "the Slurm cluster has no partition `{name}`; it has {}",
                        if known.is_empty() {
                            "none".to_string()
                        } else {
                            known.join(", ")
                        }
                    ),
                )));
            }
        }
        Ok(())
    }

    fn executor_of(&self, spec: &LaunchSpec) -> slurm::Executor {
        spec.executor.unwrap_or(self.inner.settings.executor)
    }

    fn slurm_options(&self, spec: &LaunchSpec) -> slurm::SlurmOptions {
        spec.slurm.over(&self.inner.settings.slurm.defaults)
    }

    /// Whether this server has `gpus` GPUs (0 asks for a CPU slot).
    fn check_gpus(&self, gpus: usize) -> Result<(), LaunchError> {
        let available = if gpus == 0 { 0 } else { self.inner.gpus.len() };
        if gpus > available {
            return Err(LaunchError::TooManyGpus {
                requested: gpus,
                available,
            });
        }
        Ok(())
    }

    /// Creates the run as `queued`, prepares its directory and puts it in line.
    #[tracing::instrument(skip(self, new, spec), fields(gpus = spec.gpus))]
    pub async fn launch(&self, mut new: NewRun, spec: LaunchSpec) -> Result<Run, LaunchError> {
        self.check(&spec)?;
        let executor = self.executor_of(&spec);
        let slurm_record = (executor == slurm::Executor::Slurm).then(|| slurm::SlurmRecord {
            options: self.slurm_options(&spec),
            ..Default::default()
        });
        new.status = Some(RunStatus::Queued);
        new.tags
            .entry("trainyard.launcher".into())
            .or_insert_with(|| executor.as_str().into());
        if let Some(p) = slurm_record
            .as_ref()
            .and_then(|s| s.options.partition.clone())
        {
            new.tags.insert(slurm::PARTITION_TAG.into(), p);
        }
        let run = self.inner.store.create_run(new).await?;
        let dir = self.inner.run_dir(&run.id);
        let record = LaunchRecord {
            gpus_requested: spec.gpus,
            max_restarts: spec.max_restarts,
            command: spec.command,
            attempts: 0,
            process: None,
            first_started_at_ms: None,
            resume_from: None,
            attempts_before_resume: 0,
            env: spec.env,
            read: spec.read,
            executor,
            slurm: slurm_record,
        };
        let config = spec.config;
        let dir2 = dir.clone();
        let prepared = tokio::task::spawn_blocking(move || -> std::io::Result<()> {
            std::fs::create_dir_all(&dir2)?;
            if let Some(config) = config {
                let text = serde_json::to_vec_pretty(&config).map_err(std::io::Error::other)?;
                std::fs::write(dir2.join(process::CONFIG_FILE), text)?;
            }
            record.save(&dir2)
        })
        .await
        .map_err(std::io::Error::other)
        .and_then(|r| r);
        if let Err(e) = prepared {
            // The run exists already: end it with the reason rather than leave it queued with
            // nothing that will ever start it.
            let reason = format!("could not prepare the run directory runs/{}: {e}", run.id);
            tracing::error!(run = %run.id, error = %e, "launch failed");
            let exit = ExitInfo {
                message: Some(reason.clone()),
                ..ExitInfo::default()
            };
            self.inner
                .hooks
                .set_status(&run.id, RunStatus::Failed, &reason, Some(exit))
                .await
                .map_err(|e| std::io::Error::other(e.to_string()))?;
            return Ok(self.inner.store.get_run(&run.id).await?);
        }
        if executor == slurm::Executor::Slurm {
            slurm::follow(&self.inner, &run.id);
            return Ok(run);
        }
        self.inner.state().sched.enqueue(run.id.clone(), spec.gpus);
        self.inner.wake.notify_one();
        Ok(run)
    }

    /// Whether this server launched the run (then it supervises its process, or re-adopts it
    /// after a restart).
    pub fn is_launched(&self, run_id: &str) -> bool {
        self.inner
            .run_dir(run_id)
            .join(process::LAUNCH_FILE)
            .exists()
    }

    /// Run ids waiting in the queue, oldest first.
    pub fn queued(&self) -> Vec<String> {
        self.inner
            .state()
            .sched
            .queued()
            .map(String::from)
            .collect()
    }
}
