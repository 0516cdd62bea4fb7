//! The trainer's other calls to the tracking server: creating its own run (`train --server`
//! without `--run-id`) and the heartbeat that tells the server the run is still alive.

use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender};
use std::thread::JoinHandle;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use serde_json::{json, Value};

use super::ServerTarget;
use crate::config::Config;
use crate::wire::ErrorReply;

/// What `train --server` without `--run-id` asks the server to create.
#[derive(Debug, Clone, Copy)]
pub struct NewRun<'a> {
    /// Experiment id or name (the server's default experiment when absent).
    pub experiment: Option<&'a str>,
    /// Run name (the server generates one when absent).
    pub name: Option<&'a str>,
    /// The resolved config, recorded as the run's params.
    pub config: &'a Config,
}

/// `{server}/runs/{id}`: the run's page on the dashboard.
pub fn run_page(server: &str, run_id: &str) -> String {
    format!("{}/runs/{run_id}", server.trim_end_matches('/'))
}

/// Creates a run with `POST {server}/api/v1/runs` (as `trainyard submit` does, without launching
/// it: this process is the run) and returns its id.
pub fn create_run(server: &str, token: Option<&str>, new: &NewRun<'_>) -> Result<String> {
    let base = server.trim_end_matches('/');
    let mut body = json!({ "config": serde_json::to_value(new.config)? });
    if let Some(e) = new.experiment {
        body["experiment"] = Value::String(e.to_string());
    }
    if let Some(n) = new.name {
        body["name"] = Value::String(n.to_string());
    }
    let client = reqwest::blocking::Client::builder()
        .connect_timeout(Duration::from_secs(5))
        .timeout(Duration::from_secs(30))
        .build()
        .context("building the HTTP client")?;
    let mut req = client.post(format!("{base}/api/v1/runs")).json(&body);
    if let Some(t) = token {
        req = req.bearer_auth(t);
    }
    let resp = req
        .send()
        .with_context(|| format!("--server: cannot reach {base} to create the run"))?;
    let status = resp.status();
    let text = resp.text().unwrap_or_default();
    if !status.is_success() {
        let why = serde_json::from_str::<ErrorReply>(&text)
            .map(|reply| reply.error.to_string())
            .unwrap_or_else(|_| "no reason given".to_string());
        bail!("--server: {base} refused to create the run (HTTP {status}): {why}");
    }
    let reply: Value = serde_json::from_str(&text).unwrap_or(Value::Null);
    match reply["id"].as_str() {
        Some(id) if !id.is_empty() => Ok(id.to_string()),
        _ => bail!("--server: {base} created a run but its reply has no run id"),
    }
}

/// A thread that posts `POST {server}/api/v1/runs/{id}/heartbeat` every interval until told to
/// stop. It runs beside the reporter thread, so a slow metrics upload never delays it and it
/// never delays training.
pub(super) struct Heartbeat {
    stop: Sender<()>,
    handle: JoinHandle<()>,
}

/// Whether to keep beating after an answer.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Beat {
    Continue,
    /// The server has no heartbeat endpoint (an older server), or no such run: stop quietly.
    Stop,
}

impl Heartbeat {
    pub(super) fn spawn(target: &ServerTarget) -> Result<Self> {
        let client = reqwest::blocking::Client::builder()
            .connect_timeout(Duration::from_secs(2))
            .timeout(Duration::from_secs(5))
            .build()
            .context("building the HTTP client")?;
        let url = format!(
            "{}/api/v1/runs/{}/heartbeat",
            target.url.trim_end_matches('/'),
            target.run_id
        );
        let token = target.token.clone();
        let interval = target.heartbeat_interval.max(Duration::from_millis(10));
        let (stop, rx) = mpsc::channel();
        let handle = std::thread::Builder::new()
            .name("heartbeat".into())
            .spawn(move || beat_until_stopped(&rx, interval, || send(&client, &url, &token)))
            .context("starting the heartbeat thread")?;
        Ok(Heartbeat { stop, handle })
    }

    /// Stops the beats (before the final status, so no beat follows it) and waits for the
    /// thread, which is at most one short request away.
    pub(super) fn stop(self) {
        let _ = self.stop.send(());
        if self.handle.join().is_err() {
            tracing::error!("heartbeat thread panicked");
        }
    }
}

fn beat_until_stopped(stop: &Receiver<()>, interval: Duration, mut beat: impl FnMut() -> Beat) {
    loop {
        match stop.recv_timeout(interval) {
            Err(RecvTimeoutError::Timeout) => {}
            // Asked to stop, or the reporter is gone.
            Ok(()) | Err(RecvTimeoutError::Disconnected) => return,
        }
        if beat() == Beat::Stop {
            return;
        }
    }
}

fn send(client: &reqwest::blocking::Client, url: &str, token: &Option<String>) -> Beat {
    let mut req = client
        .post(url)
        .header("content-type", "application/json")
        .body("{}");
    if let Some(t) = token {
        req = req.bearer_auth(t);
    }
    match req.send() {
        Ok(resp) => answer(resp.status().as_u16()),
        Err(e) => {
            // The server may be down for a while; the next beat tries again.
            tracing::debug!(error = %e, "heartbeat not delivered");
            Beat::Continue
        }
    }
}

/// 404 or 405: a server without heartbeats. Anything else (a refusal included) is tried again
/// at the next beat: a server that is restarting answers oddly for a moment.
pub(super) fn answer(status: u16) -> Beat {
    if status == 404 || status == 405 {
        tracing::debug!(status, "the server takes no heartbeats; not sending more");
        Beat::Stop
    } else {
        if !(200..300).contains(&status) {
            tracing::debug!(status, "heartbeat refused");
        }
        Beat::Continue
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_run_page_is_under_runs_whatever_the_trailing_slash() {
        assert_eq!(run_page("http://h:1/", "r7"), "http://h:1/runs/r7");
        assert_eq!(run_page("http://h:1", "r7"), "http://h:1/runs/r7");
    }

    #[test]
    fn heartbeats_stop_only_for_a_server_without_the_endpoint() {
        for (status, beat) in [
            (204, Beat::Continue),
            (200, Beat::Continue),
            (503, Beat::Continue),
            (401, Beat::Continue),
            (404, Beat::Stop),
            (405, Beat::Stop),
        ] {
            assert_eq!(answer(status), beat, "{status}");
        }
    }

    #[test]
    fn a_stop_request_ends_the_beats_without_another_beat() {
        let (tx, rx) = mpsc::channel();
        tx.send(()).unwrap();
        let mut beats = 0;
        beat_until_stopped(&rx, Duration::from_secs(3600), || {
            beats += 1;
            Beat::Continue
        });
        assert_eq!(beats, 0);
    }
}
