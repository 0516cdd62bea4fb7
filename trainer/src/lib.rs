//! Trainyard's trainer: GPT-style decoders on candle, from raw text to checkpoints.

pub mod checkpoint;
pub mod cli;
pub mod config;
pub mod data;
pub mod hf;
pub mod kernels;
pub mod model;
pub mod optim;
pub mod profile;
pub mod report;
pub mod sample;
pub mod train;
pub mod wire;
