//! The batch script of one attempt, written into the run's directory (`slurm-job.sh`) and
//! handed to `sbatch`. It holds no secret: the run's token reaches the job through the
//! environment sbatch passes on, never through a file.

use super::options::SlurmOptions;
use std::path::Path;

pub const SCRIPT_FILE: &str = "slurm-job.sh";

/// Exit status of the script when the run directory is not visible on the node: the data
/// directory must be on a filesystem the compute nodes share with the server.
pub const NO_RUN_DIR: i32 = 97;

/// Everything one attempt's script needs.
pub struct ScriptSpec<'a> {
    pub run_id: &'a str,
    pub run_dir: &'a Path,
    pub attempt: u32,
    pub options: &'a SlurmOptions,
    /// GPUs per job when the options leave them unset (`resources.gpus`).
    pub gpus: usize,
    pub argv: &'a [String],
    /// The command is confined: its temporary files go to a folder of the run directory.
    pub confined: bool,
}

/// Single quotes for the shell (a `'` becomes `'\''`).
pub fn quote(text: &str) -> String {
    format!("'{}'", text.replace('\'', r"'\''"))
}

pub fn render(spec: &ScriptSpec<'_>) -> String {
    let dir = spec.run_dir.display().to_string();
    let log = spec.run_dir.join(crate::launcher::process::LOG_FILE);
    let o = spec.options;
    let mut lines = vec![
        "#!/bin/sh".to_string(),
        format!("#SBATCH --job-name=trainyard-{}", spec.run_id),
        // Every attempt appends to the one log the log API and the run page read.
        format!("#SBATCH --output={}", log.display()),
        "#SBATCH --open-mode=append".to_string(),
        format!("#SBATCH --chdir={dir}"),
        // Restarts are ours (a new job that resumes from the latest checkpoint), so Slurm's own
        // requeue, which would rerun this attempt from the start, is off.
        "#SBATCH --no-requeue".to_string(),
    ];
    let mut opt = |name: &str, value: &Option<String>| {
        if let Some(v) = value {
            lines.push(format!("#SBATCH --{name}={v}"));
        }
    };
    opt("partition", &o.partition);
    opt("account", &o.account);
    opt("qos", &o.qos);
    opt("time", &o.time);
    opt("mem", &o.mem);
    if let Some(cpus) = o.cpus {
        lines.push(format!("#SBATCH --cpus-per-task={cpus}"));
    }
    let gpus = o.gpus.map_or(spec.gpus, |g| g as usize);
    if gpus > 0 {
        lines.push(format!("#SBATCH --gres=gpu:{gpus}"));
    }
    for extra in &o.extra {
        lines.push(format!("#SBATCH {extra}"));
    }
    let argv: Vec<String> = spec.argv.iter().map(|a| quote(a)).collect();
    let qdir = quote(&dir);
    let tmp = if spec.confined {
        format!(
            "# A confined run writes only its run directory.\nmkdir -p {tmp} && export TMPDIR=\"$PWD/{tmp}\"\n",
            tmp = crate::launcher::confine::TMP_DIR
        )
    } else {
        String::new()
    };
    lines.push(format!(
        r#"# Written by Trainyard for run {run}, attempt {attempt}.
# A run directory the node cannot see means the data directory is not on a shared filesystem.
cd {qdir} || {{ echo "trainyard: run directory {dir} is not visible on $(hostname)" >&2; exit {NO_RUN_DIR}; }}
echo "=== trainyard: Slurm job $SLURM_JOB_ID on $(hostname) (attempt {attempt}) ==="
{tmp}# A CPU run's trainer uses the cores Slurm gave the job, not every core of the node.
if [ -z "${{CUDA_VISIBLE_DEVICES:-}}" ]; then
  export TRAINYARD_CPU_THREADS="${{SLURM_CPUS_PER_TASK:-${{SLURM_CPUS_ON_NODE:-1}}}}"
fi
# scancel --signal=TERM --full reaches this shell and the trainer alike: the shell waits for
# the trainer to write its checkpoint and exit, then records how it ended.
trap : TERM INT HUP
{argv}
code=$?
printf '%s\n' "$code" > exit_code.tmp && mv exit_code.tmp exit_code
exit "$code""#,
        run = spec.run_id,
        attempt = spec.attempt,
        argv = argv.join(" "),
    ));
    let mut text = lines.join("\n");
    text.push('\n');
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_script_asks_for_the_options_and_runs_the_command_quoted() {
        let options = SlurmOptions {
            partition: Some("gpu".into()),
            account: Some("lab".into()),
            time: Some("4:00:00".into()),
            cpus: Some(8),
            mem: Some("32G".into()),
            extra: vec!["--constraint=a100".into()],
            ..SlurmOptions::default()
        };
        let argv = vec!["trainyard".to_string(), "train".into(), "it's".into()];
        let text = render(&ScriptSpec {
            run_id: "abc123",
            run_dir: Path::new("/shared/runs/abc123"),
            attempt: 2,
            options: &options,
            gpus: 2,
            argv: &argv,
            confined: false,
        });
        for line in [
            "#SBATCH --partition=gpu",
            "#SBATCH --account=lab",
            "#SBATCH --time=4:00:00",
            "#SBATCH --cpus-per-task=8",
            "#SBATCH --mem=32G",
            "#SBATCH --gres=gpu:2",
            "#SBATCH --constraint=a100",
            "#SBATCH --output=/shared/runs/abc123/output.log",
            "#SBATCH --open-mode=append",
            "#SBATCH --no-requeue",
        ] {
            assert!(text.lines().any(|l| l == line), "missing {line}:\n{text}");
        }
        assert!(text.contains(r"'trainyard' 'train' 'it'\''s'"), "{text}");
        assert!(
            !text.contains("#SBATCH --qos"),
            "unset options are left to Slurm"
        );
        // Every #SBATCH line comes before the first command, or sbatch ignores it.
        let first_cmd = text.lines().position(|l| !l.starts_with('#')).unwrap();
        assert!(text
            .lines()
            .skip(first_cmd)
            .all(|l| !l.starts_with("#SBATCH")));
    }

    #[test]
    fn a_cpu_run_asks_for_no_gpu() {
        let text = render(&ScriptSpec {
            run_id: "r",
            run_dir: Path::new("/d"),
            attempt: 1,
            options: &SlurmOptions::default(),
            gpus: 0,
            argv: &["true".to_string()],
            confined: true,
        });
        assert!(text.contains("export TMPDIR=\"$PWD/tmp\""), "{text}");
        assert!(!text.contains("--gres"), "{text}");
    }
}
