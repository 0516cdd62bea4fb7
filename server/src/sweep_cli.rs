//! `trainyard sweep submit sweep.yaml --server URL [--follow]`: start a sweep from a terminal,
//! and optionally follow its trials until it ends; `trainyard sweep pause|resume|stop ID`.

use std::collections::{BTreeMap, BTreeSet};
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

/// One line per trial whenever its state or step changed, and one for its end; the best trial
/// at the end.
async fn follow_sweep(client: &Client, id: &str) -> anyhow::Result<i32> {
    let mut events = client.sweep_events(id).await?;
    let mut printed = Printed::default();
    let mut last: Option<Sweep> = None;
    while let Some(sweep) = events.next().await.transpose()? {
        for line in printed.new_lines(&sweep) {
            println!("{line}");
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

/// The trial lines printed so far: a running trial's line is printed again when it changed, an
/// ended trial's once. A pruned trial's run may log a few more points while it stops; its end
/// (the step it reached and its value when it was pruned) stays what was printed.
#[derive(Debug, Default)]
struct Printed {
    shown: BTreeMap<i64, String>,
    ended: BTreeSet<i64>,
}

impl Printed {
    fn new_lines(&mut self, sweep: &Sweep) -> Vec<String> {
        let mut lines = Vec::new();
        for trial in &sweep.trials {
            if self.ended.contains(&trial.number) {
                continue;
            }
            let line = trial_line(sweep, trial);
            if self.shown.get(&trial.number) != Some(&line) {
                lines.push(line.clone());
                self.shown.insert(trial.number, line);
            }
            if !trial.state.is_active() {
                self.ended.insert(trial.number);
            }
        }
        lines
    }
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
    // An ended trial's step and value are those it ended with; a running one's, its latest
    // point.
    let at = if trial.state.is_active() {
        trial.step.zip(trial.curve.last().map(|p| p[1]))
    } else {
        trial.step.zip(trial.value)
    };
    if let Some((step, value)) = at {
        line.push_str(&format!("  step {step} {}={value}", sweep.metric));
    }
    if !trial.state.is_active() {
        if let Some(reason) = trial.reason.as_deref().filter(|r| !r.is_empty()) {
            line.push_str(&format!("  ({reason})"));
        }
    }
    line
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::sweeps::TrialState;

    fn trial(state: TrialState, step: i64, value: Option<f64>, curve_to: i64) -> Trial {
        Trial {
            number: 2,
            run_id: Some("r".into()),
            params: Default::default(),
            state,
            value,
            step: Some(step),
            reason: (state == TrialState::Pruned).then(|| "pruned at step 30: ...".into()),
            curve: (0..=curve_to).map(|s| [s as f64, s as f64 / 4.0]).collect(),
        }
    }

    fn sweep_of(trials: Vec<Trial>) -> Sweep {
        Sweep {
            id: "s".into(),
            name: "s".into(),
            experiment_id: "e".into(),
            state: SweepState::Running,
            message: None,
            version: 1,
            method: "random".into(),
            metric: "loss".into(),
            goal: "minimize".into(),
            max_trials: 4,
            parallel: 2,
            best: None,
            trials,
        }
    }

    #[test]
    fn a_pruned_trial_is_printed_once_with_its_value_at_pruning() {
        let mut printed = Printed::default();
        let running = printed.new_lines(&sweep_of(vec![trial(TrialState::Running, 20, None, 20)]));
        assert_eq!(running, ["trial 2 running   step 20 loss=5"]);
        // Pruned at step 30 with 2.7; its run logged up to step 34 before it stopped.
        let pruned = printed.new_lines(&sweep_of(vec![trial(
            TrialState::Pruned,
            30,
            Some(2.7),
            34,
        )]));
        assert_eq!(
            pruned,
            ["trial 2 pruned   step 30 loss=2.7  (pruned at step 30: ...)"]
        );
        // More points after the prune print nothing.
        let later = printed.new_lines(&sweep_of(vec![trial(
            TrialState::Pruned,
            30,
            Some(2.7),
            40,
        )]));
        assert!(later.is_empty(), "{later:?}");
    }

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
