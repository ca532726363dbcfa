//! Secrets never reach the logs, errors or `Debug` output (issue 8): every tracing event of a
//! full run at TRACE level — CHAP and mutual CHAP logins that succeed and fail, discovery with
//! CHAP, commands, logouts, shutdown — is captured and searched for the secrets, as are the
//! config's `Debug` and the errors of bad configs.
//!
//! One test per binary: it installs the process-wide tracing subscriber.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod robust_common;

use iscsi_proto::chap::{self, ChapAlgorithm, ChapSecret};
use iscsi_wire::header::*;
use robust_common::*;

const CHAP_SECRET: &str = "s3cr3t-chap-Zq9xW7vK";
const MUTUAL_SECRET: &str = "s3cr3t-mutual-Hj4pL2mN";
const DISCOVERY_SECRET: &str = "s3cr3t-discovery-Rt6yU8iO";
const SEAL_SECRET: &str = "s3cr3t-seal-psk-Bn3mK5jH-32-bytes-long";

/// The forms a secret could leak in: as text, hex, or CHAP's 0x-hex binary encoding.
fn forms(secret: &str) -> Vec<String> {
    vec![
        secret.to_owned(),
        hex::encode(secret),
        chap::encode_binary(secret.as_bytes()),
        format!("{:?}", secret.as_bytes()),
    ]
}

fn assert_clean(what: &str, text: &str) {
    for s in [CHAP_SECRET, MUTUAL_SECRET, DISCOVERY_SECRET, SEAL_SECRET] {
        for f in forms(s) {
            assert!(!text.contains(&f), "{what} contains a secret ({f:?})");
        }
    }
}

async fn chap_login(
    c: &mut Raw,
    isid: [u8; 6],
    target: Option<&str>,
    user: &str,
    secret: &str,
    mutual: bool,
) -> LoginAnswer {
    let mut keys = vec![("InitiatorName", INITIATOR), ("AuthMethod", "CHAP")];
    match target {
        Some(t) => keys.extend([("TargetName", t), ("SessionType", "Normal")]),
        None => keys.push(("SessionType", "Discovery")),
    }
    let a = c
        .login_step(
            isid,
            Stage::SECURITY_NEGOTIATION,
            Stage::SECURITY_NEGOTIATION,
            false,
            &keys,
        )
        .await
        .unwrap();
    assert!(a.ok(), "{a:?}");
    let b = c
        .login_step(
            isid,
            Stage::SECURITY_NEGOTIATION,
            Stage::SECURITY_NEGOTIATION,
            false,
            &[("CHAP_A", "7")],
        )
        .await
        .unwrap();
    let alg = ChapAlgorithm(b.key("CHAP_A").unwrap().parse().unwrap());
    let id = chap::parse_identifier(b.key("CHAP_I").unwrap()).unwrap();
    let ch = chap::decode_binary(b.key("CHAP_C").unwrap()).unwrap();
    let r = chap::encode_binary(
        &chap::response(
            alg,
            id,
            &ChapSecret::new(secret.as_bytes().to_vec()).unwrap(),
            &ch,
        )
        .unwrap(),
    );
    let my_c = chap::encode_binary(&[0x11u8; 32]);
    let mut keys = vec![("CHAP_N", user), ("CHAP_R", r.as_str())];
    if mutual {
        keys.extend([("CHAP_I", "3"), ("CHAP_C", my_c.as_str())]);
    }
    c.login_step(
        isid,
        Stage::SECURITY_NEGOTIATION,
        Stage::LOGIN_OPERATIONAL_NEGOTIATION,
        true,
        &keys,
    )
    .await
    .unwrap()
}

