//! Text sampled from a launched run's checkpoint, on this server's CPU: the API
//! (`POST /api/v1/runs/{id}/checkpoints/{name}/sample`) and the checkpoints panel alike.

use std::sync::Arc;

use serde::{Deserialize, Serialize};

use crate::checkpoints;
use crate::error::Error;
use crate::state::AppState;
use crate::validate::Invalid;

/// Most tokens one sample request may ask for (the model runs on this server's CPU).
pub const MAX_SAMPLE_TOKENS: usize = 500;
/// Longest prompt, in bytes.
pub const MAX_PROMPT_LEN: usize = 4096;

#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct SampleRequest {
    /// Text to continue (empty: start a new document).
    #[serde(default)]
    pub prompt: String,
    /// 1..=500, default 100.
    #[serde(default)]
    pub max_new_tokens: Option<usize>,
    /// 0 = greedy; default 0.8.
    #[serde(default)]
    pub temperature: Option<f64>,
    /// Sample among the k most likely tokens (0 = all, the default).
    #[serde(default)]
    pub top_k: Option<usize>,
    /// Nucleus threshold in (0, 1] (1 = off, the default).
    #[serde(default)]
    pub top_p: Option<f64>,
    #[serde(default)]
    pub seed: Option<u64>,
}

#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct SampleResponse {
    /// The checkpoint that produced it, and its step.
    pub checkpoint: String,
    pub step: u64,
    /// The generated continuation (without the prompt).
    pub text: String,
}

impl SampleRequest {
    fn params(&self) -> Result<(usize, trainer::sample::SamplingParams), Invalid> {
        crate::validate::limits::check_len("prompt", &self.prompt, MAX_PROMPT_LEN)?;
        let tokens = self.max_new_tokens.unwrap_or(100);
        if !(1..=MAX_SAMPLE_TOKENS).contains(&tokens) {
            return Err(Invalid::new(
                "max_new_tokens",
                format!("max_new_tokens must be from 1 to {MAX_SAMPLE_TOKENS}, got {tokens}"),
            ));
        }
        let temperature = self.temperature.unwrap_or(0.8);
        if !(temperature.is_finite() && (0.0..=10.0).contains(&temperature)) {
            return Err(Invalid::new(
                "temperature",
                "temperature must be from 0 (greedy) to 10",
            ));
        }
        let top_p = self.top_p.unwrap_or(1.0);
        if !(top_p > 0.0 && top_p <= 1.0) {
            return Err(Invalid::new("top_p", "top_p must be in (0, 1]"));
        }
        Ok((
            tokens,
            trainer::sample::SamplingParams {
                temperature,
                top_k: self.top_k.unwrap_or(0),
                top_p,
            },
        ))
    }
}

/// One sample at a time: the model runs on the server's CPU beside training runs.
static SAMPLING: std::sync::LazyLock<Arc<tokio::sync::Semaphore>> =
    std::sync::LazyLock::new(|| Arc::new(tokio::sync::Semaphore::new(1)));

/// Generates text from a checkpoint, on this server's CPU (one request at a time).
pub async fn sample_text(
    state: &AppState,
    id: &str,
    name: &str,
    request: &SampleRequest,
) -> Result<SampleResponse, Error> {
    let (tokens, params) = request.params()?;
    state.store.get_run(id).await?;
    let dir = state.launcher.run_dir(id);
    let wanted = name.to_string();
    let found = tokio::task::spawn_blocking(move || checkpoints::find(&dir, &wanted))
        .await
        .map_err(Error::internal)?;
    let Some((checkpoint, path)) = found else {
        return Err(Error::NotFound(format!(
            "checkpoint `{name}` of run `{id}` not found"
        )));
    };
    let _turn = SAMPLING
        .clone()
        .acquire_owned()
        .await
        .map_err(Error::internal)?;
    let prompt = request.prompt.clone();
    let seed = request.seed.unwrap_or(1337);
    let text = tokio::task::spawn_blocking(move || {
        let model = trainer::sample::load(&path, candle_core::Device::Cpu)?;
        model.generate(&prompt, tokens, params, seed)
    })
    .await
    .map_err(Error::internal)?
    .map_err(|e| Error::Internal(e.context("sampling from a checkpoint")))?;
    Ok(SampleResponse {
        checkpoint: checkpoint.name,
        step: checkpoint.step,
        text,
    })
}
