//! Checks every request passes before routing reaches a handler, and the headers every response
//! carries:
//!
//! - the `Host` must be a name of this server, so a web page whose own host name an attacker
//!   points at 127.0.0.1 (DNS rebinding) cannot reach the token-less loopback server;
//! - a browser request from another site may not change anything (`Sec-Fetch-Site`, `Origin`);
//!   requests without those headers (curl, the trainer, scripts) are not browsers and pass;
//! - path and query parameters may not contain NUL, which no stored text can hold;
//! - responses forbid framing and content sniffing.
//!
//! `docs/security.md` states these rules for operators.

use std::net::IpAddr;
use std::sync::Arc;

use axum::extract::rejection::RawPathParamsRejection;
use axum::extract::{Query, RawPathParams, Request, State};
use axum::http::header::{self, HeaderMap, HeaderValue};
use axum::http::uri::{Authority, Uri};
use axum::http::Method;

use crate::settings::normalize_host;
use axum::middleware::Next;
use axum::response::Response;

use super::error::ApiError;
use crate::settings::Settings;

/// The host names this server answers to, and the origins its pages may write from.
///
/// Ports are never compared: DNS rebinding is about the *name* a browser believes it talks to,
/// and a reverse proxy may well change the port.
#[derive(Debug, Clone)]
pub struct HostRules {
    /// The address the server is bound to: that IP is a name of this server; when it is
    /// 0.0.0.0 or `::`, every address of the machine is.
    bound: IpAddr,
    /// Normalized names accepted besides loopback: the public URL's host and `--allowed-host`.
    names: Vec<String>,
    /// Origins whose writes are accepted besides the request's own (`scheme://host[:port]`,
    /// lowercase, default port left out as browsers do): the public URL's.
    origins: Vec<String>,
    /// `--allowed-host` entries: any origin on these hosts may write, whatever its port.
    trusted_origin_hosts: Vec<String>,
}

impl HostRules {
    pub fn new(settings: &Settings) -> Self {
        let mut names = vec!["localhost".to_string()];
        let mut origins = Vec::new();
        if let Some(url) = &settings.public_url {
            if let Some(host) = url.host() {
                names.push(normalize_host(host));
            }
            origins.extend(origin_of(url));
        }
        let explicit: Vec<String> = settings
            .allowed_hosts
            .iter()
            .map(|h| normalize_host(h))
            .collect();
        names.extend(explicit.iter().cloned());
        HostRules {
            bound: settings.addr.ip(),
            names,
            origins,
            trusted_origin_hosts: explicit,
        }
    }

    /// Whether `host` (an authority's host part, normalized) names this server. An IP literal
    /// cannot be a rebinding attack (that needs a name the attacker controls), so loopback and
    /// bound addresses pass as IPs.
    fn allows_host(&self, host: &str) -> bool {
        if self.names.iter().any(|n| n == host) {
            return true;
        }
        match host.parse::<IpAddr>() {
            Ok(ip) => ip.is_loopback() || ip == self.bound || self.bound.is_unspecified(),
            Err(_) => false,
        }
    }

    /// The `Host` header (and the request target's authority, when a client sends an absolute
    /// URI) must name this server.
    fn check_host(&self, uri: &Uri, headers: &HeaderMap) -> Result<(), ApiError> {
        // Two `Host` headers are a malformed request (RFC 9112 §3.2: answer 400): a proxy and
        // this server could each read another one.
        if headers.get_all(header::HOST).iter().nth(1).is_some() {
            return Err(ApiError::bad_request(
                "Host",
                "the request has more than one Host header; send exactly one",
            ));
        }
        let header = headers.get(header::HOST).map(|v| v.to_str().unwrap_or(""));
        let authority = uri.authority().map(Authority::as_str);
        if header.is_none() && authority.is_none() {
            return Err(ApiError::HostNotAllowed(
                "the request has no Host header; send the host name of this server".into(),
            ));
        }
        for given in header.into_iter().chain(authority) {
            let allowed = host_of(given).is_some_and(|h| self.allows_host(&h));
            if !allowed {
                return Err(ApiError::HostNotAllowed(format!(
                    "this server does not answer to host `{given}`; if that is one of its names, \
                     start it with --allowed-host or --public-url"
                )));
            }
        }
        Ok(())
    }

    /// A request that changes state (anything but GET, HEAD, OPTIONS, TRACE) is refused when a
    /// browser says it comes from another site. Browsers send `Sec-Fetch-Site` (only
    /// `same-origin` and `none`, a user's own navigation, pass) and `Origin` on such requests;
    /// a request with neither is not a browser's and passes.
    fn check_site(&self, method: &Method, headers: &HeaderMap) -> Result<(), ApiError> {
        if method.is_safe() {
            return Ok(());
        }
        if let Some(site) = headers.get("sec-fetch-site") {
            let site = site.to_str().unwrap_or("");
            if !matches!(site, "same-origin" | "none") {
                return Err(ApiError::CrossSite(format!(
                    "requests from other sites may not change anything here \
                     (Sec-Fetch-Site: {site})"
                )));
            }
        }
        if let Some(origin) = headers.get(header::ORIGIN) {
            let origin = origin.to_str().unwrap_or("");
            let host = headers.get(header::HOST).and_then(|v| v.to_str().ok());
            if !self.allows_origin(origin, host) {
                return Err(ApiError::CrossSite(format!(
                    "requests from other sites may not change anything here (Origin: {origin})"
                )));
            }
        }
        Ok(())
    }

