//! Access control: who is calling (`principal`), what each route requires (`policy`), and the
//! decision itself (`decide`), applied to every request by one middleware (`http::access`).
//! Passwords (`password`) and secrets such as tokens and session ids (`secret`) are hashed
//! before they reach the store; failed sign-ins are throttled (`throttle`).
//!
//! Levels are per experiment: READ sees its runs, charts, logs and checkpoints; EDIT also
//! creates, launches, stops, tags and reports; MANAGE also grants, renames and deletes. A run
//! or experiment the caller may not read answers 404, exactly like one that does not exist.

pub mod audit;
pub mod epoch;
pub mod password;
pub mod policy;
pub mod principal;
pub mod revocation;
pub mod secret;
pub mod throttle;

pub use policy::{Rule, Target};
pub use principal::Principal;
pub use secret::issue_run_token;

use crate::error::Error;
use crate::state::AppState;
use crate::store::accounts::Level;
use crate::store::{Experiment, Store, StoreError, DEFAULT_EXPERIMENT};

/// The decision for one request: `id` is the route's `{id}` parameter, if any.
pub async fn decide(
    state: &AppState,
    principal: &Principal,
    rule: Rule,
    write: bool,
    id: Option<&str>,
) -> Result<(), Error> {
    if rule == Rule::Public {
        return Ok(());
    }
    if principal.is_anonymous() {
        return Err(Error::SignIn);
    }
    if write && !principal.may_write() {
        return Err(Error::forbidden(
            "this token may only read (its scope is `read`)",
        ));
    }
    if principal.is_admin() {
        // Every level on everything: no lookup, so the local user's metric writes (the hot
        // path) cost what they did before accounts, and a missing run is the handler's 404.
        return Ok(());
    }
    if let Principal::Run { run_id } = principal {
        // A run's token reports its own run and does nothing else.
        return match (rule, id) {
            (Rule::Report, Some(id)) if id == run_id => Ok(()),
            // Its handler checks the run it names with `Rule::Report`, which lands above.
            (Rule::InRequest(Target::Report), None) => Ok(()),
            _ => Err(Error::forbidden("a run's token may only report that run")),
        };
    }
    match rule {
        Rule::Public | Rule::SignedIn => Ok(()),
        // The handler applies the target's rule once it has read the target's name.
        Rule::InRequest(_) => Ok(()),
        Rule::Admin => Err(Error::forbidden("only an administrator may do this")),
        Rule::Run(level) => require_run(state, principal, id.unwrap_or_default(), level).await,
        Rule::Report => require_run(state, principal, id.unwrap_or_default(), Level::Edit).await,
        Rule::Experiment(level) => {
            // Named back as the client named it, so a hidden experiment's name does not leak.
            let asked = id.unwrap_or_default();
            let experiment = state.store.get_experiment(asked).await?;
            require_experiment(state, principal, &experiment.id, asked, level).await
        }
        Rule::Model(level) => require_model(state, principal, id.unwrap_or_default(), level).await,
        Rule::Sweep(level) => {
            let asked = id.unwrap_or_default();
            let not_found = || Error::NotFound(format!("sweep `{asked}` not found"));
            let sweep = match state.store.get_sweep(asked).await {
                Err(StoreError::NotFound { .. }) => return Err(not_found()),
                other => other?,
            };
            let in_sweep = Held {
                experiment_id: &sweep.experiment_id,
                created_by: sweep.created_by.as_deref(),
            };
            match require_held(state, principal, in_sweep, level, "sweep").await {
                // A sweep in an experiment the caller may not read does not exist for them.
                Err(Error::NotFound(_)) => Err(not_found()),
                Err(Error::Forbidden { message: why, .. }) => {
                    Err(Error::forbidden(format!("sweep `{asked}`: {why}")))
                }
                other => other,
            }
        }
    }
}

/// The second half of an [`Rule::InRequest`] route's check, in its handler: `id` is the run or
/// experiment the request names. Any other rule was decided in full before the handler ran.
pub async fn require_named(
    state: &AppState,
    principal: &Principal,
    rule: Rule,
    write: bool,
    id: &str,
) -> Result<(), Error> {
    match rule {
        Rule::InRequest(target) => decide(state, principal, target.rule(), write, Some(id)).await,
        _ => Ok(()),
    }
}

