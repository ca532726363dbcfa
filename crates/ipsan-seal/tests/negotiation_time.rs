//! The CPU cost of Seal's login negotiation alone (issue 31 item 2: what CPace adds): offer,
//! answer, both confirmations and both sessions' keys, the median of 1000 runs on one thread.
//! A measurement, not a check, so ignored by default:
//! `cargo test --release -p ipsan-seal --test negotiation_time -- --ignored --nocapture`.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::time::{Duration, Instant};

use ipsan_seal::Cipher;
use support::keys::pair;

#[test]
#[ignore = "a measurement: run with --ignored --nocapture, in release"]
fn negotiation_median_of_1000() {
    let mut times: Vec<Duration> = (0..1100)
        .map(|_| {
            let t = Instant::now();
            let (i, s) = pair(Cipher::Aes256Gcm, 65536);
            let took = t.elapsed();
            drop((i, s));
            took
        })
        .skip(100)
        .collect();
    times.sort();
    let us = |d: Duration| d.as_secs_f64() * 1e6;
    println!(
        "negotiation (1000, after 100 warm-up): median {:.1} us, p10 {:.1} us, p90 {:.1} us",
        us(times[500]),
        us(times[100]),
        us(times[900])
    );
}
