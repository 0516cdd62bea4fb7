//! "Sweep around this run": the spec the new-sweep form starts from when it is opened from a
//! run page, built from that run's recorded config, experiment and metrics.

pub(super) struct Around<'a> {
    pub run_id: &'a str,
    pub run_name: &'a str,
    pub experiment: &'a str,
    pub config: &'a serde_json::Value,
    pub metric_keys: &'a [String],
    pub gpus: u32,
}

/// `v` rounded to 3 significant digits, written as YAML reads it back.
fn round3(v: f64) -> String {
    let r: f64 = format!("{v:.2e}").parse().unwrap_or(v);
    format!("{r:?}")
}

fn number_at(config: &serde_json::Value, path: &str) -> Option<f64> {
    path.split('.')
        .try_fold(config, |v, k| v.get(k))
        .and_then(serde_json::Value::as_f64)
        .filter(|v| v.is_finite())
}

/// A JSON string is a valid YAML double-quoted scalar: names with any characters stay text.
fn yaml_text(s: &str) -> String {
    serde_json::to_string(s).unwrap_or_else(|_| "\"\"".into())
}

/// Search ranges around the run's own values: rates and weights ×/÷ 3 on a log scale (they
/// matter by order of magnitude), dropout ± 0.1 (a probability).
fn ranges_around(config: &serde_json::Value) -> Vec<(String, String)> {
    let mut out = Vec::new();
    for key in [
        "training.learning_rate",
        "training.weight_decay",
        "model.moe.aux_loss_weight",
    ] {
        if let Some(v) = number_at(config, key).filter(|v| *v > 0.0) {
            out.push((
                key.to_string(),
                format!(
                    "{{distribution: log_uniform, min: {}, max: {}}}",
                    round3(v / 3.0),
                    round3(v * 3.0)
                ),
            ));
        }
    }
    if let Some(v) = number_at(config, "model.dropout") {
        let (lo, hi) = ((v - 0.1).max(0.0), (v + 0.1).min(0.9));
        if hi > lo {
            out.push((
                "model.dropout".into(),
                format!(
                    "{{distribution: uniform, min: {}, max: {}}}",
                    round3(lo),
                    round3(hi)
                ),
            ));
        }
    }
    out
}

/// The spec "Sweep around this run" starts from: the run's recorded config as the base, search
/// ranges around its numeric hyperparameters, its experiment, and its evaluation metric.
pub(super) fn spec_around(a: &Around<'_>) -> String {
    let metric = ["val/loss", "train/loss"]
        .into_iter()
        .find(|k| a.metric_keys.iter().any(|m| m == k))
        .map(str::to_string)
        .or_else(|| {
            a.metric_keys
                .iter()
                .find(|k| !k.starts_with("sys/"))
                .cloned()
        })
        .unwrap_or_else(|| "val/loss".into());
    let config_yaml = serde_yaml_ng::to_string(a.config).unwrap_or_default();
    let config: String = config_yaml.lines().map(|l| format!("    {l}\n")).collect();
    let mut params = ranges_around(a.config);
    if params.is_empty() {
        // Nothing numeric to search around: a placeholder the author edits, which still runs.
        params.push((
            "training.learning_rate".into(),
            "{distribution: log_uniform, min: 1.0e-4, max: 1.0e-2}".into(),
        ));
    }
    let parameters: String = params
        .iter()
        .map(|(k, v)| format!("  {k}: {v}\n"))
        .collect();
    // Early stopping judges at evaluations; without them, at a tenth of the run.
    let min_steps = number_at(a.config, "training.eval_steps")
        .filter(|s| *s >= 1.0)
        .or_else(|| number_at(a.config, "training.max_steps").map(|m| (m / 10.0).max(1.0)))
        .unwrap_or(50.0) as u64;
    let name: String = format!("{}-sweep", a.run_name).chars().take(200).collect();
    format!(
        "# A sweep around run {run_name} ({run_id}): its recorded config as the base, and ranges\n\
         # around its numeric hyperparameters. Edit the ranges, the metric and the budget.\n\
         name: {name}\n\
         experiment: {experiment}\n\
         base:\n  config:\n{config}\
         metric: {{name: {metric}, goal: minimize}}\n\
         method: tpe\n\
         parameters:\n{parameters}\
         early_terminate: {{type: asha, min_steps: {min_steps}, reduction_factor: 3}}\n\
         max_trials: 12\n\
         parallel: 2\n\
         resources: {{gpus: {gpus}}}\n",
        run_name = a.run_name.replace('\n', " "),
        run_id = a.run_id,
        name = yaml_text(&name),
        experiment = yaml_text(a.experiment),
        metric = yaml_text(&metric),
        gpus = a.gpus,
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_spec_around_a_run_searches_its_rates_on_a_log_scale() {
        let config = json!({"model": {"d_model": 64, "dropout": 0.05},
            "training": {"learning_rate": 0.003, "weight_decay": 0.0, "eval_steps": 50}});
        let keys = vec!["train/loss".to_string(), "val/loss".to_string()];
        let a = Around {
            run_id: "0123",
            run_name: "a \"quoted\": name",
            experiment: "exp: one",
            config: &config,
            metric_keys: &keys,
            gpus: 0,
        };
        let text = spec_around(&a);
        let body = serde_json::Value::String(text.clone());
        let (doc, spec) = crate::sweeps::admit::parse(&body).expect("spec around a run");
        assert_eq!(spec.name, "a \"quoted\": name-sweep");
        assert_eq!(spec.experiment.as_deref(), Some("exp: one"));
        assert_eq!(spec.metric.name, "val/loss");
        let lr = &doc["parameters"]["training.learning_rate"];
        assert_eq!(lr["distribution"], "log_uniform");
        assert_eq!(lr["min"], json!(0.001));
        assert_eq!(lr["max"], json!(0.009));
        let dropout = &doc["parameters"]["model.dropout"];
        assert_eq!(dropout["min"], json!(0.0));
        assert!((dropout["max"].as_f64().unwrap_or(0.0) - 0.15).abs() < 1e-12);
        assert!(
            doc["parameters"].get("training.weight_decay").is_none(),
            "a zero weight decay has no scale to search around: {text}"
        );
        assert_eq!(doc["base"]["config"]["model"]["d_model"], 64);
    }
}
