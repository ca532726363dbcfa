#![allow(clippy::unwrap_used, clippy::expect_used)]
//! Login-time negotiation: policy, key confirmation, downgrade protection, redaction.

mod support;
use support::keys::{ids, pair, psk, SECRET};

use ipsan_seal::negotiate::{KEY_CHUNK, KEY_CONFIRM, KEY_NONCE, KEY_SEAL, KEY_SHARE};
use ipsan_seal::{
    AnswerOutcome, Binding, Cipher, Direction, LoginTranscript, NegotiationError, SealAnswer,
    SealOffer, SealPolicy, TargetSealConfig,
};

fn cfg(policy: SealPolicy) -> TargetSealConfig {
    TargetSealConfig {
        policy,
        ..TargetSealConfig::default()
    }
}

fn offer(ciphers: Vec<Cipher>) -> SealOffer {
    SealOffer::new(ciphers, 65536, psk(SECRET), ids()).unwrap()
}

#[test]
fn accepts_the_first_offered_cipher_the_target_supports() {
    let o = offer(vec![Cipher::ChaCha20Poly1305, Cipher::Aes256Gcm]);
    let config = TargetSealConfig {
        accept: vec![Cipher::Aes256Gcm, Cipher::ChaCha20Poly1305],
        ..cfg(SealPolicy::Allowed)
    };
    let AnswerOutcome::Pending(p) =
        SealAnswer::handle_offer(&config, &o.keys(), &ids(), |_| Some(psk(SECRET))).unwrap()
    else {
        panic!()
    };
    assert_eq!(p.framing().cipher, Cipher::ChaCha20Poly1305);
    let (i, confirm) = o.handle_answer(p.keys()).unwrap();
    let t = p.handle_confirm(&confirm).unwrap();
    assert_eq!(i.cipher(), Cipher::ChaCha20Poly1305);
    assert_eq!(t.cipher(), Cipher::ChaCha20Poly1305);
}

#[test]
fn target_answers_minimum_chunk_size() {
    let o = SealOffer::new(vec![Cipher::Aes256Gcm], 1 << 20, psk(SECRET), ids()).unwrap();
    let config = TargetSealConfig {
        max_chunk: 65536,
        ..cfg(SealPolicy::Allowed)
    };
    let AnswerOutcome::Pending(p) =
        SealAnswer::handle_offer(&config, &o.keys(), &ids(), |_| Some(psk(SECRET))).unwrap()
    else {
        panic!()
    };
    let (i, _) = o.handle_answer(p.keys()).unwrap();
    assert_eq!(i.chunk_size(), 65536);
}

#[test]
fn plain_initiator_gets_plain_session_when_allowed() {
    let out = SealAnswer::handle_offer(&cfg(SealPolicy::Allowed), &[], &ids(), |_| None).unwrap();
    assert!(matches!(out, AnswerOutcome::Plain { keys, reason: None } if keys.is_empty()));
}

#[test]
fn rejects_plain_initiator_with_authorization_failure_when_required() {
    let e =
        SealAnswer::handle_offer(&cfg(SealPolicy::Required), &[], &ids(), |_| None).unwrap_err();
    assert!(matches!(e, NegotiationError::RequiredNotOffered { .. }));
    assert_eq!(e.login_status(), (0x02, 0x02));
    let msg = e.to_string();
    assert!(msg.contains("seal=required"), "{msg}");
    assert!(msg.contains(&ids().initiator_name), "{msg}");
}

#[test]
fn rejects_none_cipher_when_required() {
    let o = offer(vec![Cipher::None]);
    let e = SealAnswer::handle_offer(&cfg(SealPolicy::Required), &o.keys(), &ids(), |_| {
        Some(psk(SECRET))
    })
    .unwrap_err();
    assert!(matches!(e, NegotiationError::NoCommonCipher { .. }));
    assert_eq!(e.login_status(), (0x02, 0x02));
}

