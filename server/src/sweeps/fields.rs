//! The strings a sweep's controller will use, checked when the sweep is admitted (and when it
//! changes): its name (every trial's run is named `<name>-<number>`), the metric it reads, each
//! parameter's name and values (a trial's overrides or command-line arguments, its environment,
//! its stored parameters) and the base every trial starts from. Whatever a launch, the store or
//! a metric read would refuse later is refused now, with 422 naming the field, so no sweep is
//! admitted whose every trial fails to launch or whose controller cannot take a step.
//!
//! Messages never repeat a refused value as it is: it may hold a NUL or a control character,
//! and the message of a sweep that fails is stored.

use serde_json::Value;
use sweep::{Command, SweepSpec};

use crate::validate::limits::{
    check_len, config_limit_error, yaml_limit_error, MAX_COMMAND_BYTES, MAX_NAME_LEN,
    MAX_OVERRIDES, MAX_OVERRIDE_VALUE_LEN, MAX_PARAM_KEY_LEN, MAX_WORKING_DIR_LEN,
};
use crate::validate::points::check_key;
use crate::validate::Invalid;

/// Room a trial's run name needs after the sweep's name: `-` and a trial number (at most ten
/// digits).
pub const TRIAL_SUFFIX_ROOM: usize = 11;
/// A sweep's name, in bytes: a trial's run name must fit in a run name's limit.
pub const MAX_SWEEP_NAME_LEN: usize = MAX_NAME_LEN - TRIAL_SUFFIX_ROOM;
/// Bytes a number or boolean takes on a command line at most (an `f64` written out).
const NUMBER_ARG_LEN: usize = 32;
/// Characters of a refused value shown in a message.
pub const SHOWN: usize = 40;

/// `text` as a message may show it: control characters escaped, at most [`SHOWN`] characters.
pub fn shown(text: &str) -> String {
    let mut out = String::new();
    for (i, c) in text.chars().enumerate() {
        if i == SHOWN {
            out.push('…');
            break;
        }
        if c.is_control() {
            out.extend(c.escape_default());
        } else {
            out.push(c);
        }
    }
    out
}

/// Every check below, first failure first.
pub fn check(spec: &SweepSpec) -> Result<(), Invalid> {
    check_nul(spec)?;
    check_name(&spec.name)?;
    check_metric(&spec.metric.name)?;
    check_parameters(spec)?;
    check_base(spec)
}

/// No string or key anywhere in the spec holds a NUL (no stored text can: Postgres refuses
/// it). A JSON body cannot bring one (refused at the edge); YAML text can (`"\0"`).
fn check_nul(spec: &SweepSpec) -> Result<(), Invalid> {
    let value = serde_json::to_value(spec)
        .map_err(|e| Invalid::new("spec", format!("the spec cannot be written as JSON: {e}")))?;
    match nul_path(&value, "") {
        Some(field) => Err(Invalid::new(
            field.clone(),
            format!("{field} contains a NUL character, which no text this server stores may hold"),
        )),
        None => Ok(()),
    }
}

/// The path of the first string holding a NUL (for a key: the path of its mapping).
fn nul_path(value: &Value, here: &str) -> Option<String> {
    let at = |key: &str| {
        if here.is_empty() {
            key.to_owned()
        } else {
            format!("{here}.{key}")
        }
    };
    match value {
        Value::String(s) if s.contains('\0') => Some(if here.is_empty() {
            "spec".into()
        } else {
            here.into()
        }),
        Value::Array(items) => items
            .iter()
            .enumerate()
            .find_map(|(i, item)| nul_path(item, &format!("{here}[{i}]"))),
        Value::Object(map) => map.iter().find_map(|(key, item)| {
            if key.contains('\0') {
                Some(if here.is_empty() {
                    "spec".into()
                } else {
                    here.into()
                })
            } else {
                nul_path(item, &at(key))
            }
        }),
        _ => None,
    }
}

fn check_name(name: &str) -> Result<(), Invalid> {
    if name.chars().any(char::is_control) {
        return Err(Invalid::new(
            "name",
            "name must not contain control characters (each trial's run is named after it)",
        ));
    }
    if name.len() > MAX_SWEEP_NAME_LEN {
        return Err(Invalid::new(
            "name",
            format!(
                "name is {} bytes long; at most {MAX_SWEEP_NAME_LEN} are allowed (each trial's \
                 run is named `<name>-<trial number>`, within the {MAX_NAME_LEN} bytes of a run \
                 name)",
                name.len()
            ),
        ));
    }
    Ok(())
}

