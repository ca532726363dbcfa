//! The originator's login exchange against the real target login machine
//! ([`crate::login::TargetLogin`]), with a relay on the path that splits the target's
//! responses into continued PDUs or replaces them with what a hostile target would send.

use bytes::Bytes;
use iscsi_wire::header::{LoginResponse, NopIn};
use iscsi_wire::{Header, Pdu};

use super::*;
use crate::login::originator::{LoginOptions, SessionKind};
use crate::login::{
    Auth, Directory, LoginFailure, LoginStatus, Outcome, TargetLogin, TargetOffer, TargetPolicy,
};

const TARGET: &str = "iqn.2026-11.org.ipsan:disk0";
const ISID: [u8; 6] = [0x80, 1, 2, 3, 4, 5];

#[derive(Debug, Default)]
struct Dir;

impl Directory for Dir {
    fn target(&self, name: &str, _: &str) -> Result<TargetPolicy, LoginFailure> {
        if name != TARGET {
            return Err(LoginFailure::new(LoginStatus::NOT_FOUND, "no such target"));
        }
        Ok(TargetPolicy {
            auth: Auth::None,
            portal_group_tag: 1,
            alias: None,
        })
    }
    fn discovery(&self, _: &str) -> Result<TargetPolicy, LoginFailure> {
        self.target(TARGET, "")
    }
    fn assign_tsih(&mut self, _: [u8; 6], _: &str, _: u16) -> Result<u16, LoginFailure> {
        Ok(9)
    }
}

fn exchange(target: &str) -> LoginExchange {
    let kind = SessionKind::Normal {
        target_name: target.into(),
    };
    let (m, first) = <LoginMachine>::start(LoginOptions::default(), kind);
    LoginExchange::new(m, first, ISID)
}

fn login_request(p: &Pdu) -> &LoginRequest {
    let Header::LoginRequest(r) = &p.header else {
        panic!("not a Login Request: {p:?}")
    };
    r
}

/// The target's reply to `req`, split by the relay into `pieces` PDUs: all but the last with
/// C=1 and T=0 (RFC 7143 §11.13.3), each with its own StatSN.
fn split(h: &LoginResponse, data: &[u8], pieces: usize) -> Vec<Pdu> {
    let n = data.len().div_ceil(pieces).max(1);
    let chunks: Vec<&[u8]> = data.chunks(n).collect();
    let last = chunks.len().saturating_sub(1);
    if chunks.is_empty() {
        return vec![Pdu::new(h.clone(), Bytes::new())];
    }
    chunks
        .iter()
        .enumerate()
        .map(|(i, c)| {
            let mut h = h.clone();
            if i != last {
                h.continue_ = true;
                h.transit = false;
            }
            h.stat_sn = h.stat_sn.wrapping_add(100 + i as u32);
            Pdu::new(h, Bytes::copy_from_slice(c))
        })
        .collect()
}

#[test]
fn accepts_a_login_whose_responses_are_continued_over_several_pdus() {
    let mut ini = exchange(TARGET);
    let mut tgt = TargetLogin::new(TargetOffer::default(), None);
    let mut dir = Dir;
    let mut continuations = 0;
    let done = 'login: loop {
        let req = ini.poll_transmit().expect("a request to send");
        let h = login_request(&req).clone();
        assert!(!h.continue_);
        assert_eq!((h.isid, h.tsih, h.itt, h.cmd_sn), (ISID, 0, 0, 1));
        let reply = tgt.handle(&h, &req.data, &mut dir);
        assert!(
            !matches!(reply.outcome, Outcome::Failed(_)),
            "{:?}",
            reply.outcome
        );
        let pdus = split(&reply.header, &reply.data, 3);
        let n = pdus.len();
        for (i, p) in pdus.into_iter().enumerate() {
            let stat_sn = match &p.header {
                Header::LoginResponse(r) => r.stat_sn,
                _ => unreachable!(),
            };
            match ini.handle_pdu(&p).unwrap() {
                LoginProgress::Send if i + 1 < n => {
                    // The empty request for the rest: same stage, T=0, StatSN acknowledged.
                    let more = ini.poll_transmit().expect("a continuation request");
                    let m = login_request(&more);
                    assert!(more.data.is_empty());
                    assert!(!m.transit && !m.continue_);
                    assert_eq!(m.csg, h.csg);
                    assert_eq!(m.exp_stat_sn, stat_sn.wrapping_add(1));
                    continuations += 1;
                }
                LoginProgress::Send => {
                    assert_eq!(i + 1, n);
                }
                LoginProgress::Done(d) => {
                    assert_eq!(i + 1, n);
                    assert_eq!(d.exp_stat_sn, stat_sn.wrapping_add(1));
                    break 'login d;
                }
                LoginProgress::RelayChallenge { .. } => panic!("no relay here"),
            }
        }
    };
    assert!(continuations >= 2, "{continuations}");
    assert_eq!(done.established.tsih, 9);
    // Both sides negotiated the same values: the split lost no key.
    assert_eq!(done.established.params.target_name.as_deref(), Some(TARGET));
    assert_eq!(
        done.established
            .params
            .initiator_max_recv_data_segment_length,
        LoginOptions::default().max_recv_data_segment_length
    );
    assert_eq!(
        done.established.params.target_max_recv_data_segment_length,
        TargetOffer::default().max_recv_data_segment_length
    );
    assert_eq!(done.exp_cmd_sn, 1);
    assert_eq!(
        done.max_cmd_sn,
        done.exp_cmd_sn + TargetOffer::default().cmd_window - 1
    );
    assert!(ini.poll_transmit().is_none());
}

