//! The one error type of the HTTP API. Every failure becomes `{"error": {code, message, field?}}`:
//! 4xx for a client's mistake (naming the field when there is one), a logged 500 for real faults
//! that never shows the client what went wrong inside.

use axum::extract::rejection::{BytesRejection, JsonRejection, PathRejection, QueryRejection};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::Serialize;

use crate::error::Error;
use crate::store::StoreError;

#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    /// Malformed request: bad JSON syntax, a query parameter that does not parse.
    #[error("{message}")]
    BadRequest {
        field: Option<String>,
        message: String,
    },
    /// `q=` did not parse; `position` is the byte offset of the problem in the filter text.
    #[error("invalid filter at position {position}: {message}")]
    InvalidFilter { position: usize, message: String },
    /// Well-formed JSON whose content is wrong: wrong types, non-finite values, too many points.
    #[error("{message}")]
    Unprocessable {
        field: Option<String>,
        message: String,
    },
    #[error("{0}")]
    NotFound(String),
    #[error("{message}")]
    Conflict {
        field: Option<String>,
        message: String,
    },
    #[error("method {0} is not allowed here")]
    MethodNotAllowed(String),
    #[error("{0}")]
    PayloadTooLarge(String),
    #[error("{0}")]
    UnsupportedMediaType(String),
    #[error("sign in, or send a valid bearer token")]
    Unauthorized,
    /// Too many attempts (failed sign-ins); retry after `retry_after` seconds (429).
    #[error("{message}")]
    TooManyRequests { message: String, retry_after: u64 },
    /// The database has no room for a write: nothing of the request was stored (507).
    #[error("{0}")]
    InsufficientStorage(String),
    /// The server cannot serve the request now, e.g. its database is unreachable (503); the
    /// client should retry after `retry_after` seconds.
    #[error("{message}")]
    Unavailable { message: String, retry_after: u32 },
    /// The `Host` is not a name of this server (the defence against DNS rebinding).
    #[error("{0}")]
    HostNotAllowed(String),
    /// A browser request from another site tried to change something.
    #[error("{0}")]
    CrossSite(String),
    /// The client stopped sending the request body for longer than the body timeout.
    #[error("{0}")]
    RequestTimeout(String),
    /// The server's settings do not allow this request (e.g. command launches are off).
    #[error("{message}")]
    Forbidden {
        field: Option<String>,
        message: String,
    },
    /// A real fault; the cause chain is logged, the client sees only "internal error".
    #[error("internal error")]
    Internal(#[source] anyhow::Error),
}

/// The JSON body of every error response.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct ErrorBody {
    pub error: ErrorDetail,
}

#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct ErrorDetail {
    /// Stable machine-readable code, e.g. `not_found`, `unprocessable`, `invalid_filter`.
    pub code: &'static str,
    pub message: String,
    /// The request field at fault, when there is one (`points[3].value`, `q`, `limit`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub field: Option<String>,
}

impl ApiError {
    pub fn bad_request(field: &str, message: impl Into<String>) -> Self {
        ApiError::BadRequest {
            field: Some(field.to_string()),
            message: message.into(),
        }
    }

    pub fn unprocessable(field: impl Into<String>, message: impl Into<String>) -> Self {
        ApiError::Unprocessable {
            field: Some(field.into()),
            message: message.into(),
        }
    }

