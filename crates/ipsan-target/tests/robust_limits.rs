//! Login limits against the real target (issue 8, security): CHAP failures back off and lock
//! out (RFC 7143 §11.13.5 statuses), sessions per initiator, connections per source address,
//! and connections that never send a Login Request. The policy itself is unit-tested on a
//! virtual clock in `crates/ipsan-target/src/limits.rs`.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod robust_common;

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use iscsi_proto::chap::{self, ChapSecret};
use iscsi_wire::header::*;
use robust_common::*;

const SECRET: &str = "limits-secret-Kq7vN2xP";
const WRONG: &str = "limits-wrong-Zt5bM8wQ";

/// Every tracing event of this test binary at INFO or above, as text.
fn log() -> Arc<Mutex<String>> {
    captured_log(tracing::Level::INFO)
}

fn chap_target(server_extra: &str) -> ipsan_target::Config {
    let extra = format!("[target.chap]\nuser = \"alice\"\nsecret = \"{SECRET}\"\n");
    let mut toml = format!(
        "[server]\nportals = [\"127.0.0.1:0\"]\nnop_interval_secs = 0\n{server_extra}\n\n[[target]]\niqn = \"{IQN}\"\n{extra}\n"
    );
    toml.push_str("[[target.lun]]\nid = 0\nbackend = \"mem:4MiB\"\n");
    ipsan_target::Config::from_toml(&toml).unwrap_or_else(|e| panic!("{e}\n{toml}"))
}

/// A whole CHAP login as `initiator` with `secret`: the final answer, or the first refusal.
/// Also returns how long the last step took to be answered.
async fn chap_login(c: &mut Raw, initiator: &str, secret: &str) -> (LoginAnswer, Duration) {
    let isid = [0x80, 0, 0, 0, 9, 1];
    let t0 = Instant::now();
    let a = c
        .login_step(
            isid,
            Stage::SECURITY_NEGOTIATION,
            Stage::SECURITY_NEGOTIATION,
            false,
            &[
                ("InitiatorName", initiator),
                ("TargetName", IQN),
                ("AuthMethod", "CHAP"),
            ],
        )
        .await
        .expect("answer");
    if !a.ok() {
        return (a, t0.elapsed());
    }
    let b = c
        .login_step(
            isid,
            Stage::SECURITY_NEGOTIATION,
            Stage::SECURITY_NEGOTIATION,
            false,
            &[("CHAP_A", "7")],
        )
        .await
        .expect("answer");
    assert!(b.ok(), "{b:?}");
    let alg = chap::ChapAlgorithm(b.key("CHAP_A").unwrap().parse().unwrap());
    let id = chap::parse_identifier(b.key("CHAP_I").unwrap()).unwrap();
    let ch = chap::decode_binary(b.key("CHAP_C").unwrap()).unwrap();
    let secret = ChapSecret::new(secret.as_bytes().to_vec()).unwrap();
    let r = chap::encode_binary(&chap::response(alg, id, &secret, &ch).unwrap());
    let t0 = Instant::now();
    let a = c
        .login_step(
            isid,
            Stage::SECURITY_NEGOTIATION,
            Stage::FULL_FEATURE_PHASE,
            true,
            &[("CHAP_N", "alice"), ("CHAP_R", &r)],
        )
        .await
        .expect("answer");
    (a, t0.elapsed())
}

fn status(a: &LoginAnswer) -> (u8, u8) {
    (a.header.status_class, a.header.status_detail)
}