#[test]
fn policy_off_answers_reject_and_initiator_sees_not_agreed() {
    let o = offer(vec![Cipher::Aes256Gcm]);
    let out = SealAnswer::handle_offer(&cfg(SealPolicy::Off), &o.keys(), &ids(), |_| {
        Some(psk(SECRET))
    })
    .unwrap();
    let AnswerOutcome::Plain { keys, .. } = out else {
        panic!()
    };
    assert_eq!(keys, vec![(KEY_SEAL.to_owned(), "Reject".to_owned())]);
    assert_eq!(
        o.handle_answer(&keys).unwrap_err(),
        NegotiationError::NotAgreed("Reject".into())
    );
}

#[test]
fn rejects_wrong_secret_at_login_on_both_sides() {
    // Initiator holds the wrong secret: the target's confirmation fails at the initiator...
    let o = SealOffer::new(
        vec![Cipher::Aes256Gcm],
        65536,
        psk("not the shared secret at all!!!!"),
        ids(),
    )
    .unwrap();
    let AnswerOutcome::Pending(p) =
        SealAnswer::handle_offer(&cfg(SealPolicy::Required), &o.keys(), &ids(), |_| {
            Some(psk(SECRET))
        })
        .unwrap()
    else {
        panic!()
    };
    let target_keys = p.keys().to_vec();
    assert_eq!(
        o.handle_answer(&target_keys).unwrap_err(),
        NegotiationError::ConfirmationFailed
    );
    // ...and a forged initiator confirmation fails at the target with Authorization failure.
    let forged = vec![(KEY_CONFIRM.to_owned(), format!("0x{}", "00".repeat(32)))];
    let e = p.handle_confirm(&forged).unwrap_err();
    assert_eq!(e, NegotiationError::ConfirmationFailed);
    assert_eq!(e.login_status(), (0x02, 0x02));
}

#[test]
fn rejects_a_stripped_offer_downgrade() {
    // An attacker removes aes-256-gcm from the offer so the target picks the legacy cipher.
    let o = offer(vec![Cipher::Aes256Gcm, Cipher::TripleDesCbcHmacSha1]);
    let mut keys = o.keys();
    for (k, v) in &mut keys {
        if k == KEY_SEAL {
            *v = "3des-cbc-hmac-sha1".into();
        }
    }
    let AnswerOutcome::Pending(p) =
        SealAnswer::handle_offer(&cfg(SealPolicy::Allowed), &keys, &ids(), |_| {
            Some(psk(SECRET))
        })
        .unwrap()
    else {
        panic!()
    };
    assert_eq!(
        o.handle_answer(p.keys()).unwrap_err(),
        NegotiationError::ConfirmationFailed
    );
}

#[test]
fn rejects_malformed_nonce_and_chunk() {
    let o = offer(vec![Cipher::Aes256Gcm]);
    for (key, bad) in [
        (KEY_NONCE, "0x1234"),
        (KEY_NONCE, "not-hex"),
        (KEY_CHUNK, "100"),
        (KEY_CHUNK, "lots"),
    ] {
        let mut keys = o.keys();
        for (k, v) in &mut keys {
            if k == key {
                *v = bad.into();
            }
        }
        let e = SealAnswer::handle_offer(&cfg(SealPolicy::Allowed), &keys, &ids(), |_| {
            Some(psk(SECRET))
        })
        .unwrap_err();
        assert!(
            matches!(e, NegotiationError::Malformed { .. }),
            "{key}={bad}: {e}"
        );
    }
}

