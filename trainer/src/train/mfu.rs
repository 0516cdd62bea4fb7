//! Model FLOPs utilization (`perf/mfu`): the model FLOPs a step really needed per second, over the
//! device's dense bf16 peak — the number that says how much of the GPU training uses.

use std::process::Command;

/// Dense (no sparsity) bf16 tensor-core peak FLOP/s from the vendors' datasheets, matched in
/// order against the name `nvidia-smi` prints: the PCIe and NVL parts run lower clocks and fewer
/// SMs than the SXM part of the same name ("NVIDIA H100 80GB HBM3" is the SXM H100).
const PEAKS: [(&str, f64); 8] = [
    ("H100 PCIe", 756.5e12),
    ("H100 NVL", 835.5e12),
    ("H200 NVL", 835.5e12),
    ("H200", 989.4e12),
    ("H100", 989.4e12),
    ("A100", 312e12),
    ("L40S", 362.05e12),
    ("A10G", 70e12),
];

/// Peak bf16 FLOP/s of a GPU by its marketing name (as `nvidia-smi` prints it).
pub fn peak_bf16_flops(gpu_name: &str) -> Option<f64> {
    PEAKS
        .iter()
        .find(|(model, _)| gpu_name.contains(model))
        .map(|(_, peak)| *peak)
}

/// Fraction of `peak` that `tokens_per_s` tokens of `flops_per_token` each amount to.
pub fn mfu(tokens_per_s: f64, flops_per_token: f64, peak: f64) -> f64 {
    tokens_per_s * flops_per_token / peak
}

/// The physical GPU index `nvidia-smi` knows for CUDA ordinal `ordinal`: the launcher narrows a
/// run to its GPUs with CUDA_VISIBLE_DEVICES, which renumbers them from 0 for CUDA but not for
/// nvidia-smi.
pub fn physical_index(ordinal: usize, visible: Option<&str>) -> String {
    visible
        .and_then(|v| v.split(',').nth(ordinal))
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| ordinal.to_string())
}

/// The peak to measure against: `TRAINYARD_PEAK_FLOPS` when set (any hardware), else the
/// datasheet peak of the CUDA device `ordinal`; `None` on the CPU or for an unknown GPU.
pub fn device_peak(cuda_ordinal: Option<usize>) -> Option<f64> {
    if let Some(peak) = std::env::var("TRAINYARD_PEAK_FLOPS")
        .ok()
        .and_then(|v| v.parse::<f64>().ok())
        .filter(|p| *p > 0.0)
    {
        return Some(peak);
    }
    let ordinal = cuda_ordinal?;
    let visible = std::env::var("CUDA_VISIBLE_DEVICES").ok();
    let index = physical_index(ordinal, visible.as_deref());
    let out = Command::new("nvidia-smi")
        .args(["--query-gpu=name", "--format=csv,noheader", "-i", &index])
        .output()
        .ok()?;
    let name = String::from_utf8_lossy(&out.stdout).trim().to_string();
    let peak = peak_bf16_flops(&name);
    if peak.is_none() {
        tracing::info!(gpu = %name, "no bf16 peak known for this GPU: perf/mfu not reported (set TRAINYARD_PEAK_FLOPS)");
    }
    peak
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn peaks_are_found_by_the_names_nvidia_smi_prints() {
        assert_eq!(peak_bf16_flops("NVIDIA H100 80GB HBM3"), Some(989.4e12));
        assert_eq!(peak_bf16_flops("NVIDIA H200"), Some(989.4e12));
        assert_eq!(peak_bf16_flops("NVIDIA H100 PCIe"), Some(756.5e12));
        assert_eq!(peak_bf16_flops("NVIDIA H100 NVL"), Some(835.5e12));
        assert_eq!(peak_bf16_flops("NVIDIA A100-SXM4-80GB"), Some(312e12));
        assert_eq!(peak_bf16_flops("Some Other Accelerator"), None);
    }

    #[test]
    fn mfu_is_achieved_model_flops_over_the_peak() {
        // GPT-2 124M at ~0.85 GFLOP/token and 400k tokens/s on a 989 TFLOP/s part: ~34%.
        let m = mfu(400_000.0, 0.85e9, 989.4e12);
        assert!((m - 0.3436).abs() < 1e-3, "{m}");
    }

    #[test]
    fn a_cuda_ordinal_maps_through_cuda_visible_devices() {
        assert_eq!(physical_index(0, None), "0");
        assert_eq!(physical_index(1, Some("2,3")), "3");
        assert_eq!(physical_index(0, Some("5")), "5");
        assert_eq!(physical_index(2, Some("5")), "2");
    }
}
