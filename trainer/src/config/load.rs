//! Loading: YAML text, files, built-in profiles and JSON values, with unknown keys reported by
//! full path and nearest valid key, and type errors pinned to the offending key.

use std::path::Path;

use serde_yaml_ng::{Mapping, Value};

use super::{
    Config, ConfigError, InstabilityGuardConfig, LayerPattern, LoraConfig, MambaConfig, MoeConfig,
};

/// Built-in profiles, embedded so the binary works from any directory.
pub const PROFILES: &[(&str, &str)] = &[
    ("tiny", include_str!("../../../configs/tiny.yaml")),
    ("small", include_str!("../../../configs/small.yaml")),
    ("medium", include_str!("../../../configs/medium.yaml")),
    ("large", include_str!("../../../configs/large.yaml")),
    ("tiny-moe", include_str!("../../../configs/tiny-moe.yaml")),
    ("small-moe", include_str!("../../../configs/small-moe.yaml")),
    (
        "tiny-hybrid",
        include_str!("../../../configs/tiny-hybrid.yaml"),
    ),
    (
        "small-hybrid",
        include_str!("../../../configs/small-hybrid.yaml"),
    ),
];

impl Config {
    /// Parses a YAML document (sections may be partial; missing keys take defaults).
    /// Does not validate cross-field rules: call [`Config::validate`].
    pub fn from_yaml_str(text: &str) -> Result<Config, ConfigError> {
        let value: Value = if text.trim().is_empty() {
            Value::Mapping(Mapping::new())
        } else {
            serde_yaml_ng::from_str(text).map_err(|e| ConfigError::Syntax(e.to_string()))?
        };
        Config::from_value(value)
    }

    /// Same as [`Config::from_yaml_str`] for a JSON document (the server's launch requests).
    pub fn from_json_value(value: &serde_json::Value) -> Result<Config, ConfigError> {
        let value =
            serde_yaml_ng::to_value(value).map_err(|e| ConfigError::Syntax(e.to_string()))?;
        Config::from_value(value)
    }

    pub fn from_yaml_file(path: impl AsRef<Path>) -> Result<Config, ConfigError> {
        let path = path.as_ref();
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Io {
            path: path.to_path_buf(),
            source,
        })?;
        Config::from_yaml_str(&text)
    }

    /// One of the built-in profiles (`tiny`, `small`, `medium`, `large`, `tiny-moe`, `small-moe`,
    /// `tiny-hybrid`, `small-hybrid`).
    pub fn from_profile(name: &str) -> Result<Config, ConfigError> {
        match PROFILES.iter().find(|(n, _)| *n == name) {
            Some((_, text)) => Config::from_yaml_str(text),
            None => Err(unknown_profile(name)),
        }
    }

    /// `--config SPEC`: an existing file wins; otherwise SPEC names a built-in profile.
    pub fn load(spec: &str) -> Result<Config, ConfigError> {
        let path = Path::new(spec);
        if path.is_file() {
            return Config::from_yaml_file(path);
        }
        if PROFILES.iter().any(|(n, _)| *n == spec) {
            return Config::from_profile(spec);
        }
        Err(unknown_profile(spec))
    }

    /// Load, apply `--set` overrides, validate: everything the CLI does before any work starts.
    pub fn resolve(spec: &str, overrides: &[String]) -> Result<Config, ConfigError> {
        let mut cfg = Config::load(spec)?;
        cfg.apply_overrides(overrides)?;
        cfg.validate()?;
        Ok(cfg)
    }

    /// The fully resolved configuration as YAML (written to the run directory).
    pub fn to_yaml(&self) -> Result<String, ConfigError> {
        serde_yaml_ng::to_string(self).map_err(|e| ConfigError::Syntax(e.to_string()))
    }

    pub(crate) fn from_value(value: Value) -> Result<Config, ConfigError> {
        let value = match value {
            Value::Null => Value::Mapping(Mapping::new()),
            v => v,
        };
        check_keys(&value, &schema(), "")?;
        match serde_yaml_ng::from_value::<Config>(value.clone()) {
            Ok(cfg) => Ok(cfg),
            Err(err) => {
                Err(
                    locate_type_error(&value).unwrap_or_else(|| ConfigError::InvalidType {
                        key: "config".to_string(),
                        message: strip_location(&err.to_string()),
                    }),
                )
            }
        }
    }
}

