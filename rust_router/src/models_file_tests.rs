use super::*;
use crate::cli::Args;
use crate::tokenization::LongInput;
use clap::Parser;
use std::path::PathBuf;

/// A models file in the temporary folder, removed when dropped.
struct TempFile(PathBuf);

impl TempFile {
    fn new(text: &str) -> Self {
        use std::sync::atomic::{AtomicUsize, Ordering};
        static NEXT: AtomicUsize = AtomicUsize::new(0);
        let name = format!(
            "models-file-{}-{}.yaml",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        );
        let path = std::env::temp_dir().join(name);
        std::fs::write(&path, text).unwrap();
        TempFile(path)
    }

    fn path(&self) -> &str {
        self.0.to_str().unwrap()
    }
}

impl Drop for TempFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

fn args(flags: &[&str]) -> Result<Args, String> {
    let argv = ["text-embeddings-router"].iter().chain(flags);
    Args::try_parse_from(argv).map_err(|e| e.to_string())
}

const EVERY_KEY: &str = "
- model_id: BAAI/bge-base-en-v1.5
  name: bge
  revision: v2
  dtype: bfloat16
  pooling: cls
  task: embed
  max_active_dims: 64
  default_prompt_name: query
  max_batch_tokens: 8192
  max_batch_requests: 16
  max_client_batch_size: 8
  auto_truncate: true
  long_input: chunk
  max_chunks: 16
  lora_adapters:
    legal: /adapters/legal
    medical: /adapters/medical
  weight: 2.5
- model_id: /models/bge-reranker-base/
  default_prompt: 'query: '
";

#[test]
fn every_key_is_read_and_absent_ones_are_unset() {
    let parsed = ModelsFile::parse(EVERY_KEY).unwrap();
    let [bge, reranker] = parsed.models.as_slice() else {
        panic!("two entries: {parsed:?}");
    };
    assert_eq!(
        (bge.spec.name.as_str(), bge.spec.id.as_str()),
        ("bge", "BAAI/bge-base-en-v1.5")
    );
    assert_eq!(
        bge.options,
        ModelOptions {
            revision: Some("v2".into()),
            dtype: Some("bfloat16".into()),
            pooling: Some("cls".into()),
            task: Some("embed".into()),
            max_active_dims: Some(64),
            default_prompt_name: Some("query".into()),
            default_prompt: None,
            max_batch_tokens: Some(8192),
            max_batch_requests: Some(16),
            max_client_batch_size: Some(8),
            auto_truncate: Some(true),
            long_input: Some(LongInput::Chunk),
            max_chunks: Some(16),
        }
    );
    assert_eq!(
        bge.adapters,
        [
            LoraSpec::parse("legal=/adapters/legal").unwrap(),
            LoraSpec::parse("medical=/adapters/medical").unwrap()
        ]
    );
    assert_eq!(bge.weight, 2.5);
    // The name defaults as `--model-id`'s does; the weight to 1.
    assert_eq!(reranker.spec.name, "bge-reranker-base");
    assert_eq!(reranker.weight, 1.0);
    assert!(reranker.adapters.is_empty());
    assert_eq!(
        reranker.options,
        ModelOptions {
            default_prompt: Some("query: ".into()),
            ..ModelOptions::default()
        }
    );
    // An integer weight is a number too.
    let whole = ModelsFile::parse("- {model_id: a, weight: 3}").unwrap();
    assert_eq!(whole.models[0].weight, 3.0);
}

