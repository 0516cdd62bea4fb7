//! The one table of route rules: every routed path of the API, the pages and the MLflow
//! protocol, with the rule its access check applies (see the parent module for the rules).

use super::{Level, Method, Rule, Target};

/// `(method, route pattern as registered, rule)`. `GET` rows also cover `HEAD`.
pub(super) const RULES: &[(Method, &str, Rule)] = &[
    // --- API, under /api/v1 ---
    (Method::GET, "/healthz", Rule::Public),
    (Method::GET, "/api/v1/openapi.json", Rule::Public),
    (Method::GET, "/api/v1/session", Rule::Public),
    (Method::POST, "/api/v1/session", Rule::Public),
    (Method::DELETE, "/api/v1/session", Rule::Public),
    (Method::GET, "/api/v1/tokens", Rule::SignedIn),
    (Method::POST, "/api/v1/tokens", Rule::SignedIn),
    (Method::DELETE, "/api/v1/tokens/{id}", Rule::SignedIn),
    (Method::GET, "/api/v1/users", Rule::Admin),
    (Method::POST, "/api/v1/users", Rule::Admin),
    (Method::PATCH, "/api/v1/users/{name}", Rule::Admin),
    (Method::GET, "/api/v1/teams", Rule::SignedIn),
    (Method::POST, "/api/v1/teams", Rule::Admin),
    (
        Method::PUT,
        "/api/v1/teams/{id}/members/{user}",
        Rule::Admin,
    ),
    (
        Method::DELETE,
        "/api/v1/teams/{id}/members/{user}",
        Rule::Admin,
    ),
    (Method::GET, "/api/v1/audit", Rule::Admin),
    (Method::GET, "/api/v1/experiments", Rule::SignedIn),
    (Method::POST, "/api/v1/experiments", Rule::SignedIn),
    (
        Method::GET,
        "/api/v1/experiments/{id}",
        Rule::Experiment(Level::Read),
    ),
    (
        Method::PATCH,
        "/api/v1/experiments/{id}",
        Rule::Experiment(Level::Manage),
    ),
    (
        Method::GET,
        "/api/v1/experiments/{id}/grants",
        Rule::Experiment(Level::Read),
    ),
    (
        Method::PUT,
        "/api/v1/experiments/{id}/grants",
        Rule::Experiment(Level::Manage),
    ),
    (Method::GET, "/api/v1/runs", Rule::SignedIn),
    (Method::POST, "/api/v1/runs", Rule::SignedIn),
    (Method::GET, "/api/v1/runs/{id}", Rule::Run(Level::Read)),
    (Method::PATCH, "/api/v1/runs/{id}", Rule::Report),
    (
        Method::DELETE,
        "/api/v1/runs/{id}",
        Rule::Run(Level::Manage),
    ),
    (Method::POST, "/api/v1/runs/{id}/heartbeat", Rule::Report),
    (
        Method::GET,
        "/api/v1/runs/{id}/metrics",
        Rule::Run(Level::Read),
    ),
    (Method::POST, "/api/v1/runs/{id}/metrics", Rule::Report),
    (
        Method::GET,
        "/api/v1/runs/{id}/metric-keys",
        Rule::Run(Level::Read),
    ),
    (
        Method::GET,
        "/api/v1/runs/{id}/events",
        Rule::Run(Level::Read),
    ),
    (Method::GET, "/api/v1/events", Rule::SignedIn),
    (
        Method::GET,
        "/api/v1/runs/{id}/logs",
        Rule::Run(Level::Read),
    ),
    (
        Method::GET,
        "/api/v1/runs/{id}/expert-utilization",
        Rule::Run(Level::Read),
    ),
    (
        Method::GET,
        "/api/v1/runs/{id}/charts",
        Rule::Run(Level::Read),
    ),
    (
        Method::GET,
        "/api/v1/runs/{id}/charts/{*file}",
        Rule::Run(Level::Read),
    ),
    (Method::GET, "/api/v1/charts/{file}", Rule::SignedIn),
    (
        Method::GET,
        "/api/v1/runs/{id}/checkpoints",
        Rule::Run(Level::Read),
    ),
    (
        Method::GET,
        "/api/v1/runs/{id}/checkpoints/{name}/archive",
        Rule::Run(Level::Read),
    ),
    (
        Method::GET,
        "/api/v1/runs/{id}/export/hf",
        Rule::Run(Level::Read),
    ),
    (
        Method::POST,
        "/api/v1/runs/{id}/checkpoints/{name}/sample",
        Rule::Run(Level::Edit),
    ),
    (
        Method::POST,
        "/api/v1/runs/{id}/stop",
        Rule::Run(Level::Edit),
    ),
    (
        Method::POST,
        "/api/v1/runs/{id}/resume",
        Rule::Run(Level::Edit),
    ),
    (
        Method::POST,
        "/api/v1/runs/{id}/end",
        Rule::Run(Level::Edit),
    ),
    (Method::GET, "/api/v1/sweeps", Rule::SignedIn),
    (Method::POST, "/api/v1/sweeps", Rule::SignedIn),
    (Method::GET, "/api/v1/sweeps/{id}", Rule::Sweep(Level::Read)),
    (
        Method::PATCH,
        "/api/v1/sweeps/{id}",
        Rule::Sweep(Level::Edit),
    ),
    (
        Method::POST,
        "/api/v1/sweeps/{id}/pause",
        Rule::Sweep(Level::Edit),
    ),
    (
        Method::POST,
        "/api/v1/sweeps/{id}/resume",
        Rule::Sweep(Level::Edit),
    ),
    (
        Method::POST,
        "/api/v1/sweeps/{id}/stop",
        Rule::Sweep(Level::Edit),
    ),
    (
        Method::GET,
        "/api/v1/sweeps/{id}/events",
        Rule::Sweep(Level::Read),
    ),
    (Method::GET, "/api/v1/models", Rule::SignedIn),
    (Method::GET, "/api/v1/models/{id}", Rule::Model(Level::Read)),
    (
        Method::GET,
        "/api/v1/models/{id}/versions/{version}/archive",
        Rule::Model(Level::Read),
    ),
    (
        Method::GET,
        "/api/v1/models/{id}/versions/{version}/export/hf",
        Rule::Model(Level::Read),
    ),
    (
        Method::PUT,
        "/api/v1/models/{id}/aliases/{alias}",
        Rule::Model(Level::Edit),
    ),
    (
        Method::DELETE,
        "/api/v1/models/{id}/aliases/{alias}",
        Rule::Model(Level::Edit),
    ),
    (
        Method::POST,
        "/api/v1/runs/{id}/checkpoints/{name}/register",
        Rule::Run(Level::Read),
    ),
    // --- pages ---
    (Method::GET, "/static/{*file}", Rule::Public),
    (Method::GET, "/api-docs", Rule::Public),
    (Method::GET, "/sign-in", Rule::Public),
    (Method::POST, "/sign-in", Rule::Public),
    (Method::POST, "/sign-out", Rule::Public),
    (Method::GET, "/", Rule::SignedIn),
    (
        Method::GET,
        "/experiments/{id}",
        Rule::Experiment(Level::Read),
    ),
    (
        Method::GET,
        "/experiments/{id}/sharing",
        Rule::Experiment(Level::Read),
    ),
    (
        Method::POST,
        "/experiments/{id}/sharing",
        Rule::Experiment(Level::Manage),
    ),
    (Method::GET, "/runs/{id}", Rule::Run(Level::Read)),
    (Method::GET, "/runs/{id}/panels", Rule::Run(Level::Read)),
    (
        Method::GET,
        "/runs/{id}/artifacts/{*path}",
        Rule::Run(Level::Read),
    ),
    (Method::POST, "/runs/{id}/tags", Rule::Run(Level::Edit)),
    (Method::POST, "/runs/{id}/notes", Rule::Run(Level::Edit)),
    (Method::POST, "/runs/{id}/stop", Rule::Run(Level::Edit)),
    (Method::POST, "/runs/{id}/end", Rule::Run(Level::Edit)),
    (Method::POST, "/runs/{id}/relaunch", Rule::Run(Level::Edit)),
    (Method::POST, "/runs/{id}/resume", Rule::Run(Level::Edit)),
    (Method::POST, "/runs/{id}/delete", Rule::Run(Level::Manage)),
    (
        Method::GET,
        "/runs/{id}/checkpoints/{name}/sample",
        Rule::Run(Level::Read),
    ),
    (
        Method::POST,
        "/runs/{id}/checkpoints/{name}/sample",
        Rule::Run(Level::Edit),
    ),
    (
        Method::POST,
        "/runs/{id}/checkpoints/{name}/register",
        Rule::Run(Level::Read),
    ),
    (Method::GET, "/models", Rule::SignedIn),
    (Method::GET, "/models/{id}", Rule::Model(Level::Read)),
    (
        Method::POST,
        "/models/{id}/aliases",
        Rule::Model(Level::Edit),
    ),
    (Method::GET, "/compare", Rule::SignedIn),
    (Method::GET, "/sweeps", Rule::SignedIn),
    (Method::GET, "/sweeps/new", Rule::SignedIn),
    (Method::POST, "/sweeps/new", Rule::SignedIn),
    (Method::GET, "/sweeps/{id}", Rule::Sweep(Level::Read)),
    (Method::POST, "/sweeps/{id}/pause", Rule::Sweep(Level::Edit)),
    (
        Method::POST,
        "/sweeps/{id}/resume",
        Rule::Sweep(Level::Edit),
    ),
    (Method::POST, "/sweeps/{id}/stop", Rule::Sweep(Level::Edit)),
    (
        Method::POST,
        "/sweeps/{id}/change",
        Rule::Sweep(Level::Edit),
    ),
    (Method::GET, "/launch", Rule::SignedIn),
    (Method::POST, "/launch", Rule::SignedIn),
    (Method::GET, "/account", Rule::SignedIn),
    (Method::POST, "/account/tokens", Rule::SignedIn),
    (Method::POST, "/account/tokens/{id}/revoke", Rule::SignedIn),
    (Method::GET, "/admin/users", Rule::Admin),
    (Method::POST, "/admin/users", Rule::Admin),
    (Method::POST, "/admin/users/{name}", Rule::Admin),
    (Method::POST, "/admin/teams", Rule::Admin),
    (Method::POST, "/admin/teams/{id}/members", Rule::Admin),
    (Method::GET, "/admin/audit", Rule::Admin),
    // --- the MLflow tracking protocol (`http::mlflow`), the same under /api and /ajax-api ---
    (
        Method::POST,
        "/api/2.0/mlflow/experiments/create",
        Rule::SignedIn,
    ),
    (Method::GET, "/api/2.0/mlflow/experiments/get", EXP_READ),
    (
        Method::GET,
        "/api/2.0/mlflow/experiments/get-by-name",
        EXP_READ,
    ),
    (
        Method::GET,
        "/api/2.0/mlflow/experiments/search",
        Rule::SignedIn,
    ),
    (
        Method::POST,
        "/api/2.0/mlflow/experiments/search",
        Rule::SignedIn,
    ),
    (
        Method::POST,
        "/api/2.0/mlflow/experiments/update",
        EXP_MANAGE,
    ),
    (
        Method::POST,
        "/api/2.0/mlflow/experiments/delete",
        EXP_MANAGE,
    ),
    (
        Method::POST,
        "/api/2.0/mlflow/experiments/restore",
        EXP_MANAGE,
    ),
    (
        Method::POST,
        "/api/2.0/mlflow/experiments/set-experiment-tag",
        EXP_EDIT,
    ),
    (
        Method::POST,
        "/api/2.0/mlflow/experiments/delete-experiment-tag",
        EXP_EDIT,
    ),
    (Method::POST, "/api/2.0/mlflow/runs/create", EXP_EDIT),
    (Method::GET, "/api/2.0/mlflow/runs/get", RUN_READ),
    (Method::POST, "/api/2.0/mlflow/runs/update", REPORT),
    (Method::POST, "/api/2.0/mlflow/runs/delete", RUN_EDIT),
    (Method::POST, "/api/2.0/mlflow/runs/restore", RUN_EDIT),
    (Method::GET, "/api/2.0/mlflow/runs/search", Rule::SignedIn),
    (Method::POST, "/api/2.0/mlflow/runs/search", Rule::SignedIn),
    (Method::POST, "/api/2.0/mlflow/runs/log-metric", REPORT),
    (Method::POST, "/api/2.0/mlflow/runs/log-batch", REPORT),
    (Method::POST, "/api/2.0/mlflow/runs/log-parameter", REPORT),
    (Method::POST, "/api/2.0/mlflow/runs/set-tag", REPORT),
    (Method::POST, "/api/2.0/mlflow/runs/delete-tag", REPORT),
    (Method::POST, "/api/2.0/mlflow/runs/log-inputs", REPORT),
    (Method::GET, "/api/2.0/mlflow/metrics/get-history", RUN_READ),
    (
        Method::GET,
        "/api/2.0/mlflow/metrics/get-history-bulk-interval",
        RUN_READ,
    ),
    (Method::GET, "/api/2.0/mlflow/artifacts/list", RUN_READ),
    (Method::GET, "/api/2.0/mlflow-artifacts/artifacts", RUN_READ),
    (
        Method::GET,
        "/api/2.0/mlflow-artifacts/artifacts/{*path}",
        RUN_READ,
    ),
    (
        Method::PUT,
        "/api/2.0/mlflow-artifacts/artifacts/{*path}",
        REPORT,
    ),
    (
        Method::DELETE,
        "/api/2.0/mlflow-artifacts/artifacts/{*path}",
        RUN_EDIT,
    ),
    (
        Method::POST,
        "/api/2.0/mlflow/logged-models/search",
        Rule::SignedIn,
    ),
    // The model registry (`http::mlflow::registry`): a model's rule is its experiment's.
    (
        Method::POST,
        "/api/2.0/mlflow/registered-models/create",
        Rule::SignedIn,
    ),
    (
        Method::POST,
        "/api/2.0/mlflow/registered-models/rename",
        MODEL_EDIT,
    ),
    (
        Method::PATCH,
        "/api/2.0/mlflow/registered-models/update",
        MODEL_EDIT,
    ),
    (
        Method::DELETE,
        "/api/2.0/mlflow/registered-models/delete",
        MODEL_MANAGE,
    ),
    (
        Method::GET,
        "/api/2.0/mlflow/registered-models/get",
        MODEL_READ,
    ),
    (
        Method::GET,
        "/api/2.0/mlflow/registered-models/search",
        Rule::SignedIn,
    ),
    (
        Method::GET,
        "/api/2.0/mlflow/registered-models/get-latest-versions",
        MODEL_READ,
    ),
    (
        Method::POST,
        "/api/2.0/mlflow/registered-models/get-latest-versions",
        MODEL_READ,
    ),
    (
        Method::POST,
        "/api/2.0/mlflow/registered-models/set-tag",
        MODEL_EDIT,
    ),
    (
        Method::DELETE,
        "/api/2.0/mlflow/registered-models/delete-tag",
        MODEL_EDIT,
    ),
    (
        Method::GET,
        "/api/2.0/mlflow/registered-models/alias",
        MODEL_READ,
    ),
    (
        Method::POST,
        "/api/2.0/mlflow/registered-models/alias",
        MODEL_EDIT,
    ),
    (
        Method::DELETE,
        "/api/2.0/mlflow/registered-models/alias",
        MODEL_EDIT,
    ),
    (
        Method::POST,
        "/api/2.0/mlflow/model-versions/create",
        MODEL_EDIT,
    ),
    (
        Method::PATCH,
        "/api/2.0/mlflow/model-versions/update",
        MODEL_EDIT,
    ),
    (
        Method::DELETE,
        "/api/2.0/mlflow/model-versions/delete",
        MODEL_MANAGE,
    ),
    (
        Method::GET,
        "/api/2.0/mlflow/model-versions/get",
        MODEL_READ,
    ),
    (
        Method::GET,
        "/api/2.0/mlflow/model-versions/search",
        Rule::SignedIn,
    ),
    (
        Method::GET,
        "/api/2.0/mlflow/model-versions/get-download-uri",
        MODEL_READ,
    ),
    (
        Method::POST,
        "/api/2.0/mlflow/model-versions/set-tag",
        MODEL_EDIT,
    ),
    (
        Method::DELETE,
        "/api/2.0/mlflow/model-versions/delete-tag",
        MODEL_EDIT,
    ),
    (Method::GET, "/api/3.0/mlflow/server-info", Rule::SignedIn),
];

const EXP_READ: Rule = Rule::InRequest(Target::Experiment(Level::Read));
const EXP_EDIT: Rule = Rule::InRequest(Target::Experiment(Level::Edit));
const EXP_MANAGE: Rule = Rule::InRequest(Target::Experiment(Level::Manage));
const RUN_READ: Rule = Rule::InRequest(Target::Run(Level::Read));
const RUN_EDIT: Rule = Rule::InRequest(Target::Run(Level::Edit));
const REPORT: Rule = Rule::InRequest(Target::Report);
const MODEL_READ: Rule = Rule::InRequest(Target::Model(Level::Read));
const MODEL_EDIT: Rule = Rule::InRequest(Target::Model(Level::Edit));
const MODEL_MANAGE: Rule = Rule::InRequest(Target::Model(Level::Manage));
