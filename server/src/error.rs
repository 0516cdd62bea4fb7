//! The one error of the use cases (`actions`, `sweeps`, `search`, `access`): what went wrong, in
//! the domain's words. It knows no status code: each edge picks one (the API's
//! `http::error::ApiError`, the pages' error, MLflow's own codes), from this one mapping.

use crate::launcher::LaunchError;
use crate::store::StoreError;
use crate::validate::Invalid;

/// Seconds a client is asked to wait before retrying a write the full disk refused.
pub const STORAGE_RETRY_AFTER_S: u32 = 60;

/// Seconds a client is asked to wait before retrying while the database is unreachable.
pub const UNAVAILABLE_RETRY_AFTER_S: u32 = 5;

/// Seconds a client is asked to wait before retrying while Slurm cannot be reached.
pub const SLURM_RETRY_AFTER_S: u32 = 10;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A value the client sent is refused: which field, and why (a 422 at the edge).
    #[error(transparent)]
    Invalid(#[from] Invalid),
    /// A request that cannot be carried out as it is written, naming the field when there is
    /// one: a sweep spec whose trials cannot run here, a search parameter (a 400 at the edge).
    #[error("{message}")]
    Malformed {
        field: Option<String>,
        message: String,
    },
    /// A run search's `q` that does not parse: the byte offset of the problem in the filter
    /// text (a 400 with its own code).
    #[error("invalid filter at position {position}: {message}")]
    InvalidFilter { position: usize, message: String },
    /// The target does not exist, or the caller may not read it: the same answer.
    #[error("{0}")]
    NotFound(String),
    /// The target's state does not allow this now (a run that is still active, a sweep that
    /// ended).
    #[error("{message}")]
    Conflict {
        field: Option<String>,
        message: String,
    },
    /// The caller may see the target but not do this, or the server's settings do not allow
    /// it; in plain words.
    #[error("{message}")]
    Forbidden {
        field: Option<String>,
        message: String,
    },
    /// Too many failed attempts (sign-ins): the same request may succeed after `retry_after`
    /// seconds.
    #[error("{message}")]
    Throttled { message: String, retry_after: u64 },
    /// No valid credential: sign in, or send a valid token.
    #[error("sign in, or send a valid bearer token")]
    SignIn,
    /// The launcher refused or failed to start a run.
    #[error(transparent)]
    Launch(#[from] LaunchError),
    /// The store refused or failed: a conflict, a refused value, the database unavailable or
    /// out of space (with the retry hints above), a fault.
    #[error(transparent)]
    Store(StoreError),
    /// A fault of the server itself; its cause chain is kept for the log (`{:#}`), and no edge
    /// shows it to a client.
    #[error("internal error")]
    Internal(#[source] anyhow::Error),
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    pub fn forbidden(message: impl Into<String>) -> Self {
        Error::Forbidden {
            field: None,
            message: message.into(),
        }
    }

    pub fn conflict(message: impl Into<String>) -> Self {
        Error::Conflict {
            field: None,
            message: message.into(),
        }
    }

    pub fn internal(cause: impl Into<anyhow::Error>) -> Self {
        Error::Internal(cause.into())
    }

    /// Seconds after which the same request may succeed, for a failure that passes by itself.
    pub fn retry_after(&self) -> Option<u32> {
        match self {
            Error::Store(StoreError::StorageFull(_)) => Some(STORAGE_RETRY_AFTER_S),
            Error::Store(StoreError::Unavailable(_)) => Some(UNAVAILABLE_RETRY_AFTER_S),
            Error::Launch(LaunchError::SlurmUnavailable(_)) => Some(SLURM_RETRY_AFTER_S),
            _ => None,
        }
    }

    /// What may be said of the failure where no client is answering (a sweep's trial that
    /// could not be launched): the message; for a fault of the server its cause chain (our own
    /// code's words: a join or I/O error); for the database's a pointer to the log, since its
    /// messages may quote stored values.
    pub fn reason(&self) -> String {
        match self {
            Error::Internal(cause) => format!("internal error: {cause:#}"),
            Error::Store(StoreError::Database(_) | StoreError::Migrate(_)) => {
                "a database error (the server's log has its cause)".into()
            }
            Error::Launch(LaunchError::Io(_)) => {
                "an I/O error starting it (the server's log has its cause)".into()
            }
            other => other.to_string(),
        }
    }
}

/// A missing row is "not found" in the store's own words (`` run `x` not found ``).
impl From<StoreError> for Error {
    fn from(e: StoreError) -> Self {
        match e {
            StoreError::NotFound { .. } => Error::NotFound(e.to_string()),
            other => Error::Store(other),
        }
    }
}

impl From<tokio::task::JoinError> for Error {
    fn from(e: tokio::task::JoinError) -> Self {
        Error::Internal(e.into())
    }
}

impl From<crate::registry::RegistryError> for Error {
    fn from(e: crate::registry::RegistryError) -> Self {
        use crate::registry::RegistryError;
        match e {
            RegistryError::NotFound(message) => Error::NotFound(message),
            RegistryError::Invalid(invalid) => Error::Invalid(invalid),
            RegistryError::Store(e) => e.into(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_reason_keeps_the_cause_of_a_fault_and_the_words_of_a_refusal() {
        let fault = Error::internal(
            anyhow::anyhow!("No space left on device").context("writing the run's config.json"),
        );
        assert_eq!(
            fault.reason(),
            "internal error: writing the run's config.json: No space left on device"
        );
        let refused: Error =
            Invalid::new("resources.gpus", "asks for 4 GPUs, this server has 0").into();
        assert_eq!(refused.reason(), "asks for 4 GPUs, this server has 0");
        // A database's own message may quote stored values: the log has it, the reason not.
        let database = Error::from(StoreError::from(sqlx::Error::Protocol("value 'x'".into())));
        assert!(
            !database.reason().contains("value 'x'"),
            "{}",
            database.reason()
        );
    }

    #[test]
    fn a_missing_row_is_not_found_in_the_stores_words() {
        let e = Error::from(StoreError::NotFound {
            entity: "run",
            id: "ab12".into(),
        });
        assert!(
            matches!(&e, Error::NotFound(m) if m == "run `ab12` not found"),
            "{e:?}"
        );
    }
}
