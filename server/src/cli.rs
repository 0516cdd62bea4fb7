//! The `trainyard` command line. Each subcommand is one enum variant with its own args struct
//! and one arm in `run`.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use ::http::Uri;
use clap::{Args, Parser, Subcommand};

use crate::store::accounts::Level;

use crate::app::{Application, Settings, DEFAULT_BODY_LIMIT};
use crate::settings::{parse_host_name, parse_public_url};

#[derive(Debug, Parser)]
#[command(
    name = "trainyard",
    version,
    about = "Train language models from the browser"
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run the tracking server, REST API and dashboard.
    Serve(ServeArgs),
    /// Launch a run on a server (and follow it with --follow).
    Submit(crate::submit::SubmitArgs),
    /// Hyperparameter sweeps on a server (`sweep submit sweep.yaml --follow`, pause, resume, stop).
    Sweep(crate::sweep_cli::SweepArgs),
    /// Train a GPT from a config file or profile (what launched runs execute).
    Train(trainer::cli::TrainArgs),
    /// Generate text from a checkpoint.
    Sample(trainer::cli::SampleArgs),
    /// Tokenizer tools (`tokenizer train --input ... --vocab-size N --out tokenizer.json`).
    Tokenizer(trainer::cli::TokenizerArgs),
    /// Export a checkpoint as a Hugging Face directory
    /// (`export --format hf [--merge] RUN_OR_CHECKPOINT OUT_DIR`).
    Export(trainer::cli::ExportArgs),
    /// Manage accounts on the server's database (`user add NAME --admin`, `user list`, ...).
    User(crate::user_cli::UserArgs),
    /// Run a command confined to the files and ports given (what a Slurm job script starts a
    /// run through; `docs/security.md`, "What a launched run can touch").
    #[command(hide = true)]
    Confine(crate::launcher::confine::ConfineArgs),
}