/// Schedule v4: a missing CPace share (a v3 initiator) is a missing parameter (0x0207); a share
/// that is not a ristretto255 encoding, or is the identity (which would make the shared
/// point known to anyone, draft-irtf-cfrg-cpace §6.2 "MUST abort"), is refused on both sides.
#[test]
fn rejects_missing_invalid_and_identity_cpace_shares() {
    let o = offer(vec![Cipher::Aes256Gcm]);
    let without: Vec<_> = o
        .keys()
        .into_iter()
        .filter(|(k, _)| k != KEY_SHARE)
        .collect();
    let e = SealAnswer::handle_offer(&cfg(SealPolicy::Allowed), &without, &ids(), |_| {
        Some(psk(SECRET))
    })
    .unwrap_err();
    assert_eq!(e, NegotiationError::MissingKey(KEY_SHARE));
    assert_eq!(e.login_status(), (0x02, 0x07));
    let identity = format!("0x{}", "00".repeat(32));
    let not_a_point = format!("0x{}", "ff".repeat(32));
    for bad in [identity.as_str(), not_a_point.as_str(), "0x0102", "zz"] {
        let mut keys = o.keys();
        for (k, v) in &mut keys {
            if k == KEY_SHARE {
                *v = bad.into();
            }
        }
        let e = SealAnswer::handle_offer(&cfg(SealPolicy::Allowed), &keys, &ids(), |_| {
            Some(psk(SECRET))
        })
        .unwrap_err();
        assert!(
            matches!(e, NegotiationError::Malformed { key, .. } if key == KEY_SHARE),
            "{bad}: {e}"
        );
    }
    // The initiator refuses an identity share in the answer.
    let AnswerOutcome::Pending(p) =
        SealAnswer::handle_offer(&cfg(SealPolicy::Allowed), &o.keys(), &ids(), |_| {
            Some(psk(SECRET))
        })
        .unwrap()
    else {
        panic!()
    };
    let mut answer = p.keys().to_vec();
    for (k, v) in &mut answer {
        if k == KEY_SHARE {
            *v = identity.clone();
        }
    }
    assert!(matches!(
        o.handle_answer(&answer).unwrap_err(),
        NegotiationError::Malformed { key, .. } if key == KEY_SHARE
    ));
}

#[test]
fn different_logins_derive_different_keys() {
    // Fresh nonces per login: the same plaintext seals differently in two sessions.
    let (a, _) = pair(Cipher::Aes256Gcm, 65536);
    let (b, _) = pair(Cipher::Aes256Gcm, 65536);
    let bind = Binding::default();
    let sa = a.seal(&bind, vec![7u8; 4096].as_slice().into()).unwrap();
    let sb = b.seal(&bind, vec![7u8; 4096].as_slice().into()).unwrap();
    assert_ne!(sa[..4096], sb[..4096]);
}

#[test]
fn debug_output_never_contains_secrets_or_keys() {
    let o = offer(vec![Cipher::Aes256Gcm]);
    let d = format!("{o:?}");
    assert!(!d.contains(SECRET), "{d}");
    assert!(d.contains("redacted"), "{d}");
    let AnswerOutcome::Pending(p) =
        SealAnswer::handle_offer(&cfg(SealPolicy::Allowed), &o.keys(), &ids(), |_| {
            Some(psk(SECRET))
        })
        .unwrap()
    else {
        panic!()
    };
    let pd = format!("{p:?}");
    assert!(!pd.contains("0x"), "{pd}");
    let (s, _) = o.handle_answer(p.keys()).unwrap();
    let sd = format!("{s:?}");
    assert!(
        sd.contains("<redacted>") && sd.contains("Aes256Gcm"),
        "{sd}"
    );
}

/// Both ends' login transcripts, fed as a runtime feeds them: each side adds every Login PDU it
/// sends or receives. `edit` changes what the receiving side sees (a relay on the path).
struct Wire {
    initiator: LoginTranscript,
    target: LoginTranscript,
}

fn text(keys: &[(String, String)]) -> Vec<u8> {
    keys.iter()
        .flat_map(|(k, v)| format!("{k}={v}\0").into_bytes())
        .collect()
}

