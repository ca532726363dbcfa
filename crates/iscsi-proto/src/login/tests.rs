use super::*;
use crate::chap;
use crate::params::SessionType;
use iscsi_wire::text;

#[derive(Debug, Default)]
struct Dir {
    chap: Option<ChapPolicy>,
    relay: bool,
    next_tsih: u16,
}

impl Directory for Dir {
    fn target(&self, target_name: &str, _ini: &str) -> Result<TargetPolicy, LoginFailure> {
        if target_name != "iqn.2026-11.org.ipsan:disk0" {
            return Err(LoginFailure::new(LoginStatus::NOT_FOUND, "no such target"));
        }
        Ok(TargetPolicy {
            auth: if self.relay {
                Auth::Relay
            } else {
                self.chap.clone().map_or(Auth::None, Auth::Chap)
            },
            portal_group_tag: 1,
            alias: None,
        })
    }
    fn discovery(&self, _ini: &str) -> Result<TargetPolicy, LoginFailure> {
        Ok(TargetPolicy {
            auth: Auth::None,
            portal_group_tag: 1,
            alias: None,
        })
    }
    fn assign_tsih(&mut self, _: [u8; 6], _: &str, requested: u16) -> Result<u16, LoginFailure> {
        if requested != 0 {
            return Err(LoginFailure::new(
                LoginStatus::SESSION_DOES_NOT_EXIST,
                "no such session",
            ));
        }
        self.next_tsih += 1;
        Ok(self.next_tsih)
    }
}

fn req(csg: u8, nsg: u8, transit: bool) -> LoginRequest {
    LoginRequest {
        transit,
        continue_: false,
        csg: Stage(csg),
        nsg: Stage(nsg),
        version_max: 0,
        version_min: 0,
        isid: [0x80, 0, 0, 0, 0, 1],
        tsih: 0,
        itt: 1,
        cid: 0,
        cmd_sn: 5,
        exp_stat_sn: 0,
    }
}

fn keys(reply: &Reply) -> Vec<(String, String)> {
    text::parse(&reply.data).unwrap()
}

fn get<'a>(k: &'a [(String, String)], name: &str) -> Option<&'a str> {
    k.iter().find(|(n, _)| n == name).map(|(_, v)| v.as_str())
}

const FIRST: &[u8] = b"InitiatorName=iqn.test:ini\0TargetName=iqn.2026-11.org.ipsan:disk0\0SessionType=Normal\0AuthMethod=CHAP,None\0";

#[test]
fn accepts_no_auth_login_through_both_stages() {
    let mut dir = Dir::default();
    let mut l = TargetLogin::new(TargetOffer::default(), None);
    let r = l.handle(&req(0, 1, true), FIRST, &mut dir);
    assert!(matches!(r.outcome, Outcome::Continue));
    assert!(r.header.transit);
    assert_eq!(r.header.nsg, Stage::LOGIN_OPERATIONAL_NEGOTIATION);
    let k = keys(&r);
    assert_eq!(get(&k, "AuthMethod"), Some("None"));
    assert_eq!(get(&k, "TargetPortalGroupTag"), Some("1"));

    let ops = b"HeaderDigest=CRC32C,None\0DataDigest=None\0InitialR2T=No\0ImmediateData=Yes\0MaxBurstLength=16776192\0FirstBurstLength=262144\0MaxRecvDataSegmentLength=262144\0MaxOutstandingR2T=1\0ErrorRecoveryLevel=0\0X-com.example.Foo=1\0";
    let r = l.handle(&req(1, 3, true), ops, &mut dir);
    let Outcome::FullFeature(res) = r.outcome else {
        panic!("{:?}", r.outcome)
    };
    let k = text::parse(&r.data).unwrap();
    assert_eq!(get(&k, "HeaderDigest"), Some("CRC32C"));
    assert_eq!(get(&k, "InitialR2T"), Some("No"));
    assert_eq!(get(&k, "X-com.example.Foo"), Some("NotUnderstood"));
    assert_eq!(get(&k, "MaxRecvDataSegmentLength"), Some("262144"));
    assert!(r.header.transit && r.header.nsg == Stage::FULL_FEATURE_PHASE);
    assert_eq!(r.header.tsih, 1);
    assert_eq!(r.header.max_cmd_sn, 5 + 127);
    assert!(res.params.header_digest && !res.params.data_digest);
    assert!(!res.params.initial_r2t && res.params.immediate_data);
    assert_eq!(res.params.first_burst_length, 262_144);
    assert_eq!(res.params.initiator_max_recv_data_segment_length, 262_144);
    assert_eq!(res.cmd_sn, 5);
}