#[derive(Debug, Args)]
pub struct ServeArgs {
    /// Address to listen on. Anything but loopback requires --admin-token.
    #[arg(long, env = "TRAINYARD_ADDR", default_value = "127.0.0.1:8080")]
    pub addr: SocketAddr,
    /// Directory for the default SQLite database and run data.
    #[arg(long, env = "TRAINYARD_DATA_DIR", default_value = "./trainyard-data")]
    pub data_dir: PathBuf,
    /// `sqlite:PATH` or `postgres://...` [default: a SQLite file inside --data-dir]
    #[arg(long, env = "DATABASE_URL")]
    pub database_url: Option<String>,
    /// Token every /api request must carry as `Authorization: Bearer <token>`.
    #[arg(long, env = "TRAINYARD_ADMIN_TOKEN", hide_env_values = true)]
    pub admin_token: Option<String>,
    /// A file whose first line is the admin token (instead of --admin-token, which other
    /// processes of the same user can read from this process's environment or command line).
    #[arg(
        long,
        env = "TRAINYARD_ADMIN_TOKEN_FILE",
        conflicts_with = "admin_token"
    )]
    pub admin_token_file: Option<PathBuf>,
    /// A folder whose files launched runs may read (repeatable, or comma-separated in the
    /// variable). Every path of a launch config must lie in one [default: the datasets folder
    /// inside --data-dir].
    #[arg(
        long = "data-root",
        env = "TRAINYARD_DATA_ROOTS",
        value_delimiter = ','
    )]
    pub data_roots: Vec<PathBuf>,
    /// Launch runs without confining them with Landlock. Needed to start a server with
    /// accounts on a kernel without Landlock; `/healthz` then says `runs_confined: false`.
    #[arg(long, env = "TRAINYARD_UNCONFINED_RUNS")]
    pub unconfined_runs: bool,
    /// GPUs the launcher may use, e.g. `0,1` [default: every GPU nvidia-smi lists].
    #[arg(long, env = "TRAINYARD_GPUS")]
    pub gpus: Option<String>,
    /// Concurrent CPU runs (`gpus: 0`).
    #[arg(long, env = "TRAINYARD_CPU_SLOTS", default_value_t = 2)]
    pub cpu_slots: usize,
    /// Seconds a stopped run gets between SIGTERM and SIGKILL.
    #[arg(long, env = "TRAINYARD_STOP_GRACE", default_value_t = 30)]
    pub stop_grace_secs: u64,
    /// URL users reach this server at when it is not --addr (a DNS name, a reverse proxy), e.g.
    /// `https://trainyard.example.com`. Its host is accepted in `Host`, its origin in `Origin`.
    #[arg(long, env = "TRAINYARD_PUBLIC_URL", value_parser = parse_public_url)]
    pub public_url: Option<Uri>,
    /// More host names this server answers to (comma-separated). Loopback names and the
    /// --addr IP are always accepted; any other `Host` is refused.
    #[arg(
        long = "allowed-host",
        env = "TRAINYARD_ALLOWED_HOSTS",
        value_delimiter = ',',
        value_parser = parse_host_name
    )]
    pub allowed_hosts: Vec<String>,
    /// Seconds a connection has to send a request's headers; idle connections close after it.
    #[arg(long, env = "TRAINYARD_HEADER_TIMEOUT", default_value_t = 10,
          value_parser = clap::value_parser!(u64).range(1..))]
    pub header_timeout_secs: u64,
    /// Longest pause, in seconds, while a request body arrives.
    #[arg(long, env = "TRAINYARD_BODY_TIMEOUT", default_value_t = 30,
          value_parser = clap::value_parser!(u64).range(1..))]
    pub body_timeout_secs: u64,
    /// Seconds a request body has in total to arrive (as many again per further 16 MiB of an
    /// upload); a body still arriving after it is answered 408.
    #[arg(long, env = "TRAINYARD_BODY_DEADLINE", default_value_t = 300,
          value_parser = clap::value_parser!(u64).range(1..))]
    pub body_deadline_secs: u64,
    /// Connections served at once; more wait to be accepted.
    #[arg(long, env = "TRAINYARD_MAX_CONNECTIONS", default_value_t = 512,
          value_parser = clap::value_parser!(u64).range(1..))]
    pub max_connections: u64,
    /// Connections one client address may hold at once; more are answered 429 and closed.
    /// Behind a reverse proxy every client has the proxy's address: raise it there.
    #[arg(long, env = "TRAINYARD_MAX_CONNECTIONS_PER_ADDRESS", default_value_t = 64,
          value_parser = clap::value_parser!(u64).range(1..))]
    pub max_connections_per_address: u64,
    /// Event streams (all runs' events, a run's events, a sweep's events, a followed log) one
    /// user, the admin token or one run's token may hold open at once; more are answered 429.
    #[arg(long, env = "TRAINYARD_MAX_STREAMS_PER_PRINCIPAL",
          default_value_t = crate::live::DEFAULT_STREAMS_PER_PRINCIPAL as u64,
          value_parser = clap::value_parser!(u64).range(1..))]
    pub max_streams_per_principal: u64,
    /// Event streams one client address may hold open at once; more are answered 429. Behind
    /// a reverse proxy every client has the proxy's address: raise it there.
    #[arg(long, env = "TRAINYARD_MAX_STREAMS_PER_ADDRESS",
          default_value_t = crate::live::DEFAULT_STREAMS_PER_ADDRESS as u64,
          value_parser = clap::value_parser!(u64).range(1..))]
    pub max_streams_per_address: u64,
    /// Let launch requests run an arbitrary `command` as this server's user (off by default).
    #[arg(long, env = "TRAINYARD_ALLOW_COMMAND_LAUNCH")]
    pub allow_command_launch: bool,
    /// Seconds without a heartbeat, metric or update after which a running run that this
    /// server did not launch is marked `lost` (it becomes `running` again if it reports).
    #[arg(long, env = "TRAINYARD_LOST_AFTER", default_value_t = 300,
          value_parser = clap::value_parser!(u64).range(1..))]
    pub lost_after_secs: u64,
    /// Turn accounts on (sign-in, tokens, per-experiment roles) on a loopback address too;
    /// any other address always has them.
    #[arg(long, env = "TRAINYARD_AUTH")]
    pub auth: bool,
    /// The level every signed-in user gets on experiments created from now on: `none`,
    /// `read` or `edit` (owners and grants can change it per experiment).
    #[arg(long, env = "TRAINYARD_DEFAULT_LEVEL", default_value = "none", value_parser = parse_default_level)]
    pub default_level: Level,
    /// Hours of inactivity after which a browser session ends.
    #[arg(long, env = "TRAINYARD_SESSION_IDLE_HOURS", default_value_t = 12,
          value_parser = clap::value_parser!(u64).range(1..))]
    pub session_idle_hours: u64,
    /// Days after sign-in at which a session ends, however active.
    #[arg(long, env = "TRAINYARD_SESSION_MAX_DAYS", default_value_t = 7,
          value_parser = clap::value_parser!(u64).range(1..))]
    pub session_max_days: u64,
    /// Boxed: the Slurm flags would make `serve`'s arguments much larger than every other
    /// subcommand's.
    #[command(flatten)]
    pub slurm: Box<SlurmArgs>,
}

