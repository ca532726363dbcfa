//! Who gets in (issue 8, security): CHAP with a wrong secret, a replayed response, a reflected
//! challenge and algorithm downgrades are refused (RFC 7143 §12.1.3, RFC 1994); the initiator
//! allow-list holds for login and for SendTargets discovery.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod robust_common;

use std::time::Duration;

use bytes::Bytes;
use iscsi_proto::chap::{self, ChapAlgorithm, ChapSecret};
use iscsi_wire::header::*;
use iscsi_wire::{Header, Pdu, RESERVED_TAG};
use robust_common::*;

const SECRET: &str = "correct horse battery staple";
const MUTUAL: &str = "target answers with this one";

fn chap_target(algorithms: &str, mutual: bool) -> ipsan_target::Config {
    let mut extra = format!(
        "[target.chap]\nuser = \"alice\"\nsecret = \"{SECRET}\"\nalgorithms = [{algorithms}]\n"
    );
    if mutual {
        extra.push_str(&format!(
            "mutual_user = \"disk\"\nmutual_secret = \"{MUTUAL}\"\n"
        ));
    }
    config(&["mem:4MiB"], &extra)
}

/// Security stage up to the challenge: (CHAP_I, CHAP_C bytes, algorithm) or the failure.
async fn get_challenge(
    c: &mut Raw,
    isid: [u8; 6],
    chap_a: &str,
) -> Result<(u8, Vec<u8>, ChapAlgorithm), LoginAnswer> {
    let a = c
        .login_step(
            isid,
            Stage::SECURITY_NEGOTIATION,
            Stage::SECURITY_NEGOTIATION,
            false,
            &[
                ("InitiatorName", INITIATOR),
                ("TargetName", IQN),
                ("SessionType", "Normal"),
                ("AuthMethod", "CHAP"),
            ],
        )
        .await
        .expect("answer");
    assert!(a.ok(), "{a:?}");
    assert_eq!(a.key("AuthMethod"), Some("CHAP"));
    let b = c
        .login_step(
            isid,
            Stage::SECURITY_NEGOTIATION,
            Stage::SECURITY_NEGOTIATION,
            false,
            &[("CHAP_A", chap_a)],
        )
        .await
        .expect("answer");
    if !b.ok() {
        return Err(b);
    }
    let alg = ChapAlgorithm(b.key("CHAP_A").unwrap().parse().unwrap());
    let id = chap::parse_identifier(b.key("CHAP_I").unwrap()).unwrap();
    let ch = chap::decode_binary(b.key("CHAP_C").unwrap()).unwrap();
    Ok((id, ch, alg))
}

async fn send_response(c: &mut Raw, isid: [u8; 6], keys: &[(&str, &str)]) -> Option<LoginAnswer> {
    c.login_step(
        isid,
        Stage::SECURITY_NEGOTIATION,
        Stage::LOGIN_OPERATIONAL_NEGOTIATION,
        true,
        keys,
    )
    .await
}

fn secret(s: &str) -> ChapSecret {
    ChapSecret::new(s.as_bytes().to_vec()).unwrap()
}

fn assert_auth_failure(a: Option<LoginAnswer>) {
    let a = a.expect("a login response");
    assert_eq!(
        (a.header.status_class, a.header.status_detail),
        (2, 1),
        "authentication failure (0x0201): {a:?}"
    );
}

#[test]
fn accepts_correct_chap_response() {
    bounded(30, async {
        let t = start(&chap_target("\"sha256\"", false)).await;
        let mut c = Raw::connect(t.addrs[0]).await;
        let isid = [0x80, 0, 0, 0, 5, 1];
        let (id, ch, alg) = get_challenge(&mut c, isid, "7").await.unwrap();
        let r = chap::response(alg, id, &secret(SECRET), &ch).unwrap();
        let a = send_response(
            &mut c,
            isid,
            &[("CHAP_N", "alice"), ("CHAP_R", &chap::encode_binary(&r))],
        )
        .await
        .unwrap();
        assert!(a.ok(), "{a:?}");
        t.shutdown().await.unwrap();
    });
}

