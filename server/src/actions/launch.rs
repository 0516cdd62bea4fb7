//! Launching a run: resolve and check the request (config, overrides, command, resources),
//! create the run as `queued` and hand it to the launcher. `POST /api/v1/runs` with
//! `launch: true`, the launch page and a page's relaunch all come here.

use std::collections::BTreeMap;

use serde::Deserialize;
use tracing::instrument;
use trainer::config::{Config, ConfigError};

use super::paths;
use crate::access::audit::AuditAction;
use crate::error::Error;
use crate::launcher::LaunchSpec;
use crate::state::AppState;
use crate::store::accounts::Level;
use crate::store::{NewRun, Run, DEFAULT_EXPERIMENT};
use crate::validate::limits::{
    check_len, config_limit_error, yaml_limit_error, MAX_COMMAND_BYTES, MAX_NAME_LEN,
    MAX_OVERRIDES, MAX_OVERRIDE_VALUE_LEN, MAX_PARAM_KEY_LEN, MAX_WORKING_DIR_LEN,
};
use crate::validate::{Invalid, Name, Tags};

/// Most relaunches one run may ask for.
pub const MAX_RESTARTS: u32 = 100;

/// `resources` of a launch request.
#[derive(Debug, Clone, Default, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct Resources {
    /// Whole GPUs (0 = a CPU slot).
    #[serde(default)]
    pub gpus: usize,
    /// `local` (this server's machine) or `slurm` (a Slurm cluster); unset: the server's
    /// `--executor`.
    #[serde(default)]
    pub executor: Option<crate::launcher::slurm::Executor>,
    /// A Slurm run's options (partition, account, QoS, time limit, GPUs, CPUs, memory, extra
    /// `#SBATCH` lines); unset fields take the server's `--slurm-...` defaults.
    #[serde(default)]
    pub slurm: Option<crate::launcher::slurm::SlurmOptions>,
}

/// A custom entrypoint: a shell command line or an argv list.
#[derive(Debug, Clone, Deserialize, utoipa::ToSchema)]
#[serde(untagged)]
pub enum CommandSpec {
    Shell(String),
    Argv(Vec<String>),
}

/// The launch fields of `POST /api/v1/runs` (all ignored unless `launch` is true).
#[derive(Debug, Clone, Default)]
pub struct LaunchRequest {
    pub experiment: Option<String>,
    pub name: Option<String>,
    pub tags: BTreeMap<String, String>,
    /// YAML text or a JSON object.
    pub config: Option<serde_json::Value>,
    pub profile: Option<String>,
    /// Dotted keys → values, applied after `config`/`profile`.
    pub overrides: BTreeMap<String, serde_json::Value>,
    pub resources: Option<Resources>,
    pub max_restarts: Option<u32>,
    pub command: Option<CommandSpec>,
    /// Absolute directory the config's relative paths resolve against; None = the server's
    /// working directory (see `actions::paths`).
    pub working_dir: Option<String>,
    /// Extra environment variables of the process (set by the sweep controller, never read
    /// from a request).
    pub env: BTreeMap<String, String>,
}

fn config_error(e: ConfigError, fallback_field: &str) -> Invalid {
    let field = e.key().unwrap_or(fallback_field).to_string();
    Invalid::new(field, e.to_string())
}

/// Loads, overrides and validates the config of a launch request: a mistake is refused naming
/// the key now, never a run that fails later. None when the request has no config (a command).
pub fn resolve_config(req: &LaunchRequest) -> Result<Option<Config>, Invalid> {
    let mut cfg = match (&req.config, &req.profile) {
        (Some(_), Some(_)) => {
            return Err(Invalid::new(
                "profile",
                "give either `config` or `profile`, not both",
            ))
        }
        (Some(serde_json::Value::String(text)), None) => {
            Config::from_yaml_str(text).map_err(|e| config_error(e, "config"))?
        }
        (Some(v @ serde_json::Value::Object(_)), None) => {
            Config::from_json_value(v).map_err(|e| config_error(e, "config"))?
        }
        (Some(_), None) => {
            return Err(Invalid::new(
                "config",
                "config must be YAML text or a JSON object",
            ))
        }
        (None, Some(name)) => Config::from_profile(name).map_err(|e| config_error(e, "profile"))?,
        (None, None) if req.overrides.is_empty() => return Ok(None),
        (None, None) => Config::default(),
    };
    let overrides: Vec<String> = req
        .overrides
        .iter()
        .map(|(k, v)| match v {
            serde_json::Value::String(s) => format!("{k}={s}"),
            other => format!("{k}={other}"),
        })
        .collect();
    cfg.apply_overrides(&overrides)
        .map_err(|e| config_error(e, "overrides"))?;
    cfg.validate().map_err(|e| config_error(e, "config"))?;
    Ok(Some(cfg))
}

