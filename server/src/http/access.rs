//! The one access check. Every routed request, API and pages alike, passes here: the caller is
//! resolved (`access::principal`), the route's rule is looked up (`access::policy`), a write
//! riding on a session cookie must echo the session's CSRF token, and the decision is made
//! (`access::decide`). The caller then travels to the handler as a request extension, so
//! handlers that list things filter them to what the caller may read.

use axum::body::Body;
use axum::extract::{MatchedPath, RawPathParams, Request, State};
use axum::http::header;
use axum::middleware::Next;
use axum::response::{IntoResponse, Redirect, Response};

use crate::access::audit::Actor;
use crate::access::principal::CSRF_HEADER;
use crate::access::{decide, policy, Principal};
use crate::app::AppState;
use crate::error::Error;
use crate::http::error::ApiError;
use crate::http::pages::chrome::Chrome;
use crate::http::principal::{resolve, ResolveError};

pub async fn check(
    State(state): State<AppState>,
    params: Result<RawPathParams, axum::extract::rejection::RawPathParamsRejection>,
    request: Request,
    next: Next,
) -> Response {
    let method = request.method().clone();
    let Some(pattern) = request
        .extensions()
        .get::<MatchedPath>()
        .map(|m| m.as_str().to_owned())
    else {
        return next.run(request).await;
    };
    let room = Room::of(&pattern);
    let principal = match resolve(&state, &method, request.headers()).await {
        Ok(p) => p,
        // A public route (health, the API document, sign-in) answers a stale or wrong
        // credential as it answers anyone: a monitor with an old token still sees the health,
        // and a browser with an expired cookie can still sign in.
        Err(ResolveError::BadCredential)
            if policy::rule(&method, &pattern) == Some(policy::Rule::Public) =>
        {
            Principal::Anonymous
        }
        Err(ResolveError::BadCredential) => {
            return refuse(&state, room, &request, Error::SignIn);
        }
        Err(ResolveError::Store(e)) => return refuse(&state, room, &request, Error::Store(e)),
    };
    let Some(rule) = policy::rule(&method, &pattern) else {
        if policy::has_route(&pattern) {
            // The route exists, but not with this method: the table lists every method served.
            let e = ApiError::MethodNotAllowed(method.to_string());
            if room == Room::Mlflow {
                return crate::http::mlflow::MlflowError::from(e).into_response();
            }
            return e.into_response();
        }
        // A server bug, refused for everyone (the local user too) so that the first test of a
        // new route without a row in `access::policy` fails instead of the route being open.
        let bug = format!("route {method} {pattern} has no access rule");
        return refuse(
            &state,
            room,
            &request,
            Error::Internal(anyhow::anyhow!(bug)),
        );
    };
    let id = params.ok().and_then(|p| {
        p.iter()
            .find(|(k, _)| *k == "id")
            .map(|(_, v)| v.to_owned())
    });
    let write = policy::changes(&method, &pattern);
    if let Err(denied) = decide(&state, &principal, rule, write, id.as_deref()).await {
        return refuse(&state, room, &request, denied);
    }
    let request = if write && rule != policy::Rule::Public {
        match csrf_checked(&state, &principal, request).await {
            Ok(r) => r,
            Err(response) => return *response,
        }
    } else {
        request
    };
    with_principal(&state, room == Room::Page, principal, request, next).await
}

async fn with_principal(
    state: &AppState,
    page: bool,
    principal: Principal,
    mut request: Request,
    next: Next,
) -> Response {
    if page {
        // Pages show who is signed in, and their forms carry the session's CSRF token.
        let chrome = Chrome::of(&principal, state.settings.accounts_on());
        request.extensions_mut().insert(principal);
        return chrome.scope(next.run(request)).await;
    }
    request.extensions_mut().insert(principal);
    next.run(request).await
}

/// Which part of the server a route belongs to: pages answer with HTML and send anonymous
/// browsers to sign in; the API answers JSON; the MLflow protocol answers in its own shape.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Room {
    Page,
    Api,
    Mlflow,
}

impl Room {
    fn of(pattern: &str) -> Room {
        if crate::http::mlflow::is_mlflow_route(pattern) {
            Room::Mlflow
        } else if pattern.starts_with("/api/") || pattern == "/healthz" {
            Room::Api
        } else {
            Room::Page
        }
    }
}

fn refuse(state: &AppState, room: Room, request: &Request, denied: Error) -> Response {
    // Without accounts (a loopback server with only an admin token) there is no sign-in page:
    // the page answers 401 like the API.
    if room == Room::Page && state.settings.accounts_on() {
        if let Error::SignIn = denied {
            let here = request
                .uri()
                .path_and_query()
                .map(|p| p.as_str())
                .unwrap_or("/");
            let next: String = url_encode(here);
            return Redirect::to(&format!("/sign-in?next={next}")).into_response();
        }
    }
    refuse_plain(room, denied)
}

