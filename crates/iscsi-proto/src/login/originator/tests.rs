use super::*;
use crate::chap;

fn reply(csg: Stage, nsg: Stage, transit: bool, keys: &[(&str, &str)]) -> LoginReply {
    LoginReply {
        transit,
        csg,
        nsg,
        status_class: 0,
        status_detail: 0,
        tsih: 7,
        keys: keys
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect(),
    }
}

fn get<'a>(step: &'a LoginStep, key: &str) -> Option<&'a str> {
    step.keys
        .iter()
        .find(|(k, _)| k == key)
        .map(|(_, v)| v.as_str())
}

const SEC: Stage = Stage::SECURITY_NEGOTIATION;
const OP: Stage = Stage::LOGIN_OPERATIONAL_NEGOTIATION;
const FF: Stage = Stage::FULL_FEATURE_PHASE;

#[test]
fn accepts_plain_login_and_takes_target_values() {
    let kind = SessionKind::Normal {
        target_name: "iqn.t".into(),
    };
    let (mut m, first) = <LoginMachine>::start(LoginOptions::default(), kind);
    assert_eq!(get(&first, "AuthMethod"), Some("None"));
    assert!(first.transit);
    let LoginNext::Send(op) = m
        .handle(reply(SEC, OP, true, &[("AuthMethod", "None")]))
        .unwrap()
    else {
        panic!("expected operational step")
    };
    assert_eq!(op.csg, OP);
    assert_eq!(get(&op, "InitialR2T"), Some("No"));
    let LoginNext::Done(n) = m
        .handle(reply(
            OP,
            FF,
            true,
            &[
                ("HeaderDigest", "None"),
                ("DataDigest", "None"),
                ("MaxRecvDataSegmentLength", "65536"),
                ("InitialR2T", "Yes"),
                ("ImmediateData", "Yes"),
                ("MaxBurstLength", "262144"),
                ("FirstBurstLength", "65536"),
                ("MaxOutstandingR2T", "1"),
            ],
        ))
        .unwrap()
    else {
        panic!("expected done")
    };
    assert!(n.params.initial_r2t);
    assert_eq!(n.params.target_max_recv_data_segment_length, 65536);
    assert_eq!(n.params.max_burst_length, 262_144);
    assert_eq!(n.params.max_outstanding_r2t, 1);
    assert_eq!(n.tsih, 7);
}

#[test]
fn rejects_answer_above_our_min_offer() {
    let kind = SessionKind::Normal {
        target_name: "iqn.t".into(),
    };
    let (mut m, _) = <LoginMachine>::start(LoginOptions::rfc_defaults(), kind);
    m.handle(reply(SEC, OP, true, &[])).unwrap();
    let err = m
        .handle(reply(OP, FF, true, &[("MaxBurstLength", "99999999")]))
        .unwrap_err();
    assert!(err.to_string().contains("MaxBurstLength"));
}

#[test]
fn rejects_refused_digest() {
    let opts = LoginOptions {
        digest: DigestChoice::Both,
        ..LoginOptions::default()
    };
    let (mut m, _) = <LoginMachine>::start(opts, SessionKind::Discovery);
    m.handle(reply(SEC, OP, true, &[])).unwrap();
    assert!(m
        .handle(reply(OP, FF, true, &[("HeaderDigest", "None")]))
        .is_err());
}

#[test]
fn rejects_unanswered_digest_instead_of_falling_back() {
    // Regression (fuzz target initiator_login): the target answered `DataDigesf=CRC32C`
    // and went to full feature phase; the session came up without the data digest.
    let opts = LoginOptions {
        digest: DigestChoice::Both,
        ..LoginOptions::default()
    };
    let (mut m, _) = <LoginMachine>::start(opts, SessionKind::Discovery);
    m.handle(reply(SEC, OP, true, &[])).unwrap();
    let err = m
        .handle(reply(
            OP,
            FF,
            true,
            &[("HeaderDigest", "CRC32C"), ("DataDigesf", "CRC32C")],
        ))
        .unwrap_err();
    assert!(err.to_string().contains("DataDigest=CRC32C"), "{err}");
    // Not insisting on a digest: an unanswered offer of None still means None.
    let (mut m, _) = <LoginMachine>::start(LoginOptions::default(), SessionKind::Discovery);
    m.handle(reply(SEC, OP, true, &[])).unwrap();
    assert!(matches!(
        m.handle(reply(OP, FF, true, &[])).unwrap(),
        LoginNext::Done(n) if !n.params.data_digest && !n.params.header_digest
    ));
}

