//! `docs/config.md`, built from the config types themselves: the doc comment, the type and the
//! default of every key. The text comes from this module's source file (`mod.rs`, embedded at
//! build time) and the defaults from `Config::default()`, so the reference cannot drift from the
//! code: a unit test compares the checked-in file with [`markdown`] and fails when they differ.

use std::collections::BTreeMap;

use serde_json::Value;

use super::{Config, InstabilityGuardConfig, LoraConfig, MambaConfig, MoeConfig};

/// The source the reference is read from.
const SOURCE: &str = include_str!("mod.rs");

/// Where the generated reference is checked in, relative to the repository root.
pub const DOC_PATH: &str = "docs/config.md";

/// How to regenerate the file (the test's failure message says it too).
pub const REGENERATE: &str = "TRAINYARD_WRITE_DOCS=1 cargo test --workspace config_reference";

/// One `pub name: Type` with its doc comment.
#[derive(Debug, Clone)]
struct Field {
    name: String,
    ty: String,
    doc: String,
}

/// What the source declares: structs with their fields, enums with their variants.
#[derive(Debug, Default)]
struct Types {
    structs: BTreeMap<String, (String, Vec<Field>)>,
    /// Enum name → (value as written in YAML, doc) per variant.
    enums: BTreeMap<String, Vec<(String, String)>>,
}

/// The reference as Markdown, from the embedded source of the config types.
pub fn markdown() -> Result<String, String> {
    render(&parse(SOURCE)?)
}

fn parse(source: &str) -> Result<Types, String> {
    let mut types = Types::default();
    let mut doc: Vec<String> = Vec::new();
    let mut lowercase = false;
    // (kind, name, doc, members) of the item being read.
    let mut open: Option<(&str, String, String, Vec<Field>)> = None;
    for (n, raw) in source.lines().enumerate() {
        let line = raw.trim();
        let here = || format!("config source line {}", n + 1);
        if let Some(text) = line.strip_prefix("///") {
            doc.push(text.trim().to_string());
            continue;
        }
        if line.starts_with("#[") {
            lowercase |= line.contains("rename_all = \"lowercase\"");
            continue;
        }
        let joined = doc.join(" ");
        match &mut open {
            None => {
                let item = line
                    .strip_prefix("pub struct ")
                    .map(|r| ("struct", r))
                    .or_else(|| line.strip_prefix("pub enum ").map(|r| ("enum", r)));
                if let Some((kind, rest)) = item {
                    let name = rest.trim_end_matches('{').trim().to_string();
                    if kind == "enum" && !lowercase {
                        return Err(format!(
                            "{}: enum {name} must be renamed lowercase for the reference",
                            here()
                        ));
                    }
                    open = Some((kind, name, joined, Vec::new()));
                }
            }
            Some((kind, name, item_doc, members)) => {
                if line == "}" {
                    let name = std::mem::take(name);
                    let item_doc = std::mem::take(item_doc);
                    let members = std::mem::take(members);
                    if *kind == "struct" {
                        types.structs.insert(name, (item_doc, members));
                    } else {
                        let variants = members.into_iter().map(|f| (f.name, f.doc)).collect();
                        types.enums.insert(name, variants);
                    }
                    open = None;
                } else if *kind == "struct" {
                    let Some((field, ty)) = line
                        .strip_prefix("pub ")
                        .and_then(|r| r.trim_end_matches(',').split_once(": "))
                    else {
                        return Err(format!("{}: expected `pub name: Type,`", here()));
                    };
                    if joined.is_empty() {
                        return Err(format!("{name}.{field} has no doc comment"));
                    }
                    members.push(Field {
                        name: field.to_string(),
                        ty: ty.to_string(),
                        doc: joined,
                    });
                } else if let Some(variant) = line.strip_suffix(',') {
                    if joined.is_empty() {
                        return Err(format!("{name}::{variant} has no doc comment"));
                    }
                    members.push(Field {
                        name: variant.to_ascii_lowercase(),
                        ty: String::new(),
                        doc: joined,
                    });
                }
            }
        }
        doc.clear();
        lowercase = false;
    }
    if !types.structs.contains_key("Config") {
        return Err("no `pub struct Config` in the config source".to_string());
    }
    Ok(types)
}

/// Defaults as JSON, with the optional sections filled in so their keys have defaults too.
fn defaults() -> Value {
    let mut full = Config::default();
    full.model.moe = Some(MoeConfig::default());
    full.model.mamba = Some(MambaConfig::default());
    full.training.lora = Some(LoraConfig::default());
    full.training.instability_guard = Some(InstabilityGuardConfig::default());
    serde_json::to_value(&full).unwrap_or(Value::Null)
}

fn render(types: &Types) -> Result<String, String> {
    let mut out = String::new();
    out.push_str(&format!(
        "# Config reference\n\n\
         <!-- Generated from the doc comments of trainer/src/config/mod.rs; do not edit by hand.\n     \
         Regenerate with: {REGENERATE} -->\n\n\
         A run's configuration has four sections. `trainyard train --config FILE|PROFILE` reads \
         a YAML file or a built-in profile (`tiny`, `small`, `medium`, `large`, `tiny-moe`, \
         `small-moe`, `tiny-hybrid`, `small-hybrid`); every key left out takes the default \
         below. `--set KEY=VALUE` overrides one key by its path (`--set training.max_steps=500`). The result is checked \
         before any work starts; a mistake names its key. \
         `trainyard train --config ... --set ... --print-config` prints the resolved config as \
         YAML without training.\n"
    ));
    let defaults = defaults();
    let (_, sections) = &types.structs["Config"];
    for section in sections {
        render_section(types, &defaults, &section.name, section, &mut out)?;
    }
    Ok(out)
}

