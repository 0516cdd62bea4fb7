//! Confinement of launched runs with Linux Landlock, behind the data roots checked at admission
//! (`actions::paths`): defence in depth, so a run that names a path admission did not see (a
//! command's own file access, a symlink planted later) still cannot reach it.
//!
//! A confined process may
//! - read and execute the system's programs and libraries (`/usr`, `/lib*`, `/bin`, `/sbin`,
//!   `/opt`, the absolute `PATH` and `LD_LIBRARY_PATH` entries), the few files under `/etc` that
//!   programs need to start (the loader's cache, name resolution, time zone, certificates, user
//!   names), `/sys`, the NVIDIA driver's `/proc/driver/nvidia`, the trainer binary, the data roots
//!   and the checkpoints its config starts from;
//! - read and write its run directory and the server's token cache, and the device files a
//!   program writes to (`/dev/null`, `/dev/zero`, `/dev/full`, the random devices, the NVIDIA
//!   devices);
//! - connect over TCP only to the port of the server it reports to (Landlock ABI 4 and later),
//!   and signal or reach abstract sockets only of processes inside its own sandbox (ABI 6).
//!
//! Nothing else: not the database file, not another run's directory, not `/proc` (so no other
//! process's environment), not the rest of `/etc`, not `/tmp` (its `TMPDIR` is a folder of its
//! run directory), not the server user's home.
//!
//! Local runs are confined in the forked child right before `exec` (`pre_exec` with a ruleset
//! built in the parent, so the child only makes two system calls). A Slurm job runs on another
//! machine: its script starts the command through `trainyard confine`, which applies the same
//! policy on the node where its kernel has Landlock and says so in the log where it has not.

use std::path::{Path, PathBuf};

use clap::Args;
use landlock::{
    path_beneath_rules, Access, AccessFs, AccessNet, CompatLevel, Compatible, NetPort, Ruleset,
    RulesetAttr, RulesetCreated, RulesetCreatedAttr, RulesetStatus, Scope, ABI,
};

/// The newest Landlock ABI this policy was written and tested against (filesystem rights of
/// ABI 5, TCP rules of ABI 4, scopes of ABI 6); an older kernel enforces what it has.
const POLICY_ABI: ABI = ABI::V6;

/// Read-only system trees every program needs.
const SYSTEM_READ: &[&str] = &[
    "/usr",
    "/lib",
    "/lib32",
    "/lib64",
    "/libx32",
    "/bin",
    "/sbin",
    "/opt",
    "/sys",
    // The NVIDIA driver's parameters, which CUDA reads when it starts.
    "/proc/driver/nvidia",
];

/// Files under `/etc` that programs read to start and resolve names; the rest of `/etc`
/// (host name, machine id, credentials, the server's own configuration) stays out of reach.
const ETC_READ: &[&str] = &[
    "/etc/ld.so.cache",
    "/etc/ld.so.conf",
    "/etc/ld.so.conf.d",
    "/etc/ld.so.preload",
    "/etc/alternatives",
    "/etc/localtime",
    "/etc/timezone",
    "/etc/hosts",
    "/etc/host.conf",
    "/etc/resolv.conf",
    "/etc/nsswitch.conf",
    "/etc/gai.conf",
    "/etc/passwd",
    "/etc/group",
    "/etc/ssl",
    "/etc/ca-certificates",
    "/etc/pki",
    "/etc/mime.types",
];

/// Device files a program may open for reading and writing.
const DEVICES: &[&str] = &[
    "/dev/null",
    "/dev/zero",
    "/dev/full",
    "/dev/random",
    "/dev/urandom",
];

/// A confined run's `TMPDIR`, a folder of its run directory.
pub const TMP_DIR: &str = "tmp";

/// Whether runs this server launches are confined, and how its kernel supports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Confinement {
    /// Runs are confined; the kernel's Landlock ABI version.
    Landlock { abi: i32 },
    /// Runs are not confined: the operator said so (`--unconfined-runs`), or the kernel has no
    /// Landlock and the server has no accounts.
    Off,
}

impl Confinement {
    pub fn is_on(self) -> bool {
        matches!(self, Confinement::Landlock { .. })
    }
}

/// The kernel's Landlock ABI version, or None when it has no Landlock (not built in, or turned
/// off at boot).
pub fn kernel_abi() -> Option<i32> {
    // LANDLOCK_CREATE_RULESET_VERSION: ask for the ABI version instead of creating a ruleset.
    const VERSION: libc::c_long = 1 << 0;
    // SAFETY: with a null attribute pointer, size 0 and the VERSION flag, the call only returns
    // a number; it reads and writes no memory of ours.
    let abi = unsafe {
        libc::syscall(
            libc::SYS_landlock_create_ruleset,
            std::ptr::null::<libc::c_void>(),
            0usize,
            VERSION,
        )
    };
    (abi > 0).then_some(abi as i32)
}

