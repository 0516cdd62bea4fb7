//! Which params and metrics the runs table shows, and how a metric's best value is read.
//!
//! Without `cols=`, the table shows `train/loss` and `val/loss` (else the first two plain
//! metrics) and the params that tell the listed runs apart, most telling first: a
//! hyperparameter that was varied (`training.*`, `model.*`, `optim*`, numbers, few distinct
//! values) before bookkeeping that differs between any two runs anyway (paths, seeds, names,
//! logging settings).

use std::collections::{BTreeMap, BTreeSet};

use trainer::wire::moe_keys;

use crate::store::Run;

/// Params shown by default.
const DEFAULT_PARAMS: usize = 3;

/// Evaluation metrics (few points, where the best value matters as much as the last).
pub fn is_eval_key(key: &str) -> bool {
    ["val/", "eval/", "valid/", "test/"]
        .iter()
        .any(|p| key.starts_with(p))
}

/// Whether a lower value of `key` is better: losses, perplexities and errors; accuracies and
/// scores are better higher.
pub fn lower_is_better(key: &str) -> bool {
    let k = key.to_ascii_lowercase();
    ![
        "acc",
        "f1",
        "bleu",
        "rouge",
        "score",
        "auc",
        "precision",
        "recall",
    ]
    .iter()
    .any(|w| k.contains(w))
}

/// How telling a differing param is as a column: higher first.
fn telling(key: &str, values: &[Option<&String>]) -> i32 {
    let mut score = 0;
    let section = key.split('.').next().unwrap_or("");
    if matches!(
        section,
        "training" | "model" | "optim" | "optimizer" | "moe"
    ) {
        score += 4;
    }
    if key.contains("seed")
        || key.contains("name")
        || key.contains("path")
        || key.contains("dir")
        || section == "logging"
    {
        score -= 6;
    }
    let present: Vec<&String> = values.iter().flatten().copied().collect();
    if present.iter().all(|v| v.parse::<f64>().is_ok()) {
        score += 2;
    }
    if present.iter().any(|v| v.contains('/')) {
        score -= 3;
    }
    // A value unique to every run is more likely an id than a varied setting.
    let distinct: BTreeSet<&String> = present.iter().copied().collect();
    if values.len() > 2 && distinct.len() == values.len() {
        score -= 1;
    }
    score
}

/// The param and metric columns: those named in `cols` (`params.X`, `metrics.X` or a bare
/// metric key), else the defaults above.
pub fn table_columns(cols: &str, runs: &[Run]) -> (Vec<String>, Vec<String>) {
    let mut params = Vec::new();
    let mut metrics = Vec::new();
    for c in cols.split(',').map(str::trim).filter(|c| !c.is_empty()) {
        if let Some(p) = c.strip_prefix("params.") {
            params.push(p.to_string());
        } else if let Some(m) = c.strip_prefix("metrics.") {
            metrics.push(m.to_string());
        } else {
            metrics.push(c.to_string());
        }
    }
    if !params.is_empty() || !metrics.is_empty() {
        return (params, metrics);
    }
    let metric_keys: BTreeSet<&String> =
        runs.iter().flat_map(|r| r.latest_metrics.keys()).collect();
    for wanted in ["train/loss", "val/loss"] {
        if metric_keys.iter().any(|k| k.as_str() == wanted) {
            metrics.push(wanted.to_string());
        }
    }
    if metrics.is_empty() {
        metrics.extend(
            metric_keys
                .iter()
                .filter(|k| moe_keys::parse_expert(k).is_none())
                .take(2)
                .map(|k| k.to_string()),
        );
    }
    let param_keys: BTreeSet<&String> = runs.iter().flat_map(|r| r.params.keys()).collect();
    let mut differing: Vec<(i32, &String)> = param_keys
        .into_iter()
        .filter_map(|k| {
            let values: Vec<Option<&String>> = runs.iter().map(|r| r.params.get(k)).collect();
            let differs = values.iter().any(|v| *v != values[0]);
            differs.then(|| (telling(k, &values), k))
        })
        .collect();
    // Most telling first; the key's name breaks ties, so the order is stable.
    differing.sort_by(|a, b| b.0.cmp(&a.0).then(a.1.cmp(b.1)));
    params.extend(
        differing
            .into_iter()
            .take(DEFAULT_PARAMS)
            .map(|(_, k)| k.clone()),
    );
    (params, metrics)
}

/// The best value of each (run, eval metric) among `extremes`.
pub fn best_values(extremes: &[crate::store::MetricExtremes]) -> BTreeMap<(String, String), f64> {
    extremes
        .iter()
        .map(|e| {
            let best = if lower_is_better(&e.key) {
                e.min
            } else {
                e.max
            };
            ((e.run_id.clone(), e.key.clone()), best)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(params: &[(&str, &str)]) -> Run {
        let params: BTreeMap<&str, &str> = params.iter().copied().collect();
        serde_json::from_value(serde_json::json!({
            "id": "0", "name": "r", "experiment_id": "0", "status": "finished",
            "created_at": 0, "started_at": null, "ended_at": null, "config": null,
            "params": params, "tags": {}, "notes": "", "exit": null, "latest_metrics": {},
        }))
        .unwrap()
    }

    #[test]
    fn the_varied_hyperparameter_comes_before_paths_seeds_and_logging() {
        let runs = [
            run(&[
                ("data.cache_dir", "/tmp/a"),
                ("logging.flush_interval_ms", "100"),
                ("training.learning_rate", "0.001"),
                ("training.seed", "1"),
                ("training.batch_size", "8"),
            ]),
            run(&[
                ("data.cache_dir", "/tmp/b"),
                ("logging.flush_interval_ms", "200"),
                ("training.learning_rate", "0.003"),
                ("training.seed", "2"),
                ("training.batch_size", "8"),
            ]),
        ];
        let (params, _) = table_columns("", &runs);
        assert_eq!(params[0], "training.learning_rate", "{params:?}");
        assert!(
            !params.contains(&"training.batch_size".to_string()),
            "same everywhere"
        );
        let (params, metrics) = table_columns("params.training.seed, val/loss", &runs);
        assert_eq!(
            (params, metrics),
            (
                vec!["training.seed".to_string()],
                vec!["val/loss".to_string()]
            )
        );
    }

    #[test]
    fn losses_are_better_low_and_accuracies_high() {
        assert!(lower_is_better("val/loss") && lower_is_better("val/ppl"));
        assert!(!lower_is_better("val/acc") && !lower_is_better("eval/f1"));
        assert!(is_eval_key("val/loss") && !is_eval_key("train/loss"));
    }
}
