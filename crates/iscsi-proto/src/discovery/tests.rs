//! SendTargets and the discovery logout against a scripted target that answers as RFC 7143
//! lets it (continued answers, a TTT) or as a broken or hostile one would.

use bytes::Bytes;
use iscsi_wire::header::{LogoutResponse, NopIn, Reject, RejectReason, TextResponse};
use iscsi_wire::{Header, Pdu, RESERVED_TAG};

use super::*;

const ANSWER: &[u8] = b"TargetName=iqn.2026-11.org.ipsan:disk0\0TargetAddress=10.0.0.1:3260,1\0TargetAddress=[fd00::1]:3260,1\0TargetName=iqn.2026-11.org.ipsan:disk1\0TargetAddress=10.0.0.2:3260,2\0";

fn text_request(p: &Pdu) -> &TextRequest {
    let Header::TextRequest(r) = &p.header else {
        panic!("not a Text Request: {p:?}")
    };
    r
}

fn response(final_: bool, ttt: u32, stat_sn: u32, data: &[u8]) -> Pdu {
    Pdu::new(
        TextResponse {
            final_,
            continue_: false,
            lun: 0,
            itt: 1,
            ttt,
            stat_sn,
            exp_cmd_sn: 0,
            max_cmd_sn: 0,
        },
        Bytes::copy_from_slice(data),
    )
}

#[test]
fn accepts_send_targets_answered_in_several_pdus_with_a_ttt_then_logs_out() {
    let mut d = Discovery::new(10, 5);
    let first = d.poll_transmit().unwrap();
    let r = text_request(&first);
    assert_eq!((r.cmd_sn, r.exp_stat_sn, r.ttt), (10, 5, RESERVED_TAG));
    assert!(r.final_ && !r.continue_ && !r.immediate);
    assert_eq!(&first.data[..], b"SendTargets=All\0");
    assert!(d.poll_transmit().is_none());

    // The target sends the answer in three parts, cut inside a key, continuing with TTT 0x55.
    let parts = [&ANSWER[..30], &ANSWER[30..90], &ANSWER[90..]];
    let mut targets = None;
    for (i, part) in parts.iter().enumerate() {
        let last = i + 1 == parts.len();
        let stat_sn = 5 + i as u32;
        let ttt = if last { RESERVED_TAG } else { 0x55 };
        match d.handle_pdu(&response(last, ttt, stat_sn, part)).unwrap() {
            DiscoveryEvent::Pending => {
                assert!(!last);
                let more = d.poll_transmit().unwrap();
                let m = text_request(&more);
                // Empty, echoing the TTT, the next CmdSN, acknowledging the StatSN.
                assert!(more.data.is_empty());
                assert_eq!(m.ttt, 0x55);
                assert_eq!(m.itt, 1);
                assert_eq!(m.cmd_sn, 10 + i as u32 + 1);
                assert_eq!(m.exp_stat_sn, stat_sn + 1);
            }
            DiscoveryEvent::Targets(t) => {
                assert!(last);
                targets = Some(t);
            }
            e @ DiscoveryEvent::LoggedOut(_) => panic!("{e:?}"),
        }
    }
    let targets = targets.unwrap();
    assert_eq!(
        targets,
        vec![
            DiscoveredTarget {
                name: "iqn.2026-11.org.ipsan:disk0".into(),
                addresses: vec!["10.0.0.1:3260,1".into(), "[fd00::1]:3260,1".into()],
            },
            DiscoveredTarget {
                name: "iqn.2026-11.org.ipsan:disk1".into(),
                addresses: vec!["10.0.0.2:3260,2".into()],
            },
        ]
    );

    // Then the logout: immediate, closing the session, at the CmdSN after the last request.
    let out = d.poll_transmit().unwrap();
    let Header::LogoutRequest(l) = &out.header else {
        panic!("{out:?}")
    };
    assert!(l.immediate);
    assert_eq!(l.reason, LogoutReason::CLOSE_SESSION);
    assert_eq!((l.cmd_sn, l.exp_stat_sn), (13, 8));
    assert!(!d.is_done());
    // A NOP-In on the way out changes nothing; the Logout Response ends it.
    assert_eq!(
        d.handle_pdu(&Pdu::new(NopIn::default(), Bytes::new()))
            .unwrap(),
        DiscoveryEvent::Pending
    );
    let bye = LogoutResponse {
        response: 0,
        itt: l.itt,
        stat_sn: 8,
        exp_cmd_sn: 13,
        max_cmd_sn: 13,
        time2wait: 0,
        time2retain: 0,
    };
    assert_eq!(
        d.handle_pdu(&Pdu::new(bye, Bytes::new())).unwrap(),
        DiscoveryEvent::LoggedOut(0)
    );
    assert!(d.is_done());
    assert!(d.poll_transmit().is_none());
}

