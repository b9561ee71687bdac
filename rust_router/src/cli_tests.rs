//! The flags: parsing, defaults, validation and `--help`.

use super::*;

fn parse(extra: &[&str]) -> Result<Args, clap::Error> {
    let mut argv = vec!["text-embeddings-router", "--model-id", "m"];
    argv.extend_from_slice(extra);
    Args::try_parse_from(argv)
}

#[test]
fn defaults_match_tei() {
    let a = parse(&[]).unwrap();
    assert_eq!(a.max_concurrent_requests, 512);
    assert_eq!(a.max_batch_tokens, 16384);
    assert_eq!(a.max_client_batch_size, 32);
    assert_eq!(a.payload_limit, 2_000_000);
    assert_eq!(a.backend, BackendKind::Python);
    assert_eq!(a.interactive_max_tokens, 256);
    assert!(a.validate().is_ok());
}

#[test]
fn interactive_max_tokens_parses_and_zero_turns_the_lane_off() {
    assert_eq!(
        parse(&["--interactive-max-tokens", "64"])
            .unwrap()
            .interactive_max_tokens,
        64
    );
    let off = parse(&["--interactive-max-tokens", "0"]).unwrap();
    assert_eq!(off.interactive_max_tokens, 0);
    // 0 is a setting, not a mistake.
    assert!(off.validate().is_ok());
    assert_eq!(
        off.policy_flags().interactive_max_tokens,
        0,
        "0 must reach the queue unchanged"
    );
    assert!(parse(&["--interactive-max-tokens", "-1"]).is_err());
    assert!(parse(&["--interactive-max-tokens", "many"]).is_err());
}

#[test]
fn bulk_batches_are_bounded_by_40_ms_unless_zero() {
    use crate::schedule::{BackendFacts, ServingProfile};
    use std::time::Duration;
    let cpu = BackendFacts {
        interactive_lane: false,
    };
    let config = |args: &[&str]| {
        ServingProfile::resolve(&parse(args).unwrap().policy_flags(), cpu)
            .batching
            .bulk_pacing()
    };
    assert_eq!(config(&[]), Some(Duration::from_millis(40)));
    assert_eq!(
        config(&["--max-bulk-batch-ms", "200"]),
        Some(Duration::from_millis(200))
    );
    assert_eq!(config(&["--max-bulk-batch-ms", "0"]), None);
    assert!(parse(&["--max-bulk-batch-ms", "-5"]).is_err());
}

#[test]
fn tokenization_priority_is_the_runtimes_unless_given() {
    assert_eq!(parse(&[]).unwrap().tokenization_priority, None);
    for (flag, priority) in [
        ("normal", PoolPriority::Normal),
        ("low", PoolPriority::Low),
        ("idle", PoolPriority::Idle),
    ] {
        let given = parse(&["--tokenization-priority", flag]).unwrap();
        assert_eq!(given.tokenization_priority, Some(priority));
    }
    let err = parse(&["--tokenization-priority", "high"])
        .unwrap_err()
        .to_string();
    assert!(err.contains("normal") && err.contains("idle"), "{err}");
}

#[test]
fn bulk_step_time_is_the_runtimes_unless_given() {
    assert_eq!(parse(&[]).unwrap().max_bulk_step_ms, None);
    let given = parse(&["--max-bulk-step-ms", "1.5"]).unwrap();
    assert_eq!(given.max_bulk_step_ms, Some(1.5));
    assert!(given.validate().is_ok());
    assert!(parse(&["--max-bulk-step-ms", "0"])
        .unwrap()
        .validate()
        .is_ok());
    for bad in ["-1", "NaN", "inf"] {
        let err = parse(&["--max-bulk-step-ms", bad])
            .unwrap()
            .validate()
            .unwrap_err();
        assert!(err.contains("--max-bulk-step-ms"), "{err}");
    }
    assert!(parse(&["--max-bulk-step-ms", "soon"]).is_err());
}

