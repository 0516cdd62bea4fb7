//! Trainyard server: tracking store, REST API, live events, dashboard and launcher.

pub mod access;
pub mod actions;
pub mod app;
pub mod chart_pool;
pub mod checkpoints;
pub mod cli;
pub mod client;
pub mod environ;
pub mod error;
pub mod http;
pub mod ingest;
pub mod launcher;
pub mod live;
pub mod liveness;
pub mod registry;
pub mod search;
pub mod settings;
pub mod state;
pub mod status;
pub mod store;
pub mod submit;
pub mod sweep_cli;
pub mod sweeps;
pub mod telemetry;
pub mod user_cli;
pub mod validate;
