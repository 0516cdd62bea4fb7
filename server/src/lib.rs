//! Trainyard server: tracking store, REST API, live events, dashboard and launcher.

pub mod charts;
pub mod store;
pub mod http {
    pub mod pages;
    pub mod views;
}
