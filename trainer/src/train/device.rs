//! Where training runs (`training.device`) and how many CPU threads it uses (`training.threads`).

use anyhow::{bail, Result};
use candle_core::Device;

use crate::config::DeviceSpec;

/// Resolves `training.device`: `auto` takes the first GPU when built with CUDA and one is
/// present, else the CPU; `cuda[:N]` in a CPU-only build is an error naming the feature.
/// A GPU's freed memory stays pooled for reuse (see `kernels::cuda::keep_freed_memory`), and its
/// buffers carry no cross-stream events (`kernels::cuda::skip_stream_events`).
pub fn resolve_device(spec: DeviceSpec) -> Result<Device> {
    let dev = open_device(spec)?;
    #[cfg(feature = "cuda")]
    crate::kernels::cuda::keep_freed_memory(&dev)
        .map_err(|e| anyhow::anyhow!("training.device: configuring `{spec}`'s memory pool: {e}"))?;
    #[cfg(feature = "cuda")]
    crate::kernels::cuda::skip_stream_events(&dev);
    Ok(dev)
}

fn open_device(spec: DeviceSpec) -> Result<Device> {
    match spec {
        DeviceSpec::Cpu => Ok(Device::Cpu),
        DeviceSpec::Auto => {
            if candle_core::utils::cuda_is_available() {
                Ok(Device::cuda_if_available(0)?)
            } else {
                Ok(Device::Cpu)
            }
        }
        DeviceSpec::Cuda(n) => {
            if !candle_core::utils::cuda_is_available() {
                bail!(
                    "training.device: `{spec}` needs a build with CUDA support \
                     (cargo build --release --features cuda); this build is CPU-only"
                );
            }
            Device::new_cuda(n.unwrap_or(0))
                .map_err(|e| anyhow::anyhow!("training.device: cannot open `{spec}`: {e}"))
        }
    }
}

/// The device in words: `cpu` or `cuda:N`.
pub fn describe(dev: &Device) -> String {
    match dev.location() {
        candle_core::DeviceLocation::Cpu => "cpu".to_string(),
        candle_core::DeviceLocation::Cuda { gpu_id } => format!("cuda:{gpu_id}"),
        candle_core::DeviceLocation::Metal { gpu_id } => format!("metal:{gpu_id}"),
    }
}

/// The share of the cores a launched run may use when `training.threads` is 0: the server sets
/// it to its cores divided by its CPU slots, so two CPU runs do not each take every core.
pub const CPU_THREADS_VAR: &str = "TRAINYARD_CPU_THREADS";

/// The thread count `training.threads` asks for: 0 = the launcher's share
/// ([`CPU_THREADS_VAR`]) when set, else every available core.
pub fn thread_count(requested: usize) -> usize {
    let share = std::env::var(CPU_THREADS_VAR).ok();
    thread_count_with(requested, share.as_deref())
}

fn thread_count_with(requested: usize, share: Option<&str>) -> usize {
    if requested > 0 {
        return requested;
    }
    if let Some(n) = share.and_then(|s| s.trim().parse::<usize>().ok()) {
        if n > 0 {
            return n;
        }
    }
    std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1)
}

/// candle reads this when its element-wise thread pool starts; a user's own setting wins.
const SPIN_LIMIT_VAR: &str = "CANDLE_BARRIER_POOL_SPIN_LIMIT";
const SPIN_LIMIT: u32 = 2_000;

