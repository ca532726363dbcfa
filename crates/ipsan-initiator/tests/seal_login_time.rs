//! Login time with Seal (issue 31 item 2: the cost of CPace under the key schedule): the
//! median of 100 sealed logins (AES-256-GCM, TCP connect to the final Login Response) against
//! the in-process target on loopback, each followed by a logout. A measurement, not a check,
//! so ignored by default:
//! `cargo test --release -p ipsan-initiator --test seal_login_time -- --ignored --nocapture`.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::time::{Duration, Instant};

use common::{bounded, config, seal_target};
use ipsan_initiator::seal::SealRequest;
use ipsan_initiator::{IscsiUrl, LoginOptions, Session, SessionConfig};
use ipsan_seal::{Cipher, Psk, SealPolicy};

const IQN: &str = "iqn.2026-11.org.ipsan:login-time";
const SECRET: &[u8] = b"login-time-pre-shared-secret-0123456789";

#[test]
#[ignore = "a measurement: run with --ignored --nocapture, in release"]
fn sealed_login_median_of_100() {
    bounded(600, async {
        let h = seal_target(IQN, SECRET, SealPolicy::Required, None).await;
        let url = IscsiUrl::parse(&format!("iscsi://{}/{IQN}/0", h.addrs[0])).unwrap();
        let req = SealRequest {
            ciphers: vec![Cipher::Aes256Gcm],
            chunk: ipsan_seal::DEFAULT_CHUNK,
            psk: Psk::new(SECRET.to_vec()).unwrap(),
            pool: None,
        };
        let cfg = SessionConfig {
            extension: Some(req.factory()),
            ..config(LoginOptions::default())
        };
        let mut times: Vec<Duration> = Vec::new();
        for i in 0..110 {
            let t = Instant::now();
            let s = Session::open(&url, &cfg).await.unwrap();
            let took = t.elapsed();
            s.logout().await.unwrap();
            if i >= 10 {
                times.push(took);
            }
        }
        times.sort();
        let us = |d: Duration| d.as_secs_f64() * 1e6;
        println!(
            "sealed login (100, after 10 warm-up): median {:.0} us, p10 {:.0} us, p90 {:.0} us",
            us(times[50]),
            us(times[10]),
            us(times[90])
        );
        h.shutdown().await.unwrap();
    });
}