#[test]
fn bad_entries_are_refused_naming_the_entry_and_key() {
    let cases = [
        (
            "- model_id: a\n- model_id: b\n  wieght: 2\n",
            &["[1]: unknown field `wieght`", "expected one of", "line 3"][..],
        ),
        (
            "- model_id: a\n  weight: heavy\n",
            &["[0].weight: invalid type: string \"heavy\"", "line 2"],
        ),
        (
            "- model_id: a\n  weight: 0\n",
            &["[0]", "`weight` must be a positive number, got 0"],
        ),
        (
            "- model_id: a\n  weight: -1.5\n",
            &["`weight` must be a positive number, got -1.5"],
        ),
        (
            "- model_id: a\n  weight: .nan\n",
            &["`weight` must be a positive number, got NaN"],
        ),
        (
            "- model_id: a\n  weight: .inf\n",
            &["`weight` must be a positive number, got inf"],
        ),
        (
            "- model_id: a\n- name: b\n",
            &["[1]: missing field `model_id`", "line 2"],
        ),
        (
            "- model_id: ''\n",
            &["[0].model_id: expected ID or NAME=ID"],
        ),
        (
            "- {model_id: a, name: 'a b'}\n",
            &["[0].name:", "without spaces"],
        ),
        (
            "- {model_id: a, max_batch_tokens: 0}\n",
            &["[0].max_batch_tokens: invalid value: integer `0`, expected a nonzero"],
        ),
        (
            "- {model_id: a, max_client_batch_size: -2}\n",
            &["[0].max_client_batch_size: invalid type: integer `-2`"],
        ),
        (
            "- {model_id: a, auto_truncate: 'no way'}\n",
            &["[0].auto_truncate: invalid type"],
        ),
        (
            "- {model_id: a, long_input: whole}\n",
            &[
                "[0]",
                "`long_input` must be \"error\", \"truncate\" or \"chunk\"",
            ],
        ),
        (
            "- {model_id: a, max_chunks: 0}\n",
            &["[0].max_chunks: invalid value: integer `0`"],
        ),
        (
            "- {model_id: [a, b]}\n",
            &["[0].model_id: invalid type: sequence"],
        ),
        (
            "- {model_id: a, lora_adapters: [x]}\n",
            &["[0].lora_adapters: invalid type: sequence"],
        ),
        (
            "- {model_id: a, lora_adapters: {'x y': /p}}\n",
            &["[0].lora_adapters:", "a name without spaces"],
        ),
        (
            "- {model_id: a, default_prompt: 'q: ', default_prompt_name: query}\n",
            &["[0].default_prompt:", "not both"],
        ),
        (
            "bge: {model_id: a}\n",
            &["expected a sequence", "YAML list"],
        ),
        ("- model_id: a\n  - x\n", &["line 2"]),
        ("", &["lists no model"]),
        ("[]\n", &["lists no model"]),
    ];
    for (text, wanted) in cases {
        let err = ModelsFile::parse(text).unwrap_err();
        for part in wanted {
            assert!(err.contains(part), "{text:?}: {err:?} lacks {part:?}");
        }
        assert!(!err.starts_with('.'), "{err}");
    }
}

#[test]
fn errors_name_the_file_and_an_unreadable_one_is_refused() {
    let file = TempFile::new("- model_id: a\n  pooling: [mean]\n");
    let err = args(&["--models", file.path()]).unwrap_err();
    assert!(
        err.contains(&format!("'{}' for '--models <FILE>': ", file.path()))
            && err.contains("[0].pooling: invalid type: sequence, expected a string at line 2"),
        "{err}"
    );
    let err = args(&["--models", "/no/such/models.yaml"]).unwrap_err();
    assert!(
        err.contains("'/no/such/models.yaml' for '--models <FILE>': cannot read it: "),
        "{err}"
    );
    let err = args(&[]).unwrap_err();
    assert!(err.contains("--model-id"), "{err}");
}

