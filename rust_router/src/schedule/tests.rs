use super::*;

/// The flags' defaults, as `--help` gives them (`cli`'s tests check they agree).
pub(crate) fn defaults() -> PolicyFlags {
    PolicyFlags {
        max_batch_tokens: 16384,
        max_batch_requests: None,
        interactive_max_tokens: 256,
        max_bulk_batch_ms: 40,
        backend_spin_us: None,
        query_warm_us: DEFAULT_WARM_EVERY_US,
        query_spin_us: None,
        http_spin_us: None,
        tokenization_priority: None,
        max_queue: None,
    }
}

const GPU: BackendFacts = BackendFacts {
    interactive_lane: true,
};
const CPU: BackendFacts = BackendFacts {
    interactive_lane: false,
};

#[test]
fn a_gpu_runtime_gets_a_lane_apart_hot_waits_and_an_idle_throttled_pool() {
    let p = ServingProfile::resolve(&defaults(), GPU);
    assert_eq!(p.batching, Batching::Lanes);
    assert_eq!(
        p.batching.takes(),
        [Take::Lane(Lane::Interactive), Take::Lane(Lane::Bulk)]
    );
    assert_eq!(p.batching.bulk_pacing(), None);
    assert_eq!(p.query_spin, DEFAULT_QUERY_SPIN);
    assert_eq!(
        p.http_spin,
        Duration::from_micros(DEFAULT_INTERACTIVE_SPIN_US)
    );
    assert_eq!(
        p.tokenizer_pool,
        TokenizerPoolPolicy {
            priority: PoolPriority::Idle,
            throttled: true
        }
    );
    assert_eq!(
        p.backend_waits,
        BackendWaits {
            bulk: WaitPolicy::default(),
            interactive: WaitPolicy::spin_micros(DEFAULT_INTERACTIVE_SPIN_US)
                .warming_every(DEFAULT_WARM_EVERY_US),
        }
    );
    assert_eq!(
        (
            p.max_batch_tokens,
            p.max_batch_requests,
            p.interactive_max_tokens
        ),
        (16384, None, 256)
    );
    assert_eq!(
        p.describe_interactive_lane(),
        "requests of <= 256 tokens on their own backend thread (one per device)"
    );
}

#[test]
fn a_cpu_runtime_shares_one_thread_paces_bulk_batches_and_never_spins() {
    let p = ServingProfile::resolve(&defaults(), CPU);
    assert_eq!(
        p.batching,
        Batching::Shared {
            pace_bulk: Some(Duration::from_millis(40))
        }
    );
    assert_eq!(p.batching.takes(), [Take::Priority]);
    assert_eq!(p.batching.bulk_pacing(), Some(Duration::from_millis(40)));
    assert_eq!(p.query_spin, Duration::ZERO);
    assert_eq!(p.http_spin, Duration::ZERO);
    assert_eq!(
        p.tokenizer_pool,
        TokenizerPoolPolicy {
            priority: PoolPriority::Normal,
            throttled: false
        }
    );
    // The backend's waits need no fact of it: the same as a GPU's (no interactive thread
    // exists to spin).
    assert_eq!(p.backend_waits, ServingProfile::backend_waits(&defaults()));
    assert_eq!(
        p.describe_interactive_lane(),
        "requests of <= 256 tokens first in the shared queue (the runtime has no interactive lane)"
    );
}

#[test]
fn zero_interactive_tokens_shares_one_batching_task_even_with_a_lane() {
    let flags = PolicyFlags {
        interactive_max_tokens: 0,
        ..defaults()
    };
    for facts in [GPU, CPU] {
        let p = ServingProfile::resolve(&flags, facts);
        assert_eq!(p.batching.takes(), [Take::Priority], "{facts:?}");
        assert_eq!(
            p.batching.bulk_pacing(),
            Some(Duration::from_millis(40)),
            "{facts:?}"
        );
        assert!(!p.tokenizer_pool.throttled, "{facts:?}");
        assert_eq!(p.describe_interactive_lane(), "off");
    }
    // The waits' and the pool's defaults follow the runtime's lane, not the flag.
    let gpu = ServingProfile::resolve(&flags, GPU);
    assert_eq!(gpu.query_spin, DEFAULT_QUERY_SPIN);
    assert_eq!(gpu.tokenizer_pool.priority, PoolPriority::Idle);
}

#[test]
fn flags_override_every_default() {
    let flags = PolicyFlags {
        max_batch_tokens: 4096,
        max_batch_requests: Some(8),
        interactive_max_tokens: 64,
        max_bulk_batch_ms: 0,
        backend_spin_us: Some(700),
        query_warm_us: 300,
        query_spin_us: Some(250),
        http_spin_us: Some(900),
        tokenization_priority: Some(PoolPriority::Low),
        max_queue: Some(Duration::from_millis(75)),
    };
    for facts in [GPU, CPU] {
        let p = ServingProfile::resolve(&flags, facts);
        assert_eq!(
            (
                p.max_batch_tokens,
                p.max_batch_requests,
                p.interactive_max_tokens
            ),
            (4096, Some(8), 64)
        );
        assert_eq!(p.batching.bulk_pacing(), None, "--max-bulk-batch-ms 0");
        assert_eq!(p.query_spin, Duration::from_micros(250));
        assert_eq!(p.http_spin, Duration::from_micros(900));
        assert_eq!(p.tokenizer_pool.priority, PoolPriority::Low);
        assert_eq!(p.max_queue, Some(Duration::from_millis(75)));
        assert_eq!(
            p.backend_waits,
            BackendWaits {
                bulk: WaitPolicy::spin_micros(700),
                interactive: WaitPolicy::spin_micros(700).warming_every(300),
            }
        );
    }
    let off = PolicyFlags {
        backend_spin_us: Some(0),
        query_warm_us: 0,
        query_spin_us: Some(0),
        http_spin_us: Some(0),
        ..defaults()
    };
    let p = ServingProfile::resolve(&off, GPU);
    assert_eq!(
        (p.backend_waits.bulk, p.backend_waits.interactive),
        (WaitPolicy::default(), WaitPolicy::default())
    );
    assert_eq!(
        (p.query_spin, p.http_spin),
        (Duration::ZERO, Duration::ZERO)
    );
    assert!(
        p.tokenizer_pool.throttled,
        "the throttle has no flag of its own"
    );
}