/// The first response as the target would send it, changed by `f`.
fn first_response(f: impl FnOnce(&mut LoginResponse, &mut Bytes)) -> (LoginExchange, Pdu) {
    let mut ini = exchange(TARGET);
    let mut tgt = TargetLogin::new(TargetOffer::default(), None);
    let req = ini.poll_transmit().unwrap();
    let reply = tgt.handle(login_request(&req), &req.data, &mut Dir);
    let mut h = reply.header;
    let mut data = Bytes::from(reply.data);
    f(&mut h, &mut data);
    (ini, Pdu::new(h, data))
}

#[test]
fn rejects_a_pdu_that_is_not_a_login_response() {
    let mut ini = exchange(TARGET);
    ini.poll_transmit().unwrap();
    let e = ini
        .handle_pdu(&Pdu::new(NopIn::default(), Bytes::new()))
        .unwrap_err();
    assert!(matches!(e, OriginatorError::UnexpectedPdu { .. }), "{e:?}");
    assert!(e.to_string().contains("expected a Login Response"), "{e}");
}

#[test]
fn rejects_endless_continuation_past_64_kib() {
    let (mut ini, piece) = first_response(|h, d| {
        h.continue_ = true;
        h.transit = false;
        *d = Bytes::from(vec![b'a'; 8192]);
    });
    let mut sent = 0;
    let e = loop {
        match ini.handle_pdu(&piece) {
            Ok(LoginProgress::Send) => {
                assert!(ini.poll_transmit().is_some());
                sent += 1;
                assert!(sent <= LOGIN_TEXT_LIMIT / 8192, "not cut: {sent}");
            }
            Ok(other) => panic!("{other:?}"),
            Err(e) => break e,
        }
    };
    assert!(matches!(e, OriginatorError::TextTooLong { .. }), "{e:?}");
    assert!(e.to_string().contains("64 KiB"), "{e}");
}

#[test]
fn rejects_a_response_whose_text_does_not_parse() {
    let (mut ini, pdu) = first_response(|_, d| *d = Bytes::from_static(b"AuthMethod\0"));
    let e = ini.handle_pdu(&pdu).unwrap_err();
    assert!(matches!(e, OriginatorError::Text(_)), "{e:?}");
}

#[test]
fn rejects_a_response_for_another_stage() {
    let (mut ini, pdu) =
        first_response(|h, _| h.csg = iscsi_wire::header::Stage::LOGIN_OPERATIONAL_NEGOTIATION);
    let e = ini.handle_pdu(&pdu).unwrap_err();
    assert!(matches!(e, OriginatorError::WrongStage { .. }), "{e:?}");
}

#[test]
fn refusal_keeps_the_targets_status() {
    let mut ini = exchange("iqn.2026-11.org.ipsan:nothere");
    let mut tgt = TargetLogin::new(TargetOffer::default(), None);
    let req = ini.poll_transmit().unwrap();
    let reply = tgt.handle(login_request(&req), &req.data, &mut Dir);
    assert!(matches!(reply.outcome, Outcome::Failed(_)));
    let e = ini
        .handle_pdu(&Pdu::new(reply.header, Bytes::from(reply.data)))
        .unwrap_err();
    assert!(
        matches!(
            e,
            OriginatorError::Refused {
                class: 2,
                detail: 3
            }
        ),
        "{e:?}"
    );
    // Nothing more goes out, and a late response is refused.
    assert!(ini.poll_transmit().is_none());
}

