//! Black-box tests of the REST API: a real server per test, a fresh database per test.
//! Scenarios wrapped in `on_both_backends!` run once on SQLite and once on Postgres.

#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a failed setup step is a failed test

mod helpers;
#[allow(dead_code)]
#[path = "../kit/mod.rs"]
mod kit;

mod access;
mod amplification;
mod auth;
mod bounds;
mod charts;
mod cli;
mod ended;
mod errors;
mod events;
mod experiments;
mod experts;
mod export;
mod exposure;
mod launch_paths;
mod limits;
mod liveness;
mod metrics;
mod mlflow;
mod model_files;
mod models;
mod nul_bodies;
mod openapi;
mod reported_exit;
mod runs;
mod search_keys;
mod stream_caps;
mod sweep_failures;
mod sweeps;
