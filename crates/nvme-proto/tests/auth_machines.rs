//! DH-HMAC-CHAP's two machines against each other, through a relay that sees (and, for the
//! attack tests, rewrites) every Authentication Send and Receive payload, as a man in the
//! middle on the TCP connection would: every hash × group, unidirectional and bidirectional;
//! wrong secrets both ways; replayed, reflected and tampered messages.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;

use bytes::Bytes;
use nvme_proto::auth::message::{Message, ID_CHALLENGE, ID_REPLY, ID_SUCCESS1};
use nvme_proto::auth::{
    AuthCommandError, AuthConfig, AuthFailure, AuthState, ControllerAuth, DhGroup, DhchapSecret,
    FailureReason, HashId, HostAuth, HostStep, RECEIVE_ALLOC_LEN,
};

const HOSTNQN: &str = "nqn.2014-08.org.nvmexpress:uuid:6e766d65-766d-4000-8000-000000000001";
const SUBNQN: &str = "nqn.2026-11.org.example:ipsan";

fn secret(fill: u8, transform: Option<HashId>) -> DhchapSecret {
    let len = transform.map_or(32, HashId::len);
    DhchapSecret::from_key(&vec![fill; len], transform).unwrap()
}

fn config(host: u8, ctrl: Option<u8>) -> AuthConfig {
    AuthConfig::new(
        secret(host, Some(HashId::Sha256)),
        ctrl.map(|c| secret(c, Some(HashId::Sha512))),
    )
}

/// Which way a payload travels.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Leg {
    /// Authentication Send data.
    ToController,
    /// Authentication Receive data.
    ToHost,
}

/// Runs one transaction, every payload through `relay`; returns both sides' states.
fn transact(
    host: &mut HostAuth,
    ctrl: &mut ControllerAuth,
    mut relay: impl FnMut(Leg, Bytes) -> Bytes,
) -> (AuthState, AuthState) {
    let mut send = host.start();
    for _ in 0..4 {
        ctrl.auth_send(&relay(Leg::ToController, send)).unwrap();
        let got = relay(Leg::ToHost, ctrl.auth_receive(RECEIVE_ALLOC_LEN).unwrap());
        match host.receive(&got) {
            HostStep::SendThenReceive(b) => send = b,
            HostStep::SendThenDone(b) | HostStep::SendFailure(b, _) => {
                ctrl.auth_send(&relay(Leg::ToController, b)).unwrap();
                break;
            }
            HostStep::Done | HostStep::Failed(_) => break,
        }
    }
    (host.state(), ctrl.state())
}

fn pair(host_cfg: AuthConfig, ctrl_cfg: AuthConfig, t_id: u16) -> (HostAuth, ControllerAuth) {
    (
        HostAuth::new(Arc::new(host_cfg), HOSTNQN, SUBNQN, t_id),
        ControllerAuth::new(Arc::new(ctrl_cfg), HOSTNQN, SUBNQN),
    )
}

fn pass(_: Leg, b: Bytes) -> Bytes {
    b
}

fn auth_id(b: &[u8]) -> (u8, u8) {
    (b[0], b[1])
}

const FAILED_HERE: AuthState = AuthState::Failed(AuthFailure {
    reason: FailureReason::Failed,
    local: true,
});
const FAILED_THERE: AuthState = AuthState::Failed(AuthFailure {
    reason: FailureReason::Failed,
    local: false,
});