impl Wire {
    fn new() -> Self {
        Self {
            initiator: LoginTranscript::new(),
            target: LoginTranscript::new(),
        }
    }
    fn request(&mut self, keys: &[(String, String)], edit: Option<(&str, &str)>) {
        let bhs = [0x43u8; 48];
        self.initiator
            .add(Direction::InitiatorToTarget, &bhs, &[], &text(keys));
        let seen = edited(keys, edit);
        self.target
            .add(Direction::InitiatorToTarget, &bhs, &[], &text(&seen));
    }
    fn response(&mut self, keys: &[(String, String)], edit: Option<(&str, &str)>) {
        let bhs = [0x23u8; 48];
        self.target
            .add(Direction::TargetToInitiator, &bhs, &[], &text(keys));
        let seen = edited(keys, edit);
        self.initiator
            .add(Direction::TargetToInitiator, &bhs, &[], &text(&seen));
    }
}

fn edited(keys: &[(String, String)], edit: Option<(&str, &str)>) -> Vec<(String, String)> {
    keys.iter()
        .map(|(k, v)| match edit {
            Some((ek, ev)) if ek == k => (k.clone(), ev.to_owned()),
            _ => (k.clone(), v.clone()),
        })
        .collect()
}

fn kv(k: &str, v: &str) -> (String, String) {
    (k.to_owned(), v.to_owned())
}

mod transcript_binding {
    use super::*;
    use ipsan_seal::{InitiatorNegotiation, TargetNegotiation};

    /// One login: security stage, the offer with operational keys, the answer, the
    /// confirmation, the final response. `edits[n]` alters the n-th PDU on the path.
    fn login(edits: [Option<(&str, &str)>; 6]) -> Result<(), String> {
        let mut i = InitiatorNegotiation::new(vec![Cipher::Aes256Gcm], 65536, psk(SECRET));
        let mut t =
            TargetNegotiation::new(cfg(SealPolicy::Required), Box::new(|_| Some(psk(SECRET))));
        let mut w = Wire::new();
        w.request(
            &[kv("InitiatorName", "iqn.i"), kv("AuthMethod", "None")],
            edits[0],
        );
        w.response(&[kv("AuthMethod", "None")], edits[1]);
        let mut req = vec![
            kv("MaxRecvDataSegmentLength", "262144"),
            kv("ImmediateData", "Yes"),
        ];
        let offer = i.offer(&ids()).unwrap();
        req.extend(offer.clone());
        w.request(&req, edits[2]);
        let mut resp = vec![kv("ImmediateData", "Yes"), kv("HeaderDigest", "None")];
        resp.extend(
            t.respond(&offer, &ids(), &w.target)
                .map_err(|e| e.to_string())?,
        );
        w.response(&resp, edits[3]);
        let answer: Vec<_> = resp
            .into_iter()
            .filter(|(k, _)| k.starts_with("X-"))
            .collect();
        let confirm = i
            .on_answer(&answer, &w.initiator)
            .map_err(|e| format!("initiator: {e}"))?;
        w.request(&confirm, edits[4]);
        t.respond(&confirm, &ids(), &w.target)
            .map_err(|e| format!("target: {e}"))?;
        w.response(&[kv("MaxRecvDataSegmentLength", "262144")], edits[5]);
        let (is, ts) = (i.take_session().unwrap(), t.take_session().unwrap());
        // The record keys bind the whole transcript, the final response included.
        let (mut seal, _) = is.record_layer(&w.initiator.hash()).unwrap();
        let (_, mut open) = ts.record_layer(&w.target.hash()).unwrap();
        let mut pdu = iscsi_wire::Pdu::new(
            iscsi_wire::header::NopOut {
                immediate: true,
                lun: 0,
                itt: 1,
                ttt: 0xffff_ffff,
                cmd_sn: 1,
                exp_stat_sn: 1,
            },
            bytes::Bytes::new(),
        );
        seal.protect(&mut pdu).unwrap();
        let mut buf = bytes::BytesMut::new();
        let codec = iscsi_wire::Codec::default();
        codec.encode(&pdu, &mut buf).unwrap();
        let mut rx = codec.decode(&mut buf).unwrap().unwrap();
        open.verify(&mut rx).map_err(|e| e.to_string())
    }

    #[test]
    fn accepts_an_unaltered_login() {
        login([None; 6]).unwrap();
    }

