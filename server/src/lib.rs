//! Trainyard server: tracking store, REST API, live events, dashboard and launcher.

pub mod launcher;
pub mod store;
