//! Failure cases against a scripted fake target on 127.0.0.1:0: a connection closed with
//! commands in flight, and a target that stops answering (keepalive).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use common::bounded;
use ipsan_initiator::{
    scsi, ConnectionLoss, DataDir, Error, IscsiUrl, LoginOptions, Session, SessionConfig,
};
use iscsi_wire::header::{DataIn, LoginResponse, ScsiResponse, Stage};
use iscsi_wire::{Codec, Header, Pdu};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::OwnedReadHalf;
use tokio::net::TcpListener;

#[derive(Clone, Copy)]
enum Behaviour {
    /// Close the connection once this many SCSI commands have arrived.
    CloseAfterCommands(usize),
    /// Log in, then never send another byte.
    Silent,
    /// Answer every read with half the data and GOOD status, no underflow flag.
    ShortRead,
    /// Answer every read with exactly ExpectedDataTransferLength bytes and GOOD status.
    FullRead,
    /// Answer every command with GOOD status after this many milliseconds, concurrently.
    DelayedGood(u64),
    /// Never answer a NOP-Out or finish a command, but after the first command send an
    /// unsolicited NOP-In (no answer wanted) every 100 ms for this many milliseconds: a
    /// session whose ping is stuck behind data on a slow link, still talking.
    Chatter(u64),
    /// Send a NOP-In ping (TTT [`PING_TTT`]) in the same write as the final login response,
    /// and answer reads (all their data, GOOD) only once the initiator's NOP-Out answered it.
    PingWithLogin,
}

/// The target transfer tag of [`Behaviour::PingWithLogin`]'s ping.
const PING_TTT: u32 = 0x5eed;

/// One Data-In with all `len` bytes (7s) and GOOD status for command `c`.
fn data_in(
    c: &iscsi_wire::header::ScsiCommand,
    len: usize,
    stat_sn: u32,
    codec: &Codec,
) -> BytesMut {
    let h = DataIn {
        final_: true,
        status_present: true,
        status: 0,
        itt: c.itt,
        ttt: u32::MAX,
        stat_sn,
        exp_cmd_sn: c.cmd_sn.wrapping_add(1),
        max_cmd_sn: c.cmd_sn.wrapping_add(64),
        ..DataIn::default()
    };
    let mut out = BytesMut::new();
    codec
        .encode(&Pdu::new(h, vec![7u8; len].into()), &mut out)
        .unwrap();
    out
}

async fn read_pdu(s: &mut OwnedReadHalf, buf: &mut BytesMut, codec: &Codec) -> Option<Pdu> {
    loop {
        if let Some(p) = codec.decode(buf).unwrap() {
            return Some(p);
        }
        if s.read_buf(buf).await.ok()? == 0 {
            return None;
        }
    }
}