    #[test]
    fn rejects_a_login_whose_security_stage_was_edited() {
        let e = login([
            Some(("AuthMethod", "CHAP,None")),
            None,
            None,
            None,
            None,
            None,
        ])
        .unwrap_err();
        assert!(
            e.contains("initiator: seal: key confirmation failed"),
            "{e}"
        );
        // Everything before the target's answer is covered by the target's confirmation.
        let e = login([None, Some(("AuthMethod", "Reject")), None, None, None, None]).unwrap_err();
        assert!(
            e.contains("initiator: seal: key confirmation failed"),
            "{e}"
        );
    }

    #[test]
    fn rejects_a_login_whose_operational_keys_were_edited_in_either_direction() {
        let e = login([
            None,
            None,
            Some(("MaxRecvDataSegmentLength", "512")),
            None,
            None,
            None,
        ])
        .unwrap_err();
        assert!(
            e.contains("initiator: seal: key confirmation failed"),
            "{e}"
        );
        let e = login([None, None, None, Some(("ImmediateData", "No")), None, None]).unwrap_err();
        assert!(e.contains("target: seal: key confirmation failed"), "{e}");
        let e = login([
            None,
            None,
            None,
            Some(("HeaderDigest", "CRC32C")),
            None,
            None,
        ])
        .unwrap_err();
        assert!(e.contains("target: seal: key confirmation failed"), "{e}");
    }

    #[test]
    fn rejects_the_first_pdu_after_a_login_whose_final_response_was_edited() {
        // No confirmation comes after the final Login Response: the record keys bind it, so
        // the first full-feature PDU fails and nothing of the session acts.
        let e = login([
            None,
            None,
            None,
            None,
            None,
            Some(("MaxRecvDataSegmentLength", "512")),
        ])
        .unwrap_err();
        assert!(e.contains("failed authentication"), "{e}");
    }
}

mod target_negotiation {
    use super::*;
    use ipsan_seal::{is_seal_key, TargetNegotiation};

    fn neg(policy: SealPolicy) -> TargetNegotiation {
        TargetNegotiation::new(cfg(policy), Box::new(|_| Some(psk(SECRET))))
    }

    #[test]
    fn accepts_offer_then_confirm_across_two_requests() {
        let mut t = neg(SealPolicy::Required);
        let o = offer(vec![Cipher::Aes256Gcm]);
        assert!(o.keys().iter().all(|(k, _)| is_seal_key(k)));
        let mut w = Wire::new();
        w.request(&o.keys(), None);
        let answer = t.respond(&o.keys(), &ids(), &w.target).unwrap();
        w.response(&answer, None);
        let (init, confirm) = o
            .handle_answer_bound(
                &answer,
                &w.initiator.hash_before_last(),
                &w.initiator.hash(),
            )
            .unwrap();
        w.request(&confirm, None);
        assert!(t.respond(&confirm, &ids(), &w.target).unwrap().is_empty());
        t.finish(&ids()).unwrap();
        let target = t.take_session().unwrap();
        let b = Binding::default();
        let sealed = init.seal(&b, vec![1u8; 700].as_slice().into()).unwrap();
        assert_eq!(
            &target.open(&b, sealed.as_ref().into()).unwrap()[..],
            &[1u8; 700][..]
        );
    }

    #[test]
    fn rejects_transit_before_confirmation() {
        let mut t = neg(SealPolicy::Allowed);
        let o = offer(vec![Cipher::Aes256Gcm]);
        t.respond(&o.keys(), &ids(), &LoginTranscript::new())
            .unwrap();
        let e = t.finish(&ids()).unwrap_err();
        assert_eq!(e, NegotiationError::MissingKey(KEY_CONFIRM));
        assert!(t.take_session().is_none());
    }

    #[test]
    fn rejects_login_without_offer_when_required_at_finish() {
        let mut t = neg(SealPolicy::Required);
        let e = t.finish(&ids()).unwrap_err();
        assert_eq!(e.login_status(), (0x02, 0x02));
        let mut t = neg(SealPolicy::Allowed);
        t.finish(&ids()).unwrap();
        assert!(t.take_session().is_none());
    }

