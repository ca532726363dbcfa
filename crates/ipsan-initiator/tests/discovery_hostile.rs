//! `discover` (SendTargets, RFC 7143 §11.10–§11.11, Appendix D) against a target on
//! 127.0.0.1:0 that logs the discovery session in with iscsi-proto's real target login
//! machine and then answers SendTargets as the script says: split over several Text
//! Responses with a Target Transfer Tag (as a large target would), or as a broken or hostile
//! target would (continuing without a TTT, never ending). Every test is bounded in time.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use common::bounded;
use ipsan_initiator::{discover, DiscoveredTarget, Error, IscsiUrl, LoginOptions};
use iscsi_proto::login::{
    Auth, Directory, LoginFailure, Outcome, TargetLogin, TargetOffer, TargetPolicy,
};
use iscsi_wire::header::{LogoutResponse, TextRequest, TextResponse};
use iscsi_wire::{Codec, Header, Pdu, RESERVED_TAG};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

struct Dir;

impl Directory for Dir {
    fn target(&self, _: &str, _: &str) -> Result<TargetPolicy, LoginFailure> {
        self.discovery("")
    }
    fn discovery(&self, _: &str) -> Result<TargetPolicy, LoginFailure> {
        Ok(TargetPolicy {
            auth: Auth::None,
            portal_group_tag: 1,
            alias: None,
        })
    }
    fn assign_tsih(&mut self, _: [u8; 6], _: &str, _: u16) -> Result<u16, LoginFailure> {
        Ok(1)
    }
}

const ANSWER: &[u8] = b"TargetName=iqn.2026-11.org.ipsan:disk0\0TargetAddress=127.0.0.1:3260,1\0TargetName=iqn.2026-11.org.ipsan:disk1\0TargetAddress=127.0.0.1:3261,1\0TargetAddress=[::1]:3261,1\0";

/// The answer to the `n`-th Text Request (0: SendTargets=All): final, TTT, data.
type TextScript = Arc<dyn Fn(usize, &TextRequest) -> (bool, u32, Vec<u8>) + Send + Sync>;

/// What the target saw after login.
#[derive(Default, Debug)]
struct Seen {
    texts: Vec<(TextRequest, Bytes)>,
    logouts: usize,
}

async fn target(l: TcpListener, script: TextScript, seen: Arc<Mutex<Seen>>) {
    let (s, _) = l.accept().await.unwrap();
    let (mut rd, mut wr) = s.into_split();
    let codec = Codec::default();
    let mut buf = BytesMut::new();
    let mut login = TargetLogin::new(TargetOffer::default(), None);
    let mut stat_sn = 0u32;
    loop {
        let pdu = loop {
            if let Some(p) = codec.decode(&mut buf).unwrap() {
                break p;
            }
            if rd.read_buf(&mut buf).await.unwrap_or(0) == 0 {
                return;
            }
        };
        let out = match &pdu.header {
            Header::LoginRequest(r) => {
                let reply = login.handle(r, &pdu.data, &mut Dir);
                if let Outcome::FullFeature(done) = &reply.outcome {
                    stat_sn = done.next_stat_sn;
                }
                assert!(!matches!(reply.outcome, Outcome::Failed(_)));
                Pdu::new(reply.header, Bytes::from(reply.data))
            }
            Header::TextRequest(r) => {
                let n = {
                    let mut s = seen.lock().unwrap();
                    s.texts.push((r.clone(), pdu.data.clone()));
                    s.texts.len() - 1
                };
                let (final_, ttt, data) = script(n, r);
                let h = TextResponse {
                    final_,
                    continue_: false,
                    lun: 0,
                    itt: r.itt,
                    ttt,
                    stat_sn,
                    exp_cmd_sn: r.cmd_sn.wrapping_add(1),
                    max_cmd_sn: r.cmd_sn.wrapping_add(8),
                };
                stat_sn = stat_sn.wrapping_add(1);
                Pdu::new(h, Bytes::from(data))
            }
            Header::LogoutRequest(r) => {
                seen.lock().unwrap().logouts += 1;
                let h = LogoutResponse {
                    response: 0,
                    itt: r.itt,
                    stat_sn,
                    exp_cmd_sn: r.cmd_sn,
                    max_cmd_sn: r.cmd_sn,
                    time2wait: 0,
                    time2retain: 0,
                };
                Pdu::new(h, Bytes::new())
            }
            _ => continue,
        };
        let mut bytes = BytesMut::new();
        codec.encode(&out, &mut bytes).unwrap();
        if wr.write_all(&bytes).await.is_err() {
            return;
        }
    }
}

