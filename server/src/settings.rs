//! What `serve` was given: [`Settings`], built from the command line or by tests, the defaults
//! of its limits, and the parsing of the values that need more than clap's.

use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::time::Duration;

use ::http::Uri;

use crate::launcher::LauncherSettings;
use crate::store::accounts::Level;

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
    pub sweep_retry: crate::sweeps::retry::Retry,
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
            sweep_retry: crate::sweeps::retry::Retry::default(),
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

    /// Whether accounts are on: `--auth`, or a server reachable from other machines.
    pub fn accounts_on(&self) -> bool {
        self.auth || !self.addr.ip().is_loopback()
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

/// `--public-url`: an absolute `http`/`https` URL with a host.
pub fn parse_public_url(text: &str) -> Result<Uri, String> {
    let bad = || {
        format!(
            "`{text}` is not an absolute http:// or https:// URL such as \
             https://trainyard.example.com"
        )
    };
    let url: Uri = text.trim().parse().map_err(|_| bad())?;
    let web = matches!(url.scheme_str(), Some("http" | "https"));
    let has_host = url.host().is_some_and(|h| !h.is_empty());
    let userinfo = url.authority().is_some_and(|a| a.as_str().contains('@'));
    if !web || !has_host || userinfo {
        return Err(bad());
    }
    Ok(url)
}

/// `--allowed-host`: a bare host name or IP address, stored normalized.
pub fn parse_host_name(text: &str) -> Result<String, String> {
    let text = text.trim();
    let bare = text.trim_start_matches('[').trim_end_matches(']');
    let ip = bare.parse::<IpAddr>().is_ok();
    let name = !bare.is_empty()
        && bare
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'.');
    if ip || name {
        Ok(normalize_host(text))
    } else {
        Err(format!(
            "`{text}` is not a host name: give a name or IP address such as trainyard.lan, \
             without scheme, port or wildcard"
        ))
    }
}

/// Lowercase, without IPv6 brackets or a final dot; IP addresses in their canonical form, so
/// `[0:0::1]` and `::1` compare equal.
pub fn normalize_host(host: &str) -> String {
    let bare = host.trim_start_matches('[').trim_end_matches(']');
    if let Ok(ip) = bare.parse::<IpAddr>() {
        return ip.to_string();
    }
    let bare = bare.strip_suffix('.').unwrap_or(bare);
    bare.to_ascii_lowercase()
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
