//! Malformed and out-of-spec PDUs from a raw client: each gets the RFC's answer, and the
//! target keeps serving other sessions.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use bytes::{Bytes, BytesMut};
use ipsan_target::config::{self, Config, TargetConfig};
use ipsan_target::ServerHandle;
use iscsi_wire::header::*;
use iscsi_wire::{Codec, Header, Pdu};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

const IQN: &str = "iqn.2026-11.org.ipsan:hostile";

async fn start() -> ServerHandle {
    let mut c = Config {
        portals: vec!["127.0.0.1:0".parse().unwrap()],
        targets: vec![TargetConfig {
            iqn: IQN.into(),
            alias: None,
            allow: Vec::new(),
            chap: None,
            chap_hosts: Vec::new(),
            seal: Default::default(),
            luns: config::luns_from_specs(&["mem:16MiB".into()]).unwrap(),
        }],
        ..Config::default()
    };
    c.validate().unwrap();
    ServerHandle::start(&c).await.unwrap()
}

struct Raw {
    s: TcpStream,
    buf: BytesMut,
    codec: Codec,
    cmd_sn: u32,
}

impl Raw {
    async fn connect(addr: std::net::SocketAddr) -> Self {
        let s = TcpStream::connect(addr).await.unwrap();
        Self {
            s,
            buf: BytesMut::new(),
            codec: Codec::default(),
            cmd_sn: 1,
        }
    }

    async fn send(&mut self, pdu: &Pdu) {
        let mut out = BytesMut::new();
        self.codec.encode(pdu, &mut out).unwrap();
        self.s.write_all(&out).await.unwrap();
    }

    /// The next PDU, or None if the target closed the connection (bounded wait).
    async fn recv(&mut self) -> Option<Pdu> {
        let fut = async {
            loop {
                if let Some(p) = self.codec.decode(&mut self.buf).unwrap() {
                    return Some(p);
                }
                if self.s.read_buf(&mut self.buf).await.unwrap_or(0) == 0 {
                    return None;
                }
            }
        };
        tokio::time::timeout(Duration::from_secs(10), fut)
            .await
            .expect("target answered in time")
    }

    /// Logs in straight to full feature phase with the given ISID.
    async fn login(&mut self, isid: [u8; 6]) -> LoginResponse {
        let r = self
            .login_request(
                "iqn.2026-11.org.example:raw",
                isid,
                0,
                0,
                "MaxRecvDataSegmentLength=65536\0",
            )
            .await;
        assert_eq!((r.status_class, r.status_detail), (0, 0), "login refused");
        r
    }

    /// A login that names a session (its TSIH: a connection joining it, RFC 7143 §5.3.4), as
    /// `initiator`; returns the response's status class and detail.
    async fn login_into(&mut self, initiator: &str, isid: [u8; 6], tsih: u16) -> (u8, u8) {
        let r = self.login_request(initiator, isid, tsih, 1, "").await;
        (r.status_class, r.status_detail)
    }

    /// One Login Request straight to full feature phase on connection `cid` of session
    /// (`isid`, `tsih`) as `initiator`, with `extra` keys; the Login Response.
    async fn login_request(
        &mut self,
        initiator: &str,
        isid: [u8; 6],
        tsih: u16,
        cid: u16,
        extra: &str,
    ) -> LoginResponse {
        let text =
            format!("InitiatorName={initiator}\0TargetName={IQN}\0SessionType=Normal\0{extra}");
        let req = LoginRequest {
            transit: true,
            continue_: false,
            csg: Stage::LOGIN_OPERATIONAL_NEGOTIATION,
            nsg: Stage::FULL_FEATURE_PHASE,
            version_max: 0,
            version_min: 0,
            isid,
            tsih,
            itt: 1,
            cid,
            cmd_sn: self.cmd_sn,
            exp_stat_sn: 0,
        };
        self.send(&Pdu::new(req, Bytes::from(text))).await;
        let Some(Pdu {
            header: Header::LoginResponse(r),
            ..
        }) = self.recv().await
        else {
            panic!("no login response")
        };
        r
    }

    async fn test_unit_ready(&mut self, itt: u32) -> Option<Pdu> {
        let cmd = ScsiCommand {
            immediate: false,
            final_: true,
            read: false,
            write: false,
            attr: TaskAttr::SIMPLE,
            lun: 0,
            itt,
            expected_data_transfer_length: 0,
            cmd_sn: self.cmd_sn,
            exp_stat_sn: 0,
            cdb: [0; 16],
        };
        self.cmd_sn += 1;
        self.send(&Pdu::new(cmd, Bytes::new())).await;
        self.recv().await
    }
}

