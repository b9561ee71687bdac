//! Which models one server serves: every `--model-id`, each as `ID` or `NAME=ID`, then the
//! entries of `--models FILE` (`models_file`), the first being the default (the model of
//! requests that name none), and the LoRA adapters (`--lora-adapter NAME=PATH`) each of them
//! loads.

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
            Some((name, id)) => (Some(name), id),
            None => (None, value),
        };
        Self::named(name, id).map_err(|e| format!("`{value}`: {e}"))
    }

    /// The model `id` under `name`, or under its id's last path component when `name` is None.
    pub fn named(name: Option<&str>, id: &str) -> Result<Self, String> {
        let id = id.trim();
        if id.is_empty() {
            return Err("expected ID or NAME=ID, with a model id".into());
        }
        let name = name.map_or_else(|| last_component(id), str::trim);
        if name.is_empty() || name.chars().any(char::is_whitespace) {
            return Err("a model's name must be non-empty and without spaces".into());
        }
        Ok(Self {
            name: name.to_string(),
            id: id.to_string(),
        })
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

/// One `--lora-adapter NAME=PATH`: a PEFT LoRA folder (`adapter_config.json`,
/// `adapter_model.safetensors`) that requests select with `model: NAME`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LoraSpec {
    pub name: String,
    pub path: String,
}

impl LoraSpec {
    pub fn parse(value: &str) -> Result<Self, String> {
        match value.trim().split_once('=') {
            Some((name, path)) => Self::new(name, path),
            None => Err(format!(
                "`{value}`: expected NAME=PATH (a name without spaces, a PEFT LoRA folder)"
            )),
        }
    }

    /// The adapter folder `path` under `name` (non-empty, without spaces).
    pub fn new(name: &str, path: &str) -> Result<Self, String> {
        let (name, path) = (name.trim(), path.trim());
        if name.is_empty() || path.is_empty() || name.chars().any(char::is_whitespace) {
            return Err(format!(
                "`{name}={path}`: expected NAME=PATH (a name without spaces, a PEFT LoRA folder)"
            ));
        }
        Ok(Self {
            name: name.to_string(),
            path: path.to_string(),
        })
    }

    /// `base_model_name_or_path` of its `adapter_config.json` (None when it names none).
    fn base_model(&self) -> Result<Option<String>, String> {
        let config = std::path::Path::new(&self.path).join("adapter_config.json");
        let text = std::fs::read_to_string(&config).map_err(|e| {
            format!(
                "--lora-adapter {}: cannot read {}: {e} (expected a PEFT LoRA folder)",
                self.name,
                config.display()
            )
        })?;
        let json: serde_json::Value = serde_json::from_str(&text)
            .map_err(|e| format!("--lora-adapter {}: {}: {e}", self.name, config.display()))?;
        Ok(json
            .get("base_model_name_or_path")
            .and_then(|v| v.as_str())
            .map(str::to_string))
    }
}

/// Each model's adapters, in model order: an adapter goes to the model its
/// `base_model_name_or_path` names (by id or name), else to the default model.
pub fn assign_adapters(
    models: &[ModelSpec],
    adapters: &[LoraSpec],
) -> Result<Vec<Vec<LoraSpec>>, String> {
    let mut assigned = vec![Vec::new(); models.len()];
    for adapter in adapters {
        let base = adapter.base_model()?;
        let index = base
            .and_then(|b| models.iter().position(|m| m.answers_to(&b)))
            .unwrap_or(0);
        assigned[index].push(adapter.clone());
    }
    Ok(assigned)
}

/// Refuses two models or adapters under one name: a request could not tell them apart.
pub fn check_unique(models: &[ModelSpec], adapters: &[LoraSpec]) -> Result<(), String> {
    let mut seen = HashSet::new();
    for model in models {
        if !seen.insert(model.name.as_str()) {
            return Err(format!(
                "two models are named `{}`: give them names with --model-id NAME=ID or `name:` \
                 in the --models file",
                model.name
            ));
        }
    }
    for adapter in adapters {
        if !seen.insert(adapter.name.as_str()) {
            return Err(format!(
                "`{}` names a model or adapter already: each LoRA adapter (--lora-adapter, or \
                 `lora_adapters` in the --models file) needs a name of its own",
                adapter.name
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
        assert!(check_unique(&two, &[])
            .unwrap_err()
            .contains("two models are named `m`"));
        let ok = [
            ModelSpec::parse("a/m").unwrap(),
            ModelSpec::parse("n=b/m").unwrap(),
        ];
        assert!(check_unique(&ok, &[]).is_ok());
        let clash = [LoraSpec::parse("n=/x").unwrap()];
        assert!(check_unique(&ok, &clash)
            .unwrap_err()
            .contains("`n` names a model"));
        assert!(LoraSpec::parse("/just/a/path")
            .unwrap_err()
            .contains("NAME=PATH"));
    }

    #[test]
    fn adapters_go_to_the_model_their_config_names_else_the_default() {
        let dir = std::env::temp_dir().join(format!("lora-spec-{}", std::process::id()));
        let write = |name: &str, base: &str| {
            let folder = dir.join(name);
            std::fs::create_dir_all(&folder).unwrap();
            let config = format!(r#"{{"base_model_name_or_path": "{base}", "r": 8}}"#);
            std::fs::write(folder.join("adapter_config.json"), config).unwrap();
            LoraSpec::parse(&format!("{name}={}", folder.display())).unwrap()
        };
        let models = [
            ModelSpec::parse("org/embedder").unwrap(),
            ModelSpec::parse("rr=org/reranker").unwrap(),
        ];
        let adapters = [
            write("a", "org/reranker"),
            write("b", "rr"),
            write("c", "someone/else"),
        ];
        let assigned = assign_adapters(&models, &adapters).unwrap();
        let names = |i: usize| {
            assigned[i]
                .iter()
                .map(|a| a.name.as_str())
                .collect::<Vec<_>>()
        };
        assert_eq!(names(0), ["c"]);
        assert_eq!(names(1), ["a", "b"]);
        let missing = LoraSpec::parse("m=/no/such/folder").unwrap();
        let err = assign_adapters(&models, &[missing]).unwrap_err();
        assert!(
            err.contains("cannot read") && err.contains("PEFT LoRA folder"),
            "{err}"
        );
        std::fs::remove_dir_all(dir).unwrap();
    }
}
