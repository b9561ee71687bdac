use super::*;
use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

fn two_models(weights: [f64; 2]) -> [Seat; 2] {
    let shares = DeviceShares::default();
    let names = ["cuda:0".to_string()];
    let a = shares.seats(&names, 0, weights[0]).remove(0);
    let b = shares.seats(&names, 1, weights[1]).remove(0);
    [a, b]
}

#[test]
fn models_on_the_same_device_share_it_and_other_devices_are_apart() {
    let shares = DeviceShares::default();
    let a = shares.seats(&["cuda:0".into(), "cuda:1".into()], 0, 1.0);
    let b = shares.seats(&["cuda:1".into()], 1, 1.0);
    assert!(Arc::ptr_eq(&a[1].share, &b[0].share));
    assert!(!Arc::ptr_eq(&a[0].share, &b[0].share));
    // A repeated name is one device per occurrence.
    let cpus = shares.seats(&["cpu".into(), "cpu".into()], 0, 1.0);
    assert!(!Arc::ptr_eq(&cpus[0].share, &cpus[1].share));
    let other = shares.seats(&["cpu".into(), "cpu".into()], 1, 1.0);
    assert!(Arc::ptr_eq(&cpus[1].share, &other[1].share));
}

#[test]
fn another_models_batch_waits_for_the_turn_to_end() {
    let [a, b] = two_models([1.0, 1.0]);
    let turn = a.try_take(100).expect("the device is free");
    assert!(b.try_take(100).is_none());
    let (tx, rx) = mpsc::channel();
    let waiter = thread::spawn(move || {
        let turn = b.take(100);
        tx.send(()).unwrap();
        drop(turn);
    });
    assert!(rx.recv_timeout(Duration::from_millis(50)).is_err());
    drop(turn);
    rx.recv_timeout(Duration::from_secs(5))
        .expect("the waiting model took the turn once it ended");
    waiter.join().unwrap();
}

#[test]
fn a_pipelining_model_keeps_the_device_until_another_waits_with_an_earlier_start() {
    let [a, b] = two_models([1.0, 1.0]);
    let first = a.try_take(1000).unwrap();
    // Nobody else waits: the next batch is launched behind the first.
    let second = a.try_take(1000).unwrap();
    drop(first);
    let waiter = thread::spawn(move || drop(b.take(10)));
    let deadline = Instant::now() + Duration::from_secs(5);
    while a.state().waiting.is_empty() {
        assert!(Instant::now() < deadline, "the other model never asked");
        thread::yield_now();
    }
    // The other model starts at 1000 (the device's time), before this one's 2000.
    assert!(a.try_take(1000).is_none());
    drop(second);
    waiter.join().unwrap();
    // The other model's turn just ended and it would start earlier: it may still ask again.
    assert!(a.try_take(1000).is_none());
    thread::sleep(REASK_GRACE);
    assert!(
        a.try_take(1000).is_some(),
        "the other model did not ask again"
    );
}

#[test]
fn a_waiting_model_is_not_held_past_the_grace_by_one_that_stopped_asking() {
    let [a, b] = two_models([1.0, 1.0]);
    drop(b.try_take(10));
    drop(a.try_take(1000));
    // b would start before a's next batch, but asks nothing more.
    let asked = Instant::now();
    drop(a.take(1000));
    let waited = asked.elapsed();
    assert!(waited < REASK_GRACE * 50, "waited {waited:?}");
}

#[test]
fn a_model_that_was_idle_starts_at_the_devices_time() {
    let [a, b] = two_models([1.0, 1.0]);
    for _ in 0..10 {
        drop(a.try_take(500).unwrap());
    }
    // b asked nothing while a ran 5000 tokens: it starts where a's last batch started,
    // not at 0 with 4500 tokens of credit.
    assert_eq!(b.state().start_of(1), 4500.0);
    assert_eq!(a.state().start_of(0), 5000.0);
}

/// Both models keep the device busy, each batch held briefly as a forward pass would be:
/// the tokens they get follow their weights, whatever their batch sizes.
#[test]
fn saturating_models_share_tokens_by_weight() {
    let [a, b] = two_models([1.0, 3.0]);
    let stop = Instant::now() + Duration::from_millis(600);
    let run = |seat: Seat, tokens: usize| {
        thread::spawn(move || {
            let mut total = 0usize;
            while Instant::now() < stop {
                let turn = seat.take(tokens);
                total += tokens;
                thread::sleep(Duration::from_micros(tokens as u64 / 4));
                drop(turn);
            }
            total
        })
    };
    let (a, b) = (run(a, 4000), run(b, 1000));
    let (a, b) = (a.join().unwrap() as f64, b.join().unwrap() as f64);
    let share = b / (a + b);
    assert!(
        (0.65..=0.85).contains(&share),
        "weight 3 of 4 got {share:.2} of the tokens ({a} and {b})"
    );
}
