//! Wiring: settings → store + live hub → router → bound listener.

use std::path::PathBuf;
use std::sync::Arc;

use anyhow::Context;
use axum::extract::DefaultBodyLimit;
use axum::{middleware, Router};
use tokio::net::TcpListener;
use tower_http::catch_panic::CatchPanicLayer;
use tower_http::timeout::RequestBodyTimeoutLayer;
use tower_http::trace::TraceLayer;

use crate::http;
pub use crate::settings::{
    database_url, default_database_file, Settings, DEFAULT_BODY_DEADLINE, DEFAULT_BODY_LIMIT,
    DEFAULT_BODY_TIMEOUT, DEFAULT_HEADER_TIMEOUT, DEFAULT_LOST_AFTER, DEFAULT_MAX_CONNECTIONS,
    DEFAULT_MAX_CONNECTIONS_PER_ADDRESS,
};
pub use crate::state::AppState;
use crate::store;

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
