//! View structs for the dashboard's askama templates, and the pure functions that build them from
//! store types. Everything here is plain data: askama escapes every value it renders.

use crate::store::{Run, RunStatus};
use askama::Template;
use std::collections::{BTreeMap, BTreeSet};
use trainer::wire::moe_keys;

/// Colours for compared runs: the dashboard's one palette.
pub use crate::http::palette::PALETTE;

#[derive(Template)]
#[template(path = "error.html")]
pub struct ErrorPage {
    pub nav: &'static str,
    pub title: String,
    pub message: String,
}

pub struct Choice {
    pub value: String,
    pub selected: bool,
}

pub struct ExperimentChoice {
    pub id: String,
    pub name: String,
    pub selected: bool,
}

/// The filter form's current values (echoed back into the inputs).
#[derive(Default, Clone)]
pub struct Filters {
    pub experiment: String,
    pub status: String,
    pub tag: String,
    pub q: String,
    pub cols: String,
    /// `created_at`, `-metrics.val/loss`, ... (leading `-` = descending).
    pub sort: String,
}

pub struct Header {
    pub label: String,
    pub numeric: bool,
    pub sort_href: Option<String>,
    pub sorted: bool,
    pub aria_sort: &'static str,
    pub arrow: &'static str,
}

pub struct RunRow {
    pub id: String,
    pub short_id: String,
    pub name: String,
    pub status: &'static str,
    pub experiment: String,
    pub params: Vec<String>,
    pub metrics: Vec<String>,
    pub duration: String,
    pub tags: Vec<String>,
    pub created: String,
}

#[derive(Template)]
#[template(path = "runs.html")]
pub struct RunsPage {
    pub nav: &'static str,
    pub heading: String,
    pub subtitle: String,
    pub experiments: Vec<ExperimentChoice>,
    pub statuses: Vec<Choice>,
    pub filters: Filters,
    pub error: Option<String>,
    pub count_label: String,
    pub headers: Vec<Header>,
    pub rows: Vec<RunRow>,
    pub first_href: Option<String>,
    pub next_href: Option<String>,
}

pub struct RunHeader {
    pub id: String,
    pub name: String,
    pub status: &'static str,
    pub experiment_id: String,
    pub experiment: String,
    pub duration: String,
    pub stoppable: bool,
    pub relaunchable: bool,
    pub exit: Option<String>,
    pub tags: Vec<String>,
    pub notes: String,
}

pub struct ChartCard {
    pub title: String,
    pub keys_csv: String,
    pub latest: String,
    pub svg_href: String,
}

pub struct HeatmapCard {
    pub layer: u32,
    pub prefix: String,
    pub experts: u32,
}

pub struct CheckpointRow {
    pub name: String,
    pub href: String,
    pub size: String,
    pub modified: String,
}

#[derive(Template)]
#[template(path = "run.html")]
pub struct RunPage {
    pub nav: &'static str,
    pub run: RunHeader,
    pub charts: Vec<ChartCard>,
    pub heatmaps: Vec<HeatmapCard>,
    pub checkpoints: Vec<CheckpointRow>,
    pub params: Vec<(String, String)>,
    pub config_yaml: Option<String>,
    pub log_placeholder: String,
    /// Highest step already stored: the live stream starts after it (empty: from the start).
    pub after_step: String,
}

pub struct CompareRun {
    pub id: String,
    pub name: String,
    pub color: &'static str,
}

pub struct ParamRow {
    pub key: String,
    pub values: Vec<String>,
    pub differs: bool,
}

#[derive(Template)]
#[template(path = "compare.html")]
pub struct ComparePage {
    pub nav: &'static str,
    pub runs: Vec<CompareRun>,
    /// `[{"id":..,"name":..}]` for the chart module (escaped into an attribute).
    pub runs_json: String,
    pub key: String,
    pub keys: Vec<Choice>,
    pub svg_href: String,
    pub params: Vec<ParamRow>,
    pub differing: usize,
}

pub struct LaunchForm {
    pub profile: String,
    pub experiment: String,
    pub name: String,
    pub gpus: u32,
    pub yaml: String,
    pub overrides: String,
}

pub struct AnnotatedLine {
    pub number: usize,
    pub text: String,
    pub bad: bool,
    pub message: Option<String>,
}

#[derive(Template)]
#[template(path = "launch.html")]
pub struct LaunchPage {
    pub nav: &'static str,
    pub profiles: Vec<Choice>,
    pub form: LaunchForm,
    pub error: Option<String>,
    pub yaml_error_line: Option<usize>,
    pub annotated: Vec<AnnotatedLine>,
}

// ---------------------------------------------------------------------------------------------
// Formatting helpers

/// Percent-encodes a query component (RFC 3986 unreserved characters pass through).
pub fn enc(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                out.push(b as char)
            }
            _ => out.push_str(&format!("%{b:02X}")),
        }
    }
    out
}

/// Percent-encodes a metric key for a URL path, keeping `/` as a separator.
pub fn enc_path(s: &str) -> String {
    s.split('/').map(enc).collect::<Vec<_>>().join("/")
}

