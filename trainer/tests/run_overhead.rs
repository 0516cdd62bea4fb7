//! What `trainyard train`'s loop (`train::run`) does per step beyond `Trainer::step`, counted:
//! heap allocations (every metric key, formatted line, cloned map or tensor read to the host
//! allocates) and metric records. A count, not a time, so the test holds on any machine.
//!
//! One test in its own binary: the allocation counter is process-wide, and the thread count
//! (`training.threads: 1`, so all work stays on the calling thread) can be set once.

#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a failed setup step is a failed test

use std::alloc::{GlobalAlloc, Layout, System};
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};

use candle_core::Device;
use trainer::config::Config;
use trainer::train::{self, device, RunOptions, Trainer};
use trainer::wire::MetricsLine;

/// The system allocator, counting allocations and reallocations.
struct Counting;

static ALLOCATIONS: AtomicU64 = AtomicU64::new(0);

// SAFETY: every call is forwarded unchanged to the system allocator.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        System.alloc(layout)
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        System.alloc_zeroed(layout)
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        System.realloc(ptr, layout, new_size)
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        System.dealloc(ptr, layout)
    }
}

#[global_allocator]
static COUNTING: Counting = Counting;

fn allocations() -> u64 {
    ALLOCATIONS.load(Ordering::Relaxed)
}

/// A small dense model on one thread; no evaluation or checkpoint before the last step.
fn config(max_steps: usize) -> Config {
    let mut cfg = Config::from_profile("tiny").unwrap();
    let overrides: Vec<String> = [
        "training.device=cpu",
        "training.threads=1",
        "model.d_model=32",
        "model.n_heads=2",
        "model.d_ff=64",
        "model.max_seq_len=32",
        "training.seq_len=32",
        "training.batch_size=4",
        "training.eval_iters=2",
        "training.warmup_steps=0",
        "training.eval_steps=0",
        "training.save_steps=0",
        "logging.progress=never",
        "logging.log_every=1000",
    ]
    .iter()
    .map(|s| s.to_string())
    .chain([format!("training.max_steps={max_steps}")])
    .collect();
    cfg.apply_overrides(&overrides).unwrap();
    cfg.validate().unwrap();
    cfg
}

/// Allocations of a whole `train::run` of `max_steps` steps in `dir`, and its metric lines.
fn run_counted(dir: &Path, max_steps: usize) -> (u64, Vec<MetricsLine>) {
    let opts = RunOptions {
        out_dir: dir.to_path_buf(),
        ..RunOptions::default()
    };
    let before = allocations();
    train::run(config(max_steps), &opts).unwrap();
    let counted = allocations() - before;
    let lines = std::fs::read_to_string(dir.join("metrics.jsonl"))
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    (counted, lines)
}

/// The loop's own allocations per step: today the metric line's map and its four keys (5; the
/// line's JSON text reuses one buffer). The loop as it was before (a copy of every line, its
/// text, the progress line formatted on every step) made 13; a tensor op or a read of a tensor
/// to the host costs several, so one more per step, or one per parameter, fails the test.
const LOOP_ALLOCATIONS_PER_STEP: u64 = 8;

#[test]
fn the_training_command_adds_a_bounded_count_of_allocations_and_one_metric_line_per_step() {
    const SHORT: usize = 4;
    const LONG: usize = 14;
    device::configure_threads(1);

    // Trainer::step alone, past its first steps (buffers that grow once have grown).
    let mut trainer = Trainer::new(config(LONG), Device::Cpu).unwrap();
    for _ in 0..SHORT {
        trainer.step().unwrap();
    }
    let before = allocations();
    for _ in SHORT..LONG {
        trainer.step().unwrap();
    }
    let step_only = allocations() - before;
    drop(trainer);

    // The same steps through the loop: two runs that differ only in length, so set-up, the
    // final evaluation and the checkpoint cancel out and the difference is LONG - SHORT steps.
    let short_dir = tempfile::tempdir().unwrap();
    let long_dir = tempfile::tempdir().unwrap();
    let (short, short_lines) = run_counted(short_dir.path(), SHORT);
    let (long, long_lines) = run_counted(long_dir.path(), LONG);

    let steps = (LONG - SHORT) as u64;
    let loop_extra = long.saturating_sub(short).saturating_sub(step_only);
    assert!(
        loop_extra <= LOOP_ALLOCATIONS_PER_STEP * steps,
        "the loop allocated {loop_extra} times over {steps} steps beyond Trainer::step's \
         {step_only} (bound {LOOP_ALLOCATIONS_PER_STEP} per step); runs: {short} ({SHORT} steps), \
         {long} ({LONG} steps)"
    );
    assert!(
        step_only > 20 * LOOP_ALLOCATIONS_PER_STEP * steps,
        "the bound should be a small share of a step's own {step_only} allocations"
    );

    // One metric record per step, in order, each with the step's basics.
    for (lines, n) in [(&short_lines, SHORT), (&long_lines, LONG)] {
        let steps: Vec<i64> = lines.iter().map(|l| l.step).collect();
        assert_eq!(steps, (1..=n as i64).collect::<Vec<_>>());
        for line in lines.iter() {
            for key in ["train/loss", "lr", "grad_norm", "perf/tokens_per_s"] {
                assert!(
                    line.metrics.contains_key(key),
                    "step {} lacks {key}",
                    line.step
                );
            }
        }
    }
}
