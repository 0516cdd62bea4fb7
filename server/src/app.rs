//! Wiring: settings → store + live hub → router → bound listener.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use axum::extract::DefaultBodyLimit;
use axum::http::Uri;
use axum::{middleware, Router};
use tokio::net::TcpListener;
use tower_http::catch_panic::CatchPanicLayer;
use tower_http::timeout::RequestBodyTimeoutLayer;
use tower_http::trace::TraceLayer;

use crate::http;
use crate::launcher::hooks::AppHooks;
use crate::launcher::{Launcher, LauncherSettings};
use crate::live::LiveHub;
use crate::store::accounts::Level;
use crate::store::{self, DynStore};

/// Largest request body accepted (a full 10,000-point batch is well under 1 MiB).
pub const DEFAULT_BODY_LIMIT: usize = 16 * 1024 * 1024;
/// A real client sends its request headers at once; a slow one is holding a connection.
pub const DEFAULT_HEADER_TIMEOUT: Duration = Duration::from_secs(10);
/// Longest pause allowed while a request body arrives (between reads, not in total: a large
/// metric batch on a slow link may take longer than this overall).
pub const DEFAULT_BODY_TIMEOUT: Duration = Duration::from_secs(30);
/// Connections served at once: far more than browsers, trainers and scripts open, and fewer
/// than the usual 1024 open-file limit (it is lowered further when that limit is lower).
pub const DEFAULT_MAX_CONNECTIONS: usize = 512;
/// Connections one client address may hold: an eighth of the whole, far more than a browser
/// (six per server), trainers and scripts on one machine open, so no one address takes them all.
pub const DEFAULT_MAX_CONNECTIONS_PER_ADDRESS: usize = 64;
/// Time a request body has in total to arrive (more for each further body limit's worth of an
/// upload): a full 16 MiB body fits at about 56 KiB/s.
pub const DEFAULT_BODY_DEADLINE: Duration = Duration::from_secs(300);

/// Silence after which a running run not launched here is marked `lost`: ten missed heartbeats
/// of the trainer (every 30 s), so a slow network or a long evaluation does not trip it.
pub const DEFAULT_LOST_AFTER: Duration = Duration::from_secs(300);

/// Everything `serve` needs; built from the CLI or by tests.
#[derive(Clone)]
pub struct Settings {
    /// Where to listen; port 0 picks a free port.
    pub addr: SocketAddr,
    /// Holds the default SQLite database and, later, run directories.
    pub data_dir: PathBuf,
    /// `sqlite:...` or `postgres://...`; `None` means `sqlite:<data_dir>/trainyard.db`.
    pub database_url: Option<String>,
    /// Required for any non-loopback address; then every `/api` request must carry it.
    pub admin_token: Option<String>,
    pub body_limit: usize,
    /// The URL users reach the server at when that is not `addr` (a DNS name, a reverse proxy):
    /// its host is accepted in `Host`, its origin in `Origin`. See `http::guard`.
    pub public_url: Option<Uri>,
    /// More host names (or IP addresses) the server answers to, normalized; loopback names and
    /// the bound address always are.
    pub allowed_hosts: Vec<String>,
    /// Time a connection has to send a request's headers (and most an idle keep-alive lasts).
    pub header_timeout: Duration,
    /// Longest pause while reading a request body. Responses (event streams) are not bounded.
    pub body_timeout: Duration,
    /// Time a request body has in total to arrive (and as much again per further `body_limit`
    /// bytes of an upload); `http::serve::DeadlineBody`.
    pub body_deadline: Duration,
    /// Connections served at once; more wait to be accepted.
    pub max_connections: usize,
    /// Connections one client address may hold at once; more are answered 429 and closed.
    pub max_connections_per_address: usize,
    /// Event streams one principal and one client address may hold open at once; more are
    /// answered 429 (`live::StreamSlots`).
    pub streams: crate::live::StreamLimits,
    /// How a sweep controller whose step fails tries again, and when it gives up.
    pub sweep_retry: crate::sweeps::Retry,
    /// Whether launch requests may run an arbitrary `command` (off by default: whoever can call
    /// the API could otherwise run anything as the server's user).
    pub allow_command_launch: bool,
    /// A running run this server did not launch is marked `lost` after this long without a
    /// heartbeat, metric or update from its client (`crate::liveness`).
    pub lost_after: Duration,
    /// Accounts on a loopback address too (`--auth`); any other address always has them.
    pub auth: bool,
    /// The level every signed-in user gets on experiments created from now on.
    pub default_level: Level,
    /// A browser session ends after this long without a request...
    pub session_idle: Duration,
    /// ...and this long after sign-in in any case.
    pub session_max: Duration,
    /// GPUs, CPU slots, stop grace period and trainer binary of the local executor
    /// (its `data_dir` is replaced by the one above).
    pub launcher: LauncherSettings,
}

