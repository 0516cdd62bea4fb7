//! Checkpoints: `DIR/checkpoints/step-000123/` holding `model.safetensors`,
//! `optimizer.safetensors`, `state.json`, `config.yaml`, `tokenizer.json`, and
//! `DIR/checkpoints/best/` holding the same without the optimizer state (for sampling and
//! `init_from`; the moments would double its size, and resuming from it starts them afresh).
//!
//! A LoRA run's checkpoints hold only the adapters in `model.safetensors`, and `base.json`
//! naming the base weights they go with (`training.init_from` as an absolute path, or `null`
//! for the seeded initialization of the checkpoint's config).
//!
//! A checkpoint is written into a hidden temporary directory, every file and the directory are
//! fsynced, and only then is it renamed into place: a reader (or a resume after a crash) sees a
//! whole checkpoint or none. Names starting with `.` are never treated as checkpoints.

use std::collections::HashMap;
use std::fs::{self, File};
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use candle_core::{Device, Tensor};
use candle_nn::VarMap;
use serde::{Deserialize, Serialize};

use crate::config::Config;
use crate::data::SamplerState;
use crate::optim::Optimizer;
use crate::train::guard::GuardState;

pub const MODEL_FILE: &str = "model.safetensors";
pub const OPTIMIZER_FILE: &str = "optimizer.safetensors";
pub const STATE_FILE: &str = "state.json";
pub const CONFIG_FILE: &str = "config.yaml";
pub const TOKENIZER_FILE: &str = "tokenizer.json";
pub const BEST_DIR: &str = "best";
/// In a LoRA checkpoint: which base weights the adapters go with.
pub const BASE_FILE: &str = "base.json";

/// The base weights of a LoRA checkpoint.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BaseRef {
    /// A checkpoint directory or `hf:PATH` (absolute), or `None`: the seeded initialization of
    /// the checkpoint's config.
    pub init_from: Option<String>,
}

/// Everything besides tensors that a resumed run needs to continue exactly.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TrainState {
    /// Optimizer steps completed.
    pub step: u64,
    /// Training tokens consumed so far.
    pub tokens_seen: u64,
    /// Position of the training batch sampler.
    pub sampler: SamplerState,
    /// Seed of the dropout masks; the mask stream of step `s` is derived from (seed, s), so the
    /// step fully determines the dropout RNG's position.
    pub dropout_seed: u64,
    /// Lowest validation loss seen so far.
    pub best_val_loss: Option<f64>,
    /// Evaluations since the best one (early-stopping patience counter).
    pub evals_without_improvement: usize,
    /// True once early stopping has ended the run.
    pub early_stopped: bool,
    /// Validation loss at this step, when it was just evaluated.
    pub val_loss: Option<f64>,
    /// The instability guard's running mean, counters and learning-rate factor (absent in
    /// checkpoints from before the guard: a fresh guard).
    #[serde(default)]
    pub guard: GuardState,
}

impl TrainState {
    /// Records an evaluation: updates the best loss and the patience counter, and marks the run
    /// early-stopped after `patience` evaluations without improvement (0 = never). Returns
    /// whether `val_loss` is a new best.
    pub fn record_eval(&mut self, val_loss: f64, patience: usize) -> bool {
        self.val_loss = Some(val_loss);
        let improved = self.best_val_loss.is_none_or(|best| val_loss < best);
        if improved {
            self.best_val_loss = Some(val_loss);
            self.evals_without_improvement = 0;
        } else {
            self.evals_without_improvement += 1;
            if patience > 0 && self.evals_without_improvement >= patience {
                self.early_stopped = true;
            }
        }
        improved
    }
}

/// What goes into one checkpoint directory.
pub struct Snapshot<'a> {
    pub varmap: &'a VarMap,
    pub optimizer: &'a dyn Optimizer,
    pub state: &'a TrainState,
    pub config: &'a Config,
    pub tokenizer_json: &'a str,
    /// For a LoRA run: only adapters are saved, with this reference to their base.
    pub base: Option<&'a BaseRef>,
}

/// `DIR/checkpoints`.
pub fn checkpoints_dir(run_dir: &Path) -> PathBuf {
    run_dir.join("checkpoints")
}

/// `step-000123`.
pub fn step_dir_name(step: u64) -> String {
    format!("step-{step:06}")
}

