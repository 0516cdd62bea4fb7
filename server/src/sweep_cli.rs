//! `trainyard sweep submit sweep.yaml --server URL [--follow]`: start a sweep from a terminal,
//! and optionally follow its trials until it ends; `trainyard sweep pause|resume|stop ID`.

use std::collections::BTreeMap;
use std::path::PathBuf;

use anyhow::{bail, Context};
use futures::StreamExt;
use serde_json::{json, Value};

#[derive(Debug, clap::Args)]
pub struct SweepArgs {
    #[command(subcommand)]
    pub command: SweepCommand,
    /// Server to run the sweep on.
    #[arg(
        long,
        global = true,
        env = "TRAINYARD_SERVER_URL",
        default_value = "http://127.0.0.1:8080"
    )]
    pub server: String,
    /// Bearer token of a server that requires one.
    #[arg(long, global = true, env = "TRAINYARD_TOKEN", hide_env_values = true)]
    pub token: Option<String>,
}

#[derive(Debug, clap::Subcommand)]
pub enum SweepCommand {
    /// Submit a sweep spec (YAML or JSON).
    Submit {
        file: PathBuf,
        /// Print trials as they start, report and end; exit 0 when the sweep finished.
        #[arg(long)]
        follow: bool,
    },
    /// Launch no new trials (running ones go on).
    Pause { id: String },
    /// Continue a paused sweep.
    Resume { id: String },
    /// End the sweep and stop its running trials.
    Stop { id: String },
}

/// The request body of a spec file. Relative paths in a config base mean what they mean here,
/// where the user typed the command, unless the spec names its own working directory.
pub fn submit_body(text: &str, here: &std::path::Path) -> anyhow::Result<Value> {
    let mut spec: Value =
        serde_yaml_ng::from_str(text).context("the sweep file is not valid YAML or JSON")?;
    let Some(base) = spec.get_mut("base").and_then(Value::as_object_mut) else {
        return Ok(json!({ "spec": spec }));
    };
    if !base.contains_key("working_dir") {
        base.insert(
            "working_dir".into(),
            Value::String(here.display().to_string()),
        );
    }
    Ok(json!({ "spec": spec }))
}

/// Runs the subcommand; returns the process exit code.
pub async fn run(args: SweepArgs) -> anyhow::Result<i32> {
    let base = args.server.trim_end_matches('/').to_string();
    let client = reqwest::Client::new();
    let auth = |rb: reqwest::RequestBuilder| match &args.token {
        Some(t) => rb.bearer_auth(t),
        None => rb,
    };
    let (url, body, follow) = match &args.command {
        SweepCommand::Submit { file, follow } => {
            let text = std::fs::read_to_string(file)
                .with_context(|| format!("cannot read {}", file.display()))?;
            let here = std::env::current_dir().context(
                "cannot tell the current directory, which relative paths resolve against",
            )?;
            (
                format!("{base}/api/v1/sweeps"),
                submit_body(&text, &here)?,
                *follow,
            )
        }
        SweepCommand::Pause { id } => {
            (format!("{base}/api/v1/sweeps/{id}/pause"), json!({}), false)
        }
        SweepCommand::Resume { id } => (
            format!("{base}/api/v1/sweeps/{id}/resume"),
            json!({}),
            false,
        ),
        SweepCommand::Stop { id } => (format!("{base}/api/v1/sweeps/{id}/stop"), json!({}), false),
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
        bail!("sweep {}", crate::submit::refusal(status, &reply));
    }
    let id = reply["id"]
        .as_str()
        .context("the reply has no sweep id")?
        .to_string();
    println!("sweep {id} {}", reply["state"].as_str().unwrap_or("?"));
    if !follow {
        return Ok(0);
    }
    follow_sweep(&client, &base, &id, &auth).await
}

/// One line per trial whenever its state or step changed; the best trial at the end.
async fn follow_sweep(
    client: &reqwest::Client,
    base: &str,
    id: &str,
    auth: &impl Fn(reqwest::RequestBuilder) -> reqwest::RequestBuilder,
) -> anyhow::Result<i32> {
    let resp = auth(client.get(format!("{base}/api/v1/sweeps/{id}/events")))
        .send()
        .await?
        .error_for_status()?;
    let mut stream = resp.bytes_stream();
    let mut buf = String::new();
    let mut shown: BTreeMap<i64, String> = BTreeMap::new();
    let mut last = Value::Null;
    while let Some(chunk) = stream.next().await {
        buf.push_str(&String::from_utf8_lossy(&chunk?));
        while let Some(nl) = buf.find('\n') {
            let line: String = buf.drain(..=nl).collect();
            let Some(data) = line.trim_end().strip_prefix("data:") else {
                continue;
            };
            let sweep: Value = serde_json::from_str(data.trim()).unwrap_or(Value::Null);
            for trial in sweep["trials"].as_array().into_iter().flatten() {
                let number = trial["number"].as_i64().unwrap_or(-1);
                let line = trial_line(&sweep, trial);
                if shown.get(&number) != Some(&line) {
                    println!("{line}");
                    shown.insert(number, line);
                }
            }
            last = sweep;
        }
    }
    let state = last["state"].as_str().unwrap_or("unknown");
    match last["best"].as_object() {
        Some(best) => eprintln!(
            "sweep {id} {state}: best trial {} {} = {} with {}",
            best["number"],
            last["metric"].as_str().unwrap_or("?"),
            best["value"],
            Value::Object(best["params"].as_object().cloned().unwrap_or_default())
        ),
        None => eprintln!("sweep {id} {state}: no trial completed"),
    }
    Ok(match state {
        "finished" => 0,
        "stopped" => 3,
        _ => 1,
    })
}

fn trial_line(sweep: &Value, trial: &Value) -> String {
    let params: Vec<String> = trial["params"]
        .as_object()
        .into_iter()
        .flatten()
        .map(|(k, v)| format!("{k}={v}"))
        .collect();
    let mut line = format!(
        "trial {} {} {}",
        trial["number"],
        trial["state"].as_str().unwrap_or("?"),
        params.join(" ")
    );
    if let (Some(step), Some(value)) = (
        trial["step"].as_i64(),
        trial["curve"].as_array().and_then(|c| c.last()),
    ) {
        line.push_str(&format!(
            "  step {step} {}={}",
            sweep["metric"].as_str().unwrap_or("metric"),
            value[1]
        ));
    }
    line
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_spec_file_gets_the_working_directory_of_the_command() {
        let here = std::path::Path::new("/somewhere");
        let body = submit_body("name: s\nbase: {profile: tiny}\n", here).unwrap();
        assert_eq!(body["spec"]["base"]["working_dir"], "/somewhere");
        let body = submit_body("name: s\nbase: {profile: tiny, working_dir: /x}\n", here).unwrap();
        assert_eq!(body["spec"]["base"]["working_dir"], "/x");
        assert!(submit_body("name: [", here).is_err());
    }
}
