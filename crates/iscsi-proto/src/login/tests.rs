use super::*;
use iscsi_wire::text;

#[derive(Debug, Default)]
struct Dir {
    chap: Option<ChapPolicy>,
    next_tsih: u16,
}

impl Directory for Dir {
    fn target(&self, target_name: &str, _ini: &str) -> Result<TargetPolicy, LoginFailure> {
        if target_name != "iqn.2026-11.org.ipsan:disk0" {
            return Err(LoginFailure::new(LoginStatus::NOT_FOUND, "no such target"));
        }
        Ok(TargetPolicy {
            auth: self.chap.clone().map_or(Auth::None, Auth::Chap),
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