#[test]
fn accepts_every_hash_and_group_one_way_and_both_ways() {
    for hash in HashId::ALL {
        for group in DhGroup::ALL {
            for bidirectional in [false, true] {
                let ctrl_key = bidirectional.then_some(9);
                // The host offers everything; the controller accepts only this pair, so the
                // negotiation has to find it.
                let mut ctrl_cfg = config(1, ctrl_key);
                ctrl_cfg.hashes = vec![hash];
                ctrl_cfg.dh_groups = vec![group];
                let (mut host, mut ctrl) = pair(config(1, ctrl_key), ctrl_cfg, 3);
                let want = AuthState::Succeeded {
                    hash,
                    dh_group: group,
                    bidirectional,
                };
                let mut sizes = vec![];
                let got = transact(&mut host, &mut ctrl, |leg, b| {
                    sizes.push((leg, auth_id(&b), b.len()));
                    b
                });
                assert_eq!(got, (want, want), "{hash:?} {group:?} {bidirectional}");
                assert!(ctrl.is_authenticated());
                // The lengths Linux's structures have.
                let hl = hash.len();
                let dh = group.value_len();
                let mut expect = vec![
                    (Leg::ToController, (0, 0), 72),
                    (Leg::ToHost, (1, ID_CHALLENGE), 16 + hl + dh),
                    (Leg::ToController, (1, ID_REPLY), 16 + 2 * hl + dh),
                    (
                        Leg::ToHost,
                        (1, ID_SUCCESS1),
                        16 + if bidirectional { hl } else { 0 },
                    ),
                ];
                if bidirectional {
                    expect.push((Leg::ToController, (1, 4), 16));
                }
                assert_eq!(sizes, expect, "{hash:?} {group:?} {bidirectional}");
            }
        }
    }
}

#[test]
fn rejects_a_host_with_the_wrong_secret_with_authentication_failed_only() {
    for group in [DhGroup::Null, DhGroup::Ffdhe2048] {
        let mut ctrl_cfg = config(1, None);
        ctrl_cfg.dh_groups = vec![group];
        let (mut host, mut ctrl) = pair(config(2, None), ctrl_cfg, 1);
        assert_eq!(
            transact(&mut host, &mut ctrl, pass),
            (FAILED_THERE, FAILED_HERE)
        );
        assert!(!ctrl.is_authenticated());
    }
    // The right secret with the host's response altered at any byte: the same Failure1, so
    // nothing tells which byte was wrong.
    let mut failures = std::collections::BTreeSet::new();
    for at in [0, 1, 15, 31] {
        let (mut host, mut ctrl) = pair(config(1, None), config(1, None), 1);
        let mut failure1 = None;
        let got = transact(&mut host, &mut ctrl, |leg, b| {
            let mut v = b.to_vec();
            if leg == Leg::ToController && auth_id(&v) == (1, ID_REPLY) {
                v[16 + at] ^= 0x01;
            }
            if leg == Leg::ToHost && v[1] == 0xf1 {
                failure1 = Some(v.clone());
            }
            v.into()
        });
        assert_eq!(got, (FAILED_THERE, FAILED_HERE));
        failures.insert(failure1.unwrap());
    }
    assert_eq!(failures.len(), 1);
    assert_eq!(
        failures.first().unwrap(),
        &[0x00, 0xf1, 0, 0, 1, 0, 0x01, 0x01]
    );
}

#[test]
fn rejects_a_controller_with_the_wrong_secret() {
    // The host knows controller secret 9; this controller has 8: its R2 does not verify, the
    // host sends Failure2 and the controller does not count the queue as authenticated.
    let (mut host, mut ctrl) = pair(config(1, Some(9)), config(1, Some(8)), 1);
    let mut sent_failure2 = false;
    let got = transact(&mut host, &mut ctrl, |leg, b| {
        sent_failure2 |= leg == Leg::ToController && b[1] == 0xf0;
        b
    });
    assert_eq!(got, (FAILED_HERE, FAILED_THERE));
    assert!(sent_failure2);
    assert!(!ctrl.is_authenticated());

    // A controller with no controller secret cannot answer C2: Failure1.
    let (mut host, mut ctrl) = pair(config(1, Some(9)), config(1, None), 1);
    assert_eq!(
        transact(&mut host, &mut ctrl, pass),
        (FAILED_THERE, FAILED_HERE)
    );
}