/// Saves `DIR/checkpoints/step-NNNNNN/`, then removes the oldest step checkpoints beyond `limit`
/// (0 = keep all). Returns the new checkpoint's path.
pub fn save_step(run_dir: &Path, snap: &Snapshot<'_>, limit: usize) -> Result<PathBuf> {
    let root = checkpoints_dir(run_dir);
    let path = write_atomically(&root, &step_dir_name(snap.state.step), |dir| {
        write_snapshot(dir, snap, true)
    })?;
    if limit > 0 {
        let steps = list_steps(&root)?;
        let excess = steps.len().saturating_sub(limit);
        for (_, old) in steps.into_iter().take(excess) {
            fs::remove_dir_all(&old).with_context(|| format!("removing {}", old.display()))?;
        }
    }
    Ok(path)
}

/// Replaces `DIR/checkpoints/best/`: weights, state, config and tokenizer; no optimizer state.
pub fn save_best(run_dir: &Path, snap: &Snapshot<'_>) -> Result<PathBuf> {
    write_atomically(&checkpoints_dir(run_dir), BEST_DIR, |dir| {
        write_snapshot(dir, snap, false)
    })
}

fn write_snapshot(dir: &Path, snap: &Snapshot<'_>, optimizer: bool) -> Result<()> {
    let mut tensors = varmap_tensors(snap.varmap)?;
    if let Some(base) = snap.base {
        tensors.retain(|name, _| crate::model::lora::is_adapter(name));
        fs::write(dir.join(BASE_FILE), serde_json::to_vec_pretty(base)?)?;
    }
    candle_core::safetensors::save(&tensors, dir.join(MODEL_FILE))?;
    if optimizer {
        candle_core::safetensors::save(&snap.optimizer.state()?, dir.join(OPTIMIZER_FILE))?;
    }
    fs::write(dir.join(STATE_FILE), serde_json::to_vec_pretty(snap.state)?)?;
    fs::write(dir.join(CONFIG_FILE), snap.config.to_yaml()?)?;
    fs::write(dir.join(TOKENIZER_FILE), snap.tokenizer_json)?;
    Ok(())
}

/// Every variable of `varmap` by name.
pub fn varmap_tensors(varmap: &VarMap) -> Result<HashMap<String, Tensor>> {
    let data = varmap
        .data()
        .lock()
        .map_err(|_| anyhow::anyhow!("model variables are poisoned by a panicked thread"))?;
    Ok(data
        .iter()
        .map(|(k, v)| (k.clone(), v.as_tensor().clone()))
        .collect())
}

/// Builds `root/name` by filling a hidden temporary directory with `fill`, fsyncing it and
/// renaming it into place (replacing an existing `root/name`).
pub fn write_atomically(
    root: &Path,
    name: &str,
    fill: impl FnOnce(&Path) -> Result<()>,
) -> Result<PathBuf> {
    fs::create_dir_all(root).with_context(|| format!("creating {}", root.display()))?;
    let pid = std::process::id();
    let tmp = root.join(format!(".tmp-{name}-{pid}"));
    if tmp.exists() {
        fs::remove_dir_all(&tmp)?;
    }
    fs::create_dir(&tmp).with_context(|| format!("creating {}", tmp.display()))?;
    let filled = fill(&tmp).and_then(|()| sync_dir_tree(&tmp));
    if let Err(e) = filled {
        let _ = fs::remove_dir_all(&tmp);
        return Err(e.context(format!("writing checkpoint {name}")));
    }
    let dest = root.join(name);
    if dest.exists() {
        // rename(2) cannot replace a non-empty directory: move the old one aside first.
        let old = root.join(format!(".old-{name}-{pid}"));
        if old.exists() {
            fs::remove_dir_all(&old)?;
        }
        fs::rename(&dest, &old)?;
        fs::rename(&tmp, &dest)?;
        fs::remove_dir_all(&old)?;
    } else {
        fs::rename(&tmp, &dest)
            .with_context(|| format!("renaming {} to {}", tmp.display(), dest.display()))?;
    }
    sync_dir(root)?;
    Ok(dest)
}

fn sync_dir_tree(dir: &Path) -> Result<()> {
    for entry in fs::read_dir(dir)? {
        let path = entry?.path();
        if path.is_file() {
            File::open(&path)?.sync_all()?;
        }
    }
    sync_dir(dir)
}

fn sync_dir(dir: &Path) -> Result<()> {
    // Directories can be fsynced on Unix; elsewhere the rename is the best we can do.
    #[cfg(unix)]
    File::open(dir)?.sync_all()?;
    #[cfg(not(unix))]
    let _ = dir;
    Ok(())
}