/// Where launched runs execute, and the Slurm executor's defaults (docs/slurm.md).
#[derive(Debug, Clone, Args)]
pub struct SlurmArgs {
    /// Where launched runs execute unless their request says (`resources.executor`): `local`
    /// (this machine) or `slurm` (submitted with sbatch to the cluster this machine can reach).
    #[arg(long, env = "TRAINYARD_EXECUTOR", default_value = "local", value_parser = parse_executor)]
    pub executor: crate::launcher::slurm::Executor,
    /// Let a request choose `resources.executor: slurm` while --executor stays `local`.
    #[arg(long, env = "TRAINYARD_ALLOW_SLURM")]
    pub allow_slurm: bool,
    /// Default Slurm partition of Slurm runs (checked against `sinfo` at launch).
    #[arg(long, env = "TRAINYARD_SLURM_PARTITION")]
    pub slurm_partition: Option<String>,
    /// Default Slurm account.
    #[arg(long, env = "TRAINYARD_SLURM_ACCOUNT")]
    pub slurm_account: Option<String>,
    /// Default Slurm QoS.
    #[arg(long, env = "TRAINYARD_SLURM_QOS")]
    pub slurm_qos: Option<String>,
    /// Default time limit of a Slurm job (`4:00:00`, `1-00:00:00`).
    #[arg(long, env = "TRAINYARD_SLURM_TIME")]
    pub slurm_time: Option<String>,
    /// Default GPUs per Slurm job (`--gres=gpu:N`) [default: the run's `resources.gpus`].
    #[arg(long, env = "TRAINYARD_SLURM_GPUS")]
    pub slurm_gpus: Option<u32>,
    /// Default CPUs per Slurm job (`--cpus-per-task`).
    #[arg(long, env = "TRAINYARD_SLURM_CPUS")]
    pub slurm_cpus: Option<u32>,
    /// Default memory per Slurm job (`--mem`, e.g. `32G`).
    #[arg(long, env = "TRAINYARD_SLURM_MEM")]
    pub slurm_mem: Option<String>,
    /// More `#SBATCH` options for every Slurm job (repeatable), e.g. `--constraint=a100`.
    #[arg(
        long = "slurm-extra",
        env = "TRAINYARD_SLURM_EXTRA",
        value_delimiter = ';'
    )]
    pub slurm_extra: Vec<String>,
    /// An sbatch option users who are not administrators may set in `resources.slurm.extra`
    /// (repeatable, its long name, e.g. `constraint`) [default: none]. Options that set output,
    /// error, input, working directory or environment are refused for everyone.
    #[arg(
        long = "slurm-allow-option",
        env = "TRAINYARD_SLURM_ALLOW_OPTIONS",
        value_delimiter = ','
    )]
    pub slurm_allow_options: Vec<String>,
    /// The URL Slurm jobs report to, when the compute nodes reach this server by another name
    /// than its listening address, e.g. `http://trainyard-host:8080`.
    #[arg(long, env = "TRAINYARD_SLURM_SERVER_URL")]
    pub slurm_server_url: Option<String>,
}

fn parse_executor(text: &str) -> Result<crate::launcher::slurm::Executor, String> {
    crate::launcher::slurm::Executor::parse(text)
        .ok_or_else(|| format!("expected local or slurm, not `{text}`"))
}

impl SlurmArgs {
    /// The executor settings, the defaults checked as a request's options are.
    pub fn apply(self, launcher: &mut crate::launcher::LauncherSettings) -> anyhow::Result<()> {
        let defaults = crate::launcher::slurm::SlurmOptions {
            partition: self.slurm_partition,
            account: self.slurm_account,
            qos: self.slurm_qos,
            time: self.slurm_time,
            gpus: self.slurm_gpus,
            cpus: self.slurm_cpus,
            mem: self.slurm_mem,
            extra: self.slurm_extra,
        };
        defaults
            .validate("--slurm")
            .map_err(|e| anyhow::anyhow!("{}", e.message.replace("--slurm.", "--slurm-")))?;
        launcher.executor = self.executor;
        launcher.slurm.allowed = self.allow_slurm;
        launcher.slurm.defaults = defaults;
        launcher.slurm.server_url = self.slurm_server_url.filter(|u| !u.is_empty());
        launcher.slurm.allowed_options = self
            .slurm_allow_options
            .iter()
            .map(|o| o.trim().trim_start_matches('-').to_string())
            .filter(|o| !o.is_empty())
            .collect();
        Ok(())
    }
}

