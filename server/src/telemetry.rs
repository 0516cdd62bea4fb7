//! Structured logs through `tracing`; `RUST_LOG` overrides the default filter.

use tracing_subscriber::EnvFilter;

/// Installs the global subscriber once; later calls (tests) are no-ops.
pub fn init() {
    let filter = EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| EnvFilter::new("info,tower_http=info,sqlx=warn"));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_target(false)
        .try_init();
}
