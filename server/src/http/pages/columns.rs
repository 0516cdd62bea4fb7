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
    // A text unique to every run is more likely an id than a varied setting (a number unique
    // to every run is a swept value).
    let distinct: BTreeSet<&String> = present.iter().copied().collect();
    let numeric = present.iter().all(|v| v.parse::<f64>().is_ok());
    if values.len() > 2 && distinct.len() == values.len() && !numeric {
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
    params.extend(ranked_params(runs).into_iter().take(DEFAULT_PARAMS));
    (params, metrics)
}

/// The params that differ among `runs`, most telling first: those a sweep varies (they differ
/// among the runs of one sweep), then by `telling`, then those with more distinct values
/// (they differ most), the key's name breaking ties so the order is stable.
pub fn ranked_params(runs: &[Run]) -> Vec<String> {
    let param_keys: BTreeSet<&String> = runs.iter().flat_map(|r| r.params.keys()).collect();
    let mut sweeps: BTreeMap<&str, Vec<&Run>> = BTreeMap::new();
    for r in runs {
        if let Some(sweep) = r.tags.get(crate::sweeps::SWEEP_TAG) {
            sweeps.entry(sweep.as_str()).or_default().push(r);
        }
    }
    let mut differing: Vec<(bool, i32, usize, &String)> = param_keys
        .into_iter()
        .filter_map(|k| {
            let values: Vec<Option<&String>> = runs.iter().map(|r| r.params.get(k)).collect();
            let differs = values.iter().any(|v| *v != values[0]);
            if !differs {
                return None;
            }
            let swept = sweeps.values().any(|trials| {
                let first = trials[0].params.get(k);
                trials.iter().any(|t| t.params.get(k) != first)
            });
            let distinct: BTreeSet<&Option<&String>> = values.iter().collect();
            Some((swept, telling(k, &values), distinct.len(), k))
        })
        .collect();
    differing.sort_by(|a, b| (b.0, b.1, b.2).cmp(&(a.0, a.1, a.2)).then(a.3.cmp(b.3)));
    differing.into_iter().map(|(.., k)| k.clone()).collect()
}

/// At most this many keys are offered in the column chooser (a run may log any number).
pub const CHOOSER_KEYS: usize = 200;

/// The keys a person may pick as columns: params that differ first (as ranked), then the
/// others, then the metrics (no per-expert MoE series), at most [`CHOOSER_KEYS`] in all, each
/// as the `cols=` term it adds (`params.X`, `metrics.X`).
pub fn chooser_keys(runs: &[Run]) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    let ranked = ranked_params(runs);
    let mut seen: BTreeSet<String> = BTreeSet::new();
    let all: BTreeSet<&String> = runs.iter().flat_map(|r| r.params.keys()).collect();
    for k in ranked.iter().chain(all) {
        if seen.insert(k.clone()) {
            out.push(format!("params.{k}"));
        }
    }
    let metrics: BTreeSet<&String> = runs.iter().flat_map(|r| r.latest_metrics.keys()).collect();
    out.extend(
        metrics
            .into_iter()
            .filter(|k| moe_keys::parse_expert(k).is_none())
            .map(|k| format!("metrics.{k}")),
    );
    out.truncate(CHOOSER_KEYS);
    out
}

/// A param's value as the table shows it: a float rounded for reading (`0.0015482797056940566`
/// → `0.001548`), anything else as stored.
pub fn shown_param(value: &str) -> String {
    let looks_float = value.contains(['.', 'e', 'E']);
    match value.parse::<f64>() {
        Ok(v) if looks_float && v.is_finite() => super::views::fmt_value(v),
        _ => value.to_string(),
    }
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
    fn a_swept_param_comes_first_and_floats_are_rounded_for_reading() {
        let mut a = run(&[
            ("model.d_ff", "128"),
            ("training.learning_rate", "0.0015482797056940566"),
            ("training.batch_size", "8"),
        ]);
        let mut b = run(&[
            ("model.d_ff", "256"),
            ("training.learning_rate", "0.0031"),
            ("training.batch_size", "8"),
        ]);
        let c = run(&[
            ("model.d_ff", "512"),
            ("training.learning_rate", "0.0031"),
            ("training.batch_size", "16"),
        ]);
        // a and b are trials of one sweep that varies the learning rate and d_ff; c is apart.
        for r in [&mut a, &mut b] {
            r.tags.insert(crate::sweeps::SWEEP_TAG.into(), "s1".into());
        }
        a.params.insert("model.d_ff".into(), "256".into());
        let ranked = ranked_params(&[a.clone(), b.clone(), c.clone()]);
        assert_eq!(ranked[0], "training.learning_rate", "{ranked:?}");
        // Without a sweep, the param with more distinct values differs most.
        let ranked = ranked_params(&[
            run(&[("model.d_ff", "1"), ("model.n_layers", "2")]),
            run(&[("model.d_ff", "2"), ("model.n_layers", "2")]),
            run(&[("model.d_ff", "3"), ("model.n_layers", "4")]),
        ]);
        assert_eq!(ranked, vec!["model.d_ff", "model.n_layers"]);
        assert_eq!(shown_param("0.0015482797056940566"), "0.001548");
        assert_eq!(shown_param("8"), "8");
        assert_eq!(shown_param("cosine"), "cosine");
        assert_eq!(shown_param("3e-4"), "3.000e-4");
        let keys = chooser_keys(&[a, b, c]);
        assert_eq!(keys[0], "params.training.learning_rate");
        assert!(keys.contains(&"params.training.batch_size".to_string()));
    }

    #[test]
    fn losses_are_better_low_and_accuracies_high() {
        assert!(lower_is_better("val/loss") && lower_is_better("val/ppl"));
        assert!(!lower_is_better("val/acc") && !lower_is_better("eval/f1"));
        assert!(is_eval_key("val/loss") && !is_eval_key("train/loss"));
    }
}