/// The size and nesting limits of everything a launch parses as YAML, checked before any parser
/// runs: a deeply nested document costs the YAML parser far more than its size suggests.
fn check_launch_limits(req: &LaunchRequest) -> Result<(), Invalid> {
    let bad = |field: &str, message: String| Invalid::new(field, message);
    match &req.config {
        Some(serde_json::Value::String(text)) => {
            if let Some(message) = yaml_limit_error("config", text) {
                return Err(bad("config", message));
            }
        }
        Some(value) => {
            if let Some(message) = config_limit_error(value) {
                return Err(bad("config", message));
            }
        }
        None => {}
    }
    if let Some(profile) = &req.profile {
        check_len("profile", profile, MAX_NAME_LEN)?;
    }
    if req.overrides.len() > MAX_OVERRIDES {
        return Err(bad(
            "overrides",
            format!(
                "overrides has {} entries; at most {MAX_OVERRIDES} are allowed",
                req.overrides.len()
            ),
        ));
    }
    for (key, value) in &req.overrides {
        check_len("overrides", key, MAX_PARAM_KEY_LEN)?;
        let field = format!("overrides.{key}");
        let problem = match value {
            serde_json::Value::String(text) if text.len() > MAX_OVERRIDE_VALUE_LEN => {
                Some(format!(
                    "{field} is {} bytes long; at most {MAX_OVERRIDE_VALUE_LEN} are allowed",
                    text.len()
                ))
            }
            serde_json::Value::String(text) => yaml_limit_error(&field, text),
            other => config_limit_error(other),
        };
        if let Some(message) = problem {
            return Err(bad(&field, message));
        }
    }
    Ok(())
}

fn parse_command(command: &Option<CommandSpec>) -> Result<Option<Vec<String>>, Invalid> {
    let size = match command {
        None => return Ok(None),
        Some(CommandSpec::Shell(line)) => line.len(),
        Some(CommandSpec::Argv(argv)) => argv.iter().map(String::len).sum(),
    };
    if size > MAX_COMMAND_BYTES {
        return Err(Invalid::new(
            "command",
            format!("command is {size} bytes long; at most {MAX_COMMAND_BYTES} are allowed"),
        ));
    }
    match command {
        None => Ok(None),
        Some(CommandSpec::Shell(line)) if line.trim().is_empty() => {
            Err(Invalid::new("command", "command must not be empty"))
        }
        Some(CommandSpec::Shell(line)) => Ok(Some(vec!["sh".into(), "-c".into(), line.clone()])),
        Some(CommandSpec::Argv(argv)) if argv.first().is_none_or(|a| a.is_empty()) => {
            Err(Invalid::new("command", "command must name a program"))
        }
        Some(CommandSpec::Argv(argv)) => Ok(Some(argv.clone())),
    }
}

/// A custom command runs anything as the server's user, so it needs the operator's explicit
/// consent (`serve --allow-command-launch`).
fn check_command_allowed(state: &AppState, req: &LaunchRequest) -> Result<(), Error> {
    // Once accounts exist, a command launch must also come from an admin: check it here.
    if req.command.is_some() && !state.settings.allow_command_launch {
        return Err(Error::Forbidden {
            field: Some("command".into()),
            message: "launching a custom command is turned off on this server; an operator can \
                      allow it with `trainyard serve --allow-command-launch` (or \
                      TRAINYARD_ALLOW_COMMAND_LAUNCH=true)"
                .into(),
        });
    }
    Ok(())
}