#[test]
fn rejects_a_replayed_reply() {
    for group in [DhGroup::Null, DhGroup::Ffdhe2048] {
        let mut cfg = config(1, None);
        cfg.dh_groups = vec![group];
        // An attacker records a genuine transaction …
        let (mut host, mut ctrl) = pair(cfg.clone(), cfg.clone(), 5);
        let mut recorded = None;
        let ok = transact(&mut host, &mut ctrl, |leg, b| {
            if leg == Leg::ToController && auth_id(&b) == (1, ID_REPLY) {
                recorded = Some(b.clone());
            }
            b
        });
        assert!(matches!(ok.1, AuthState::Succeeded { .. }));
        let recorded = recorded.unwrap();

        // … replays the Reply to the same controller queue after it succeeded (no
        // transaction is open) …
        ctrl.auth_send(&recorded).unwrap();
        let answer = ctrl.auth_receive(RECEIVE_ALLOC_LEN).unwrap();
        assert_eq!(answer[1], 0xf1);
        assert!(!ctrl.is_authenticated());

        // … and into a new transaction (same T_ID) on a new queue, where it answers a
        // challenge that is no longer asked.
        let (mut host2, mut ctrl2) = pair(cfg.clone(), cfg.clone(), 5);
        let got = transact(&mut host2, &mut ctrl2, |leg, b| {
            if leg == Leg::ToController && auth_id(&b) == (1, ID_REPLY) {
                return recorded.clone();
            }
            b
        });
        assert_eq!(got, (FAILED_THERE, FAILED_HERE), "{group:?}");
        assert!(!ctrl2.is_authenticated());
    }
}

#[test]
fn rejects_a_reflected_challenge() {
    // The attacker rewrites the host's C2 to the controller's own C1, hoping to get the
    // controller to compute a response it can reuse: refused.
    let (mut host, mut ctrl) = pair(config(1, Some(9)), config(1, Some(9)), 2);
    let mut c1 = vec![];
    let got = transact(&mut host, &mut ctrl, |leg, b| {
        let mut v = b.to_vec();
        if leg == Leg::ToHost && auth_id(&v) == (1, ID_CHALLENGE) {
            c1 = v[16..16 + 32].to_vec();
        }
        if leg == Leg::ToController && auth_id(&v) == (1, ID_REPLY) {
            v[16 + 32..16 + 64].copy_from_slice(&c1);
        }
        v.into()
    });
    assert_eq!(got, (FAILED_THERE, FAILED_HERE));
}

/// Byte ranges of each message an attacker may flip, and who must notice.
#[test]
fn rejects_tampered_messages() {
    // (leg, AUTH_ID, byte to flip (from the message's start))
    let hl = 32;
    let cases: [(Leg, u8, usize, &str); 9] = [
        (Leg::ToHost, ID_CHALLENGE, 16, "C1"),
        (Leg::ToHost, ID_CHALLENGE, 12, "S1"),
        (
            Leg::ToHost,
            ID_CHALLENGE,
            16 + hl + 100,
            "controller DH value",
        ),
        (Leg::ToHost, ID_CHALLENGE, 4, "Challenge T_ID"),
        (
            Leg::ToController,
            ID_REPLY,
            16 + 2 * hl + 7,
            "host DH value",
        ),
        (Leg::ToController, ID_REPLY, 16 + hl + 3, "C2"),
        (Leg::ToController, ID_REPLY, 12, "S2"),
        (Leg::ToController, ID_REPLY, 4, "Reply T_ID"),
        (Leg::ToHost, ID_SUCCESS1, 16 + 5, "R2"),
    ];
    for (leg, id, at, what) in cases {
        let mut cfg = config(1, Some(9));
        cfg.hashes = vec![HashId::Sha256];
        cfg.dh_groups = vec![DhGroup::Ffdhe2048];
        let (mut host, mut ctrl) = pair(cfg.clone(), cfg, 7);
        let mut flipped = false;
        let (h, c) = transact(&mut host, &mut ctrl, |l, b| {
            let mut v = b.to_vec();
            if l == leg && v[0] == 1 && v[1] == id {
                v[at] ^= 0x40;
                flipped = true;
            }
            v.into()
        });
        assert!(flipped, "{what}");
        assert!(
            matches!(h, AuthState::Failed(_)) && matches!(c, AuthState::Failed(_)),
            "{what}: host {h:?}, controller {c:?}"
        );
        assert!(!ctrl.is_authenticated(), "{what}");
    }
}