#[test]
fn accepts_login_straight_into_operational_stage() {
    let mut dir = Dir::default();
    let mut l = TargetLogin::new(TargetOffer::default(), None);
    let first = b"InitiatorName=iqn.test:ini\0TargetName=iqn.2026-11.org.ipsan:disk0\0";
    let r = l.handle(&req(1, 3, true), first, &mut dir);
    assert!(
        matches!(r.outcome, Outcome::FullFeature(_)),
        "{:?}",
        r.outcome
    );
}

#[test]
fn refuses_a_final_step_with_service_unavailable_built_by_the_login() {
    let mut dir = Dir::default();
    let mut l = TargetLogin::new(TargetOffer::default(), None);
    let first = b"InitiatorName=iqn.test:ini\0TargetName=iqn.2026-11.org.ipsan:disk0\0";
    let r = l.handle(&req(1, 3, true), first, &mut dir);
    assert!(matches!(r.outcome, Outcome::FullFeature(_)));
    let (stat_sn, itt, isid) = (r.header.stat_sn, r.header.itt, r.header.isid);
    let r = l.refuse(
        r,
        LoginFailure::new(LoginStatus::SERVICE_UNAVAILABLE, "remote target down"),
    );
    // RFC 7143 §11.13.5: 0x0301, no transit, no TSIH, no keys; the same StatSN and ITT.
    assert_eq!((r.header.status_class, r.header.status_detail), (3, 1));
    assert!(!r.header.transit && r.header.nsg == Stage(0));
    assert_eq!(r.header.tsih, 0);
    assert!(r.data.is_empty());
    assert_eq!(
        (r.header.stat_sn, r.header.itt, r.header.isid),
        (stat_sn, itt, isid)
    );
    assert!(
        matches!(r.outcome, Outcome::Failed(ref f) if f.status == LoginStatus::SERVICE_UNAVAILABLE)
    );
    // The login is over: a further request fails.
    let again = l.handle(&req(1, 3, true), first, &mut dir);
    assert!(matches!(again.outcome, Outcome::Failed(_)));
}

fn chap_dir(mutual: bool) -> Dir {
    Dir {
        chap: Some(ChapPolicy {
            user: "alice".into(),
            secret: ChapSecret::new(b"sixteen-byte-sec".to_vec()).unwrap(),
            mutual: mutual.then(|| {
                (
                    "target".into(),
                    ChapSecret::new(b"target-secret-16".to_vec()).unwrap(),
                )
            }),
            algorithms: vec![ChapAlgorithm::SHA256, ChapAlgorithm::MD5],
        }),
        relay: false,
        next_tsih: 0,
    }
}

fn chap_login(dir: &mut Dir, secret: &[u8], mutual_challenge: Option<Vec<u8>>) -> Reply {
    let mut l = TargetLogin::new(TargetOffer::default(), None);
    let r = l.handle(&req(0, 1, true), FIRST, dir);
    assert_eq!(get(&keys(&r), "AuthMethod"), Some("CHAP"));
    assert!(!r.header.transit, "cannot transit before CHAP");
    let r = l.handle(&req(0, 1, true), b"CHAP_A=5,7\0", dir);
    let k = keys(&r);
    assert_eq!(
        get(&k, "CHAP_A"),
        Some("5"),
        "initiator's preference order wins"
    );
    let id = chap::parse_identifier(get(&k, "CHAP_I").unwrap()).unwrap();
    let c = chap::decode_binary(get(&k, "CHAP_C").unwrap()).unwrap();
    let resp = chap::response(
        ChapAlgorithm::MD5,
        id,
        &ChapSecret::new(secret.to_vec()).unwrap(),
        &c,
    )
    .unwrap();
    let mut t = format!("CHAP_N=alice\0CHAP_R={}\0", chap::encode_binary(&resp));
    if let Some(mc) = &mutual_challenge {
        t.push_str(&format!("CHAP_I=7\0CHAP_C={}\0", chap::encode_binary(mc)));
    }
    let _ = c;
    l.handle(&req(0, 1, true), t.as_bytes(), dir)
}

