//! GPU inventory: what the local executor may hand out.
//!
//! Discovered with `nvidia-smi` unless the operator lists the devices (`serve --gpus 0,1`), which
//! is also how tests get a fake inventory on a machine without GPUs.

use serde::Serialize;
use std::process::Command;

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Gpu {
    /// Index as CUDA numbers it (the value put in `CUDA_VISIBLE_DEVICES`).
    pub index: u32,
    pub name: String,
    pub memory_mb: Option<u64>,
}

/// Parses `nvidia-smi --query-gpu=index,name,memory.total --format=csv,noheader` output
/// (`0, NVIDIA H100 80GB HBM3, 81559 MiB`); lines that do not parse are skipped.
pub fn parse_nvidia_smi(text: &str) -> Vec<Gpu> {
    text.lines()
        .filter_map(|line| {
            let mut fields = line.split(',').map(str::trim);
            let index = fields.next()?.parse().ok()?;
            let name = fields.next()?.to_string();
            let memory_mb = fields
                .next()
                .and_then(|m| m.split_whitespace().next())
                .and_then(|m| m.parse().ok());
            Some(Gpu {
                index,
                name,
                memory_mb,
            })
        })
        .collect()
}

/// Asks `nvidia-smi`; no binary, an error or no devices all mean "no GPUs".
pub fn discover() -> Vec<Gpu> {
    let output = Command::new("nvidia-smi")
        .args([
            "--query-gpu=index,name,memory.total",
            "--format=csv,noheader",
        ])
        .output();
    match output {
        Ok(out) if out.status.success() => parse_nvidia_smi(&String::from_utf8_lossy(&out.stdout)),
        _ => Vec::new(),
    }
}

/// Parses an operator's list (`0,1` or `2, 3`) into a fake-or-forced inventory.
pub fn parse_list(list: &str) -> Result<Vec<Gpu>, String> {
    let mut gpus: Vec<Gpu> = Vec::new();
    for part in list.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let index: u32 = part
            .parse()
            .map_err(|_| format!("gpus: `{part}` is not a GPU index (expected e.g. 0,1)"))?;
        if gpus.iter().any(|g| g.index == index) {
            return Err(format!("gpus: index {index} is listed twice"));
        }
        gpus.push(Gpu {
            index,
            name: format!("gpu{index}"),
            memory_mb: None,
        });
    }
    Ok(gpus)
}

/// One utilization sample of a GPU.
#[derive(Debug, Clone, PartialEq)]
pub struct GpuSample {
    pub index: u32,
    pub utilization_pct: f64,
    pub memory_used_mb: f64,
}

/// Parses `nvidia-smi --query-gpu=index,utilization.gpu,memory.used --format=csv,noheader,nounits`.
pub fn parse_samples(text: &str) -> Vec<GpuSample> {
    text.lines()
        .filter_map(|line| {
            let mut f = line.split(',').map(str::trim);
            Some(GpuSample {
                index: f.next()?.parse().ok()?,
                utilization_pct: f.next()?.parse().ok()?,
                memory_used_mb: f.next()?.parse().ok()?,
            })
        })
        .collect()
}

/// Samples the given GPUs (blocking: call from `spawn_blocking`). Empty when unavailable.
pub fn sample(indices: &[u32]) -> Vec<GpuSample> {
    if indices.is_empty() {
        return Vec::new();
    }
    let ids: Vec<String> = indices.iter().map(u32::to_string).collect();
    let output = Command::new("nvidia-smi")
        .arg(format!("--id={}", ids.join(",")))
        .args([
            "--query-gpu=index,utilization.gpu,memory.used",
            "--format=csv,noheader,nounits",
        ])
        .output();
    match output {
        Ok(out) if out.status.success() => parse_samples(&String::from_utf8_lossy(&out.stdout)),
        _ => Vec::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nvidia_smi_inventory_lines_become_gpus() {
        let text = "0, NVIDIA H100 80GB HBM3, 81559 MiB\n1, NVIDIA H100 80GB HBM3, 81559 MiB\n";
        let gpus = parse_nvidia_smi(text);
        assert_eq!(gpus.len(), 2);
        assert_eq!(gpus[1].index, 1);
        assert_eq!(gpus[0].name, "NVIDIA H100 80GB HBM3");
        assert_eq!(gpus[0].memory_mb, Some(81559));
    }

    #[test]
    fn garbage_from_nvidia_smi_means_no_gpus() {
        assert!(parse_nvidia_smi("No devices were found\n").is_empty());
    }

    #[test]
    fn an_operator_list_is_parsed_and_duplicates_are_refused() {
        let gpus = parse_list("0, 2").unwrap();
        assert_eq!(gpus.iter().map(|g| g.index).collect::<Vec<_>>(), [0, 2]);
        assert!(parse_list("0,0").unwrap_err().contains("twice"));
        assert!(parse_list("0,x").unwrap_err().contains("`x`"));
    }

    #[test]
    fn utilization_samples_are_parsed() {
        let s = parse_samples("0, 87, 10240\n1, 3, 512\n");
        assert_eq!(s.len(), 2);
        assert_eq!(s[0].utilization_pct, 87.0);
        assert_eq!(s[1].memory_used_mb, 512.0);
    }
}
