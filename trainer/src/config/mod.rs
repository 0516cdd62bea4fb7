//! Run configuration: `model`, `training`, `data`, `logging` sections, loaded from YAML profiles
//! (`configs/*.yaml`) plus `--set a.b=VALUE` overrides, validated before any work starts.
//!
//! These types are the contract between the trainer, the server (which validates launches with
//! them) and users' YAML files. Defaults are the `tiny` profile.

use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default)]
#[serde(deny_unknown_fields, default)]
pub struct Config {
    /// The network's shape.
    pub model: ModelConfig,
    /// Optimization, evaluation, checkpoints and the device.
    pub training: TrainingConfig,
    /// Where the text comes from and how it is cleaned, split and tokenized.
    pub data: DataConfig,
    /// Console output and reporting to the tracking server.
    pub logging: LoggingConfig,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum PositionKind {
    /// Learned absolute position embeddings (GPT-2).
    Learned,
    /// Rotary position embeddings applied to queries and keys.
    Rope,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum NormKind {
    /// LayerNorm: subtract the mean, divide by the standard deviation, scale and shift.
    LayerNorm,
    /// RMSNorm: divide by the root mean square and scale (LLaMA).
    RmsNorm,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Activation {
    /// GELU MLP: d_model → d_ff → d_model.
    Gelu,
    /// Gated SiLU MLP (LLaMA): two d_model → d_ff projections, one back.
    Swiglu,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ModelConfig {
    /// Embedding rows; must be >= the tokenizer's vocabulary (256 for raw bytes).
    pub vocab_size: usize,
    /// Width of the residual stream.
    pub d_model: usize,
    /// Number of transformer blocks.
    pub n_layers: usize,
    /// Attention heads per block; must divide d_model.
    pub n_heads: usize,
    /// Hidden width of each MLP (and of each MoE expert).
    pub d_ff: usize,
    /// Longest context the model supports (size of learned position table; RoPE limit).
    pub max_seq_len: usize,
    /// Dropout probability on attention weights, residual branches and embeddings (0 = off).
    pub dropout: f64,
    /// Position encoding.
    pub position: PositionKind,
    /// RoPE base frequency.
    pub rope_theta: f64,
    /// Pre-norm flavour for every block and the final norm.
    pub norm: NormKind,
    /// Epsilon inside the norms.
    pub norm_eps: f64,
    /// MLP flavour.
    pub activation: Activation,
    /// Bias terms in linear layers and LayerNorm.
    pub bias: bool,
    /// Share the token embedding with the output projection (GPT-2).
    pub tie_embeddings: bool,
    /// Std of the normal init (GPT-2: 0.02); residual projections get std/sqrt(2·n_layers).
    pub init_std: f64,
    /// Mixture-of-Experts blocks; absent = dense model.
    pub moe: Option<MoeConfig>,
    /// The stack as letters, block by block: a mixer, `A` (attention) or `M` (Mamba-2), each
    /// optionally followed by the block's MLP, `F` (dense) or `E` (MoE, shaped by model.moe);
    /// an MLP letter with no mixer before it is a block of its own. `MFMEAF` is three blocks,
    /// `MMAF` three (M, M, AF). It must describe model.n_layers blocks; with it,
    /// model.moe.every_n_layers is not used. Absent = `AF` per block (`AE` where model.moe
    /// puts MoE).
    pub layer_pattern: Option<LayerPattern>,
    /// Shape of the Mamba-2 mixers (the `M` letters of model.layer_pattern); absent = the
    /// defaults below.
    pub mamba: Option<MambaConfig>,
}

impl Default for ModelConfig {
    fn default() -> Self {
        ModelConfig {
            vocab_size: 256,
            d_model: 64,
            n_layers: 2,
            n_heads: 4,
            d_ff: 256,
            max_seq_len: 64,
            dropout: 0.0,
            position: PositionKind::Learned,
            rope_theta: 10_000.0,
            norm: NormKind::LayerNorm,
            norm_eps: 1e-5,
            activation: Activation::Gelu,
            bias: true,
            tie_embeddings: true,
            init_std: 0.02,
            moe: None,
            layer_pattern: None,
            mamba: None,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct MoeConfig {
    /// Routed experts per MoE layer.
    pub num_experts: usize,
    /// Experts each token is sent to.
    pub top_k: usize,
    /// Every n-th block (1 = all) uses MoE instead of the dense MLP; block i is MoE when
    /// (i + 1) % every_n_layers == 0.
    pub every_n_layers: usize,
    /// Expert capacity = capacity_factor · tokens · top_k / num_experts; overflow tokens are
    /// dropped and pass through the residual. 0 = no limit.
    pub capacity_factor: f64,
    /// Weight of the Switch/GShard load-balancing loss E·Σ f_i·P_i.
    pub aux_loss_weight: f64,
    /// Weight of the router z-loss (mean squared logsumexp of router logits).
    pub z_loss_weight: f64,
    /// Multiplicative uniform noise on router inputs during training (0 = off).
    pub router_jitter: f64,
    /// An always-on expert beside the routed ones.
    pub shared_expert: bool,
}

impl Default for MoeConfig {
    fn default() -> Self {
        MoeConfig {
            num_experts: 8,
            top_k: 2,
            every_n_layers: 1,
            capacity_factor: 0.0,
            aux_loss_weight: 0.01,
            z_loss_weight: 0.001,
            router_jitter: 0.0,
            shared_expert: false,
        }
    }
}

/// A Mamba-2 mixer (state-space duality, Dao and Gu 2024): per head, a state h (head_dim ×
/// d_state) decays by exp(dt·A) each token and takes in dt·x·Bᵀ; the output reads it with C.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct MambaConfig {
    /// Size N of the state per channel: B and C are N-vectors per token, shared by all heads.
    pub d_state: usize,
    /// Taps of the causal depthwise convolution over x, B and C (the current token included);
    /// at least 2.
    pub d_conv: usize,
    /// Inner width = expand · model.d_model: the channels the state-space scan runs over.
    pub expand: usize,
    /// Channels per head; expand · model.d_model must be a multiple of it. Each head has one
    /// decay A and one step size dt.
    pub head_dim: usize,
    /// Tokens per chunk of the training scan: masked quadratic (attention-like) form within a
    /// chunk, a state passed from chunk to chunk. Generation steps the recurrence instead.
    pub chunk_size: usize,
}

impl Default for MambaConfig {
    fn default() -> Self {
        MambaConfig {
            d_state: 16,
            d_conv: 4,
            expand: 2,
            head_dim: 16,
            chunk_size: 32,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum OptimizerKind {
    /// Adam with decoupled weight decay.
    AdamW,
    /// Stochastic gradient descent with (optionally Nesterov) momentum.
    Sgd,
    /// Lion: the sign of an interpolated momentum (uses beta1, beta2).
    Lion,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LrSchedule {
    /// Stay at learning_rate after warmup.
    Constant,
    /// Straight line down to min_lr at max_steps.
    Linear,
    /// Half a cosine down to min_lr at max_steps.
    Cosine,
    /// (1 - progress)^lr_power down to min_lr.
    Polynomial,
    /// Multiply by lr_gamma every step, never below min_lr.
    Exponential,
    /// Cosine with warm restarts (SGDR, Loshchilov and Hutter): half a cosine from
    /// learning_rate down to min_lr over lr_restart_period steps, then back to learning_rate for
    /// a cycle lr_restart_mult times as long, and so on until max_steps.
    Sgdr,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Precision {
    /// Full single precision everywhere.
    F32,
    /// bfloat16 matmuls with f32 master weights.
    Bf16,
    /// TensorFloat-32 matmuls on CUDA (f32 on the CPU).
    Tf32,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct TrainingConfig {
    /// Sequences per optimizer micro-step.
    pub batch_size: usize,
    /// Tokens per training sequence; <= model.max_seq_len.
    pub seq_len: usize,
    /// Optimizer steps to run.
    pub max_steps: usize,
    /// Peak learning rate (reached after warmup).
    pub learning_rate: f64,
    /// Floor the schedule decays to.
    pub min_lr: f64,
    /// Linear warmup steps from 0 to learning_rate; < max_steps.
    pub warmup_steps: usize,
    /// Shape of the decay after warmup.
    pub lr_schedule: LrSchedule,
    /// Exponent of the polynomial schedule.
    pub lr_power: f64,
    /// Per-step multiplicative factor of the exponential schedule.
    pub lr_gamma: f64,
    /// Steps in the first cycle of the sgdr schedule (counted after warmup).
    pub lr_restart_period: usize,
    /// Each sgdr cycle is this many times as long as the one before (>= 1; 1 = all
    /// cycles equal).
    pub lr_restart_mult: f64,
    /// The update rule.
    pub optimizer: OptimizerKind,
    /// AdamW/Lion beta1 (SGD ignores).
    pub beta1: f64,
    /// AdamW/Lion beta2.
    pub beta2: f64,
    /// AdamW epsilon.
    pub eps: f64,
    /// SGD momentum.
    pub momentum: f64,
    /// SGD Nesterov momentum.
    pub nesterov: bool,
    /// Decoupled weight decay; never applied to biases, norms or embeddings.
    pub weight_decay: f64,
    /// Clip the global gradient norm to this value (0 = off).
    pub grad_clip: f64,
    /// Micro-batches accumulated per optimizer step.
    pub grad_accum_steps: usize,
    /// Label smoothing in [0, 1): the target distribution puts 1 - label_smoothing on the next
    /// token and spreads label_smoothing evenly over the whole vocabulary. train/loss includes
    /// it; val/loss stays the plain cross-entropy.
    pub label_smoothing: f64,
    /// Sequence-length warm-up: stages of shorter training sequences before training.seq_len,
    /// e.g. `[{seq_len: 16, steps: 100}, {seq_len: 32, steps: 100}]` trains steps 1-100 on 16
    /// tokens, 101-200 on 32 and the rest on training.seq_len. Empty = off.
    pub curriculum: Vec<CurriculumStage>,
    /// Skip updates on a non-finite or spiking loss and roll back to the last checkpoint when
    /// they repeat; absent = off (a non-finite loss ends the run).
    pub instability_guard: Option<InstabilityGuardConfig>,
    /// Activation checkpointing: keep only each block's input in the forward and recompute the
    /// block's activations in the backward (same gradients, lower peak memory, about one more
    /// forward pass of compute).
    pub gradient_checkpointing: bool,
    /// Seeds init, data order and dropout; runs are deterministic on CPU.
    pub seed: u64,
    /// `auto`, `cpu`, `cuda` or `cuda:N`.
    pub device: DeviceSpec,
    /// CPU threads (0 = all cores, or a launched CPU run's share of them: the server divides
    /// the cores among its CPU slots).
    pub threads: usize,
    /// Matmul precision: f32, bf16 (f32 master weights) or tf32.
    pub precision: Precision,
    /// Evaluate every N steps (0 = only at the end).
    pub eval_steps: usize,
    /// Validation batches per evaluation.
    pub eval_iters: usize,
    /// Stop after this many evaluations without improvement (0 = never).
    pub early_stopping_patience: usize,
    /// Checkpoint every N steps (0 = only at the end).
    pub save_steps: usize,
    /// Keep at most this many step checkpoints, oldest removed first (0 = keep all).
    pub save_total_limit: usize,
    /// Start from this checkpoint's weights (a fresh run, not a resume): a checkpoint
    /// directory, or `hf:PATH` for a Hugging Face GPT-2, Llama or Mixtral directory
    /// (`config.json`, `model.safetensors`, `tokenizer.json`), whose shape replaces `model.*`.
    pub init_from: Option<String>,
    /// What the loss is: next-token prediction on text, or preference tuning on pairs.
    pub objective: Objective,
    /// Direct Preference Optimization settings, used when training.objective is dpo.
    pub dpo: DpoConfig,
    /// Low-rank adapters: train small matrices beside frozen base weights; absent = train
    /// every weight.
    pub lora: Option<LoraConfig>,
}

impl Default for TrainingConfig {
    fn default() -> Self {
        TrainingConfig {
            batch_size: 8,
            seq_len: 64,
            max_steps: 200,
            learning_rate: 3e-3,
            min_lr: 3e-4,
            warmup_steps: 10,
            lr_schedule: LrSchedule::Cosine,
            lr_power: 1.0,
            lr_gamma: 0.999,
            lr_restart_period: 100,
            lr_restart_mult: 1.0,
            optimizer: OptimizerKind::AdamW,
            beta1: 0.9,
            beta2: 0.95,
            eps: 1e-8,
            momentum: 0.9,
            nesterov: false,
            weight_decay: 0.1,
            grad_clip: 1.0,
            grad_accum_steps: 1,
            label_smoothing: 0.0,
            curriculum: Vec::new(),
            instability_guard: None,
            gradient_checkpointing: false,
            seed: 1337,
            device: DeviceSpec::Auto,
            threads: 0,
            precision: Precision::F32,
            eval_steps: 50,
            eval_iters: 10,
            early_stopping_patience: 0,
            save_steps: 100,
            save_total_limit: 3,
            init_from: None,
            objective: Objective::Lm,
            dpo: DpoConfig::default(),
            lora: None,
        }
    }
}

/// One stage of the sequence-length curriculum.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CurriculumStage {
    /// Tokens per training sequence during this stage; <= training.seq_len.
    pub seq_len: usize,
    /// Optimizer steps the stage lasts.
    pub steps: usize,
}

/// The instability guard: a step whose loss is non-finite, or more than spike_factor times the
/// running mean of recent accepted losses, is skipped (no update; the step still counts). After
/// rollback_after skipped steps in a row the weights and optimizer state go back to the latest
/// step checkpoint and the learning rate is multiplied by lr_scale; the step counter and the data
/// order go on, so the run sees new batches.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct InstabilityGuardConfig {
    /// A loss above spike_factor x the running mean of accepted losses is a spike (> 1).
    pub spike_factor: f64,
    /// Accepted steps before spikes are judged, so the running mean has settled.
    pub min_history: usize,
    /// Skipped steps in a row that trigger a rollback to the latest step checkpoint.
    pub rollback_after: usize,
    /// Factor applied to the learning rate at each rollback, in (0, 1].
    pub lr_scale: f64,
    /// Rollbacks allowed before the run fails as diverged.
    pub max_rollbacks: usize,
}

impl Default for InstabilityGuardConfig {
    fn default() -> Self {
        InstabilityGuardConfig {
            spike_factor: 3.0,
            min_history: 20,
            rollback_after: 3,
            lr_scale: 0.5,
            max_rollbacks: 3,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Objective {
    /// Mean next-token cross-entropy on data.dataset's text.
    Lm,
    /// DPO on data.dataset, a JSONL file of {"prompt", "chosen", "rejected"} records.
    Dpo,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct DpoConfig {
    /// Strength of the pull towards the reference: the loss is -log sigmoid(beta · margin of
    /// the log-probability ratios).
    pub beta: f64,
    /// The frozen model the policy is measured against: `init` (the starting weights; with
    /// LoRA the same model with its adapters off, so no second copy is held), or a checkpoint
    /// directory or `hf:PATH` of the same shape.
    pub reference: String,
}

impl Default for DpoConfig {
    fn default() -> Self {
        DpoConfig {
            beta: 0.1,
            reference: "init".to_string(),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct LoraConfig {
    /// Rank of each adapter: delta W = B·A with A (r, in) and B (out, r).
    pub r: usize,
    /// Scale numerator: the adapter's output is multiplied by alpha / r.
    pub alpha: f64,
    /// Dropout probability on the adapter's input while training (0 = off).
    pub dropout: f64,
    /// Projections that get adapters: q, k, v, o (attention), mlp_in, mlp_out (dense MLP),
    /// expert_in, expert_out (every MoE expert, the shared one included).
    pub targets: Vec<LoraTarget>,
}

impl Default for LoraConfig {
    fn default() -> Self {
        LoraConfig {
            r: 8,
            alpha: 16.0,
            dropout: 0.0,
            targets: vec![LoraTarget::Q, LoraTarget::V],
        }
    }
}

impl LoraConfig {
    /// Whether `target` is among the projections that get adapters.
    pub fn adapts(&self, target: LoraTarget) -> bool {
        self.targets.contains(&target)
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct DataConfig {
    /// `dummy` (synthetic, learnable), `demo` (bundled real text), or a file, directory, glob
    /// or `.jsonl` path.
    pub dataset: String,
    /// Field holding the text in JSONL records.
    pub text_column: String,
    /// `bytes` (raw UTF-8 bytes, vocab 256), `bpe` (train a byte-level BPE of
    /// model.vocab_size on the training split) or a path to a `tokenizer.json`.
    pub tokenizer: String,
    /// Fraction of documents held out for validation (deterministic by content hash).
    pub val_fraction: f64,
    /// Drop documents shorter than this many characters.
    pub min_length: usize,
    /// Drop exact duplicate documents (by content hash, ignoring line endings, trailing spaces
    /// and leading or trailing blank lines).
    pub dedup: bool,
    /// Drop near-duplicate documents (MinHash over word shingles).
    pub near_dedup: bool,
    /// Jaccard similarity above which two documents are near-duplicates.
    pub near_dedup_threshold: f64,
    /// Where token caches live (memory-mapped; keyed by data + tokenizer hash).
    pub cache_dir: String,
    /// Line-level cleaning, applied to every document before the document filters.
    pub line_filters: LineFilterConfig,
}

impl Default for DataConfig {
    fn default() -> Self {
        DataConfig {
            dataset: "dummy".to_string(),
            text_column: "text".to_string(),
            tokenizer: "bytes".to_string(),
            val_fraction: 0.1,
            min_length: 0,
            dedup: true,
            near_dedup: false,
            near_dedup_threshold: 0.8,
            cache_dir: ".trainyard-cache".to_string(),
            line_filters: LineFilterConfig::default(),
        }
    }
}

/// Line-level filters drop boilerplate lines inside documents (as web-text pipelines do) and
/// count what they dropped; a document left without text is dropped. Blank lines are kept, so
/// paragraphs stay apart. All are off by default.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct LineFilterConfig {
    /// Drop lines with fewer than this many words (0 = off).
    pub min_words: usize,
    /// Drop lines without a single letter or digit (`-----`, `* * *`, `|||`).
    pub symbol_lines: bool,
    /// Drop navigation and boilerplate lines: menus of three or more short items separated by
    /// `|`, `»`, `›`, `·`, `•` or ` > ` (breadcrumbs), and short lines such as "Skip to
    /// content", "All rights reserved", "Privacy policy" or "Enable JavaScript".
    pub boilerplate: bool,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct LoggingConfig {
    /// Print a log line every N steps (metrics are recorded every step regardless).
    pub log_every: usize,
    /// Emit MoE telemetry every N steps.
    pub moe_every: usize,
    /// Record each layer's gradient and parameter L2 norms (`grad_norm/<layer>`,
    /// `param_norm/<layer>`) every N steps (0 = off).
    pub layer_norms_every: usize,
    /// Longest time metrics wait before being sent to the server, in milliseconds.
    pub flush_interval_ms: u64,
    /// Progress bar: `auto` (on a terminal), `always` or `never`. The bar stays at the bottom;
    /// a step line is still printed above it every log_every steps.
    pub progress: Progress,
    /// Seconds between heartbeats to the tracking server while training with one. A server
    /// marks a running run it has not heard from for `serve --lost-after-secs` (300 by default,
    /// ten heartbeats) `lost`, so a killed trainer does not stay `running` forever.
    pub heartbeat_interval_secs: u64,
}

impl Default for LoggingConfig {
    fn default() -> Self {
        LoggingConfig {
            log_every: 10,
            moe_every: 10,
            layer_norms_every: 0,
            flush_interval_ms: 1000,
            progress: Progress::Auto,
            heartbeat_interval_secs: 30,
        }
    }
}

mod choices;
mod error;
mod load;
mod overrides;
mod pattern;
pub mod reference;
mod validate;

pub use choices::{DeviceSpec, LoraTarget, Progress};
pub use error::ConfigError;
pub use load::PROFILES;
pub use pattern::{BlockKind, FfnKind, LayerPattern, MixerKind};
