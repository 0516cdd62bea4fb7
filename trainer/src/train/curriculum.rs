//! The sequence-length curriculum (`training.curriculum`): shorter training sequences for the
//! first steps, then `training.seq_len`. A pure function of the step, like the learning rate,
//! so a resumed run cuts the same lengths; the sampler's position counts batches whatever their
//! length, so it needs nothing more.

use crate::config::TrainingConfig;

/// Tokens per training sequence at optimizer step `step` (0-based).
pub fn seq_len_at(cfg: &TrainingConfig, step: u64) -> usize {
    let mut end = 0u64;
    for stage in &cfg.curriculum {
        end += stage.steps as u64;
        if step < end {
            return stage.seq_len;
        }
    }
    cfg.seq_len
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::CurriculumStage;

    #[test]
    fn each_stage_lasts_its_steps_and_the_run_ends_at_training_seq_len() {
        let cfg = TrainingConfig {
            seq_len: 64,
            curriculum: vec![
                CurriculumStage {
                    seq_len: 16,
                    steps: 10,
                },
                CurriculumStage {
                    seq_len: 32,
                    steps: 5,
                },
            ],
            ..TrainingConfig::default()
        };
        let lens: Vec<usize> = (0..20).map(|s| seq_len_at(&cfg, s)).collect();
        assert_eq!(&lens[..10], &[16; 10]);
        assert_eq!(&lens[10..15], &[32; 5]);
        assert_eq!(&lens[15..], &[64; 5]);
    }

    #[test]
    fn without_a_curriculum_every_step_uses_training_seq_len() {
        let cfg = TrainingConfig::default();
        assert_eq!(seq_len_at(&cfg, 0), cfg.seq_len);
        assert_eq!(seq_len_at(&cfg, 10_000), cfg.seq_len);
    }
}