#[test]
fn backend_spin_is_the_lanes_default_unless_given() {
    assert_eq!(parse(&[]).unwrap().backend_spin_us, None);
    assert_eq!(
        parse(&["--backend-spin-us", "2000"])
            .unwrap()
            .backend_spin_us,
        Some(2000)
    );
    assert_eq!(
        parse(&["--backend-spin-us", "0"]).unwrap().backend_spin_us,
        Some(0)
    );
    assert!(parse(&["--backend-spin-us", "-5"]).is_err());
    assert_eq!(parse(&[]).unwrap().query_warm_us, DEFAULT_WARM_EVERY_US);
    assert_eq!(parse(&["--query-warm-us", "0"]).unwrap().query_warm_us, 0);
    assert!(parse(&["--query-warm-us", "often"]).is_err());
    assert_eq!(parse(&[]).unwrap().policy_flags().query_spin_us, None);
    assert_eq!(
        parse(&["--query-spin-us", "250"])
            .unwrap()
            .policy_flags()
            .query_spin_us,
        Some(250)
    );
    assert!(parse(&["--query-spin-us", "-1"]).is_err());
    assert!(parse(&["--backend-spin-us", "soon"]).is_err());
    assert_eq!(parse(&[]).unwrap().http_spin_us, None);
    assert_eq!(
        parse(&["--http-spin-us", "300"]).unwrap().http_spin_us,
        Some(300)
    );
    assert!(parse(&["--http-spin-us", "-1"]).is_err());
}

#[test]
fn the_policy_flags_carry_every_default_unchanged() {
    // `schedule`'s tests state the defaults as `--help` gives them.
    assert_eq!(
        parse(&[]).unwrap().policy_flags(),
        crate::schedule::tests::defaults()
    );
}

#[test]
fn help_says_what_the_interactive_lane_is_for() {
    use clap::CommandFactory;
    let help = Args::command().render_long_help().to_string();
    let at = help
        .find("--interactive-max-tokens")
        .expect("flag missing from --help");
    let text = &help[at..];
    assert!(text.contains("INTERACTIVE_MAX_TOKENS"), "{text}");
    assert!(text.contains("default: 256"), "{text}");
    assert!(text.contains("corpus backfills"), "{text}");
}

#[test]
fn devices_is_passed_as_given_and_excludes_device() {
    let a = parse(&["--devices", "cuda:0,cuda:1"]).unwrap();
    assert_eq!(a.devices.as_deref(), Some("cuda:0,cuda:1"));
    assert!(a.validate().is_ok());
    assert!(parse(&["--devices", "all"]).unwrap().validate().is_ok());
    assert!(parse(&["--device", "cpu"]).unwrap().validate().is_ok());
    let err = parse(&["--device", "cpu", "--devices", "cpu,cpu"])
        .unwrap()
        .validate()
        .unwrap_err();
    assert!(err.contains("give only one"), "{err}");
    assert!(parse(&["--devices", " "]).unwrap().validate().is_err());
}

#[test]
fn help_says_what_devices_takes() {
    use clap::CommandFactory;
    let help = Args::command().render_long_help().to_string();
    let at = help.find("--devices").expect("flag missing from --help");
    let text = &help[at..];
    for needle in ["DEVICES", "cuda:0,cuda:1", "`all`", "DeviceError"] {
        assert!(text.contains(needle), "{needle} missing from\n{text}");
    }
}

#[test]
fn connection_limits_have_load_balancer_defaults_and_refuse_nonsense() {
    let a = parse(&[]).unwrap();
    assert_eq!(a.header_read_timeout, Duration::from_secs(10));
    assert_eq!(a.body_read_timeout, Duration::from_secs(60));
    assert_eq!(a.keep_alive_timeout, Duration::from_secs(75));
    assert_eq!(a.max_connections, 4096);
    assert_eq!(a.shutdown_timeout, Duration::from_secs(30));
    let b = parse(&["--keep-alive-timeout", "0.5", "--shutdown-timeout", "3"]).unwrap();
    assert_eq!(b.keep_alive_timeout, Duration::from_millis(500));
    assert_eq!(
        b.connection_limits().keep_alive_timeout,
        Duration::from_millis(500)
    );
    for bad in ["0", "-1", "soon", "inf"] {
        assert!(parse(&["--header-read-timeout", bad]).is_err(), "{bad}");
    }
    assert!(parse(&["--max-connections", "0"])
        .unwrap()
        .validate()
        .is_err());
}