/// The metric is read by its key: it must be one a run can report.
fn check_metric(metric: &str) -> Result<(), Invalid> {
    check_key(metric).map_err(|_| {
        Invalid::new(
            "metric.name",
            format!(
                "metric.name `{}` is not a metric key a run can report (at most 250 bytes of \
                 letters, digits, space and _ - . / : @)",
                shown(metric)
            ),
        )
    })
}

fn check_parameters(spec: &SweepSpec) -> Result<(), Invalid> {
    for key in spec.parameters.keys() {
        if key.is_empty() || key.chars().any(char::is_control) {
            return Err(Invalid::new(
                "parameters",
                format!(
                    "parameter name `{}` must be a non-empty name without control characters",
                    shown(key)
                ),
            ));
        }
        check_len("parameters", key, MAX_PARAM_KEY_LEN)
            .map_err(|e| Invalid::new("parameters", format!("a parameter name: {e}")))?;
    }
    if spec.base.command.is_some() {
        return check_command_size(spec);
    }
    // Every value becomes an override of each trial's config, next to the base's.
    let overrides = spec
        .base
        .overrides
        .keys()
        .chain(
            spec.parameters
                .keys()
                .filter(|k| !spec.base.overrides.contains_key(*k)),
        )
        .count();
    if overrides > MAX_OVERRIDES {
        return Err(Invalid::new(
            "parameters",
            format!(
                "each trial would set {overrides} config keys (the base's overrides and the \
                 parameters); at most {MAX_OVERRIDES} are allowed"
            ),
        ));
    }
    for (key, value) in spec.probe_values() {
        check_override(&format!("parameters.{key}"), &value)?;
    }
    Ok(())
}

/// A value set as a config override: within the size and nesting limits of one.
fn check_override(field: &str, value: &Value) -> Result<(), Invalid> {
    let problem = match value {
        Value::String(text) if text.len() > MAX_OVERRIDE_VALUE_LEN => Some(format!(
            "{field} has a value of {} bytes; at most {MAX_OVERRIDE_VALUE_LEN} are allowed",
            text.len()
        )),
        Value::String(text) => yaml_limit_error(field, text),
        other => config_limit_error(other),
    };
    match problem {
        Some(message) => Err(Invalid::new(field, message)),
        None => Ok(()),
    }
}

/// A command trial's command line: the base command and `--name=value` per parameter, with
/// each parameter's longest value, within a launch's limit.
fn check_command_size(spec: &SweepSpec) -> Result<(), Invalid> {
    let shell = matches!(spec.base.command, Some(Command::Shell(_)));
    let base = match &spec.base.command {
        Some(Command::Shell(line)) => line.len(),
        Some(Command::Argv(argv)) => argv.iter().map(String::len).sum(),
        None => 0,
    };
    let mut longest = std::collections::BTreeMap::<&str, usize>::new();
    for (key, value) in spec.probe_values() {
        let arg = format!("--{key}={}", arg_value(&value));
        let mut len = if shell {
            shell_quote(&arg).len() + 1
        } else {
            arg.len()
        };
        if !value.is_string() {
            len = len.max(key.len() + 3 + NUMBER_ARG_LEN + usize::from(shell) * 3);
        }
        let entry = longest.entry(spec_key(spec, &key)).or_insert(0);
        *entry = (*entry).max(len);
    }
    let size = base + longest.values().sum::<usize>();
    if size > MAX_COMMAND_BYTES {
        return Err(Invalid::new(
            "parameters",
            format!(
                "a trial's command line would be up to {size} bytes long (the base command and \
                 `--name=value` per parameter); at most {MAX_COMMAND_BYTES} are allowed"
            ),
        ));
    }
    Ok(())
}

/// The spec's own copy of `key` (to borrow it for as long as the spec).
fn spec_key<'a>(spec: &'a SweepSpec, key: &str) -> &'a str {
    spec.parameters
        .get_key_value(key)
        .map(|(k, _)| k.as_str())
        .unwrap_or_default()
}

