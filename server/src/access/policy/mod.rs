//! Who may call which route: one table, read by the one access check (`http::access`) for every
//! request that reaches a route, API and pages alike. A route with no row here is refused for
//! everyone but the local single user, and the role-matrix test walks every documented route, so
//! a route added without a rule fails the suite instead of being open.

use ::http::Method;

use crate::store::accounts::Level;

mod table;
use table::RULES;

/// What a route requires of the caller.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Rule {
    /// Anyone, signed in or not: health, the API document, static files, signing in.
    Public,
    /// Any signed-in caller; what the handler returns is filtered to what the caller may read
    /// (run search, experiment list, the global event stream, compare), and a handler that acts
    /// on an experiment named in the body checks that experiment with
    /// [`crate::access::require_experiment`].
    SignedIn,
    /// `{id}` is a run; the caller needs this level on the run ([`run_level`]: its level on
    /// the run's experiment, narrower on others' runs in the shared experiment).
    Run(Level),
    /// `{id}` is an experiment; the caller needs this level on it.
    Experiment(Level),
    /// `{id}` is a sweep; the caller needs this level on it ([`run_level`], as for a run).
    Sweep(Level),
    /// `{id}` is a registered model (by name); the caller needs this level on it: the level on
    /// the model's experiment, as for a run of it ([`run_level`], its creator in place of the
    /// run's).
    Model(Level),
    /// `{id}` is a run that reports here: EDIT on the run ([`run_level`]), or that run's own
    /// token.
    Report,
    /// Instance administrators only.
    Admin,
    /// The target is named in the query string or the body, not the path (the MLflow
    /// protocol): the check here lets any caller through that could pass the rule at all, and
    /// the handler applies it once it has read the name (`crate::access::require_named`).
    InRequest(Target),
}

/// What an [`Rule::InRequest`] route acts on, and the level it needs there.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Target {
    /// A run named by its id; the caller needs this level on the run ([`run_level`]).
    Run(Level),
    /// A run that reports here (its metrics, params, tags, status, artifacts): EDIT on the run
    /// ([`run_level`]), or that run's own token.
    Report,
    /// An experiment named by its id or name.
    Experiment(Level),
    /// A registered model named by its name.
    Model(Level),
}

impl Target {
    /// The rule the handler applies once it knows the id.
    pub fn rule(self) -> Rule {
        match self {
            Target::Run(level) => Rule::Run(level),
            Target::Report => Rule::Report,
            Target::Experiment(level) => Rule::Experiment(level),
            Target::Model(level) => Rule::Model(level),
        }
    }
}

/// The id of the shared experiment (`store::DEFAULT_EXPERIMENT`): runs land there when no
/// experiment is named, and every signed-in user has EDIT on it through its default level.
pub const SHARED_EXPERIMENT_ID: &str = "0";

/// How a caller stands towards one run (or sweep): what [`run_level`] decides from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Standing {
    /// The caller's level on the run's experiment, from every source (its default level too).
    pub experiment: Level,
    /// The part of it given to the caller in particular: as the experiment's owner, through a
    /// grant to the user or to one of its teams (not the experiment's default level).
    pub granted: Level,
    /// Whether the caller created the run (or sweep).
    pub creator: bool,
}

/// The caller's level on one run (or sweep) of an experiment, what [`Rule::Run`],
/// [`Rule::Report`] and [`Rule::Sweep`] compare with. Administrators have every level and never
/// get here.
///
/// | experiment | caller | level on the run |
/// |---|---|---|
/// | any but the shared one | anyone | its level on the experiment |
/// | shared (`Default`) | the run's creator | MANAGE when its level there is EDIT or more (it may delete its own run), else that level |
/// | shared (`Default`) | anyone else | READ, or what a grant to them (or their team, or owning it) gives, whichever is higher |
///
/// So in the shared experiment everyone's EDIT (its default level) adds runs and reads every
/// run, and changing someone else's run (stop, resume, tags, notes, status, metrics, delete)
/// takes a grant. A read-only token's cap on `experiment` caps the result too.
pub fn run_level(experiment_id: &str, s: Standing) -> Level {
    if experiment_id != SHARED_EXPERIMENT_ID {
        return s.experiment;
    }
    if s.creator {
        return if s.experiment >= Level::Edit {
            Level::Manage
        } else {
            s.experiment
        };
    }
    s.experiment
        .min(Level::Read)
        .max(s.granted.min(s.experiment))
}

/// The browser UI of MLflow calls the same routes under `/ajax-api`: one rule for both.
const AJAX_PREFIX: &str = "/ajax-api/";