/// Step checkpoints under `root`, oldest first.
pub fn list_steps(root: &Path) -> Result<Vec<(u64, PathBuf)>> {
    let mut out = Vec::new();
    let Ok(entries) = fs::read_dir(root) else {
        return Ok(out);
    };
    for entry in entries {
        let path = entry?.path();
        let step = path
            .file_name()
            .and_then(|n| n.to_str())
            .and_then(|n| n.strip_prefix("step-"))
            .and_then(|n| n.parse::<u64>().ok());
        if let Some(step) = step {
            if path.join(STATE_FILE).is_file() {
                out.push((step, path));
            }
        }
    }
    out.sort();
    Ok(out)
}

/// `--resume latest` (the newest step checkpoint of `run_dir`) or a checkpoint path.
pub fn resolve(run_dir: &Path, spec: &str) -> Result<PathBuf> {
    if spec == "latest" {
        let root = checkpoints_dir(run_dir);
        return match list_steps(&root)?.pop() {
            Some((_, path)) => Ok(path),
            None => bail!(
                "--resume latest: no checkpoint in {} (is --out the run directory?)",
                root.display()
            ),
        };
    }
    let path = PathBuf::from(spec);
    if !path.join(STATE_FILE).is_file() {
        bail!("--resume {spec}: not a checkpoint directory (no {STATE_FILE})");
    }
    Ok(path)
}

/// The checkpoint a path means for reading (sampling, export): a checkpoint directory, or a
/// run directory's `best` checkpoint, else its latest.
pub fn resolve_for_reading(path: &Path) -> Result<PathBuf> {
    let best = checkpoints_dir(path).join(BEST_DIR);
    if path.join(STATE_FILE).is_file() {
        Ok(path.to_path_buf())
    } else if best.join(STATE_FILE).is_file() {
        Ok(best)
    } else {
        resolve(path, "latest").with_context(|| format!("{}: no checkpoint found", path.display()))
    }
}

/// Reads `state.json`.
pub fn read_state(dir: &Path) -> Result<TrainState> {
    let path = dir.join(STATE_FILE);
    let bytes = fs::read(&path).with_context(|| format!("reading {}", path.display()))?;
    serde_json::from_slice(&bytes).with_context(|| format!("parsing {}", path.display()))
}

/// Reads the resolved `config.yaml` saved with a checkpoint.
pub fn read_config(dir: &Path) -> Result<Config> {
    let path = dir.join(CONFIG_FILE);
    Config::from_yaml_file(&path).with_context(|| format!("reading {}", path.display()))
}

/// Copies the checkpoint's weights into `varmap`, which must hold exactly the same names and
/// shapes.
pub fn load_weights(dir: &Path, varmap: &VarMap, device: &Device) -> Result<()> {
    load_weights_where(dir, varmap, device, |_| true)
}

/// Reads `base.json`: `Some` for a LoRA checkpoint.
pub fn read_base(dir: &Path) -> Result<Option<BaseRef>> {
    let path = dir.join(BASE_FILE);
    if !path.is_file() {
        return Ok(None);
    }
    let bytes = fs::read(&path).with_context(|| format!("reading {}", path.display()))?;
    Ok(Some(
        serde_json::from_slice(&bytes).with_context(|| format!("parsing {}", path.display()))?,
    ))
}

/// The weights of a checkpoint, into `varmap` built for `cfg` (its config): all of them, or
/// for a LoRA checkpoint the base it names and then its adapters.
pub fn load_model(dir: &Path, cfg: &Config, varmap: &VarMap, device: &Device) -> Result<()> {
    match read_base(dir)? {
        Some(base) => {
            load_base(base.init_from.as_deref(), cfg, varmap, device)?;
            load_weights_where(dir, varmap, device, crate::model::lora::is_adapter)
        }
        None => load_weights(dir, varmap, device),
    }
}

/// Sets the base (non-adapter) weights of `varmap`, a model built for `cfg`, from `init_from`:
/// a checkpoint directory, `hf:PATH`, or `None` for the seeded initialization.
pub fn load_base(
    init_from: Option<&str>,
    cfg: &Config,
    varmap: &VarMap,
    device: &Device,
) -> Result<()> {
    let base = |n: &str| !crate::model::lora::is_adapter(n);
    match init_from {
        None => Ok(crate::model::init_weights(
            varmap,
            &cfg.model,
            cfg.training.seed,
        )?),
        Some(spec) => match crate::hf::import::hf_path(spec) {
            Some(dir) => crate::hf::import::load_weights(&dir, &cfg.model, varmap, device),
            None => {
                let dir = resolve(Path::new("."), spec)?;
                if read_base(&dir)?.is_some() {
                    bail!(
                        "{}: a LoRA checkpoint holds only adapters; export it with \
                         `trainyard export --format hf --merge` and start from hf:DIR",
                        dir.display()
                    );
                }
                load_weights_where(&dir, varmap, device, base)
            }
        },
    }
}