fn check_base(spec: &SweepSpec) -> Result<(), Invalid> {
    let base = &spec.base;
    if let Some(profile) = &base.profile {
        check_len("base.profile", profile, MAX_NAME_LEN)?;
    }
    match &base.config {
        Some(Value::String(text)) => {
            if let Some(message) = yaml_limit_error("base.config", text) {
                return Err(Invalid::new("base.config", message));
            }
        }
        Some(value) => {
            if let Some(message) = config_limit_error(value) {
                return Err(Invalid::new("base.config", message));
            }
        }
        None => {}
    }
    for (key, value) in &base.overrides {
        check_len("base.overrides", key, MAX_PARAM_KEY_LEN)?;
        check_override(&format!("base.overrides.{key}"), value)?;
    }
    if let Some(dir) = &base.working_dir {
        check_len("base.working_dir", dir, MAX_WORKING_DIR_LEN)?;
    }
    match &base.command {
        Some(Command::Shell(line)) if line.trim().is_empty() => Err(Invalid::new(
            "base.command",
            "base.command must not be empty",
        )),
        Some(Command::Argv(argv)) if argv.first().is_none_or(|a| a.is_empty()) => Err(
            Invalid::new("base.command", "base.command must name a program"),
        ),
        _ => Ok(()),
    }
}

/// How a parameter's value is written on a command line: strings as they are, everything else
/// as JSON (numbers, booleans).
pub(super) fn arg_value(value: &serde_json::Value) -> String {
    match value {
        serde_json::Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

/// `text` quoted for `sh`.
pub(super) fn shell_quote(text: &str) -> String {
    format!("'{}'", text.replace('\'', r"'\''"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(name: &str, metric: &str, extra: &str) -> SweepSpec {
        let text = format!(
            "name: {name}\nmetric: {{name: {metric}, goal: minimize}}\nmethod: random\n\
             max_trials: 4\n{extra}"
        );
        SweepSpec::from_yaml_str(&text).expect("spec")
    }

    fn field_of(spec: &SweepSpec) -> String {
        match check(spec) {
            Err(e) => {
                assert!(!e.message.contains('\0'), "{:?}", e.message);
                e.field
            }
            Ok(()) => panic!("expected a refusal of {spec:?}"),
        }
    }

    const PARAMS: &str =
        "base: {profile: tiny}\nparameters:\n  training.learning_rate: {values: [0.001]}\n";

    #[test]
    fn a_valid_spec_passes() {
        check(&spec("s", "loss", PARAMS)).expect("valid");
        let room = "n".repeat(MAX_SWEEP_NAME_LEN);
        check(&spec(&room, "val/loss", PARAMS)).expect("a name at the limit");
        // Its trials' run names fit, whatever the trial number.
        let trial = format!("{room}-{}", u32::MAX);
        crate::validate::Name::parse("name", &trial).expect("a trial's run name");
    }

    #[test]
    fn each_string_the_controller_uses_is_named_when_refused() {
        let long = "n".repeat(MAX_SWEEP_NAME_LEN + 1);
        let cases = [
            (spec(&long, "loss", PARAMS), "name"),
            (spec("\"a\\tb\"", "loss", PARAMS), "name"),
            (spec("\"a\\0b\"", "loss", PARAMS), "name"),
            (spec("s", "\"lo\\0ss\"", PARAMS), "metric.name"),
            (spec("s", "\"lo\\nss\"", PARAMS), "metric.name"),
            (
                spec(
                    "s",
                    "loss",
                    "base: {profile: tiny}\nparameters:\n  \"a\\x07b\": {values: [1]}\n",
                ),
                "parameters",
            ),
            (
                spec(
                    "s",
                    "loss",
                    "base: {command: [python3, f.py]}\nparameters:\n  x: {values: [\"a\\0b\"]}\n",
                ),
                "parameters.x.values[0]",
            ),
            (
                spec(
                    "s",
                    "loss",
                    "base: {profile: tiny, overrides: {training.device: \"c\\0pu\"}}\n\
                     parameters:\n  training.learning_rate: {values: [0.001]}\n",
                ),
                "base.overrides.training.device",
            ),
        ];
        for (spec, field) in cases {
            assert_eq!(field_of(&spec), field, "{spec:?}");
        }
    }

    #[test]
    fn a_command_line_that_would_grow_past_the_launch_limit_is_refused() {
        let value = "v".repeat(MAX_COMMAND_BYTES / 2);
        let extra = format!(
            "base: {{command: \"python3 f.py\"}}\nparameters:\n  a: {{values: [\"{value}\"]}}\n  \
             b: {{values: [\"{value}\"]}}\n"
        );
        assert_eq!(field_of(&spec("s", "loss", &extra)), "parameters");
    }

    #[test]
    fn shown_values_escape_control_characters_and_stay_short() {
        assert_eq!(shown("a\0b\nc"), "a\\u{0}b\\nc");
        assert_eq!(shown(&"x".repeat(100)).chars().count(), SHOWN + 1);
    }
}
