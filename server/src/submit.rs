//! `trainyard submit`: launch a run on a server from a terminal or a script, and optionally
//! follow its output and metrics until it ends (the exit code tells how it ended).

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use std::io::Write;

use anyhow::{bail, Context};
use futures::StreamExt;
use serde_json::Value;

use crate::client::{Client, ClientError, CreateRun, LogEvent, Resources, ResumeFrom, ResumeRun};
use crate::store::{LatestMetric, RunStatus};

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
    /// Experiment to put the run in, by name or id (a new name creates it) [default: the
    /// shared `Default` experiment].
    #[arg(long)]
    pub experiment: Option<String>,
    /// The run's name [default: one the server makes up].
    #[arg(long)]
    pub name: Option<String>,
    /// Stream the run's output and metrics until it ends; exit 0 only if it finished.
    #[arg(long)]
    pub follow: bool,
    /// Bearer token of a server that requires one.
    #[arg(long, env = "TRAINYARD_TOKEN", hide_env_values = true)]
    pub token: Option<String>,
}

/// The run's page on the server `server` names.
pub fn run_page(server: &str, id: &str) -> String {
    format!("{}/runs/{id}", server.trim_end_matches('/'))
}

/// Exit codes of `submit --follow`: 0 only for a finished run, 3 for a stopped one.
pub fn exit_code_for(status: Option<RunStatus>) -> i32 {
    match status {
        Some(RunStatus::Finished) => 0,
        Some(RunStatus::Stopped) => 3,
        _ => 1,
    }
}

/// `POST /runs/{id}/resume`: the checkpoint, and GPUs when asked.
fn resume_request(args: &SubmitArgs) -> anyhow::Result<ResumeRun> {
    let from = match args.from.as_deref() {
        None => ResumeFrom::Latest,
        Some(text) => ResumeFrom::parse(text).with_context(|| {
            format!("--from `{text}`: expected `latest`, `best` or a checkpoint's step")
        })?,
    };
    Ok(ResumeRun {
        from,
        resources: (args.gpus > 0).then_some(Resources { gpus: args.gpus }),
    })
}

fn launch_request(args: &SubmitArgs) -> anyhow::Result<CreateRun> {
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
    let config = match &args.config {
        Some(path) => Some(Value::String(
            std::fs::read_to_string(path)
                .with_context(|| format!("--config: cannot read {}", path.display()))?,
        )),
        None => None,
    };
    Ok(CreateRun {
        launch: true,
        working_dir: Some(here.display().to_string()),
        overrides,
        resources: Some(Resources { gpus: args.gpus }),
        max_restarts: Some(args.max_restarts),
        config,
        profile: args.profile.clone(),
        experiment: args.experiment.clone(),
        name: args.name.clone(),
        ..CreateRun::default()
    })
}

/// `what refused (STATUS): field: message` for a refusal; other errors as they are.
pub fn refused(what: &str) -> impl FnOnce(ClientError) -> anyhow::Error + '_ {
    move |e| match e {
        ClientError::Refused { .. } => anyhow::anyhow!("{what} {e}"),
        e => e.into(),
    }
}

/// Submits; returns the process exit code.
pub async fn run(args: SubmitArgs) -> anyhow::Result<i32> {
    if args.from.is_some() && args.resume.is_none() {
        bail!("--from picks the checkpoint of --resume RUN; it does nothing without it");
    }
    let client = Client::new(&args.server, args.token.clone());
    let run = match &args.resume {
        Some(id) => client
            .resume_run(id, &resume_request(&args)?)
            .await
            .map_err(refused("resume"))?,
        None => client
            .create_run(&launch_request(&args)?)
            .await
            .map_err(refused("launch"))?,
    };
    println!("run {} {}", run.id, run.status);
    // Where to watch it (on stderr, beside the metrics, so stdout stays the run's own output).
    eprintln!("page: {}", run_page(&args.server, &run.id));
    if !args.follow {
        return Ok(0);
    }
    follow(&client, &run.id).await
}

/// Prints the run's output as it comes and its metrics every few seconds (to stderr) until it
/// ends; returns the exit code of its final status.
async fn follow(client: &Client, id: &str) -> anyhow::Result<i32> {
    let mut logs = client.follow_logs(id).await?;
    let mut tick = tokio::time::interval(Duration::from_secs(5));
    let mut last_metrics = String::new();
    let mut out = std::io::stdout();
    loop {
        tokio::select! {
            event = logs.next() => match event.transpose()? {
                Some(LogEvent::Output(chunk)) => {
                    out.write_all(chunk.text.as_bytes())?;
                    out.flush()?;
                }
                Some(LogEvent::End(end)) => {
                    eprintln!("run {id} {}", end.status);
                    return Ok(exit_code_for(end.status()));
                }
                None => break,
            },
            _ = tick.tick() => {
                let run = client.get_run(id).await?;
                let summary = summarize_metrics(&run.latest_metrics);
                if !summary.is_empty() && summary != last_metrics {
                    eprintln!("[metrics] {summary}");
                    last_metrics = summary;
                }
            }
        }
    }
    // The stream ended without an `end` event (the server went away): report what we know.
    let run = client.get_run(id).await?;
    Ok(exit_code_for(Some(run.status)))
}

fn summarize_metrics(latest: &BTreeMap<String, LatestMetric>) -> String {
    latest
        .iter()
        .filter(|(k, _)| !k.starts_with("sys/"))
        .map(|(k, m)| format!("{k}={:.4} @{}", m.value, m.step))
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
        let request = launch_request(&args).unwrap();
        assert!(request.launch);
        assert_eq!(request.profile.as_deref(), Some("tiny"));
        assert_eq!(request.overrides["training.max_steps"], "5");
        assert_eq!(request.resources, Some(Resources { gpus: 1 }));
        assert_eq!(request.max_restarts, Some(2));
        let here = std::env::current_dir().unwrap();
        assert_eq!(request.working_dir, Some(here.display().to_string()));
        assert!(here.is_absolute());
        let bad = SubmitArgs {
            set: vec!["oops".into()],
            ..args
        };
        assert!(launch_request(&bad)
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
        let resume = |argv: &[&str]| resume_request(&parse(argv).unwrap());
        let request = resume(&["x", "--resume", "abc", "--from", "300"]).unwrap();
        assert_eq!(request.from, ResumeFrom::Step(300));
        assert_eq!(request.resources, None);
        let request = resume(&["x", "--resume", "abc"]).unwrap();
        assert_eq!(request.from, ResumeFrom::Latest);
        let request = resume(&["x", "--resume", "abc", "--from", "best", "--gpus", "1"]).unwrap();
        assert_eq!(request.from, ResumeFrom::Best);
        assert_eq!(request.resources, Some(Resources { gpus: 1 }));
        let wrong = resume(&["x", "--resume", "abc", "--from", "newest"]).unwrap_err();
        assert!(wrong.to_string().contains("--from `newest`"), "{wrong}");
        assert!(parse(&["x", "--resume", "abc", "--profile", "tiny"]).is_err());
    }

    #[test]
    fn only_a_finished_run_exits_zero() {
        assert_eq!(exit_code_for(Some(RunStatus::Finished)), 0);
        assert_ne!(exit_code_for(Some(RunStatus::Failed)), 0);
        assert_ne!(exit_code_for(Some(RunStatus::Stopped)), 0);
        assert_ne!(exit_code_for(None), 0, "a status the server could not tell");
    }
}
