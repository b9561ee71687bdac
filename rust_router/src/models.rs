//! Which models one server serves: every `--model-id`, each as `ID` or `NAME=ID`, the first
//! being the default (the model of requests that name none).

use std::collections::HashSet;

/// One `--model-id` value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ModelSpec {
    /// What requests select it by (`model` in a body, `/info?model=`, `/v1/models`).
    pub name: String,
    /// A hub id or a local folder, as the runtime loads it.
    pub id: String,
}

impl ModelSpec {
    /// `NAME=ID`, or `ID` alone, named after its last path component
    /// (`sentence-transformers/all-MiniLM-L6-v2` is `all-MiniLM-L6-v2`).
    pub fn parse(value: &str) -> Result<Self, String> {
        let value = value.trim();
        let (name, id) = match value.split_once('=') {
            Some((name, id)) => (name.trim().to_string(), id.trim().to_string()),
            None => (last_component(value).to_string(), value.to_string()),
        };
        if id.is_empty() {
            return Err(format!(
                "`{value}`: expected ID or NAME=ID, with a model id"
            ));
        }
        if name.is_empty() || name.chars().any(char::is_whitespace) {
            return Err(format!(
                "`{value}`: a model's name must be non-empty and without spaces"
            ));
        }
        Ok(Self { name, id })
    }

    /// Whether a request's `model` selects this model: its name or its full id.
    pub fn answers_to(&self, requested: &str) -> bool {
        requested == self.name || requested == self.id
    }
}

fn last_component(id: &str) -> &str {
    let trimmed = id.trim_end_matches('/');
    trimmed.rsplit('/').next().unwrap_or(trimmed)
}

/// Refuses two models under one name: a request could not tell them apart.
pub fn check_unique(models: &[ModelSpec]) -> Result<(), String> {
    let mut seen = HashSet::new();
    for model in models {
        if !seen.insert(model.name.as_str()) {
            return Err(format!(
                "two models are named `{}`: give them names with --model-id NAME=ID",
                model.name
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_default_to_the_last_path_component() {
        let m = ModelSpec::parse("sentence-transformers/all-MiniLM-L6-v2").unwrap();
        assert_eq!(m.name, "all-MiniLM-L6-v2");
        assert_eq!(m.id, "sentence-transformers/all-MiniLM-L6-v2");
        assert_eq!(ModelSpec::parse("/models/bge/").unwrap().name, "bge");
        let named = ModelSpec::parse("rr=BAAI/bge-reranker-base").unwrap();
        assert_eq!(
            (named.name.as_str(), named.id.as_str()),
            ("rr", "BAAI/bge-reranker-base")
        );
        assert!(named.answers_to("rr") && named.answers_to("BAAI/bge-reranker-base"));
        assert!(!named.answers_to("bge-reranker-base"));
    }

    #[test]
    fn bad_values_and_duplicate_names_are_refused() {
        assert!(ModelSpec::parse("rr=").unwrap_err().contains("NAME=ID"));
        assert!(ModelSpec::parse("=x").unwrap_err().contains("non-empty"));
        assert!(ModelSpec::parse("a b=x")
            .unwrap_err()
            .contains("without spaces"));
        let two = [
            ModelSpec::parse("a/m").unwrap(),
            ModelSpec::parse("b/m").unwrap(),
        ];
        assert!(check_unique(&two)
            .unwrap_err()
            .contains("two models are named `m`"));
        let ok = [
            ModelSpec::parse("a/m").unwrap(),
            ModelSpec::parse("n=b/m").unwrap(),
        ];
        assert!(check_unique(&ok).is_ok());
    }
}
