//! Black-box tests of the REST API: a real server per test, a fresh database per test.
//! Scenarios wrapped in `on_both_backends!` run once on SQLite and once on Postgres.

mod helpers;

mod auth;
mod cli;
mod errors;
mod events;
mod experiments;
mod experts;
mod limits;
mod metrics;
mod openapi;
mod runs;