    pub fn status(&self) -> StatusCode {
        match self {
            ApiError::BadRequest { .. } | ApiError::InvalidFilter { .. } => StatusCode::BAD_REQUEST,
            ApiError::Unprocessable { .. } => StatusCode::UNPROCESSABLE_ENTITY,
            ApiError::NotFound(_) => StatusCode::NOT_FOUND,
            ApiError::Conflict { .. } => StatusCode::CONFLICT,
            ApiError::MethodNotAllowed(_) => StatusCode::METHOD_NOT_ALLOWED,
            ApiError::PayloadTooLarge(_) => StatusCode::PAYLOAD_TOO_LARGE,
            ApiError::UnsupportedMediaType(_) => StatusCode::UNSUPPORTED_MEDIA_TYPE,
            ApiError::Unauthorized => StatusCode::UNAUTHORIZED,
            ApiError::TooManyRequests { .. } => StatusCode::TOO_MANY_REQUESTS,
            ApiError::InsufficientStorage(_) => StatusCode::INSUFFICIENT_STORAGE,
            ApiError::Unavailable { .. } => StatusCode::SERVICE_UNAVAILABLE,
            ApiError::HostNotAllowed(_) => StatusCode::MISDIRECTED_REQUEST,
            ApiError::CrossSite(_) => StatusCode::FORBIDDEN,
            ApiError::RequestTimeout(_) => StatusCode::REQUEST_TIMEOUT,
            ApiError::Forbidden { .. } => StatusCode::FORBIDDEN,
            ApiError::Internal(_) => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }

    fn code(&self) -> &'static str {
        match self {
            ApiError::BadRequest { .. } => "bad_request",
            ApiError::InvalidFilter { .. } => "invalid_filter",
            ApiError::Unprocessable { .. } => "unprocessable",
            ApiError::NotFound(_) => "not_found",
            ApiError::Conflict { .. } => "conflict",
            ApiError::MethodNotAllowed(_) => "method_not_allowed",
            ApiError::PayloadTooLarge(_) => "payload_too_large",
            ApiError::UnsupportedMediaType(_) => "unsupported_media_type",
            ApiError::Unauthorized => "unauthorized",
            ApiError::TooManyRequests { .. } => "too_many_requests",
            ApiError::InsufficientStorage(_) => "insufficient_storage",
            ApiError::Unavailable { .. } => "unavailable",
            ApiError::HostNotAllowed(_) => "host_not_allowed",
            ApiError::CrossSite(_) => "cross_site",
            ApiError::RequestTimeout(_) => "request_timeout",
            ApiError::Forbidden { .. } => "forbidden",
            ApiError::Internal(_) => "internal",
        }
    }