#[test]
fn accepts_correct_chap() {
    let mut dir = chap_dir(false);
    let r = chap_login(&mut dir, b"sixteen-byte-sec", None);
    assert!(matches!(r.outcome, Outcome::Continue), "{:?}", r.outcome);
    assert!(r.header.transit);
}

#[test]
fn rejects_wrong_chap_secret() {
    let mut dir = chap_dir(false);
    let r = chap_login(&mut dir, b"wrong-secret-xxx", None);
    let Outcome::Failed(f) = r.outcome else {
        panic!()
    };
    assert_eq!(f.status, LoginStatus::AUTHENTICATION_FAILURE);
    assert_eq!((r.header.status_class, r.header.status_detail), (2, 1));
    assert!(!f.reason.contains("sixteen"), "no secret in the reason");
}

#[test]
fn answers_mutual_chap_and_refuses_reflection() {
    let mut dir = chap_dir(true);
    let r = chap_login(&mut dir, b"sixteen-byte-sec", Some(vec![9u8; 16]));
    let k = keys(&r);
    assert_eq!(get(&k, "CHAP_N"), Some("target"));
    let expect = chap::response(
        ChapAlgorithm::MD5,
        7,
        &ChapSecret::new(b"target-secret-16".to_vec()).unwrap(),
        &[9u8; 16],
    )
    .unwrap();
    assert_eq!(
        get(&k, "CHAP_R"),
        Some(chap::encode_binary(&expect).as_str())
    );

    // Reflection: the initiator sends the target's own challenge back.
    let mut dir = chap_dir(true);
    let mut l = TargetLogin::new(TargetOffer::default(), None);
    l.handle(&req(0, 1, true), FIRST, &mut dir);
    let r = l.handle(&req(0, 1, true), b"CHAP_A=5\0", &mut dir);
    let k = keys(&r);
    let id = chap::parse_identifier(get(&k, "CHAP_I").unwrap()).unwrap();
    let c = chap::decode_binary(get(&k, "CHAP_C").unwrap()).unwrap();
    let resp = chap::response(
        ChapAlgorithm::MD5,
        id,
        &ChapSecret::new(b"sixteen-byte-sec".to_vec()).unwrap(),
        &c,
    )
    .unwrap();
    let t = format!(
        "CHAP_N=alice\0CHAP_R={}\0CHAP_I=1\0CHAP_C={}\0",
        chap::encode_binary(&resp),
        chap::encode_binary(&c)
    );
    let r = l.handle(&req(0, 1, true), t.as_bytes(), &mut dir);
    assert!(matches!(r.outcome, Outcome::Failed(_)));
}

#[test]
fn rejects_skipping_authentication() {
    let mut dir = chap_dir(false);
    let mut l = TargetLogin::new(TargetOffer::default(), None);
    let r = l.handle(&req(1, 3, true), FIRST, &mut dir);
    let Outcome::Failed(f) = r.outcome else {
        panic!("{:?}", r.outcome)
    };
    assert_eq!(f.status, LoginStatus::AUTHENTICATION_FAILURE);
}

#[test]
fn rejects_unknown_target_and_missing_names() {
    let mut dir = Dir::default();
    let r = TargetLogin::new(TargetOffer::default(), None).handle(
        &req(0, 1, true),
        b"InitiatorName=iqn.x\0TargetName=iqn.nope\0",
        &mut dir,
    );
    assert!(matches!(&r.outcome, Outcome::Failed(f) if f.status == LoginStatus::NOT_FOUND));
    let r = TargetLogin::new(TargetOffer::default(), None).handle(
        &req(0, 1, true),
        b"TargetName=iqn.2026-11.org.ipsan:disk0\0",
        &mut dir,
    );
    assert!(matches!(&r.outcome, Outcome::Failed(f) if f.status == LoginStatus::MISSING_PARAMETER));
    let r = TargetLogin::new(TargetOffer::default(), None).handle(
        &req(0, 1, true),
        b"InitiatorName=iqn.x\0",
        &mut dir,
    );
    assert!(matches!(&r.outcome, Outcome::Failed(f) if f.status == LoginStatus::MISSING_PARAMETER));
}