fn unknown_profile(name: &str) -> ConfigError {
    ConfigError::UnknownProfile {
        name: name.to_string(),
        profiles: PROFILES
            .iter()
            .map(|(n, _)| *n)
            .collect::<Vec<_>>()
            .join(", "),
    }
}

/// Every valid key, as a value tree: defaults with optional sections filled in.
pub(crate) fn schema() -> Value {
    let mut full = Config::default();
    full.model.moe = Some(MoeConfig::default());
    full.model.mamba = Some(MambaConfig::default());
    full.model.layer_pattern = Some(LayerPattern(Vec::new()));
    full.training.init_from = Some(String::new());
    full.training.lora = Some(LoraConfig::default());
    full.training.instability_guard = Some(InstabilityGuardConfig::default());
    // Serializing plain structs of numbers and strings cannot fail.
    serde_yaml_ng::to_value(&full).unwrap_or(Value::Null)
}

/// Optional sections that may be set to `null` instead of a mapping.
const NULLABLE_SECTIONS: &[&str] = &[
    "model.moe",
    "model.mamba",
    "training.lora",
    "training.instability_guard",
];

pub(crate) fn join(path: &str, key: &str) -> String {
    if path.is_empty() {
        key.to_string()
    } else {
        format!("{path}.{key}")
    }
}

/// Rejects keys the schema does not know, naming the nearest valid one.
pub(crate) fn check_keys(value: &Value, schema: &Value, path: &str) -> Result<(), ConfigError> {
    let Value::Mapping(allowed) = schema else {
        return Ok(());
    };
    let given = match value {
        Value::Mapping(m) => m,
        Value::Null if NULLABLE_SECTIONS.contains(&path) => return Ok(()),
        other => {
            return Err(ConfigError::InvalidType {
                key: if path.is_empty() { "config" } else { path }.to_string(),
                message: format!("expected a mapping of keys, got {}", describe(other)),
            })
        }
    };
    for (k, v) in given {
        let Some(name) = k.as_str() else {
            return Err(ConfigError::InvalidType {
                key: if path.is_empty() { "config" } else { path }.to_string(),
                message: format!("keys must be strings, got {}", describe(k)),
            });
        };
        let full = join(path, name);
        match allowed.get(name) {
            Some(sub) => check_keys(v, sub, &full)?,
            None => {
                return Err(ConfigError::UnknownKey {
                    suggestion: nearest_key(path, name, allowed),
                    key: full,
                })
            }
        }
    }
    Ok(())
}

/// The sibling key closest in spelling, or else a key of the same name in another section.
fn nearest_key(path: &str, name: &str, siblings: &Mapping) -> Option<String> {
    let best = siblings
        .keys()
        .filter_map(|k| k.as_str())
        .map(|k| (strsim::normalized_damerau_levenshtein(name, k), k))
        .max_by(|a, b| a.0.total_cmp(&b.0));
    if let Some((score, key)) = best {
        if score >= 0.6 {
            return Some(join(path, key));
        }
    }
    // Abbreviations: `lr` for `learning_rate`.
    if let Some(key) = siblings
        .keys()
        .filter_map(|k| k.as_str())
        .find(|k| k.contains('_') && acronym(k) == name)
    {
        return Some(join(path, key));
    }
    let mut all = Vec::new();
    leaf_paths(&schema(), "", &mut all);
    all.into_iter()
        .map(|p| {
            let last = p.rsplit('.').next().unwrap_or(&p).to_string();
            (strsim::normalized_damerau_levenshtein(name, &last), p)
        })
        .filter(|(score, _)| *score >= 0.8)
        .max_by(|a, b| a.0.total_cmp(&b.0))
        .map(|(_, p)| p)
}