    /// The request field at fault, when there is one.
    pub fn field(&self) -> Option<String> {
        match self {
            ApiError::BadRequest { field, .. }
            | ApiError::Unprocessable { field, .. }
            | ApiError::Conflict { field, .. }
            | ApiError::Forbidden { field, .. } => field.clone(),
            ApiError::InvalidFilter { .. } => Some("q".to_string()),
            _ => None,
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        if let ApiError::Internal(cause) = &self {
            // `{:#}` prints the whole cause chain on one line.
            tracing::error!(error = %format!("{cause:#}"), "request failed with an internal error");
        }
        let body = ErrorBody {
            error: ErrorDetail {
                code: self.code(),
                message: self.to_string(),
                field: self.field(),
            },
        };
        let mut response = (self.status(), Json(body)).into_response();
        let headers = response.headers_mut();
        match &self {
            ApiError::Unauthorized => {
                headers.insert(
                    axum::http::header::WWW_AUTHENTICATE,
                    axum::http::HeaderValue::from_static("Bearer"),
                );
            }
            ApiError::Unavailable { retry_after, .. } => {
                headers.insert(axum::http::header::RETRY_AFTER, (*retry_after).into());
            }
            ApiError::TooManyRequests { retry_after, .. } => {
                headers.insert(axum::http::header::RETRY_AFTER, (*retry_after).into());
            }
            ApiError::InsufficientStorage(_) => {
                headers.insert(
                    axum::http::header::RETRY_AFTER,
                    STORAGE_RETRY_AFTER_S.into(),
                );
            }
            _ => {}
        }
        response
    }
}

pub use crate::error::{STORAGE_RETRY_AFTER_S, UNAVAILABLE_RETRY_AFTER_S};

/// The one place a use case's error gets its status, code and body.
impl From<Error> for ApiError {
    fn from(e: Error) -> Self {
        match e {
            Error::Invalid(invalid) => invalid.into(),
            Error::Malformed { field, message } => ApiError::BadRequest { field, message },
            Error::InvalidFilter { position, message } => {
                ApiError::InvalidFilter { position, message }
            }
            Error::NotFound(m) => ApiError::NotFound(m),
            Error::Conflict { field, message } => ApiError::Conflict { field, message },
            Error::Forbidden { field, message } => ApiError::Forbidden { field, message },
            Error::Throttled {
                message,
                retry_after,
            } => ApiError::TooManyRequests {
                message,
                retry_after,
            },
            Error::SignIn => ApiError::Unauthorized,
            Error::Launch(e) => e.into(),
            Error::Store(e) => e.into(),
            Error::Internal(cause) => ApiError::Internal(cause),
        }
    }
}

impl From<StoreError> for ApiError {
    fn from(err: StoreError) -> Self {
        match err {
            StoreError::StorageFull(cause) => {
                tracing::error!(error = %cause, "a write failed: the database is out of disk space");
                ApiError::InsufficientStorage(
                    "the server's database is out of disk space: nothing of this request was \
                     stored; retry once space has been freed"
                        .into(),
                )
            }
            StoreError::NotFound { .. } => ApiError::NotFound(err.to_string()),
            StoreError::Conflict { field, message } => ApiError::Conflict {
                field: field.map(str::to_string),
                message,
            },
            StoreError::Rejected(invalid) => invalid.into(),
            StoreError::Invalid { field, message } => ApiError::Unprocessable {
                field: Some(field.to_string()),
                message: format!("{field}: {message}"),
            },
            StoreError::Unavailable(cause) => {
                tracing::error!(error = %cause, "the database is unavailable");
                ApiError::Unavailable {
                    message: "the server's database is unavailable; retry later".into(),
                    retry_after: UNAVAILABLE_RETRY_AFTER_S,
                }
            }
            StoreError::Database(_) | StoreError::Migrate(_) => ApiError::Internal(err.into()),
        }
    }
}

/// Every refused value is a 422 naming the field, wherever it entered.
impl From<crate::validate::Invalid> for ApiError {
    fn from(e: crate::validate::Invalid) -> Self {
        ApiError::Unprocessable {
            field: Some(e.field),
            message: e.message,
        }
    }
}

impl From<crate::launcher::LaunchError> for ApiError {
    fn from(e: crate::launcher::LaunchError) -> Self {
        use crate::launcher::LaunchError;
        match e {
            LaunchError::TooManyGpus { .. } => {
                ApiError::unprocessable("resources.gpus", e.to_string())
            }
            LaunchError::NothingToRun => ApiError::unprocessable("config", e.to_string()),
            LaunchError::NotActive(_)
            | LaunchError::NotLaunched(_)
            | LaunchError::NotResumable(_) => ApiError::Conflict {
                field: None,
                message: e.to_string(),
            },
            LaunchError::Invalid(invalid) => invalid.into(),
            LaunchError::SlurmUnavailable(message) => ApiError::Unavailable {
                message,
                retry_after: crate::error::SLURM_RETRY_AFTER_S,
            },
            LaunchError::Store(s) => s.into(),
            LaunchError::Io(io) => ApiError::Internal(io.into()),
        }
    }
}

impl From<JsonRejection> for ApiError {
    fn from(rejection: JsonRejection) -> Self {
        let message = rejection.body_text();
        match rejection {
            JsonRejection::JsonDataError(_) => ApiError::Unprocessable {
                field: field_from_serde_message(&message),
                message,
            },
            JsonRejection::JsonSyntaxError(_) => ApiError::BadRequest {
                field: None,
                message,
            },
            JsonRejection::MissingJsonContentType(_) => ApiError::UnsupportedMediaType(message),
            _ if rejection.status() == StatusCode::PAYLOAD_TOO_LARGE => {
                ApiError::PayloadTooLarge("request body is larger than the server accepts".into())
            }
            _ => ApiError::BadRequest {
                field: None,
                message,
            },
        }
    }
}

/// Reading a request body failed: too large, too slow (the body timeout or its total deadline),
/// or the connection broke.
impl From<BytesRejection> for ApiError {
    fn from(rejection: BytesRejection) -> Self {
        if rejection.status() == StatusCode::PAYLOAD_TOO_LARGE {
            return ApiError::PayloadTooLarge(
                "request body is larger than the server accepts".into(),
            );
        }
        let mut cause: Option<&(dyn std::error::Error + 'static)> = Some(&rejection);
        while let Some(err) = cause {
            if let Some(late) = err.downcast_ref::<crate::http::serve::BodyDeadlineExceeded>() {
                return ApiError::RequestTimeout(late.to_string());
            }
            if err.is::<tower_http::timeout::TimeoutError>() {
                return ApiError::RequestTimeout(
                    "the request body did not arrive in time; send it without pausing".into(),
                );
            }
            cause = err.source();
        }
        ApiError::BadRequest {
            field: None,
            message: rejection.body_text(),
        }
    }
}

impl From<QueryRejection> for ApiError {
    fn from(rejection: QueryRejection) -> Self {
        let message = rejection.body_text();
        ApiError::BadRequest {
            field: field_from_serde_message(&message),
            message,
        }
    }
}

impl From<PathRejection> for ApiError {
    fn from(rejection: PathRejection) -> Self {
        ApiError::BadRequest {
            field: None,
            message: rejection.body_text(),
        }
    }
}

/// axum renders data errors as `Failed to deserialize ...: points[0].value: invalid type ...`;
/// the path before the serde message names the field.
fn field_from_serde_message(message: &str) -> Option<String> {
    let (_, rest) = message.split_once(": ")?;
    let (path, _) = rest.split_once(": ")?;
    let looks_like_path = !path.is_empty()
        && path
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "_.[]".contains(c));
    looks_like_path.then(|| path.to_string())
}

/// A refused run search names its parameter (`q` keeps the filter's own error code).
impl From<crate::search::SearchError> for ApiError {
    fn from(e: crate::search::SearchError) -> Self {
        Error::from(e).into()
    }
}

impl From<crate::search::SearchOrStoreError> for ApiError {
    fn from(e: crate::search::SearchOrStoreError) -> Self {
        Error::from(e).into()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_serde_path_in_a_rejection_message_becomes_the_field() {
        let msg = "Failed to deserialize the JSON body into the target type: points[0].value: \
                   invalid type: string \"x\", expected f64 at line 1 column 40";
        assert_eq!(
            field_from_serde_message(msg).as_deref(),
            Some("points[0].value")
        );
    }

    #[test]
    fn a_message_without_a_path_names_no_field() {
        let msg = "Failed to deserialize the JSON body into the target type: missing field `name` at line 1 column 2";
        assert_eq!(field_from_serde_message(msg), None);
    }

    #[test]
    fn a_database_fault_is_a_500_that_hides_its_details() {
        let err: ApiError = StoreError::from(sqlx::Error::RowNotFound).into();
        assert_eq!(err.status(), StatusCode::INTERNAL_SERVER_ERROR);
        assert_eq!(err.to_string(), "internal error");
    }

    #[test]
    fn an_unreachable_database_is_a_503_that_says_when_to_retry() {
        let refused = std::io::Error::from(std::io::ErrorKind::ConnectionRefused);
        for cause in [
            sqlx::Error::PoolTimedOut,
            sqlx::Error::PoolClosed,
            sqlx::Error::Io(refused),
        ] {
            let response = ApiError::from(StoreError::from(cause)).into_response();
            assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE);
            assert_eq!(
                response.headers().get("retry-after").map(|v| v.as_bytes()),
                Some(UNAVAILABLE_RETRY_AFTER_S.to_string().as_bytes())
            );
        }
    }

