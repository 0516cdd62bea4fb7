//! Trainyard server: tracking store, REST API, live events, dashboard and launcher.

pub mod app;
pub mod cli;
pub mod http;
pub mod ingest;
pub mod launcher;
pub mod live;
pub mod search;
pub mod status;
pub mod store;
pub mod submit;
pub mod telemetry;
