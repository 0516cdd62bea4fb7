//! One forward pass and loss checked against an independent NumPy implementation
//! (`tests/reference/gpt_reference.py`) on weights given by a fixed formula.

#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a failed setup step is a failed test

use candle_core::{DType, Device, Tensor, D};
use candle_nn::{VarBuilder, VarMap};
use trainer::config::{Activation, ModelConfig, NormKind, PositionKind};
use trainer::model::{cross_entropy, Gpt};

const V: usize = 11;
const B: usize = 2;
const T: usize = 6;

fn config(variant: char) -> ModelConfig {
    let a = variant == 'a';
    ModelConfig {
        vocab_size: V,
        d_model: 8,
        n_layers: 2,
        n_heads: 2,
        d_ff: 16,
        max_seq_len: 8,
        position: if a {
            PositionKind::Learned
        } else {
            PositionKind::Rope
        },
        norm: if a {
            NormKind::LayerNorm
        } else {
            NormKind::RmsNorm
        },
        activation: if a {
            Activation::Gelu
        } else {
            Activation::Swiglu
        },
        bias: a,
        tie_embeddings: a,
        ..ModelConfig::default()
    }
}

/// Same formula as the Python script's `weights()`.
fn set_reference_weights(varmap: &VarMap) {
    let data = varmap.data().lock().unwrap();
    let mut names: Vec<&String> = data.keys().collect();
    names.sort();
    for (t, name) in names.into_iter().enumerate() {
        let var = &data[name];
        let t = t as f64;
        let values: Vec<f64> = (0..var.elem_count())
            .map(|j| {
                let j = j as f64;
                if name.ends_with(".bias") {
                    0.05 * (0.9 * j + t).cos()
                } else if name.split('.').any(|p| p.starts_with("ln_")) {
                    1.0 + 0.1 * (1.1 * j + t).sin()
                } else {
                    0.2 * (0.37 * j + 0.5 * t + 0.1).sin()
                }
            })
            .collect();
        let v = Tensor::from_vec(values, var.shape(), &Device::Cpu).unwrap();
        var.set(&v.to_dtype(var.dtype()).unwrap()).unwrap();
    }
}

fn run(variant: char, dtype: DType) -> (f64, Vec<f64>, Vec<f64>) {
    let dev = Device::Cpu;
    let varmap = VarMap::new();
    let model = Gpt::new(
        &config(variant),
        VarBuilder::from_varmap(&varmap, dtype, &dev),
    )
    .unwrap();
    set_reference_weights(&varmap);
    let n: Vec<u32> = (0..(B * T) as u32).collect();
    let idx: Vec<u32> = n.iter().map(|i| (3 + 7 * i) % V as u32).collect();
    let tgt: Vec<u32> = n.iter().map(|i| (1 + 5 * i) % V as u32).collect();
    let idx = Tensor::from_vec(idx, (B, T), &dev).unwrap();
    let tgt = Tensor::from_vec(tgt, (B, T), &dev).unwrap();
    let out = model.forward(&idx, None).unwrap();
    let loss = cross_entropy(&out.logits, &tgt).unwrap();
    let loss = loss
        .to_dtype(DType::F64)
        .unwrap()
        .to_scalar::<f64>()
        .unwrap();
    let logits = out.logits.to_dtype(DType::F64).unwrap();
    let first: Vec<f64> = logits
        .get(0)
        .unwrap()
        .get(0)
        .unwrap()
        .narrow(D::Minus1, 0, 3)
        .unwrap()
        .to_vec1()
        .unwrap();
    let last: Vec<f64> = logits
        .get(1)
        .unwrap()
        .get(5)
        .unwrap()
        .narrow(D::Minus1, V - 3, 3)
        .unwrap()
        .to_vec1()
        .unwrap();
    (loss, first, last)
}

fn assert_close(got: &[f64], want: &[f64], tol: f64, what: &str) {
    for (g, w) in got.iter().zip(want) {
        assert!((g - w).abs() < tol, "{what}: got {got:?}, want {want:?}");
    }
}

// Printed by `python3 tests/reference/gpt_reference.py` (NumPy, float64).
const REFERENCE: [(char, f64, [f64; 3], [f64; 3]); 2] = [
    (
        'a',
        2.6120702604697925,
        [
            -0.5727782894611972,
            0.41901980839661684,
            -0.25148170424800287,
        ],
        [
            0.06489183281109978,
            -0.05052888363531404,
            0.034504273226809136,
        ],
    ),
    (
        'b',
        2.5183432306774405,
        [
            0.15999720351024332,
            0.04955167642197835,
            -0.2574710309461068,
        ],
        [-0.9888129739288826, 1.075298446782995, -1.1264223281261616],
    ),
];

#[test]
fn forward_and_loss_match_an_independent_numpy_implementation_in_f64() {
    for (variant, loss, first, last) in REFERENCE {
        let (got_loss, got_first, got_last) = run(variant, DType::F64);
        assert_close(
            &[got_loss],
            &[loss],
            1e-10,
            &format!("variant {variant} loss"),
        );
        assert_close(
            &got_first,
            &first,
            1e-10,
            &format!("variant {variant} logits[0,0]"),
        );
        assert_close(
            &got_last,
            &last,
            1e-10,
            &format!("variant {variant} logits[1,5]"),
        );
    }
}

#[test]
fn the_f32_training_path_matches_the_reference_closely() {
    for (variant, loss, first, last) in REFERENCE {
        let (got_loss, got_first, got_last) = run(variant, DType::F32);
        assert_close(
            &[got_loss],
            &[loss],
            1e-5,
            &format!("variant {variant} loss"),
        );
        assert_close(
            &got_first,
            &first,
            1e-5,
            &format!("variant {variant} logits[0,0]"),
        );
        assert_close(
            &got_last,
            &last,
            1e-5,
            &format!("variant {variant} logits[1,5]"),
        );
    }
}
