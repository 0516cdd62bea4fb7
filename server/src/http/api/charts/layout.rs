//! Which chart shows which metric key: the one grouping rule. The run page renders its chart
//! cards from it, and `GET /api/v1/runs/{id}/charts` sends it to the page's script, which
//! creates the cards of keys that appear while the page is open. So a live page and a reloaded
//! one group and order their charts identically.

use serde::Serialize;
use std::collections::BTreeMap;
use trainer::wire::{guard_keys, moe_keys, norm_keys};

/// What a chart's x axis counts in step mode.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum XUnit {
    /// Training steps.
    Step,
    /// Seconds since the run started: the launcher records `sys/...` samples at that step.
    Seconds,
}

impl XUnit {
    pub fn of(key: &str) -> XUnit {
        if key.starts_with("sys/") {
            XUnit::Seconds
        } else {
            XUnit::Step
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            XUnit::Step => "step",
            XUnit::Seconds => "seconds",
        }
    }

    /// The x axis' caption.
    pub fn caption(self) -> &'static str {
        match self {
            XUnit::Step => "step",
            XUnit::Seconds => "time since start (s)",
        }
    }
}

/// Keys one chart overlays at most (a per-layer norm card of a 100-layer model fits); a run
/// whose keys would put more in one chart has the first of them drawn.
pub const MAX_KEYS_PER_CHART: usize = 128;
/// Heatmaps (MoE layers) laid out at most, and experts per heatmap: expert keys past them are
/// not drawn (an expert index is any 32-bit number a client sends).
pub const MAX_HEATMAP_LAYERS: usize = 64;
pub const MAX_HEATMAP_EXPERTS: u32 = 256;
/// Charts in one page of the layout by default, and at most.
pub const DEFAULT_CHART_PAGE: usize = 24;
pub const MAX_CHART_PAGE: usize = 100;

/// The heading a chart is shown under on the run page, in page order: training first (loss,
/// learning rate, gradient norm, throughput, the rest), then evaluation, MoE and system.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum Section {
    Training,
    /// Charts of validation or evaluation keys only (`val/ppl`); `val/loss` shares the Loss
    /// chart with `train/loss`.
    Evaluation,
    /// MoE's own series (aux and z losses, drops); the heatmaps follow them.
    Moe,
    /// `sys/...`: memory, CPU, GPUs of the run's processes.
    System,
}

impl Section {
    pub const ALL: [Section; 4] = [
        Section::Training,
        Section::Evaluation,
        Section::Moe,
        Section::System,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Section::Training => "training",
            Section::Evaluation => "evaluation",
            Section::Moe => "moe",
            Section::System => "system",
        }
    }

    pub fn title(self) -> &'static str {
        match self {
            Section::Training => "Training",
            Section::Evaluation => "Evaluation",
            Section::Moe => "Mixture of experts",
            Section::System => "System",
        }
    }

    /// The section of a chart of `rank` (see `group_of`) showing `keys`.
    fn of(rank: u8, keys: &[String]) -> Section {
        let evaluation = |k: &String| {
            ["val/", "eval/", "test/"]
                .iter()
                .any(|prefix| k.starts_with(prefix))
        };
        match rank {
            7 => Section::Moe,
            9 => Section::System,
            _ if keys.iter().all(evaluation) => Section::Evaluation,
            _ => Section::Training,
        }
    }
}

/// One chart card: the keys it overlays, in colour order.
#[derive(Debug, Clone, PartialEq, Serialize, utoipa::ToSchema)]
pub struct ChartGroup {
    /// Stable across page loads: identifies the card for live additions.
    pub id: String,
    pub title: String,
    /// At most 128: the first of the chart's keys.
    pub keys: Vec<String>,
    /// How many keys the run has for this chart (more than `keys` when they were cut).
    pub total_keys: usize,
    pub x_unit: XUnit,
    /// The heading it is shown under (a chart of `val/` keys moves to Training if a `train/`
    /// key joins it).
    pub section: Section,
}