    #[test]
    fn rejects_wrong_initiator_confirmation() {
        let mut t = neg(SealPolicy::Required);
        let o = offer(vec![Cipher::Aes256Gcm]);
        let w = LoginTranscript::new();
        t.respond(&o.keys(), &ids(), &w).unwrap();
        let forged = vec![(KEY_CONFIRM.to_owned(), format!("0x{}", "ab".repeat(32)))];
        assert_eq!(
            t.respond(&forged, &ids(), &w).unwrap_err(),
            NegotiationError::ConfirmationFailed
        );
        assert!(t.finish(&ids()).is_err());
    }
}

proptest::proptest! {
    #[test]
    fn arbitrary_login_values_never_panic(
        seal in "\\PC{0,40}",
        chunk in "\\PC{0,12}",
        nonce in "(0x)?[0-9a-fA-F]{0,70}",
        confirm in "(0x)?[0-9a-f]{0,70}",
    ) {
        let keys = vec![
            (KEY_SEAL.to_owned(), seal),
            (KEY_CHUNK.to_owned(), chunk),
            (KEY_NONCE.to_owned(), nonce),
            (KEY_CONFIRM.to_owned(), confirm),
        ];
        let _ = SealAnswer::handle_offer(&cfg(SealPolicy::Required), &keys, &ids(), |_| {
            Some(psk(SECRET))
        });
        let _ = offer(vec![Cipher::Aes256Gcm]).handle_answer(&keys);
    }
}

mod initiator_negotiation {
    use super::*;
    use ipsan_seal::{InitiatorNegotiation, TargetNegotiation};

    #[test]
    fn accepts_a_full_login_between_both_state_machines() {
        let mut i = InitiatorNegotiation::new(vec![Cipher::Aes256Gcm], 65536, psk(SECRET));
        let mut t =
            TargetNegotiation::new(cfg(SealPolicy::Required), Box::new(|_| Some(psk(SECRET))));
        let mut w = Wire::new();
        let offer = i.offer(&ids()).unwrap();
        w.request(&offer, None);
        let answer = t.respond(&offer, &ids(), &w.target).unwrap();
        w.response(&answer, None);
        let confirm = i.on_answer(&answer, &w.initiator).unwrap();
        w.request(&confirm, None);
        t.respond(&confirm, &ids(), &w.target).unwrap();
        i.finish().unwrap();
        t.finish(&ids()).unwrap();
        let (is, ts) = (i.take_session().unwrap(), t.take_session().unwrap());
        let b = Binding::default();
        let sealed = is.seal(&b, vec![2u8; 9000].as_slice().into()).unwrap();
        assert_eq!(
            &ts.open(&b, sealed.as_ref().into()).unwrap()[..],
            &[2u8; 9000][..]
        );
        let sealed = ts.seal(&b, vec![3u8; 10].as_slice().into()).unwrap();
        assert_eq!(
            &is.open(&b, sealed.as_ref().into()).unwrap()[..],
            &[3u8; 10][..]
        );
    }

    #[test]
    fn rejects_full_feature_when_the_target_ignored_the_offer() {
        let mut i = InitiatorNegotiation::new(vec![Cipher::Aes256Gcm], 65536, psk(SECRET));
        i.offer(&ids()).unwrap();
        assert!(matches!(i.finish(), Err(NegotiationError::NotAgreed(_))));
        assert!(i.take_session().is_none());
    }

    #[test]
    fn rejects_a_reject_answer() {
        let mut i = InitiatorNegotiation::new(vec![Cipher::Aes256Gcm], 65536, psk(SECRET));
        i.offer(&ids()).unwrap();
        let e = i
            .on_answer(
                &[(KEY_SEAL.to_owned(), "Reject".to_owned())],
                &LoginTranscript::new(),
            )
            .unwrap_err();
        assert_eq!(e, NegotiationError::NotAgreed("Reject".into()));
        assert!(i.finish().is_err());
    }
}