/// Written by hand so the admin token never reaches a log.
impl std::fmt::Debug for Settings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Settings")
            .field("addr", &self.addr)
            .field("data_dir", &self.data_dir)
            .field("database_url", &self.database_url)
            .field(
                "admin_token",
                &self.admin_token.as_ref().map(|_| "<redacted>"),
            )
            .field("body_limit", &self.body_limit)
            .field("public_url", &self.public_url)
            .field("allowed_hosts", &self.allowed_hosts)
            .field("header_timeout", &self.header_timeout)
            .field("body_timeout", &self.body_timeout)
            .field("body_deadline", &self.body_deadline)
            .field("max_connections", &self.max_connections)
            .field(
                "max_connections_per_address",
                &self.max_connections_per_address,
            )
            .field("streams", &self.streams)
            .field("sweep_retry", &self.sweep_retry)
            .field("allow_command_launch", &self.allow_command_launch)
            .field("lost_after", &self.lost_after)
            .field("auth", &self.auth)
            .field("default_level", &self.default_level)
            .field("session_idle", &self.session_idle)
            .field("session_max", &self.session_max)
            .finish()
    }
}

impl Settings {
    pub fn new(addr: SocketAddr, data_dir: impl Into<PathBuf>) -> Self {
        let data_dir = data_dir.into();
        Settings {
            addr,
            launcher: LauncherSettings::new(&data_dir),
            data_dir,
            database_url: None,
            admin_token: None,
            body_limit: DEFAULT_BODY_LIMIT,
            public_url: None,
            allowed_hosts: Vec::new(),
            header_timeout: DEFAULT_HEADER_TIMEOUT,
            body_timeout: DEFAULT_BODY_TIMEOUT,
            body_deadline: DEFAULT_BODY_DEADLINE,
            max_connections: DEFAULT_MAX_CONNECTIONS,
            max_connections_per_address: DEFAULT_MAX_CONNECTIONS_PER_ADDRESS,
            streams: crate::live::StreamLimits::default(),
            sweep_retry: crate::sweeps::Retry::default(),
            allow_command_launch: false,
            lost_after: DEFAULT_LOST_AFTER,
            auth: false,
            default_level: Level::None,
            session_idle: Duration::from_secs(12 * 3600),
            session_max: Duration::from_secs(7 * 86_400),
        }
    }

    /// The database URL actually used.
    pub fn resolved_database_url(&self) -> String {
        database_url(&self.data_dir, self.database_url.as_deref())
    }

    /// Safety by default: a server reachable from other machines must require a token.
    pub fn check_exposure(&self) -> anyhow::Result<()> {
        let token = self.admin_token.as_deref().unwrap_or("");
        if !self.addr.ip().is_loopback() && token.is_empty() {
            anyhow::bail!(
                "refusing to listen on {} without an admin token: this address is reachable from \
                 other machines. Set --admin-token (or TRAINYARD_ADMIN_TOKEN), or bind to \
                 127.0.0.1",
                self.addr
            );
        }
        Ok(())
    }
}

