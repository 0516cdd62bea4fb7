//! The FIFO queue and slot accounting: whole GPUs, never oversubscribed; a CPU run takes a CPU
//! slot. Pure bookkeeping (no I/O) so it can be tested exhaustively.

use std::collections::{BTreeSet, VecDeque};

/// What a started run holds until it ends.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Assignment {
    /// GPU indices (empty for a CPU run).
    pub gpus: Vec<u32>,
}

impl Assignment {
    pub fn is_cpu(&self) -> bool {
        self.gpus.is_empty()
    }

    /// The value for `CUDA_VISIBLE_DEVICES` (empty hides every GPU from a CPU run).
    pub fn cuda_visible_devices(&self) -> String {
        let ids: Vec<String> = self.gpus.iter().map(u32::to_string).collect();
        ids.join(",")
    }
}

#[derive(Debug)]
pub struct Scheduler {
    all_gpus: BTreeSet<u32>,
    free_gpus: BTreeSet<u32>,
    free_cpu: usize,
    cpu_slots: usize,
    /// (run id, GPUs wanted), oldest first.
    queue: VecDeque<(String, usize)>,
}

impl Scheduler {
    pub fn new(gpus: &[u32], cpu_slots: usize) -> Self {
        Scheduler {
            all_gpus: gpus.iter().copied().collect(),
            free_gpus: gpus.iter().copied().collect(),
            free_cpu: cpu_slots,
            cpu_slots,
            queue: VecDeque::new(),
        }
    }

    pub fn enqueue(&mut self, run_id: String, gpus: usize) {
        self.queue.push_back((run_id, gpus));
    }

    /// Removes a queued run; false when it was not queued.
    pub fn remove(&mut self, run_id: &str) -> bool {
        let before = self.queue.len();
        self.queue.retain(|(id, _)| id != run_id);
        self.queue.len() != before
    }

    pub fn queued(&self) -> impl Iterator<Item = &str> {
        self.queue.iter().map(|(id, _)| id.as_str())
    }

    /// Claims slots for a run outside the queue (a re-adopted process keeps its GPUs).
    pub fn claim(&mut self, assignment: &Assignment) {
        if assignment.is_cpu() {
            self.free_cpu = self.free_cpu.saturating_sub(1);
        } else {
            for g in &assignment.gpus {
                self.free_gpus.remove(g);
            }
        }
    }

    pub fn release(&mut self, assignment: &Assignment) {
        if assignment.is_cpu() {
            self.free_cpu = (self.free_cpu + 1).min(self.cpu_slots);
        } else {
            // A re-adopted run may hold a GPU the inventory no longer lists: never add it.
            let known = assignment.gpus.iter().filter(|g| self.all_gpus.contains(g));
            self.free_gpus.extend(known);
        }
    }

    /// The next run to start and what it gets. FIFO within each pool: the oldest GPU run waits
    /// for enough GPUs and no younger GPU run overtakes it (no starvation of big runs), while CPU
    /// runs do not wait behind GPU runs (they compete for different slots).
    pub fn pop_next(&mut self) -> Option<(String, Assignment)> {
        let mut gpu_blocked = false;
        let mut cpu_blocked = false;
        let mut pick = None;
        for (pos, (_, want)) in self.queue.iter().enumerate() {
            if *want == 0 {
                if !cpu_blocked && self.free_cpu > 0 {
                    pick = Some(pos);
                    break;
                }
                cpu_blocked = true;
            } else {
                if !gpu_blocked && self.free_gpus.len() >= *want {
                    pick = Some(pos);
                    break;
                }
                gpu_blocked = true;
            }
            if gpu_blocked && cpu_blocked {
                break;
            }
        }
        let (run_id, want) = self.queue.remove(pick?)?;
        let assignment = if want == 0 {
            self.free_cpu -= 1;
            Assignment { gpus: Vec::new() }
        } else {
            let gpus: Vec<u32> = self.free_gpus.iter().copied().take(want).collect();
            for g in &gpus {
                self.free_gpus.remove(g);
            }
            Assignment { gpus }
        };
        Some((run_id, assignment))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn drain(s: &mut Scheduler) -> Vec<(String, Assignment)> {
        std::iter::from_fn(|| s.pop_next()).collect()
    }

    #[test]
    fn runs_start_in_submission_order_until_the_gpus_run_out() {
        let mut s = Scheduler::new(&[0, 1], 1);
        for i in 0..4 {
            s.enqueue(format!("r{i}"), 1);
        }
        let started = drain(&mut s);
        assert_eq!(started.len(), 2);
        assert_eq!(started[0].0, "r0");
        assert_eq!(started[0].1.gpus, [0]);
        assert_eq!(started[1].1.gpus, [1]);
        s.release(&started[1].1);
        let next = drain(&mut s);
        assert_eq!(next.len(), 1);
        assert_eq!(next[0].0, "r2");
        assert_eq!(next[0].1.gpus, [1]);
    }

    #[test]
    fn a_big_run_at_the_head_is_not_overtaken_by_smaller_gpu_runs() {
        let mut s = Scheduler::new(&[0, 1], 1);
        s.enqueue("small".into(), 1);
        s.enqueue("big".into(), 2);
        s.enqueue("late".into(), 1);
        let first = drain(&mut s);
        assert_eq!(
            first.len(),
            1,
            "only `small` fits; `late` must wait behind `big`"
        );
        s.release(&first[0].1);
        let second = drain(&mut s);
        assert_eq!(second[0].0, "big");
        assert_eq!(second[0].1.gpus, [0, 1]);
    }

    #[test]
    fn cpu_runs_use_cpu_slots_and_do_not_wait_behind_gpu_runs() {
        let mut s = Scheduler::new(&[], 2);
        s.enqueue("gpu".into(), 1);
        s.enqueue("c1".into(), 0);
        s.enqueue("c2".into(), 0);
        s.enqueue("c3".into(), 0);
        let started = drain(&mut s);
        let ids: Vec<&str> = started.iter().map(|(id, _)| id.as_str()).collect();
        assert_eq!(ids, ["c1", "c2"]);
        assert!(started.iter().all(|(_, a)| a.is_cpu()));
        assert_eq!(s.queued().collect::<Vec<_>>(), ["gpu", "c3"]);
    }

    #[test]
    fn removing_a_queued_run_takes_it_out_of_line() {
        let mut s = Scheduler::new(&[0], 0);
        s.enqueue("a".into(), 1);
        s.enqueue("b".into(), 1);
        assert!(s.remove("a"));
        assert!(!s.remove("a"));
        assert_eq!(drain(&mut s)[0].0, "b");
    }

    #[test]
    fn claimed_gpus_are_not_handed_out_again() {
        let mut s = Scheduler::new(&[0, 1], 0);
        s.claim(&Assignment { gpus: vec![0] });
        s.enqueue("a".into(), 1);
        s.enqueue("b".into(), 1);
        let started = drain(&mut s);
        assert_eq!(started.len(), 1);
        assert_eq!(started[0].1.gpus, [1]);
        assert_eq!(started[0].1.cuda_visible_devices(), "1");
    }
}
