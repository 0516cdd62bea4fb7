//! Admission of a sweep: the spec is parsed (`sweep::SweepSpec`, every mistake naming its key
//! path), then checked as a whole against what running it will need, before anything runs:
//! every value the space can produce must pass the trainer's config validation on top of the
//! base (a 400 naming the parameter), every string the controller will use must be one it can
//! use (`fields`, a 422 naming it), a command sweep needs the operator's consent, and the GPUs
//! it asks for must exist. A trial's launch request is built here too, so admission and
//! the controller agree on what a trial runs.

use std::collections::BTreeMap;

use sweep::{Command, Params, SweepSpec};

use crate::access::audit::Actor;
use crate::access::audit::AuditAction;
use crate::actions::launch::{self, CommandSpec, LaunchRequest, Resources};
use crate::error::Error;
use crate::state::AppState;
use crate::store::DEFAULT_EXPERIMENT;
use crate::sweeps::view::SweepDetail;
use crate::validate::limits::{config_limit_error, yaml_limit_error};
use crate::validate::{Invalid, Name};

use super::fields::{arg_value, shell_quote};

/// A spec that cannot run is the client's mistake in the request: a 400 naming the key.
pub fn bad(e: Invalid) -> Error {
    Error::Malformed {
        field: Some(e.field),
        message: e.message,
    }
}

/// The spec of a request body (YAML text, or a JSON object): the document as JSON, which is
/// what the store keeps (a later change edits it and parses it again), and what it means.
pub fn parse(body: &serde_json::Value) -> Result<(serde_json::Value, SweepSpec), Invalid> {
    let document = match body {
        serde_json::Value::String(text) => {
            if let Some(message) = yaml_limit_error("spec", text) {
                return Err(Invalid::new("spec", message));
            }
            serde_yaml_ng::from_str::<serde_json::Value>(text)
                .map_err(|e| Invalid::new("spec", format!("the spec is not valid YAML: {e}")))?
        }
        value => value.clone(),
    };
    if !document.is_object() {
        return Err(Invalid::new(
            "spec",
            "the spec must be YAML text or a JSON object",
        ));
    }
    if let Some(message) = config_limit_error(&document) {
        return Err(Invalid::new("spec", message));
    }
    let spec =
        SweepSpec::from_json_value(&document).map_err(|e| Invalid::new(e.field, e.reason))?;
    Ok((document, spec))
}

/// Admits and starts a sweep: the whole spec is checked first (every parameter path a real
/// config key, every value it can produce a valid config), so nothing runs of a spec that
/// could not.
pub async fn submit(
    state: &AppState,
    actor: &Actor,
    body: &serde_json::Value,
) -> Result<SweepDetail, Error> {
    let (document, spec) = parse(body).map_err(bad)?;
    let experiment = Name::parse(
        "experiment",
        spec.experiment.as_deref().unwrap_or(DEFAULT_EXPERIMENT),
    )
    .map_err(bad)?;
    let principal = &actor.principal;
    crate::access::may_add_runs(state, principal, Some(experiment.as_str())).await?;
    check(state, &spec).await?;
    let experiment_id =
        crate::access::experiment_for_new_run(state, principal, Some(experiment.as_str())).await?;
    let row = state
        .store
        .create_sweep(&experiment_id, &spec.name, &document, principal.user_id())
        .await?;
    actor
        .record(
            state.store.as_ref(),
            AuditAction::SweepSubmit,
            Some(&row.id),
            None,
        )
        .await;
    state.sweeps.start(state, &row.id);
    Ok(super::view::detail(state, &row.id).await?)
}

/// Checks that every trial of `spec` can run here; the error names the parameter (or the base
/// key) at fault. A string the controller would use and something downstream would refuse (a
/// name too long for its trials' run names, a control character, a NUL from YAML text, a metric
/// key no run can report) is a 422 (`fields`).
pub async fn check(state: &AppState, spec: &SweepSpec) -> Result<(), Error> {
    super::fields::check(spec)?;
    if spec.base.command.is_some() && !state.settings.allow_command_launch {
        return Err(Error::Forbidden {
            field: Some("base.command".into()),
            message: "a command sweep launches a custom command, which is turned off on this \
                      server; an operator can allow it with `trainyard serve \
                      --allow-command-launch` (or TRAINYARD_ALLOW_COMMAND_LAUNCH=true)"
                .into(),
        });
    }
    let gpus = spec.resources.gpus;
    let available = state.launcher.gpus().len();
    // Trials of a server that sends runs to Slurm ask the cluster for their GPUs.
    let local = state.launcher.default_executor() == crate::launcher::slurm::Executor::Local;
    if local && gpus > available {
        return Err(bad(Invalid::new(
            "resources.gpus",
            format!("each trial asks for {gpus} GPUs but this server has {available}"),
        )));
    }
    let spec = spec.clone();
    // Loading and validating configs is CPU work: off the async workers.
    tokio::task::spawn_blocking(move || check_configs(&spec))
        .await
        .map_err(Error::internal)?
        .map_err(bad)
}

/// The base alone, then each probe value of each parameter on top of it, through the trainer's
/// own config validation. Command sweeps have no config to check.
fn check_configs(spec: &SweepSpec) -> Result<(), Invalid> {
    if spec.base.command.is_some() {
        return Ok(());
    }
    let base = base_request(spec);
    launch::resolve_config(&base).map_err(|e| {
        // A key of the base's overrides is named where it was written.
        let field = if spec.base.overrides.contains_key(&e.field) {
            format!("base.overrides.{}", e.field)
        } else {
            format!("base.{}", e.field)
        };
        Invalid::new(field, e.message)
    })?;
    for (key, value) in spec.probe_values() {
        let mut req = base_request(spec);
        req.overrides.insert(key.clone(), value.clone());
        if let Err(e) = launch::resolve_config(&req) {
            let shown = match &value {
                serde_json::Value::String(s) => s.clone(),
                other => other.to_string(),
            };
            return Err(Invalid::new(
                format!("parameters.{key}"),
                format!(
                    "the value {shown} would make an invalid config: {}",
                    e.message
                ),
            ));
        }
    }
    Ok(())
}