/// Shared by every handler. Cheap to clone: every field is an `Arc` or small.
#[derive(Clone)]
pub struct AppState {
    pub store: DynStore,
    pub live: Arc<LiveHub>,
    pub settings: Arc<Settings>,
    /// Queue, GPUs and supervision of launched runs.
    pub launcher: Launcher,
    /// Last signs of life of runs reporting from elsewhere.
    pub liveness: Arc<crate::liveness::Liveness>,
    /// Failed sign-ins per user and per client (`access::throttle`).
    pub throttle: Arc<crate::access::throttle::Throttle>,
    /// The controllers of running sweeps.
    pub sweeps: Arc<crate::sweeps::SweepHub>,
    /// Bumped when access may have been taken away, so open streams check theirs again.
    pub access_epoch: Arc<crate::access::revocation::AccessEpoch>,
    /// Hugging Face exports: shared per run, bounded per principal (`checkpoints::exports`).
    pub exports: Arc<crate::checkpoints::exports::Exports>,
    /// The pool chart images are rendered in (`http::api::charts::pool`).
    pub chart_pool: Arc<crate::http::api::charts::pool::ChartPool>,
}

impl AppState {
    pub fn new(store: DynStore, settings: Settings) -> Self {
        let live = Arc::new(LiveHub::new());
        let mut launcher_settings = settings.launcher.clone();
        launcher_settings.data_dir = settings.data_dir.clone();
        let hooks = Arc::new(AppHooks {
            store: store.clone(),
            live: live.clone(),
        });
        let launcher = Launcher::new(launcher_settings, store.clone(), hooks).with_run_tokens(
            settings.auth
                || !settings.addr.ip().is_loopback()
                || settings
                    .admin_token
                    .as_deref()
                    .is_some_and(|t| !t.is_empty()),
        );
        AppState {
            store,
            live,
            liveness: Arc::new(crate::liveness::Liveness::new(settings.lost_after)),
            throttle: Arc::default(),
            sweeps: Arc::new(
                crate::sweeps::SweepHub::new(crate::sweeps::POLL).with_retry(settings.sweep_retry),
            ),
            access_epoch: Arc::default(),
            exports: Arc::default(),
            chart_pool: Arc::default(),
            settings: Arc::new(settings),
            launcher,
        }
    }
}

/// The whole HTTP surface, ready for `http::serve` or `tower::ServiceExt::oneshot`.
///
/// Layers, outermost first: tracing, panic catching, security headers on every response, the
/// host and cross-site checks, the request body's total deadline, its timeout and size limit,
/// the NUL checks on path and query parameters and on form bodies (JSON bodies are checked by
/// their extractors); then routing and each router's own access check.
pub fn app(state: AppState) -> Router {
    let hosts = Arc::new(http::guard::HostRules::new(&state.settings));
    Router::new()
        .merge(http::api::health::router())
        .nest("/api/v1", http::api_router())
        .merge(http::mlflow::router())
        .merge(http::pages::router())
        // The one access check, on every route above (not on fallbacks: an unknown path is a
        // 404 whoever asks).
        .route_layer(middleware::from_fn_with_state(
            state.clone(),
            http::access::check,
        ))
        .fallback(http::not_found)
        .layer(middleware::from_fn(http::guard::reject_nul_bytes))
        .layer(middleware::from_fn(http::extract::reject_nul_in_forms))
        .layer(DefaultBodyLimit::max(state.settings.body_limit))
        .layer(RequestBodyTimeoutLayer::new(state.settings.body_timeout))
        .layer(tower::util::MapRequestLayer::new(
            http::serve::DeadlineBody::wrap(
                state.settings.body_deadline,
                state.settings.body_limit,
            ),
        ))
        .layer(middleware::from_fn_with_state(
            hosts,
            http::guard::check_host_and_site,
        ))
        .layer(middleware::map_response(http::guard::security_headers))
        .layer(CatchPanicLayer::custom(http::panic_response))
        .layer(TraceLayer::new_for_http())
        .with_state(state)
}

pub struct Application {
    listener: TcpListener,
    port: u16,
    state: AppState,
}