async fn fake_target(l: TcpListener, behaviour: Behaviour) {
    let (s, _) = l.accept().await.unwrap();
    let (mut rd, wr) = s.into_split();
    let wr = Arc::new(tokio::sync::Mutex::new(wr));
    let codec = Codec::default();
    let mut buf = BytesMut::new();
    let mut stat_sn = 0u32;
    let mut commands = 0usize;
    let mut pinged = false;
    let mut pending = None;
    while let Some(pdu) = read_pdu(&mut rd, &mut buf, &codec).await {
        match pdu.header {
            Header::LoginRequest(r) => {
                let keys: &[(&str, &str)] = if r.csg == Stage::SECURITY_NEGOTIATION {
                    &[("AuthMethod", "None")]
                } else {
                    &[("MaxRecvDataSegmentLength", "65536")]
                };
                let resp = LoginResponse {
                    transit: r.transit,
                    continue_: false,
                    csg: r.csg,
                    nsg: r.nsg,
                    version_max: 0,
                    version_active: 0,
                    isid: r.isid,
                    tsih: 1,
                    itt: r.itt,
                    stat_sn,
                    exp_cmd_sn: r.cmd_sn,
                    max_cmd_sn: r.cmd_sn.wrapping_add(63),
                    status_class: 0,
                    status_detail: 0,
                };
                stat_sn += 1;
                let mut out = BytesMut::new();
                let data = iscsi_wire::text::encode(keys).freeze();
                codec.encode(&Pdu::new(resp, data), &mut out).unwrap();
                if let (Behaviour::PingWithLogin, true, Stage::FULL_FEATURE_PHASE) =
                    (behaviour, r.transit, r.nsg)
                {
                    // Glued to the login response: one segment carries both.
                    let ping = iscsi_wire::header::NopIn {
                        lun: 0,
                        itt: u32::MAX,
                        ttt: PING_TTT,
                        stat_sn,
                        exp_cmd_sn: r.cmd_sn,
                        max_cmd_sn: r.cmd_sn.wrapping_add(63),
                    };
                    codec
                        .encode(&Pdu::new(ping, Bytes::new()), &mut out)
                        .unwrap();
                }
                wr.lock().await.write_all(&out).await.unwrap();
            }
            Header::ScsiCommand(c) => {
                commands += 1;
                if let (Behaviour::Chatter(ms), 1) = (behaviour, commands) {
                    let wr = wr.clone();
                    let codec = codec.clone();
                    tokio::spawn(async move {
                        let t0 = Instant::now();
                        while t0.elapsed() < Duration::from_millis(ms) {
                            let h = iscsi_wire::header::NopIn {
                                lun: 0,
                                itt: u32::MAX,
                                ttt: u32::MAX,
                                stat_sn,
                                exp_cmd_sn: c.cmd_sn.wrapping_add(1),
                                max_cmd_sn: c.cmd_sn.wrapping_add(64),
                            };
                            let mut out = BytesMut::new();
                            codec.encode(&Pdu::new(h, Bytes::new()), &mut out).unwrap();
                            if wr.lock().await.write_all(&out).await.is_err() {
                                return;
                            }
                            tokio::time::sleep(Duration::from_millis(100)).await;
                        }
                    });
                }
                if let Behaviour::DelayedGood(ms) = behaviour {
                    let resp = ScsiResponse {
                        itt: c.itt,
                        stat_sn,
                        exp_cmd_sn: c.cmd_sn.wrapping_add(1),
                        max_cmd_sn: c.cmd_sn.wrapping_add(64),
                        ..ScsiResponse::default()
                    };
                    stat_sn += 1;
                    let mut out = BytesMut::new();
                    codec
                        .encode(&Pdu::new(resp, Bytes::new()), &mut out)
                        .unwrap();
                    let wr = wr.clone();
                    tokio::spawn(async move {
                        tokio::time::sleep(Duration::from_millis(ms)).await;
                        let _ = wr.lock().await.write_all(&out).await;
                    });
                }
                if let Behaviour::ShortRead | Behaviour::FullRead = behaviour {
                    let edtl = c.expected_data_transfer_length as usize;
                    let half = if let Behaviour::FullRead = behaviour {
                        edtl
                    } else {
                        edtl / 2
                    };
                    let h = DataIn {
                        final_: true,
                        status_present: true,
                        status: 0,
                        itt: c.itt,
                        ttt: u32::MAX,
                        stat_sn,
                        exp_cmd_sn: c.cmd_sn.wrapping_add(1),
                        max_cmd_sn: c.cmd_sn.wrapping_add(64),
                        ..DataIn::default()
                    };
                    stat_sn += 1;
                    let mut out = BytesMut::new();
                    codec
                        .encode(&Pdu::new(h, vec![7u8; half].into()), &mut out)
                        .unwrap();
                    wr.lock().await.write_all(&out).await.unwrap();
                }
                if let Behaviour::PingWithLogin = behaviour {
                    if pinged {
                        let len = c.expected_data_transfer_length as usize;
                        let out = data_in(&c, len, stat_sn, &codec);
                        stat_sn += 1;
                        wr.lock().await.write_all(&out).await.unwrap();
                    } else {
                        pending = Some(c);
                    }
                }
                if let Behaviour::CloseAfterCommands(n) = behaviour {
                    if commands >= n {
                        return; // drops the socket with commands in flight
                    }
                }
            }
            Header::NopOut(n) if n.ttt == PING_TTT => {
                pinged = true;
                if let Some(c) = pending.take() {
                    let len = c.expected_data_transfer_length as usize;
                    let out = data_in(&c, len, stat_sn, &codec);
                    stat_sn += 1;
                    wr.lock().await.write_all(&out).await.unwrap();
                }
            }
            _ => {} // other NOP-Outs and everything else: never answered
        }
    }
}

async fn start(behaviour: Behaviour) -> IscsiUrl {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = l.local_addr().unwrap().port();
    tokio::spawn(fake_target(l, behaviour));
    IscsiUrl::parse(&format!(
        "iscsi://127.0.0.1:{port}/iqn.2026-11.org.ipsan:fake/0"
    ))
    .unwrap()
}