/// The admin token from `--admin-token-file`: its first line, trimmed, not empty.
fn read_token_file(path: &std::path::Path) -> anyhow::Result<String> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| anyhow::anyhow!("--admin-token-file {}: {e}", path.display()))?;
    let token = text.lines().next().unwrap_or("").trim().to_string();
    if token.is_empty() {
        anyhow::bail!(
            "--admin-token-file {}: the file's first line is empty",
            path.display()
        );
    }
    Ok(token)
}

fn parse_default_level(text: &str) -> Result<Level, String> {
    match Level::parse(text) {
        Some(level) if level <= Level::Edit => Ok(level),
        _ => Err(format!("expected none, read or edit, not `{text}`")),
    }
}

impl ServeArgs {
    pub fn into_settings(self) -> anyhow::Result<Settings> {
        let mut launcher = crate::launcher::LauncherSettings::new(&self.data_dir);
        if let Some(list) = &self.gpus {
            let gpus =
                crate::launcher::gpus::parse_list(list).map_err(|e| anyhow::anyhow!("--{e}"))?;
            launcher.gpus = Some(gpus.iter().map(|g| g.index).collect());
        }
        launcher.cpu_slots = self.cpu_slots;
        launcher.data_roots = self.data_roots;
        launcher.unconfined_runs = self.unconfined_runs;
        let admin_token = match &self.admin_token_file {
            Some(path) => Some(read_token_file(path)?),
            None => self.admin_token.filter(|t| !t.is_empty()),
        };
        launcher.stop_grace = std::time::Duration::from_secs(self.stop_grace_secs);
        (*self.slurm).clone().apply(&mut launcher)?;
        Ok(Settings {
            launcher,
            addr: self.addr,
            data_dir: self.data_dir,
            database_url: self.database_url.filter(|u| !u.is_empty()),
            admin_token,
            body_limit: DEFAULT_BODY_LIMIT,
            public_url: self.public_url,
            allowed_hosts: self.allowed_hosts,
            header_timeout: Duration::from_secs(self.header_timeout_secs),
            body_timeout: Duration::from_secs(self.body_timeout_secs),
            body_deadline: Duration::from_secs(self.body_deadline_secs),
            max_connections: usize::try_from(self.max_connections).unwrap_or(usize::MAX),
            max_connections_per_address: usize::try_from(self.max_connections_per_address)
                .unwrap_or(usize::MAX),
            streams: crate::live::StreamLimits {
                per_principal: usize::try_from(self.max_streams_per_principal)
                    .unwrap_or(usize::MAX),
                per_address: usize::try_from(self.max_streams_per_address).unwrap_or(usize::MAX),
            },
            sweep_retry: crate::sweeps::Retry::default(),
            allow_command_launch: self.allow_command_launch,
            lost_after: Duration::from_secs(self.lost_after_secs),
            auth: self.auth,
            default_level: self.default_level,
            session_idle: Duration::from_secs(self.session_idle_hours * 3600),
            session_max: Duration::from_secs(self.session_max_days * 86_400),
        })
    }
}

/// Runs the parsed command.
pub async fn run(cli: Cli) -> anyhow::Result<()> {
    match cli.command {
        Command::Serve(args) => serve(args).await,
        Command::User(args) => crate::user_cli::run(args).await,
        Command::Confine(args) => crate::launcher::confine::run_confined(args),
        // The trainer is synchronous (and its HTTP reporter blocking): keep it off the runtime.
        Command::Train(args) => {
            tokio::task::spawn_blocking(move || trainer::cli::run_train(args)).await?
        }
        Command::Sample(args) => {
            tokio::task::spawn_blocking(move || trainer::cli::run_sample(args)).await?
        }
        Command::Tokenizer(args) => {
            tokio::task::spawn_blocking(move || trainer::cli::run_tokenizer(args)).await?
        }
        Command::Export(args) => {
            tokio::task::spawn_blocking(move || trainer::cli::run_export(args)).await?
        }
        Command::Submit(args) => {
            let code = crate::submit::run(args).await?;
            if code != 0 {
                std::process::exit(code);
            }
            Ok(())
        }
        Command::Sweep(args) => {
            let code = crate::sweep_cli::run(args).await?;
            if code != 0 {
                std::process::exit(code);
            }
            Ok(())
        }
    }
}