/// The caller needs `level` on the run ([`policy::run_level`]); a run it may not read is "not
/// found".
pub async fn require_run(
    state: &AppState,
    principal: &Principal,
    run_id: &str,
    level: Level,
) -> Result<(), Error> {
    let not_found = || Error::NotFound(format!("run `{run_id}` not found"));
    let run = match state.store.run_access(run_id).await {
        Err(StoreError::NotFound { .. }) => return Err(not_found()),
        other => other?,
    };
    let held = Held {
        experiment_id: &run.experiment_id,
        created_by: run.created_by.as_deref(),
    };
    match require_held(state, principal, held, level, "run").await {
        Err(Error::NotFound(_)) => Err(not_found()),
        other => other,
    }
}

/// The caller needs `level` on the registered model named `name`: its level on the model's
/// experiment, narrowed as for a run in the shared experiment (its creator in the run's creator's
/// place). A model it may not read is "not found".
pub async fn require_model(
    state: &AppState,
    principal: &Principal,
    name: &str,
    level: Level,
) -> Result<(), Error> {
    let not_found = || Error::NotFound(format!("registered model `{name}` not found"));
    let model = match state.store.get_model(name).await {
        Err(StoreError::NotFound { .. }) => return Err(not_found()),
        other => other?,
    };
    let held = Held {
        experiment_id: &model.experiment_id,
        created_by: model.created_by.as_deref(),
    };
    match require_held(state, principal, held, level, "registered model").await {
        Err(Error::NotFound(_)) => Err(not_found()),
        Err(Error::Forbidden { field, message }) => Err(Error::Forbidden {
            field,
            message: format!("model `{name}`: {message}"),
        }),
        other => other,
    }
}

/// The caller's level on a registered model (what pages use to offer its actions), as for a
/// run.
pub async fn level_on_model(
    state: &AppState,
    principal: &Principal,
    model: &crate::store::models::ModelRow,
) -> Result<Level, StoreError> {
    let on_experiment = principal
        .level_on(state.store.as_ref(), &model.experiment_id)
        .await?;
    let held = Held {
        experiment_id: &model.experiment_id,
        created_by: model.created_by.as_deref(),
    };
    level_on_held(state, principal, held, on_experiment).await
}

/// A run or sweep, as far as the access check cares: where it is and who created it.
#[derive(Debug, Clone, Copy)]
struct Held<'a> {
    experiment_id: &'a str,
    created_by: Option<&'a str>,
}

/// The caller needs `level` on a run or sweep (`what`): a "not found" when it may not read it.
async fn require_held(
    state: &AppState,
    principal: &Principal,
    held: Held<'_>,
    level: Level,
    what: &str,
) -> Result<(), Error> {
    let on_experiment = principal
        .level_on(state.store.as_ref(), held.experiment_id)
        .await?;
    if on_experiment < Level::Read {
        return Err(Error::NotFound(format!("{what} not found")));
    }
    if level <= Level::Read {
        return Ok(());
    }
    let have = level_on_held(state, principal, held, on_experiment).await?;
    if have >= level {
        return Ok(());
    }
    let shared = held.experiment_id == policy::SHARED_EXPERIMENT_ID;
    Err(Error::forbidden(if shared && have < on_experiment {
        format!(
            "this {what} is in the shared experiment `{DEFAULT_EXPERIMENT}`: only its \
             creator, an administrator or someone granted {} access there may change it \
             (you may read it)",
            level.as_str()
        )
    } else {
        format!(
            "you need {} access to this {what}'s experiment (you have {})",
            level.as_str(),
            have.as_str()
        )
    }))
}

/// The caller's level on a run or sweep whose experiment it has `on_experiment` on: the table
/// of [`policy::run_level`]. The grants are read only where they matter (someone else's run
/// in the shared experiment).
async fn level_on_held(
    state: &AppState,
    principal: &Principal,
    held: Held<'_>,
    on_experiment: Level,
) -> Result<Level, StoreError> {
    if principal.is_admin() {
        return Ok(on_experiment);
    }
    let creator = held.created_by.is_some() && held.created_by == principal.user_id();
    let shared = held.experiment_id == policy::SHARED_EXPERIMENT_ID;
    let granted = match principal.user_id() {
        Some(user) if shared && !creator && on_experiment > Level::Read => {
            state.store.granted_level(user, held.experiment_id).await?
        }
        // Where it does not matter.
        _ => on_experiment,
    };
    Ok(policy::run_level(
        held.experiment_id,
        policy::Standing {
            experiment: on_experiment,
            granted,
            creator,
        },
    ))
}