/// Copies the checkpoint's tensors for the variables `wanted` picks into `varmap`.
fn load_weights_where(
    dir: &Path,
    varmap: &VarMap,
    device: &Device,
    wanted: impl Fn(&str) -> bool,
) -> Result<()> {
    let path = dir.join(MODEL_FILE);
    let tensors = candle_core::safetensors::load(&path, device)
        .with_context(|| format!("reading {}", path.display()))?;
    let data = varmap
        .data()
        .lock()
        .map_err(|_| anyhow::anyhow!("model variables are poisoned by a panicked thread"))?;
    for (name, var) in data.iter().filter(|(n, _)| wanted(n.as_str())) {
        let t = tensors
            .get(name)
            .with_context(|| format!("{}: no tensor `{name}`", path.display()))?;
        if t.dims() != var.dims() {
            bail!(
                "{}: `{name}` has shape {:?}, the model expects {:?} (different model config?)",
                path.display(),
                t.dims(),
                var.dims()
            );
        }
        var.set(&t.to_dtype(var.dtype())?)?;
    }
    Ok(())
}

/// Whether the checkpoint holds optimizer state (the `best` checkpoint holds weights only).
pub fn has_optimizer(dir: &Path) -> bool {
    dir.join(OPTIMIZER_FILE).is_file()
}

