//! Tokenization against a small word-level tokenizer built in code.

use super::*;
use tokenizers::models::wordlevel::WordLevel;
use tokenizers::pre_tokenizers::whitespace::Whitespace;
use tokenizers::processors::template::TemplateProcessing;
use tokenizers::{AddedToken, TruncationParams};

/// A word-level tokenizer with BERT-like special tokens: `[CLS] a b [SEP]`, pairs with
/// type ids 0/1, and the built-in truncation + padding a real tokenizer.json may carry.
pub fn test_tokenizer() -> Tokenizer {
    let words = [
        "[PAD]", "[UNK]", "[CLS]", "[SEP]", "hello", "world", "what", "is", "deep", "learning",
        "query", ":", "a", "b", "c", "d", "e", "f", "g", "h", "poison", "nan", "lost",
    ];
    let vocab = words
        .iter()
        .enumerate()
        .map(|(i, w)| (w.to_string(), i as u32))
        .collect();
    let model = WordLevel::builder()
        .vocab(vocab)
        .unk_token("[UNK]".into())
        .build()
        .unwrap();
    let mut tokenizer = Tokenizer::new(model);
    tokenizer.with_pre_tokenizer(Some(Whitespace {}));
    let specials: Vec<AddedToken> = ["[PAD]", "[UNK]", "[CLS]", "[SEP]"]
        .iter()
        .map(|t| AddedToken::from(*t, true))
        .collect();
    tokenizer.add_special_tokens(specials).unwrap();
    tokenizer.with_post_processor(Some(
        TemplateProcessing::builder()
            .try_single("[CLS] $A [SEP]")
            .unwrap()
            .try_pair("[CLS] $A [SEP] $B:1 [SEP]:1")
            .unwrap()
            .special_tokens(vec![("[CLS]", 2), ("[SEP]", 3)])
            .build()
            .unwrap(),
    ));
    tokenizer
        .with_truncation(Some(TruncationParams {
            max_length: 4,
            ..Default::default()
        }))
        .unwrap();
    tokenizer.with_padding(Some(Default::default()));
    // Round-trip through JSON like a real model folder, and strip as the server does.
    let dir = std::env::temp_dir().join(format!("tok-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join(format!("tokenizer-{:?}.json", std::thread::current().id()));
    tokenizer.save(&path, false).unwrap();
    load_tokenizer(&path).unwrap()
}

pub fn test_tokenization(max_input_length: usize, position_offset: u32) -> Tokenization {
    let config = TokenizerConfig {
        max_input_length,
        position_offset,
        prompts: [("query".to_string(), "query : ".to_string())].into(),
        ..Default::default()
    };
    Tokenization::new(test_tokenizer(), 2, config)
}

pub(super) fn single(s: &str) -> EncodingInput {
    EncodingInput::Single(s.into())
}

/// Long encodes sent to a pool at once, more than its threads: while they run, jobs wait.
pub struct BusyPool(Vec<tokio::task::JoinHandle<()>>);

impl BusyPool {
    /// Waits for every job (their results, over-length errors, are dropped).
    pub async fn finish(self) {
        for job in self.0 {
            job.await.unwrap();
        }
    }
}

/// Sends `jobs` encodes of a long text to `pool` and returns once one of them waits for a
/// pool thread (each takes milliseconds, so the rest wait for a while).
pub async fn keep_pool_busy(pool: &Tokenization, jobs: usize) -> BusyPool {
    let text = "hello world what is deep learning ".repeat(20_000);
    let handles = (0..jobs)
        .map(|_| {
            let (pool, text) = (pool.clone(), text.clone());
            tokio::spawn(async move {
                let _ = pool.encode(single(&text), Default::default()).await;
            })
        })
        .collect();
    let load = pool.load();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    while load.jobs_waiting() == 0 {
        assert!(std::time::Instant::now() < deadline, "no job ever waited");
        tokio::task::yield_now().await;
    }
    BusyPool(handles)
}

#[tokio::test]
async fn the_pool_leaves_cores_free_unless_jobs_wait_for_its_threads() {
    let pool = test_tokenization(64, 0);
    let load = pool.load();
    assert!(load.leaves_cores_free());
    let busy = keep_pool_busy(&pool, 64).await;
    assert!(load.jobs_waiting() > 0);
    assert!(!load.leaves_cores_free(), "every thread busy, jobs waiting");
    let vote = pool.throttle();
    vote.set_bounded(true);
    assert!(
        load.leaves_cores_free(),
        "part of the pool stands aside on purpose"
    );
    vote.set_bounded(false);
    busy.finish().await;
    assert_eq!(load.jobs_waiting(), 0, "every job was taken");
    assert!(load.leaves_cores_free());
}

#[tokio::test]
async fn builtin_truncation_and_padding_are_ignored() {
    let t = test_tokenization(16, 0);
    let e = t
        .encode(single("hello world what is deep"), Default::default())
        .await
        .unwrap();
    // 5 words + 2 specials, beyond the file's own max_length of 4.
    assert_eq!(e.input_ids, vec![2, 4, 5, 6, 7, 8, 3]);
    assert_eq!(e.position_ids, (0..7).collect::<Vec<_>>());
    assert_eq!(e.token_type_ids, vec![0; 7]);
}

#[tokio::test]
async fn over_length_fails_or_truncates_by_direction() {
    let t = test_tokenization(4, 0);
    let err = t
        .encode(single("a b c d"), Default::default())
        .await
        .unwrap_err();
    assert_eq!(err, TokenizationError::TooLong { max: 4, given: 6 });
    assert!(err.to_string().contains("at most 4 tokens"));
    assert!(err.to_string().contains("Given: 6"));

    let right = EncodeOptions {
        truncate: true,
        ..Default::default()
    };
    let e = t.encode(single("a b c d"), right.clone()).await.unwrap();
    assert_eq!(e.input_ids, vec![2, 12, 13, 3]);
    let left = EncodeOptions {
        direction: TruncationDirection::Left,
        ..right
    };
    let e = t.encode(single("a b c d"), left).await.unwrap();
    assert_eq!(e.input_ids, vec![2, 14, 15, 3]);
}

#[tokio::test]
async fn pairs_get_type_ids_and_roberta_positions() {
    let t = test_tokenization(16, 2);
    let e = t
        .encode(
            EncodingInput::Pair("hello".into(), "world".into()),
            Default::default(),
        )
        .await
        .unwrap();
    assert_eq!(e.input_ids, vec![2, 4, 3, 5, 3]);
    assert_eq!(e.token_type_ids, vec![0, 0, 0, 1, 1]);
    assert_eq!(e.position_ids, vec![2, 3, 4, 5, 6]);
}

#[tokio::test]
async fn prompts_are_prepended_and_unknown_ones_rejected() {
    let t = test_tokenization(16, 0);
    let opts = |name: &str| EncodeOptions {
        prompt_name: Some(name.into()),
        apply_prompts: true,
        ..Default::default()
    };
    let e = t.encode(single("hello"), opts("query")).await.unwrap();
    assert_eq!(e.input_ids, vec![2, 10, 11, 4, 3]);
    let err = t
        .encode(single("hello"), opts("passage"))
        .await
        .unwrap_err();
    assert!(err.to_string().contains("[\"query\"]"), "{err}");

    let config = TokenizerConfig {
        max_input_length: 16,
        default_prompt: Some("query : ".into()),
        ..Default::default()
    };
    let with_default = Tokenization::new(test_tokenizer(), 1, config);
    let dflt = EncodeOptions {
        apply_prompts: true,
        ..Default::default()
    };
    let e = with_default.encode(single("hello"), dflt).await.unwrap();
    assert_eq!(e.input_ids, vec![2, 10, 11, 4, 3]);
}

#[tokio::test]
async fn pair_template_keeps_the_suffix_when_truncating() {
    let config = TokenizerConfig {
        max_input_length: 7,
        pair_template: Some(PairTemplate {
            before_query: "query : ".into(),
            between: " is ".into(),
            after_document: " h".into(),
            suffix_ids: vec![3],
        }),
        ..Default::default()
    };
    let t = Tokenization::new(test_tokenizer(), 1, config);
    let pair = |d: &str| EncodingInput::Pair("a".into(), d.into());
    // "query : a is b h" + [SEP]: no [CLS], one sequence, type ids all 0.
    let e = t.encode(pair("b"), Default::default()).await.unwrap();
    assert_eq!(e.input_ids, vec![10, 11, 12, 7, 13, 19, 3]);
    assert_eq!(e.token_type_ids, vec![0; 7]);
    let err = t.encode(pair("b c"), Default::default()).await.unwrap_err();
    assert_eq!(err, TokenizationError::TooLong { max: 7, given: 8 });
    let opts = EncodeOptions {
        truncate: true,
        ..Default::default()
    };
    let e = t.encode(pair("b c"), opts).await.unwrap();
    assert_eq!(e.input_ids, vec![10, 11, 12, 7, 13, 14, 3]);
}

#[tokio::test]
async fn text_padding_pads_every_input_after_truncation() {
    let config = TokenizerConfig {
        max_input_length: 5,
        position_offset: 1,
        text_padding: Some(TextPadding {
            length: 5,
            token_id: 0,
        }),
        ..Default::default()
    };
    let t = Tokenization::new(test_tokenizer(), 1, config);
    let e = t.encode(single("hello"), Default::default()).await.unwrap();
    assert_eq!(e.input_ids, vec![2, 4, 3, 0, 0]);
    assert_eq!(e.token_type_ids, vec![0; 5]);
    assert_eq!(e.position_ids, vec![1, 2, 3, 4, 5]);
    let truncate = EncodeOptions {
        truncate: true,
        ..Default::default()
    };
    let e = t.encode(single("a b c d e"), truncate).await.unwrap();
    assert_eq!(
        e.input_ids,
        vec![2, 12, 13, 14, 3],
        "cut, no room left for pads"
    );
    let e = t
        .encode(EncodingInput::Ids(vec![2, 4]), Default::default())
        .await
        .unwrap();
    assert_eq!(e.input_ids, vec![2, 4, 0, 0, 0]);
}

#[tokio::test]
async fn token_ids_are_checked_and_truncated() {
    let t = test_tokenization(3, 0);
    let ids = |v: &[u32]| EncodingInput::Ids(v.to_vec());
    let e = t.encode(ids(&[2, 4, 3]), Default::default()).await.unwrap();
    assert_eq!(e.input_ids, vec![2, 4, 3]);
    let err = t
        .encode(ids(&[2, 400]), Default::default())
        .await
        .unwrap_err();
    assert!(matches!(
        err,
        TokenizationError::IdOutOfRange { id: 400, .. }
    ));
    let left = EncodeOptions {
        truncate: true,
        direction: TruncationDirection::Left,
        ..Default::default()
    };
    let e = t.encode(ids(&[2, 4, 5, 6, 3]), left).await.unwrap();
    assert_eq!(e.input_ids, vec![5, 6, 3]);
}

#[tokio::test]
async fn tokenize_reports_char_offsets_and_decode_inverts() {
    let t = test_tokenization(16, 0);
    let tokens = t.tokenize("hello world".into(), true, None).await.unwrap();
    let texts: Vec<&str> = tokens.iter().map(|t| t.text.as_str()).collect();
    assert_eq!(texts, vec!["[CLS]", "hello", "world", "[SEP]"]);
    assert_eq!((tokens[2].start, tokens[2].stop), (Some(6), Some(11)));
    assert!(tokens[0].special && tokens[0].start.is_none());
    let text = t.decode(vec![2, 4, 5, 3], true).await.unwrap();
    assert_eq!(text, "hello world");
}

#[tokio::test]
async fn inline_encoding_matches_the_pool() {
    let t = test_tokenization(4, 1);
    for truncate in [false, true, false] {
        for input in [
            single("hello world"),
            single("a b c d"),
            EncodingInput::Pair("a".into(), "b c".into()),
        ] {
            let pool = EncodeOptions {
                truncate,
                direction: TruncationDirection::Left,
                ..Default::default()
            };
            let inline = EncodeOptions {
                inline: true,
                ..pool.clone()
            };
            let a = t.encode(input.clone(), pool).await;
            let b = t.encode(input, inline).await;
            assert_eq!(a, b);
        }
    }
}

#[tokio::test]
async fn adapter_prompts_set_every_type_id_to_the_adapter() {
    let config = TokenizerConfig {
        max_input_length: 16,
        prompts: [
            ("query".to_string(), "query : ".to_string()),
            ("plain".to_string(), String::new()),
        ]
        .into(),
        adapters: [("query".to_string(), 1), ("plain".to_string(), 2)].into(),
        default_adapter: 2,
        ..Default::default()
    };
    let t = Tokenization::new(test_tokenizer(), 1, config);
    let named = |name: &str| EncodeOptions {
        prompt_name: Some(name.into()),
        apply_prompts: true,
        ..Default::default()
    };
    let e = t.encode(single("hello"), named("query")).await.unwrap();
    assert_eq!(e.input_ids, vec![2, 10, 11, 4, 3]);
    assert_eq!(e.token_type_ids, vec![1; 5]);
    let e = t.encode(single("hello"), named("plain")).await.unwrap();
    assert_eq!(e.token_type_ids, vec![2; 3]);
    let dflt = EncodeOptions {
        apply_prompts: true,
        ..Default::default()
    };
    let e = t.encode(single("hello"), dflt).await.unwrap();
    assert_eq!(e.token_type_ids, vec![2; 3]);
    // Classification pairs and token ids are never prompted: no adapter.
    let pair = EncodingInput::Pair("a".into(), "b".into());
    let e = t.encode(pair, Default::default()).await.unwrap();
    assert_eq!(e.token_type_ids, vec![0, 0, 0, 1, 1]);
}

/// The scheduling class and nice value of a thread of this process (fields 41 and 19 of its
/// stat line).
#[cfg(target_os = "linux")]
fn scheduling(tid: &str) -> (u32, i32) {
    let stat = std::fs::read_to_string(format!("/proc/self/task/{tid}/stat")).unwrap();
    let fields: Vec<&str> = stat[stat.rfind(')').unwrap() + 2..].split(' ').collect();
    (fields[38].parse().unwrap(), fields[16].parse().unwrap())
}

#[cfg(target_os = "linux")]
fn own_tid() -> String {
    unsafe { libc::syscall(libc::SYS_gettid) }.to_string()
}

#[cfg(target_os = "linux")]
#[test]
fn each_pool_priority_sets_its_class_on_the_calling_thread_only() {
    let before = scheduling(&own_tid());
    for (priority, class, nice) in [
        (PoolPriority::Normal, libc::SCHED_OTHER, before.1),
        (PoolPriority::Low, libc::SCHED_OTHER, 19),
        (PoolPriority::Idle, libc::SCHED_IDLE, before.1),
    ] {
        let after = std::thread::spawn(move || {
            priority.apply();
            scheduling(&own_tid())
        })
        .join()
        .unwrap();
        assert_eq!(after, (class as u32, nice), "{priority:?}");
    }
    assert_eq!(scheduling(&own_tid()), before);
}

#[cfg(target_os = "linux")]
#[tokio::test]
async fn pool_threads_yield_their_cores_by_default_and_inline_callers_keep_theirs() {
    // Other tests run pools in this process at the same time, some in the normal class: this
    // one looks only at its own pool's threads, once both have started.
    let t = test_tokenization(16, 0);
    t.encode(single("hello world"), Default::default())
        .await
        .unwrap();
    let inline = EncodeOptions {
        inline: true,
        ..Default::default()
    };
    t.encode(single("hello"), inline).await.unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    while t.worker_tids().len() < 2 {
        assert!(
            std::time::Instant::now() < deadline,
            "the pool's threads did not start"
        );
        tokio::time::sleep(std::time::Duration::from_millis(1)).await;
    }
    for tid in t.worker_tids() {
        assert_eq!(
            scheduling(&tid.to_string()).0,
            libc::SCHED_IDLE as u32,
            "thread {tid}"
        );
    }
    assert_eq!(scheduling(&own_tid()).0, libc::SCHED_OTHER as u32);
}

#[tokio::test]
async fn the_warmer_encodes_on_the_inline_worker_the_next_query_takes() {
    let t = test_tokenization(16, 0);
    let idle = |t: &Tokenization| t.model.inline.idle_workers();
    assert_eq!(idle(&t), 1);
    let warm = t.warmer();
    warm();
    warm();
    // One worker, taken and put back each time: the warmer adds none and loses none.
    assert_eq!(idle(&t), 1);
    let inline = EncodeOptions {
        inline: true,
        ..Default::default()
    };
    let encoded = t.encode(single("hello world"), inline).await.unwrap();
    assert_eq!(encoded.input_ids.len(), 4);
    assert_eq!(idle(&t), 1);
}

#[test]
fn a_batch_encodes_in_order_as_one_input_at_a_time_does() {
    let tokenizer = test_tokenizer();
    let model = TokenizerConfig {
        max_input_length: 6,
        ..Default::default()
    };
    let pool = InlinePool::new(tokenizer, model);
    let opts = EncodeOptions {
        truncate: false,
        ..Default::default()
    };
    // More inputs than one chunk, with one too long for the model in the middle.
    let texts: Vec<String> = (0..40)
        .map(|i| match i {
            21 => "hello world hello world hello world".to_string(),
            _ => "hello world ".repeat(1 + i % 2).trim().to_string(),
        })
        .collect();
    let batch = pool.encode_batch(texts.iter().map(|t| single(t)).collect(), &opts);
    assert_eq!(batch.len(), texts.len());
    for (text, got) in texts.iter().zip(&batch) {
        let want = pool.encode(single(text), &opts);
        assert_eq!(
            got.as_ref().map(|e| &e.input_ids),
            want.as_ref().map(|e| &e.input_ids)
        );
    }
    assert!(matches!(batch[21], Err(TokenizationError::TooLong { .. })));
}

/// A word-level tokenizer of other words than [`test_tokenizer`]'s, with no special tokens.
fn other_tokenizer() -> Tokenizer {
    let vocab = ["[UNK]", "hello", "world"]
        .iter()
        .enumerate()
        .map(|(i, w)| (w.to_string(), i as u32))
        .collect();
    let model = WordLevel::builder()
        .vocab(vocab)
        .unk_token("[UNK]".into())
        .build()
        .unwrap();
    let mut tokenizer = Tokenizer::new(model);
    tokenizer.with_pre_tokenizer(Some(Whitespace {}));
    tokenizer
}

#[tokio::test]
async fn models_on_one_pool_share_its_threads_and_keep_their_own_rules() {
    // One thread: every job of both models runs on it, one model's after the other's.
    let pool = TokenizerPool::spawn(1, PoolPriority::Idle);
    let bert = Tokenization::on_pool(
        &pool,
        test_tokenizer(),
        TokenizerConfig {
            max_input_length: 16,
            prompts: [("query".to_string(), "query : ".to_string())].into(),
            ..Default::default()
        },
    );
    let other = Tokenization::on_pool(
        &pool,
        other_tokenizer(),
        TokenizerConfig {
            max_input_length: 3,
            position_offset: 2,
            ..Default::default()
        },
    );
    let prompted = EncodeOptions {
        prompt_name: Some("query".into()),
        apply_prompts: true,
        ..Default::default()
    };
    let jobs = (0..16).map(|i| {
        let (model, opts) = match i % 2 {
            0 => (bert.clone(), prompted.clone()),
            _ => (other.clone(), EncodeOptions::default()),
        };
        tokio::spawn(async move { model.encode(single("hello world"), opts).await })
    });
    let encoded = futures_util::future::join_all(jobs).await;
    for (i, result) in encoded.into_iter().enumerate() {
        let e = result.unwrap().unwrap();
        if i % 2 == 0 {
            // The prompt, the first tokenizer's ids and specials, positions from 0.
            assert_eq!(e.input_ids, vec![2, 10, 11, 4, 5, 3]);
            assert_eq!(e.position_ids, (0..6).collect::<Vec<_>>());
        } else {
            assert_eq!(e.input_ids, vec![1, 2]);
            assert_eq!(e.position_ids, vec![2, 3]);
        }
    }
    // Each model's rules on the shared thread: the other model has no such prompt and a
    // 3-token limit.
    let err = other.encode(single("hello"), prompted).await.unwrap_err();
    assert!(
        matches!(err, TokenizationError::UnknownPrompt { .. }),
        "{err}"
    );
    let long = other.encode(single("hello world hello world"), Default::default());
    assert!(matches!(
        long.await,
        Err(TokenizationError::TooLong { max: 3, given: 4 })
    ));
    // Both models' jobs went to the pool's one thread; the second model started none.
    assert_eq!(pool.workers(), 1);
    #[cfg(target_os = "linux")]
    {
        assert_eq!(pool.worker_tids().len(), 1);
        assert_eq!(bert.worker_tids(), other.worker_tids());
    }
    // One queue of jobs: the load the HTTP thread reads is the pool's, whichever model's jobs
    // wait.
    let busy = keep_pool_busy(&bert, 8).await;
    assert!(other.load().jobs_waiting() > 0);
    busy.finish().await;
    assert_eq!(other.load().jobs_waiting(), 0);
}

#[test]
fn a_pool_of_several_models_competes_as_the_model_that_needs_cores_most() {
    use PoolPriority::*;
    assert_eq!(PoolPriority::for_models([Idle, Idle]), Some(Idle));
    assert_eq!(PoolPriority::for_models([Idle, Normal, Low]), Some(Normal));
    assert_eq!(PoolPriority::for_models([Idle, Low]), Some(Low));
    assert_eq!(PoolPriority::for_models([]), None);
}
