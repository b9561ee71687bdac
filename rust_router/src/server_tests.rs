//! Tests of `server.rs`: flags into policy, addresses, limits, the info body.

use super::*;
use crate::backend::fake::FakeBackend;

fn args(extra: &[&str]) -> Args {
    let mut argv = vec!["text-embeddings-router", "--model-id", "m"];
    argv.extend_from_slice(extra);
    Args::try_parse_from(argv).unwrap()
}

#[test]
fn the_http_thread_polls_by_default_only_with_an_interactive_lane() {
    use crate::schedule::DEFAULT_INTERACTIVE_SPIN_US;
    let pool = crate::tokenization::tests::test_tokenization(64, 0).load();
    let window = |flag: &[&str], interactive_lane| {
        let profile = ServingProfile::resolve(
            &args(flag).policy_flags(),
            BackendFacts { interactive_lane },
        );
        hot_poll(profile.http_spin, pool.clone()).map(|h| h.window())
    };
    let default = Duration::from_micros(DEFAULT_INTERACTIVE_SPIN_US);
    assert_eq!(window(&[], true), Some(default));
    assert_eq!(window(&[], false), None);
    assert_eq!(window(&["--http-spin-us", "0"], true), None);
    assert_eq!(
        window(&["--http-spin-us", "700"], false),
        Some(Duration::from_micros(700))
    );
}

#[tokio::test]
async fn the_http_thread_polls_only_while_the_tokenizer_pool_leaves_cores_free() {
    let pool = crate::tokenization::tests::test_tokenization(64, 0);
    let hot = hot_poll(Duration::from_micros(25_000), pool.load()).unwrap();
    assert!(hot.may_spin_now(), "nothing to tokenize");
    // The pool's own rule (jobs waiting for a thread, the throttle) is tested beside it.
    let busy = crate::tokenization::tests::keep_pool_busy(&pool, 64).await;
    assert!(!hot.may_spin_now(), "jobs wait for a pool thread");
    let vote = pool.throttle();
    vote.set_bounded(true);
    assert!(hot.may_spin_now(), "the backend bounds the backfill");
    vote.set_bounded(false);
    busy.finish().await;
    assert!(hot.may_spin_now(), "the jobs are done");
}

#[test]
fn default_prompt_resolution() {
    let info = FakeBackend::info();
    assert_eq!(default_prompt(&args(&[]), &info), Ok(None));
    assert_eq!(
        default_prompt(&args(&["--default-prompt-name", "query"]), &info),
        Ok(Some("query : ".into()))
    );
    assert_eq!(
        default_prompt(&args(&["--default-prompt", "x: "]), &info),
        Ok(Some("x: ".into()))
    );
    let err = default_prompt(&args(&["--default-prompt-name", "nope"]), &info).unwrap_err();
    assert!(err.contains("[\"query\"]"), "{err}");
}

#[test]
fn info_body_for_a_classifier() {
    let info = FakeBackend::classifier_info(3);
    let body = build_info(&args(&["--served-model-name", "clf"]), &info, 2);
    let json = serde_json::to_value(&body).unwrap();
    assert_eq!(json["model_type"]["classifier"]["id2label"]["2"], "LABEL_2");
    assert_eq!(json["model_type"]["classifier"]["label2id"]["LABEL_1"], 1);
    assert_eq!(json["served_model_name"], "clf");
}

#[test]
fn hostnames_resolve_or_fail_clearly() {
    let one = listen_addrs("127.0.0.1", 5).unwrap();
    assert_eq!(one, ["127.0.0.1:5".parse().unwrap()]);
    let local = listen_addrs("localhost", 5).unwrap();
    assert!(
        local.iter().all(|a| a.ip().is_loopback() && a.port() == 5),
        "{local:?}"
    );
    let err = listen_addrs("no-such-host.invalid", 5).unwrap_err();
    assert!(err.contains("neither an IP address"), "{err}");
}

#[test]
fn binding_reports_the_port_in_use_and_port_zero_gets_a_real_port() {
    let first = bind(&["127.0.0.1:0".parse().unwrap()]).unwrap();
    let port = first[0].local_addr().unwrap().port();
    assert_ne!(port, 0);
    let err = bind(&[format!("127.0.0.1:{port}").parse().unwrap()]).unwrap_err();
    assert!(err.contains("the port is in use"), "{err}");
}

#[test]
fn connection_cap_fits_the_open_file_limit() {
    assert_eq!(effective_max_connections(4096, 1 << 20), 4096);
    assert_eq!(effective_max_connections(4096, 1024), 768);
    assert_eq!(effective_max_connections(4096, 300), 150);
    assert_eq!(effective_max_connections(100, 1024), 100);
}

#[test]
fn requests_are_answered_before_the_shutdown_timeout_ends() {
    assert_eq!(
        answer_deadline(Duration::from_secs(30)),
        Duration::from_secs(28)
    );
    assert_eq!(
        answer_deadline(Duration::from_secs(4)),
        Duration::from_secs(3)
    );
    assert!(check_batch_tokens(512, 512).is_ok());
    let err = check_batch_tokens(256, 512).unwrap_err();
    assert!(err.contains("--max-batch-tokens"), "{err}");
}

#[test]
fn help_exits_zero_and_bad_flags_two() {
    let none = || -> MakeBackend { Box::new(|_| Err("unused".into())) };
    let code = main_with_args(vec!["x".into(), "--help".into()], none());
    assert_eq!(code, 0);
    let code = main_with_args(vec!["x".into(), "--bogus".into()], none());
    assert_eq!(code, 2);
}
