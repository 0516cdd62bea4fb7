//! View structs for the dashboard's askama templates, and the pure functions that build them from
//! store types. Everything here is plain data: askama escapes every value it renders.

use crate::store::{Run, RunStatus};
use askama::Template;
use std::collections::BTreeMap;

use crate::http::api::charts::layout;

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

/// One row of the runs table on the runs page.
pub struct RunsTableRow {
    pub id: String,
    pub short_id: String,
    pub name: String,
    pub status: &'static str,
    pub experiment: String,
    /// Who created the run (empty without accounts).
    pub user: String,
    /// Each param column's value as shown (floats rounded) and as stored (its title).
    pub params: Vec<(String, String)>,
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
    pub rows: Vec<RunsTableRow>,
    pub first_href: Option<String>,
    pub next_href: Option<String>,
    /// The column chooser's keys (`params.X`, `metrics.X`) and whether each is shown now.
    pub chooser: Vec<(String, bool)>,
}

pub struct RunHeader {
    pub id: String,
    pub name: String,
    pub status: &'static str,
    pub experiment_id: String,
    pub experiment: String,
    pub duration: String,
    /// When the run started (Unix ms; empty if it has not) and the server's time now, from
    /// which the page's script keeps the duration current while the run runs.
    pub started_at: String,
    pub now: i64,
    /// Launched here and queued or running: Stop is offered.
    pub stoppable: bool,
    /// Queued or running: not deleted yet.
    pub active: bool,
    /// This server launched it (it holds its process, logs and checkpoints).
    pub launched: bool,
    /// Not launched here and not ended: "Mark as ended" is offered instead of Stop.
    pub markable: bool,
    pub relaunchable: bool,
    /// Ended and launched here with checkpoints: the Resume form is offered.
    pub resumable: bool,
    /// Why the run is in its status (the reason of the status change that put it there).
    pub status_reason: String,
    pub exit: Option<ExitView>,
    pub tags: Vec<String>,
    pub notes: String,
    /// Where a launched run executes: `local`, or `Slurm job 12 · partition gpu · RUNNING`.
    pub executor: Option<String>,
    /// "1.2M parameters (4.1k trainable)" from the run's `model/params` and
    /// `model/trainable_params`, when it reported them.
    pub parameters: Option<String>,
    /// The Hugging Face export's download, offered once the run has finished with a checkpoint
    /// whose model an export can write.
    pub export_href: Option<String>,
    /// Why a finished run with a checkpoint offers no download (shown beside a disabled one).
    pub export_unavailable: Option<String>,
}

pub struct ChartCard {
    pub title: String,
    pub keys_csv: String,
    pub latest: String,
    pub svg_href: String,
    /// The heading it is shown under (`layout::Section`).
    pub section: layout::Section,
}

impl ChartCard {
    /// The key whose latest value the card's header shows (live updates follow it).
    pub fn first_key(&self) -> &str {
        self.keys_csv.split(',').next().unwrap_or_default()
    }

    /// The card's id in the chart layout, which the page's script matches live keys against.
    pub fn group_id(&self) -> String {
        layout::group_id(self.first_key()).unwrap_or_default()
    }

    /// `step` or `seconds`: what the x axis counts.
    pub fn x_unit(&self) -> &'static str {
        layout::XUnit::of(self.first_key()).as_str()
    }
}

pub struct HeatmapCard {
    pub layer: u32,
    pub experts: u32,
    /// Each row's metric key, in expert order, for live points.
    pub keys_csv: String,
}

pub struct CheckpointRow {
    pub name: String,
    pub step: u64,
    pub time: String,
    pub size: String,
    pub val_loss: String,
    pub best: bool,
    pub archive_href: String,
    pub sample_href: String,
    /// The launch form of a fine-tune from this checkpoint (`&method=lora|dpo` follows).
    pub finetune_href: String,
}

/// How the run's process ended: one summary line, the log tail as lines, and whether it is a
/// failure (red) or a plain record (a clean exit, a stop).
pub struct ExitView {
    pub summary: String,
    pub tail: String,
    pub failed: bool,
}

/// The run page's checkpoints and history panels alone, for its live refresh.
#[derive(Template)]
#[template(path = "run_panels.html")]
pub struct RunPanels {
    pub run: PanelRun,
    pub checkpoints: Vec<CheckpointRow>,
    pub history: Vec<HistoryRow>,
    pub guard_events: Vec<super::guard::GuardEvent>,
}

pub struct PanelRun {
    pub id: String,
    pub status: &'static str,
    pub status_reason: String,
    pub resumable: bool,
    /// As in [`RunHeader`].
    pub parameters: Option<String>,
    pub export_href: Option<String>,
    pub export_unavailable: Option<String>,
}