#[derive(Debug, Default)]
struct Counting {
    sent: usize,
    received: usize,
}

impl OriginatorExtension for Counting {
    fn handles(&self, _: &str) -> bool {
        false
    }
    fn offer(
        &mut self,
        _: &crate::login::ExtensionContext<'_>,
    ) -> std::result::Result<Vec<(String, String)>, String> {
        Ok(Vec::new())
    }
    fn on_answer(
        &mut self,
        _: &[(String, String)],
        _: &crate::login::ExtensionContext<'_>,
    ) -> std::result::Result<Vec<(String, String)>, String> {
        Ok(Vec::new())
    }
    fn finish(
        &mut self,
        _: &crate::login::ExtensionContext<'_>,
    ) -> std::result::Result<(), String> {
        // Every PDU of the login so far, the final response included, was shown first.
        if self.received == 0 || self.sent != self.received {
            return Err(format!(
                "saw {} sent, {} received",
                self.sent, self.received
            ));
        }
        Ok(())
    }
    fn observe_pdu(&mut self, dir: PduDir, _: &Pdu) {
        match dir {
            PduDir::Sent => self.sent += 1,
            PduDir::Received => self.received += 1,
        }
    }
}

#[test]
fn shows_every_login_pdu_to_the_extension_before_the_machine_decides() {
    let kind = SessionKind::Normal {
        target_name: TARGET.into(),
    };
    let (mut m, first) =
        LoginMachine::<dyn OriginatorExtension>::start(LoginOptions::default(), kind);
    m.set_extension(Box::<Counting>::default(), ISID);
    let mut ini = LoginExchange::new(m, first, ISID);
    let mut tgt = TargetLogin::new(TargetOffer::default(), None);
    let mut pdus = 0;
    loop {
        let req = ini.poll_transmit().unwrap();
        pdus += 1;
        let r = tgt.handle(login_request(&req), &req.data, &mut Dir);
        match ini
            .handle_pdu(&Pdu::new(r.header, Bytes::from(r.data)))
            .unwrap()
        {
            LoginProgress::Send => {}
            LoginProgress::Done(_) => break,
            LoginProgress::RelayChallenge { .. } => panic!(),
        }
    }
    assert!(pdus >= 2);
}

/// Issue 28: a login adding a connection to a running session (RFC 7143 §5.3.4) names the
/// session's TSIH and its own CID on every request, and offers the MaxConnections the caller
/// set; the target answers the lower limit.
#[test]
fn accepts_a_login_joining_a_session_with_its_tsih_and_a_cid_of_its_own() {
    let kind = SessionKind::Normal {
        target_name: TARGET.into(),
    };
    let opts = LoginOptions {
        max_connections: 4,
        join: Some(crate::login::originator::Join { tsih: 9, cid: 3 }),
        ..LoginOptions::default()
    };
    let (m, first) = <LoginMachine>::start(opts, kind);
    let mut ini = LoginExchange::new(m, first, ISID);
    let offer = TargetOffer {
        max_connections: 2,
        ..TargetOffer::default()
    };
    let mut tgt = TargetLogin::new(offer, None);
    let mut dir = Dir;
    let mut offered = None;
    let done = loop {
        let req = ini.poll_transmit().expect("a request to send");
        let h = login_request(&req).clone();
        assert_eq!((h.isid, h.tsih, h.cid), (ISID, 9, 3), "every request");
        let keys = iscsi_wire::text::parse(&req.data).unwrap();
        if let Some((_, v)) = keys.iter().find(|(k, _)| k == "MaxConnections") {
            offered = Some(v.clone());
        }
        let reply = tgt.handle(&h, &req.data, &mut dir);
        match ini
            .handle_pdu(&Pdu::new(reply.header, Bytes::from(reply.data)))
            .unwrap()
        {
            LoginProgress::Send => {}
            LoginProgress::Done(d) => break d,
            LoginProgress::RelayChallenge { .. } => panic!("no relay here"),
        }
    };
    assert_eq!(offered.as_deref(), Some("4"));
    assert_eq!(done.established.tsih, 9);
    assert_eq!(
        done.established.params.max_connections, 2,
        "the lower limit"
    );
}