fn acronym(key: &str) -> String {
    key.split('_').filter_map(|w| w.chars().next()).collect()
}

pub(crate) fn leaf_paths(value: &Value, path: &str, out: &mut Vec<String>) {
    match value {
        Value::Mapping(m) => {
            for (k, v) in m {
                if let Some(k) = k.as_str() {
                    leaf_paths(v, &join(path, k), out);
                }
            }
        }
        _ => out.push(path.to_string()),
    }
}

/// Leaves of a user document with their key paths.
fn leaves<'a>(value: &'a Value, path: &str, out: &mut Vec<(String, &'a Value)>) {
    match value {
        Value::Mapping(m) => {
            for (k, v) in m {
                if let Some(k) = k.as_str() {
                    leaves(v, &join(path, k), out);
                }
            }
        }
        v => out.push((path.to_string(), v)),
    }
}

/// Puts `leaf` at `path` inside `root`, creating mappings where the path crosses null.
pub(crate) fn set_path(root: &mut Value, path: &str, leaf: Value) {
    let mut cur = root;
    for seg in path.split('.') {
        if !cur.is_mapping() {
            *cur = Value::Mapping(Mapping::new());
        }
        let Value::Mapping(m) = cur else { return };
        cur = m
            .entry(Value::String(seg.to_string()))
            .or_insert(Value::Null);
    }
    *cur = leaf;
}

/// serde reports the first bad value without its path: re-check one leaf at a time over the
/// defaults to name the key.
fn locate_type_error(value: &Value) -> Option<ConfigError> {
    let mut found = Vec::new();
    leaves(value, "", &mut found);
    let base = serde_yaml_ng::to_value(Config::default()).ok()?;
    found
        .into_iter()
        .find_map(|(path, leaf)| leaf_error(&base, &path, leaf))
}

/// The error of `leaf` put at `path` in `base`, or None when that reads. In a list the first
/// element that does not read is named (`training.lora.targets[1]`).
pub(crate) fn leaf_error(base: &Value, path: &str, leaf: &Value) -> Option<ConfigError> {
    let read = |leaf: Value| {
        let mut probe = base.clone();
        set_path(&mut probe, path, leaf);
        serde_yaml_ng::from_value::<Config>(probe).err()
    };
    let err = read(leaf.clone())?;
    let at_fault = match leaf {
        Value::Sequence(items) => (0..items.len()).find_map(|i| {
            read(Value::Sequence(items[..=i].to_vec())).map(|e| (format!("{path}[{i}]"), e))
        }),
        _ => None,
    };
    let (key, err) = at_fault.unwrap_or((path.to_string(), err));
    Some(ConfigError::InvalidType {
        key,
        message: strip_location(&err.to_string()),
    })
}

/// A serde message in a reader's words: without the YAML position (the key path says where)
/// and without Rust type names (`expected usize` becomes `expected a whole number (0 or more)`).
pub(crate) fn strip_location(msg: &str) -> String {
    let msg = match msg.find(" at line ") {
        Some(i) => &msg[..i],
        None => msg,
    };
    const TYPE_WORDS: &[(&str, &str)] = &[
        ("expected usize", "expected a whole number (0 or more)"),
        ("expected u64", "expected a whole number (0 or more)"),
        ("expected u32", "expected a whole number (0 or more)"),
        ("expected f64", "expected a number"),
        ("expected a boolean", "expected true or false (a boolean)"),
    ];
    let mut out = msg.to_string();
    for (rust, plain) in TYPE_WORDS {
        out = out.replace(rust, plain);
    }
    out
}

pub(crate) fn describe(v: &Value) -> String {
    match v {
        Value::Null => "null".to_string(),
        Value::Bool(b) => format!("boolean {b}"),
        Value::Number(n) => format!("number {n}"),
        Value::String(s) => format!("string \"{s}\""),
        Value::Sequence(_) => "a list".to_string(),
        Value::Mapping(_) => "a mapping".to_string(),
        Value::Tagged(_) => "a tagged value".to_string(),
    }
}
