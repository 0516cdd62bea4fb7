//! The dataset inputs an MLflow client logs (`runs/log-inputs`): each field within MLflow's own
//! size limit (tighter for `profile`), a bounded number of tags, and nothing stored that is
//! not one of MLflow's fields. What is kept is rebuilt from the checked fields, so an input's
//! stored size is bounded by the limits below; the store bounds a run's inputs as a whole
//! ([`MAX_INPUTS_PER_RUN`], [`MAX_INPUT_BYTES_PER_RUN`]).

use serde_json::{json, Map, Value};

use super::limits::check_len;
use super::Invalid;

/// A dataset a run used, as an MLflow client logged it (`log-inputs`): stored once per run,
/// name and digest, and given back as sent.
#[derive(Debug, Clone, PartialEq)]
pub struct RunInput {
    pub name: String,
    pub digest: String,
    /// The input's JSON as the client sent it.
    pub body: serde_json::Value,
}

/// A dataset's name, in bytes (MLflow's limit).
pub const MAX_DATASET_NAME_LEN: usize = 500;
/// A dataset's digest, in bytes (MLflow's limit).
pub const MAX_DATASET_DIGEST_LEN: usize = 36;
/// A dataset's source type (`local`, `http`, ...), in bytes (MLflow's database column).
pub const MAX_DATASET_SOURCE_TYPE_LEN: usize = 36;
/// A dataset's source, in bytes (MLflow's limit: 64 KiB - 1).
pub const MAX_DATASET_SOURCE_LEN: usize = 65_535;
/// A dataset's schema, in bytes (MLflow's limit: 1 MiB - 1).
pub const MAX_DATASET_SCHEMA_LEN: usize = 1_048_575;
/// A dataset's profile, in bytes: 1 MiB - 1 (MLflow allows 16 MiB - 1).
pub const MAX_DATASET_PROFILE_LEN: usize = 1_048_575;
/// An input tag's key, in bytes (MLflow's limit).
pub const MAX_INPUT_TAG_KEY_LEN: usize = 255;
/// An input tag's value, in bytes (MLflow's limit).
pub const MAX_INPUT_TAG_VALUE_LEN: usize = 500;
/// Tags of one input.
pub const MAX_INPUT_TAGS: usize = 32;
/// Inputs (distinct name and digest) one run keeps.
pub const MAX_INPUTS_PER_RUN: usize = 100;
/// Bytes of all of one run's inputs together, as stored (JSON).
pub const MAX_INPUT_BYTES_PER_RUN: usize = 4 * 1024 * 1024;

/// One text field of `object`, at most `max` bytes; `required` ones must be non-empty.
fn text(
    object: &Map<String, Value>,
    at: &str,
    key: &str,
    max: usize,
    required: bool,
) -> Result<Option<String>, Invalid> {
    let field = format!("{at}.{key}");
    match object.get(key) {
        None | Some(Value::Null) if !required => Ok(None),
        Some(Value::String(s)) if !(required && s.is_empty()) => {
            check_len(&field, s, max)?;
            Ok(Some(s.clone()))
        }
        Some(Value::String(_)) | None | Some(Value::Null) => {
            Err(Invalid::new(&field, format!("{field} must be given")))
        }
        Some(_) => Err(Invalid::new(&field, format!("{field} must be a string"))),
    }
}

fn object<'a>(value: &'a Value, field: &str) -> Result<&'a Map<String, Value>, Invalid> {
    value
        .as_object()
        .ok_or_else(|| Invalid::new(field, format!("{field} must be an object")))
}

