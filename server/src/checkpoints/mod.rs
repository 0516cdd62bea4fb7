//! A launched run's checkpoints, as the trainer writes them: `<run dir>/checkpoints/step-N/`
//! directories (and `best/`), each with its `state.json`. Listed for the API and the run page,
//! resolved for a resume, archived for a download; the layout itself is the trainer's
//! (`trainer::checkpoint`).

pub mod archive;
pub mod exports;

use std::path::{Path, PathBuf};

use serde::Serialize;
use trainer::checkpoint::{self as layout, BEST_DIR};

use crate::validate::Invalid;

/// One checkpoint directory.
#[derive(Debug, Clone, PartialEq, Serialize, utoipa::ToSchema)]
pub struct Checkpoint {
    /// Its directory name (`step-000300`, or `best`): the `{name}` in its URLs.
    pub name: String,
    /// Optimizer steps completed when it was written.
    pub step: u64,
    /// When it was written (unix ms).
    pub time: i64,
    /// Bytes of its files together.
    pub size_bytes: u64,
    /// Validation loss at its step, when that step was evaluated.
    pub val_loss: Option<f64>,
    /// Whether it holds the run's best validation loss (the `best/` copy's step).
    pub best: bool,
}

/// Where a resume continues from.
#[derive(Debug, Clone, PartialEq)]
pub enum ResumePoint {
    Latest,
    Best,
    Step(u64),
}

impl ResumePoint {
    /// `latest`, `best`, or a step number.
    pub fn parse(field: &str, text: &str) -> Result<ResumePoint, Invalid> {
        match text.trim() {
            "" | "latest" => Ok(ResumePoint::Latest),
            "best" => Ok(ResumePoint::Best),
            step => step.parse().map(ResumePoint::Step).map_err(|_| {
                Invalid::new(
                    field,
                    format!("{field} must be `latest`, `best` or a step number, got `{step}`"),
                )
            }),
        }
    }
}

fn dir_size(dir: &Path) -> u64 {
    std::fs::read_dir(dir)
        .map(|entries| {
            entries
                .flatten()
                .filter_map(|e| e.metadata().ok())
                .filter(|m| m.is_file())
                .map(|m| m.len())
                .sum()
        })
        .unwrap_or(0)
}