    /// The page's origin is this very server (same authority as the `Host` the browser sent),
    /// the public URL's origin, or an origin on an `--allowed-host`. `null` (sandboxed frames,
    /// `file:` pages) never is.
    fn allows_origin(&self, origin: &str, host: Option<&str>) -> bool {
        let Some(authority) = origin_authority(origin) else {
            return false;
        };
        if host.is_some_and(|h| origin_matches_host(origin, h)) {
            return true;
        }
        if self.origins.contains(&origin.to_ascii_lowercase()) {
            return true;
        }
        host_of(authority).is_some_and(|h| self.trusted_origin_hosts.contains(&h))
    }
}

/// The `host[:port]` of an `Origin` value (`scheme://host[:port]`); `None` for `null` and
/// anything malformed.
fn origin_authority(origin: &str) -> Option<&str> {
    let (_, authority) = origin.split_once("://")?;
    let malformed = authority.is_empty() || authority.contains(['/', '@']);
    (!malformed).then_some(authority)
}

/// Whether an `Origin` is the very server the request was sent to: its `host[:port]` is the
/// request's `Host`.
pub fn origin_matches_host(origin: &str, host: &str) -> bool {
    origin_authority(origin).is_some_and(|a| a.eq_ignore_ascii_case(host))
}

/// The host part of an authority (`name`, `name:port`, `[v6]:port`), normalized; `None` when it
/// does not parse.
fn host_of(authority: &str) -> Option<String> {
    let parsed: Authority = authority.parse().ok()?;
    // `user@host` is no Host a browser sends.
    if parsed.as_str().contains('@') {
        return None;
    }
    Some(normalize_host(parsed.host()))
}

/// `scheme://host[:port]` as a browser writes it in `Origin` (no default port, lowercase).
fn origin_of(url: &Uri) -> Option<String> {
    let scheme = url.scheme_str()?.to_ascii_lowercase();
    let host = url.host()?.to_ascii_lowercase();
    let default_port = match scheme.as_str() {
        "http" => Some(80),
        "https" => Some(443),
        _ => None,
    };
    Some(match url.port_u16() {
        Some(port) if Some(port) != default_port => format!("{scheme}://{host}:{port}"),
        _ => format!("{scheme}://{host}"),
    })
}

/// Middleware: the host check, then the cross-site rule. Runs before routing's handlers on
/// every route (API, event streams, pages, static files, the 404 fallback).
pub async fn check_host_and_site(
    State(rules): State<Arc<HostRules>>,
    request: Request,
    next: Next,
) -> Result<Response, ApiError> {
    rules.check_host(request.uri(), request.headers())?;
    rules.check_site(request.method(), request.headers())?;
    Ok(next.run(request).await)
}

/// Middleware: a NUL byte in a (percent-decoded) path or query parameter is a 400 naming the
/// parameter. Postgres cannot store NUL in text and would fail the query; checking here covers
/// every route, API and pages alike.
pub async fn reject_nul_bytes(
    path: Result<RawPathParams, RawPathParamsRejection>,
    request: Request,
    next: Next,
) -> Result<Response, ApiError> {
    if let Ok(params) = &path {
        if let Some((name, _)) = params.iter().find(|(_, value)| value.contains('\0')) {
            return Err(nul_error("path", name));
        }
    }
    if request.uri().query().is_some_and(|q| !q.is_empty()) {
        // A query that does not decode is left to the handler's own extractor to report.
        if let Ok(Query(pairs)) = Query::<Vec<(String, String)>>::try_from_uri(request.uri()) {
            if let Some((name, _)) = pairs
                .iter()
                .find(|(k, v)| k.contains('\0') || v.contains('\0'))
            {
                return Err(nul_error("query", &name.replace('\0', "%00")));
            }
        }
    }
    Ok(next.run(request).await)
}

fn nul_error(kind: &str, name: &str) -> ApiError {
    ApiError::bad_request(
        name,
        format!("{kind} parameter `{name}` must not contain a NUL byte (%00)"),
    )
}

