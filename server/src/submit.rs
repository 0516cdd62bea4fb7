//! `trainyard submit`: launch a run on a server from a terminal or a script, and optionally
//! follow its output and metrics until it ends (the exit code tells how it ended).

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{bail, Context};
use futures::StreamExt;
use serde_json::{json, Value};

#[derive(Debug, Clone, clap::Args)]
#[command(group(clap::ArgGroup::new("source").required(true).args(["config", "profile", "resume"])))]
pub struct SubmitArgs {
    /// Server to launch on.
    #[arg(
        long,
        env = "TRAINYARD_SERVER_URL",
        default_value = "http://127.0.0.1:8080"
    )]
    pub server: String,
    /// A YAML config file.
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// A built-in profile (tiny, small, medium, large, tiny-moe, small-moe, tiny-hybrid,
    /// small-hybrid).
    #[arg(long)]
    pub profile: Option<String>,
    /// Continue this ended run (its id) from a checkpoint, as a new attempt of the same run,
    /// instead of launching a new one.
    #[arg(long, value_name = "RUN")]
    pub resume: Option<String>,
    /// With --resume: `latest` (default), `best`, or a checkpoint's step.
    #[arg(long, value_name = "latest|best|STEP")]
    pub from: Option<String>,
    /// Override a config key, e.g. `--set training.max_steps=100` (repeatable).
    #[arg(long = "set", value_name = "KEY=VALUE")]
    pub set: Vec<String>,
    /// Whole GPUs to run on (0 = CPU).
    #[arg(long, default_value_t = 0)]
    pub gpus: usize,
    /// Relaunch a failed run (resuming from its latest checkpoint) up to this many times.
    #[arg(long, default_value_t = 0)]
    pub max_restarts: u32,
    #[arg(long)]
    pub experiment: Option<String>,
    #[arg(long)]
    pub name: Option<String>,
    /// Stream the run's output and metrics until it ends; exit 0 only if it finished.
    #[arg(long)]
    pub follow: bool,
    /// Bearer token of a server that requires one.
    #[arg(long, env = "TRAINYARD_TOKEN", hide_env_values = true)]
    pub token: Option<String>,
}

/// `refused (STATUS): field: message` from the API's error body, for a terminal.
pub fn refusal(status: reqwest::StatusCode, reply: &Value) -> String {
    let err = &reply["error"];
    let message = err["message"].as_str().unwrap_or("?");
    // Config messages start with their key already.
    let field = err["field"]
        .as_str()
        .filter(|f| !message.starts_with(&format!("{f}:")))
        .map(|f| format!("{f}: "))
        .unwrap_or_default();
    format!("refused ({status}): {field}{message}")
}

/// Exit codes of `submit --follow`.
pub fn exit_code_for(status: &str) -> i32 {
    match status {
        "finished" => 0,
        "stopped" => 3,
        _ => 1,
    }
}

/// `POST /runs/{id}/resume`: the checkpoint (a step number as a number), and GPUs when asked.
fn resume_body(args: &SubmitArgs) -> Value {
    let from = args.from.as_deref().unwrap_or("latest");
    let mut body = match from.parse::<u64>() {
        Ok(step) => json!({ "from": step }),
        Err(_) => json!({ "from": from }),
    };
    if args.gpus > 0 {
        body["resources"] = json!({ "gpus": args.gpus });
    }
    body
}

fn build_body(args: &SubmitArgs) -> anyhow::Result<Value> {
    let mut overrides = BTreeMap::new();
    for item in &args.set {
        let Some((k, v)) = item.split_once('=') else {
            bail!("--set `{item}`: expected KEY=VALUE, e.g. training.max_steps=100");
        };
        overrides.insert(k.trim().to_string(), Value::String(v.to_string()));
    }
    // Relative paths in the config mean what they mean here, where the user types them.
    let here = std::env::current_dir().context(
        "cannot tell the current directory, which relative config paths resolve against",
    )?;
    let mut body = json!({
        "launch": true,
        "working_dir": here.display().to_string(),
        "overrides": overrides,
        "resources": {"gpus": args.gpus},
        "max_restarts": args.max_restarts,
    });
    if let Some(path) = &args.config {
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("--config: cannot read {}", path.display()))?;
        body["config"] = Value::String(text);
    }
    if let Some(profile) = &args.profile {
        body["profile"] = Value::String(profile.clone());
    }
    if let Some(e) = &args.experiment {
        body["experiment"] = Value::String(e.clone());
    }
    if let Some(n) = &args.name {
        body["name"] = Value::String(n.clone());
    }
    Ok(body)
}

/// Submits; returns the process exit code.
pub async fn run(args: SubmitArgs) -> anyhow::Result<i32> {
    let base = args.server.trim_end_matches('/').to_string();
    let client = reqwest::Client::new();
    let auth = |rb: reqwest::RequestBuilder| match &args.token {
        Some(t) => rb.bearer_auth(t),
        None => rb,
    };
    if args.from.is_some() && args.resume.is_none() {
        bail!("--from picks the checkpoint of --resume RUN; it does nothing without it");
    }
    let (url, body) = match &args.resume {
        Some(run) => (
            format!("{base}/api/v1/runs/{run}/resume"),
            resume_body(&args),
        ),
        None => (format!("{base}/api/v1/runs"), build_body(&args)?),
    };
    let resp = auth(client.post(url).json(&body))
        .send()
        .await
        .with_context(|| format!("cannot reach the server at {base}"))?;
    let status = resp.status();
    let reply: Value = resp
        .json()
        .await
        .context("the server's reply is not JSON")?;
    if !status.is_success() {
        let what = if args.resume.is_some() {
            "resume"
        } else {
            "launch"
        };
        bail!("{what} {}", refusal(status, &reply));
    }
    let id = reply["id"]
        .as_str()
        .context("the reply has no run id")?
        .to_string();
    println!("run {id} {}", reply["status"].as_str().unwrap_or("queued"));
    if !args.follow {
        return Ok(0);
    }
    follow(&client, &base, &id, &auth).await
}