#[test]
fn rejects_wrong_secret_wrong_name_and_no_auth() {
    bounded(30, async {
        let t = start(&chap_target("\"sha256\"", false)).await;
        let isid = [0x80, 0, 0, 0, 5, 2];
        // Wrong secret.
        let mut c = Raw::connect(t.addrs[0]).await;
        let (id, ch, alg) = get_challenge(&mut c, isid, "7").await.unwrap();
        let r = chap::response(alg, id, &secret("correct horse battery stapler"), &ch).unwrap();
        assert_auth_failure(
            send_response(
                &mut c,
                isid,
                &[("CHAP_N", "alice"), ("CHAP_R", &chap::encode_binary(&r))],
            )
            .await,
        );
        assert!(
            c.closed_within(Duration::from_secs(5)).await,
            "closed after the failure"
        );
        // Right secret, wrong name.
        let mut c = Raw::connect(t.addrs[0]).await;
        let (id, ch, alg) = get_challenge(&mut c, isid, "7").await.unwrap();
        let r = chap::response(alg, id, &secret(SECRET), &ch).unwrap();
        assert_auth_failure(
            send_response(
                &mut c,
                isid,
                &[("CHAP_N", "mallory"), ("CHAP_R", &chap::encode_binary(&r))],
            )
            .await,
        );
        // AuthMethod=None to a CHAP target.
        let mut c = Raw::connect(t.addrs[0]).await;
        let a = c
            .login_step(
                isid,
                Stage::SECURITY_NEGOTIATION,
                Stage::LOGIN_OPERATIONAL_NEGOTIATION,
                true,
                &[
                    ("InitiatorName", INITIATOR),
                    ("TargetName", IQN),
                    ("AuthMethod", "None"),
                ],
            )
            .await;
        assert_auth_failure(a);
        // Skipping security negotiation altogether.
        let mut c = Raw::connect(t.addrs[0]).await;
        let a = c
            .login_step(
                isid,
                Stage::LOGIN_OPERATIONAL_NEGOTIATION,
                Stage::FULL_FEATURE_PHASE,
                true,
                &[("InitiatorName", INITIATOR), ("TargetName", IQN)],
            )
            .await
            .expect("answer");
        assert_eq!(a.header.status_class, 2, "refused: {a:?}");
        t.shutdown().await.unwrap();
    });
}

#[test]
fn rejects_replayed_chap_response() {
    bounded(30, async {
        let t = start(&chap_target("\"sha256\"", false)).await;
        let isid = [0x80, 0, 0, 0, 5, 3];
        // A genuine exchange an eavesdropper records...
        let mut c = Raw::connect(t.addrs[0]).await;
        let (id, ch, alg) = get_challenge(&mut c, isid, "7").await.unwrap();
        let recorded = chap::encode_binary(&chap::response(alg, id, &secret(SECRET), &ch).unwrap());
        let a = send_response(&mut c, isid, &[("CHAP_N", "alice"), ("CHAP_R", &recorded)])
            .await
            .unwrap();
        assert!(a.ok());
        // ...and replays on a new connection: a fresh challenge, so the old answer fails.
        let mut e = Raw::connect(t.addrs[0]).await;
        let (id2, ch2, _) = get_challenge(&mut e, [0x80, 0, 0, 0, 5, 4], "7")
            .await
            .unwrap();
        assert!(
            ch2 != ch || id2 != id,
            "the target issued the same challenge twice"
        );
        assert_auth_failure(
            send_response(
                &mut e,
                [0x80, 0, 0, 0, 5, 4],
                &[("CHAP_N", "alice"), ("CHAP_R", &recorded)],
            )
            .await,
        );
        t.shutdown().await.unwrap();
    });
}

#[test]
fn rejects_reflected_challenge_in_mutual_chap() {
    bounded(30, async {
        let t = start(&chap_target("\"sha256\"", true)).await;
        let isid = [0x80, 0, 0, 0, 5, 5];
        let mut c = Raw::connect(t.addrs[0]).await;
        let (id, ch, alg) = get_challenge(&mut c, isid, "7").await.unwrap();
        let r = chap::encode_binary(&chap::response(alg, id, &secret(SECRET), &ch).unwrap());
        // The initiator sends the target's own challenge back, hoping the target computes
        // the answer to it (RFC 7143 §12.1.3: reflection).
        let reflected = chap::encode_binary(&ch);
        let id_s = id.to_string();
        let a = send_response(
            &mut c,
            isid,
            &[
                ("CHAP_N", "alice"),
                ("CHAP_R", &r),
                ("CHAP_I", &id_s),
                ("CHAP_C", &reflected),
            ],
        )
        .await;
        let a = a.expect("a login response");
        assert_eq!(
            a.header.status_class, 2,
            "reflected challenge refused: {a:?}"
        );
        assert!(
            a.key("CHAP_R").is_none(),
            "the target computed a response to its own challenge"
        );
        // A genuine mutual exchange still works and the target proves the mutual secret.
        let mut c = Raw::connect(t.addrs[0]).await;
        let (id, ch, alg) = get_challenge(&mut c, isid, "7").await.unwrap();
        let r = chap::encode_binary(&chap::response(alg, id, &secret(SECRET), &ch).unwrap());
        let my_c = [0x5au8; 32];
        let a = send_response(
            &mut c,
            isid,
            &[
                ("CHAP_N", "alice"),
                ("CHAP_R", &r),
                ("CHAP_I", "9"),
                ("CHAP_C", &chap::encode_binary(&my_c)),
            ],
        )
        .await
        .unwrap();
        assert!(a.ok(), "{a:?}");
        let tr = chap::decode_binary(a.key("CHAP_R").unwrap()).unwrap();
        assert!(
            chap::verify(alg, 9, &secret(MUTUAL), &my_c, &tr),
            "target proved the mutual secret"
        );
        t.shutdown().await.unwrap();
    });
}

