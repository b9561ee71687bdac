//! Tasks other than tokenization on the pool's threads ([`Tokenization::run`]).

use super::tests::{single, test_tokenization};
use super::*;

#[tokio::test]
async fn tasks_run_on_the_pool_threads_and_a_panic_answers_its_caller_only() {
    let t = test_tokenization(16, 0);
    let thread = t
        .run(|| {
            std::thread::current()
                .name()
                .unwrap_or_default()
                .to_string()
        })
        .await
        .unwrap();
    assert!(thread.starts_with("tokenizer-"), "{thread}");
    let panicked = t.run(|| -> u32 { panic!("a corrupt image") }).await;
    assert!(matches!(panicked, Err(TokenizationError::Panicked)));
    // Both threads still serve.
    for _ in 0..4 {
        assert_eq!(t.run(|| 6 * 7).await.unwrap(), 42);
    }
    let encoded = t
        .encode(single("hello world"), Default::default())
        .await
        .unwrap();
    assert_eq!(encoded.input_ids, vec![2, 4, 5, 3]);
}