impl Application {
    /// Checks the settings, opens the store (running migrations) and binds the listener.
    pub async fn build(mut settings: Settings) -> anyhow::Result<Application> {
        settings.check_exposure()?;
        // A launched run starts inside its run directory, so the paths it is given (its config,
        // its run directory, the token cache) must not be relative to ours.
        settings.data_dir = std::path::absolute(&settings.data_dir)
            .with_context(|| format!("resolving data directory {}", settings.data_dir.display()))?;
        if settings.database_url.is_none() {
            std::fs::create_dir_all(&settings.data_dir).with_context(|| {
                format!("creating data directory {}", settings.data_dir.display())
            })?;
        }
        prepare_launches(&mut settings)?;
        let url = settings.resolved_database_url();
        let store = store::connect(&url)
            .await
            .with_context(|| format!("opening the {} store", backend_name(&url)))?;
        let listener = TcpListener::bind(settings.addr)
            .await
            .with_context(|| format!("binding {}", settings.addr))?;
        let port = listener.local_addr()?.port();
        let state = AppState::new(store, settings);
        // Launched trainers report back over loopback even when we listen on all interfaces.
        let mut local = listener.local_addr()?;
        if local.ip().is_unspecified() {
            local.set_ip(std::net::Ipv4Addr::LOCALHOST.into());
        }
        state
            .launcher
            .start(format!("http://{local}"))
            .await
            .context("recovering launched runs")?;
        Ok(Application {
            listener,
            port,
            state,
        })
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    pub fn state(&self) -> &AppState {
        &self.state
    }

    /// Serves until SIGINT or SIGTERM, then finishes in-flight requests.
    pub async fn run_until_stopped(self) -> anyhow::Result<()> {
        let shutdown = shutdown_signal()?;
        self.run_until(shutdown).await
    }

    /// Serves until `shutdown` completes.
    pub async fn run_until(
        self,
        shutdown: impl std::future::Future<Output = ()> + Send + 'static,
    ) -> anyhow::Result<()> {
        tracing::info!(
            addr = %self.listener.local_addr()?,
            backend = self.state.store.backend(),
            "trainyard listening"
        );
        let live = Arc::clone(&self.state.live);
        let shutdown = async move {
            shutdown.await;
            // SSE streams never end on their own; close them so in-flight requests can drain.
            live.close();
        };
        let limits = http::serve::ConnectionLimits {
            header_timeout: self.state.settings.header_timeout,
            max_connections: self.state.settings.max_connections,
            max_per_address: self.state.settings.max_connections_per_address,
        };
        let watchdog = tokio::spawn(crate::liveness::watch(self.state.clone()));
        // Sweeps continue where they were, now that trials can report back.
        crate::sweeps::resume_all(&self.state).await;
        let sweeps = Arc::clone(&self.state.sweeps);
        http::serve::serve(self.listener, app(self.state), limits, shutdown).await;
        watchdog.abort();
        sweeps.abort_all();
        Ok(())
    }
}

/// The SQLite file a server uses when it is given no database URL.
pub fn default_database_file(data_dir: &Path) -> PathBuf {
    data_dir.join("trainyard.db")
}

/// The database a server with this data directory and `--database-url` opens (`trainyard
/// user` opens the same one).
pub fn database_url(data_dir: &Path, database_url: Option<&str>) -> String {
    match database_url.filter(|u| !u.is_empty()) {
        Some(url) => url.to_string(),
        None => format!(
            "sqlite://{}?mode=rwc",
            default_database_file(data_dir).display()
        ),
    }
}

/// Checks the data roots, creates the token cache and decides whether runs are confined: a
/// server with accounts whose kernel has no Landlock refuses to start unless its operator says
/// runs are not confined (`--unconfined-runs`).
fn prepare_launches(settings: &mut Settings) -> anyhow::Result<()> {
    use crate::launcher::confine::kernel_abi;
    // A data root must not hold the database: the default file, or an explicit SQLite one.
    let database_file = match settings.database_url.as_deref() {
        None => Some(default_database_file(&settings.data_dir)),
        Some(url) => url
            .strip_prefix("sqlite://")
            .or_else(|| url.strip_prefix("sqlite:"))
            .map(|rest| PathBuf::from(rest.split('?').next().unwrap_or(rest))),
    };
    std::fs::create_dir_all(&settings.data_dir)
        .with_context(|| format!("creating data directory {}", settings.data_dir.display()))?;
    let launcher = &mut settings.launcher;
    launcher.roots = crate::launcher::roots::DataRoots::resolve(
        &launcher.data_roots,
        &settings.data_dir,
        database_file.as_deref(),
    )?;
    let cache = crate::launcher::token_cache(&settings.data_dir);
    std::fs::create_dir_all(&cache)
        .with_context(|| format!("creating the token cache {}", cache.display()))?;
    let accounts = settings.auth || !settings.addr.ip().is_loopback();
    launcher.confinement =
        crate::launcher::confine::decide(launcher.unconfined_runs, kernel_abi(), accounts)?;
    if !launcher.confinement.is_on() {
        tracing::warn!(
            "launched runs are NOT confined ({}): only the data roots are checked at launch",
            if launcher.unconfined_runs {
                "--unconfined-runs"
            } else {
                "this kernel has no Landlock"
            }
        );
    }
    tracing::info!(
        data_roots = %launcher.roots.describe(),
        confined = launcher.confinement.is_on(),
        "launched runs read from the data roots"
    );
    Ok(())
}

fn backend_name(url: &str) -> &'static str {
    if url.starts_with("postgres") {
        "Postgres"
    } else {
        "SQLite"
    }
}