/// The rule of a route, by its method and registered pattern (axum's `MatchedPath`).
pub fn rule(method: &Method, pattern: &str) -> Option<Rule> {
    let method = if method == Method::HEAD {
        &Method::GET
    } else {
        method
    };
    let pattern = &canonical(pattern);
    RULES
        .iter()
        .find(|(m, p, _)| m == method && *p == pattern)
        .map(|(_, _, rule)| *rule)
}

/// Whether some method of this route pattern has a rule. A method without one is answered 405
/// by the access check, so this table is also the list of methods each route serves.
pub fn has_route(pattern: &str) -> bool {
    let pattern = canonical(pattern);
    RULES.iter().any(|(_, p, _)| *p == pattern)
}

/// A pattern under `/ajax-api/` has the rule of the same pattern under `/api/`.
fn canonical(pattern: &str) -> std::borrow::Cow<'_, str> {
    match pattern.strip_prefix(AJAX_PREFIX) {
        Some(rest) => format!("/api/{rest}").into(),
        None => pattern.into(),
    }
}

/// Every `(method, pattern)` with a rule, for the role-matrix test.
pub fn routes() -> impl Iterator<Item = (&'static Method, &'static str, Rule)> {
    RULES.iter().map(|(m, p, r)| (m, *p, *r))
}

/// Whether the method changes something (and so needs a write-scoped credential, and a CSRF
/// token when it rides on a session cookie).
pub fn is_write(method: &Method) -> bool {
    !matches!(*method, Method::GET | Method::HEAD | Method::OPTIONS)
}

/// Routes the MLflow client POSTs to that only read (its searches): a read-scoped token may
/// call them.
const READING_POSTS: &[&str] = &[
    "/api/2.0/mlflow/experiments/search",
    "/api/2.0/mlflow/runs/search",
    "/api/2.0/mlflow/logged-models/search",
    "/api/2.0/mlflow/registered-models/get-latest-versions",
];

/// Whether a request to this route changes something: [`is_write`], but for the searches the
/// MLflow protocol sends as POST.
pub fn changes(method: &Method, pattern: &str) -> bool {
    is_write(method) && !(*method == Method::POST && READING_POSTS.contains(&&*canonical(pattern)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn head_follows_get_and_unknown_routes_have_no_rule() {
        assert_eq!(
            rule(&Method::HEAD, "/runs/{id}"),
            Some(Rule::Run(Level::Read))
        );
        assert_eq!(rule(&Method::PUT, "/runs/{id}"), None);
        assert_eq!(rule(&Method::GET, "/nowhere"), None);
    }

    #[test]
    fn in_the_shared_experiment_only_creators_and_grantees_change_a_run() {
        use Level::{Edit, Manage, Read};
        const NO: Level = Level::None;
        let standing = |experiment, granted, creator| Standing {
            experiment,
            granted,
            creator,
        };
        // (experiment, level there, granted part, creator) -> level on the run.
        let cases = [
            // Elsewhere the experiment's level is the run's, whoever created it.
            ("7", Edit, NO, false, Edit),
            ("7", Edit, Edit, true, Edit),
            ("7", NO, NO, false, NO),
            // Everyone's default EDIT on the shared experiment only reads others' runs.
            (SHARED_EXPERIMENT_ID, Edit, NO, false, Read),
            // A grant (own, team's, as owner) is what it says.
            (SHARED_EXPERIMENT_ID, Edit, Edit, false, Edit),
            (SHARED_EXPERIMENT_ID, Manage, Manage, false, Manage),
            (SHARED_EXPERIMENT_ID, Edit, Read, false, Read),
            // Its creator may also delete it.
            (SHARED_EXPERIMENT_ID, Edit, NO, true, Manage),
            // A read-only token (its level capped at READ) reads, creator or not.
            (SHARED_EXPERIMENT_ID, Read, NO, true, Read),
            (SHARED_EXPERIMENT_ID, Read, Manage, false, Read),
            // No access to the experiment: none to its runs.
            (SHARED_EXPERIMENT_ID, NO, NO, false, NO),
            (SHARED_EXPERIMENT_ID, NO, NO, true, NO),
        ];
        for (experiment, level, granted, creator, want) in cases {
            assert_eq!(
                run_level(experiment, standing(level, granted, creator)),
                want,
                "{experiment} {level:?} granted {granted:?} creator {creator}"
            );
        }
    }

    #[test]
    fn no_route_has_two_rules() {
        let mut seen = std::collections::BTreeSet::new();
        for (m, p, _) in routes() {
            assert!(seen.insert((m.as_str(), p)), "{m} {p} has two rules");
        }
    }
}
