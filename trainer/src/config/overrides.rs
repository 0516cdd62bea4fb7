//! `--set a.b=VALUE` overrides: the key must exist, the value is parsed as YAML and
//! type-checked against the field it replaces.

use serde_yaml_ng::Value;

use super::load::{check_keys, describe, join, leaf_error, schema, set_path, strip_location};
use super::{Config, ConfigError};

impl Config {
    /// Applies `key.path=VALUE` overrides in order. Does not validate cross-field rules.
    pub fn apply_overrides(&mut self, overrides: &[String]) -> Result<(), ConfigError> {
        let schema = schema();
        for arg in overrides {
            let Some((key, raw)) = arg.split_once('=') else {
                return Err(ConfigError::BadOverride {
                    arg: arg.clone(),
                    message: "expected KEY=VALUE, e.g. training.learning_rate=3e-4".to_string(),
                });
            };
            let key = key.trim();
            let field = lookup(&schema, key)?;
            let value = parse_value(field, raw, key)?;
            check_keys(&value, field, key)?;
            let base =
                serde_yaml_ng::to_value(&*self).map_err(|e| ConfigError::Syntax(e.to_string()))?;
            let mut current = base.clone();
            set_path(&mut current, key, value.clone());
            *self = serde_yaml_ng::from_value(current).map_err(|e| {
                leaf_error(&base, key, &value).unwrap_or_else(|| ConfigError::InvalidType {
                    key: key.to_string(),
                    message: strip_location(&e.to_string()),
                })
            })?;
        }
        Ok(())
    }
}

/// The schema node at `key`, or an unknown-key error naming the nearest valid key.
fn lookup<'a>(schema: &'a Value, key: &str) -> Result<&'a Value, ConfigError> {
    let mut node = schema;
    let mut path = String::new();
    for seg in key.split('.') {
        let next = match node {
            Value::Mapping(m) => m.get(seg),
            _ => None,
        };
        match next {
            Some(n) => {
                path = join(&path, seg);
                node = n;
            }
            None => {
                // Reuse the document check for the suggestion: a one-key mapping at this level.
                let mut probe = serde_yaml_ng::Mapping::new();
                probe.insert(Value::String(seg.to_string()), Value::Null);
                return match check_keys(&Value::Mapping(probe), node, &path) {
                    Err(e) => Err(e),
                    Ok(()) => Err(ConfigError::UnknownKey {
                        key: key.to_string(),
                        suggestion: None,
                    }),
                };
            }
        }
    }
    Ok(node)
}

/// YAML-parses the value; string fields take the text verbatim so `data.dataset=2024` stays a
/// path and `training.device=cuda:1` a device.
fn parse_value(field: &Value, raw: &str, key: &str) -> Result<Value, ConfigError> {
    let trimmed = raw.trim();
    if field.is_string() {
        return Ok(match trimmed {
            "null" | "~" if key == "training.init_from" => Value::Null,
            _ => Value::String(raw.to_string()),
        });
    }
    if trimmed.is_empty() {
        return Err(ConfigError::InvalidType {
            key: key.to_string(),
            message: format!("empty value; expected {}", expected(field)),
        });
    }
    serde_yaml_ng::from_str::<Value>(trimmed).map_err(|e| ConfigError::InvalidType {
        key: key.to_string(),
        message: format!(
            "cannot parse `{trimmed}`: {}",
            strip_location(&e.to_string())
        ),
    })
}

fn expected(field: &Value) -> String {
    match field {
        Value::Number(n) if n.is_f64() => "a number".to_string(),
        Value::Number(_) => "a non-negative integer".to_string(),
        Value::Bool(_) => "true or false".to_string(),
        Value::Mapping(_) => "a mapping".to_string(),
        other => describe(other),
    }
}
