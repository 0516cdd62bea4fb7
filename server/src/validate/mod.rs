//! Validate once, at the edge, into types: a handler or a page turns what a client sent into a
//! `Name`, `Tags` or `RunEdit` here, and everything behind it (actions, store) takes those
//! types, so a value cannot skip the check and a mistake has one message wherever it enters.
//!
//! Every refusal is an [`Invalid`]: the field (a path such as `tags.k` or `points[3].step`) and
//! the reason in plain words. The API answers it with 422 and the dashboard shows the same
//! message with the same status; 400 is kept for a request that cannot be read at all (JSON
//! syntax, a query string or filter that does not parse).

pub mod inputs;
pub mod limits;
pub mod points;
pub mod times;

use std::collections::{BTreeMap, BTreeSet};

use trainer::wire::RunPatch;

use limits::{
    check_len, check_tracked_config, MAX_NAME_LEN, MAX_NOTES_LEN, MAX_REASON_LEN, MAX_TAGS,
    MAX_TAG_VALUE_LEN,
};
use trainer::wire::RunStatus;

/// A value a client sent that is refused: which field, and why.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct Invalid {
    pub field: String,
    pub message: String,
}

impl Invalid {
    pub fn new(field: impl Into<String>, message: impl Into<String>) -> Self {
        Invalid {
            field: field.into(),
            message: message.into(),
        }
    }
}

/// A user-given name (experiment, run, tag key): trimmed, non-blank, at most
/// [`MAX_NAME_LEN`] bytes, one line without control characters.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Name(String);

impl Name {
    pub fn parse(field: &str, raw: &str) -> Result<Name, Invalid> {
        let name = raw.trim();
        if name.is_empty() {
            return Err(Invalid::new(field, format!("{field} must not be empty")));
        }
        check_len(field, name, MAX_NAME_LEN)?;
        if name.chars().any(char::is_control) {
            return Err(Invalid::new(
                field,
                format!("{field} must not contain control characters"),
            ));
        }
        Ok(Name(name.to_string()))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }

    pub fn into_string(self) -> String {
        self.0
    }
}

/// Tags: at most [`MAX_TAGS`], keys are names, values at most [`MAX_TAG_VALUE_LEN`] bytes.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Tags(BTreeMap<String, String>);

impl Tags {
    pub fn parse(raw: BTreeMap<String, String>) -> Result<Tags, Invalid> {
        if raw.len() > MAX_TAGS {
            return Err(Invalid::new(
                "tags",
                format!(
                    "tags has {} entries; at most {MAX_TAGS} are allowed",
                    raw.len()
                ),
            ));
        }
        let mut tags = BTreeMap::new();
        for (key, value) in raw {
            let key = Name::parse("tags", &key)
                .map_err(|e| Invalid::new("tags", e.message.replacen("tags", "a tag key", 1)))?;
            check_len(&format!("tags.{}", key.as_str()), &value, MAX_TAG_VALUE_LEN)?;
            if value.contains('\0') {
                return Err(Invalid::new(
                    format!("tags.{}", key.as_str()),
                    "a tag value must not contain NUL characters",
                ));
            }
            tags.insert(key.into_string(), value);
        }
        Ok(Tags(tags))
    }

    pub fn get(&self) -> &BTreeMap<String, String> {
        &self.0
    }

    pub fn into_inner(self) -> BTreeMap<String, String> {
        self.0
    }

    /// Tags merge into a run's: the merged set is bounded too, not only one request.
    pub fn check_merge(&self, existing: &BTreeMap<String, String>) -> Result<(), Invalid> {
        let merged = existing
            .keys()
            .chain(self.0.keys())
            .collect::<BTreeSet<_>>()
            .len();
        if merged > MAX_TAGS {
            return Err(Invalid::new(
                "tags",
                format!("the run would have {merged} tags; at most {MAX_TAGS} are allowed"),
            ));
        }
        Ok(())
    }
}

/// Free text within a byte limit and without NUL characters (which Postgres text cannot hold).
pub fn text(field: &str, raw: String, max: usize) -> Result<String, Invalid> {
    check_len(field, &raw, max)?;
    if raw.contains('\0') {
        return Err(Invalid::new(
            field,
            format!("{field} must not contain NUL characters"),
        ));
    }
    Ok(raw)
}