#[test]
fn fails_every_in_flight_command_when_target_closes_mid_command() {
    bounded(20, async {
        let url = start(Behaviour::CloseAfterCommands(4)).await;
        let cfg = SessionConfig {
            login: LoginOptions::default(),
            nop_interval: None,
            ..SessionConfig::default()
        };
        let s = Arc::new(Session::connect(&url, &cfg).await.unwrap());
        let t0 = Instant::now();
        let mut tasks = Vec::new();
        for i in 0..8u64 {
            let s = s.clone();
            tasks.push(tokio::spawn(async move {
                s.command(scsi::read16(i * 8, 8), DataDir::Read(BytesMut::new(), 4096))
                    .await
            }));
        }
        for t in tasks {
            let r = t.await.unwrap();
            match r {
                Err(Error::ConnectionLost(reason)) => {
                    assert!(
                        matches!(
                            reason,
                            ConnectionLoss::PeerClosed
                                | ConnectionLoss::Io {
                                    kind: std::io::ErrorKind::ConnectionReset
                                        | std::io::ErrorKind::BrokenPipe,
                                    ..
                                }
                        ),
                        "{reason}"
                    )
                }
                other => panic!("expected ConnectionLost, got {other:?}"),
            }
        }
        assert!(t0.elapsed() < Duration::from_secs(5));
        // New commands fail at once with the same clear error.
        let e = s
            .command(scsi::sync_cache10(), DataDir::None)
            .await
            .unwrap_err();
        assert!(matches!(e, Error::ConnectionLost(_)), "{e}");
        assert!(s.failure().is_some());
    });
}

/// Against `behaviour`, with a NOP-Out every 200 ms and a 500 ms timeout: a read must fail with
/// the keepalive's ConnectionLost, after `min` and before `max`.
async fn keepalive_kills_the_read_between(behaviour: Behaviour, min: Duration, max: Duration) {
    let url = start(behaviour).await;
    let cfg = SessionConfig {
        login: LoginOptions::default(),
        nop_interval: Some(Duration::from_millis(200)),
        nop_timeout: Duration::from_millis(500),
        ..SessionConfig::default()
    };
    let s = Session::connect(&url, &cfg).await.unwrap();
    let t0 = Instant::now();
    let e = s
        .command(scsi::read16(0, 1), DataDir::Read(BytesMut::new(), 512))
        .await
        .unwrap_err();
    match e {
        Error::ConnectionLost(reason) => {
            assert!(
                matches!(reason, ConnectionLoss::KeepaliveTimeout(d) if d == Duration::from_millis(500)),
                "{reason}"
            );
            assert!(reason.to_string().contains("NOP-In"), "{reason}");
        }
        other => panic!("expected ConnectionLost, got {other:?}"),
    }
    let waited = t0.elapsed();
    assert!(
        waited >= min && waited < max,
        "declared dead after {waited:?}, expected between {min:?} and {max:?}"
    );
}

#[test]
fn fails_commands_when_keepalive_goes_unanswered() {
    bounded(20, async {
        let (min, max) = (Duration::from_millis(500), Duration::from_secs(3));
        keepalive_kills_the_read_between(Behaviour::Silent, min, max).await;
    });
}

#[test]
fn a_late_ping_answer_is_not_a_dead_link_while_the_target_keeps_talking() {
    // On a slow lossy link the NOP-Out waits behind MiBs of Data-Out while R2Ts and status
    // keep arriving (the lab's pathologies plan at 2.7 % loss): the session is alive until
    // nothing at all has come from the target for the NOP timeout, so not before the chatter
    // stops at 1.5 s.
    bounded(20, async {
        let (min, max) = (Duration::from_millis(1500), Duration::from_secs(4));
        keepalive_kills_the_read_between(Behaviour::Chatter(1500), min, max).await;
    });
}

#[test]
fn rejects_connection_refused_with_clear_error() {
    bounded(10, async {
        let port = common::free_port();
        let url = IscsiUrl::parse(&format!("iscsi://127.0.0.1:{port}/iqn.x/0")).unwrap();
        let e = Session::connect(&url, &SessionConfig::default())
            .await
            .unwrap_err();
        assert!(matches!(e, Error::Io(_)), "{e}");
    });
}