/// A metric value with 4 significant digits, scientific for very small or large magnitudes.
pub fn fmt_value(v: f64) -> String {
    if !v.is_finite() {
        return v.to_string();
    }
    let a = v.abs();
    if a != 0.0 && !(1e-3..1e5).contains(&a) {
        return format!("{v:.3e}");
    }
    let digits = if a == 0.0 {
        0
    } else {
        (3 - a.log10().floor() as i32).clamp(0, 6) as usize
    };
    let s = format!("{v:.digits$}");
    if s.contains('.') {
        s.trim_end_matches('0').trim_end_matches('.').to_string()
    } else {
        s
    }
}

pub fn fmt_duration(ms: i64) -> String {
    let s = (ms.max(0) + 500) / 1000;
    let (h, m, sec) = (s / 3600, (s % 3600) / 60, s % 60);
    if h > 0 {
        format!("{h}h {m:02}m")
    } else if m > 0 {
        format!("{m}m {sec:02}s")
    } else {
        format!("{sec}s")
    }
}

pub fn fmt_bytes(n: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = n as f64;
    let mut u = 0;
    while v >= 1024.0 && u < UNITS.len() - 1 {
        v /= 1024.0;
        u += 1;
    }
    if u == 0 {
        format!("{n} B")
    } else {
        format!("{v:.1} {}", UNITS[u])
    }
}

/// `YYYY-MM-DD HH:MM` (UTC) from unix milliseconds.
pub fn fmt_time(ms: i64) -> String {
    let secs = ms.div_euclid(1000);
    let days = secs.div_euclid(86_400);
    let rem = secs.rem_euclid(86_400);
    // Civil date from days since 1970-01-01 (proleptic Gregorian).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!(
        "{y:04}-{m:02}-{d:02} {:02}:{:02}",
        rem / 3600,
        (rem % 3600) / 60
    )
}

/// How long a run has been (or was) going.
pub fn run_duration(run: &Run, now_ms: i64) -> String {
    match (run.started_at, run.ended_at) {
        (Some(s), Some(e)) => fmt_duration(e - s),
        (Some(s), None) if run.status == RunStatus::Running => fmt_duration(now_ms - s),
        (Some(s), None) => fmt_duration(
            run.latest_metrics
                .values()
                .map(|m| m.time)
                .max()
                .unwrap_or(s)
                - s,
        ),
        (None, _) => "–".to_string(),
    }
}

pub fn tag_labels(tags: &BTreeMap<String, String>) -> Vec<String> {
    tags.iter()
        .map(|(k, v)| {
            if v.is_empty() {
                k.clone()
            } else {
                format!("{k}={v}")
            }
        })
        .collect()
}

// ---------------------------------------------------------------------------------------------
// Run page structure

/// Heatmap cards, one per MoE layer with expert-utilisation keys.
pub fn heatmap_cards(keys: &[String]) -> Vec<HeatmapCard> {
    let mut layers: BTreeMap<u32, u32> = BTreeMap::new();
    for k in keys {
        if let Some((l, e)) = moe_keys::parse_expert(k) {
            let n = layers.entry(l).or_insert(0);
            *n = (*n).max(e + 1);
        }
    }
    layers
        .into_iter()
        .map(|(layer, experts)| HeatmapCard {
            layer,
            prefix: moe_keys::expert_prefix(layer as usize),
            experts,
        })
        .collect()
}

/// Groups metric keys into charts: keys sharing their last path segment share a chart
/// (`train/loss` with `val/loss`), loss first, then learning rate, gradient norm, throughput,
/// the rest, and system metrics last. Expert-utilisation keys go to heatmaps instead.
pub fn chart_groups(keys: &[String]) -> Vec<(String, Vec<String>)> {
    let mut groups: BTreeMap<(u8, String), Vec<String>> = BTreeMap::new();
    for k in keys {
        if moe_keys::parse_expert(k).is_some() {
            continue;
        }
        let leaf = k.rsplit('/').next().unwrap_or(k).to_string();
        let rank = if k.starts_with("sys/") {
            9
        } else if leaf.contains("loss") {
            0
        } else if leaf == "lr" || leaf.contains("learning_rate") {
            1
        } else if leaf.contains("grad_norm") {
            2
        } else if leaf.contains("tokens") || leaf.contains("throughput") {
            3
        } else {
            5
        };
        // System metrics keep one chart per key: their units differ.
        let group = if rank == 9 { k.clone() } else { leaf };
        groups.entry((rank, group)).or_default().push(k.clone());
    }
    groups
        .into_iter()
        .map(|((_, g), mut ks)| {
            // Training series before validation, so colours are stable across runs.
            ks.sort_by_key(|k| (!k.starts_with("train"), k.clone()));
            (chart_title(&g), ks)
        })
        .collect()
}