/// One dataset input as MLflow sends it (`{"dataset": {...}, "tags": [...]}`), checked and
/// rebuilt from its known fields.
fn dataset_input(i: usize, input: &Value) -> Result<RunInput, Invalid> {
    let at = format!("datasets[{i}]");
    let input = object(input, &at)?;
    let dataset_at = format!("{at}.dataset");
    let dataset = object(input.get("dataset").unwrap_or(&Value::Null), &dataset_at)?;
    let field = |key, max, required| text(dataset, &dataset_at, key, max, required);
    let name = field("name", MAX_DATASET_NAME_LEN, true)?.unwrap_or_default();
    let digest = field("digest", MAX_DATASET_DIGEST_LEN, true)?.unwrap_or_default();
    let mut kept = Map::new();
    kept.insert("name".into(), json!(name));
    kept.insert("digest".into(), json!(digest));
    for (key, max) in [
        ("source_type", MAX_DATASET_SOURCE_TYPE_LEN),
        ("source", MAX_DATASET_SOURCE_LEN),
        ("schema", MAX_DATASET_SCHEMA_LEN),
        ("profile", MAX_DATASET_PROFILE_LEN),
    ] {
        if let Some(value) = field(key, max, false)? {
            kept.insert(key.into(), json!(value));
        }
    }
    let tags_at = format!("{at}.tags");
    let tags = match input.get("tags") {
        None | Some(Value::Null) => Vec::new(),
        Some(Value::Array(tags)) => tags.clone(),
        Some(_) => return Err(Invalid::new(&tags_at, format!("{tags_at} must be a list"))),
    };
    if tags.len() > MAX_INPUT_TAGS {
        return Err(Invalid::new(
            &tags_at,
            format!(
                "{tags_at} has {} tags; at most {MAX_INPUT_TAGS} are allowed",
                tags.len()
            ),
        ));
    }
    let mut kept_tags = Vec::with_capacity(tags.len());
    for (j, tag) in tags.iter().enumerate() {
        let tag_at = format!("{tags_at}[{j}]");
        let tag = object(tag, &tag_at)?;
        let key = text(tag, &tag_at, "key", MAX_INPUT_TAG_KEY_LEN, true)?;
        let value = text(tag, &tag_at, "value", MAX_INPUT_TAG_VALUE_LEN, false)?;
        kept_tags.push(json!({"key": key, "value": value.unwrap_or_default()}));
    }
    let mut body = json!({ "dataset": kept });
    if !kept_tags.is_empty() {
        body["tags"] = Value::Array(kept_tags);
    }
    Ok(RunInput { name, digest, body })
}

/// The `datasets` of a `log-inputs` request, checked: at most [`MAX_INPUTS_PER_RUN`] of them,
/// every field within its limit.
pub fn dataset_inputs(datasets: &[Value]) -> Result<Vec<RunInput>, Invalid> {
    if datasets.len() > MAX_INPUTS_PER_RUN {
        return Err(Invalid::new(
            "datasets",
            format!(
                "datasets has {} inputs; a run keeps at most {MAX_INPUTS_PER_RUN}",
                datasets.len()
            ),
        ));
    }
    datasets
        .iter()
        .enumerate()
        .map(|(i, input)| dataset_input(i, input))
        .collect()
}