/// The launch request of the base: config or profile, overrides, working directory.
fn base_request(spec: &SweepSpec) -> LaunchRequest {
    LaunchRequest {
        config: spec.base.config.clone(),
        profile: spec.base.profile.clone(),
        overrides: spec.base.overrides.clone(),
        working_dir: spec.base.working_dir.clone(),
        ..Default::default()
    }
}

/// The launch request of trial `number` of sweep `sweep_id` with `params`.
pub fn trial_request(
    spec: &SweepSpec,
    sweep_id: &str,
    experiment_id: &str,
    number: u32,
    params: &Params,
) -> LaunchRequest {
    let mut req = base_request(spec);
    req.experiment = Some(experiment_id.to_string());
    req.name = Some(format!("{}-{number}", spec.name));
    req.tags = BTreeMap::from([
        (super::SWEEP_TAG.to_string(), sweep_id.to_string()),
        (super::TRIAL_TAG.to_string(), format!("{sweep_id}/{number}")),
    ]);
    req.resources = Some(Resources {
        gpus: spec.resources.gpus,
        ..Resources::default()
    });
    let args: Vec<String> = params
        .iter()
        .map(|(k, v)| format!("--{k}={}", arg_value(v)))
        .collect();
    match &spec.base.command {
        Some(Command::Shell(line)) => {
            let quoted: Vec<String> = args.iter().map(|a| shell_quote(a)).collect();
            req.command = Some(CommandSpec::Shell(format!("{line} {}", quoted.join(" "))));
        }
        Some(Command::Argv(argv)) => {
            let mut argv = argv.clone();
            argv.extend(args);
            req.command = Some(CommandSpec::Argv(argv));
        }
        None => {
            for (k, v) in params {
                req.overrides.insert(k.clone(), v.clone());
            }
        }
    }
    let json = serde_json::to_string(params).unwrap_or_else(|_| "{}".into());
    req.env.insert("TRAINYARD_PARAMS".into(), json);
    req.env
        .insert("TRAINYARD_SWEEP_ID".into(), sweep_id.to_string());
    req.env.insert("TRAINYARD_TRIAL".into(), number.to_string());
    req
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn spec(extra: &str) -> SweepSpec {
        let text = format!(
            "name: s\nmetric: {{name: loss, goal: minimize}}\nmethod: random\nmax_trials: 4\n{extra}"
        );
        SweepSpec::from_yaml_str(&text).expect("spec")
    }

    #[test]
    fn a_value_the_trainer_refuses_is_named_by_its_parameter() {
        // d_model 63 is not a multiple of the tiny profile's heads.
        let s = spec("base: {profile: tiny}\nparameters:\n  model.d_model: {values: [64, 63]}\n");
        let err = check_configs(&s).expect_err("63 is refused");
        assert_eq!(err.field, "parameters.model.d_model");
        assert!(err.message.contains("63"), "{}", err.message);
    }

    #[test]
    fn a_valid_space_passes() {
        let s = spec(
            "base: {profile: tiny}\nparameters:\n  training.learning_rate: {distribution: log_uniform, min: 0.001, max: 0.01}\n",
        );
        check_configs(&s).expect("valid");
    }

    #[test]
    fn a_command_trial_gets_its_parameters_as_arguments_and_in_its_environment() {
        let s = spec("base: {command: [python3, f.py]}\nparameters:\n  x: {values: [1.5]}\n  name: {values: [\"it's\"]}\n");
        let params = Params::from([
            ("x".to_string(), json!(1.5)),
            ("name".to_string(), json!("it's")),
        ]);
        let req = trial_request(&s, "abc", "1", 3, &params);
        match req.command {
            Some(CommandSpec::Argv(argv)) => {
                assert_eq!(argv, vec!["python3", "f.py", "--name=it's", "--x=1.5"])
            }
            other => panic!("expected an argv, got {other:?}"),
        }
        let env: serde_json::Value =
            serde_json::from_str(&req.env["TRAINYARD_PARAMS"]).expect("json");
        assert_eq!(env, json!({"x": 1.5, "name": "it's"}));
        assert_eq!(req.tags[crate::sweeps::TRIAL_TAG], "abc/3");

        let s =
            spec("base: {command: \"python3 f.py\"}\nparameters:\n  name: {values: [\"it's\"]}\n");
        let req = trial_request(&s, "abc", "1", 0, &params);
        match req.command {
            Some(CommandSpec::Shell(line)) => {
                assert_eq!(line, r"python3 f.py '--name=it'\''s' '--x=1.5'")
            }
            other => panic!("expected a shell line, got {other:?}"),
        }
    }

    #[test]
    fn a_config_trial_gets_its_parameters_as_overrides() {
        let s = spec("base: {profile: tiny, overrides: {training.max_steps: 20}}\nparameters:\n  training.learning_rate: {values: [0.001]}\n");
        let params = Params::from([("training.learning_rate".to_string(), json!(0.001))]);
        let req = trial_request(&s, "abc", "1", 0, &params);
        assert_eq!(req.overrides["training.learning_rate"], json!(0.001));
        assert_eq!(req.overrides["training.max_steps"], json!(20));
        let cfg = launch::resolve_config(&req).unwrap().unwrap();
        assert_eq!(cfg.training.learning_rate, 0.001);
    }
}
