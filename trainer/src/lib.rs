//! Trainyard's trainer: GPT-style decoders on candle, from raw text to checkpoints.

pub mod config;
pub mod data;
pub mod model;
pub mod wire;
