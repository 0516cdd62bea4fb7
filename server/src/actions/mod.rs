//! What a user can do to runs, written once: the API handlers and the dashboard pages both call
//! these functions with already validated input (`crate::validate`), so an action has one
//! implementation, one set of checks and one set of live events whichever way it arrives.

pub mod launch;
pub mod models;
pub mod paths;
pub mod runs;

pub use launch::{launch_run, CommandSpec, LaunchRequest, Resources};
pub use runs::{delete_run, edit_run, resume_run, stop_run};
