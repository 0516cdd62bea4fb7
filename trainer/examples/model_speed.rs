//! Forward + backward time of the benchmark shape (vocab 256, d 128, 4 layers, 4 heads,
//! context 128, batch 16), dense and with 8-expert top-2 MoE in every block.
//! Run: cargo run --release -p trainyard-trainer --example model_speed [threads]

use std::time::Instant;

use candle_core::{DType, Device, Tensor};
use candle_nn::{VarBuilder, VarMap};
use trainer::config::{ModelConfig, MoeConfig};
use trainer::model::{cross_entropy, init_weights, Gpt};

fn time_steps(cfg: &ModelConfig, steps: usize) -> candle_core::Result<f64> {
    let dev = Device::Cpu;
    let varmap = VarMap::new();
    let model = Gpt::new(cfg, VarBuilder::from_varmap(&varmap, DType::F32, &dev))?;
    init_weights(&varmap, cfg, 1)?;
    let (b, t) = (16, 128);
    let ids: Vec<u32> = (0..b * t).map(|i| ((i * 31 + 7) % 256) as u32).collect();
    let x = Tensor::from_vec(ids.clone(), (b, t), &dev)?;
    let y = Tensor::from_vec(ids.iter().map(|i| (i + 1) % 256).collect(), (b, t), &dev)?;
    let mut total = 0.0;
    for step in 0..steps + 2 {
        let start = Instant::now();
        let out = model.forward(&x, None)?;
        let mut loss = cross_entropy(&out.logits, &y)?;
        if let Some(aux) = out.aux_loss {
            loss = (loss + aux)?;
        }
        let _grads = loss.backward()?;
        if step >= 2 {
            total += start.elapsed().as_secs_f64();
        }
    }
    Ok(total / steps as f64)
}

fn main() -> candle_core::Result<()> {
    let threads = std::env::args().nth(1).unwrap_or_else(|| "2".to_string());
    // candle's CPU kernels read this when their thread pool starts.
    std::env::set_var("RAYON_NUM_THREADS", &threads);
    let dense = ModelConfig {
        vocab_size: 256,
        d_model: 128,
        n_layers: 4,
        n_heads: 4,
        d_ff: 512,
        max_seq_len: 128,
        ..ModelConfig::default()
    };
    let moe = ModelConfig {
        moe: Some(MoeConfig::default()),
        ..dense.clone()
    };
    let tokens = (16 * 128) as f64;
    for (name, cfg) in [("dense", &dense), ("moe 8x top-2", &moe)] {
        let s = time_steps(cfg, 10)?;
        println!(
            "{name:>13}: {:.1} ms per forward+backward, {:.0} tokens/s ({threads} threads)",
            s * 1e3,
            tokens / s
        );
    }
    Ok(())
}
