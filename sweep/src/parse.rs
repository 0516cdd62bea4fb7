//! Reading a spec by walking the JSON value by hand: every mistake is reported with the path of
//! the key at fault and a reason in plain words (serde's derive errors would name Rust types).

use std::collections::BTreeMap;

use serde_json::{Map, Value};

use crate::params::parse_parameters;
use crate::spec::{
    Base, Command, EarlyTerminate, Goal, Method, Metric, Resources, SpecError, SweepSpec,
};

pub(crate) const MAX_NAME: usize = 200;
pub(crate) const MAX_TRIALS: u32 = 10_000;
pub(crate) const MAX_PARALLEL: u32 = 256;
pub(crate) const MAX_GRID: u64 = 10_000;

pub(crate) type Res<T> = Result<T, SpecError>;

pub(crate) fn join(path: &str, key: &str) -> String {
    if path.is_empty() {
        key.to_string()
    } else {
        format!("{path}.{key}")
    }
}

/// What a value is, in words, for error messages.
pub(crate) fn describe(v: &Value) -> String {
    match v {
        Value::Null => "nothing".into(),
        Value::Bool(b) => format!("{b}"),
        Value::Number(n) => format!("the number {n}"),
        Value::String(s) if s.chars().count() > 40 => "a long text".into(),
        Value::String(s) => format!("the text `{s}`"),
        Value::Array(_) => "a list".into(),
        Value::Object(_) => "a mapping".into(),
    }
}

/// A mapping being read, with its path for error messages.
pub(crate) struct Obj<'a> {
    pub path: String,
    pub map: &'a Map<String, Value>,
}

impl<'a> Obj<'a> {
    pub fn new(v: &'a Value, path: &str) -> Res<Obj<'a>> {
        match v {
            Value::Object(map) => Ok(Obj {
                path: path.to_string(),
                map,
            }),
            other => Err(SpecError::new(
                if path.is_empty() { "spec" } else { path },
                format!(
                    "must be a mapping of keys to values (got {})",
                    describe(other)
                ),
            )),
        }
    }

    pub fn field(&self, key: &str) -> String {
        join(&self.path, key)
    }

    /// Rejects keys outside `allowed`, naming the key; `hint` may add a word about a key that
    /// belongs somewhere else (a W&B key, say).
    pub fn check_keys(&self, allowed: &[&str], hint: impl Fn(&str) -> Option<String>) -> Res<()> {
        for key in self.map.keys() {
            if !allowed.contains(&key.as_str()) {
                let reason = hint(key).unwrap_or_else(|| {
                    format!(
                        "unknown key `{key}`; expected one of: {}",
                        allowed.join(", ")
                    )
                });
                return Err(SpecError::new(self.field(key), reason));
            }
        }
        Ok(())
    }

    /// A key's value; an explicit null counts as absent.
    pub fn get(&self, key: &str) -> Option<&'a Value> {
        self.map.get(key).filter(|v| !v.is_null())
    }

    pub fn has(&self, key: &str) -> bool {
        self.get(key).is_some()
    }

    pub fn require(&self, key: &str) -> Res<&'a Value> {
        self.get(key)
            .ok_or_else(|| SpecError::new(self.field(key), "is required"))
    }

    /// A key given under its name or under an alias (not both).
    pub fn aliased(&self, key: &str, alias: &str) -> Res<Option<(&'a Value, String)>> {
        match (self.get(key), self.get(alias)) {
            (Some(_), Some(_)) => Err(SpecError::new(
                self.field(alias),
                format!("give either {key} or {alias} (the same setting), not both"),
            )),
            (Some(v), None) => Ok(Some((v, self.field(key)))),
            (None, Some(v)) => Ok(Some((v, self.field(alias)))),
            (None, None) => Ok(None),
        }
    }

    pub fn string(&self, key: &str) -> Res<Option<String>> {
        self.get(key).map(|v| text(v, &self.field(key))).transpose()
    }
}

pub(crate) fn text(v: &Value, field: &str) -> Res<String> {
    match v {
        Value::String(s) => Ok(s.clone()),
        other => Err(SpecError::new(
            field,
            format!("must be text (got {})", describe(other)),
        )),
    }
}

/// A number; text that reads as one is accepted too, because YAML 1.1 readers leave `1e-4`
/// (no dot) as text and people write it that way.
pub(crate) fn number(v: &Value, field: &str) -> Res<f64> {
    let x = match v {
        Value::Number(n) => n.as_f64(),
        Value::String(s) => s.trim().parse::<f64>().ok(),
        _ => None,
    };
    match x {
        Some(x) if x.is_finite() => Ok(x),
        _ => Err(SpecError::new(
            field,
            format!("must be a number (got {})", describe(v)),
        )),
    }
}

