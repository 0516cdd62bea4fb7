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

/// sbatch options no `extra` line may set, whoever asks: where the job's output, error and
/// input go, its working directory, and the environment it starts with (an exported file can
/// set `LD_PRELOAD`; the user's login environment is not the run's). The executor sets the
/// output and working directory itself, and a few more options it relies on.
const REFUSED: &[&str] = &[
    "output",
    "error",
    "input",
    "chdir",
    "open-mode",
    "export",
    "export-file",
    "get-user-env",
    "parsable",
    "wrap",
    "container",
    "container-id",
    "bbf",
    "uid",
    "gid",
];

/// Short forms of refused options (`-o FILE`, `-e FILE`, `-i FILE`, `-D DIR`).
const REFUSED_SHORT: &[char] = &['o', 'e', 'i', 'D'];

/// An `extra` option's name: `constraint` for `--constraint=a100`, `C` for `-Ca100`.
#[derive(Debug, PartialEq)]
enum OptionName<'a> {
    Long(&'a str),
    Short(&'a str),
}

fn option_name(line: &str) -> Option<OptionName<'_>> {
    if let Some(long) = line.strip_prefix("--") {
        let name = long.split('=').next().unwrap_or(long);
        return (!name.is_empty()).then_some(OptionName::Long(name));
    }
    let short = line.strip_prefix('-')?;
    (!short.is_empty()).then_some(OptionName::Short(short))
}

/// One more `#SBATCH` option: one word (sbatch splits an `#SBATCH` line into words, so a space
/// would smuggle in a second option), an option (`--name[=value]` or `-X...`), and none that
/// sets output, error, input, working directory or environment, also not abbreviated (sbatch
/// takes any unambiguous prefix of a long name) nor as a short option inside a group (`-Ho/x`
/// is `-H -o /x`).
fn check_extra(field: &str, line: &str) -> Result<(), Invalid> {
    if let Some(e) = too_long(field, line) {
        return Err(e);
    }
    let one_word = !line
        .chars()
        .any(|c| c.is_control() || c.is_whitespace() || matches!(c, '"' | '\'' | '\\'));
    let name = option_name(line).filter(|_| one_word);
    let refused = match name {
        None => {
            return Err(Invalid::new(
                field,
                format!(
                    "{field} must be one sbatch option, as one word, such as `--constraint=a100`"
                ),
            ))
        }
        Some(OptionName::Long(name)) => REFUSED
            .iter()
            .find(|r| r.starts_with(name))
            .map(|r| format!("--{r}")),
        Some(OptionName::Short(cluster)) => cluster
            .chars()
            .find(|c| REFUSED_SHORT.contains(c))
            .map(|c| format!("-{c}")),
    };
    if let Some(option) = refused {
        return Err(Invalid::new(
            field,
            format!(
                "{field}: `{line}` sets {option}, which no run may set: Trainyard sets the job's \
                 output file and working directory itself (the run's output.log and run \
                 directory), and a job's input and environment are not a request's to choose; \
                 write short options in their long form"
            ),
        ));
    }
    Ok(())
}

impl SlurmOptions {
    /// A request's `extra` options from someone who is not an administrator: each must be one
    /// the operator allows (`serve --slurm-allow-option NAME`), by its full long name.
    pub fn check_allowed(&self, prefix: &str, allowed: &[String]) -> Result<(), Invalid> {
        for (i, line) in self.extra.iter().enumerate() {
            let field = format!("{prefix}.extra[{i}]");
            let permitted = match option_name(line) {
                Some(OptionName::Long(name)) => {
                    allowed.iter().any(|a| a.trim_start_matches('-') == name)
                }
                Some(OptionName::Short(_)) | None => false,
            };
            if !permitted {
                let list = if allowed.is_empty() {
                    "none".to_string()
                } else {
                    allowed
                        .iter()
                        .map(|a| format!("--{}", a.trim_start_matches('-')))
                        .collect::<Vec<_>>()
                        .join(", ")
                };
                return Err(Invalid::new(
                    field.clone(),
                    format!(
                        "{field}: `{line}` is not an option this server lets users set (allowed: \
                         {list}); an operator allows one with `trainyard serve \
                         --slurm-allow-option NAME`, and administrators may set any option \
                         but those that set output, input, working directory or environment"
                    ),
                ));
            }
        }
        Ok(())
    }
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

    #[test]
    fn options_that_set_output_input_directory_or_environment_are_refused_in_every_spelling() {
        let spellings = [
            "-o/some/file",
            "-o",
            "--output=/x",
            "--output",
            "--out=/x",
            "--error=/x",
            "-e/x",
            "-Ho/x",
            "--input=/x",
            "-i/x",
            "-D/tmp",
            "--chdir=/tmp",
            "--open-mode=truncate",
            "--export=ALL,LD_PRELOAD=/x.so",
            "--export-file=/x",
            "--get-user-env",
            "--get-user",
            "--constraint=a100 --output=/x",
            "--comment=\"a b\"",
        ];
        for line in spellings {
            let o = SlurmOptions {
                extra: vec![line.to_string()],
                ..SlurmOptions::default()
            };
            assert_eq!(refused(o), "resources.slurm.extra[0]", "{line}");
        }
        for line in ["--constraint=a100", "--exclusive", "--nice=10", "-Ca100"] {
            check_extra("x", line).unwrap();
        }
    }

    #[test]
    fn a_user_may_set_only_the_extra_options_the_operator_allows() {
        let o = SlurmOptions {
            extra: vec!["--constraint=a100".into(), "--exclusive".into()],
            ..SlurmOptions::default()
        };
        let e = o.check_allowed("resources.slurm", &[]).unwrap_err();
        assert_eq!(e.field, "resources.slurm.extra[0]");
        assert!(e.message.contains("allowed: none"), "{}", e.message);
        let e = o
            .check_allowed("resources.slurm", &["constraint".into()])
            .unwrap_err();
        assert_eq!(e.field, "resources.slurm.extra[1]");
        o.check_allowed(
            "resources.slurm",
            &["--constraint".into(), "exclusive".into()],
        )
        .unwrap();
        // An abbreviation or a short form is not the allowed name.
        let short = SlurmOptions {
            extra: vec!["--constr=a100".into(), "-Ca100".into()],
            ..SlurmOptions::default()
        };
        assert!(short
            .check_allowed("resources.slurm", &["constraint".into()])
            .is_err());
    }
}