#[test]
fn the_files_models_follow_the_model_ids_and_override_flags_for_themselves_alone() {
    let file = TempFile::new(EVERY_KEY);
    let a = args(&[
        "--model-id",
        "org/embedder",
        "--models",
        file.path(),
        "--pooling",
        "mean",
        "--dtype",
        "float16",
        "--max-batch-tokens",
        "4096",
        "--default-prompt",
        "passage: ",
    ])
    .unwrap();
    a.validate().unwrap();
    let names: Vec<String> = a.served_models().into_iter().map(|m| m.name).collect();
    assert_eq!(names, ["embedder", "bge", "bge-reranker-base"]);

    // The `--model-id` model keeps every flag and weighs 1.
    let embedder = a.for_model(0, Vec::new());
    assert_eq!(embedder.model_id(), "org/embedder");
    assert_eq!(embedder.pooling.as_deref(), Some("mean"));
    assert_eq!(embedder.max_batch_tokens, 4096);
    assert_eq!(embedder.share_weight(), 1.0);

    let bge = a.for_model(1, Vec::new());
    assert_eq!(bge.model_id(), "BAAI/bge-base-en-v1.5");
    assert_eq!(bge.served_name(), "bge");
    assert_eq!(
        (bge.pooling.as_deref(), bge.dtype.as_deref()),
        (Some("cls"), Some("bfloat16"))
    );
    assert_eq!(
        (bge.revision.as_deref(), bge.task.as_deref()),
        (Some("v2"), Some("embed"))
    );
    assert_eq!(bge.max_active_dims, Some(64));
    assert_eq!(
        (bge.max_batch_tokens, bge.max_batch_requests),
        (8192, Some(16))
    );
    assert_eq!(bge.policy_flags().max_batch_tokens, 8192);
    assert_eq!((bge.max_client_batch_size, bge.auto_truncate), (8, true));
    assert_eq!((bge.long_input, bge.max_chunks), (LongInput::Chunk, 16));
    // Its prompt name replaces the command line's prompt text.
    assert_eq!(
        (
            bge.default_prompt_name.as_deref(),
            bge.default_prompt.as_deref()
        ),
        (Some("query"), None)
    );
    assert_eq!(bge.share_weight(), 2.5);

    // What an entry leaves out is the command line's.
    let reranker = a.for_model(2, Vec::new());
    assert_eq!(reranker.model_id(), "/models/bge-reranker-base/");
    assert_eq!(reranker.pooling.as_deref(), Some("mean"));
    assert_eq!(reranker.dtype.as_deref(), Some("float16"));
    assert_eq!(reranker.max_batch_tokens, 4096);
    assert_eq!(reranker.default_prompt.as_deref(), Some("query: "));
    assert_eq!(reranker.share_weight(), 1.0);
    assert_eq!(
        (reranker.long_input, reranker.max_chunks),
        (LongInput::Error, 64)
    );
    assert_eq!(reranker.max_client_batch_size, 32);
}

#[test]
fn without_a_model_id_the_files_first_entry_is_the_default() {
    let file = TempFile::new("- {model_id: org/first, weight: 4}\n- {model_id: org/second}\n");
    let a = args(&["--models", file.path(), "--served-model-name", "main"]).unwrap();
    a.validate().unwrap();
    assert_eq!(a.model_id(), "org/first");
    assert_eq!(a.served_name(), "main");
    assert_eq!(a.share_weight(), 4.0);
    assert_eq!(a.for_model(1, Vec::new()).served_name(), "second");
}

#[test]
fn names_stay_unique_across_flags_and_file_and_entries_keep_their_adapters() {
    let clash = TempFile::new("- {model_id: other/embedder}\n");
    let a = args(&["--model-id", "org/embedder", "--models", clash.path()]).unwrap();
    assert!(
        a.validate()
            .unwrap_err()
            .contains("two models are named `embedder`"),
        "{:?}",
        a.validate()
    );

    let file = TempFile::new("- {model_id: org/rr, lora_adapters: {legal: /a/legal}}\n");
    let same_adapter = args(&[
        "--model-id",
        "org/embedder",
        "--models",
        file.path(),
        "--lora-adapter",
        "legal=/b/legal",
    ])
    .unwrap();
    let err = same_adapter.validate().unwrap_err();
    assert!(err.contains("`legal` names a model or adapter"), "{err}");

    let a = args(&["--model-id", "org/embedder", "--models", file.path()]).unwrap();
    a.validate().unwrap();
    let assigned = a.adapters_by_model().unwrap();
    assert!(assigned[0].is_empty());
    assert_eq!(assigned[1], [LoraSpec::parse("legal=/a/legal").unwrap()]);
}