/// Restores the optimizer's state from a checkpoint.
pub fn load_optimizer(dir: &Path, optimizer: &mut dyn Optimizer, device: &Device) -> Result<()> {
    let path = dir.join(OPTIMIZER_FILE);
    let state = candle_core::safetensors::load(&path, &Device::Cpu)
        .with_context(|| format!("reading {}", path.display()))?;
    optimizer
        .load_state(&state, device)
        .with_context(|| format!("restoring optimizer from {}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::optim::{params_from_varmap, AdamW};
    use candle_core::DType;

    fn snapshot_parts() -> (VarMap, AdamW, Config) {
        let varmap = VarMap::new();
        varmap
            .get(
                (2, 3),
                "w",
                candle_nn::Init::Const(0.5),
                DType::F32,
                &Device::Cpu,
            )
            .unwrap();
        let opt = AdamW::new(
            params_from_varmap(&varmap, |_| true),
            crate::optim::adamw::AdamWParams {
                beta1: 0.9,
                beta2: 0.95,
                eps: 1e-8,
                weight_decay: 0.1,
            },
        )
        .unwrap();
        (varmap, opt, Config::default())
    }

    fn state(step: u64) -> TrainState {
        TrainState {
            step,
            tokens_seen: step * 100,
            sampler: SamplerState {
                seed: 1,
                batches: step,
            },
            dropout_seed: 7,
            best_val_loss: Some(1.5),
            evals_without_improvement: 0,
            early_stopped: false,
            val_loss: None,
            guard: GuardState::default(),
        }
    }

    fn save(run: &Path, step: u64, limit: usize) -> PathBuf {
        let (varmap, opt, config) = snapshot_parts();
        let st = state(step);
        let snap = Snapshot {
            varmap: &varmap,
            optimizer: &opt,
            state: &st,
            config: &config,
            tokenizer_json: "{}",
            base: None,
        };
        save_step(run, &snap, limit).unwrap()
    }

    #[test]
    fn early_stopping_triggers_after_patience_evaluations_without_improvement() {
        let mut st = state(0);
        st.best_val_loss = None;
        assert!(st.record_eval(2.0, 2));
        assert!(st.record_eval(1.5, 2));
        assert!(!st.record_eval(1.6, 2));
        assert!(!st.early_stopped, "one bad evaluation is within patience");
        assert!(st.record_eval(1.4, 2), "an improvement resets the counter");
        assert!(!st.record_eval(1.4, 2));
        assert!(!st.record_eval(1.9, 2));
        assert!(st.early_stopped);
        assert_eq!(st.best_val_loss, Some(1.4));
    }

    #[test]
    fn zero_patience_never_stops() {
        let mut st = state(0);
        for _ in 0..10 {
            st.record_eval(9.0, 0);
        }
        assert!(!st.early_stopped);
    }

    #[test]
    fn save_total_limit_keeps_only_the_newest_checkpoints() {
        let run = tempfile::tempdir().unwrap();
        for step in [10, 20, 30, 40, 50] {
            save(run.path(), step, 2);
        }
        let steps: Vec<u64> = list_steps(&checkpoints_dir(run.path()))
            .unwrap()
            .into_iter()
            .map(|(s, _)| s)
            .collect();
        assert_eq!(steps, vec![40, 50]);
        let latest = resolve(run.path(), "latest").unwrap();
        assert!(latest.ends_with("step-000050"));
        assert_eq!(read_state(&latest).unwrap(), state(50));
    }

    #[test]
    fn a_checkpoint_holds_every_file_and_round_trips_weights() {
        let run = tempfile::tempdir().unwrap();
        let dir = save(run.path(), 3, 0);
        for f in [
            MODEL_FILE,
            OPTIMIZER_FILE,
            STATE_FILE,
            CONFIG_FILE,
            TOKENIZER_FILE,
        ] {
            assert!(dir.join(f).is_file(), "{f} missing");
        }
        assert_eq!(read_config(&dir).unwrap(), Config::default());
        let (varmap, mut opt, _) = snapshot_parts();
        varmap.data().lock().unwrap()["w"]
            .set(&Tensor::zeros((2, 3), DType::F32, &Device::Cpu).unwrap())
            .unwrap();
        load_weights(&dir, &varmap, &Device::Cpu).unwrap();
        let w = varmap.data().lock().unwrap()["w"]
            .as_tensor()
            .flatten_all()
            .unwrap()
            .to_vec1::<f32>()
            .unwrap();
        assert_eq!(w, vec![0.5; 6]);
        load_optimizer(&dir, &mut opt, &Device::Cpu).unwrap();
    }

    #[test]
    fn the_best_checkpoint_keeps_weights_and_metadata_but_no_optimizer_state() {
        let run = tempfile::tempdir().unwrap();
        let (varmap, opt, config) = snapshot_parts();
        let st = state(7);
        let snap = Snapshot {
            varmap: &varmap,
            optimizer: &opt,
            state: &st,
            config: &config,
            tokenizer_json: "{}",
            base: None,
        };
        let best = save_best(run.path(), &snap).unwrap();
        let mut names: Vec<String> = fs::read_dir(&best)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        assert_eq!(names, [CONFIG_FILE, MODEL_FILE, STATE_FILE, TOKENIZER_FILE]);
        assert!(!has_optimizer(&best));
        assert!(has_optimizer(&save(run.path(), 7, 0)));
        assert_eq!(resolve(run.path(), best.to_str().unwrap()).unwrap(), best);
    }

    #[test]
    fn a_failed_write_leaves_no_checkpoint_behind() {
        let run = tempfile::tempdir().unwrap();
        save(run.path(), 1, 0);
        let root = checkpoints_dir(run.path());
        let err = write_atomically(&root, &step_dir_name(2), |dir| {
            fs::write(dir.join(STATE_FILE), b"{}")?;
            bail!("disk full")
        });
        assert!(err.is_err());
        assert!(!root.join(step_dir_name(2)).exists());
        let names: Vec<String> = fs::read_dir(&root)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        assert_eq!(
            names,
            vec!["step-000001".to_string()],
            "no temp dir is left"
        );
        assert!(resolve(run.path(), "latest")
            .unwrap()
            .ends_with("step-000001"));
    }

    #[test]
    fn a_half_written_temp_dir_is_never_taken_for_a_checkpoint() {
        let run = tempfile::tempdir().unwrap();
        let root = checkpoints_dir(run.path());
        fs::create_dir_all(root.join(".tmp-step-000009-1")).unwrap();
        fs::write(root.join(".tmp-step-000009-1").join(STATE_FILE), b"{").unwrap();
        assert!(resolve(run.path(), "latest").is_err());
        save(run.path(), 5, 0);
        assert!(resolve(run.path(), "latest")
            .unwrap()
            .ends_with("step-000005"));
    }

    #[test]
    fn resaving_a_step_replaces_it_whole() {
        let run = tempfile::tempdir().unwrap();
        save(run.path(), 4, 0);
        let dir = save(run.path(), 4, 0);
        assert_eq!(read_state(&dir).unwrap().step, 4);
        assert_eq!(list_steps(&checkpoints_dir(run.path())).unwrap().len(), 1);
    }
}