#[test]
fn rejects_bad_version_and_stage_errors() {
    let mut dir = Dir::default();
    let mut r0 = req(0, 1, true);
    r0.version_min = 2;
    let r = TargetLogin::new(TargetOffer::default(), None).handle(&r0, FIRST, &mut dir);
    assert!(
        matches!(&r.outcome, Outcome::Failed(f) if f.status == LoginStatus::UNSUPPORTED_VERSION)
    );
    let r =
        TargetLogin::new(TargetOffer::default(), None).handle(&req(1, 0, true), FIRST, &mut dir);
    assert!(matches!(&r.outcome, Outcome::Failed(f) if f.status == LoginStatus::INITIATOR_ERROR));
}

#[test]
fn discovery_session_answers_irrelevant() {
    let mut dir = Dir::default();
    let mut l = TargetLogin::new(TargetOffer::default(), None);
    let r = l.handle(
        &req(1, 3, true),
        b"InitiatorName=iqn.x\0SessionType=Discovery\0MaxBurstLength=262144\0HeaderDigest=None\0",
        &mut dir,
    );
    let k = keys(&r);
    assert_eq!(get(&k, "MaxBurstLength"), Some("Irrelevant"));
    assert_eq!(get(&k, "HeaderDigest"), Some("None"));
    let Outcome::FullFeature(res) = r.outcome else {
        panic!()
    };
    assert_eq!(res.params.session_type, SessionType::Discovery);
}

#[test]
fn continued_text_is_reassembled() {
    let mut dir = Dir::default();
    let mut l = TargetLogin::new(TargetOffer::default(), None);
    let mut first = req(0, 1, false);
    first.continue_ = true;
    let (a, b) = FIRST.split_at(20);
    let r = l.handle(&first, a, &mut dir);
    assert!(matches!(r.outcome, Outcome::Continue) && r.data.is_empty());
    let r = l.handle(&req(0, 1, true), b, &mut dir);
    assert_eq!(get(&keys(&r), "AuthMethod"), Some("None"));
}

#[test]
fn rejects_out_of_range_values_without_failing() {
    let mut dir = Dir::default();
    let mut l = TargetLogin::new(TargetOffer::default(), None);
    l.handle(&req(0, 1, true), FIRST, &mut dir);
    let r = l.handle(
        &req(1, 3, true),
        b"MaxBurstLength=12\0ErrorRecoveryLevel=2\0",
        &mut dir,
    );
    let k = keys(&r);
    assert_eq!(get(&k, "MaxBurstLength"), Some("Reject"));
    assert_eq!(get(&k, "ErrorRecoveryLevel"), Some("0"));
    let Outcome::FullFeature(res) = r.outcome else {
        panic!()
    };
    assert_eq!(res.params.max_burst_length, 262_144, "default kept");
}

/// Relayed CHAP, the gateway's listening side: the engine asks its driver for the challenge
/// and the verdict; the proof exists only after `Verified`.
fn relay_until_response(dir: &mut Dir, l: &mut TargetLogin, mutual: bool) -> RelayRequest {
    let first = b"InitiatorName=iqn.test:ini\0TargetName=iqn.2026-11.org.ipsan:disk0\0AuthMethod=CHAP,None\0";
    let r = l.handle(&req(0, 1, false), first, dir);
    assert!(matches!(r.outcome, Outcome::Continue));
    assert_eq!(get(&keys(&r), "AuthMethod"), Some("CHAP"));
    let r = l.handle(&req(0, 1, false), b"CHAP_A=7,99,5\0", dir);
    let Outcome::Relay(RelayRequest::Challenge { algorithms }) = r.outcome else {
        panic!("{:?}", r.outcome)
    };
    // Unknown numbers are not passed on.
    assert_eq!(algorithms, [ChapAlgorithm::SHA256, ChapAlgorithm::MD5]);
    let r = l.relay_answer(
        RelayAnswer::Challenge {
            algorithm: ChapAlgorithm::SHA256,
            id: 42,
            challenge: vec![7; 32],
        },
        dir,
    );
    assert!(matches!(r.outcome, Outcome::Continue), "{:?}", r.outcome);
    let k = keys(&r);
    assert_eq!(get(&k, "CHAP_A"), Some("7"));
    assert_eq!(get(&k, "CHAP_I"), Some("42"));
    assert_eq!(
        get(&k, "CHAP_C"),
        Some(chap::encode_binary(&[7; 32]).as_str())
    );
    let mut answer = format!("CHAP_N=host\0CHAP_R={}\0", chap::encode_binary(&[1; 32]));
    if mutual {
        answer.push_str(&format!(
            "CHAP_I=9\0CHAP_C={}\0",
            chap::encode_binary(&[3; 32])
        ));
    }
    let r = l.handle(&req(0, 1, true), answer.as_bytes(), dir);
    let Outcome::Relay(request) = r.outcome else {
        panic!("{:?}", r.outcome)
    };
    request
}