#[test]
fn chap_failures_lock_out_and_a_correct_login_after_the_lockout_works() {
    let log = log();
    bounded(60, async {
        let cfg = chap_target(
            "[server.auth_backoff]\nname_free_failures = 2\naddress_free_failures = 100\nlockout_base_ms = 1500\ndelay_base_ms = 100\ndelay_max_ms = 200\n",
        );
        let t = start(&cfg).await;
        let victim = "iqn.2026-11.org.example:limits-victim";
        let other = "iqn.2026-11.org.example:limits-other";
        // Two free failures, then the third starts a lockout. Each failing answer is held back
        // (100 ms, then 200 ms: doubling, capped).
        let mut delays = Vec::new();
        for i in 0..3 {
            let mut c = Raw::connect(t.addrs[0]).await;
            let (a, took) = chap_login(&mut c, victim, WRONG).await;
            assert_eq!(status(&a), (2, 1), "failure {i} is 0x0201: {a:?}");
            delays.push(took);
        }
        assert!(delays[0] >= Duration::from_millis(100), "{delays:?}");
        assert!(delays[2] >= Duration::from_millis(200), "{delays:?}");
        // Locked out: even the right secret is refused at the first request, before CHAP
        // (no AuthMethod answered), with 0x0301 Service Unavailable (class 3: retry later).
        let mut c = Raw::connect(t.addrs[0]).await;
        let (a, _) = chap_login(&mut c, victim, SECRET).await;
        assert_eq!(status(&a), (3, 1), "locked out: {a:?}");
        assert_eq!(a.key("AuthMethod"), None, "CHAP not started: {a:?}");
        assert!(c.closed_within(Duration::from_secs(5)).await);
        // Another initiator name from the same address is not locked out.
        let mut c = Raw::connect(t.addrs[0]).await;
        let (a, _) = chap_login(&mut c, other, SECRET).await;
        assert!(a.ok(), "other name logs in: {a:?}");
        let s = t.limit_stats();
        assert_eq!((s.auth_failures, s.lockout_rejects), (3, 1), "{s:?}");
        // After the lockout the right secret works; the refused attempt did not extend it.
        tokio::time::sleep(Duration::from_millis(1600)).await;
        let mut c = Raw::connect(t.addrs[0]).await;
        let (a, _) = chap_login(&mut c, victim, SECRET).await;
        assert!(a.ok(), "after the lockout: {a:?}");
        t.shutdown().await.unwrap();
    });
    let text = log.lock().unwrap().clone();
    let line = text
        .lines()
        // Other tests of this binary log too: pick this test's initiator.
        .find(|l| l.contains("authentication failed; locked out") && l.contains("limits-victim"))
        .unwrap_or_else(|| panic!("no lockout warning in:\n{text}"));
    assert!(line.starts_with("WARN:"), "{line}");
    for want in [
        "limits-victim",
        "127.0.0.1",
        "failures_name_here=3",
        "lockout_ms=1500",
    ] {
        assert!(line.contains(want), "{want:?} missing from {line}");
    }
    for secret in [SECRET, WRONG] {
        assert!(!text.contains(secret), "secret in the log");
        assert!(
            !text.to_lowercase().contains(&hex::encode(secret)),
            "secret in hex in the log"
        );
    }
    assert!(!text.contains("CHAP_R"), "the response reached the log");
}

#[test]
fn a_login_to_an_open_target_does_not_wash_away_chap_failures() {
    bounded(30, async {
        // One CHAP target (IQN) and one open target on the same portal.
        let toml = format!(
            "[server]\nportals = [\"127.0.0.1:0\"]\nnop_interval_secs = 0\n[server.auth_backoff]\nname_free_failures = 2\naddress_free_failures = 100\nlockout_base_ms = 5000\ndelay_base_ms = 0\n\n[[target]]\niqn = \"{IQN}\"\n[target.chap]\nuser = \"alice\"\nsecret = \"{SECRET}\"\n[[target.lun]]\nid = 0\nbackend = \"mem:1MiB\"\n\n[[target]]\niqn = \"{IQN}-open\"\n[[target.lun]]\nid = 0\nbackend = \"mem:1MiB\"\n"
        );
        let t = start(&ipsan_target::Config::from_toml(&toml).unwrap()).await;
        let name = "iqn.2026-11.org.example:limits-wash";
        for _ in 0..2 {
            let mut c = Raw::connect(t.addrs[0]).await;
            assert_eq!(status(&chap_login(&mut c, name, WRONG).await.0), (2, 1));
        }
        // The same name logs in to the open target: no CHAP was passed, nothing is cleared.
        let mut o = Raw::connect(t.addrs[0]).await;
        let a = o
            .login_step(
                [0x80, 0, 0, 0, 9, 9],
                Stage::LOGIN_OPERATIONAL_NEGOTIATION,
                Stage::FULL_FEATURE_PHASE,
                true,
                &[
                    ("InitiatorName", name),
                    ("TargetName", &format!("{IQN}-open")),
                ],
            )
            .await
            .unwrap();
        assert!(a.ok(), "{a:?}");
        // So the third failure still starts the lockout.
        let mut c = Raw::connect(t.addrs[0]).await;
        assert_eq!(status(&chap_login(&mut c, name, WRONG).await.0), (2, 1));
        let mut c = Raw::connect(t.addrs[0]).await;
        assert_eq!(status(&chap_login(&mut c, name, SECRET).await.0), (3, 1));
        t.shutdown().await.unwrap();
    });
}