pub(crate) fn integer(v: &Value, field: &str) -> Res<i64> {
    if let Some(i) = v.as_i64() {
        return Ok(i);
    }
    let x = number(v, field)?;
    if x.fract() != 0.0 || x.abs() > 9.0e15 {
        return Err(SpecError::new(
            field,
            format!("must be a whole number (got {x})"),
        ));
    }
    Ok(x as i64)
}

/// A whole number in `lo..=hi`.
pub(crate) fn bounded(v: &Value, field: &str, lo: i64, hi: i64) -> Res<i64> {
    let i = integer(v, field)?;
    if i < lo || i > hi {
        return Err(SpecError::new(
            field,
            format!("must be between {lo} and {hi} (got {i})"),
        ));
    }
    Ok(i)
}

const TOP_KEYS: &[&str] = &[
    "name",
    "experiment",
    "base",
    "metric",
    "method",
    "parameters",
    "early_terminate",
    "max_trials",
    "run_cap",
    "parallel",
    "resources",
    "seed",
];

fn top_hint(key: &str) -> Option<String> {
    let h = match key {
        "program" | "command" => {
            "W&B's program/command go under base.command here (or use base.profile or base.config)"
        }
        "project" | "entity" => {
            "W&B's project/entity have no meaning here; use `experiment` to group the trials"
        }
        "description" => {
            "descriptions are not part of the spec; put it in the name or the experiment"
        }
        _ => return None,
    };
    Some(format!("unknown key `{key}`: {h}"))
}

pub(crate) fn parse_spec(v: &Value) -> Res<SweepSpec> {
    let top = Obj::new(v, "")?;
    top.check_keys(TOP_KEYS, top_hint)?;

    let name = text(top.require("name")?, "name")?;
    if name.trim().is_empty() {
        return Err(SpecError::new("name", "must not be empty"));
    }
    if name.chars().count() > MAX_NAME {
        return Err(SpecError::new(
            "name",
            format!("must be at most {MAX_NAME} characters"),
        ));
    }
    let experiment = top.string("experiment")?;
    if experiment.as_deref().is_some_and(|e| e.trim().is_empty()) {
        return Err(SpecError::new("experiment", "must not be empty when given"));
    }
    let base = parse_base(top.require("base")?)?;
    let metric = parse_metric(top.require("metric")?)?;
    let method = parse_method(top.require("method")?)?;
    let parameters = parse_parameters(top.require("parameters")?)?;
    for key in parameters.keys() {
        if base.overrides.contains_key(key) {
            return Err(SpecError::new(
                format!("parameters.{key}"),
                "is also set in base.overrides; a key is either fixed there or searched here",
            ));
        }
    }
    let early_terminate = match top.get("early_terminate") {
        Some(v) => crate::params::parse_early_terminate(v)?,
        None => EarlyTerminate::None,
    };

    let mut spec = SweepSpec {
        name,
        experiment,
        base,
        metric,
        method,
        parameters,
        early_terminate,
        max_trials: 0,
        parallel: 1,
        resources: Resources::default(),
        seed: 0,
    };

    let grid_size = if method == Method::Grid {
        Some(check_grid(&spec)?)
    } else {
        None
    };
    spec.max_trials = match (top.aliased("max_trials", "run_cap")?, grid_size) {
        (Some((v, field)), _) => bounded(v, &field, 1, MAX_TRIALS.into())? as u32,
        // Validated to be at most MAX_GRID, which fits.
        (None, Some(size)) => size as u32,
        (None, None) => return Err(SpecError::new(
            "max_trials",
            "is required for random, tpe, bayes and auto search (only a grid has a natural size)",
        )),
    };
    if let Some(v) = top.get("parallel") {
        spec.parallel = bounded(v, "parallel", 1, MAX_PARALLEL.into())? as u32;
    }
    if let Some(v) = top.get("resources") {
        let res = Obj::new(v, "resources")?;
        res.check_keys(&["gpus"], |_| None)?;
        if let Some(g) = res.get("gpus") {
            spec.resources.gpus = bounded(g, "resources.gpus", 0, 1024)? as usize;
        }
    }
    if let Some(s) = top.get("seed") {
        spec.seed = match s.as_u64() {
            Some(seed) => seed,
            None => bounded(s, "seed", 0, i64::MAX)? as u64,
        };
    }
    Ok(spec)
}

/// The grid size, or an error naming the parameter that has no grid or saying the size.
fn check_grid(spec: &SweepSpec) -> Res<u64> {
    for (key, param) in &spec.parameters {
        if crate::space::grid_count(param).is_none() {
            return Err(SpecError::new(
                format!("parameters.{key}"),
                "grid search needs a finite set of values, and this range is continuous; use values, \
                 int_uniform or q_uniform, or the random, tpe or bayes method",
            ));
        }
    }
    match spec.grid_size() {
        Some(size) if size <= MAX_GRID => Ok(size),
        size => Err(SpecError::new(
            "parameters",
            match size {
                Some(s) => format!("the grid has {s} points, more than the limit of {MAX_GRID}; use random, tpe or bayes search"),
                None => format!("the grid has more points than can be counted (the limit is {MAX_GRID})"),
            },
        )),
    }
}