async fn serve(args: ServeArgs) -> anyhow::Result<()> {
    let app = Application::build(args.into_settings()?).await?;
    app.run_until_stopped().await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn serve_defaults_to_loopback_and_a_local_data_dir() {
        let cli = Cli::try_parse_from(["trainyard", "serve"]).map_err(|e| e.to_string());
        let Ok(Cli {
            command: Command::Serve(args),
        }) = cli
        else {
            panic!("serve should parse: {cli:?}");
        };
        // Env vars could override defaults on a developer machine; only check when unset.
        if std::env::var_os("TRAINYARD_ADDR").is_none() {
            assert_eq!(args.addr.to_string(), "127.0.0.1:8080");
        }
        if std::env::var_os("TRAINYARD_DATA_DIR").is_none() {
            assert_eq!(args.data_dir, PathBuf::from("./trainyard-data"));
        }
    }

    #[test]
    fn exposure_flags_are_parsed_into_the_settings() {
        let cli = Cli::try_parse_from([
            "trainyard",
            "serve",
            "--public-url",
            "https://ty.example.com",
            "--allowed-host",
            "Lab.lan,10.0.0.7",
            "--header-timeout-secs",
            "3",
            "--body-timeout-secs",
            "4",
            "--max-connections",
            "5",
            "--body-deadline-secs",
            "6",
            "--max-connections-per-address",
            "2",
        ])
        .map_err(|e| e.to_string());
        let Ok(Cli {
            command: Command::Serve(args),
        }) = cli
        else {
            panic!("serve should parse: {cli:?}");
        };
        let settings = args.into_settings().map_err(|e| e.to_string());
        let Ok(settings) = settings else {
            panic!("settings: {settings:?}");
        };
        assert_eq!(
            settings.public_url.map(|u| u.to_string()).as_deref(),
            Some("https://ty.example.com/")
        );
        assert_eq!(settings.allowed_hosts, ["lab.lan", "10.0.0.7"]);
        assert_eq!(settings.header_timeout, Duration::from_secs(3));
        assert_eq!(settings.body_timeout, Duration::from_secs(4));
        assert_eq!(settings.max_connections, 5);
        assert_eq!(settings.body_deadline, Duration::from_secs(6));
        assert_eq!(settings.max_connections_per_address, 2);
    }

    #[test]
    fn bad_exposure_flags_are_cli_errors_naming_the_flag() {
        let cases: &[(&str, &str)] = &[
            ("--public-url", "trainyard.example.com"),
            ("--allowed-host", "http://lab.lan"),
            ("--allowed-host", "lab.lan:8080"),
            ("--header-timeout-secs", "0"),
            ("--body-timeout-secs", "soon"),
            ("--max-connections", "0"),
            ("--body-deadline-secs", "0"),
            ("--max-connections-per-address", "0"),
        ];
        for (flag, value) in cases {
            let err = Cli::try_parse_from(["trainyard", "serve", flag, value])
                .err()
                .map(|e| e.to_string())
                .unwrap_or_default();
            assert!(err.contains(flag), "{flag} {value}: {err}");
        }
    }

    #[test]
    fn stream_caps_are_parsed_into_the_settings_and_zero_is_refused() {
        let cli = Cli::try_parse_from([
            "trainyard",
            "serve",
            "--max-streams-per-principal",
            "3",
            "--max-streams-per-address",
            "4",
        ]);
        let Ok(Cli {
            command: Command::Serve(args),
        }) = cli
        else {
            panic!("serve should parse: {cli:?}");
        };
        let settings = args.into_settings().map_err(|e| e.to_string());
        let Ok(settings) = settings else {
            panic!("settings: {settings:?}");
        };
        assert_eq!(settings.streams.per_principal, 3);
        assert_eq!(settings.streams.per_address, 4);
        for flag in ["--max-streams-per-principal", "--max-streams-per-address"] {
            let err = Cli::try_parse_from(["trainyard", "serve", flag, "0"])
                .err()
                .map(|e| e.to_string())
                .unwrap_or_default();
            assert!(err.contains(flag), "{flag}: {err}");
        }
    }

    #[test]
    fn a_malformed_address_is_a_cli_error_naming_the_flag() {
        let err = Cli::try_parse_from(["trainyard", "serve", "--addr", "nope"])
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(err.contains("--addr"), "{err}");
    }
}
