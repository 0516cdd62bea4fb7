//! Memory a training thread frees is kept for its next step. Every tensor op allocates its
//! output, so if freed blocks went back to the kernel each step would fault in and zero its
//! whole working set again (seen through `trainyard train`: about 18,800 pages a step for the
//! MoE benchmark shape). The trainer runs on a thread other than the main one, where glibc's
//! malloc keeps a chain of 64 MiB heaps per arena and unmaps a heap as soon as it empties
//! unless told otherwise; `device::configure_threads` tells it. Counted with the process's
//! minor-fault counter, not timed, so the test holds on any machine.
//!
//! One test in its own binary: the malloc tuning is process-wide.

#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a failed setup step is a failed test

use trainer::train::device;

/// Minor page faults of the whole process so far.
#[cfg(target_os = "linux")]
fn minor_faults() -> i64 {
    let mut usage = std::mem::MaybeUninit::<libc::rusage>::zeroed();
    // SAFETY: getrusage writes one rusage into the buffer it is given.
    let rc = unsafe { libc::getrusage(libc::RUSAGE_SELF, usage.as_mut_ptr()) };
    assert_eq!(rc, 0, "getrusage failed");
    // SAFETY: getrusage succeeded, so the struct is initialised.
    unsafe { usage.assume_init() }.ru_minflt
}

/// A step's worth of activations: 96 buffers of 1 MiB (more than one 64 MiB heap), each
/// written whole, then all freed.
fn one_step() {
    let buffers: Vec<Vec<f32>> = (0..96).map(|i| vec![i as f32; 256 * 1024]).collect();
    assert_eq!(buffers.len(), 96);
    drop(buffers);
}

#[cfg(target_os = "linux")]
#[test]
fn a_training_thread_reuses_the_memory_it_freed_without_faulting_it_in_again() {
    device::configure_threads(1);
    let (steps, faults) = std::thread::spawn(|| {
        one_step(); // the first step faults its memory in
        let before = minor_faults();
        let steps = 8;
        for _ in 0..steps {
            one_step();
        }
        (steps, minor_faults() - before)
    })
    .join()
    .unwrap();
    // 96 MiB is 24,576 pages a step when it goes back to the kernel; kept, next to none.
    assert!(
        faults <= 256 * steps,
        "{faults} minor page faults over {steps} steps that reuse the same 96 MiB"
    );
}