fn chart_title(group: &str) -> String {
    match group {
        "loss" => "Loss".into(),
        "lr" => "Learning rate".into(),
        "grad_norm" => "Gradient norm".into(),
        "tokens_per_sec" | "tokens_per_s" | "tokens/s" => "Tokens / s".into(),
        other => other.to_string(),
    }
}

// ---------------------------------------------------------------------------------------------
// Runs table columns

/// Columns the user asked for (`params.x`, `metrics.y`, comma-separated), or a default: the
/// loss metrics present on the page and up to three params whose values differ between rows.
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
    for k in param_keys {
        let mut values = runs.iter().map(|r| r.params.get(k));
        let first = values.next().flatten();
        if values.any(|v| v != first) {
            params.push(k.clone());
            if params.len() == 3 {
                break;
            }
        }
    }
    (params, metrics)
}

/// Line numbers (1-based) of each key path in a YAML mapping document, so a validation error
/// naming `training.lr` can be shown at its line. Handles the block style profiles use.
pub fn yaml_key_lines(yaml: &str) -> BTreeMap<String, usize> {
    let mut out = BTreeMap::new();
    let mut stack: Vec<(usize, String)> = Vec::new();
    for (i, line) in yaml.lines().enumerate() {
        let trimmed = line.trim_start();
        if trimmed.is_empty() || trimmed.starts_with('#') || trimmed.starts_with('-') {
            continue;
        }
        let indent = line.len() - trimmed.len();
        let Some((key, _)) = trimmed.split_once(':') else {
            continue;
        };
        let key = key.trim().trim_matches(|c| c == '"' || c == '\'');
        while stack.last().is_some_and(|(ind, _)| *ind >= indent) {
            stack.pop();
        }
        let path = match stack.last() {
            Some((_, parent)) => format!("{parent}.{key}"),
            None => key.to_string(),
        };
        out.entry(path.clone()).or_insert(i + 1);
        stack.push((indent, path));
    }
    out
}

/// The line for an error's field path: the longest prefix of the path that names a line.
pub fn line_of_field(yaml: &str, field: &str) -> Option<usize> {
    let lines = yaml_key_lines(yaml);
    let field = field.strip_prefix("config.").unwrap_or(field);
    let mut path = field.to_string();
    loop {
        if let Some(l) = lines.get(&path) {
            return Some(*l);
        }
        path = path.rsplit_once('.')?.0.to_string();
    }
}

pub fn annotate_yaml(yaml: &str, line: Option<usize>, message: &str) -> Vec<AnnotatedLine> {
    let Some(bad) = line else {
        return Vec::new();
    };
    yaml.lines()
        .enumerate()
        .map(|(i, text)| AnnotatedLine {
            number: i + 1,
            text: text.to_string(),
            bad: i + 1 == bad,
            message: (i + 1 == bad).then(|| message.to_string()),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unix_milliseconds_format_as_utc_dates() {
        assert_eq!(fmt_time(0), "1970-01-01 00:00");
        assert_eq!(fmt_time(951_827_696_000), "2000-02-29 12:34");
        assert_eq!(fmt_time(1_700_000_000_000), "2023-11-14 22:13");
    }

    #[test]
    fn values_keep_four_significant_digits() {
        for (v, s) in [
            (0.0, "0"),
            (2.5, "2.5"),
            (0.123456, "0.1235"),
            (1234.5, "1234"),
            (1e-5, "1.000e-5"),
        ] {
            assert_eq!(fmt_value(v), s, "{v}");
        }
    }

    #[test]
    fn yaml_keys_map_to_their_lines() {
        let yaml = "# c\nmodel:\n  d_model: 64\n  moe:\n    top_k: 2\ntraining:\n  lr: 1\n";
        let lines = yaml_key_lines(yaml);
        assert_eq!(lines.get("model.d_model"), Some(&3));
        assert_eq!(lines.get("model.moe.top_k"), Some(&5));
        assert_eq!(lines.get("training.lr"), Some(&7));
        assert_eq!(line_of_field(yaml, "config.model.moe.top_k"), Some(5));
        assert_eq!(
            line_of_field(yaml, "training.missing"),
            Some(6),
            "falls back to the section"
        );
    }

    #[test]
    fn metric_keys_group_into_charts_and_heatmaps() {
        let keys: Vec<String> = [
            "val/loss",
            "train/loss",
            "train/lr",
            "sys/cpu",
            "moe/layer1/expert3",
            "moe/layer1/expert0",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        let groups = chart_groups(&keys);
        assert_eq!(
            groups[0],
            (
                "Loss".to_string(),
                vec!["train/loss".to_string(), "val/loss".to_string()]
            )
        );
        assert_eq!(groups[1].0, "Learning rate");
        assert_eq!(
            groups.last().map(|g| g.1.clone()),
            Some(vec!["sys/cpu".to_string()])
        );
        let heat = heatmap_cards(&keys);
        assert_eq!((heat.len(), heat[0].layer, heat[0].experts), (1, 1, 4));
        assert_eq!(moe_keys::parse_expert("moe/layer2/expertx"), None);
    }
}