/// Whether a server confines its runs: always where the kernel has Landlock, unless its
/// operator said not to; a server with accounts on a kernel without it refuses to start
/// unless its operator says runs are not confined (`--unconfined-runs`).
pub fn decide(unconfined: bool, abi: Option<i32>, accounts: bool) -> anyhow::Result<Confinement> {
    match (unconfined, abi) {
        (true, _) => Ok(Confinement::Off),
        (false, Some(abi)) => Ok(Confinement::Landlock { abi }),
        (false, None) if accounts => anyhow::bail!(
            "refusing to start with accounts on: this kernel has no Landlock, so runs launched \
             through this server could read every file the server can. Use a kernel with \
             Landlock (Linux 5.13 or later, with `landlock` among its LSMs), or pass \
             --unconfined-runs to accept that runs are not confined"
        ),
        (false, None) => Ok(Confinement::Off),
    }
}

/// What one run may touch (see the module comment).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Policy {
    /// Read and execute.
    pub read: Vec<PathBuf>,
    /// Read, write, create and remove beneath.
    pub write: Vec<PathBuf>,
    /// TCP ports it may connect to.
    pub connect_ports: Vec<u16>,
}

/// What a run's policy is made of.
pub struct RunPaths<'a> {
    pub run_dir: &'a Path,
    pub token_cache: &'a Path,
    pub trainer_bin: &'a Path,
    pub data_roots: &'a [PathBuf],
    /// Checkpoints (or Hugging Face directories) outside the roots that its config starts from,
    /// admitted because the launcher may read them.
    pub extra_read: &'a [PathBuf],
    /// The port of the server the run reports to.
    pub server_port: Option<u16>,
}

impl Policy {
    /// The policy of one run on this machine, from the system's paths and the server's
    /// environment (`PATH`, `LD_LIBRARY_PATH`).
    pub fn for_run(paths: &RunPaths<'_>) -> Policy {
        let mut read: Vec<PathBuf> = SYSTEM_READ
            .iter()
            .chain(ETC_READ)
            .map(PathBuf::from)
            .collect();
        for var in ["PATH", "LD_LIBRARY_PATH"] {
            if let Some(value) = std::env::var_os(var) {
                read.extend(
                    std::env::split_paths(&value)
                        .filter(|p| p.is_absolute() && p != Path::new("/")),
                );
            }
        }
        read.push(paths.trainer_bin.to_path_buf());
        read.extend(paths.data_roots.iter().cloned());
        read.extend(paths.extra_read.iter().cloned());
        let mut write = vec![paths.run_dir.to_path_buf(), paths.token_cache.to_path_buf()];
        write.extend(DEVICES.iter().map(PathBuf::from));
        write.extend(nvidia_devices());
        Policy {
            read,
            write,
            connect_ports: paths.server_port.into_iter().collect(),
        }
    }

    /// The Landlock ruleset of this policy, created (its rules added) but not yet applied. A
    /// path that does not exist on this machine is skipped.
    pub fn ruleset(&self) -> Result<RulesetCreated, landlock::RulesetError> {
        let fs_all = AccessFs::from_all(POLICY_ABI);
        let fs_read = AccessFs::from_read(POLICY_ABI);
        let mut ruleset = Ruleset::default()
            .set_compatibility(CompatLevel::BestEffort)
            .handle_access(fs_all)?
            .handle_access(AccessNet::ConnectTcp)?
            .scope(Scope::from_all(POLICY_ABI))?
            .create()?
            .add_rules(path_beneath_rules(&self.read, fs_read))?
            .add_rules(path_beneath_rules(&self.write, fs_all))?;
        for &port in &self.connect_ports {
            ruleset = ruleset.add_rule(NetPort::new(port, AccessNet::ConnectTcp))?;
        }
        Ok(ruleset)
    }

    /// The arguments of `trainyard confine` that apply this policy.
    pub fn to_args(&self) -> Vec<String> {
        let mut args = Vec::new();
        for p in &self.read {
            args.extend(["--read".to_string(), p.display().to_string()]);
        }
        for p in &self.write {
            args.extend(["--write".to_string(), p.display().to_string()]);
        }
        for port in &self.connect_ports {
            args.extend(["--connect-port".to_string(), port.to_string()]);
        }
        args
    }
}

/// `/dev/nvidia*` (the control device, the unified memory device and one per GPU).
fn nvidia_devices() -> Vec<PathBuf> {
    let Ok(dir) = std::fs::read_dir("/dev") else {
        return Vec::new();
    };
    dir.filter_map(|e| e.ok())
        .filter(|e| e.file_name().to_string_lossy().starts_with("nvidia"))
        .map(|e| e.path())
        .collect()
}

