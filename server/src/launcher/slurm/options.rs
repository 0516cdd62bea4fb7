//! The Slurm options of a run (`resources.slurm` of a launch request, and the server's defaults
//! from `serve --slurm-...`), checked once at admission: every value ends up on an `#SBATCH`
//! line of a shell script, so anything that could break out of that line is refused here,
//! naming the field.

use serde::{Deserialize, Serialize};

use crate::validate::Invalid;

/// Where a run executes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum Executor {
    /// This server's own machine: the local queue and process supervision.
    #[default]
    Local,
    /// A Slurm cluster, through `sbatch`, `squeue`/`scontrol`/`sacct` and `scancel`.
    Slurm,
}

impl Executor {
    pub fn as_str(self) -> &'static str {
        match self {
            Executor::Local => "local",
            Executor::Slurm => "slurm",
        }
    }

    pub fn parse(text: &str) -> Option<Executor> {
        match text {
            "local" => Some(Executor::Local),
            "slurm" => Some(Executor::Slurm),
            _ => None,
        }
    }
}

/// `resources.slurm`: what the batch script asks Slurm for. Unset fields take the server's
/// defaults (`serve --slurm-partition ...`), and those Slurm's own.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct SlurmOptions {
    /// `--partition`; checked against `sinfo` when the run is launched.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub partition: Option<String>,
    /// `--account`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub account: Option<String>,
    /// `--qos`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub qos: Option<String>,
    /// `--time`, in Slurm's forms: `30` (minutes), `4:00:00`, `1-12:00:00`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub time: Option<String>,
    /// GPUs per job (`--gres=gpu:N`); unset: `resources.gpus`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpus: Option<u32>,
    /// `--cpus-per-task`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpus: Option<u32>,
    /// `--mem`, e.g. `16G` or `4000M`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mem: Option<String>,
    /// More `#SBATCH` options, one per entry, e.g. `--constraint=a100` (after the server's).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub extra: Vec<String>,
}

/// Most `extra` lines one run may add, and the longest value of any field.
pub const MAX_EXTRA: usize = 32;
pub const MAX_VALUE_LEN: usize = 256;

impl SlurmOptions {
    /// The request's options over the server's: each field set in `self` wins; `extra` lines
    /// add to the server's.
    pub fn over(&self, defaults: &SlurmOptions) -> SlurmOptions {
        SlurmOptions {
            partition: self
                .partition
                .clone()
                .or_else(|| defaults.partition.clone()),
            account: self.account.clone().or_else(|| defaults.account.clone()),
            qos: self.qos.clone().or_else(|| defaults.qos.clone()),
            time: self.time.clone().or_else(|| defaults.time.clone()),
            gpus: self.gpus.or(defaults.gpus),
            cpus: self.cpus.or(defaults.cpus),
            mem: self.mem.clone().or_else(|| defaults.mem.clone()),
            extra: defaults
                .extra
                .iter()
                .chain(self.extra.iter())
                .cloned()
                .collect(),
        }
    }

    /// Checks every field; `prefix` is where they came from (`resources.slurm` in a request,
    /// `--slurm` for the server's flags), so the refusal names the field as the user wrote it.
    pub fn validate(&self, prefix: &str) -> Result<(), Invalid> {
        let field = |name: &str| format!("{prefix}.{name}");
        let names = [
            ("partition", &self.partition),
            ("account", &self.account),
            ("qos", &self.qos),
        ];
        for (name, value) in names {
            if let Some(v) = value {
                check_word(&field(name), v)?;
            }
        }
        if let Some(time) = &self.time {
            check_time(&field("time"), time)?;
        }
        if let Some(mem) = &self.mem {
            check_mem(&field("mem"), mem)?;
        }
        if self.cpus == Some(0) {
            return Err(Invalid::new(
                field("cpus"),
                format!("{} must be at least 1", field("cpus")),
            ));
        }
        if self.extra.len() > MAX_EXTRA {
            return Err(Invalid::new(
                field("extra"),
                format!(
                    "{} has {} lines; at most {MAX_EXTRA} are allowed",
                    field("extra"),
                    self.extra.len()
                ),
            ));
        }
        for (i, line) in self.extra.iter().enumerate() {
            check_extra(&format!("{}[{i}]", field("extra")), line)?;
        }
        Ok(())
    }
}

fn too_long(field: &str, value: &str) -> Option<Invalid> {
    (value.len() > MAX_VALUE_LEN).then(|| {
        Invalid::new(
            field,
            format!(
                "{field} is {} bytes long; at most {MAX_VALUE_LEN} are allowed",
                value.len()
            ),
        )
    })
}

/// A partition, account or QoS name: Slurm's names are letters, digits and `-_.`; a comma
/// separates several partitions (Slurm then picks the first that can start the job).
fn check_word(field: &str, value: &str) -> Result<(), Invalid> {
    if let Some(e) = too_long(field, value) {
        return Err(e);
    }
    let ok = !value.is_empty()
        && value
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.' | ','));
    if !ok {
        return Err(Invalid::new(
            field,
            format!("{field} must be a Slurm name (letters, digits, `-`, `_`, `.`), not `{value}`"),
        ));
    }
    Ok(())
}