#[test]
fn flags_parse_and_validate() {
    let a = parse(&[
        "--cors-allow-origin",
        "http://a,http://b",
        "--auto-truncate",
        "--port",
        "8080",
        "--backend",
        "python",
    ])
    .unwrap();
    assert_eq!(a.cors_allow_origin.unwrap(), vec!["http://a", "http://b"]);
    assert!(a.auto_truncate);
    assert_eq!(a.port, 8080);
    assert!(parse(&["--max-batch-tokens", "0"])
        .unwrap()
        .validate()
        .is_err());
    assert!(parse(&["--python-backend-class", "nocolon"])
        .unwrap()
        .validate()
        .is_err());
    assert!(parse(&["--default-prompt", "a", "--default-prompt-name", "b"]).is_err());
    assert!(parse(&["--backend", "candle"]).is_err());
}

#[test]
fn the_server_docs_flag_table_lists_every_flag_and_no_other() {
    use clap::CommandFactory;
    use std::collections::BTreeSet;
    let server_docs = include_str!("../../docs/server.md");
    let documented: BTreeSet<&str> = server_docs
        .lines()
        .filter_map(|line| line.strip_prefix("| `--"))
        .filter_map(|rest| rest.split('`').next())
        .collect();
    let command = Args::command();
    let flags: BTreeSet<&str> = command
        .get_arguments()
        .filter_map(|arg| arg.get_long())
        .filter(|long| !matches!(*long, "help" | "version"))
        .collect();
    assert_eq!(
        documented, flags,
        "docs/server.md's flag table against --help"
    );
}

#[test]
fn max_queue_ms_is_unset_by_default_and_bounded() {
    assert_eq!(parse(&[]).unwrap().max_queue_ms, None);
    assert_eq!(parse(&[]).unwrap().policy_flags().max_queue, None);
    let a = parse(&["--max-queue-ms", "250"]).unwrap();
    assert_eq!(a.max_queue_ms, Some(Duration::from_millis(250)));
    assert_eq!(a.policy_flags().max_queue, Some(Duration::from_millis(250)));
    for bad in ["0", "-1", "1.5", "3600001", "soon"] {
        let flag = format!("--max-queue-ms={bad}");
        let err = parse(&[&flag]).unwrap_err().to_string();
        assert!(err.contains("3600000"), "{bad}: {err}");
    }
    use clap::CommandFactory;
    let help = Args::command().render_long_help().to_string();
    assert!(
        help.contains("--max-queue-ms") && help.contains("MAX_QUEUE_MS"),
        "{help}"
    );
}

#[test]
fn a_malformed_otlp_endpoint_fails_at_start_and_a_url_passes() {
    let with = |endpoint: &str| {
        Args::try_parse_from(["x", "--model-id", "m", "--otlp-endpoint", endpoint])
            .unwrap()
            .validate()
    };
    assert!(with("http://collector:4317").is_ok());
    let err = with("collector:4317").unwrap_err();
    assert!(err.contains("--otlp-endpoint `collector:4317`"), "{err}");
    assert!(err.contains("http://"), "{err}");
    let bad_protocol = Args::try_parse_from(["x", "--model-id", "m", "--otlp-protocol", "http"]);
    assert!(bad_protocol.is_err());
    let http = Args::try_parse_from(["x", "--model-id", "m", "--otlp-protocol", "http/protobuf"]);
    assert_eq!(
        http.unwrap().otlp_protocol,
        crate::telemetry::OtlpProtocol::HttpProtobuf
    );
}