fn parse_base(v: &Value) -> Res<Base> {
    let obj = Obj::new(v, "base")?;
    obj.check_keys(
        &["profile", "config", "command", "overrides", "working_dir"],
        |_| None,
    )?;
    let given: Vec<&str> = ["profile", "config", "command"]
        .into_iter()
        .filter(|k| obj.has(k))
        .collect();
    if given.len() != 1 {
        return Err(SpecError::new(
            "base",
            if given.is_empty() {
                "needs one of profile, config or command".to_string()
            } else {
                format!(
                    "give exactly one of profile, config or command (got {})",
                    given.join(" and ")
                )
            },
        ));
    }
    let mut base = Base {
        profile: obj.string("profile")?,
        working_dir: obj.string("working_dir")?,
        ..Base::default()
    };
    if base.profile.as_deref().is_some_and(|p| p.trim().is_empty()) {
        return Err(SpecError::new("base.profile", "must not be empty"));
    }
    if let Some(c) = obj.get("config") {
        match c {
            Value::String(s) if s.trim().is_empty() => {
                return Err(SpecError::new("base.config", "must not be empty"))
            }
            Value::String(_) | Value::Object(_) => base.config = Some(c.clone()),
            other => {
                return Err(SpecError::new(
                    "base.config",
                    format!("must be YAML text or a mapping (got {})", describe(other)),
                ))
            }
        }
    }
    if let Some(c) = obj.get("command") {
        base.command = Some(parse_command(c)?);
    }
    if let Some(o) = obj.get("overrides") {
        if base.command.is_some() {
            return Err(SpecError::new(
                "base.overrides",
                "cannot be used with command (a command is not configured through config keys)",
            ));
        }
        let map = Obj::new(o, "base.overrides")?;
        let mut overrides = BTreeMap::new();
        for (key, value) in map.map {
            if key.trim().is_empty() {
                return Err(SpecError::new("base.overrides", "a key must not be empty"));
            }
            overrides.insert(key.clone(), value.clone());
        }
        base.overrides = overrides;
    }
    Ok(base)
}

fn parse_command(v: &Value) -> Res<Command> {
    const F: &str = "base.command";
    match v {
        Value::String(s) if s.trim().is_empty() => Err(SpecError::new(F, "must not be empty")),
        Value::String(s) => Ok(Command::Shell(s.clone())),
        Value::Array(items) if items.is_empty() => {
            Err(SpecError::new(F, "must not be an empty list"))
        }
        Value::Array(items) => {
            let argv = items
                .iter()
                .enumerate()
                .map(|(i, a)| match a {
                    Value::String(s) => Ok(s.clone()),
                    // Numbers in an argument list are harmless; keep them as written.
                    Value::Number(n) => Ok(n.to_string()),
                    other => Err(SpecError::new(
                        format!("{F}[{i}]"),
                        format!("must be text (got {})", describe(other)),
                    )),
                })
                .collect::<Res<Vec<String>>>()?;
            Ok(Command::Argv(argv))
        }
        other => Err(SpecError::new(
            F,
            format!(
                "must be a command line or a list of arguments (got {})",
                describe(other)
            ),
        )),
    }
}

fn parse_metric(v: &Value) -> Res<Metric> {
    let obj = Obj::new(v, "metric")?;
    obj.check_keys(&["name", "goal"], |_| None)?;
    let name = text(obj.require("name")?, "metric.name")?;
    if name.trim().is_empty() {
        return Err(SpecError::new("metric.name", "must not be empty"));
    }
    let goal = match obj.string("goal")?.as_deref() {
        None | Some("minimize") => Goal::Minimize,
        Some("maximize") => Goal::Maximize,
        Some(other) => {
            return Err(SpecError::new(
                "metric.goal",
                format!("unknown goal `{other}`; expected minimize or maximize"),
            ))
        }
    };
    Ok(Metric { name, goal })
}

fn parse_method(v: &Value) -> Res<Method> {
    match text(v, "method")?.as_str() {
        "grid" => Ok(Method::Grid),
        "random" => Ok(Method::Random),
        "tpe" => Ok(Method::Tpe),
        "bayes" => Ok(Method::Bayes),
        "auto" => Ok(Method::Auto),
        other => Err(SpecError::new(
            "method",
            format!("unknown method `{other}`; expected grid, random, tpe, bayes or auto"),
        )),
    }
}
