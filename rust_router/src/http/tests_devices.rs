//! `/health`, `/info` and `/metrics` of a server over several fake devices.

use super::test_util::*;
use serde_json::json;
use std::sync::atomic::Ordering;

fn two_devices() -> TestApp {
    test_app(Options {
        devices: 2,
        ..Default::default()
    })
}

#[tokio::test]
async fn info_and_metrics_report_every_device() {
    let app = two_devices();
    for _ in 0..3 {
        let r = app.post("/embed", json!({"inputs": "hello world"})).await;
        assert_eq!(r.status, 200, "{}", r.text);
    }
    assert_eq!(
        app.get("/health").await.text,
        "",
        "all healthy: an empty 200"
    );
    let r = app.get("/info").await;
    let devices = r.json["devices"].as_array().unwrap();
    assert_eq!(devices.len(), 2);
    assert_eq!(devices[0]["name"], "fake:0");
    assert_eq!(devices[1]["index"], 1);
    assert!(devices.iter().all(|d| d["healthy"] == true));
    assert!(devices.iter().all(|d| d.get("error").is_none()));
    let batches: u64 = devices.iter().map(|d| d["batches"].as_u64().unwrap()).sum();
    assert_eq!(batches, 3);
    let metrics = app.get("/metrics").await.text;
    // Sequential queries always find device 0 idle.
    for line in [
        "te_batch_inference_success{device=\"0\"} 3",
        "te_batch_inference_duration_count{device=\"0\"} 3",
        "te_batch_next_size_count{lane=\"interactive\",device=\"0\"} 3",
        "te_queue_size 0",
    ] {
        assert!(metrics.contains(line), "missing {line} in\n{metrics}");
    }
    assert_eq!(metrics.matches("# TYPE te_queue_size gauge").count(), 1);
}

#[tokio::test]
async fn a_failed_device_is_named_by_health_and_the_other_keeps_answering() {
    let app = two_devices();
    app.broken[1].store(true, Ordering::SeqCst);
    // The health check finds it, and takes it out.
    let r = app.get("/health").await;
    assert_eq!(r.status, 200);
    assert_eq!(
        r.json,
        json!({"status": "degraded", "unhealthy_devices": [{"index": 1, "name": "fake:1"}]})
    );
    let info = app.get("/info").await.json;
    assert_eq!(info["devices"][0]["healthy"], true);
    assert_eq!(info["devices"][1]["healthy"], false);
    let error = info["devices"][1]["error"].as_str().unwrap();
    assert!(error.contains("DeviceError"), "{error}");
    // Concurrent requests: every one answered, by device 0.
    let answers = futures_util::future::join_all(
        (0..8).map(|_| app.post("/embed", json!({"inputs": ["hello", "a b c"]}))),
    )
    .await;
    assert!(answers.iter().all(|r| r.status == 200));
    assert!(app.seen.lock().unwrap().iter().all(|b| b.device == 0));
    // Still degraded, not worse: the failed device is not called again.
    assert_eq!(app.get("/health").await.status, 200);
}

#[tokio::test]
async fn health_is_503_once_every_device_failed_and_requests_too() {
    let app = two_devices();
    for broken in &app.broken {
        broken.store(true, Ordering::SeqCst);
    }
    let r = app.get("/health").await;
    assert_eq!(r.status, 503);
    assert_eq!(r.json["error_type"], "unhealthy");
    let error = r.json["error"].as_str().unwrap();
    for device in ["device 0 (fake:0)", "device 1 (fake:1)"] {
        assert!(error.contains(device), "{error}");
    }
    let r = app.post("/embed", json!({"inputs": "hello"})).await;
    assert_eq!(r.status, 503, "{}", r.text);
    assert!(r.json["error"]
        .as_str()
        .unwrap()
        .contains("every device has failed"));
    let r = app.post("/v1/embeddings", json!({"input": "hello"})).await;
    assert_eq!(r.status, 503, "{}", r.text);
}

#[tokio::test]
async fn a_device_error_mid_batch_is_503_for_its_requests_and_takes_the_device_out() {
    let app = two_devices();
    // "lost" breaks the device that runs it (device 0: the server is idle).
    let r = app.post("/embed", json!({"inputs": "lost"})).await;
    assert_eq!(r.status, 503, "{}", r.text);
    assert_eq!(r.json["error_type"], "unhealthy");
    assert!(
        r.json["error"]
            .as_str()
            .unwrap()
            .contains("the device running this request failed"),
        "{}",
        r.text
    );
    let r = app.get("/health").await;
    assert_eq!(r.json["unhealthy_devices"][0]["index"], 0, "{}", r.text);
    let r = app.post("/embed", json!({"inputs": "hello"})).await;
    assert_eq!(r.status, 200, "{}", r.text);
    assert_eq!(app.seen.lock().unwrap().last().unwrap().device, 1);
}

#[tokio::test]
async fn one_device_keeps_its_health_body_and_metric_labels() {
    let app = test_app(Options::default());
    app.post("/embed", json!({"inputs": "hello"})).await;
    let r = app.get("/health").await;
    assert_eq!((r.status.as_u16(), r.text.as_str()), (200, ""));
    let info = app.get("/info").await.json;
    assert_eq!(
        info["devices"],
        json!([{"index": 0, "name": "cpu", "healthy": true, "batches": 1, "failed_batches": 0}])
    );
    let metrics = app.get("/metrics").await.text;
    assert!(
        metrics.contains("te_batch_inference_success 1"),
        "{metrics}"
    );
    assert!(!metrics.contains("device=\""), "{metrics}");
    // A device error on the only device: 503 for its request, and for /health from then on.
    let r = app.post("/embed", json!({"inputs": "lost"})).await;
    assert_eq!(r.status, 503, "{}", r.text);
    let r = app.get("/health").await;
    assert_eq!(r.status, 503);
    assert!(
        r.json["error"]
            .as_str()
            .unwrap()
            .contains("device 0 (cpu) has failed"),
        "{}",
        r.text
    );
    assert_eq!(
        app.post("/embed", json!({"inputs": "hello"})).await.status,
        503
    );
}
