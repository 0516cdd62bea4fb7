//! `trainyard sweep submit sweep.yaml --server URL [--follow]`: start a sweep from a terminal,
//! and optionally follow its trials until it ends; `trainyard sweep pause|resume|stop ID`.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use anyhow::Context;
use futures::StreamExt;
use serde_json::Value;

use crate::client::{Client, SubmitSweep, Sweep, Trial};
use crate::store::sweeps::SweepState;

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

/// The request of a spec file. Relative paths in a config base mean what they mean here, where
/// the user typed the command, unless the spec names its own working directory.
pub fn submit_request(text: &str, here: &Path) -> anyhow::Result<SubmitSweep> {
    let mut spec: Value =
        serde_yaml_ng::from_str(text).context("the sweep file is not valid YAML or JSON")?;
    if let Some(base) = spec.get_mut("base").and_then(Value::as_object_mut) {
        if !base.contains_key("working_dir") {
            base.insert(
                "working_dir".into(),
                Value::String(here.display().to_string()),
            );
        }
    }
    Ok(SubmitSweep { spec })
}

/// Runs the subcommand; returns the process exit code.
pub async fn run(args: SweepArgs) -> anyhow::Result<i32> {
    let client = Client::new(&args.server, args.token.clone());
    let (sweep, follow) = match &args.command {
        SweepCommand::Submit { file, follow } => {
            let text = std::fs::read_to_string(file)
                .with_context(|| format!("cannot read {}", file.display()))?;
            let here = std::env::current_dir().context(
                "cannot tell the current directory, which relative paths resolve against",
            )?;
            let request = submit_request(&text, &here)?;
            (client.submit_sweep(&request).await, *follow)
        }
        SweepCommand::Pause { id } => (client.pause_sweep(id).await, false),
        SweepCommand::Resume { id } => (client.resume_sweep(id).await, false),
        SweepCommand::Stop { id } => (client.stop_sweep(id).await, false),
    };
    let sweep = sweep.map_err(crate::submit::refused("sweep"))?;
    println!("sweep {} {}", sweep.id, sweep.state.as_str());
    if !follow {
        return Ok(0);
    }
    follow_sweep(&client, &sweep.id).await
}

/// One line per trial whenever its state or step changed; the best trial at the end.
async fn follow_sweep(client: &Client, id: &str) -> anyhow::Result<i32> {
    let mut events = client.sweep_events(id).await?;
    let mut shown: BTreeMap<i64, String> = BTreeMap::new();
    let mut last: Option<Sweep> = None;
    while let Some(sweep) = events.next().await.transpose()? {
        for trial in &sweep.trials {
            let line = trial_line(&sweep, trial);
            if shown.get(&trial.number) != Some(&line) {
                println!("{line}");
                shown.insert(trial.number, line);
            }
        }
        last = Some(sweep);
    }
    let Some(sweep) = last else {
        eprintln!("sweep {id}: the server sent no state");
        return Ok(1);
    };
    let state = sweep.state.as_str();
    match &sweep.best {
        Some(best) => eprintln!(
            "sweep {id} {state}: best trial {} {} = {} with {}",
            best.number,
            sweep.metric,
            best.value,
            Value::Object(best.params.clone())
        ),
        None => eprintln!("sweep {id} {state}: no trial completed"),
    }
    Ok(match sweep.state {
        SweepState::Finished => 0,
        SweepState::Stopped => 3,
        _ => 1,
    })
}

fn trial_line(sweep: &Sweep, trial: &Trial) -> String {
    let params: Vec<String> = trial
        .params
        .iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect();
    let mut line = format!(
        "trial {} {} {}",
        trial.number,
        trial.state.as_str(),
        params.join(" ")
    );
    if let (Some(step), Some([_, value])) = (trial.step, trial.curve.last()) {
        line.push_str(&format!("  step {step} {}={value}", sweep.metric));
    }
    line
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_spec_file_gets_the_working_directory_of_the_command() {
        let here = std::path::Path::new("/somewhere");
        let request = submit_request("name: s\nbase: {profile: tiny}\n", here).unwrap();
        assert_eq!(request.spec["base"]["working_dir"], "/somewhere");
        let request =
            submit_request("name: s\nbase: {profile: tiny, working_dir: /x}\n", here).unwrap();
        assert_eq!(request.spec["base"]["working_dir"], "/x");
        assert!(submit_request("name: [", here).is_err());
    }
}
