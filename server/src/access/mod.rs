//! Access control: who is calling (`principal`), what each route requires (`policy`), and the
//! decision itself (`decide`), applied to every request by one middleware (`http::access`).
//! Passwords (`password`) and secrets such as tokens and session ids (`secret`) are hashed
//! before they reach the store; failed sign-ins are throttled (`throttle`).
//!
//! Levels are per experiment: READ sees its runs, charts, logs and checkpoints; EDIT also
//! creates, launches, stops, tags and reports; MANAGE also grants, renames and deletes. A run
//! or experiment the caller may not read answers 404, exactly like one that does not exist.

pub mod audit;
pub mod password;
pub mod policy;
pub mod principal;
pub mod secret;
pub mod throttle;

pub use policy::{Rule, Target};
pub use principal::Principal;

use crate::app::AppState;
use crate::store::accounts::Level;
use crate::store::{StoreError, DEFAULT_EXPERIMENT};

/// Why a request was refused.
#[derive(Debug)]
pub enum Denied {
    /// No valid credential (401; a page sends the browser to the sign-in page).
    SignIn,
    /// The caller may see the target but not do this (403), in plain words.
    Forbidden(String),
    /// The target does not exist, or the caller may not read it: the same answer (404).
    NotFound(String),
    Store(StoreError),
    /// A fault of the server itself (a route without an access rule): a logged 500.
    Bug(String),
}

impl From<StoreError> for Denied {
    fn from(e: StoreError) -> Self {
        match e {
            StoreError::NotFound { entity, id } => {
                Denied::NotFound(format!("{entity} `{id}` not found"))
            }
            other => Denied::Store(other),
        }
    }
}

/// The decision for one request: `id` is the route's `{id}` parameter, if any.
pub async fn decide(
    state: &AppState,
    principal: &Principal,
    rule: Rule,
    write: bool,
    id: Option<&str>,
) -> Result<(), Denied> {
    if rule == Rule::Public {
        return Ok(());
    }
    if principal.is_anonymous() {
        return Err(Denied::SignIn);
    }
    if write && !principal.may_write() {
        return Err(Denied::Forbidden(
            "this token may only read (its scope is `read`)".into(),
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
            _ => Err(Denied::Forbidden(
                "a run's token may only report that run".into(),
            )),
        };
    }
    match rule {
        Rule::Public | Rule::SignedIn => Ok(()),
        // The handler applies the target's rule once it has read the target's name.
        Rule::InRequest(_) => Ok(()),
        Rule::Admin => Err(Denied::Forbidden(
            "only an administrator may do this".into(),
        )),
        Rule::Run(level) => require_run(state, principal, id.unwrap_or_default(), level).await,
        Rule::Report => require_run(state, principal, id.unwrap_or_default(), Level::Edit).await,
        Rule::Experiment(level) => {
            // Named back as the client named it, so a hidden experiment's name does not leak.
            let asked = id.unwrap_or_default();
            let experiment = state.store.get_experiment(asked).await?;
            require_experiment(state, principal, &experiment.id, asked, level).await
        }
        Rule::Sweep(level) => {
            let asked = id.unwrap_or_default();
            let not_found = || Denied::NotFound(format!("sweep `{asked}` not found"));
            let sweep = match state.store.get_sweep(asked).await {
                Err(StoreError::NotFound { .. }) => return Err(not_found()),
                other => other?,
            };
            match require_experiment(state, principal, &sweep.experiment_id, "", level).await {
                // A sweep in an experiment the caller may not read does not exist for them.
                Err(Denied::NotFound(_)) => Err(not_found()),
                Err(Denied::Forbidden(_)) => Err(Denied::Forbidden(format!(
                    "you need {} access to the experiment of sweep `{asked}`",
                    level.as_str()
                ))),
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
) -> Result<(), Denied> {
    match rule {
        Rule::InRequest(target) => decide(state, principal, target.rule(), write, Some(id)).await,
        _ => Ok(()),
    }
}

/// The caller needs `level` on the run's experiment; a run it may not read is "not found".
pub async fn require_run(
    state: &AppState,
    principal: &Principal,
    run_id: &str,
    level: Level,
) -> Result<(), Denied> {
    let not_found = || Denied::NotFound(format!("run `{run_id}` not found"));
    let run = match state.store.run_access(run_id).await {
        Err(StoreError::NotFound { .. }) => return Err(not_found()),
        other => other?,
    };
    let have = principal.level_on(state, &run.experiment_id).await?;
    if have < Level::Read {
        return Err(not_found());
    }
    if have < level {
        return Err(Denied::Forbidden(format!(
            "you need {} access to this run's experiment (you have {})",
            level.as_str(),
            have.as_str()
        )));
    }
    Ok(())
}

/// The caller needs `level` on the experiment; one it may not read is "not found".
pub async fn require_experiment(
    state: &AppState,
    principal: &Principal,
    experiment_id: &str,
    name: &str,
    level: Level,
) -> Result<(), Denied> {
    let have = principal.level_on(state, experiment_id).await?;
    if have < Level::Read {
        return Err(Denied::NotFound(format!("experiment `{name}` not found")));
    }
    if have < level {
        return Err(Denied::Forbidden(format!(
            "you need {} access to experiment `{name}` (you have {})",
            level.as_str(),
            have.as_str()
        )));
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
) -> Result<(), Denied> {
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
) -> Result<String, Denied> {
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

impl From<Denied> for crate::http::error::ApiError {
    fn from(d: Denied) -> Self {
        use crate::http::error::ApiError;
        match d {
            Denied::SignIn => ApiError::Unauthorized,
            Denied::Forbidden(message) => ApiError::Forbidden {
                field: None,
                message,
            },
            Denied::NotFound(m) => ApiError::NotFound(m),
            Denied::Store(e) => e.into(),
            Denied::Bug(cause) => ApiError::Internal(anyhow::anyhow!(cause)),
        }
    }
}

/// A new token for one attempt of a launched run: it may report that run only, and it stops
/// working when the run ends. Returns the secret (the store keeps its hash).
pub async fn issue_run_token(
    store: &dyn crate::store::Store,
    run_id: &str,
) -> crate::store::StoreResult<String> {
    let secret = secret::new_secret();
    store
        .create_token(crate::store::accounts::TokenNew {
            id: secret::new_id(),
            secret_hash: secret::hash_secret(&secret),
            user_id: None,
            run_id: Some(run_id.to_owned()),
            name: format!("run {run_id}"),
            scope: crate::store::accounts::TokenScope::Run,
            created_at: crate::store::now_ms(),
            expires_at: None,
        })
        .await?;
    Ok(secret)
}