#[test]
fn refuses_algorithm_downgrade() {
    bounded(30, async {
        let t = start(&chap_target("\"sha3-256\", \"sha256\"", false)).await;
        let isid = [0x80, 0, 0, 0, 5, 6];
        // Only MD5 offered to a target that accepts SHA3-256/SHA-256 only.
        let mut c = Raw::connect(t.addrs[0]).await;
        let e = get_challenge(&mut c, isid, "5")
            .await
            .expect_err("MD5 refused");
        assert_eq!(
            (e.header.status_class, e.header.status_detail),
            (2, 1),
            "{e:?}"
        );
        // Weak first, strong later: RFC 7143 §6.2 lets the originator's order decide, but
        // only among what the target accepts: never MD5 or SHA-1 here.
        let mut c = Raw::connect(t.addrs[0]).await;
        let (id, ch, alg) = get_challenge(&mut c, isid, "5,6,7,8").await.unwrap();
        assert_eq!(alg, ChapAlgorithm::SHA256);
        // Answering the SHA-256 challenge with an MD5 digest fails.
        let r = chap::response(ChapAlgorithm::MD5, id, &secret(SECRET), &ch).unwrap();
        assert_auth_failure(
            send_response(
                &mut c,
                isid,
                &[("CHAP_N", "alice"), ("CHAP_R", &chap::encode_binary(&r))],
            )
            .await,
        );
        t.shutdown().await.unwrap();
    });
}

#[test]
fn allow_list_holds_for_login_and_discovery() {
    bounded(30, async {
        let allow = "allow = [\"iqn.2026-11.org.example:rob*\"]";
        let mut cfg = config(&["mem:4MiB"], allow);
        // A second, open target that everyone may see.
        let open = config(&["mem:4MiB"], "");
        let mut t2 = open.targets[0].clone();
        t2.iqn = "iqn.2026-11.org.ipsan:open".into();
        cfg.targets.push(t2);
        let t = start(&cfg).await;
        let evil = "iqn.2026-11.org.example:mallory";
        // Login refused with 0x0202 Authorization failure.
        let mut c = Raw::connect(t.addrs[0]).await;
        let a = c
            .login_step(
                [0x80, 0, 0, 0, 6, 1],
                Stage::LOGIN_OPERATIONAL_NEGOTIATION,
                Stage::FULL_FEATURE_PHASE,
                true,
                &[
                    ("InitiatorName", evil),
                    ("TargetName", IQN),
                    ("SessionType", "Normal"),
                ],
            )
            .await
            .expect("answer");
        assert_eq!(
            (a.header.status_class, a.header.status_detail),
            (2, 2),
            "{a:?}"
        );
        // Discovery lists only what each initiator may use.
        let seen_by = |ini: &'static str| {
            let addr = t.addrs[0];
            async move {
                let mut d = Raw::connect(addr).await;
                let a = d
                    .login_step(
                        [0x80, 0, 0, 0, 6, 2],
                        Stage::LOGIN_OPERATIONAL_NEGOTIATION,
                        Stage::FULL_FEATURE_PHASE,
                        true,
                        &[("InitiatorName", ini), ("SessionType", "Discovery")],
                    )
                    .await
                    .expect("answer");
                assert!(a.ok(), "{a:?}");
                let req = TextRequest {
                    immediate: true,
                    final_: true,
                    continue_: false,
                    lun: 0,
                    itt: 4,
                    ttt: RESERVED_TAG,
                    cmd_sn: d.cmd_sn,
                    exp_stat_sn: d.exp_stat_sn,
                };
                d.send(&Pdu::new(req, Bytes::from_static(b"SendTargets=All\0")))
                    .await;
                let p = d.recv().await.expect("text response");
                assert!(matches!(p.header, Header::TextResponse(_)));
                iscsi_wire::text::parse(&p.data)
                    .unwrap()
                    .into_iter()
                    .filter(|(k, _)| k == "TargetName")
                    .map(|(_, v)| v)
                    .collect::<Vec<_>>()
            }
        };
        assert_eq!(
            seen_by(evil).await,
            vec!["iqn.2026-11.org.ipsan:open".to_owned()]
        );
        let mut good = seen_by(INITIATOR).await;
        good.sort();
        assert_eq!(
            good,
            vec!["iqn.2026-11.org.ipsan:open".to_owned(), IQN.to_owned()]
        );
        // And the allowed initiator logs in.
        let mut ok = Raw::connect(t.addrs[0]).await;
        ok.login([0x80, 0, 0, 0, 6, 3]).await;
        assert!(is_good(&ok.test_unit_ready(1).await, 1));
        t.shutdown().await.unwrap();
    });
}