#[test]
fn answers_chap_and_verifies_mutual_response() {
    let secret = ChapSecret::new(b"initiator-secret".to_vec()).unwrap();
    let tsecret = ChapSecret::new(b"target-secret-xx".to_vec()).unwrap();
    let opts = LoginOptions {
        chap: Some(ChapCredentials {
            name: "alice".into(),
            secret: secret.clone(),
        }),
        mutual_chap: Some(ChapCredentials {
            name: "tgt".into(),
            secret: tsecret.clone(),
        }),
        ..LoginOptions::default()
    };
    let (mut m, first) = <LoginMachine>::start(opts, SessionKind::Discovery);
    assert_eq!(get(&first, "AuthMethod"), Some("CHAP"));
    assert!(!first.transit);
    let LoginNext::Send(a) = m
        .handle(reply(SEC, OP, false, &[("AuthMethod", "CHAP")]))
        .unwrap()
    else {
        panic!()
    };
    assert_eq!(get(&a, "CHAP_A"), Some("7,8,6"));
    let tc = [9u8; 16];
    let LoginNext::Send(r) = m
        .handle(reply(
            SEC,
            OP,
            false,
            &[
                ("CHAP_A", "7"),
                ("CHAP_I", "3"),
                ("CHAP_C", &chap::encode_binary(&tc)),
            ],
        ))
        .unwrap()
    else {
        panic!()
    };
    let resp = chap::decode_binary(get(&r, "CHAP_R").unwrap()).unwrap();
    assert!(chap::verify(ChapAlgorithm::SHA256, 3, &secret, &tc, &resp));
    let our_id = chap::parse_identifier(get(&r, "CHAP_I").unwrap()).unwrap();
    let our_c = chap::decode_binary(get(&r, "CHAP_C").unwrap()).unwrap();
    // A wrong mutual answer is refused.
    let (mut m2, _) = <LoginMachine>::start(m.opts.clone(), SessionKind::Discovery);
    m2.chap = ChapState::SentResponse {
        alg: ChapAlgorithm::SHA256,
        our_id: Some(our_id),
        our_challenge: Some(our_c.clone()),
    };
    let wrong = chap::response(ChapAlgorithm::SHA256, our_id, &secret, &our_c).unwrap();
    assert!(m2
        .handle(reply(
            SEC,
            OP,
            true,
            &[("CHAP_N", "tgt"), ("CHAP_R", &chap::encode_binary(&wrong))]
        ))
        .is_err());
    // The right one is accepted and login moves on.
    let right = chap::response(ChapAlgorithm::SHA256, our_id, &tsecret, &our_c).unwrap();
    let next = m
        .handle(reply(
            SEC,
            OP,
            true,
            &[("CHAP_N", "tgt"), ("CHAP_R", &chap::encode_binary(&right))],
        ))
        .unwrap();
    assert!(matches!(next, LoginNext::Send(s) if s.csg == OP));
    assert!(m.target_authenticated);
}

#[test]
fn refuses_operational_stage_without_authentication() {
    // CHAP configured, the target never settles AuthMethod and jumps to operational
    // negotiation: no proof, no operational stage, no session.
    let opts = LoginOptions {
        chap: Some(ChapCredentials {
            name: "alice".into(),
            secret: ChapSecret::new(b"initiator-secret".to_vec()).unwrap(),
        }),
        ..LoginOptions::default()
    };
    let (mut m, _) = <LoginMachine>::start(opts, SessionKind::Discovery);
    let e = m.handle(reply(SEC, OP, true, &[])).unwrap_err();
    assert!(matches!(e, OriginatorError::Auth(_)), "{e}");
    // And the machine takes nothing after that.
    assert!(m.handle(reply(OP, FF, true, &[])).is_err());
}

#[test]
fn rejects_login_status_failure() {
    let (mut m, _) = <LoginMachine>::start(LoginOptions::default(), SessionKind::Discovery);
    let mut r = reply(SEC, OP, false, &[]);
    r.status_class = 2;
    r.status_detail = 1;
    let e = m.handle(r).unwrap_err();
    assert!(e.to_string().contains("authentication failure"));
}

#[derive(Debug, Default)]
struct Echo {
    answered: bool,
    confirmed: bool,
}

impl OriginatorExtension for Echo {
    fn handles(&self, key: &str) -> bool {
        key.starts_with("X-test.")
    }
    fn offer(
        &mut self,
        ctx: &ExtensionContext<'_>,
    ) -> std::result::Result<Vec<(String, String)>, String> {
        assert_eq!(ctx.isid, [0x80, 1, 2, 3, 4, 5]);
        Ok(vec![("X-test.Offer".into(), "1".into())])
    }
    fn on_answer(
        &mut self,
        keys: &[(String, String)],
        _: &ExtensionContext<'_>,
    ) -> std::result::Result<Vec<(String, String)>, String> {
        assert_eq!(keys, &[("X-test.Answer".to_owned(), "2".to_owned())]);
        self.answered = true;
        Ok(vec![("X-test.Confirm".into(), "3".into())])
    }
    fn finish(&mut self, _: &ExtensionContext<'_>) -> std::result::Result<(), String> {
        self.confirmed = true;
        if self.answered {
            Ok(())
        } else {
            Err("extension never answered".into())
        }
    }
}

#[test]
fn extension_keys_are_offered_answered_and_confirmed() {
    let kind = SessionKind::Normal {
        target_name: "iqn.t".into(),
    };
    let (mut m, _) = <LoginMachine>::start(LoginOptions::default(), kind.clone());
    m.set_extension(Box::<Echo>::default(), [0x80, 1, 2, 3, 4, 5]);
    let LoginNext::Send(op) = m.handle(reply(SEC, OP, true, &[])).unwrap() else {
        panic!()
    };
    assert_eq!(get(&op, "X-test.Offer"), Some("1"));
    // The target answers with T=0 and its extension keys (never NotUnderstood'ed by us).
    let LoginNext::Send(next) = m
        .handle(reply(OP, FF, false, &[("X-test.Answer", "2")]))
        .unwrap()
    else {
        panic!()
    };
    assert_eq!(
        next.keys,
        vec![("X-test.Confirm".to_owned(), "3".to_owned())]
    );
    assert!(matches!(
        m.handle(reply(OP, FF, true, &[])).unwrap(),
        LoginNext::Done(_)
    ));

    // An extension that is not satisfied fails the login.
    let (mut m, _) = <LoginMachine>::start(LoginOptions::default(), kind);
    m.set_extension(Box::<Echo>::default(), [0x80, 1, 2, 3, 4, 5]);
    m.handle(reply(SEC, OP, true, &[])).unwrap();
    let e = m.handle(reply(OP, FF, true, &[])).unwrap_err();
    assert!(e.to_string().contains("never answered"), "{e}");
}