/// One expert-utilisation heatmap: a MoE layer's expert keys, in expert order.
#[derive(Debug, Clone, PartialEq, Serialize, utoipa::ToSchema)]
pub struct HeatmapGroup {
    pub layer: u32,
    pub experts: u32,
    pub keys: Vec<String>,
}

/// One page of a run's charts, in page order.
#[derive(Debug, Clone, PartialEq, Serialize, utoipa::ToSchema)]
pub struct ChartLayout {
    pub charts: Vec<ChartGroup>,
    /// The expert-utilisation heatmaps (on the first page only).
    pub heatmaps: Vec<HeatmapGroup>,
    /// Pass back as `cursor` for the next charts; null on the last page.
    pub next_cursor: Option<String>,
    /// The run's charts on all pages.
    pub total_charts: usize,
}

/// The chart a key belongs to, as (rank, group): keys sharing their last path segment share a
/// chart (`train/loss` with `val/loss`); loss first, then learning rate, gradient norm,
/// throughput, the rest, and system metrics last, one chart per key (their units differ).
/// Expert-utilisation keys belong to heatmaps and the guard's rollback targets to its event list
/// (`None`). Per-layer norms share one card per family, the gradients' beside the global norm.
fn group_of(key: &str) -> Option<(u8, String)> {
    if moe_keys::parse_expert(key).is_some()
        || key == guard_keys::ROLLBACK_TO
        || is_summary_key(key)
    {
        return None;
    }
    if key.starts_with(norm_keys::GRAD_PREFIX) {
        return Some((2, "grad_norm_by_layer".to_string()));
    }
    if key.starts_with(norm_keys::PARAM_PREFIX) {
        return Some((5, "param_norm_by_layer".to_string()));
    }
    // DPO's metrics, train and validation together: its loss beside the loss chart, the reward
    // accuracy, and the chosen and rejected rewards with their margin (one scale).
    if let Some(rest) = key
        .strip_prefix("dpo/")
        .or_else(|| key.strip_prefix("val/dpo/"))
    {
        return Some(match rest {
            "loss" => (0, "dpo_loss".to_string()),
            "reward_accuracy" => (4, "reward_accuracy".to_string()),
            _ => (4, "rewards".to_string()),
        });
    }
    let leaf = key.rsplit('/').next().unwrap_or(key).to_string();
    let rank = if key.starts_with("sys/") {
        9
    } else if key.starts_with("moe/") {
        // MoE's own series (aux and z losses, drops) after the training charts.
        7
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
    Some(if rank == 9 {
        (rank, key.to_string())
    } else {
        (rank, leaf)
    })
}

/// Keys a run reports once (its data pipeline's counts, its parameter counts): the run page
/// lists them in a summary table, not as charts of one point.
pub fn is_summary_key(key: &str) -> bool {
    key.starts_with("data/") || key.starts_with("model/")
}

/// DPO's loss is also the run's `train/loss` (and `val/dpo/loss` its `val/loss`): the Loss
/// chart shows it, so a DPO loss chart beside it would be the same curve twice.
fn duplicates_loss(key: &str, keys: &[String]) -> bool {
    let twin = match key {
        "dpo/loss" => "train/loss",
        "val/dpo/loss" => "val/loss",
        _ => return false,
    };
    keys.iter().any(|k| k == twin)
}

/// The card id of the chart showing `key` (`None` for heatmap keys).
pub fn group_id(key: &str) -> Option<String> {
    group_of(key).map(|(rank, group)| format!("{rank}:{group}"))
}

/// Groups metric keys into charts (see `group_of`). Within a chart, training series come
/// before the others, so colours are stable across runs.
pub fn chart_groups(keys: &[String]) -> Vec<ChartGroup> {
    // Within a rank, the chart named after the rank comes first (`loss` before `aux_loss`).
    let mut groups: BTreeMap<(u8, bool, String), Vec<String>> = BTreeMap::new();
    for k in keys {
        if duplicates_loss(k, keys) {
            continue;
        }
        if let Some((rank, group)) = group_of(k) {
            let named_otherwise = !matches!(group.as_str(), "loss" | "lr");
            groups
                .entry((rank, named_otherwise, group))
                .or_default()
                .push(k.clone());
        }
    }
    groups
        .into_iter()
        .map(|((rank, _, group), mut ks)| {
            ks.sort_by_key(|k| (!k.starts_with("train"), k.clone()));
            ks.dedup();
            let total_keys = ks.len();
            ks.truncate(MAX_KEYS_PER_CHART);
            ChartGroup {
                id: format!("{rank}:{group}"),
                title: chart_title(&group),
                x_unit: XUnit::of(&ks[0]),
                section: Section::of(rank, &ks),
                keys: ks,
                total_keys,
            }
        })
        .collect()
}

/// Where the chart `id` (`rank:group`) comes in page order.
fn order_of(id: &str) -> Option<(u8, bool, &str)> {
    let (rank, group) = id.split_once(':')?;
    let named_otherwise = !matches!(group, "loss" | "lr");
    Some((rank.parse().ok()?, named_otherwise, group))
}

/// The charts after `cursor` (a chart id, as `next_cursor` gives it; `None`: from the first),
/// at most `limit` of them, with the heatmaps on the first page. A chart added before the
/// cursor while a client pages is on the first page, which the run page reads again.
pub fn page(keys: &[String], cursor: Option<&str>, limit: usize) -> Result<ChartLayout, String> {
    let after = match cursor {
        None => None,
        Some(c) => Some(order_of(c).ok_or_else(|| {
            format!(
                "cursor `{}` is not a chart id from next_cursor",
                c.escape_debug()
            )
        })?),
    };
    let all = chart_groups(keys);
    let total_charts = all.len();
    let mut rest: Vec<ChartGroup> = all
        .into_iter()
        .filter(|g| match (&after, order_of(&g.id)) {
            (Some(after), Some(order)) => order > *after,
            _ => true,
        })
        .collect();
    let more = rest.len() > limit;
    rest.truncate(limit);
    Ok(ChartLayout {
        next_cursor: more.then(|| rest.last().map(|g| g.id.clone())).flatten(),
        heatmaps: match cursor {
            None => heatmap_groups(keys),
            Some(_) => Vec::new(),
        },
        charts: rest,
        total_charts,
    })
}

/// The first page of the charts of `keys` (what the run page draws).
pub fn first_page(keys: &[String], limit: usize) -> ChartLayout {
    page(keys, None, limit).unwrap_or_else(|_| ChartLayout {
        charts: Vec::new(),
        heatmaps: Vec::new(),
        next_cursor: None,
        total_charts: 0,
    })
}

fn chart_title(group: &str) -> String {
    match group {
        "loss" => "Loss".into(),
        "lr" => "Learning rate".into(),
        "grad_norm" => "Gradient norm".into(),
        "grad_norm_by_layer" => "Gradient norm by layer".into(),
        "param_norm_by_layer" => "Parameter norm by layer".into(),
        "skipped_steps" => "Updates skipped by the instability guard".into(),
        "lr_scale" => "Learning-rate factor after rollbacks".into(),
        "dpo_loss" => "DPO loss".into(),
        "reward_accuracy" => "DPO reward accuracy".into(),
        "rewards" => "DPO rewards (chosen, rejected, margin)".into(),
        "tokens_per_sec" | "tokens_per_s" | "tokens/s" => "Tokens / s".into(),
        other => other.to_string(),
    }
}

/// One heatmap per MoE layer with expert-utilisation keys, its rows experts 0 to the highest
/// index seen.
pub fn heatmap_groups(keys: &[String]) -> Vec<HeatmapGroup> {
    let mut layers: BTreeMap<u32, u32> = BTreeMap::new();
    for k in keys {
        if let Some((l, e)) = moe_keys::parse_expert(k).filter(|(_, e)| *e < MAX_HEATMAP_EXPERTS) {
            let n = layers.entry(l).or_insert(0);
            *n = (*n).max(e.saturating_add(1));
        }
    }
    layers
        .into_iter()
        .take(MAX_HEATMAP_LAYERS)
        .map(|(layer, experts)| HeatmapGroup {
            layer,
            experts,
            keys: (0..experts as usize)
                .map(|e| moe_keys::expert(layer as usize, e))
                .collect(),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn keys(list: &[&str]) -> Vec<String> {
        list.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn metric_keys_group_into_charts_and_heatmaps() {
        let k = keys(&[
            "val/loss",
            "train/loss",
            "train/lr",
            "sys/cpu",
            "moe/layer1/expert3",
            "moe/layer1/expert0",
        ]);
        let groups = chart_groups(&k);
        assert_eq!(groups[0].title, "Loss");
        assert_eq!(groups[0].keys, keys(&["train/loss", "val/loss"]));
        assert_eq!(groups[0].x_unit, XUnit::Step);
        assert_eq!(groups[1].title, "Learning rate");
        let last = groups.last().cloned();
        assert_eq!(
            last.as_ref().map(|g| g.keys.clone()),
            Some(keys(&["sys/cpu"]))
        );
        assert_eq!(last.map(|g| g.x_unit), Some(XUnit::Seconds));
        let heat = heatmap_groups(&k);
        assert_eq!((heat.len(), heat[0].layer, heat[0].experts), (1, 1, 4));
        assert_eq!(heat[0].keys[3], "moe/layer1/expert3");
        assert_eq!(moe_keys::parse_expert("moe/layer2/expertx"), None);
    }

    #[test]
    fn once_reported_counts_get_no_chart_and_dpo_loss_is_not_drawn_twice() {
        let groups = chart_groups(&keys(&[
            "train/loss",
            "val/loss",
            "dpo/loss",
            "val/dpo/loss",
            "dpo/reward_accuracy",
            "data/documents",
            "data/filter/exact_duplicates",
            "model/params",
            "moe/aux_loss",
            "train/lr",
        ]));
        let titles: Vec<&str> = groups.iter().map(|g| g.title.as_str()).collect();
        assert_eq!(
            titles,
            ["Loss", "Learning rate", "DPO reward accuracy", "aux_loss"],
            "no DPO loss twin, no one-point count charts, MoE after training"
        );
        assert!(is_summary_key("model/params") && !is_summary_key("train/loss"));
        // Without train/loss, DPO's loss is drawn.
        let only = chart_groups(&keys(&["dpo/loss"]));
        assert_eq!(only[0].title, "DPO loss");
    }

    #[test]
    fn a_key_that_appears_later_joins_the_chart_a_reload_would_put_it_in() {
        let before = chart_groups(&keys(&["train/loss", "train/lr"]));
        let after = chart_groups(&keys(&[
            "train/loss",
            "train/lr",
            "val/loss",
            "moe/aux_loss",
        ]));
        let loss = after.iter().find(|g| g.title == "Loss").cloned();
        let loss = loss.unwrap_or_else(|| panic!("no loss chart in {after:?}"));
        assert_eq!(before[0].id, loss.id, "the loss card keeps its id");
        assert_eq!(loss.keys, keys(&["train/loss", "val/loss"]));
        assert_eq!(group_id("val/loss"), Some(loss.id));
        assert_eq!(group_id("moe/layer0/expert1"), None);
        assert_eq!(after[0].title, "Loss", "the main loss chart comes first");
        assert!(after.iter().any(|g| g.keys == keys(&["moe/aux_loss"])));
    }

    #[test]
    fn charts_fall_under_training_evaluation_moe_and_system_headings() {
        let groups = chart_groups(&keys(&[
            "train/loss",
            "val/loss",
            "val/ppl",
            "train/lr",
            "moe/aux_loss",
            "sys/rss_mb",
        ]));
        let sections: Vec<(&str, Section)> = groups
            .iter()
            .map(|g| (g.title.as_str(), g.section))
            .collect();
        assert_eq!(
            sections,
            [
                ("Loss", Section::Training),
                ("Learning rate", Section::Training),
                ("ppl", Section::Evaluation),
                ("aux_loss", Section::Moe),
                ("sys/rss_mb", Section::System),
            ]
        );
    }

    #[test]
    fn per_layer_norms_share_one_card_per_family_after_the_global_gradient_norm() {
        let groups = chart_groups(&keys(&[
            "train/loss",
            "grad_norm",
            "grad_norm/layer1",
            "grad_norm/layer0",
            "grad_norm/wte",
            "param_norm/layer0",
            "param_norm/wte",
            "guard/skipped_steps",
            "guard/rollback_to",
        ]));
        let titles: Vec<&str> = groups.iter().map(|g| g.title.as_str()).collect();
        assert_eq!(
            titles,
            [
                "Loss",
                "Gradient norm",
                "Gradient norm by layer",
                "Parameter norm by layer",
                "Updates skipped by the instability guard",
            ]
        );
        assert_eq!(
            groups[2].keys,
            keys(&["grad_norm/layer0", "grad_norm/layer1", "grad_norm/wte"])
        );
        assert_eq!(
            groups[3].keys,
            keys(&["param_norm/layer0", "param_norm/wte"])
        );
        assert_eq!(group_id("grad_norm/layer7"), Some(groups[2].id.clone()));
        assert_eq!(group_id("guard/rollback_to"), None, "listed as an event");
    }

    #[test]
    fn the_layout_pages_by_chart_and_bounds_keys_per_chart_and_heatmap() {
        // 300 charts of their own, one chart of 1000 keys sharing a leaf, absurd expert keys.
        let mut k: Vec<String> = (0..300).map(|i| format!("custom/metric{i:03}")).collect();
        k.extend((0..1000).map(|i| format!("head{i}/loss")));
        k.push("moe/layer0/expert4000000000".into());
        k.push("moe/layer0/expert1".into());
        k.extend((0..100).map(|l| format!("moe/layer{}/expert0", l + 1)));
        let first = page(&k, None, 10).unwrap();
        assert_eq!(first.total_charts, 301);
        assert_eq!(first.charts.len(), 10);
        assert_eq!(first.charts[0].keys.len(), MAX_KEYS_PER_CHART);
        assert_eq!(first.charts[0].total_keys, 1000);
        assert_eq!(first.heatmaps.len(), MAX_HEATMAP_LAYERS);
        assert_eq!(
            first.heatmaps[0].experts, 2,
            "expert 4000000000 is not drawn"
        );
        // Paging through gives every chart once, in order.
        let mut seen: Vec<String> = first.charts.iter().map(|g| g.id.clone()).collect();
        let mut cursor = first.next_cursor;
        while let Some(c) = cursor {
            let next = page(&k, Some(&c), 100).unwrap();
            assert!(next.heatmaps.is_empty() && next.charts.len() <= 100);
            seen.extend(next.charts.iter().map(|g| g.id.clone()));
            cursor = next.next_cursor;
        }
        let all: Vec<String> = chart_groups(&k).into_iter().map(|g| g.id).collect();
        assert_eq!(seen, all);
        assert!(page(&k, Some("nonsense"), 10).is_err());
    }

    #[test]
    fn dpo_metrics_get_their_own_charts_with_train_and_validation_together() {
        let groups = chart_groups(&keys(&[
            "train/loss",
            "val/loss",
            "dpo/loss",
            "val/dpo/loss",
            "dpo/reward_accuracy",
            "val/dpo/reward_accuracy",
            "dpo/chosen_reward",
            "dpo/rejected_reward",
            "dpo/margin",
            "val/dpo/margin",
        ]));
        let titles: Vec<&str> = groups.iter().map(|g| g.title.as_str()).collect();
        // DPO's loss is the run's train/loss (and val/loss): the Loss chart shows it once.
        assert_eq!(
            titles,
            [
                "Loss",
                "DPO reward accuracy",
                "DPO rewards (chosen, rejected, margin)"
            ]
        );
        assert_eq!(groups[0].keys, keys(&["train/loss", "val/loss"]));
        assert_eq!(
            groups[1].keys,
            keys(&["dpo/reward_accuracy", "val/dpo/reward_accuracy"])
        );
        assert_eq!(groups[2].keys.len(), 4);
        assert_eq!(group_id("val/dpo/margin"), group_id("dpo/chosen_reward"));
    }
}