/// Whether a run that has `stored` inputs may add `adding` (those of them it does not have
/// already): the per-run count and byte limits, as a message naming `datasets`.
pub fn run_inputs_fit(stored: &[RunInput], adding: &[RunInput]) -> Result<(), Invalid> {
    let mut count = stored.len();
    let mut bytes: usize = stored.iter().map(|i| i.body.to_string().len()).sum();
    let mut seen: std::collections::BTreeSet<(&str, &str)> = stored
        .iter()
        .map(|i| (i.name.as_str(), i.digest.as_str()))
        .collect();
    for input in adding {
        if seen.insert((input.name.as_str(), input.digest.as_str())) {
            count += 1;
            bytes += input.body.to_string().len();
        }
    }
    if count > MAX_INPUTS_PER_RUN {
        return Err(Invalid::new(
            "datasets",
            format!(
                "datasets: the run would have {count} inputs; a run keeps at most \
                 {MAX_INPUTS_PER_RUN}"
            ),
        ));
    }
    if bytes > MAX_INPUT_BYTES_PER_RUN {
        return Err(Invalid::new(
            "datasets",
            format!(
                "datasets: the run's inputs would be {bytes} bytes; a run keeps at most \
                 {MAX_INPUT_BYTES_PER_RUN}"
            ),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn input(name: &str, extra: Value) -> Value {
        let mut dataset = json!({"name": name, "digest": "d1", "source_type": "local",
            "source": "{}", "schema": "{}", "profile": "{}"});
        for (k, v) in extra.as_object().unwrap() {
            dataset[k] = v.clone();
        }
        json!({"dataset": dataset, "tags": [{"key": "mlflow.data.context", "value": "train"}]})
    }

    #[test]
    fn every_field_over_its_limit_is_refused_naming_it() {
        let cases = [
            ("name", MAX_DATASET_NAME_LEN),
            ("digest", MAX_DATASET_DIGEST_LEN),
            ("source_type", MAX_DATASET_SOURCE_TYPE_LEN),
            ("source", MAX_DATASET_SOURCE_LEN),
            ("schema", MAX_DATASET_SCHEMA_LEN),
            ("profile", MAX_DATASET_PROFILE_LEN),
        ];
        for (key, max) in cases {
            let at_limit = input("n", json!({ key: "x".repeat(max) }));
            assert!(dataset_inputs(&[at_limit]).is_ok(), "{key} at its limit");
            let over = input("n", json!({ key: "x".repeat(max + 1) }));
            let e = dataset_inputs(&[over]).unwrap_err();
            assert_eq!(e.field, format!("datasets[0].dataset.{key}"));
            assert!(e.message.contains(&max.to_string()), "{}", e.message);
        }
        let long_key = json!({"dataset": {"name": "n", "digest": "d"},
            "tags": [{"key": "k".repeat(MAX_INPUT_TAG_KEY_LEN + 1), "value": "v"}]});
        let e = dataset_inputs(&[long_key]).unwrap_err();
        assert_eq!(e.field, "datasets[0].tags[0].key");
        let long_value = json!({"dataset": {"name": "n", "digest": "d"},
            "tags": [{"key": "k", "value": "v".repeat(MAX_INPUT_TAG_VALUE_LEN + 1)}]});
        let e = dataset_inputs(&[long_value]).unwrap_err();
        assert_eq!(e.field, "datasets[0].tags[0].value");
        let tags: Vec<Value> = (0..=MAX_INPUT_TAGS)
            .map(|i| json!({"key": format!("k{i}"), "value": "v"}))
            .collect();
        let many = json!({"dataset": {"name": "n", "digest": "d"}, "tags": tags});
        assert_eq!(
            dataset_inputs(&[many]).unwrap_err().field,
            "datasets[0].tags"
        );
        let wrong = json!({"dataset": {"name": "n", "digest": "d", "schema": {"a": 1}}});
        assert_eq!(
            dataset_inputs(&[wrong]).unwrap_err().field,
            "datasets[0].dataset.schema"
        );
        let unnamed = json!({"dataset": {"digest": "d"}});
        assert_eq!(
            dataset_inputs(&[unnamed]).unwrap_err().field,
            "datasets[0].dataset.name"
        );
    }

    #[test]
    fn only_mlflows_fields_are_kept() {
        let sent = json!({"dataset": {"name": "n", "digest": "d", "source_type": "local",
            "padding": "x".repeat(10_000)}, "extra": [1, 2, 3]});
        let kept = dataset_inputs(&[sent]).unwrap();
        assert_eq!(
            kept[0].body,
            json!({"dataset": {"name": "n", "digest": "d", "source_type": "local"}})
        );
    }

    #[test]
    fn a_run_keeps_a_bounded_number_and_size_of_inputs() {
        let one = |name: &str, profile: usize| {
            dataset_inputs(&[input(name, json!({"profile": "p".repeat(profile)}))])
                .unwrap()
                .remove(0)
        };
        let stored: Vec<RunInput> = (0..MAX_INPUTS_PER_RUN)
            .map(|i| one(&format!("d{i}"), 0))
            .collect();
        // The same input again adds nothing; a new one is one too many.
        assert!(run_inputs_fit(&stored, &[one("d0", 0)]).is_ok());
        let e = run_inputs_fit(&stored, &[one("new", 0)]).unwrap_err();
        assert_eq!(e.field, "datasets");
        let big: Vec<RunInput> = (0..4).map(|i| one(&format!("b{i}"), 1_000_000)).collect();
        assert!(run_inputs_fit(&[], &big).is_ok());
        let e = run_inputs_fit(&big, &[one("b4", 1_000_000)]).unwrap_err();
        assert!(e.message.contains(&MAX_INPUT_BYTES_PER_RUN.to_string()));
    }
}