/// The caller's level on a run (what pages use to offer its actions): [`policy::run_level`].
pub async fn level_on_run(
    state: &AppState,
    principal: &Principal,
    run: &crate::store::accounts::RunAccess,
) -> Result<Level, StoreError> {
    let on_experiment = principal
        .level_on(state.store.as_ref(), &run.experiment_id)
        .await?;
    let held = Held {
        experiment_id: &run.experiment_id,
        created_by: run.created_by.as_deref(),
    };
    level_on_held(state, principal, held, on_experiment).await
}

/// The caller's level on a sweep (what its page uses to offer its actions), as for a run.
pub async fn level_on_sweep(
    state: &AppState,
    principal: &Principal,
    sweep: &crate::store::sweeps::SweepRow,
) -> Result<Level, StoreError> {
    let on_experiment = principal
        .level_on(state.store.as_ref(), &sweep.experiment_id)
        .await?;
    let held = Held {
        experiment_id: &sweep.experiment_id,
        created_by: sweep.created_by.as_deref(),
    };
    level_on_held(state, principal, held, on_experiment).await
}

/// The caller needs `level` on the experiment; one it may not read is "not found".
pub async fn require_experiment(
    state: &AppState,
    principal: &Principal,
    experiment_id: &str,
    name: &str,
    level: Level,
) -> Result<(), Error> {
    let have = principal
        .level_on(state.store.as_ref(), experiment_id)
        .await?;
    if have < Level::Read {
        return Err(Error::NotFound(format!("experiment `{name}` not found")));
    }
    if have < level {
        return Err(Error::forbidden(format!(
            "you need {} access to experiment `{name}` (you have {})",
            level.as_str(),
            have.as_str()
        )));
    }
    Ok(())
}

/// The one visibility rule: the experiments where the caller has at least `level` (`None`:
/// every one, for an administrator). A read-only token has nothing above READ.
pub async fn experiments_at(
    store: &dyn Store,
    principal: &Principal,
    level: Level,
) -> Result<Option<Vec<String>>, StoreError> {
    if principal.is_admin() {
        return Ok(None);
    }
    let Some(user) = principal.user() else {
        return Ok(Some(Vec::new()));
    };
    if level > Level::Read && !principal.may_write() {
        return Ok(Some(Vec::new()));
    }
    Ok(Some(
        store
            .experiment_levels(&user.id)
            .await?
            .into_iter()
            .filter(|(_, have)| *have >= level)
            .map(|(id, _)| id)
            .collect(),
    ))
}

/// Keeps the experiments of `experiments` the caller may read (READ, as [`experiments_at`]).
pub async fn retain_readable(
    store: &dyn Store,
    principal: &Principal,
    experiments: &mut Vec<Experiment>,
) -> Result<(), StoreError> {
    if let Some(readable) = experiments_at(store, principal, Level::Read).await? {
        experiments.retain(|e| readable.contains(&e.id));
    }
    Ok(())
}

/// Whether the caller may add runs to the experiment named (EDIT on an existing one; any
/// signed-in caller may name a new one). Checked first, before the request's other fields, so
/// a refusal does not depend on what else was wrong.
pub async fn may_add_runs(
    state: &AppState,
    principal: &Principal,
    id_or_name: Option<&str>,
) -> Result<(), Error> {
    match state
        .store
        .get_experiment(id_or_name.unwrap_or(DEFAULT_EXPERIMENT))
        .await
    {
        Ok(e) => {
            let asked = id_or_name.unwrap_or(DEFAULT_EXPERIMENT);
            require_experiment(state, principal, &e.id, asked, Level::Edit).await
        }
        Err(StoreError::NotFound { .. }) => Ok(()),
        Err(e) => Err(e.into()),
    }
}

/// For a request that creates runs in an experiment named in its body (`POST /runs`, launch):
/// an existing experiment needs EDIT; a new name creates the experiment, owned by the caller.
/// Returns the experiment's id.
pub async fn experiment_for_new_run(
    state: &AppState,
    principal: &Principal,
    id_or_name: Option<&str>,
) -> Result<String, Error> {
    let wanted = id_or_name.unwrap_or(DEFAULT_EXPERIMENT);
    match state.store.get_experiment(wanted).await {
        Ok(experiment) => {
            require_experiment(state, principal, &experiment.id, wanted, Level::Edit).await?;
            Ok(experiment.id)
        }
        Err(StoreError::NotFound { .. }) => {
            let experiment = state
                .store
                .resolve_experiment_owned(wanted, principal.user_id(), state.settings.default_level)
                .await?;
            Ok(experiment.id)
        }
        Err(e) => Err(e.into()),
    }
}