#[test]
fn accepts_relayed_chap_only_with_the_remote_verdict() {
    let mut dir = Dir {
        relay: true,
        ..Dir::default()
    };
    let mut l = TargetLogin::new(TargetOffer::default(), None);
    let request = relay_until_response(&mut dir, &mut l, false);
    assert_eq!(
        request,
        RelayRequest::Response {
            name: "host".into(),
            response: vec![1; 32],
            mutual: None
        }
    );
    let r = l.relay_answer(RelayAnswer::Verified { mutual: None }, &mut dir);
    assert!(matches!(r.outcome, Outcome::Continue), "{:?}", r.outcome);
    assert!(r.header.transit && r.header.nsg == Stage::LOGIN_OPERATIONAL_NEGOTIATION);
    let r = l.handle(&req(1, 3, true), b"HeaderDigest=None\0", &mut dir);
    assert!(
        matches!(r.outcome, Outcome::FullFeature(_)),
        "{:?}",
        r.outcome
    );
}

#[test]
fn rejects_relayed_chap_the_remote_target_refused() {
    let mut dir = Dir {
        relay: true,
        ..Dir::default()
    };
    let mut l = TargetLogin::new(TargetOffer::default(), None);
    relay_until_response(&mut dir, &mut l, false);
    let r = l.relay_answer(
        RelayAnswer::Refused(LoginFailure::new(
            LoginStatus::AUTHENTICATION_FAILURE,
            "remote said no",
        )),
        &mut dir,
    );
    assert!(matches!(r.outcome, Outcome::Failed(_)));
    assert_eq!((r.header.status_class, r.header.status_detail), (2, 1));
}

#[test]
fn rejects_moving_on_while_relayed_chap_is_pending_or_without_mutual_answer() {
    let mut dir = Dir {
        relay: true,
        ..Dir::default()
    };
    // Pending verdict: the initiator's next request (operational stage) is refused.
    let mut l = TargetLogin::new(TargetOffer::default(), None);
    relay_until_response(&mut dir, &mut l, false);
    let r = l.handle(&req(1, 3, true), b"HeaderDigest=None\0", &mut dir);
    assert!(matches!(r.outcome, Outcome::Failed(_)), "{:?}", r.outcome);

    // Mutual CHAP asked: a verdict without the remote's answer fails the login.
    let mut l = TargetLogin::new(TargetOffer::default(), None);
    let RelayRequest::Response { mutual, .. } = relay_until_response(&mut dir, &mut l, true) else {
        panic!()
    };
    assert_eq!(mutual, Some((9, vec![3; 32])));
    let r = l.relay_answer(RelayAnswer::Verified { mutual: None }, &mut dir);
    assert_eq!((r.header.status_class, r.header.status_detail), (2, 1));

    // Skipping CHAP: operational stage straight after AuthMethod=CHAP is refused.
    let mut l = TargetLogin::new(TargetOffer::default(), None);
    let first =
        b"InitiatorName=iqn.test:ini\0TargetName=iqn.2026-11.org.ipsan:disk0\0AuthMethod=CHAP\0";
    l.handle(&req(0, 1, false), first, &mut dir);
    let r = l.handle(&req(1, 3, true), b"HeaderDigest=None\0", &mut dir);
    assert_eq!((r.header.status_class, r.header.status_detail), (2, 1));
}

