//! The routers' state, [`AppState`]: the store, the live hub, the settings and the shared
//! services, built once in [`AppState::new`]. Nothing here knows HTTP.

use std::sync::Arc;

use crate::launcher::hooks::AppHooks;
use crate::launcher::Launcher;
use crate::live::LiveHub;
use crate::settings::Settings;
use crate::store::DynStore;

/// Shared by every handler. Cheap to clone: every field is an `Arc` or small.
#[derive(Clone)]
pub struct AppState {
    pub store: DynStore,
    pub live: Arc<LiveHub>,
    pub settings: Arc<Settings>,
    /// Queue, GPUs and supervision of launched runs.
    pub launcher: Launcher,
    /// Last signs of life of runs reporting from elsewhere.
    pub liveness: Arc<crate::liveness::tracker::Liveness>,
    /// Failed sign-ins per user and per client (`access::throttle`).
    pub throttle: Arc<crate::access::throttle::Throttle>,
    /// The controllers of running sweeps.
    pub sweeps: Arc<crate::sweeps::hub::SweepHub>,
    /// Bumped when access may have been taken away, so open streams check theirs again.
    pub access_epoch: Arc<crate::access::epoch::AccessEpoch>,
    /// Hugging Face exports: shared per run, bounded per principal (`checkpoints::exports`).
    pub exports: Arc<crate::checkpoints::exports::Exports>,
    /// The pool chart images are rendered in (`chart_pool`).
    pub chart_pool: Arc<crate::chart_pool::ChartPool>,
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
            liveness: Arc::new(crate::liveness::tracker::Liveness::new(settings.lost_after)),
            throttle: Arc::default(),
            sweeps: Arc::new(
                crate::sweeps::hub::SweepHub::new(crate::sweeps::hub::POLL)
                    .with_retry(settings.sweep_retry),
            ),
            access_epoch: Arc::default(),
            exports: Arc::default(),
            chart_pool: Arc::default(),
            settings: Arc::new(settings),
            launcher,
        }
    }
}