fn render_section(
    types: &Types,
    defaults: &Value,
    path: &str,
    section: &Field,
    out: &mut String,
) -> Result<(), String> {
    let (inner, optional) = match option_of(&section.ty) {
        Some(t) => (t, true),
        None => (section.ty.as_str(), false),
    };
    let Some((struct_doc, fields)) = types.structs.get(inner) else {
        return Err(format!("{path}: no struct {inner} in the config source"));
    };
    out.push_str(&format!("\n## `{path}`\n\n{}\n", section.doc));
    if !struct_doc.is_empty() {
        out.push_str(&format!("\n{struct_doc}\n"));
    }
    if optional {
        out.push_str(
            "\nOptional: absent (or `null`) by default. Setting any key below turns the \
             section on, with the defaults shown for the keys left out.\n",
        );
    }
    out.push_str("\n| Key | Type | Default | Meaning |\n|---|---|---|---|\n");
    let mut subsections = Vec::new();
    for f in fields {
        let key = format!("{path}.{}", f.name);
        let inner = option_of(&f.ty).unwrap_or(&f.ty);
        if types.structs.contains_key(inner) {
            subsections.push((key, f));
            continue;
        }
        let ty = type_words(types, &f.ty).ok_or_else(|| format!("{key}: type {}", f.ty))?;
        let default = lookup(defaults, &key)
            .map(default_words)
            .ok_or_else(|| format!("{key}: no default"))?;
        let mut doc = f.doc.clone();
        if let Some(variants) = types.enums.get(inner) {
            for (value, vdoc) in variants {
                doc.push_str(&format!(" `{value}`: {vdoc}"));
            }
        }
        out.push_str(&format!(
            "| `{key}` | {ty} | {default} | {} |\n",
            doc.replace('|', "\\|")
        ));
    }
    for (key, f) in subsections {
        render_section(types, defaults, &key, f, out)?;
    }
    Ok(())
}

fn option_of(ty: &str) -> Option<&str> {
    ty.strip_prefix("Option<")?.strip_suffix('>')
}

/// The type in a reader's words.
fn type_words(types: &Types, ty: &str) -> Option<String> {
    if let Some(inner) = option_of(ty) {
        return Some(format!("{} or `null`", type_words(types, inner)?));
    }
    Some(match ty {
        "usize" | "u64" | "u32" => "integer ≥ 0".to_string(),
        "f64" | "f32" => "number".to_string(),
        "bool" => "`true` or `false`".to_string(),
        // Typed choices are spelled as strings in YAML; the doc comment lists the spellings.
        "Vec<String>" | "Vec<LoraTarget>" => "list of strings".to_string(),
        "Vec<CurriculumStage>" => "list of `{seq_len, steps}`".to_string(),
        "String" | "DeviceSpec" | "Progress" | "LayerPattern" => "string".to_string(),
        other => {
            let values: Vec<String> = types
                .enums
                .get(other)?
                .iter()
                .map(|(v, _)| format!("`{v}`"))
                .collect();
            format!("one of {}", values.join(", "))
        }
    })
}

fn lookup<'a>(value: &'a Value, path: &str) -> Option<&'a Value> {
    path.split('.').try_fold(value, |v, seg| v.get(seg))
}

fn default_words(v: &Value) -> String {
    match v {
        Value::String(s) if s.is_empty() => "empty".to_string(),
        Value::String(s) => format!("`{s}`"),
        other => format!("`{other}`"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_config_reference_in_docs_matches_the_config_types() {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("..")
            .join(DOC_PATH);
        let generated = markdown().unwrap();
        if std::env::var_os("TRAINYARD_WRITE_DOCS").is_some() {
            std::fs::write(&path, &generated).unwrap();
        }
        let checked_in = std::fs::read_to_string(&path).unwrap_or_default();
        assert!(
            checked_in == generated,
            "{DOC_PATH} is out of date with trainer/src/config/mod.rs; regenerate it with\n    \
             {REGENERATE}\nand commit it"
        );
    }

    #[test]
    fn every_key_the_loader_accepts_is_in_the_reference_with_its_default() {
        let text = markdown().unwrap();
        let mut keys = Vec::new();
        super::super::load::leaf_paths(&super::super::load::schema(), "", &mut keys);
        assert!(keys.len() > 50, "{keys:?}");
        for key in keys {
            assert!(text.contains(&format!("| `{key}` |")), "{key} missing");
        }
        assert!(text.contains("| `training.max_steps` | integer ≥ 0 | `200` |"));
        assert!(text.contains("| `logging.heartbeat_interval_secs` | integer ≥ 0 | `30` |"));
        assert!(text.contains("one of `learned`, `rope`"));
        assert!(text.contains("| `training.init_from` | string or `null` | `null` |"));
    }

    #[test]
    fn a_field_or_variant_without_a_doc_comment_is_refused() {
        let field =
            "pub struct Config {\n    /// Documented.\n    pub a: usize,\n    pub b: usize,\n}\n";
        assert_eq!(parse(field).unwrap_err(), "Config.b has no doc comment");
        let variant = "#[serde(rename_all = \"lowercase\")]\npub enum E {\n    A,\n}\n";
        assert_eq!(parse(variant).unwrap_err(), "E::A has no doc comment");
    }
}