mod relay_chain {
    //! The whole relay, sans IO: a host's originator (with the secret) → a gateway's target
    //! login under `Auth::Relay` → the gateway's relayed originator (no secret) → an array's
    //! target login with CHAP. The array alone judges the host's secret.
    use super::*;
    use crate::login::originator::{
        ChapCredentials, LoginMachine, LoginNext, LoginOptions, LoginReply, LoginStep,
        OriginatorExtension, SessionKind,
    };

    type Machine = LoginMachine<dyn OriginatorExtension>;
    const TARGET: &str = "iqn.2026-11.org.ipsan:disk0";

    fn request(step: &LoginStep) -> (LoginRequest, Vec<u8>) {
        let mut r = req(step.csg.0, step.nsg.0, step.transit);
        if !step.transit {
            r.nsg = Stage(0);
        }
        (r, iscsi_wire::text::encode(&step.keys).to_vec())
    }

    fn reply(r: &Reply) -> LoginReply {
        LoginReply {
            transit: r.header.transit,
            csg: r.header.csg,
            nsg: r.header.nsg,
            status_class: r.header.status_class,
            status_detail: r.header.status_detail,
            tsih: r.header.tsih,
            keys: text::parse(&r.data).unwrap(),
        }
    }

    /// Runs the chain; returns the host's result (Ok: logged in, with whether the target
    /// proved itself) and how many CHAP verdicts the array gave.
    fn run(host_secret: &[u8], mutual: bool) -> Result<bool, (u8, u8)> {
        let mut array_dir = chap_dir(mutual);
        let mut gw_dir = Dir {
            relay: true,
            ..Dir::default()
        };
        let opts = LoginOptions {
            initiator_name: "iqn.test:ini".into(),
            chap: Some(ChapCredentials {
                name: "alice".into(),
                secret: ChapSecret::new(host_secret.to_vec()).unwrap(),
            }),
            mutual_chap: mutual.then(|| ChapCredentials {
                name: "target".into(),
                secret: ChapSecret::new(b"target-secret-16".to_vec()).unwrap(),
            }),
            ..LoginOptions::default()
        };
        let kind = SessionKind::Normal {
            target_name: TARGET.into(),
        };
        let (mut host, mut step) = Machine::start(opts, kind.clone());
        let mut gw_target = TargetLogin::new(TargetOffer::default(), None);
        let mut array = TargetLogin::new(TargetOffer::default(), None);
        let mut remote: Option<Machine> = None;
        for _ in 0..16 {
            let (rq, data) = request(&step);
            let mut r = gw_target.handle(&rq, &data, &mut gw_dir);
            if let Outcome::Relay(req) = r.outcome {
                let answer = match req {
                    RelayRequest::Challenge { algorithms } => {
                        let (mut m, mut s) = Machine::start_relayed(
                            LoginOptions {
                                initiator_name: "iqn.test:ini".into(),
                                chap_algorithms: algorithms,
                                ..LoginOptions::default()
                            },
                            kind.clone(),
                        );
                        let answer = loop {
                            let (rq, data) = request(&s);
                            let ar = array.handle(&rq, &data, &mut array_dir);
                            match m.handle(reply(&ar)).unwrap() {
                                LoginNext::Send(next) => s = next,
                                LoginNext::RelayChallenge {
                                    algorithm,
                                    id,
                                    challenge,
                                } => {
                                    break RelayAnswer::Challenge {
                                        algorithm,
                                        id,
                                        challenge,
                                    }
                                }
                                LoginNext::Done(_) => panic!("array skipped CHAP"),
                            }
                        };
                        remote = Some(m);
                        answer
                    }
                    RelayRequest::Response {
                        name,
                        response,
                        mutual,
                    } => {
                        let m = remote.as_mut().unwrap();
                        let s = m.relay_response(&name, &response, mutual).unwrap();
                        let (rq, data) = request(&s);
                        let ar = array.handle(&rq, &data, &mut array_dir);
                        match m.handle(reply(&ar)) {
                            Ok(_) => RelayAnswer::Verified {
                                mutual: m.take_relay_verdict().unwrap(),
                            },
                            Err(_) => RelayAnswer::Refused(LoginFailure::new(
                                LoginStatus(
                                    u16::from(ar.header.status_class) << 8
                                        | u16::from(ar.header.status_detail),
                                ),
                                "refused by the array",
                            )),
                        }
                    }
                };
                r = gw_target.relay_answer(answer, &mut gw_dir);
            }
            match host.handle(reply(&r)) {
                Ok(LoginNext::Send(s)) => step = s,
                Ok(LoginNext::Done(e)) => return Ok(e.target_authenticated),
                Ok(LoginNext::RelayChallenge { .. }) => panic!("host is not relaying"),
                Err(_) => return Err((r.header.status_class, r.header.status_detail)),
            }
        }
        panic!("login did not end");
    }