#[test]
fn secrets_never_appear_in_logs_errors_or_debug() {
    // Every event and span field, at every level.
    let log = captured_log(tracing::Level::TRACE);

    let toml_extra = format!(
        "[target.chap]\nuser = \"alice\"\nsecret = \"{CHAP_SECRET}\"\nmutual_user = \"disk\"\nmutual_secret = \"{MUTUAL_SECRET}\"\n\n[target.seal]\nsecret = \"{SEAL_SECRET}\"\n"
    );
    let mut cfg = config(&["mem:4MiB"], &toml_extra);
    cfg.discovery_chap = config(
        &["mem:4MiB"],
        &format!("[target.chap]\nuser = \"disc\"\nsecret = \"{DISCOVERY_SECRET}\"\n"),
    )
    .targets[0]
        .chap
        .clone();
    assert!(cfg.discovery_chap.is_some());
    assert_clean("Config Debug", &format!("{cfg:?}"));

    bounded(60, async {
        let t = start(&cfg).await;
        // Good mutual CHAP login, then commands and a logout.
        let mut c = Raw::connect(t.addrs[0]).await;
        let a = chap_login(
            &mut c,
            [0x80, 0, 0, 0, 7, 1],
            Some(IQN),
            "alice",
            CHAP_SECRET,
            true,
        )
        .await;
        assert!(a.ok(), "{a:?}");
        let b = c
            .login_step(
                [0x80, 0, 0, 0, 7, 1],
                Stage::LOGIN_OPERATIONAL_NEGOTIATION,
                Stage::FULL_FEATURE_PHASE,
                true,
                &[("MaxRecvDataSegmentLength", "65536")],
            )
            .await
            .unwrap();
        assert!(b.ok(), "{b:?}");
        assert!(is_good(&c.test_unit_ready(1).await, 1));
        // Wrong secret, wrong user.
        for (user, secret) in [("alice", "wrong-secret-wrong-secret"), ("bob", CHAP_SECRET)] {
            let mut c = Raw::connect(t.addrs[0]).await;
            let a = chap_login(
                &mut c,
                [0x80, 0, 0, 0, 7, 2],
                Some(IQN),
                user,
                secret,
                false,
            )
            .await;
            assert_eq!(a.header.status_class, 2);
        }
        // Discovery with CHAP, good and bad.
        let mut d = Raw::connect(t.addrs[0]).await;
        let a = chap_login(
            &mut d,
            [0x80, 0, 0, 0, 7, 3],
            None,
            "disc",
            DISCOVERY_SECRET,
            false,
        )
        .await;
        assert!(a.ok(), "{a:?}");
        let mut d = Raw::connect(t.addrs[0]).await;
        let a = chap_login(
            &mut d,
            [0x80, 0, 0, 0, 7, 4],
            None,
            "disc",
            "not-the-discovery-secret",
            false,
        )
        .await;
        assert_eq!(a.header.status_class, 2);
        t.shutdown().await.unwrap();
    });

    // Errors from bad configs name the field, not the secret.
    for bad in [
        format!("[[target]]\niqn = \"{IQN}\"\n[target.chap]\nuser = \"a\"\nsecret = \"{CHAP_SECRET}\"\nsecret_file = \"/nonexistent\"\n"),
        format!("[[target]]\niqn = \"{IQN}\"\n[target.chap]\nuser = \"a\"\nsecret = \"{CHAP_SECRET}\"\nmutual_user = \"b\"\nmutual_secret = \"{CHAP_SECRET}\"\n"),
        format!("[[target]]\niqn = \"{IQN}\"\n[target.chap]\nuser = \"a\"\nsecret = \"{CHAP_SECRET}\"\nbogus = \"{MUTUAL_SECRET}\"\n"),
        format!("[[target]]\niqn = \"{IQN}\"\n[target.seal]\nsecret = \"{SEAL_SECRET}\"\nsecret_file = \"/nonexistent\"\n"),
    ] {
        if let Err(e) = ipsan_target::Config::from_toml(&bad) {
            assert_clean("config error", &format!("{e} {e:?}"));
        }
    }

    let log = log.lock().unwrap().clone();
    assert!(log.contains("login complete"), "the run was logged:\n{log}");
    assert!(log.contains("login refused"), "failures are logged:\n{log}");
    assert_clean("the log", &log);
}