/// Makes candle's CPU kernels use exactly `threads` threads. candle sizes its matmul
/// parallelism from `RAYON_NUM_THREADS` on every call and runs its kernels on rayon's global
/// pool, so both are set; this must run before any tensor work (the global pool is built once).
/// Returns the thread count in effect.
pub fn configure_threads(requested: usize) -> usize {
    let n = thread_count(requested);
    keep_freed_memory();
    // Safe in edition 2021; done before the trainer starts any threads of its own.
    std::env::set_var("RAYON_NUM_THREADS", n.to_string());
    std::env::set_var("CANDLE_NUM_THREADS", n.to_string());
    // candle's element-wise pool spins 25,000 rounds after each op before parking; with as
    // many workers as cores that spinning steals the cores the next GEMM or the rest of the
    // machine needs (a 2-thread step ran 1.5-2x slower with another process busy). 2,000
    // rounds (tens of microseconds: Intel documents `pause` at about 140 cycles since
    // Skylake; AMD's is shorter) bridge the gaps between the back-to-back ops of one step,
    // where 200 parked the worker between ops and woke it through the kernel again (+5-7 % on
    // an Intel Xeon, quiet), and still park soon after (one busy process beside it: -8 %
    // against 200, -17 % at 20,000).
    if std::env::var_os(SPIN_LIMIT_VAR).is_none() {
        std::env::set_var(SPIN_LIMIT_VAR, SPIN_LIMIT.to_string());
    }
    candle_core::utils::init_global_threadpool();
    let effective = candle_core::utils::get_num_threads();
    if effective != n {
        tracing::warn!(
            requested = n,
            effective,
            "could not set the CPU thread count"
        );
    }
    effective
}

/// Makes glibc's malloc keep freed blocks for reuse. Every tensor op allocates its output;
/// by default blocks over 128 KiB (most activations here) are served by `mmap` and handed
/// back with `munmap` when dropped, so each step faults in and the kernel zeroes the same
/// memory again (about 15 % of a CPU step in profiles). Raising the mmap and trim thresholds
/// keeps those blocks on the heap, and one arena per thread is enough: candle allocates from
/// the calling thread. The training thread is not the process's main thread, so its arena is
/// a chain of 64 MiB heaps, and glibc unmaps such a heap as soon as it is empty unless the top
/// pad asks to keep at least that much: without the pad a 2-thread MoE step still faulted in
/// about 75 MiB (18,800 pages) every step, in runs that happened to empty a heap.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
fn keep_freed_memory() {
    // glibc refuses mmap thresholds above 32 MiB on 64-bit; the biggest activation of the
    // benchmark shape (attention scores) is 4 MiB.
    const MMAP_THRESHOLD: libc::c_int = 32 << 20;
    // A whole heap of a thread's arena (64 MiB on 64-bit), so an emptied one is kept.
    const TOP_PAD: libc::c_int = 64 << 20;
    // SAFETY: mallopt only changes allocator tuning parameters; it is called before the
    // trainer's own threads start and is safe to call at any time in any case.
    let ok = unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, MMAP_THRESHOLD) == 1
            && libc::mallopt(libc::M_TRIM_THRESHOLD, libc::c_int::MAX) == 1
            && libc::mallopt(libc::M_TOP_PAD, TOP_PAD) == 1
            && libc::mallopt(libc::M_ARENA_MAX, 2) == 1
    };
    if !ok {
        tracing::warn!("could not tune malloc; training may run slower");
    }
}

#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
fn keep_freed_memory() {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_and_auto_resolve_on_a_cpu_build() {
        assert!(resolve_device(DeviceSpec::Cpu).unwrap().is_cpu());
        if !candle_core::utils::cuda_is_available() {
            assert!(resolve_device(DeviceSpec::Auto).unwrap().is_cpu());
        }
    }

    #[test]
    fn asking_for_cuda_in_a_cpu_build_names_the_key_and_the_feature() {
        if candle_core::utils::cuda_is_available() {
            return;
        }
        let err = resolve_device(DeviceSpec::Cuda(Some(1)))
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("training.device") && err.contains("--features cuda"),
            "{err}"
        );
    }

    #[test]
    fn zero_threads_means_the_launchers_share_else_every_core() {
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        assert_eq!(thread_count_with(0, None), cores);
        assert_eq!(thread_count_with(0, Some("3")), 3);
        assert_eq!(thread_count_with(5, Some("3")), 5, "an explicit count wins");
        for bad in ["0", "", "many", "-2"] {
            assert_eq!(thread_count_with(0, Some(bad)), cores, "{bad}");
        }
    }

    #[test]
    fn devices_are_described_in_words() {
        assert_eq!(describe(&Device::Cpu), "cpu");
    }
}