/// A tracked run's config, checked by [`check_tracked_config`].
pub fn tracked_config(
    raw: Option<serde_json::Value>,
) -> Result<Option<serde_json::Value>, Invalid> {
    if let Some(config) = &raw {
        check_tracked_config(config)?;
    }
    Ok(raw)
}

/// A checked `PATCH /runs/{id}` (or a dashboard edit): each part is optional.
#[derive(Debug, Clone, Default)]
pub struct RunEdit {
    pub name: Option<Name>,
    pub tags: Option<Tags>,
    pub notes: Option<String>,
    pub config: Option<serde_json::Value>,
    pub status: Option<RunStatus>,
    pub reason: Option<String>,
}

impl RunEdit {
    pub fn parse(patch: RunPatch) -> Result<RunEdit, Invalid> {
        if patch.reason.is_some() && patch.status.is_none() {
            return Err(Invalid::new(
                "reason",
                "a reason is only accepted together with a status",
            ));
        }
        Ok(RunEdit {
            name: patch.name.map(|n| Name::parse("name", &n)).transpose()?,
            tags: patch.tags.map(Tags::parse).transpose()?,
            notes: patch
                .notes
                .map(|n| text("notes", n, MAX_NOTES_LEN))
                .transpose()?,
            config: tracked_config(patch.config)?,
            status: patch.status,
            reason: patch
                .reason
                .map(|r| text("reason", r, MAX_REASON_LEN))
                .transpose()?,
        })
    }

    /// True when the edit changes stored fields besides the status.
    pub fn has_fields(&self) -> bool {
        self.name.is_some() || self.tags.is_some() || self.notes.is_some() || self.config.is_some()
    }
}

/// Flattens a JSON config into dotted keys: `{"training": {"lr": 0.001}}` → `training.lr = 0.001`.
/// Arrays are kept as their JSON text.
pub fn flatten_params(config: &serde_json::Value) -> BTreeMap<String, String> {
    fn walk(prefix: &str, v: &serde_json::Value, out: &mut BTreeMap<String, String>) {
        match v {
            serde_json::Value::Object(map) => {
                for (k, child) in map {
                    let key = if prefix.is_empty() {
                        k.clone()
                    } else {
                        format!("{prefix}.{k}")
                    };
                    walk(&key, child, out);
                }
            }
            serde_json::Value::String(s) => {
                out.insert(prefix.to_string(), s.clone());
            }
            serde_json::Value::Null => {
                out.insert(prefix.to_string(), String::new());
            }
            other => {
                out.insert(prefix.to_string(), other.to_string());
            }
        }
    }
    let mut out = BTreeMap::new();
    walk("", config, &mut out);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_trimmed_and_bad_names_are_refused_naming_the_field() {
        assert_eq!(
            Name::parse("name", "  run 1 ").map(Name::into_string),
            Ok("run 1".into())
        );
        let cases = [
            ("", "name must not be empty"),
            ("   ", "name must not be empty"),
            ("a\nb", "name must not contain control characters"),
            ("a\0b", "name must not contain control characters"),
        ];
        for (raw, message) in cases {
            assert_eq!(
                Name::parse("name", raw),
                Err(Invalid::new("name", message)),
                "{raw:?}"
            );
        }
        let long = "x".repeat(MAX_NAME_LEN + 1);
        assert!(Name::parse("name", &long).is_err_and(|e| e.message.contains("200")));
    }

    #[test]
    fn a_tag_with_an_empty_key_is_refused_with_the_same_words_everywhere() {
        let err = Tags::parse(BTreeMap::from([(" ".into(), "v".into())]));
        assert_eq!(
            err,
            Err(Invalid::new("tags", "a tag key must not be empty"))
        );
    }

    #[test]
    fn a_reason_without_a_status_is_refused() {
        let patch = RunPatch {
            reason: Some("why".into()),
            ..Default::default()
        };
        assert_eq!(
            RunEdit::parse(patch).err().map(|e| e.field),
            Some("reason".to_string())
        );
    }
}
