//! Registry searches: MLflow's filter on registered models (`name`, `tags.<key>`) and model
//! versions (`name`, `run_id`, `source_path`, `version_number`, `tags.<key>`), evaluated per
//! row as experiment searches are (a registry holds few models).

use crate::store::filter::Literal;
use crate::store::models::{ModelRow, VersionRow};

use super::super::MlflowError;
use super::experiments::test_value;
use super::grammar::{invalid, parse, Clause, Ident, Test};

/// The tag MLflow's prompt registry marks a prompt with. The official client adds
/// ``tags.`mlflow.prompt.is_prompt` != 'true'`` to every model search so that prompts stay out;
/// as on MLflow's own server, a model without the tag passes that test (it is no prompt).
const IS_PROMPT_TAG: &str = "mlflow.prompt.is_prompt";

/// Whether `c` on a tag the row lacks still passes: only the prompt exclusion above.
fn absent_tag_passes(key: &str, test: &Test) -> bool {
    key == IS_PROMPT_TAG && matches!(test, Test::Cmp("!=", _))
}

/// A parsed registry filter, for models or for versions.
pub struct RegistryFilter(Vec<Clause>);

const MODEL_FIELDS: &[&str] = &["name"];
const VERSION_FIELDS: &[&str] = &["name", "run_id", "source_path", "version_number"];

impl RegistryFilter {
    fn parse_with(input: &str, fields: &[&str], what: &str) -> Result<RegistryFilter, MlflowError> {
        if input.trim().is_empty() {
            return Ok(RegistryFilter(Vec::new()));
        }
        let clauses = parse(input)?;
        for c in &clauses {
            match &c.ident {
                Ident::Tag(_) => {}
                Ident::Attribute(a) if fields.contains(&a.as_str()) => {}
                _ => {
                    return Err(invalid(format!(
                        "{what} are searched by {} and tags.<key>",
                        fields.join(", ")
                    )))
                }
            }
        }
        Ok(RegistryFilter(clauses))
    }

    /// A filter on registered models.
    pub fn models(input: &str) -> Result<RegistryFilter, MlflowError> {
        Self::parse_with(input, MODEL_FIELDS, "registered models")
    }

    /// A filter on model versions.
    pub fn versions(input: &str) -> Result<RegistryFilter, MlflowError> {
        Self::parse_with(input, VERSION_FIELDS, "model versions")
    }

    /// The exact model name the filter asks for (`name = '...'`), to narrow the read.
    pub fn exact_name(&self) -> Option<String> {
        self.0.iter().find_map(|c| match (&c.ident, &c.test) {
            (Ident::Attribute(a), super::grammar::Test::Cmp("=", Literal::Text(name)))
                if a == "name" =>
            {
                Some(name.clone())
            }
            _ => None,
        })
    }

    pub fn matches_model(&self, m: &ModelRow) -> bool {
        self.0.iter().all(|c| {
            let value = match &c.ident {
                Ident::Tag(k) => match m.tags.get(k) {
                    Some(v) => Some(Literal::Text(v.clone())),
                    None if absent_tag_passes(k, &c.test) => return true,
                    None => None,
                },
                _ => Some(Literal::Text(m.name.clone())),
            };
            test_value(&c.test, value.as_ref())
        })
    }

    pub fn matches_version(&self, v: &VersionRow) -> bool {
        self.0.iter().all(|c| {
            let value = match &c.ident {
                Ident::Tag(k) => match v.tags.get(k) {
                    Some(t) => Some(Literal::Text(t.clone())),
                    None if absent_tag_passes(k, &c.test) => return true,
                    None => None,
                },
                Ident::Attribute(a) => match a.as_str() {
                    "name" => Some(Literal::Text(v.model.clone())),
                    "run_id" => v.run_id.clone().map(Literal::Text),
                    "source_path" => Some(Literal::Text(v.source.clone())),
                    _ => Some(Literal::Number(v.version as f64)),
                },
                _ => None,
            };
            test_value(&c.test, value.as_ref())
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    fn model(name: &str) -> ModelRow {
        ModelRow {
            name: name.into(),
            experiment_id: "0".into(),
            description: String::new(),
            tags: BTreeMap::from([("team".to_string(), "nlp".to_string())]),
            aliases: BTreeMap::new(),
            last_version: 0,
            created_by: None,
            creator: None,
            created_at: 0,
            updated_at: 0,
        }
    }

    #[test]
    fn model_names_match_like_ilike_and_tags() {
        let f = RegistryFilter::models("name LIKE 'gpt-%'").expect("parse");
        assert!(f.matches_model(&model("gpt-small")));
        assert!(!f.matches_model(&model("GPT-small")));
        let f = RegistryFilter::models("name ILIKE 'gpt-%' AND tags.team = 'nlp'").expect("parse");
        assert!(f.matches_model(&model("GPT-small")));
        let f = RegistryFilter::models("name = 'gpt-small'").expect("parse");
        assert_eq!(f.exact_name().as_deref(), Some("gpt-small"));
        assert!(RegistryFilter::models("run_id = 'x'").is_err());
        assert!(RegistryFilter::versions("run_id = 'x'").is_ok());
    }
}
