//! A hostile peer without the secrets, seeded and bounded: random bytes and well-formed
//! messages with random contents, in any order, against each machine. Neither panics, the
//! controller never counts the host as authenticated, and a bidirectional host never accepts
//! the controller.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;

use nvme_proto::auth::message::{Challenge, Message, Negotiate, Reply, Success1};
use nvme_proto::auth::{
    AuthConfig, AuthState, ControllerAuth, DhGroup, DhchapSecret, HashId, HostAuth, HostStep,
};
use rand::rngs::StdRng;
use rand::{Rng, RngCore, SeedableRng};

const HOSTNQN: &str = "nqn.2026-11.org.example:hostile-host";
const SUBNQN: &str = "nqn.2026-11.org.example:ipsan";

fn config() -> Arc<AuthConfig> {
    let mut c = AuthConfig::new(
        DhchapSecret::from_key(&[1; 32], Some(HashId::Sha256)).unwrap(),
        Some(DhchapSecret::from_key(&[2; 48], Some(HashId::Sha384)).unwrap()),
    );
    // Small groups keep the run short; the parsing paths are the same for all.
    c.dh_groups = vec![DhGroup::Null, DhGroup::Ffdhe2048];
    Arc::new(c)
}

fn bytes(rng: &mut StdRng, len: usize) -> Vec<u8> {
    let mut v = vec![0u8; len];
    rng.fill_bytes(&mut v);
    v
}

/// A message from the attacker: garbage, or a well-formed one with random contents, then
/// possibly mangled.
fn hostile_to_controller(rng: &mut StdRng, t_id: u16) -> Vec<u8> {
    let hl = [32, 48, 64][rng.gen_range(0..3)];
    let mut v = match rng.gen_range(0..6) {
        0 => {
            let len = rng.gen_range(0..200);
            bytes(rng, len)
        }
        1 => {
            let (nh, ng) = (rng.gen_range(0..5), rng.gen_range(0..7));
            Message::Negotiate(Negotiate {
                t_id,
                sc_c: if rng.gen_bool(0.9) { 0 } else { rng.gen() },
                hashes: bytes(rng, nh).iter().map(|b| b % 5).collect(),
                dh_groups: bytes(rng, ng).iter().map(|b| b % 7).collect(),
            })
            .encode()
            .to_vec()
        }
        2 | 3 => Message::Reply(Reply {
            t_id,
            response: bytes(rng, hl),
            challenge: rng.gen_bool(0.5).then(|| bytes(rng, hl)),
            seqnum: rng.gen(),
            dh_value: if rng.gen_bool(0.5) {
                vec![]
            } else {
                bytes(rng, 256)
            },
        })
        .encode()
        .to_vec(),
        4 => Message::Success2 { t_id }.encode().to_vec(),
        _ => Message::decode(&[0, 0xf0, 0, 0, 0, 0, 1, 1])
            .unwrap()
            .encode()
            .to_vec(),
    };
    if !v.is_empty() && rng.gen_bool(0.3) {
        let at = rng.gen_range(0..v.len());
        v[at] = rng.gen();
    }
    if rng.gen_bool(0.1) {
        let len = rng.gen_range(0..=v.len());
        v.truncate(len);
    }
    v
}

#[test]
fn rejects_a_hostile_host_that_has_no_secret() {
    let mut rng = StdRng::seed_from_u64(0x6e76_6d65_6175_7468);
    let cfg = config();
    let (mut challenges, mut refused_replies) = (0, 0);
    for round in 0..300 {
        let mut ctrl = ControllerAuth::new(cfg.clone(), HOSTNQN, SUBNQN);
        let t_id = rng.gen();
        let mut challenged = false;
        for i in 0..8 {
            // Mostly the protocol's shape (send, receive, send, receive …), sometimes not.
            let send = if rng.gen_bool(0.85) {
                i % 2 == 0
            } else {
                rng.gen()
            };
            if send {
                let m = if i == 0 && rng.gen_bool(0.8) {
                    Message::Negotiate(Negotiate {
                        t_id,
                        sc_c: 0,
                        hashes: vec![1, 2, 3],
                        dh_groups: vec![0, 1],
                    })
                    .encode()
                    .to_vec()
                } else {
                    hostile_to_controller(&mut rng, t_id)
                };
                let is_reply = m.len() > 2 && m[..2] == [1, 2];
                let _ = ctrl.auth_send(&m);
                if is_reply && challenged {
                    let b = ctrl.auth_receive(4096).unwrap();
                    assert_eq!(b[..2], [0, 0xf1], "round {round}: a hostile Reply passed");
                    refused_replies += 1;
                    challenged = false;
                }
            } else {
                let alloc = if rng.gen_bool(0.8) {
                    4096
                } else {
                    rng.gen_range(0..400)
                };
                if let Ok(b) = ctrl.auth_receive(alloc) {
                    challenged = b[..2] == [1, 1];
                    challenges += usize::from(challenged);
                }
            }
            assert!(!ctrl.is_authenticated(), "round {round}: {ctrl:?}");
            assert!(
                !matches!(ctrl.state(), AuthState::Succeeded { .. }),
                "round {round}"
            );
        }
    }
    // The walk reaches the checks that matter, not only the parser.
    assert!(
        challenges > 100 && refused_replies > 30,
        "{challenges} challenges, {refused_replies} replies refused"
    );
}

#[test]
fn rejects_a_hostile_controller_when_bidirectional() {
    let mut rng = StdRng::seed_from_u64(0x6374_726c);
    let cfg = config();
    for round in 0..300 {
        let t_id: u16 = rng.gen();
        let mut host = HostAuth::new(cfg.clone(), HOSTNQN, SUBNQN, t_id);
        host.start();
        let hash = HashId::ALL[rng.gen_range(0..3)];
        let challenge = match rng.gen_range(0..4) {
            0 => {
                let len = rng.gen_range(0..300);
                bytes(&mut rng, len)
            }
            _ => Message::Challenge(Challenge {
                t_id,
                hash,
                dh_group: DhGroup::Null,
                seqnum: rng.gen(),
                challenge: bytes(&mut rng, hash.len()),
                dh_value: vec![],
            })
            .encode()
            .to_vec(),
        };
        let step = host.receive(&challenge);
        if !matches!(step, HostStep::SendThenReceive(_)) {
            assert!(
                matches!(host.state(), AuthState::Failed(_)),
                "round {round}"
            );
            continue;
        }
        let mut s1 = Message::Success1(Success1 {
            t_id,
            hash_len: hash.len() as u8,
            response: rng.gen_bool(0.8).then(|| bytes(&mut rng, hash.len())),
        })
        .encode()
        .to_vec();
        if rng.gen_bool(0.3) {
            let at = rng.gen_range(0..s1.len());
            s1[at] = rng.gen();
        }
        let step = host.receive(&s1);
        assert!(
            matches!(step, HostStep::SendFailure(..) | HostStep::Failed(_)),
            "round {round}: {step:?}"
        );
        assert!(
            matches!(host.state(), AuthState::Failed(_)),
            "round {round}"
        );
    }
}