impl RunPage {
    /// The chart headings, in order, with the cards under each (an empty one is rendered
    /// hidden, for cards that appear live).
    pub fn chart_sections(&self) -> Vec<(layout::Section, Vec<&ChartCard>)> {
        layout::Section::ALL
            .iter()
            .map(|&s| (s, self.charts.iter().filter(|c| c.section == s).collect()))
            .collect()
    }
}

#[derive(Template)]
#[template(path = "sample.html")]
pub struct SamplePage {
    pub nav: &'static str,
    pub run_id: String,
    pub checkpoint: String,
    pub prompt: String,
    pub max_new_tokens: String,
    pub temperature: String,
    /// Prompt and continuation, once generated.
    pub output: Option<String>,
    pub error: Option<String>,
}

/// One status change of the run, for its history.
pub struct HistoryRow {
    pub time: String,
    pub to: &'static str,
    pub reason: String,
}

#[derive(Template)]
#[template(path = "run.html")]
pub struct RunPage {
    pub nav: &'static str,
    pub run: RunHeader,
    /// The first page of the run's charts; the script loads the next ones on demand.
    pub charts: Vec<ChartCard>,
    /// The chart layout's `next_cursor` after them (empty: every chart is drawn).
    pub charts_next: String,
    /// The run's charts in all.
    pub charts_total: usize,
    pub heatmaps: Vec<HeatmapCard>,
    /// Values a run reports once (data counts, parameter counts): key, value, step.
    pub summary: Vec<(String, String, i64)>,
    pub checkpoints: Vec<CheckpointRow>,
    pub history: Vec<HistoryRow>,
    /// What the trainer's instability guard did, newest first.
    pub guard_events: Vec<super::guard::GuardEvent>,
    pub params: Vec<(String, String)>,
    pub config_yaml: Option<String>,
    /// Files logged to the run (MLflow's `log_artifact`): (path, its link, size).
    pub artifacts: Vec<(String, String, String)>,
    pub log_placeholder: String,
    /// Highest step already stored: the live stream starts after it (empty: from the start).
    pub after_step: String,
    /// Whether the caller may act on the run (stop, resume, relaunch, tags, notes): EDIT.
    pub can_edit: bool,
    /// Whether the caller may delete the run: MANAGE.
    pub can_manage: bool,
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
    /// One chart per chosen metric.
    pub charts: Vec<CompareChart>,
    /// Every metric of the runs, the chosen ones selected.
    pub keys: Vec<Choice>,
    /// Final and best of each chosen metric, per run.
    pub summary: Vec<SummaryRow>,
    /// Differing keys first.
    pub params: Vec<ParamRow>,
    pub differing: usize,
}

pub struct CompareChart {
    pub key: String,
    pub svg_href: String,
}

pub struct SummaryRow {
    pub id: String,
    pub name: String,
    /// (final "value @ step", best) per chosen metric.
    pub cells: Vec<(String, String)>,
}

pub struct LaunchForm {
    pub profile: String,
    pub experiment: String,
    pub name: String,
    pub gpus: u32,
    pub yaml: String,
    pub overrides: String,
    /// A fine-tune's base run and checkpoint ("Fine-tune from here"), empty otherwise.
    pub from: String,
    pub checkpoint: String,
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
    /// Names of the experiments the caller may launch into (a new name creates one).
    pub experiments: Vec<String>,
    pub form: LaunchForm,
    pub error: Option<String>,
    pub yaml_error_line: Option<usize>,
    pub annotated: Vec<AnnotatedLine>,
    /// The overrides box's lines with the refused one marked (empty: no override refused).
    pub overrides_annotated: Vec<AnnotatedLine>,
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

/// Heatmap cards, one per MoE layer with expert-utilisation keys (the rule is
/// `http::api::charts::layout`, which the page's script asks for keys that appear later).
pub fn heatmap_cards(keys: &[String]) -> Vec<HeatmapCard> {
    layout::heatmap_groups(keys)
        .into_iter()
        .map(|h| HeatmapCard {
            layer: h.layer,
            experts: h.experts,
            keys_csv: h.keys.join(","),
        })
        .collect()
}

/// The run page's charts as (title, keys): the one grouping rule of
/// `http::api::charts::layout`.
pub fn chart_groups(keys: &[String]) -> Vec<(String, Vec<String>)> {
    layout::chart_groups(keys)
        .into_iter()
        .map(|g| (g.title, g.keys))
        .collect()
}

// ---------------------------------------------------------------------------------------------
// Runs table columns

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
}
