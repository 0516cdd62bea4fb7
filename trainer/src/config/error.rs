//! The one error type of configuration loading, overriding and validation.

use std::path::PathBuf;

/// A configuration problem. Every variant that concerns one setting carries its full key path
/// (`training.learning_rate`) so CLI messages and HTTP 4xx bodies can name the field.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("{key}: unknown key{}", suggestion_suffix(.suggestion))]
    UnknownKey {
        key: String,
        suggestion: Option<String>,
    },
    #[error("{key}: {message}")]
    InvalidType { key: String, message: String },
    #[error("{key}: {message}")]
    InvalidValue { key: String, message: String },
    #[error("--set `{arg}`: {message}")]
    BadOverride { arg: String, message: String },
    #[error("YAML syntax error: {0}")]
    Syntax(String),
    #[error("cannot read config file {path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("unknown config `{name}`: not a file and not a profile (profiles: {profiles})")]
    UnknownProfile { name: String, profiles: String },
}

fn suggestion_suffix(suggestion: &Option<String>) -> String {
    match suggestion {
        Some(s) => format!("; did you mean {s}?"),
        None => String::new(),
    }
}

impl ConfigError {
    /// The key path the error is about, when it concerns one setting.
    pub fn key(&self) -> Option<&str> {
        match self {
            ConfigError::UnknownKey { key, .. }
            | ConfigError::InvalidType { key, .. }
            | ConfigError::InvalidValue { key, .. } => Some(key),
            _ => None,
        }
    }

    pub(crate) fn invalid(key: &str, message: impl Into<String>) -> Self {
        ConfigError::InvalidValue {
            key: key.to_string(),
            message: message.into(),
        }
    }
}