fn url_encode(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' | b'/' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// Form bodies larger than this are not searched for a CSRF field (a dashboard form is small).
const FORM_LIMIT: usize = 1 << 20;

/// A write authenticated by a session cookie must carry the session's CSRF token: the
/// `x-csrf-token` header (`fetch`) or the `csrf` field of a form. Other credentials (bearer
/// tokens) are not sent by browsers on their own, so they need none.
async fn csrf_checked(
    state: &AppState,
    principal: &Principal,
    request: Request,
) -> Result<Request, Box<Response>> {
    if principal.session_csrf().is_none() {
        return Ok(request);
    }
    let room = request
        .extensions()
        .get::<MatchedPath>()
        .map_or(Room::Api, |m| Room::of(m.as_str()));
    let forged = || {
        let denied = Error::forbidden(
            "this form or request is missing its CSRF token; reload the page and try again",
        );
        Err(Box::new(refuse_plain(room, denied)))
    };
    if let Some(sent) = request.headers().get(CSRF_HEADER) {
        return if principal.is_session_csrf(sent.as_bytes()) {
            Ok(request)
        } else {
            forged()
        };
    }
    let is_form = request
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("application/x-www-form-urlencoded"));
    if !is_form {
        return forged();
    }
    let (parts, body) = request.into_parts();
    let limit = state.settings.body_limit.min(FORM_LIMIT);
    let Ok(bytes) = axum::body::to_bytes(body, limit).await else {
        return Err(Box::new(
            ApiError::PayloadTooLarge("the form is too large".into()).into_response(),
        ));
    };
    let sent = form_urlencoded_field(&bytes, "csrf");
    match sent {
        Some(sent) if principal.is_session_csrf(sent.as_bytes()) => {
            Ok(Request::from_parts(parts, Body::from(bytes)))
        }
        _ => forged(),
    }
}

fn refuse_plain(room: Room, denied: Error) -> Response {
    if room == Room::Mlflow {
        return crate::http::mlflow::MlflowError::from(denied).into_response();
    }
    if room == Room::Page {
        let e: crate::http::pages::PageError = ApiError::from(denied).into();
        return e.into_response();
    }
    ApiError::from(denied).into_response()
}

fn form_urlencoded_field(body: &[u8], name: &str) -> Option<String> {
    let pairs: Vec<(String, String)> = serde_urlencoded::from_bytes(body).ok()?;
    pairs.into_iter().find(|(k, _)| k == name).map(|(_, v)| v)
}

/// The client's address, as the accept loop saw it (for the audit log and sign-in throttling).
/// Behind a reverse proxy this is the proxy's address.
pub struct Client(pub Option<String>);

impl<S: Send + Sync> axum::extract::FromRequestParts<S> for Client {
    type Rejection = std::convert::Infallible;

    async fn from_request_parts(
        parts: &mut axum::http::request::Parts,
        _: &S,
    ) -> Result<Self, Self::Rejection> {
        Ok(Client(
            parts
                .extensions
                .get::<axum::extract::ConnectInfo<std::net::SocketAddr>>()
                .map(|c| c.0.ip().to_string()),
        ))
    }
}

/// The [`Actor`] of a request: the principal the access check resolved and the client address.
impl<S: Send + Sync> axum::extract::FromRequestParts<S> for Actor {
    type Rejection = ApiError;

    async fn from_request_parts(
        parts: &mut axum::http::request::Parts,
        state: &S,
    ) -> Result<Self, Self::Rejection> {
        let principal = parts
            .extensions
            .get::<Principal>()
            .cloned()
            .ok_or_else(|| {
                ApiError::Internal(anyhow::anyhow!("a handler ran without the access check"))
            })?;
        let Ok(Client(client)) =
            <Client as axum::extract::FromRequestParts<S>>::from_request_parts(parts, state).await;
        Ok(Actor { principal, client })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_next_parameter_keeps_the_path_and_escapes_the_query() {
        assert_eq!(url_encode("/runs/ab?x=1&y=2"), "/runs/ab%3Fx%3D1%26y%3D2");
    }

    #[test]
    fn the_csrf_field_is_read_from_a_form_body() {
        assert_eq!(
            form_urlencoded_field(b"tag=a&csrf=xyz%2B1", "csrf").as_deref(),
            Some("xyz+1")
        );
        assert_eq!(form_urlencoded_field(b"tag=a", "csrf"), None);
    }

    #[test]
    fn api_routes_answer_json_and_pages_html() {
        assert_eq!(Room::of("/api/v1/runs/{id}"), Room::Api);
        assert_eq!(Room::of("/healthz"), Room::Api);
        assert_eq!(Room::of("/runs/{id}"), Room::Page);
        assert_eq!(Room::of("/api/2.0/mlflow/runs/get"), Room::Mlflow);
        assert_eq!(Room::of("/ajax-api/2.0/mlflow/runs/get"), Room::Mlflow);
    }
}