/// Regression (found by the `login_sm` fuzz target): a first Login Request sent in pieces
/// (C bit) skipped the directory lookup, so no policy applied — AuthMethod=None then reached
/// full feature phase on a CHAP-protected target.
#[test]
fn rejects_continued_first_login_that_skips_chap() {
    bounded(30, async {
        let t = start(&chap_target("\"sha256\"", false)).await;
        let mut c = Raw::connect(t.addrs[0]).await;
        let isid = [0x80, 0, 0, 0, 8, 1];
        let req = |continue_: bool, transit: bool, nsg: Stage| LoginRequest {
            transit,
            continue_,
            csg: Stage::SECURITY_NEGOTIATION,
            nsg,
            version_max: 0,
            version_min: 0,
            isid,
            tsih: 0,
            itt: 1,
            cid: 0,
            cmd_sn: 1,
            exp_stat_sn: 0,
        };
        let first = format!("InitiatorName={INITIATOR}\0TargetName={IQN}\0");
        c.send(&Pdu::new(
            req(true, false, Stage::SECURITY_NEGOTIATION),
            Bytes::from(first),
        ))
        .await;
        let p = c.recv().await.expect("an answer to the first piece");
        assert!(matches!(p.header, Header::LoginResponse(ref r) if r.status_class == 0));
        c.send(&Pdu::new(
            req(false, true, Stage::FULL_FEATURE_PHASE),
            Bytes::from_static(b"SessionType=Normal\0AuthMethod=None\0"),
        ))
        .await;
        let p = c.recv().await;
        let refused = match &p {
            None => true,
            Some(Pdu {
                header: Header::LoginResponse(r),
                ..
            }) => r.status_class != 0,
            Some(_) => false,
        };
        assert!(refused, "CHAP target reached without CHAP: {p:?}");
        t.shutdown().await.unwrap();
    });
}

/// Regression (found by the `login_sm` fuzz target): TargetName, InitiatorName and
/// SessionType redeclared after the first Login Request replaced the values the directory had
/// checked, so a login authorised for an open target ended up on another one. RFC 7143 §6.2: a
/// redeclaration gets a login reject (initiator error).
#[test]
fn rejects_identity_keys_redeclared_during_login() {
    bounded(30, async {
        let mut cfg = chap_target("\"sha256\"", false);
        let mut open = config(&["mem:4MiB"], "").targets.remove(0);
        open.iqn = "iqn.2026-11.org.ipsan:open".into();
        cfg.targets.push(open);
        let t = start(&cfg).await;
        for (n, (k, v)) in [
            ("TargetName", IQN),
            ("InitiatorName", "iqn.2026-11.org.example:someone-else"),
            ("SessionType", "Discovery"),
        ]
        .into_iter()
        .enumerate()
        {
            let isid = [0x80, 0, 0, 0, 9, n as u8];
            let mut c = Raw::connect(t.addrs[0]).await;
            let a = c
                .login_step(
                    isid,
                    Stage::SECURITY_NEGOTIATION,
                    Stage::LOGIN_OPERATIONAL_NEGOTIATION,
                    true,
                    &[
                        ("InitiatorName", INITIATOR),
                        ("TargetName", "iqn.2026-11.org.ipsan:open"),
                        ("SessionType", "Normal"),
                        ("AuthMethod", "None"),
                    ],
                )
                .await
                .unwrap();
            assert!(a.ok(), "{a:?}");
            let b = c
                .login_step(
                    isid,
                    Stage::LOGIN_OPERATIONAL_NEGOTIATION,
                    Stage::FULL_FEATURE_PHASE,
                    true,
                    &[(k, v)],
                )
                .await;
            let refused = b.as_ref().is_none_or(|b| b.header.status_class == 2);
            assert!(refused, "{k} redeclared as {v} was accepted: {b:?}");
        }
        t.shutdown().await.unwrap();
    });
}