fn is_good_response(p: &Option<Pdu>, itt: u32) -> bool {
    matches!(p, Some(Pdu { header: Header::ScsiResponse(r), .. }) if r.itt == itt && r.status == 0 && r.response == 0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unknown_opcode_gets_reject_and_session_continues() {
    let t = start().await;
    let mut c = Raw::connect(t.addrs[0]).await;
    c.login([0x80, 0, 0, 0, 0, 1]).await;
    // Opcode 0x1c is not defined by RFC 7143.
    let mut raw = [0u8; 48];
    raw[0] = 0x1c;
    raw[1] = 0x80;
    c.s.write_all(&raw).await.unwrap();
    let p = c.recv().await.expect("a Reject");
    let Header::Reject(r) = &p.header else {
        panic!("{:?}", p.header)
    };
    assert_eq!(r.reason, RejectReason::COMMAND_NOT_SUPPORTED);
    assert_eq!(&p.data[..], &raw[..], "Reject carries the offending header");
    assert!(
        is_good_response(&c.test_unit_ready(7).await, 7),
        "session still works"
    );
    t.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn oversized_data_segment_drops_only_that_connection() {
    let t = start().await;
    let mut good = Raw::connect(t.addrs[0]).await;
    good.login([0x80, 0, 0, 0, 0, 2]).await;
    let mut bad = Raw::connect(t.addrs[0]).await;
    bad.login([0x80, 0, 0, 0, 0, 3]).await;
    // A NOP-Out claiming 16 MiB - 1 of data: far over MaxRecvDataSegmentLength.
    let mut raw = [0u8; 48];
    raw[0] = 0x40;
    raw[1] = 0x80;
    raw[5..8].copy_from_slice(&[0xff, 0xff, 0xff]);
    raw[16..20].copy_from_slice(&5u32.to_be_bytes());
    bad.s.write_all(&raw).await.unwrap();
    let p = bad.recv().await;
    assert!(
        matches!(&p, Some(Pdu { header: Header::Reject(r), .. }) if r.reason == RejectReason::PROTOCOL_ERROR),
        "{p:?}"
    );
    assert!(
        bad.recv().await.is_none(),
        "connection closed after the protocol error"
    );
    assert!(
        is_good_response(&good.test_unit_ready(9).await, 9),
        "other session unaffected"
    );
    t.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cmdsn_outside_window_is_ignored() {
    let t = start().await;
    let mut c = Raw::connect(t.addrs[0]).await;
    let r = c.login([0x80, 0, 0, 0, 0, 4]).await;
    let max = r.max_cmd_sn;
    // CmdSN = MaxCmdSN + 1: silently ignored (RFC 7143 §4.2.2.1)...
    let saved = c.cmd_sn;
    c.cmd_sn = max.wrapping_add(1);
    let cmd = ScsiCommand {
        immediate: false,
        final_: true,
        read: false,
        write: false,
        attr: TaskAttr::SIMPLE,
        lun: 0,
        itt: 11,
        expected_data_transfer_length: 0,
        cmd_sn: c.cmd_sn,
        exp_stat_sn: 0,
        cdb: [0; 16],
    };
    c.send(&Pdu::new(cmd, Bytes::new())).await;
    let nothing = tokio::time::timeout(Duration::from_millis(500), async {
        let mut b = [0u8; 1];
        c.s.peek(&mut b).await
    })
    .await;
    assert!(nothing.is_err(), "no answer to an out-of-window command");
    // ...and the right CmdSN still works.
    c.cmd_sn = saved;
    assert!(is_good_response(&c.test_unit_ready(12).await, 12));
    t.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn login_with_same_isid_reinstates_the_session() {
    let t = start().await;
    let isid = [0x80, 0, 0, 0, 0, 5];
    let mut old = Raw::connect(t.addrs[0]).await;
    let r1 = old.login(isid).await;
    let mut new = Raw::connect(t.addrs[0]).await;
    let r2 = new.login(isid).await;
    assert_ne!(r1.tsih, r2.tsih, "a new session");
    assert!(
        old.recv().await.is_none(),
        "the old session's connection is closed"
    );
    assert!(is_good_response(&new.test_unit_ready(1).await, 1));
    t.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn data_before_login_is_refused() {
    let t = start().await;
    let mut c = Raw::connect(t.addrs[0]).await;
    assert!(
        c.test_unit_ready(1).await.is_none(),
        "a SCSI command before login closes the connection"
    );
    let mut ok = Raw::connect(t.addrs[0]).await;
    ok.login([0x80, 0, 0, 0, 0, 6]).await;
    t.shutdown().await.unwrap();
}

/// A client trying to add a connection to someone else's session (its TSIH with another
/// initiator name or ISID) is told the session does not exist (0x020a), exactly as for a TSIH
/// nobody has, so it learns nothing; the owner asking for a second connection hears that this
/// target runs one per session (0x0206). The session itself keeps serving.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rejects_a_connection_into_another_initiators_session() {
    let t = start().await;
    let isid = [0x80, 0, 0, 0, 0, 9];
    let mut owner = Raw::connect(t.addrs[0]).await;
    let tsih = owner.login(isid).await.tsih;
    assert_ne!(tsih, 0);
    for (who, ini, i, tsih) in [
        (
            "another initiator name",
            "iqn.2026-11.org.example:mallory",
            isid,
            tsih,
        ),
        (
            "another ISID",
            "iqn.2026-11.org.example:raw",
            [0x80, 0, 0, 0, 0, 10],
            tsih,
        ),
        (
            "a TSIH nobody has",
            "iqn.2026-11.org.example:raw",
            isid,
            tsih.wrapping_add(7),
        ),
    ] {
        let mut c = Raw::connect(t.addrs[0]).await;
        assert_eq!(c.login_into(ini, i, tsih).await, (2, 0x0a), "{who}");
        assert!(c.recv().await.is_none(), "{who}: the connection is closed");
    }
    let mut c = Raw::connect(t.addrs[0]).await;
    assert_eq!(
        c.login_into("iqn.2026-11.org.example:raw", isid, tsih)
            .await,
        (2, 0x06),
        "the owner: too many connections"
    );
    assert!(is_good_response(&owner.test_unit_ready(1).await, 1));
    t.shutdown().await.unwrap();
}