/// Registers the SIGINT/SIGTERM handlers now (a signal arriving before registration would kill
/// the process outright) and returns a future that completes on the first of them.
#[cfg(unix)]
fn shutdown_signal() -> anyhow::Result<impl std::future::Future<Output = ()>> {
    use tokio::signal::unix::{signal, SignalKind};
    let mut interrupt = signal(SignalKind::interrupt()).context("listening for SIGINT")?;
    let mut terminate = signal(SignalKind::terminate()).context("listening for SIGTERM")?;
    Ok(async move {
        tokio::select! {
            _ = interrupt.recv() => {},
            _ = terminate.recv() => {},
        }
        tracing::info!("shutdown signal received; finishing in-flight requests");
    })
}

#[cfg(not(unix))]
fn shutdown_signal() -> anyhow::Result<impl std::future::Future<Output = ()>> {
    Ok(async {
        if tokio::signal::ctrl_c().await.is_err() {
            std::future::pending::<()>().await;
        }
        tracing::info!("shutdown signal received; finishing in-flight requests");
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings(addr: &str, token: Option<&str>) -> Settings {
        let mut s = Settings::new(addr.parse().expect("addr"), "data");
        s.admin_token = token.map(str::to_string);
        s
    }

    #[test]
    fn only_a_non_loopback_address_without_a_token_is_refused() {
        assert!(settings("127.0.0.1:8080", None).check_exposure().is_ok());
        assert!(settings("[::1]:8080", None).check_exposure().is_ok());
        assert!(settings("0.0.0.0:8080", None).check_exposure().is_err());
        assert!(settings("0.0.0.0:8080", Some("")).check_exposure().is_err());
        assert!(settings("0.0.0.0:8080", Some("t0k"))
            .check_exposure()
            .is_ok());
    }

    #[test]
    fn the_default_database_is_a_sqlite_file_in_the_data_dir() {
        let url = settings("127.0.0.1:0", None).resolved_database_url();
        assert!(url.starts_with("sqlite://"), "{url}");
        assert!(url.contains("trainyard.db"), "{url}");
    }

    #[test]
    fn debug_output_never_shows_the_admin_token() {
        let text = format!("{:?}", settings("127.0.0.1:0", Some("hunter2")));
        assert!(!text.contains("hunter2"), "{text}");
    }
}