async fn discover_against(script: TextScript) -> (Result<Vec<DiscoveredTarget>, Error>, Seen) {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = l.local_addr().unwrap().port();
    let seen = Arc::new(Mutex::new(Seen::default()));
    let t = tokio::spawn(target(l, script, seen.clone()));
    let url = IscsiUrl::parse(&format!("iscsi://127.0.0.1:{port}")).unwrap();
    let mut cfg = common::config(LoginOptions::default());
    cfg.login_timeout = Duration::from_secs(8);
    let r = discover(&url, &cfg).await;
    drop(t);
    let seen = std::mem::take(&mut *seen.lock().unwrap());
    (r, seen)
}

#[test]
fn accepts_send_targets_split_over_text_responses_with_a_ttt() {
    bounded(30, async {
        // Three parts, cut inside keys, continued under TTT 0x77.
        let cuts = [0, 25, 100, ANSWER.len()];
        let (r, seen) = discover_against(Arc::new(move |n, _| {
            let last = n + 2 >= cuts.len();
            let part = ANSWER[cuts[n.min(2)]..cuts[(n + 1).min(3)]].to_vec();
            (last, if last { RESERVED_TAG } else { 0x77 }, part)
        }))
        .await;
        let found = r.unwrap();
        assert_eq!(
            found,
            vec![
                DiscoveredTarget {
                    name: "iqn.2026-11.org.ipsan:disk0".into(),
                    addresses: vec!["127.0.0.1:3260,1".into()],
                },
                DiscoveredTarget {
                    name: "iqn.2026-11.org.ipsan:disk1".into(),
                    addresses: vec!["127.0.0.1:3261,1".into(), "[::1]:3261,1".into()],
                },
            ]
        );
        // SendTargets=All, then two empty requests echoing the TTT at the next CmdSNs,
        // then the logout.
        assert_eq!(seen.texts.len(), 3, "{seen:?}");
        assert_eq!(&seen.texts[0].1[..], b"SendTargets=All\0");
        assert_eq!(seen.texts[0].0.ttt, RESERVED_TAG);
        for (i, (req, data)) in seen.texts.iter().enumerate().skip(1) {
            assert!(data.is_empty());
            assert_eq!(req.ttt, 0x77);
            assert_eq!(
                req.cmd_sn,
                seen.texts[0].0.cmd_sn.wrapping_add(i as u32),
                "{seen:?}"
            );
        }
        assert_eq!(seen.logouts, 1);
    });
}

#[test]
fn rejects_a_send_targets_answer_that_continues_without_a_ttt() {
    bounded(30, async {
        // F=0 says "more to come", but without a TTT to ask for it with (RFC 7143 §11.11.4).
        let (r, seen) = discover_against(Arc::new(|n, _| {
            if n == 0 {
                (false, RESERVED_TAG, ANSWER[..40].to_vec())
            } else {
                (true, RESERVED_TAG, ANSWER[40..].to_vec())
            }
        }))
        .await;
        let e = r.unwrap_err();
        assert!(
            matches!(e, Error::Protocol(ref m) if m.contains("TTT")),
            "{e:?}"
        );
        assert_eq!(seen.texts.len(), 1, "nothing more was asked: {seen:?}");
    });
}

#[test]
fn rejects_a_send_targets_answer_that_never_ends_before_the_timeout() {
    bounded(30, async {
        // Empty parts, forever: cut at a bounded number of PDUs, not by the login timeout.
        let t0 = Instant::now();
        let (r, seen) = discover_against(Arc::new(|_, _| (false, 0x99, Vec::new()))).await;
        let e = r.unwrap_err();
        assert!(
            matches!(e, Error::Protocol(ref m) if m.contains("PDUs")),
            "{e:?}"
        );
        assert!(t0.elapsed() < Duration::from_secs(8), "{:?}", t0.elapsed());
        assert_eq!(
            seen.texts.len(),
            iscsi_proto::discovery::SEND_TARGETS_MAX_PDUS + 1
        );
        assert_eq!(seen.logouts, 0);
    });
}
