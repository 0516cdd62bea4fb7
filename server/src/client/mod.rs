//! The API client: what `trainyard submit` and `trainyard sweep` (and the test suites) speak to
//! a server with. Each route is a method with a typed request and a typed reply, so a field
//! renamed on the server fails to compile here (the server's own serde types are used where they
//! deserialize; `types` mirrors the rest and tests the mirror against the server's type); a
//! refusal comes back as the API's error body (`trainer::wire::Refusal`: code, message, the
//! field it names; the trainer's reporter reads it too), and the event streams are decoded over
//! bytes by `sse`.

pub mod sse;
pub mod types;

use futures::stream::BoxStream;
use futures::StreamExt;
use reqwest::{Method, StatusCode};
use serde::de::DeserializeOwned;
use serde::Serialize;
use trainer::wire::ErrorReply;

use crate::store::Run;
pub use sse::{SseError, SseEvent};
/// The API's error body, shared with the trainer's reporter.
pub use trainer::wire::Refusal;
pub use types::{
    BestTrial, Command, CreateRun, LogChunk, LogEnd, Resources, ResumeFrom, ResumeRun, StopOutcome,
    StopReply, SubmitSweep, Sweep, Trial,
};

/// The refusal in a reply: the API's error body, or what else an error reply holds (a proxy's
/// page, an empty body).
fn refusal_of(status: StatusCode, text: &str) -> Refusal {
    match serde_json::from_str::<ErrorReply>(text) {
        Ok(reply) => reply.error,
        Err(_) => Refusal {
            code: status.as_str().to_string(),
            message: match text.trim() {
                "" => status
                    .canonical_reason()
                    .unwrap_or("no reason given")
                    .to_string(),
                text => crate::validate::limits::preview(text, 200).to_string(),
            },
            field: None,
        },
    }
}

/// Why a call did not get its reply.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error("cannot reach the server at {base}")]
    Unreachable {
        base: String,
        #[source]
        source: reqwest::Error,
    },
    /// The server answered with an error status.
    #[error("refused ({status}): {refusal}")]
    Refused {
        status: StatusCode,
        refusal: Refusal,
    },
    /// The reply is not the type this client expects (a server of another version).
    #[error("the server's reply to {route} is not what this client expects")]
    Unexpected {
        route: String,
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    #[error(transparent)]
    Stream(#[from] SseError),
}

impl ClientError {
    /// The refusal, when the server answered with one.
    pub fn refusal(&self) -> Option<(StatusCode, &Refusal)> {
        match self {
            ClientError::Refused { status, refusal } => Some((*status, refusal)),
            _ => None,
        }
    }
}

/// A typed event of a followed log.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LogEvent {
    Output(LogChunk),
    End(LogEnd),
}

/// A server's API, as one caller (its token, if any) sees it.
#[derive(Debug, Clone)]
pub struct Client {
    base: String,
    token: Option<String>,
    http: reqwest::Client,
}

impl Client {
    /// A client of the server at `base` (`http://host:port`, a trailing `/` allowed).
    pub fn new(base: &str, token: Option<String>) -> Client {
        Client::with_http(base, token, reqwest::Client::new())
    }

    /// Like `new`, on an HTTP client of the caller's (timeouts, connection pool).
    pub fn with_http(base: &str, token: Option<String>, http: reqwest::Client) -> Client {
        Client {
            base: base.trim_end_matches('/').to_string(),
            token,
            http,
        }
    }

    /// The server's base URL.
    pub fn base(&self) -> &str {
        &self.base
    }

    /// A request to `path` (below `/api/v1`), with this caller's token.
    fn request(&self, method: Method, path: &str) -> reqwest::RequestBuilder {
        let request = self
            .http
            .request(method, format!("{}/api/v1{path}", self.base));
        match &self.token {
            Some(token) => request.bearer_auth(token),
            None => request,
        }
    }

    /// Sends `request`; the response if its status is a success, else its refusal.
    async fn accepted(
        &self,
        request: reqwest::RequestBuilder,
    ) -> Result<reqwest::Response, ClientError> {
        let response = request
            .send()
            .await
            .map_err(|source| ClientError::Unreachable {
                base: self.base.clone(),
                source,
            })?;
        let status = response.status();
        if status.is_success() {
            return Ok(response);
        }
        let text = response.text().await.unwrap_or_default();
        Err(ClientError::Refused {
            status,
            refusal: refusal_of(status, &text),
        })
    }

    /// Sends `request` to `path` and reads its reply as a `T`.
    async fn call<T: DeserializeOwned>(
        &self,
        path: &str,
        request: reqwest::RequestBuilder,
    ) -> Result<T, ClientError> {
        let bytes = self
            .accepted(request)
            .await?
            .bytes()
            .await
            .map_err(|e| unexpected(path, e))?;
        serde_json::from_slice(&bytes).map_err(|e| unexpected(path, e))
    }

    async fn get<T: DeserializeOwned>(&self, path: &str) -> Result<T, ClientError> {
        self.call(path, self.request(Method::GET, path)).await
    }

    async fn post<T: DeserializeOwned>(
        &self,
        path: &str,
        body: &(impl Serialize + ?Sized),
    ) -> Result<T, ClientError> {
        self.call(path, self.request(Method::POST, path).json(body))
            .await
    }

