//! Trainyard's trainer: GPT-style decoders on candle, from raw text to checkpoints.

pub mod checkpoint;
pub mod config;
pub mod data;
pub mod optim;
pub mod report;
pub mod wire;