    #[test]
    fn accepts_host_whose_secret_the_array_verifies_through_the_relay() {
        assert_eq!(run(b"sixteen-byte-sec", false), Ok(false));
    }

    #[test]
    fn accepts_mutual_chap_relayed_both_ways() {
        // The host checks the array's answer itself: the gateway holds neither secret.
        assert_eq!(run(b"sixteen-byte-sec", true), Ok(true));
    }

    #[test]
    fn rejects_host_with_a_wrong_secret_as_the_array_does() {
        assert_eq!(run(b"not-the-secret!!", false), Err((2, 1)));
        assert_eq!(run(b"not-the-secret!!", true), Err((2, 1)));
    }
}

/// RFC 7143 §13.2: MaxConnections is the lower of both offers. A host offering 1 (the Linux
/// initiator, libiscsi) gets 1 from a target that allows 4; one offering 8 gets the target's 4.
#[test]
fn accepts_max_connections_as_the_lower_of_both_offers() {
    for (asked, expected) in [("1", "1"), ("8", "4"), ("2", "2")] {
        let mut dir = Dir::default();
        let offer = TargetOffer {
            max_connections: 4,
            ..TargetOffer::default()
        };
        let mut l = TargetLogin::new(offer, None);
        let first = format!("InitiatorName=iqn.test:ini\0TargetName=iqn.2026-11.org.ipsan:disk0\0MaxConnections={asked}\0");
        let r = l.handle(&req(1, 3, true), first.as_bytes(), &mut dir);
        let k = keys(&r);
        assert_eq!(get(&k, "MaxConnections"), Some(expected), "asked {asked}");
        let Outcome::FullFeature(res) = r.outcome else {
            panic!("{:?}", r.outcome)
        };
        assert_eq!(res.params.max_connections.to_string(), expected);
    }
    // The default offer stays 1: a driver that runs one connection per session says so.
    let mut dir = Dir::default();
    let mut l = TargetLogin::new(TargetOffer::default(), None);
    let first =
        b"InitiatorName=iqn.test:ini\0TargetName=iqn.2026-11.org.ipsan:disk0\0MaxConnections=4\0";
    let r = l.handle(&req(1, 3, true), first, &mut dir);
    assert_eq!(get(&keys(&r), "MaxConnections"), Some("1"));
}

/// RFC 7143 §13.20: ErrorRecoveryLevel is the lower of both offers. A host offering 0 (the
/// Linux initiator, libiscsi, ipsan's own) gets 0 from a target that allows 2; one offering 2
/// gets the target's level; the default offer stays 0.
#[test]
fn accepts_error_recovery_level_as_the_lower_of_both_offers() {
    for (allowed, asked, expected) in [
        (2, "0", "0"),
        (2, "1", "1"),
        (2, "2", "2"),
        (1, "2", "1"),
        (0, "2", "0"),
    ] {
        let mut dir = Dir::default();
        let offer = TargetOffer {
            error_recovery_level: allowed,
            ..TargetOffer::default()
        };
        let mut l = TargetLogin::new(offer, None);
        let first = format!("InitiatorName=iqn.test:ini\0TargetName=iqn.2026-11.org.ipsan:disk0\0ErrorRecoveryLevel={asked}\0");
        let r = l.handle(&req(1, 3, true), first.as_bytes(), &mut dir);
        let k = keys(&r);
        assert_eq!(
            get(&k, "ErrorRecoveryLevel"),
            Some(expected),
            "allowed {allowed}, asked {asked}"
        );
        let Outcome::FullFeature(res) = r.outcome else {
            panic!("{:?}", r.outcome)
        };
        assert_eq!(res.params.error_recovery_level.to_string(), expected);
    }
}
