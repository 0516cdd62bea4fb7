//! How much text a client may store per field, checked before anything reaches the store or a
//! parser. Every limit is one constant here; a field over its limit is refused naming the field
//! and the limit. `docs/security.md` lists them for users.

use super::Invalid;

/// Largest step a point may have: 2^53. Steps from 0 to this are exact as JSON numbers in
/// every client (a JavaScript number holds integers exactly only up to 2^53, and the dashboard
/// charts are JavaScript), far more than any training run counts, and far enough from
/// `i64::MAX` that step arithmetic (bucket widths, ranges) cannot overflow.
pub const MAX_STEP: i64 = 1 << 53;

/// Experiment, run and tag-key names, in bytes.
pub const MAX_NAME_LEN: usize = 200;
/// A run's notes, in bytes.
pub const MAX_NOTES_LEN: usize = 64 * 1024;
/// One tag value, in bytes.
pub const MAX_TAG_VALUE_LEN: usize = 4 * 1024;
/// Tags in one request.
pub const MAX_TAGS: usize = 256;
/// A config as YAML text or serialized JSON, in bytes.
pub const MAX_CONFIG_BYTES: usize = 256 * 1024;
/// Nesting of a config (mappings and sequences inside each other).
pub const MAX_CONFIG_DEPTH: usize = 32;
/// A flattened config key (`training.lr`), in bytes.
pub const MAX_PARAM_KEY_LEN: usize = 500;
/// A flattened config value, in bytes.
pub const MAX_PARAM_VALUE_LEN: usize = 16 * 1024;
/// A status change's reason, in bytes (shared with the trainer, which shortens its own).
pub use trainer::wire::MAX_REASON_LEN;
/// A launch's custom command (the shell line, or all argv items together), in bytes.
pub const MAX_COMMAND_BYTES: usize = 16 * 1024;
/// Items of a launch's `overrides`.
pub const MAX_OVERRIDES: usize = 100;
/// One override value, in bytes (it is parsed as YAML like a config).
pub const MAX_OVERRIDE_VALUE_LEN: usize = 4 * 1024;
/// A launch's `working_dir`, in bytes (Linux' PATH_MAX).
pub const MAX_WORKING_DIR_LEN: usize = 4096;
/// Notes shown per run in the runs list; the whole text is on `GET /api/v1/runs/{id}`.
pub const LIST_NOTES_LEN: usize = 1024;

fn too_long(field: &str, len: usize, max: usize) -> Invalid {
    Invalid::new(
        field,
        format!("{field} is {len} bytes long; at most {max} are allowed"),
    )
}

/// At most `max` bytes.
pub fn check_len(field: &str, text: &str, max: usize) -> Result<(), Invalid> {
    if text.len() > max {
        return Err(too_long(field, text.len(), max));
    }
    Ok(())
}

/// The size and nesting limits of a config, as a message.
pub fn config_limit_error(config: &serde_json::Value) -> Option<String> {
    let size = json_size(config);
    if size > MAX_CONFIG_BYTES {
        return Some(format!(
            "config is {size} bytes as JSON; at most {MAX_CONFIG_BYTES} are allowed"
        ));
    }
    let depth = json_depth(config);
    if depth > MAX_CONFIG_DEPTH {
        return Some(format!(
            "config is nested {depth} levels deep; at most {MAX_CONFIG_DEPTH} are allowed"
        ));
    }
    None
}

/// The same limits for YAML text, checked without parsing it.
pub fn yaml_limit_error(field: &str, text: &str) -> Option<String> {
    if text.len() > MAX_CONFIG_BYTES {
        return Some(format!(
            "{field} is {} bytes long; at most {MAX_CONFIG_BYTES} are allowed",
            text.len()
        ));
    }
    let depth = yaml_nesting(text);
    if depth > MAX_CONFIG_DEPTH {
        return Some(format!(
            "{field} is nested {depth} levels deep; at most {MAX_CONFIG_DEPTH} are allowed"
        ));
    }
    None
}