/// Slurm's time limit forms: `M`, `M:S`, `H:M:S`, `D-H`, `D-H:M`, `D-H:M:S`, or `UNLIMITED`.
fn check_time(field: &str, value: &str) -> Result<(), Invalid> {
    if let Some(e) = too_long(field, value) {
        return Err(e);
    }
    let digits = |s: &str| !s.is_empty() && s.chars().all(|c| c.is_ascii_digit());
    let clock = |s: &str| {
        let parts: Vec<&str> = s.split(':').collect();
        parts.len() <= 3 && parts.iter().all(|p| digits(p))
    };
    let ok = value.eq_ignore_ascii_case("unlimited")
        || match value.split_once('-') {
            Some((days, rest)) => digits(days) && clock(rest),
            None => clock(value),
        };
    if !ok {
        return Err(Invalid::new(
            field,
            format!(
                "{field} must be a Slurm time limit such as `30` (minutes), `4:00:00` or \
                 `1-12:00:00`, not `{value}`"
            ),
        ));
    }
    Ok(())
}

/// `--mem`: a number with an optional unit K, M, G or T.
fn check_mem(field: &str, value: &str) -> Result<(), Invalid> {
    let number = value.trim_end_matches(['K', 'M', 'G', 'T', 'k', 'm', 'g', 't']);
    let ok = !number.is_empty()
        && number.len() + 1 >= value.len()
        && number.len() <= 12
        && number.chars().all(|c| c.is_ascii_digit());
    if !ok {
        return Err(Invalid::new(
            field,
            format!("{field} must be an amount of memory such as `16G` or `4000M`, not `{value}`"),
        ));
    }
    Ok(())
}

/// One more `#SBATCH` option: it must be an option (`-x`/`--xyz...`) on one line, and not one
/// the executor sets itself (the output file and working directory are the run's).
fn check_extra(field: &str, line: &str) -> Result<(), Invalid> {
    if let Some(e) = too_long(field, line) {
        return Err(e);
    }
    if !line.starts_with('-') || line.chars().any(|c| c.is_control()) {
        return Err(Invalid::new(
            field,
            format!("{field} must be one sbatch option on one line, such as `--constraint=a100`"),
        ));
    }
    const OWN: &[&str] = &[
        "--output",
        "--error",
        "-o",
        "-e",
        "--chdir",
        "-D",
        "--open-mode",
        "--parsable",
        "--wrap",
        "--export",
    ];
    let name = line.split(['=', ' ']).next().unwrap_or(line);
    if OWN.contains(&name) {
        return Err(Invalid::new(
            field,
            format!(
                "{field}: Trainyard sets `{name}` itself (the job's output goes to the run's \
                 output.log in its run directory)"
            ),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn refused(o: SlurmOptions) -> String {
        match o.validate("resources.slurm") {
            Err(Invalid { field, .. }) => field,
            Ok(()) => panic!("accepted: {o:?}"),
        }
    }

    #[test]
    fn good_options_pass_and_each_bad_one_is_refused_naming_its_field() {
        let good = SlurmOptions {
            partition: Some("gpu-a100".into()),
            account: Some("ml_team".into()),
            qos: Some("high".into()),
            time: Some("1-12:00:00".into()),
            gpus: Some(2),
            cpus: Some(8),
            mem: Some("64G".into()),
            extra: vec!["--constraint=a100".into(), "--exclusive".into()],
        };
        good.validate("resources.slurm").unwrap();
        for time in ["30", "4:00:00", "2-3", "UNLIMITED", "10:00"] {
            check_time("t", time).unwrap();
        }
        let cases = [
            (
                SlurmOptions {
                    partition: Some("gpu\n#SBATCH --x".into()),
                    ..good.clone()
                },
                "resources.slurm.partition",
            ),
            (
                SlurmOptions {
                    account: Some("a b".into()),
                    ..good.clone()
                },
                "resources.slurm.account",
            ),
            (
                SlurmOptions {
                    time: Some("soon".into()),
                    ..good.clone()
                },
                "resources.slurm.time",
            ),
            (
                SlurmOptions {
                    mem: Some("lots".into()),
                    ..good.clone()
                },
                "resources.slurm.mem",
            ),
            (
                SlurmOptions {
                    mem: Some("16GB".into()),
                    ..good.clone()
                },
                "resources.slurm.mem",
            ),
            (
                SlurmOptions {
                    cpus: Some(0),
                    ..good.clone()
                },
                "resources.slurm.cpus",
            ),
            (
                SlurmOptions {
                    extra: vec!["constraint=a100".into()],
                    ..good.clone()
                },
                "resources.slurm.extra[0]",
            ),
            (
                SlurmOptions {
                    extra: vec!["--x".into(), "--output=/etc/passwd".into()],
                    ..good.clone()
                },
                "resources.slurm.extra[1]",
            ),
            (
                SlurmOptions {
                    extra: vec!["--x\nrm -rf /".into()],
                    ..good.clone()
                },
                "resources.slurm.extra[0]",
            ),
        ];
        for (o, field) in cases {
            assert_eq!(refused(o), field);
        }
    }

    #[test]
    fn request_options_override_server_defaults_field_by_field() {
        let defaults = SlurmOptions {
            partition: Some("batch".into()),
            account: Some("lab".into()),
            extra: vec!["--constraint=a100".into()],
            ..SlurmOptions::default()
        };
        let req = SlurmOptions {
            partition: Some("debug".into()),
            extra: vec!["--exclusive".into()],
            ..SlurmOptions::default()
        };
        let merged = req.over(&defaults);
        assert_eq!(merged.partition.as_deref(), Some("debug"));
        assert_eq!(merged.account.as_deref(), Some("lab"));
        assert_eq!(merged.extra, vec!["--constraint=a100", "--exclusive"]);
    }
}