/// The error the first answer `pdu` ends the exchange with; nothing is sent after it.
fn refused(pdu: Pdu) -> DiscoveryError {
    let mut d = Discovery::new(1, 1);
    d.poll_transmit().unwrap();
    let e = d.handle_pdu(&pdu).unwrap_err();
    assert!(d.is_done());
    assert!(d.poll_transmit().is_none());
    e
}

#[test]
fn rejects_a_continuing_answer_without_a_ttt() {
    let e = refused(response(false, RESERVED_TAG, 1, &ANSWER[..20]));
    assert!(
        matches!(e, DiscoveryError::BadContinuation { final_: false, .. }),
        "{e:?}"
    );
}

#[test]
fn rejects_an_answer_with_both_final_and_continue() {
    let mut p = response(true, RESERVED_TAG, 1, ANSWER);
    if let Header::TextResponse(r) = &mut p.header {
        r.continue_ = true;
    }
    assert!(matches!(
        refused(p),
        DiscoveryError::BadContinuation {
            final_: true,
            continue_: true,
            ..
        }
    ));
}

#[test]
fn rejects_an_address_before_any_name() {
    let e = refused(response(
        true,
        RESERVED_TAG,
        1,
        b"TargetAddress=10.0.0.9:3260,1\0TargetName=iqn.x\0",
    ));
    assert!(matches!(e, DiscoveryError::AddressWithoutName(ref a) if a == "10.0.0.9:3260,1"));
}

#[test]
fn rejects_text_that_does_not_parse() {
    let e = refused(response(true, RESERVED_TAG, 1, b"TargetName\0"));
    assert!(matches!(e, DiscoveryError::Text(_)), "{e:?}");
}

#[test]
fn rejects_an_answer_for_another_itt_or_of_another_kind() {
    let mut p = response(true, RESERVED_TAG, 1, ANSWER);
    if let Header::TextResponse(r) = &mut p.header {
        r.itt = 7;
    }
    assert!(matches!(
        refused(p),
        DiscoveryError::WrongItt { got: 7, ours: 1 }
    ));
    let e = refused(Pdu::new(NopIn::default(), Bytes::new()));
    assert!(matches!(e, DiscoveryError::UnexpectedPdu { .. }), "{e:?}");
    let reject = Reject {
        reason: RejectReason::PROTOCOL_ERROR,
        ..Reject::default()
    };
    assert!(matches!(
        refused(Pdu::new(reject, Bytes::new())),
        DiscoveryError::Rejected(r) if r == RejectReason::PROTOCOL_ERROR.0
    ));
}

#[test]
fn rejects_an_endless_answer() {
    // A target that keeps answering 64 KiB parts is cut at 1 MiB ...
    let mut d = Discovery::new(1, 1);
    d.poll_transmit().unwrap();
    let part = vec![b'a'; 64 * 1024];
    let mut n = 0;
    let e = loop {
        match d.handle_pdu(&response(false, 9, n, &part)) {
            Ok(DiscoveryEvent::Pending) => {
                assert!(d.poll_transmit().is_some());
                n += 1;
                assert!(n as usize <= SEND_TARGETS_LIMIT / part.len(), "not cut");
            }
            other => break other.unwrap_err(),
        }
    };
    assert!(matches!(e, DiscoveryError::TooLong), "{e:?}");
    // ... and one that keeps answering empty parts at SEND_TARGETS_MAX_PDUS.
    let mut d = Discovery::new(1, 1);
    d.poll_transmit().unwrap();
    let mut n = 0usize;
    let e = loop {
        match d.handle_pdu(&response(false, 9, n as u32, b"")) {
            Ok(DiscoveryEvent::Pending) => {
                d.poll_transmit().unwrap();
                n += 1;
                assert!(n <= SEND_TARGETS_MAX_PDUS, "not cut");
            }
            other => break other.unwrap_err(),
        }
    };
    assert!(matches!(e, DiscoveryError::TooLong), "{e:?}");
}