/// ffdhe2048 (RFC 7919), to build p - 1.
const FFDHE2048: &str = concat!(
    "ffffffffffffffffadf85458a2bb4a9aafdc5620273d3cf1d8b9c583ce2d3695",
    "a9e13641146433fbcc939dce249b3ef97d2fe363630c75d8f681b202aec4617a",
    "d3df1ed5d5fd65612433f51f5f066ed0856365553ded1af3b557135e7f57c935",
    "984f0c70e0e68b77e2a689daf3efe8721df158a136ade73530acca4f483a797a",
    "bc0ab182b324fb61d108a94bb2c8e3fbb96adab760d7f4681d4f42a3de394df4",
    "ae56ede76372bb190b07a7c8ee0a6d709e02fce1cdf7e2ecc03404cd28342f61",
    "9172fe9ce98583ff8e4f1232eef28183c3fe3b1b4c6fad733bb5fcbc2ec22005",
    "c58ef1837d1683b2c6f34a26c1b2effa886b423861285c97ffffffffffffffff",
);

#[test]
fn rejects_dh_public_values_outside_2_to_p_minus_2() {
    let mut cfg = config(1, None);
    cfg.dh_groups = vec![DhGroup::Ffdhe2048];
    let one = {
        let mut v = vec![0u8; 256];
        v[255] = 1;
        v
    };
    let p_minus_1 = {
        let mut v: Vec<u8> = (0..512)
            .step_by(2)
            .map(|i| u8::from_str_radix(&FFDHE2048[i..i + 2], 16).unwrap())
            .collect();
        // The prime ends in 64 one bits: p - 1 ends in FEh.
        assert_eq!(v[255], 0xff);
        v[255] = 0xfe;
        v
    };
    for bad in [vec![0u8; 256], one, p_minus_1] {
        // From the host, in its Reply: the controller refuses with "DH group not usable".
        let (mut host, mut ctrl) = pair(cfg.clone(), cfg.clone(), 1);
        let got = transact(&mut host, &mut ctrl, |leg, b| {
            let mut v = b.to_vec();
            if leg == Leg::ToController && auth_id(&v) == (1, ID_REPLY) {
                v[16 + 64..].copy_from_slice(&bad);
            }
            v.into()
        });
        let refused = AuthFailure {
            reason: FailureReason::DhGroupUnusable,
            local: true,
        };
        assert_eq!(got.1, AuthState::Failed(refused));
        // From the controller, in its Challenge: the host refuses with Failure2.
        let (mut host, mut ctrl) = pair(cfg.clone(), cfg.clone(), 1);
        let got = transact(&mut host, &mut ctrl, |leg, b| {
            let mut v = b.to_vec();
            if leg == Leg::ToHost && auth_id(&v) == (1, ID_CHALLENGE) {
                v[16 + 32..].copy_from_slice(&bad);
            }
            v.into()
        });
        assert_eq!(got.0, AuthState::Failed(refused));
        assert_eq!(
            got.1,
            AuthState::Failed(AuthFailure {
                reason: FailureReason::DhGroupUnusable,
                local: false
            })
        );
    }
}