/// Validates a launch request, creates the run as `queued` and hands it to the launcher.
#[instrument(skip(state, req))]
/// Admits a launch request for `actor`: it needs EDIT on the experiment (a new experiment
/// name creates one it owns), the run records it as its creator, and the audit log the launch.
pub async fn launch_run(
    state: &AppState,
    actor: &crate::access::audit::Actor,
    mut req: LaunchRequest,
) -> Result<Run, Error> {
    let principal = &actor.principal;
    check_command_allowed(state, &req)?;
    let experiment = Name::parse(
        "experiment",
        req.experiment.as_deref().unwrap_or(DEFAULT_EXPERIMENT),
    )?;
    crate::access::may_add_runs(state, principal, Some(experiment.as_str())).await?;
    let name = req
        .name
        .take()
        .map(|n| Name::parse("name", &n))
        .transpose()?;
    let tags = Tags::parse(std::mem::take(&mut req.tags))?;
    let max_restarts = req.max_restarts.unwrap_or(0);
    if max_restarts > MAX_RESTARTS {
        return Err(Invalid::new(
            "max_restarts",
            format!("max_restarts must be at most {MAX_RESTARTS}"),
        )
        .into());
    }
    let command = parse_command(&req.command)?;
    if let Some(slurm) = req.resources.as_ref().and_then(|r| r.slurm.as_ref()) {
        if !principal.is_admin() {
            slurm.check_allowed(
                "resources.slurm",
                &state.settings.launcher.slurm.allowed_options,
            )?;
        }
    }
    check_launch_limits(&req)?;
    if let Some(dir) = &req.working_dir {
        check_len("working_dir", dir, MAX_WORKING_DIR_LEN)?;
    }
    let server_dir = std::env::current_dir().map_err(Error::internal)?;
    let base = paths::Base::of(req.working_dir.as_deref(), &server_dir)?;
    let data_dir = state.launcher.data_dir().to_path_buf();
    let roots = state.launcher.roots().clone();
    // Parsing and validating a config is CPU work, and checking its paths file system work:
    // keep both off the async workers, so a slow document delays only its own request.
    let (mut req, config, data_dir) = tokio::task::spawn_blocking(move || {
        // Paths are compared resolved; the data directory exists (the server made it).
        let data_dir = std::fs::canonicalize(&data_dir).unwrap_or(data_dir);
        let config = resolve_config(&req);
        (req, config, data_dir)
    })
    .await
    .map_err(Error::internal)?;
    let mut config = config?;
    // `model:NAME@ALIAS` weights become the checkpoint they name, checked below as any other.
    let mut init_model = None;
    if let Some(cfg) = config.as_mut() {
        init_model = super::models::resolve_model_weights(state, principal, cfg, &data_dir).await?;
    }
    let config = tokio::task::spawn_blocking(move || {
        let allowed = paths::Allowed {
            roots: &roots,
            runs_dir: &data_dir.join("runs"),
            token_cache: &crate::launcher::token_cache(&data_dir),
        };
        config
            .map(|mut c| paths::resolve_paths(&mut c, &base, &allowed).map(|runs| (c, runs)))
            .transpose()
    })
    .await
    .map_err(Error::internal)?;
    let (config, run_paths) = match config? {
        Some((config, runs)) => (Some(config), runs),
        None => (None, Vec::new()),
    };
    // Another run's checkpoint is the launcher's to read only if that run is: refused in the
    // words of any path outside the roots, so a hidden run is not revealed.
    let mut read = Vec::new();
    for run_path in run_paths {
        match crate::access::require_run(state, principal, &run_path.run_id, Level::Read).await {
            Ok(()) => read.push(run_path.path),
            Err(Error::Store(e)) => return Err(e.into()),
            Err(_) => return Err(run_path.refusal.into()),
        }
    }
    // The model of a fine-tune is its checkpoint's (read only once access to it is checked,
    // so a refusal never shows a hidden run's model).
    let config = match config {
        Some(c) => Some(
            tokio::task::spawn_blocking(move || {
                super::finetune::check_starting_model(&c).map(|()| c)
            })
            .await
            .map_err(Error::internal)??,
        ),
        None => None,
    };
    let config = config
        .map(|c| serde_json::to_value(&c))
        .transpose()
        .map_err(Error::internal)?;
    let spec = LaunchSpec {
        gpus: req.resources.as_ref().map(|r| r.gpus).unwrap_or(0),
        max_restarts,
        command,
        config: config.clone(),
        env: std::mem::take(&mut req.env),
        read,
        executor: req.resources.as_ref().and_then(|r| r.executor),
        slurm: req
            .resources
            .as_ref()
            .and_then(|r| r.slurm.clone())
            .unwrap_or_default(),
    };
    state.launcher.admit(&spec).await?;
    let experiment_id =
        crate::access::experiment_for_new_run(state, principal, Some(experiment.as_str())).await?;
    let mut tags = tags.into_inner();
    if let Some(described) = init_model {
        tags.insert(super::models::INIT_MODEL_TAG.to_string(), described);
    }
    let new = NewRun {
        experiment_id,
        name: name.map(Name::into_string),
        config,
        tags,
        status: None,
        created_by: principal.user_id().map(str::to_owned),
    };
    let run = state.launcher.launch(new, spec).await?;
    actor
        .record(
            state.store.as_ref(),
            AuditAction::RunLaunch,
            Some(&run.id),
            None,
        )
        .await;
    Ok(run)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn field_of(req: LaunchRequest) -> Option<String> {
        match resolve_config(&req) {
            Err(Invalid { field, .. }) => Some(field),
            other => panic!("expected a refusal, got {other:?}"),
        }
    }

    #[test]
    fn bad_launch_configs_are_rejected_naming_the_key() {
        let cases: Vec<(LaunchRequest, &str)> = vec![
            (
                LaunchRequest {
                    profile: Some("tiny".into()),
                    overrides: BTreeMap::from([("training.max_stepz".into(), json!(5))]),
                    ..Default::default()
                },
                "training.max_stepz",
            ),
            (
                LaunchRequest {
                    profile: Some("tiny".into()),
                    overrides: BTreeMap::from([("training.max_steps".into(), json!("many"))]),
                    ..Default::default()
                },
                "training.max_steps",
            ),
            (
                LaunchRequest {
                    config: Some(json!({"model": {"n_heads": 3, "d_model": 64}})),
                    ..Default::default()
                },
                "model.d_model",
            ),
            (
                LaunchRequest {
                    profile: Some("no-such-profile".into()),
                    ..Default::default()
                },
                "profile",
            ),
            (
                LaunchRequest {
                    config: Some(json!(42)),
                    ..Default::default()
                },
                "config",
            ),
        ];
        for (req, field) in cases {
            assert_eq!(field_of(req).as_deref(), Some(field));
        }
    }

    #[test]
    fn a_profile_with_overrides_resolves_to_a_valid_config() {
        let req = LaunchRequest {
            profile: Some("tiny".into()),
            overrides: BTreeMap::from([
                ("training.max_steps".into(), json!(30)),
                ("training.device".into(), json!("cpu")),
            ]),
            ..Default::default()
        };
        let cfg = resolve_config(&req).unwrap().unwrap();
        assert_eq!(cfg.training.max_steps, 30);
        assert_eq!(cfg.training.device, trainer::config::DeviceSpec::Cpu);
    }

    #[test]
    fn yaml_text_is_accepted_as_a_config() {
        let req = LaunchRequest {
            config: Some(json!("training:\n  max_steps: 30\n")),
            ..Default::default()
        };
        assert_eq!(
            resolve_config(&req).unwrap().unwrap().training.max_steps,
            30
        );
    }

    #[test]
    fn commands_are_a_shell_line_or_a_non_empty_argv() {
        assert_eq!(
            parse_command(&Some(CommandSpec::Shell("echo hi".into()))).unwrap(),
            Some(vec!["sh".into(), "-c".into(), "echo hi".into()])
        );
        assert!(parse_command(&Some(CommandSpec::Argv(vec![]))).is_err());
        assert!(parse_command(&Some(CommandSpec::Shell("  ".into()))).is_err());
    }
}