    /// The events of a stream at `path`.
    async fn stream(
        &self,
        path: &str,
    ) -> Result<BoxStream<'static, Result<SseEvent, SseError>>, ClientError> {
        let response = self.accepted(self.request(Method::GET, path)).await?;
        Ok(sse::events(response))
    }

    /// `POST /runs`: creates (and with `launch`, queues) a run.
    pub async fn create_run(&self, request: &CreateRun) -> Result<Run, ClientError> {
        self.post("/runs", request).await
    }

    /// `POST /runs/{id}/resume`: queues an ended run again from one of its checkpoints.
    pub async fn resume_run(&self, id: &str, request: &ResumeRun) -> Result<Run, ClientError> {
        self.post(&format!("/runs/{id}/resume"), request).await
    }

    /// `GET /runs/{id}`.
    pub async fn get_run(&self, id: &str) -> Result<Run, ClientError> {
        self.get(&format!("/runs/{id}")).await
    }

    /// `POST /runs/{id}/stop`.
    pub async fn stop_run(&self, id: &str) -> Result<StopReply, ClientError> {
        self.post(&format!("/runs/{id}/stop"), &serde_json::json!({}))
            .await
    }

    /// `GET /runs/{id}/logs?follow=true`: the run's output so far, then as it is written, then
    /// its end. Events of other names (none today) are passed over.
    pub async fn follow_logs(
        &self,
        id: &str,
    ) -> Result<BoxStream<'static, Result<LogEvent, ClientError>>, ClientError> {
        let route = format!("/runs/{id}/logs?follow=true");
        let events = self.stream(&route).await?;
        Ok(events
            .filter_map(move |event| {
                let route = route.clone();
                async move {
                    let event = match event {
                        Ok(event) => event,
                        Err(e) => return Some(Err(e.into())),
                    };
                    let typed = match event.event.as_str() {
                        sse::names::LOG => decode(&route, &event.data).map(LogEvent::Output),
                        sse::names::END => decode(&route, &event.data).map(LogEvent::End),
                        _ => return None,
                    };
                    Some(typed)
                }
            })
            .boxed())
    }

    /// `POST /sweeps`: admits and starts a sweep.
    pub async fn submit_sweep(&self, request: &SubmitSweep) -> Result<Sweep, ClientError> {
        self.post("/sweeps", request).await
    }

    /// `GET /sweeps/{id}`.
    pub async fn get_sweep(&self, id: &str) -> Result<Sweep, ClientError> {
        self.get(&format!("/sweeps/{id}")).await
    }

    /// `POST /sweeps/{id}/pause`: no new trials; running ones go on.
    pub async fn pause_sweep(&self, id: &str) -> Result<Sweep, ClientError> {
        self.post(&format!("/sweeps/{id}/pause"), &serde_json::json!({}))
            .await
    }

    /// `POST /sweeps/{id}/resume`.
    pub async fn resume_sweep(&self, id: &str) -> Result<Sweep, ClientError> {
        self.post(&format!("/sweeps/{id}/resume"), &serde_json::json!({}))
            .await
    }

    /// `POST /sweeps/{id}/stop`: ends the sweep and stops its running trials.
    pub async fn stop_sweep(&self, id: &str) -> Result<Sweep, ClientError> {
        self.post(&format!("/sweeps/{id}/stop"), &serde_json::json!({}))
            .await
    }

    /// `GET /sweeps/{id}/events`: the sweep now and after each change, until it is over.
    pub async fn sweep_events(
        &self,
        id: &str,
    ) -> Result<BoxStream<'static, Result<Sweep, ClientError>>, ClientError> {
        let route = format!("/sweeps/{id}/events");
        let events = self.stream(&route).await?;
        Ok(events
            .filter_map(move |event| {
                let route = route.clone();
                async move {
                    match event {
                        Ok(event) if event.event == sse::names::SWEEP => {
                            Some(decode(&route, &event.data))
                        }
                        Ok(_) => None,
                        Err(e) => Some(Err(e.into())),
                    }
                }
            })
            .boxed())
    }
}

fn unexpected(route: &str, source: impl std::error::Error + Send + Sync + 'static) -> ClientError {
    ClientError::Unexpected {
        route: route.to_string(),
        source: Box::new(source),
    }
}

fn decode<T: DeserializeOwned>(route: &str, data: &str) -> Result<T, ClientError> {
    serde_json::from_str(data).map_err(|e| unexpected(route, e))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_reply_that_is_not_the_apis_error_body_is_still_a_refusal() {
        let body = r#"{"error": {"code": "not_found", "message": "no run r1", "field": null}}"#;
        let read = refusal_of(StatusCode::NOT_FOUND, body);
        assert_eq!(
            (read.code.as_str(), read.message.as_str()),
            ("not_found", "no run r1")
        );
        let proxy = refusal_of(StatusCode::BAD_GATEWAY, "<html>bad gateway</html>");
        assert_eq!(proxy.code, "502");
        assert_eq!(proxy.message, "<html>bad gateway</html>");
        let empty = refusal_of(StatusCode::BAD_GATEWAY, "");
        assert_eq!(empty.message, "Bad Gateway");
    }
}