#[test]
fn rejects_messages_out_of_order_and_secure_channel_concatenation() {
    let cfg = Arc::new(config(1, Some(9)));
    // An Authentication Receive before any Negotiate: Failure1.
    let mut ctrl = ControllerAuth::new(cfg.clone(), HOSTNQN, SUBNQN);
    let b = ctrl.auth_receive(RECEIVE_ALLOC_LEN).unwrap();
    assert_eq!(auth_id(&b), (0, 0xf1));
    assert!(!ctrl.is_authenticated());

    // A Success2 where the Reply belongs: Failure1 "incorrect protocol message".
    let mut ctrl = ControllerAuth::new(cfg.clone(), HOSTNQN, SUBNQN);
    let mut host = HostAuth::new(cfg.clone(), HOSTNQN, SUBNQN, 1);
    ctrl.auth_send(&host.start()).unwrap();
    ctrl.auth_receive(RECEIVE_ALLOC_LEN).unwrap();
    ctrl.auth_send(&Message::Success2 { t_id: 1 }.encode())
        .unwrap();
    let b = ctrl.auth_receive(RECEIVE_ALLOC_LEN).unwrap();
    assert_eq!(&b[..], &[0, 0xf1, 0, 0, 1, 0, 1, 0x07]);
    assert!(!ctrl.is_authenticated());

    // SC_C set in the Negotiate: not supported, Failure1 "concatenation mismatch".
    let mut ctrl = ControllerAuth::new(cfg.clone(), HOSTNQN, SUBNQN);
    let mut neg = HostAuth::new(cfg.clone(), HOSTNQN, SUBNQN, 1)
        .start()
        .to_vec();
    neg[6] = 1;
    ctrl.auth_send(&neg).unwrap();
    let b = ctrl.auth_receive(RECEIVE_ALLOC_LEN).unwrap();
    assert_eq!(&b[..], &[0, 0xf1, 0, 0, 1, 0, 1, 0x03]);

    // A host that receives a Success1 in place of a Challenge: Failure2.
    let mut host = HostAuth::new(cfg, HOSTNQN, SUBNQN, 1);
    host.start();
    let s1 = Message::decode(&[1, 3, 0, 0, 1, 0, 32, 0, 0, 0, 0, 0, 0, 0, 0, 0]).unwrap();
    match host.receive(&s1.encode()) {
        HostStep::SendFailure(b, f) => {
            assert_eq!(auth_id(&b), (0, 0xf0));
            assert_eq!(f.reason, FailureReason::IncorrectMessage);
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn rejects_non_dhchap_commands_and_short_allocations_without_losing_the_transaction() {
    use nvme_proto::auth::check_command;
    use nvme_wire::fabrics::Auth;
    let ok = Auth {
        secp: 0xe9,
        spsp0: 1,
        spsp1: 1,
        len: 72,
    };
    assert_eq!(check_command(&ok), Ok(()));
    let bad = Auth { secp: 0xea, ..ok };
    assert!(matches!(
        check_command(&bad),
        Err(AuthCommandError::Protocol { secp: 0xea, .. })
    ));
    assert_eq!(
        check_command(&Auth { len: 0, ..ok }),
        Err(AuthCommandError::ZeroLength)
    );

    let mut cfg = config(1, None);
    cfg.dh_groups = vec![DhGroup::Ffdhe4096];
    let (mut host, mut ctrl) = pair(cfg.clone(), cfg, 1);
    ctrl.auth_send(&host.start()).unwrap();
    assert_eq!(
        ctrl.auth_receive(100),
        Err(AuthCommandError::AllocationTooSmall {
            alloc: 100,
            needed: 16 + 32 + 512
        })
    );
    let challenge = ctrl.auth_receive(560).unwrap();
    let HostStep::SendThenReceive(reply) = host.receive(&challenge) else {
        panic!()
    };
    ctrl.auth_send(&reply).unwrap();
    // Linux's target sends the whole allocation, zero-filled: the host takes that too.
    let mut s1 = ctrl.auth_receive(RECEIVE_ALLOC_LEN).unwrap().to_vec();
    s1.resize(RECEIVE_ALLOC_LEN as usize, 0);
    assert_eq!(host.receive(&s1), HostStep::Done);
    assert!(ctrl.is_authenticated());
}

#[test]
fn accepts_reauthentication_on_the_same_queue() {
    let cfg = Arc::new(config(1, Some(9)));
    let mut ctrl = ControllerAuth::new(cfg.clone(), HOSTNQN, SUBNQN);
    for t_id in [1, 2, 3] {
        let mut host = HostAuth::new(cfg.clone(), HOSTNQN, SUBNQN, t_id);
        let (h, c) = transact(&mut host, &mut ctrl, pass);
        assert!(matches!(h, AuthState::Succeeded { .. }) && h == c, "{t_id}");
        assert!(ctrl.is_authenticated());
    }
}

#[test]
fn prints_no_secret_in_debug() {
    let cfg = config(0xab, Some(0xcd));
    let (host, ctrl) = pair(cfg.clone(), cfg.clone(), 1);
    for text in [format!("{cfg:?}"), format!("{host:?}"), format!("{ctrl:?}")] {
        assert!(
            !text.contains("171") && !text.to_lowercase().contains("abab"),
            "{text}"
        );
        assert!(
            !text.contains("205") && !text.to_lowercase().contains("cdcd"),
            "{text}"
        );
    }
    assert!(format!("{cfg:?}").contains("<redacted>"));
}