/// A tracked run's config (`POST /runs` without launch, `PATCH /runs/{id}`): a JSON object
/// within the size and nesting limits whose flattened keys and values are bounded too.
pub fn check_tracked_config(config: &serde_json::Value) -> Result<(), Invalid> {
    if !config.is_object() {
        return Err(Invalid::new("config", "config must be a JSON object"));
    }
    if let Some(message) = config_limit_error(config) {
        return Err(Invalid::new("config", message));
    }
    for (key, value) in super::flatten_params(config) {
        if key.len() > MAX_PARAM_KEY_LEN {
            return Err(Invalid::new(
                "config",
                format!(
                    "config key `{}…` is {} bytes long; at most {MAX_PARAM_KEY_LEN} are allowed",
                    preview(&key, 40),
                    key.len()
                ),
            ));
        }
        check_len(&format!("config.{key}"), &value, MAX_PARAM_VALUE_LEN)?;
    }
    Ok(())
}

/// The first `max` bytes of `text`, cut at a character boundary.
pub fn preview(text: &str, max: usize) -> &str {
    if text.len() <= max {
        return text;
    }
    let mut end = max;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    &text[..end]
}

fn json_size(value: &serde_json::Value) -> usize {
    struct Count(usize);
    impl std::io::Write for Count {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0 += buf.len();
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let mut count = Count(0);
    // Writing to a counter cannot fail.
    let _ = serde_json::to_writer(&mut count, value);
    count.0
}

/// Levels of objects and arrays; a scalar is 0. (serde_json's parser already stops at 128, so
/// this recursion is bounded.)
fn json_depth(value: &serde_json::Value) -> usize {
    match value {
        serde_json::Value::Object(map) => 1 + map.values().map(json_depth).max().unwrap_or(0),
        serde_json::Value::Array(items) => 1 + items.iter().map(json_depth).max().unwrap_or(0),
        _ => 0,
    }
}

/// An upper bound of a YAML document's nesting, in one pass without parsing: block
/// indentation levels, `- ` entries opened on one line (`- - x`), and open flow brackets (`[`,
/// `{`, which may span lines). Quoted text, comments and block scalars (`|`, `>`) are skipped.
/// It may count a bracket inside an unquoted scalar, never fewer levels than a parser sees.
pub fn yaml_nesting(text: &str) -> usize {
    let mut indents: Vec<usize> = Vec::new();
    let mut flow = 0usize;
    let mut deepest = 0;
    // The indentation of the line that opened a block scalar: deeper lines are its text.
    let mut block_scalar: Option<usize> = None;
    for line in text.lines() {
        let body = line.trim_start_matches(' ');
        let indent = line.len() - body.len();
        if body.trim().is_empty() {
            continue;
        }
        if let Some(owner) = block_scalar {
            if indent > owner {
                continue;
            }
            block_scalar = None;
        }
        if body.starts_with('#') {
            continue;
        }
        if flow == 0 {
            while indents.last().is_some_and(|&top| top > indent) {
                indents.pop();
            }
            if indents.last().is_none_or(|&top| top < indent) {
                indents.push(indent);
            }
        }
        let mut rest = body;
        let mut dashes = 0;
        while let Some(after) = rest
            .strip_prefix('-')
            .or_else(|| rest.strip_prefix('?'))
            .filter(|r| r.is_empty() || r.starts_with([' ', '\t']))
        {
            dashes += 1;
            rest = after.trim_start();
        }
        let (line_flow, ends_with_block_indicator) = scan_flow(rest, &mut flow);
        deepest = deepest.max(indents.len() + dashes + line_flow);
        if ends_with_block_indicator {
            block_scalar = Some(indent);
        }
    }
    deepest
}

/// Walks one line's content outside quotes and comments, updating the open flow depth; returns
/// the deepest flow level reached on the line and whether the line ends with a block scalar
/// indicator (`key: |`, `- >-`).
fn scan_flow(rest: &str, flow: &mut usize) -> (usize, bool) {
    let mut deepest = *flow;
    let mut quote: Option<char> = None;
    let mut previous = ' ';
    let mut content_end = rest.len();
    for (i, c) in rest.char_indices() {
        match quote {
            Some(q) if c == q => quote = None,
            Some(_) => {}
            None => match c {
                '\'' | '"' if previous == ' ' || "[{,:".contains(previous) => quote = Some(c),
                '#' if previous == ' ' || previous == '\t' => {
                    content_end = i;
                    break;
                }
                '[' | '{' => {
                    *flow += 1;
                    deepest = deepest.max(*flow);
                }
                ']' | '}' => *flow = flow.saturating_sub(1),
                _ => {}
            },
        }
        previous = c;
    }
    let content = rest[..content_end].trim_end();
    let last_word = content.rsplit([' ', '\t']).next().unwrap_or("");
    let block = quote.is_none()
        && last_word.starts_with(['|', '>'])
        && last_word[1..]
            .chars()
            .all(|c| c == '-' || c == '+' || c.is_ascii_digit());
    (deepest, block)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn yaml_nesting_counts_block_sequence_and_flow_levels() {
        let cases = [
            ("", 0),
            ("a: 1\n", 1),
            ("a:\n  b:\n    c: 1\n", 3),
            ("a:\n- x\n- y\n", 2),
            ("- - - x\n", 4),
            ("a: [1, [2, [3]]]\n", 4),
            ("a: {b: {c: {d: 1}}}\n", 4),
            ("a: [\n  [\n    [1]\n  ]\n]\n", 4),
            ("a: '[[[[not nested]]]]'\n", 1),
            ("a: 1 # [[[[ a comment\n", 1),
            (
                "text: |\n  line\n      indented prose\n          more\nb: 1\n",
                1,
            ),
            ("# only a comment\n", 0),
        ];
        for (text, depth) in cases {
            assert_eq!(yaml_nesting(text), depth, "{text:?}");
        }
    }

    #[test]
    fn yaml_nesting_never_counts_fewer_levels_than_the_parser_sees() {
        for depth in [1usize, 5, 20, 40] {
            let flow = format!("a: {}1{}\n", "[".repeat(depth), "]".repeat(depth));
            assert!(yaml_nesting(&flow) > depth, "flow {depth}");
            let block: String = (0..depth)
                .map(|i| format!("{}k{i}:\n", "  ".repeat(i)))
                .collect::<String>()
                + &format!("{}v: 1\n", "  ".repeat(depth));
            assert!(yaml_nesting(&block) > depth, "block {depth}");
        }
    }

    #[test]
    fn over_deep_or_over_large_configs_are_refused_with_the_limit() {
        let deep = format!("a: {}1{}", "[".repeat(40), "]".repeat(40));
        let message = yaml_limit_error("config", &deep).expect("too deep");
        assert!(message.contains(&MAX_CONFIG_DEPTH.to_string()), "{message}");
        let large = format!("a: \"{}\"", "x".repeat(MAX_CONFIG_BYTES));
        let message = yaml_limit_error("config", &large).expect("too large");
        assert!(message.contains(&MAX_CONFIG_BYTES.to_string()), "{message}");
        assert_eq!(yaml_limit_error("config", "training:\n  lr: 0.001\n"), None);

        let mut nested = json!(1);
        for _ in 0..40 {
            nested = json!({ "k": nested });
        }
        assert!(config_limit_error(&nested).is_some_and(|m| m.contains("nested 40")));
        assert_eq!(config_limit_error(&json!({"a": {"b": 1}})), None);
    }

    #[test]
    fn a_preview_cuts_at_a_character_boundary() {
        assert_eq!(preview("héllo", 2), "h");
        assert_eq!(preview("héllo", 3), "hé");
        assert_eq!(preview("abc", 10), "abc");
    }
}
