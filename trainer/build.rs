//! With the `cuda` feature, compiles the trainer's CUDA kernels (src/kernels/cuda/kernels.cu) to
//! PTX with the same nvcc that builds candle's kernels, for `CUDA_COMPUTE_CAP` (default 90:
//! H100/H200). Without the feature it does nothing, so CPU builds need no CUDA toolkit.

use std::path::PathBuf;
use std::process::Command;

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-changed=src/kernels/cuda/kernels.cu");
    println!("cargo:rerun-if-env-changed=CUDA_COMPUTE_CAP");
    println!("cargo:rerun-if-env-changed=CUDA_HOME");
    if std::env::var_os("CARGO_FEATURE_CUDA").is_none() {
        return;
    }
    let nvcc = std::env::var_os("CUDA_HOME")
        .map(|home| PathBuf::from(home).join("bin").join("nvcc"))
        .filter(|p| p.exists())
        .unwrap_or_else(|| PathBuf::from("nvcc"));
    let cap = std::env::var("CUDA_COMPUTE_CAP").unwrap_or_else(|_| "90".to_string());
    let cap: String = cap.chars().filter(char::is_ascii_digit).collect();
    let Some(out_dir) = std::env::var_os("OUT_DIR") else {
        fail("cargo did not set OUT_DIR");
    };
    let out = PathBuf::from(out_dir).join("trainyard_kernels.ptx");
    let status = Command::new(&nvcc)
        .args(["--ptx", "-O3", "-std=c++17"])
        .arg(format!("--gpu-architecture=compute_{cap}"))
        .arg("src/kernels/cuda/kernels.cu")
        .arg("-o")
        .arg(&out)
        .status();
    match status {
        Ok(s) if s.success() => {}
        Ok(s) => fail(&format!("nvcc failed on src/kernels/cuda/kernels.cu ({s})")),
        Err(e) => fail(&format!(
            "the `cuda` feature needs nvcc (on PATH or in CUDA_HOME/bin): {e}; \
             scripts/build-cuda.sh sets up a toolkit"
        )),
    }
}

/// Stops the build with `message`.
fn fail(message: &str) -> ! {
    eprintln!("error: {message}");
    std::process::exit(1)
}