async fn follow(
    client: &reqwest::Client,
    base: &str,
    id: &str,
    auth: &impl Fn(reqwest::RequestBuilder) -> reqwest::RequestBuilder,
) -> anyhow::Result<i32> {
    let logs = auth(client.get(format!("{base}/api/v1/runs/{id}/logs?follow=true")))
        .send()
        .await?
        .error_for_status()?;
    let mut stream = logs.bytes_stream();
    let mut buf = String::new();
    let mut event = String::new();
    let mut tick = tokio::time::interval(Duration::from_secs(5));
    let mut last_metrics = String::new();
    loop {
        tokio::select! {
            chunk = stream.next() => {
                let Some(chunk) = chunk else { break };
                buf.push_str(&String::from_utf8_lossy(&chunk?));
                while let Some(nl) = buf.find('\n') {
                    let line: String = buf.drain(..=nl).collect();
                    let line = line.trim_end_matches(['\r', '\n']);
                    if let Some(name) = line.strip_prefix("event:") {
                        event = name.trim().to_string();
                    } else if let Some(data) = line.strip_prefix("data:") {
                        let v: Value = serde_json::from_str(data.trim()).unwrap_or(Value::Null);
                        if event == "end" {
                            let st = v["status"].as_str().unwrap_or("unknown").to_string();
                            eprintln!("run {id} {st}");
                            return Ok(exit_code_for(&st));
                        }
                        if let Some(text) = v["text"].as_str() {
                            print!("{text}");
                        }
                    }
                }
            }
            _ = tick.tick() => {
                let run: Value = auth(client.get(format!("{base}/api/v1/runs/{id}")))
                    .send().await?.json().await?;
                let summary = summarize_metrics(&run["latest_metrics"]);
                if !summary.is_empty() && summary != last_metrics {
                    eprintln!("[metrics] {summary}");
                    last_metrics = summary;
                }
            }
        }
    }
    // The stream ended without an `end` event (server went away): report what we know.
    let run: Value = auth(client.get(format!("{base}/api/v1/runs/{id}")))
        .send()
        .await?
        .json()
        .await?;
    Ok(exit_code_for(run["status"].as_str().unwrap_or("unknown")))
}

fn summarize_metrics(latest: &Value) -> String {
    let Some(map) = latest.as_object() else {
        return String::new();
    };
    map.iter()
        .filter(|(k, _)| !k.starts_with("sys/"))
        .filter_map(|(k, v)| Some(format!("{k}={:.4} @{}", v["value"].as_f64()?, v["step"])))
        .collect::<Vec<_>>()
        .join("  ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn submit_turns_flags_into_a_launch_request() {
        let args = SubmitArgs {
            server: "http://x".into(),
            config: None,
            profile: Some("tiny".into()),
            resume: None,
            from: None,
            set: vec!["training.max_steps=5".into()],
            gpus: 1,
            max_restarts: 2,
            experiment: None,
            name: None,
            follow: false,
            token: None,
        };
        let body = build_body(&args).unwrap();
        assert_eq!(body["launch"], true);
        assert_eq!(body["profile"], "tiny");
        assert_eq!(body["overrides"]["training.max_steps"], "5");
        assert_eq!(body["resources"]["gpus"], 1);
        let here = std::env::current_dir().unwrap();
        assert_eq!(body["working_dir"], here.display().to_string());
        assert!(here.is_absolute());
        let bad = SubmitArgs {
            set: vec!["oops".into()],
            ..args
        };
        assert!(build_body(&bad)
            .unwrap_err()
            .to_string()
            .contains("KEY=VALUE"));
    }

    #[test]
    fn submit_resume_asks_for_the_checkpoint_by_word_or_step() {
        use clap::Parser;
        #[derive(clap::Parser)]
        struct Cli {
            #[command(flatten)]
            args: SubmitArgs,
        }
        let parse = |argv: &[&str]| Cli::try_parse_from(argv).map(|c| c.args);
        let args = parse(&["x", "--resume", "abc", "--from", "300"]).unwrap();
        assert_eq!(resume_body(&args), json!({"from": 300}));
        let args = parse(&["x", "--resume", "abc"]).unwrap();
        assert_eq!(resume_body(&args), json!({"from": "latest"}));
        let args = parse(&["x", "--resume", "abc", "--from", "best", "--gpus", "1"]).unwrap();
        assert_eq!(
            resume_body(&args),
            json!({"from": "best", "resources": {"gpus": 1}})
        );
        assert!(parse(&["x", "--resume", "abc", "--profile", "tiny"]).is_err());
    }

    #[test]
    fn only_a_finished_run_exits_zero() {
        assert_eq!(exit_code_for("finished"), 0);
        assert_ne!(exit_code_for("failed"), 0);
        assert_ne!(exit_code_for("stopped"), 0);
    }
}