/// Confines the child of `cmd` right before it executes its program. The ruleset is built here,
/// in the parent: between `fork` and `exec` the child may only make async-signal-safe calls, and
/// applying a built ruleset is two system calls (`prctl(PR_SET_NO_NEW_PRIVS)`,
/// `landlock_restrict_self`) and allocates nothing. A child that cannot be confined does not
/// start: spawning fails with the reason.
pub fn apply_before_exec(
    cmd: &mut tokio::process::Command,
    policy: &Policy,
) -> std::io::Result<()> {
    let ruleset = policy.ruleset().map_err(std::io::Error::other)?;
    let mut ruleset = Some(ruleset);
    // SAFETY: the closure runs in the forked child before exec; it only takes the prepared
    // ruleset out of its Option and applies it (prctl and landlock_restrict_self), with no lock
    // and no allocation on the success path.
    unsafe {
        cmd.pre_exec(move || {
            let Some(ruleset) = ruleset.take() else {
                return Err(std::io::Error::other("the ruleset was already applied"));
            };
            match ruleset.restrict_self() {
                Ok(status) if status.ruleset != RulesetStatus::NotEnforced => Ok(()),
                Ok(_) => Err(std::io::Error::from_raw_os_error(libc::ENOSYS)),
                Err(_) => Err(std::io::Error::last_os_error()),
            }
        });
    }
    Ok(())
}

/// `trainyard confine`: applies a policy to itself and executes a command under it. The Slurm
/// executor's job scripts start runs through it (the server confines local runs itself).
#[derive(Debug, Args)]
pub struct ConfineArgs {
    /// A file or folder the command may read and execute (repeatable).
    #[arg(long = "read", value_name = "PATH")]
    pub read: Vec<PathBuf>,
    /// A folder the command may read and write (repeatable).
    #[arg(long = "write", value_name = "PATH")]
    pub write: Vec<PathBuf>,
    /// A TCP port the command may connect to (repeatable).
    #[arg(long = "connect-port", value_name = "PORT")]
    pub connect_ports: Vec<u16>,
    /// Run the command unconfined (saying so on stderr) where the kernel has no Landlock,
    /// instead of refusing to start it.
    #[arg(long)]
    pub best_effort: bool,
    /// The command and its arguments.
    #[arg(last = true, required = true, value_name = "COMMAND")]
    pub command: Vec<String>,
}

/// Applies the policy and replaces this process with the command; returns only on failure.
pub fn run_confined(args: ConfineArgs) -> anyhow::Result<()> {
    use std::os::unix::process::CommandExt;
    let policy = Policy {
        read: args.read,
        write: args.write,
        connect_ports: args.connect_ports,
    };
    let status = policy.ruleset()?.restrict_self()?;
    if status.ruleset == RulesetStatus::NotEnforced {
        if !args.best_effort {
            anyhow::bail!(
                "this machine's kernel has no Landlock, so the run cannot be confined; it was \
                 not started"
            );
        }
        eprintln!("trainyard: this machine's kernel has no Landlock: the run is not confined");
    }
    let (program, rest) = args
        .command
        .split_first()
        .ok_or_else(|| anyhow::anyhow!("confine needs a command to run"))?;
    let error = std::process::Command::new(program).args(rest).exec();
    Err(anyhow::anyhow!("cannot run {program}: {error}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_runs_policy_reads_the_roots_and_writes_only_its_directory_and_the_token_cache() {
        let roots = vec![PathBuf::from("/data/corpora")];
        let extra = vec![PathBuf::from("/srv/ty/runs/ab12/checkpoints/best")];
        let policy = Policy::for_run(&RunPaths {
            run_dir: Path::new("/srv/ty/runs/cd34"),
            token_cache: Path::new("/srv/ty/cache/tokens"),
            trainer_bin: Path::new("/usr/local/bin/trainyard"),
            data_roots: &roots,
            extra_read: &extra,
            server_port: Some(8080),
        });
        for wanted in [
            "/data/corpora",
            "/srv/ty/runs/ab12/checkpoints/best",
            "/usr",
        ] {
            assert!(policy.read.contains(&PathBuf::from(wanted)), "{wanted}");
        }
        let dirs: Vec<&PathBuf> = policy
            .write
            .iter()
            .filter(|p| !p.starts_with("/dev"))
            .collect();
        assert_eq!(
            dirs,
            [
                &PathBuf::from("/srv/ty/runs/cd34"),
                &PathBuf::from("/srv/ty/cache/tokens")
            ]
        );
        for hidden in ["/", "/proc", "/etc", "/tmp", "/srv/ty", "/home"] {
            assert!(!policy.read.contains(&PathBuf::from(hidden)), "{hidden}");
            assert!(!policy.write.contains(&PathBuf::from(hidden)), "{hidden}");
        }
        assert_eq!(policy.connect_ports, [8080]);
        let args = policy.to_args();
        assert!(args
            .windows(2)
            .any(|w| w == ["--write", "/srv/ty/runs/cd34"]));
        assert!(args.windows(2).any(|w| w == ["--connect-port", "8080"]));
    }

    #[test]
    fn a_server_with_accounts_on_a_kernel_without_landlock_starts_only_when_told_runs_are_unconfined(
    ) {
        let e = decide(false, None, true).unwrap_err().to_string();
        assert!(e.contains("--unconfined-runs"), "{e}");
        assert_eq!(decide(true, None, true).unwrap(), Confinement::Off);
        assert_eq!(decide(false, None, false).unwrap(), Confinement::Off);
        assert_eq!(
            decide(false, Some(7), true).unwrap(),
            Confinement::Landlock { abi: 7 }
        );
        assert_eq!(decide(true, Some(7), true).unwrap(), Confinement::Off);
    }
}