/// Response mapper: no page of this server may be framed by another (clickjacking), no
/// response sniffed into another content type, and no URL of it sent as a referrer elsewhere.
pub async fn security_headers(mut response: Response) -> Response {
    let headers = response.headers_mut();
    headers.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    headers.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    // Appended, not set: a page's own policy stays, and every policy given is enforced.
    headers.append(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static("frame-ancestors 'none'"),
    );
    headers
        .entry(header::REFERRER_POLICY)
        .or_insert(HeaderValue::from_static("same-origin"));
    response
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::settings::{parse_host_name, parse_public_url};

    fn rules(addr: &str, public: Option<&str>, extra: &[&str]) -> HostRules {
        let mut settings = Settings::new(addr.parse().expect("addr"), "data");
        settings.public_url = public.map(|u| parse_public_url(u).expect("url"));
        settings.allowed_hosts = extra.iter().map(|h| h.to_string()).collect();
        HostRules::new(&settings)
    }

    fn host_allowed(rules: &HostRules, host: &str) -> bool {
        let mut headers = HeaderMap::new();
        headers.insert(header::HOST, host.parse().expect("header"));
        rules.check_host(&Uri::from_static("/"), &headers).is_ok()
    }

    #[test]
    fn loopback_names_pass_with_any_port_and_other_names_do_not() {
        let r = rules("127.0.0.1:8080", None, &[]);
        for host in [
            "localhost",
            "LOCALHOST:8080",
            "localhost.:1",
            "127.0.0.1:9999",
            "[::1]:8080",
            "[0:0::1]",
        ] {
            assert!(host_allowed(&r, host), "{host}");
        }
        for host in [
            "evil.example",
            "evil.example:8080",
            "localhost.evil.example",
            "10.0.0.1",
            "127.0.0.1@evil.example",
            "",
        ] {
            assert!(!host_allowed(&r, host), "{host}");
        }
    }

    #[test]
    fn the_public_url_the_allowed_hosts_and_the_bound_address_are_names_of_the_server() {
        let r = rules(
            "192.168.1.5:8080",
            Some("https://Trainyard.Example.com/"),
            &["gpu-box.lan"],
        );
        for host in [
            "trainyard.example.com",
            "trainyard.example.com:443",
            "GPU-box.lan:8080",
            "192.168.1.5:8080",
        ] {
            assert!(host_allowed(&r, host), "{host}");
        }
        assert!(!host_allowed(&r, "192.168.1.6:8080"));
        let everywhere = rules("0.0.0.0:8080", None, &[]);
        assert!(host_allowed(&everywhere, "192.168.1.6:8080"));
        assert!(!host_allowed(&everywhere, "some.name"));
    }

    #[test]
    fn writes_from_another_site_are_refused_and_reads_and_non_browsers_are_not() {
        let r = rules("127.0.0.1:8080", Some("https://ty.example"), &["lab.lan"]);
        let check = |method: Method, pairs: &[(&'static str, &str)]| {
            let mut headers = HeaderMap::new();
            headers.insert(header::HOST, "127.0.0.1:8080".parse().expect("host"));
            for (k, v) in pairs {
                headers.insert(*k, v.parse().expect("value"));
            }
            r.check_site(&method, &headers).is_ok()
        };
        // (method, browser headers, allowed)
        type Case<'a> = (Method, &'a [(&'a str, &'a str)], bool);
        let cases: &[Case] = &[
            (Method::POST, &[], true),
            (Method::POST, &[("sec-fetch-site", "same-origin")], true),
            (Method::POST, &[("sec-fetch-site", "none")], true),
            (Method::POST, &[("sec-fetch-site", "cross-site")], false),
            (Method::DELETE, &[("sec-fetch-site", "same-site")], false),
            (Method::POST, &[("origin", "http://127.0.0.1:8080")], true),
            (Method::POST, &[("origin", "http://127.0.0.1:3000")], false),
            (Method::PATCH, &[("origin", "http://evil.example")], false),
            (Method::PUT, &[("origin", "null")], false),
            (Method::POST, &[("origin", "https://ty.example")], true),
            (
                Method::POST,
                &[("origin", "https://ty.example:8443")],
                false,
            ),
            (Method::POST, &[("origin", "http://lab.lan:8080")], true),
            (
                Method::POST,
                &[
                    ("sec-fetch-site", "same-origin"),
                    ("origin", "http://evil.example"),
                ],
                false,
            ),
            (Method::GET, &[("sec-fetch-site", "cross-site")], true),
            (Method::GET, &[("origin", "http://evil.example")], true),
        ];
        for (method, pairs, expected) in cases {
            assert_eq!(
                check(method.clone(), pairs),
                *expected,
                "{method} {pairs:?}"
            );
        }
    }

    #[test]
    fn bad_public_urls_and_host_names_are_refused_with_an_example() {
        for bad in [
            "trainyard.example.com",
            "ftp://x.example",
            "https://",
            "https://u@x.example",
        ] {
            let err = parse_public_url(bad).expect_err(bad);
            assert!(err.contains("https://"), "{err}");
        }
        assert_eq!(
            parse_public_url("https://x.example:8443/")
                .ok()
                .as_ref()
                .and_then(origin_of),
            Some("https://x.example:8443".to_string())
        );
        for bad in ["http://x.lan", "x.lan:8080", "*.lan", "", "a b"] {
            let err = parse_host_name(bad).expect_err(bad);
            assert!(err.contains("host name"), "{err}");
        }
        assert_eq!(parse_host_name(" Lab.LAN. ").as_deref(), Ok("lab.lan"));
        assert_eq!(parse_host_name("[::1]").as_deref(), Ok("::1"));
    }
}