    #[test]
    fn each_domain_error_gets_its_status_and_code_at_the_edge() {
        use crate::validate::Invalid;
        let cases: Vec<(Error, StatusCode, &str)> = vec![
            (
                Invalid::new("name", "too long").into(),
                StatusCode::UNPROCESSABLE_ENTITY,
                "unprocessable",
            ),
            (
                Error::Malformed {
                    field: Some("spec".into()),
                    message: "no".into(),
                },
                StatusCode::BAD_REQUEST,
                "bad_request",
            ),
            (
                Error::InvalidFilter {
                    position: 3,
                    message: "no".into(),
                },
                StatusCode::BAD_REQUEST,
                "invalid_filter",
            ),
            (
                Error::NotFound("run `x` not found".into()),
                StatusCode::NOT_FOUND,
                "not_found",
            ),
            (Error::conflict("busy"), StatusCode::CONFLICT, "conflict"),
            (Error::forbidden("no"), StatusCode::FORBIDDEN, "forbidden"),
            (Error::SignIn, StatusCode::UNAUTHORIZED, "unauthorized"),
            (
                Error::Throttled {
                    message: "wait".into(),
                    retry_after: 3,
                },
                StatusCode::TOO_MANY_REQUESTS,
                "too_many_requests",
            ),
            (
                StoreError::NotFound {
                    entity: "run",
                    id: "x".into(),
                }
                .into(),
                StatusCode::NOT_FOUND,
                "not_found",
            ),
            (
                Error::internal(anyhow::anyhow!("secret cause")),
                StatusCode::INTERNAL_SERVER_ERROR,
                "internal",
            ),
        ];
        for (error, status, code) in cases {
            let shown = error.to_string();
            let api = ApiError::from(error);
            assert_eq!((api.status(), api.code()), (status, code), "{shown}");
            assert!(!api.to_string().contains("secret cause"));
        }
    }

    #[test]
    fn a_failure_that_passes_by_itself_keeps_its_retry_hint_at_the_edge() {
        let refused = std::io::Error::from(std::io::ErrorKind::ConnectionRefused);
        for error in [
            Error::from(StoreError::from(sqlx::Error::Io(refused))),
            Error::Launch(crate::launcher::LaunchError::SlurmUnavailable(
                "down".into(),
            )),
        ] {
            let hint = error.retry_after().expect("a retry hint");
            let response = ApiError::from(error).into_response();
            assert_eq!(
                response.headers().get("retry-after").map(|v| v.as_bytes()),
                Some(hint.to_string().as_bytes())
            );
        }
    }
}
