//! The run page's checkpoints panel and the "sample from here" page. Checkpoints are listed
//! and resolved by `crate::checkpoints` (only names it lists are ever opened); downloads are
//! the API's archive route, samples the API's sampling function.

use super::views::{
    enc, fmt_bytes, fmt_time, fmt_value, CheckpointRow, PanelRun, RunPanels, SamplePage,
};
use super::{check_run_id, html, PageError, PageResult};
use crate::actions::sample::{sample_text, SampleRequest};
use crate::app::AppState;
use axum::extract::{Form, Path, State};
use serde::Deserialize;

/// The panel's rows, by step.
pub async fn rows(state: &AppState, run_id: &str) -> Vec<CheckpointRow> {
    let dir = state.launcher.run_dir(run_id);
    let list = tokio::task::spawn_blocking(move || crate::checkpoints::list(&dir))
        .await
        .unwrap_or_default();
    list.into_iter()
        .map(|c| CheckpointRow {
            archive_href: format!("/api/v1/runs/{run_id}/checkpoints/{}/archive", enc(&c.name)),
            sample_href: format!("/runs/{run_id}/checkpoints/{}/sample", enc(&c.name)),
            finetune_href: format!("/launch?from={run_id}&checkpoint={}", enc(&c.name)),
            time: fmt_time(c.time),
            size: fmt_bytes(c.size_bytes),
            val_loss: c.val_loss.map(fmt_value).unwrap_or_default(),
            best: c.best,
            step: c.step,
            name: c.name,
        })
        .collect()
}

/// Whether a run in `status` with `checkpoints` offers Resume.
pub fn resumable(status: crate::store::RunStatus, checkpoints: &[CheckpointRow]) -> bool {
    (status.is_terminal() || status == crate::store::RunStatus::Lost) && !checkpoints.is_empty()
}

/// The checkpoints and history panels alone: the run page swaps them in when the run's
/// status changes.
pub async fn panels(State(state): State<AppState>, Path(id): Path<String>) -> PageResult {
    check_run_id(&id)?;
    let run = state.store.get_run(&id).await?;
    let checkpoints = rows(&state, &id).await;
    let events = state.store.run_events(&id, None).await?;
    let history = super::run::history_rows(&events);
    let guard_events = super::guard::guard_events(state.store.as_ref(), &id).await?;
    let (export_href, export_unavailable) =
        super::run::export_offer(&state, &run, &checkpoints).await;
    html(RunPanels {
        run: PanelRun {
            resumable: resumable(run.status, &checkpoints),
            status: run.status.as_str(),
            status_reason: super::run::status_reason(&events, run.status),
            parameters: super::run::parameters_label(&run.latest_metrics),
            export_href,
            export_unavailable,
            id,
        },
        checkpoints,
        history,
        guard_events,
    })
}

#[derive(Debug, Deserialize)]
pub struct SampleForm {
    #[serde(default)]
    prompt: String,
    #[serde(default)]
    max_new_tokens: String,
    #[serde(default)]
    temperature: String,
}

fn page(id: &str, name: &str, form: &SampleForm) -> SamplePage {
    SamplePage {
        nav: "runs",
        run_id: id.to_string(),
        checkpoint: name.to_string(),
        prompt: form.prompt.clone(),
        max_new_tokens: form.max_new_tokens.clone(),
        temperature: form.temperature.clone(),
        output: None,
        error: None,
    }
}

/// The empty "sample from here" form.
pub async fn sample_form(Path((id, name)): Path<(String, String)>) -> PageResult {
    check_run_id(&id)?;
    let form = SampleForm {
        prompt: String::new(),
        max_new_tokens: "100".into(),
        temperature: "0.8".into(),
    };
    html(page(&id, &name, &form))
}

fn number<T: std::str::FromStr>(field: &str, text: &str) -> Result<Option<T>, PageError> {
    match text.trim() {
        "" => Ok(None),
        t => t.parse().map(Some).map_err(|_| {
            crate::validate::Invalid::new(field, format!("{field} must be a number, got `{t}`"))
                .into()
        }),
    }
}

/// Generates text and shows it under the form (refusals inline, like the API's).
pub async fn sample(
    State(state): State<AppState>,
    Path((id, name)): Path<(String, String)>,
    Form(f): Form<SampleForm>,
) -> PageResult {
    check_run_id(&id)?;
    let request = SampleRequest {
        prompt: f.prompt.clone(),
        max_new_tokens: number("max_new_tokens", &f.max_new_tokens)?,
        temperature: number("temperature", &f.temperature)?,
        top_k: None,
        top_p: None,
        seed: None,
    };
    let mut view = page(&id, &name, &f);
    match sample_text(&state, &id, &name, &request)
        .await
        .map_err(crate::http::ApiError::from)
    {
        Ok(out) => view.output = Some(format!("{}{}", f.prompt, out.text)),
        Err(e) if e.status().is_client_error() && e.status().as_u16() != 404 => {
            view.error = Some(e.to_string())
        }
        Err(e) => return Err(e.into()),
    }
    html(view)
}
