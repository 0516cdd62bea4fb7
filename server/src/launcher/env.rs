//! The environment a launched run starts with. Never the server's own: that holds the database
//! URL (with its password), the admin token and whatever else the operator exported. A run gets
//! the variables a program needs to work (paths, locale, time zone, temp dir, user), the
//! GPU/CUDA and thread-pool settings, Rust's logging switches, and the `TRAINYARD_*` variables
//! the launcher sets for it. `docs/security.md` lists them for users.

use std::ffi::{OsStr, OsString};

/// Passed on by exact name when the server has them.
const PASSED: &[&str] = &[
    "PATH",
    "HOME",
    "USER",
    "LOGNAME",
    "LANG",
    "LANGUAGE",
    "TZ",
    "TMPDIR",
    "LD_LIBRARY_PATH",
    "RUST_LOG",
    "RUST_BACKTRACE",
    // The trainer's MFU reference for GPUs it does not know.
    "TRAINYARD_PEAK_FLOPS",
];

/// Passed on by prefix: locale categories, CUDA/NVIDIA and NCCL settings, candle's and rayon's
/// thread-pool settings.
const PASSED_PREFIXES: &[&str] = &["LC_", "CUDA_", "NVIDIA_", "NCCL_", "CANDLE_", "RAYON_"];

/// Set by the launcher for each attempt, never taken from the server's environment.
pub const SET_BY_LAUNCHER: &[&str] = &[
    "TRAINYARD_SERVER_URL",
    "TRAINYARD_RUN_ID",
    "TRAINYARD_RUN_DIR",
    "TRAINYARD_ATTEMPT",
    "TRAINYARD_TOKEN",
    "CUDA_VISIBLE_DEVICES",
    CPU_THREADS_VAR,
];

/// Read by the trainer when `training.threads` is 0: a CPU run's share of the cores.
pub use trainer::train::device::CPU_THREADS_VAR;

/// The threads each CPU run gets when its config leaves `training.threads` at 0: the cores
/// divided evenly among the CPU slots (at least one), so concurrent CPU runs do not each start
/// a thread per core and slow each other down.
pub fn cpu_threads_per_slot(cores: usize, cpu_slots: usize) -> usize {
    (cores / cpu_slots.max(1)).max(1)
}

/// This machine's cores, as the trainer counts them.
pub fn cores() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

fn passed(name: &OsStr) -> bool {
    let Some(name) = name.to_str() else {
        return false;
    };
    if SET_BY_LAUNCHER.contains(&name) {
        return false;
    }
    PASSED.contains(&name) || PASSED_PREFIXES.iter().any(|p| name.starts_with(p))
}

/// The part of the server's environment (`std::env::vars_os()`) a run inherits.
pub fn inherited(
    server_env: impl IntoIterator<Item = (OsString, OsString)>,
) -> Vec<(OsString, OsString)> {
    server_env
        .into_iter()
        .filter(|(name, _)| passed(name))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(pairs: &[(&str, &str)]) -> Vec<(OsString, OsString)> {
        pairs
            .iter()
            .map(|(k, v)| (OsString::from(k), OsString::from(v)))
            .collect()
    }

    #[test]
    fn secrets_and_server_settings_stay_behind_and_working_variables_are_passed() {
        let server = env(&[
            ("PATH", "/usr/bin"),
            ("HOME", "/home/t"),
            ("LC_ALL", "C.UTF-8"),
            ("CUDA_HOME", "/usr/local/cuda"),
            ("NVIDIA_VISIBLE_DEVICES", "all"),
            ("RUST_LOG", "info"),
            ("DATABASE_URL", "postgres://u:pw@db/x"),
            ("TRAINYARD_ADMIN_TOKEN", "s3cret"),
            ("TRAINYARD_TOKEN", "s3cret"),
            ("TRAINYARD_DATA_DIR", "/srv"),
            ("CUDA_VISIBLE_DEVICES", "0,1,2,3"),
            ("TRAINYARD_CPU_THREADS", "64"),
            ("AWS_SECRET_ACCESS_KEY", "k"),
        ]);
        let mut names: Vec<String> = inherited(server)
            .into_iter()
            .map(|(k, _)| k.to_string_lossy().into_owned())
            .collect();
        names.sort();
        assert_eq!(
            names,
            [
                "CUDA_HOME",
                "HOME",
                "LC_ALL",
                "NVIDIA_VISIBLE_DEVICES",
                "PATH",
                "RUST_LOG"
            ]
        );
    }

    #[test]
    fn cpu_slots_share_the_cores_and_each_gets_at_least_one() {
        let cases = [
            (16, 2, 8),
            (16, 3, 5),
            (2, 2, 1),
            (1, 4, 1),
            (8, 1, 8),
            (8, 0, 8),
        ];
        for (cores, slots, each) in cases {
            assert_eq!(
                cpu_threads_per_slot(cores, slots),
                each,
                "{cores} cores, {slots} slots"
            );
        }
    }
}