fn modified_ms(dir: &Path) -> i64 {
    std::fs::metadata(dir.join(layout::STATE_FILE))
        .and_then(|m| m.modified())
        .ok()
        .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
        .map(|d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
        .unwrap_or(0)
}

fn describe(dir: &Path, name: String, best_step: Option<u64>) -> Option<Checkpoint> {
    let state = layout::read_state(dir).ok()?;
    Some(Checkpoint {
        best: best_step == Some(state.step),
        name,
        step: state.step,
        time: modified_ms(dir),
        size_bytes: dir_size(dir),
        val_loss: state.val_loss,
    })
}

/// The run's checkpoints, by step (a `best/` copy whose step has no step checkpoint left is
/// listed too, as `best`). Blocking: call it off the async threads.
pub fn list(run_dir: &Path) -> Vec<Checkpoint> {
    let root = layout::checkpoints_dir(run_dir);
    let best_dir = root.join(BEST_DIR);
    let best_step = layout::read_state(&best_dir).ok().map(|s| s.step);
    let mut out: Vec<Checkpoint> = layout::list_steps(&root)
        .unwrap_or_default()
        .into_iter()
        .filter_map(|(_, dir)| {
            let name = dir.file_name()?.to_str()?.to_string();
            describe(&dir, name, best_step)
        })
        .collect();
    if best_step.is_some_and(|b| !out.iter().any(|c| c.step == b)) {
        out.extend(describe(&best_dir, BEST_DIR.to_string(), best_step));
    }
    out.sort_by_key(|c| (c.step, c.name == BEST_DIR));
    out
}

/// The checkpoint called `name` and its directory; None for any name that is not one of
/// `list`'s (so a request's name never reaches the file system unchecked).
pub fn find(run_dir: &Path, name: &str) -> Option<(Checkpoint, PathBuf)> {
    let found = list(run_dir).into_iter().find(|c| c.name == name)?;
    let dir = layout::checkpoints_dir(run_dir).join(&found.name);
    Some((found, dir))
}

/// The checkpoint a resume from `point` starts at.
pub fn resolve(run_dir: &Path, point: &ResumePoint) -> Result<(Checkpoint, PathBuf), Invalid> {
    let all = list(run_dir);
    let chosen = match point {
        ResumePoint::Latest => all.iter().rfind(|c| c.name != BEST_DIR),
        ResumePoint::Best => all
            .iter()
            .find(|c| c.best && c.name != BEST_DIR)
            .or_else(|| all.iter().find(|c| c.name == BEST_DIR)),
        ResumePoint::Step(step) => all.iter().find(|c| c.step == *step),
    };
    let Some(chosen) = chosen else {
        let steps: Vec<String> = all.iter().map(|c| c.step.to_string()).collect();
        let message = match (point, steps.is_empty()) {
            (_, true) => "this run has no checkpoint to resume from".to_string(),
            (ResumePoint::Best, false) => {
                "this run has no best checkpoint (it has not been evaluated)".to_string()
            }
            (_, false) => format!(
                "this run has no checkpoint at that step; it has steps {}",
                steps.join(", ")
            ),
        };
        return Err(Invalid::new("from", message));
    };
    let dir = layout::checkpoints_dir(run_dir).join(&chosen.name);
    Ok((chosen.clone(), dir))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write_checkpoint(run_dir: &Path, name: &str, step: u64, val_loss: Option<f64>) {
        let dir = layout::checkpoints_dir(run_dir).join(name);
        std::fs::create_dir_all(&dir).unwrap();
        let state = serde_json::json!({
            "step": step, "tokens_seen": 0, "sampler": {"seed": 0, "batches": 0},
            "dropout_seed": 0, "best_val_loss": val_loss, "evals_without_improvement": 0,
            "early_stopped": false, "val_loss": val_loss,
        });
        std::fs::write(dir.join(layout::STATE_FILE), state.to_string()).unwrap();
        std::fs::write(dir.join(layout::MODEL_FILE), vec![0u8; 100]).unwrap();
    }

    #[test]
    fn checkpoints_are_listed_by_step_with_the_best_marked() {
        let tmp = tempfile::tempdir().unwrap();
        write_checkpoint(tmp.path(), "step-000010", 10, Some(3.0));
        write_checkpoint(tmp.path(), "step-000020", 20, Some(2.5));
        write_checkpoint(tmp.path(), "step-000030", 30, None);
        write_checkpoint(tmp.path(), "best", 20, Some(2.5));
        let all = list(tmp.path());
        let names: Vec<&str> = all.iter().map(|c| c.name.as_str()).collect();
        assert_eq!(names, ["step-000010", "step-000020", "step-000030"]);
        assert_eq!(all.iter().filter(|c| c.best).count(), 1);
        assert!(all[1].best && all[1].val_loss == Some(2.5));
        assert!(all[0].size_bytes >= 100);
        let (latest, _) = resolve(tmp.path(), &ResumePoint::Latest).unwrap();
        assert_eq!(latest.step, 30);
        let (best, dir) = resolve(tmp.path(), &ResumePoint::Best).unwrap();
        assert_eq!((best.step, dir.ends_with("step-000020")), (20, true));
        let missing = resolve(tmp.path(), &ResumePoint::Step(15)).unwrap_err();
        assert!(
            missing.message.contains("10, 20, 30"),
            "{}",
            missing.message
        );
        assert!(find(tmp.path(), "../step-000010").is_none());
    }

    #[test]
    fn a_best_copy_whose_step_was_pruned_is_listed_as_best() {
        let tmp = tempfile::tempdir().unwrap();
        write_checkpoint(tmp.path(), "step-000030", 30, None);
        write_checkpoint(tmp.path(), "best", 20, Some(2.5));
        let names: Vec<String> = list(tmp.path()).into_iter().map(|c| c.name).collect();
        assert_eq!(names, ["best", "step-000030"]);
        let (best, _) = resolve(tmp.path(), &ResumePoint::Best).unwrap();
        assert_eq!(best.name, "best");
    }

    #[test]
    fn resume_points_parse_from_words_and_numbers() {
        assert_eq!(
            ResumePoint::parse("from", "latest"),
            Ok(ResumePoint::Latest)
        );
        assert_eq!(ResumePoint::parse("from", ""), Ok(ResumePoint::Latest));
        assert_eq!(ResumePoint::parse("from", "best"), Ok(ResumePoint::Best));
        assert_eq!(
            ResumePoint::parse("from", "300"),
            Ok(ResumePoint::Step(300))
        );
        assert!(ResumePoint::parse("from", "newest").is_err_and(|e| e.field == "from"));
    }
}
