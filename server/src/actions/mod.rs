//! What a user can do to runs, written once: the API handlers and the dashboard pages both call
//! these functions with already validated input (`crate::validate`), so an action has one
//! implementation, one set of checks and one set of live events whichever way it arrives.

pub mod accounts;
pub mod admin;
pub mod create;
pub mod finetune;
pub mod launch;
pub mod models;
pub mod paths;
pub mod runs;
pub mod sample;
pub mod sharing;

pub use create::{create_run, TrackedRun};
pub use launch::{launch_run, CommandSpec, LaunchRequest, Resources};
pub use runs::{delete_run, edit_run, mark_ended, resume_run, stop_run};