#[test]
fn rejects_good_status_with_missing_data_in() {
    bounded(20, async {
        let url = start(Behaviour::ShortRead).await;
        let cfg = SessionConfig {
            nop_interval: None,
            ..SessionConfig::default()
        };
        let s = Session::connect(&url, &cfg).await.unwrap();
        let e = s
            .command(scsi::read16(0, 8), DataDir::Read(BytesMut::new(), 4096))
            .await
            .unwrap_err();
        assert!(
            e.to_string().contains("2048 of 4096"),
            "a short Data-In must not come back as zero-filled data: {e}"
        );
    });
}

/// A length-changing transform, like Seal's tags: 16 extra bytes on the wire.
#[derive(Debug)]
struct Tagged;

impl ipsan_initiator::PayloadTransform for Tagged {
    fn wire_len(&self, plain_len: usize) -> Option<usize> {
        Some(plain_len + 16)
    }
    fn outbound(
        &self,
        _: ipsan_initiator::CommandInfo,
        data: bytes::Bytes,
    ) -> ipsan_initiator::TransformFuture<bytes::Bytes> {
        Box::pin(async move { Ok(data) })
    }
    fn inbound(
        &self,
        _: ipsan_initiator::CommandInfo,
        mut data: BytesMut,
    ) -> ipsan_initiator::TransformFuture<BytesMut> {
        Box::pin(async move {
            assert_eq!(
                data.len(),
                4096 + 16,
                "Data-In must be reassembled at wire length"
            );
            data.truncate(data.len() - 16);
            Ok(data)
        })
    }
}

#[test]
fn length_changing_transform_sets_the_wire_transfer_length() {
    bounded(20, async {
        let url = start(Behaviour::FullRead).await;
        let cfg = SessionConfig {
            nop_interval: None,
            ..SessionConfig::default()
        };
        let mut s = Session::connect(&url, &cfg).await.unwrap();
        s.set_transform(std::sync::Arc::new(Tagged));
        let c = s
            .command(scsi::read16(0, 8), DataDir::Read(BytesMut::new(), 4096))
            .await
            .unwrap();
        assert_eq!(c.data.len(), 4096);
        assert!(c.data.iter().all(|&b| b == 7));
    });
}

#[test]
fn overlaps_round_trips_with_many_commands_in_flight() {
    // The papers' lever: with a 100 ms service time, 16 commands in flight finish in about one
    // service time, not sixteen.
    bounded(30, async {
        let url = start(Behaviour::DelayedGood(100)).await;
        let cfg = SessionConfig {
            nop_interval: None,
            ..SessionConfig::default()
        };
        let s = Arc::new(Session::connect(&url, &cfg).await.unwrap());
        // Depth 1: four commands one after another take four service times.
        let t0 = Instant::now();
        for _ in 0..4 {
            s.command(scsi::sync_cache10(), DataDir::None)
                .await
                .unwrap();
        }
        let serial = t0.elapsed();
        assert!(serial >= Duration::from_millis(400), "{serial:?}");
        // Depth 16: sixteen commands at once overlap.
        let t0 = Instant::now();
        let tasks: Vec<_> = (0..16)
            .map(|_| {
                let s = s.clone();
                tokio::spawn(async move { s.command(scsi::sync_cache10(), DataDir::None).await })
            })
            .collect();
        for t in tasks {
            t.await.unwrap().unwrap();
        }
        let parallel = t0.elapsed();
        assert!(
            parallel < Duration::from_millis(600),
            "16 commands in flight took {parallel:?}: they did not overlap"
        );
    });
}

/// The login's framed reader is the full feature phase's: a ping the target sent in the same
/// segment as its final login response is not lost between the two (the initiator answers
/// it, and only then does this target answer the read).
#[test]
fn accepts_a_ping_glued_to_the_final_login_response() {
    bounded(20, async {
        let url = start(Behaviour::PingWithLogin).await;
        let cfg = SessionConfig {
            nop_interval: None,
            ..SessionConfig::default()
        };
        let s = Session::connect(&url, &cfg).await.unwrap();
        let c = tokio::time::timeout(
            Duration::from_secs(5),
            s.command(scsi::read16(0, 8), DataDir::Read(BytesMut::new(), 4096)),
        )
        .await
        .expect("the read is answered only after the glued ping was: the ping was lost")
        .unwrap();
        assert_eq!(c.data.len(), 4096);
        assert!(c.data.iter().all(|&b| b == 7));
    });
}