#[test]
fn sessions_over_the_per_initiator_limit_get_out_of_resources() {
    bounded(30, async {
        let mut cfg = config(&["mem:4MiB"], "");
        cfg.limits.max_sessions_per_initiator = 2;
        let t = start(&cfg).await;
        let mut a = Raw::connect(t.addrs[0]).await;
        a.login([0x80, 0, 0, 0, 8, 1]).await;
        let mut b = Raw::connect(t.addrs[0]).await;
        b.login([0x80, 0, 0, 0, 8, 2]).await;
        // A third session of the same initiator: 0x0302 Out of Resources.
        let mut c = Raw::connect(t.addrs[0]).await;
        let r = c
            .login_step(
                [0x80, 0, 0, 0, 8, 3],
                Stage::LOGIN_OPERATIONAL_NEGOTIATION,
                Stage::FULL_FEATURE_PHASE,
                true,
                &[("InitiatorName", INITIATOR), ("TargetName", IQN)],
            )
            .await
            .unwrap();
        assert_eq!(status(&r), (3, 2), "{r:?}");
        assert!(c.closed_within(Duration::from_secs(5)).await);
        assert_eq!(t.limit_stats().session_limit_rejects, 1);
        // Reinstating an existing session (same ISID) replaces it rather than adding one.
        let mut a2 = Raw::connect(t.addrs[0]).await;
        a2.login([0x80, 0, 0, 0, 8, 1]).await;
        assert!(is_good(&a2.test_unit_ready(1).await, 1));
        assert!(a.closed_within(Duration::from_secs(5)).await, "reinstated");
        // Another initiator is not affected.
        let mut o = Raw::connect(t.addrs[0]).await;
        let r = o
            .login_step(
                [0x80, 0, 0, 0, 8, 4],
                Stage::LOGIN_OPERATIONAL_NEGOTIATION,
                Stage::FULL_FEATURE_PHASE,
                true,
                &[
                    ("InitiatorName", "iqn.2026-11.org.example:another"),
                    ("TargetName", IQN),
                ],
            )
            .await
            .unwrap();
        assert!(r.ok(), "{r:?}");
        // A session that ends frees its place.
        drop(b);
        let mut d = None;
        for _ in 0..50 {
            tokio::time::sleep(Duration::from_millis(50)).await;
            let mut n = Raw::connect(t.addrs[0]).await;
            let r = n
                .login_step(
                    [0x80, 0, 0, 0, 8, 5],
                    Stage::LOGIN_OPERATIONAL_NEGOTIATION,
                    Stage::FULL_FEATURE_PHASE,
                    true,
                    &[("InitiatorName", INITIATOR), ("TargetName", IQN)],
                )
                .await
                .unwrap();
            if r.ok() {
                d = Some(n);
                break;
            }
        }
        assert!(d.is_some(), "the freed place was never given out");
        t.shutdown().await.unwrap();
    });
}

#[test]
fn connections_per_address_are_capped_and_freed() {
    bounded(30, async {
        let mut cfg = config(&["mem:4MiB"], "");
        cfg.limits.max_connections_per_address = 3;
        let t = start(&cfg).await;
        let mut open = Vec::new();
        for _ in 0..3 {
            open.push(Raw::connect(t.addrs[0]).await);
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
        let mut over = Raw::connect(t.addrs[0]).await;
        assert!(
            over.closed_within(Duration::from_millis(500)).await,
            "fourth connection from 127.0.0.1 refused"
        );
        assert_eq!(t.limit_stats().address_limit_refusals, 1);
        // One of them logs in and works: logged-in connections count too, idle ones close.
        open[0].login([0x80, 0, 0, 0, 7, 1]).await;
        assert!(is_good(&open[0].test_unit_ready(1).await, 1));
        open.truncate(1);
        tokio::time::sleep(Duration::from_millis(200)).await;
        let mut ok = Raw::connect(t.addrs[0]).await;
        ok.login([0x80, 0, 0, 0, 7, 2]).await;
        assert!(is_good(&ok.test_unit_ready(1).await, 1));
        t.shutdown().await.unwrap();
    });
}

#[test]
fn connections_that_send_nothing_are_closed_long_before_the_login_timeout() {
    bounded(30, async {
        let mut cfg = config(&["mem:4MiB"], "");
        cfg.login_timeout = Duration::from_secs(20);
        cfg.limits.first_pdu_timeout = Duration::from_secs(1);
        let t = start(&cfg).await;
        let t0 = Instant::now();
        let mut silent = Raw::connect(t.addrs[0]).await;
        // Half a BHS: not a Login Request yet.
        let mut partial = Raw::connect(t.addrs[0]).await;
        tokio::io::AsyncWriteExt::write_all(&mut partial.s, &[0x43, 0x87, 0, 0])
            .await
            .unwrap();
        // A first step answered: the login timeout applies from here, not the short one.
        let mut started = Raw::connect(t.addrs[0]).await;
        let a = started
            .login_step(
                [0x80, 0, 0, 0, 6, 1],
                Stage::SECURITY_NEGOTIATION,
                Stage::LOGIN_OPERATIONAL_NEGOTIATION,
                false,
                &[
                    ("InitiatorName", INITIATOR),
                    ("TargetName", IQN),
                    ("AuthMethod", "None"),
                ],
            )
            .await
            .unwrap();
        assert!(a.ok());
        assert!(silent.closed_within(Duration::from_secs(5)).await);
        assert!(partial.closed_within(Duration::from_secs(5)).await);
        let took = t0.elapsed();
        assert!(took < Duration::from_secs(3), "closed after {took:?}");
        assert!(
            !started.closed_within(Duration::from_millis(1500)).await,
            "a login under way is not cut by the first-PDU timeout"
        );
        assert_eq!(t.limit_stats().first_pdu_timeouts, 2);
        t.shutdown().await.unwrap();
    });
}
