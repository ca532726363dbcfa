//! Seal on the target, driven by a raw client that uses the seal crate's initiator half:
//! negotiation at login, sealed WRITE/READ, what the wire shows, tampering, and policy.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use ipsan_seal::{
    Cipher, Direction, LoginTranscript, Psk, RecordOpener, RecordSealer, SealOffer, SealPolicy,
    SealSession, SessionIds,
};
use ipsan_target::config::{self, Config, SealSettings, TargetConfig};
use ipsan_target::ServerHandle;
use iscsi_wire::header::*;
use iscsi_wire::{Codec, Header, Pdu};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

const IQN: &str = "iqn.2026-11.org.ipsan:sealed";
const INI: &str = "iqn.2026-11.org.example:sealer";
const SECRET: &[u8] = b"a-pre-shared-secret-of-32-bytes!";
const MARKER: &[u8] = b"THE-PLAINTEXT-MARKER-1234567890";

async fn start(policy: SealPolicy) -> ServerHandle {
    let mut c = Config {
        portals: vec!["127.0.0.1:0".parse().unwrap()],
        crypto_workers: 2,
        targets: vec![TargetConfig {
            iqn: IQN.into(),
            alias: None,
            allow: Vec::new(),
            chap: None,
            chap_hosts: Vec::new(),
            seal: SealSettings {
                policy,
                secret: Some(Psk::new(SECRET.to_vec()).unwrap()),
                initiators: Vec::new(),
            },
            luns: config::luns_from_specs(&["mem:16MiB".into()]).unwrap(),
        }],
        ..Config::default()
    };
    c.validate().unwrap();
    ServerHandle::start(&c).await.unwrap()
}

struct Client {
    s: TcpStream,
    buf: BytesMut,
    codec: Codec,
    cmd_sn: u32,
    itt: u32,
    /// Every byte the target sent, to check what the wire shows.
    seen: Vec<u8>,
    /// Every Login PDU (Seal binds the login transcript).
    transcript: LoginTranscript,
    /// Seal's record protection after a sealed login.
    record: Option<(RecordSealer, RecordOpener)>,
    /// The session to join (0: a new one; the target's answer once logged in), this
    /// connection's CID, and keys to add to the login.
    tsih: u16,
    cid: u16,
    extra: &'static str,
}

fn login_req(
    transit: bool,
    nsg: Stage,
    isid: [u8; 6],
    (tsih, cid): (u16, u16),
    cmd_sn: u32,
    itt: u32,
) -> LoginRequest {
    LoginRequest {
        transit,
        continue_: false,
        csg: Stage::LOGIN_OPERATIONAL_NEGOTIATION,
        nsg: if transit { nsg } else { Stage(0) },
        version_max: 0,
        version_min: 0,
        isid,
        tsih,
        itt,
        cid,
        cmd_sn,
        exp_stat_sn: 0,
    }
}

impl Client {
    async fn connect(addr: std::net::SocketAddr) -> Self {
        Self {
            s: TcpStream::connect(addr).await.unwrap(),
            buf: BytesMut::new(),
            codec: Codec::default(),
            cmd_sn: 1,
            itt: 1,
            seen: Vec::new(),
            transcript: LoginTranscript::new(),
            record: None,
            tsih: 0,
            cid: 0,
            extra: "",
        }
    }
    async fn send(&mut self, pdu: &Pdu) {
        let mut pdu = pdu.clone();
        match &mut self.record {
            Some((s, _)) => s.protect(&mut pdu).unwrap(),
            None => self.transcript.add_sent(Direction::InitiatorToTarget, &pdu),
        }
        self.send_raw(&pdu).await;
    }
    /// Sends a PDU as is: no record tag (an attacker's injection).
    async fn send_raw(&mut self, pdu: &Pdu) {
        let mut out = BytesMut::new();
        self.codec.encode(pdu, &mut out).unwrap();
        let _ = self.s.write_all(&out).await;
    }
    async fn recv(&mut self) -> Option<Pdu> {
        let fut = async {
            loop {
                if let Some(mut p) = self.codec.decode(&mut self.buf).unwrap() {
                    match &mut self.record {
                        Some((_, o)) => o.verify(&mut p).unwrap(),
                        None => self
                            .transcript
                            .add_received(Direction::TargetToInitiator, &p),
                    }
                    return Some(p);
                }
                let before = self.buf.len();
                if self.s.read_buf(&mut self.buf).await.unwrap_or(0) == 0 {
                    return None;
                }
                self.seen.extend_from_slice(&self.buf[before..]);
            }
        };
        tokio::time::timeout(Duration::from_secs(10), fut)
            .await
            .expect("answer in time")
    }

    /// Logs in offering `seal`; returns the Seal session, or the login status on failure.
    async fn login(&mut self, seal: Option<Cipher>) -> Result<Option<Arc<SealSession>>, (u8, u8)> {
        let isid = [0x80, 1, 2, 3, 4, 5];
        let mut text = format!("InitiatorName={INI}\0TargetName={IQN}\0SessionType=Normal\0MaxRecvDataSegmentLength=262144\0ImmediateData=Yes\0InitialR2T=No\0FirstBurstLength=262144\0MaxBurstLength=1048576\0");
        let offer = seal.map(|c| {
            SealOffer::new(
                vec![c],
                65536,
                Psk::new(SECRET.to_vec()).unwrap(),
                SessionIds {
                    initiator_name: INI.into(),
                    target_name: IQN.into(),
                    isid,
                },
            )
            .unwrap()
        });
        text.push_str(self.extra);
        if let Some(o) = &offer {
            for (k, v) in o.keys() {
                text.push_str(&format!("{k}={v}\0"));
            }
        }
        // With Seal the offer goes with T=0 so a second request can carry the confirmation.
        let transit = offer.is_none();
        self.send(&Pdu::new(
            login_req(
                transit,
                Stage::FULL_FEATURE_PHASE,
                isid,
                (self.tsih, self.cid),
                self.cmd_sn,
                1,
            ),
            Bytes::from(text),
        ))
        .await;
        let Some(Pdu {
            header: Header::LoginResponse(r),
            data,
            ..
        }) = self.recv().await
        else {
            panic!("no login response")
        };
        if r.status_class != 0 {
            return Err((r.status_class, r.status_detail));
        }
        // We declared MaxRecvDataSegmentLength=262144.
        self.codec.max_recv_data_segment_length = 262_144;
        self.tsih = r.tsih;
        let Some(offer) = offer else { return Ok(None) };
        let answer = iscsi_wire::text::parse(&data).unwrap();
        let (session, confirm) = offer
            .handle_answer_bound(
                &answer,
                &self.transcript.hash_before_last(),
                &self.transcript.hash(),
            )
            .expect("target's answer verifies");
        let text: String = confirm.iter().map(|(k, v)| format!("{k}={v}\0")).collect();
        self.send(&Pdu::new(
            login_req(
                true,
                Stage::FULL_FEATURE_PHASE,
                isid,
                (self.tsih, self.cid),
                self.cmd_sn,
                2,
            ),
            Bytes::from(text),
        ))
        .await;
        let Some(Pdu {
            header: Header::LoginResponse(r),
            ..
        }) = self.recv().await
        else {
            panic!("no final login response")
        };
        if r.status_class != 0 {
            return Err((r.status_class, r.status_detail));
        }
        assert!(r.transit && r.nsg == Stage::FULL_FEATURE_PHASE);
        self.tsih = r.tsih;
        self.record = Some(session.record_layer(&self.transcript.hash()).unwrap());
        Ok(Some(Arc::new(session)))
    }

    fn cdb10(op: u8, lba: u32, blocks: u16) -> [u8; 16] {
        let mut c = [0u8; 16];
        c[0] = op;
        c[2..6].copy_from_slice(&lba.to_be_bytes());
        c[7..9].copy_from_slice(&blocks.to_be_bytes());
        c
    }

    /// WRITE(10) with all data immediate; returns (status, sense key, asc, ascq).
    async fn write(&mut self, lba: u32, data: Bytes) -> (u8, u8, u8, u8) {
        let blocks = u16::try_from(data.len() / 512).unwrap();
        let itt = self.next_itt();
        let cmd = ScsiCommand {
            immediate: false,
            final_: true,
            read: false,
            write: true,
            attr: TaskAttr::SIMPLE,
            lun: 0,
            itt,
            expected_data_transfer_length: data.len() as u32,
            cmd_sn: self.cmd_sn,
            exp_stat_sn: 0,
            cdb: Self::cdb10(0x2a, lba, blocks),
        };
        self.cmd_sn += 1;
        self.send(&Pdu::new(cmd, data)).await;
        match self.recv().await {
            Some(Pdu {
                header: Header::ScsiResponse(r),
                data,
                ..
            }) => {
                let s = if data.len() >= 16 {
                    (data[4] & 0x0f, data[14], data[15])
                } else {
                    (0, 0, 0)
                };
                (r.status, s.0, s.1, s.2)
            }
            other => panic!("{other:?}"),
        }
    }

    /// READ(10) expecting `edtl` bytes; returns the concatenated Data-In.
    async fn read(&mut self, lba: u32, blocks: u16, edtl: u32) -> Bytes {
        let itt = self.next_itt();
        let cmd = ScsiCommand {
            immediate: false,
            final_: true,
            read: true,
            write: false,
            attr: TaskAttr::SIMPLE,
            lun: 0,
            itt,
            expected_data_transfer_length: edtl,
            cmd_sn: self.cmd_sn,
            exp_stat_sn: 0,
            cdb: Self::cdb10(0x28, lba, blocks),
        };
        self.cmd_sn += 1;
        self.send(&Pdu::new(cmd, Bytes::new())).await;
        let mut out = BytesMut::new();
        loop {
            match self.recv().await {
                Some(Pdu {
                    header: Header::DataIn(d),
                    data,
                    ..
                }) => {
                    out.extend_from_slice(&data);
                    if d.status_present {
                        assert_eq!(d.status, 0);
                        return out.freeze();
                    }
                }
                other => panic!("{other:?}"),
            }
        }
    }

    /// One command with its data-out all immediate; returns the status, the residual
    /// (positive: underflow, negative: overflow; RFC 7143 §11.4.5.1) and the Data-In.
    async fn command(&mut self, cdb: [u8; 16], edtl: u32, data_out: Bytes) -> (u8, i64, Bytes) {
        let itt = self.next_itt();
        let write = !data_out.is_empty();
        let cmd = ScsiCommand {
            immediate: false,
            final_: true,
            read: !write,
            write,
            attr: TaskAttr::SIMPLE,
            lun: 0,
            itt,
            expected_data_transfer_length: edtl,
            cmd_sn: self.cmd_sn,
            exp_stat_sn: 0,
            cdb,
        };
        self.cmd_sn += 1;
        self.send(&Pdu::new(cmd, data_out)).await;
        let residual = |under: bool, over: bool, count: u32| match (under, over) {
            (true, _) => i64::from(count),
            (_, true) => -i64::from(count),
            _ => 0,
        };
        let mut data_in = BytesMut::new();
        loop {
            match self.recv().await {
                Some(Pdu {
                    header: Header::DataIn(d),
                    data,
                    ..
                }) => {
                    data_in.extend_from_slice(&data);
                    if d.status_present {
                        let r = residual(d.underflow, d.overflow, d.residual_count);
                        return (d.status, r, data_in.freeze());
                    }
                }
                Some(Pdu {
                    header: Header::ScsiResponse(r),
                    ..
                }) => {
                    let res = residual(r.underflow, r.overflow, r.residual_count);
                    return (r.status, res, data_in.freeze());
                }
                other => panic!("{other:?}"),
            }
        }
    }

    fn next_itt(&mut self) -> u32 {
        self.itt += 1;
        self.itt
    }
}

fn payload() -> Vec<u8> {
    let mut p = vec![0u8; 8192];
    for (i, b) in p.iter_mut().enumerate() {
        *b = (i * 31 % 251) as u8;
    }
    p[100..100 + MARKER.len()].copy_from_slice(MARKER);
    p
}

fn contains(hay: &[u8], needle: &[u8]) -> bool {
    hay.windows(needle.len()).any(|w| w == needle)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sealed_write_and_read_round_trip_without_plaintext_on_the_wire() {
    let t = start(SealPolicy::Allowed).await;
    let mut c = Client::connect(t.addrs[0]).await;
    let session = c
        .login(Some(Cipher::Aes256Gcm))
        .await
        .unwrap()
        .expect("a Seal session");
    let plain = payload();
    let itt = c.itt + 1;
    let mut buf = BytesMut::with_capacity(session.sealed_len(plain.len()).unwrap());
    buf.extend_from_slice(&plain);
    let cdb = Client::cdb10(0x2a, 64, 16);
    let sealed = session.seal(&bind(0, itt, &cdb), buf).unwrap();
    assert!(!contains(&sealed, MARKER), "the client sends no plaintext");
    assert_eq!(
        c.write(64, sealed).await,
        (0, 0, 0, 0),
        "sealed write accepted"
    );

    let edtl = session.sealed_len(plain.len()).unwrap() as u32;
    let itt = c.itt + 1;
    let got = c.read(64, 16, edtl).await;
    assert!(
        !contains(&c.seen, MARKER),
        "the target sent the marker in clear"
    );
    let cdb = Client::cdb10(0x28, 64, 16);
    let opened = session
        .open(&bind(0, itt, &cdb), BytesMut::from(&got[..]))
        .unwrap();
    assert_eq!(&opened[..], &plain[..], "read back what was written");
    t.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tampered_sealed_write_is_refused_and_leaves_the_lun_unchanged() {
    let t = start(SealPolicy::Allowed).await;
    let mut c = Client::connect(t.addrs[0]).await;
    let session = c
        .login(Some(Cipher::ChaCha20Poly1305))
        .await
        .unwrap()
        .expect("a Seal session");
    let seal_write = |itt: u32, lba: u32, data: &[u8]| {
        let mut buf = BytesMut::with_capacity(session.sealed_len(data.len()).unwrap());
        buf.extend_from_slice(data);
        session
            .seal(
                &bind(0, itt, &Client::cdb10(0x2a, lba, (data.len() / 512) as u16)),
                buf,
            )
            .unwrap()
    };
    let old = vec![0x11u8; 4096];
    let s = seal_write(c.itt + 1, 8, &old);
    assert_eq!(c.write(8, s).await.0, 0);

    // Flip one byte of a new sealed write: CHECK CONDITION, ABORTED COMMAND, 74h/04h.
    let new = vec![0x22u8; 4096];
    let mut s = seal_write(c.itt + 1, 8, &new).to_vec();
    s[10] ^= 0x01;
    assert_eq!(c.write(8, Bytes::from(s)).await, (2, 0x0b, 0x74, 0x04));

    // A genuine write sealed for LBA 8, replayed at LBA 16 (relocation): refused.
    let moved = seal_write(c.itt + 1, 8, &new);
    assert_eq!(
        c.write(16, moved).await,
        (2, 0x0b, 0x74, 0x04),
        "relocated chunk refused"
    );

    // The session goes on, and the LUN still holds the old data.
    let edtl = session.sealed_len(4096).unwrap() as u32;
    let itt = c.itt + 1;
    let got = c.read(8, 8, edtl).await;
    let plain = session
        .open(
            &bind(0, itt, &Client::cdb10(0x28, 8, 8)),
            BytesMut::from(&got[..]),
        )
        .unwrap();
    assert_eq!(&plain[..], &old[..]);
    t.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn policy_required_refuses_a_plain_login_and_allowed_admits_it() {
    let t = start(SealPolicy::Required).await;
    let mut c = Client::connect(t.addrs[0]).await;
    assert_eq!(
        c.login(None).await.unwrap_err(),
        (2, 2),
        "authorization failure"
    );
    let mut c = Client::connect(t.addrs[0]).await;
    assert!(c.login(Some(Cipher::Aes256Gcm)).await.unwrap().is_some());
    t.shutdown().await.unwrap();

    let t = start(SealPolicy::Allowed).await;
    let mut c = Client::connect(t.addrs[0]).await;
    assert!(
        c.login(None).await.unwrap().is_none(),
        "a plaintext session"
    );
    t.shutdown().await.unwrap();
}

/// Issue 14: an immediate WRITE SAME(16) NDOB=1 has no data to seal; injected into a sealed
/// session it must not run. The target drops the connection, counts the forgery, and a new
/// sealed session reads the old data back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rejects_an_injected_write_same_ndob_and_keeps_the_lun() {
    let t = start(SealPolicy::Required).await;
    let mut c = Client::connect(t.addrs[0]).await;
    let session = c.login(Some(Cipher::Aes256Gcm)).await.unwrap().unwrap();
    let old = vec![0x33u8; 4096];
    let mut buf = BytesMut::with_capacity(session.sealed_len(old.len()).unwrap());
    buf.extend_from_slice(&old);
    let itt = c.itt + 1;
    let sealed = session
        .seal(&bind(0, itt, &Client::cdb10(0x2a, 0, 8)), buf)
        .unwrap();
    assert_eq!(c.write(0, sealed).await.0, 0);

    let mut cdb = [0u8; 16];
    cdb[0] = 0x93; // WRITE SAME(16)
    cdb[1] = 0x01; // NDOB: no data, write zeros
    cdb[10..14].copy_from_slice(&32768u32.to_be_bytes());
    let wipe = ScsiCommand {
        immediate: true,
        final_: true,
        read: false,
        write: false,
        attr: TaskAttr::SIMPLE,
        lun: 0,
        itt: 0x7777,
        expected_data_transfer_length: 0,
        cmd_sn: c.cmd_sn,
        exp_stat_sn: 0,
        cdb,
    };
    c.send_raw(&Pdu::new(wipe, Bytes::new())).await;
    assert!(c.recv().await.is_none(), "the connection stays open");
    assert_eq!(t.limit_stats().forged_pdus, 1);

    let mut c = Client::connect(t.addrs[0]).await;
    let session = c.login(Some(Cipher::Aes256Gcm)).await.unwrap().unwrap();
    let edtl = session.sealed_len(4096).unwrap() as u32;
    let itt = c.itt + 1;
    let got = c.read(0, 8, edtl).await;
    let plain = session
        .open(
            &bind(0, itt, &Client::cdb10(0x28, 0, 8)),
            BytesMut::from(&got[..]),
        )
        .unwrap();
    assert_eq!(&plain[..], &old[..], "the LUN was wiped");
    t.shutdown().await.unwrap();
}

/// Issue 32: a sealed session applies the overflow rules a plain one does (RFC 7143
/// §11.4.5.1), in plaintext bytes: a WRITE(10) of 4 blocks whose EDTL seals 2 blocks and 100
/// bytes writes the 2 whole blocks (FCP-4 option (a)), reports an overflow of 924 bytes and
/// leaves the rest of the extent alone. Before, the target refused any EDTL that was not the
/// sealed size of the CDB's transfer, so a plain host behind a gateway failed libiscsi's
/// residual tests.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn accepts_a_sealed_write_overflow_and_writes_only_the_whole_blocks_edtl_covers() {
    let t = start(SealPolicy::Required).await;
    let mut c = Client::connect(t.addrs[0]).await;
    let session = c.login(Some(Cipher::Aes256Gcm)).await.unwrap().unwrap();
    let plain = payload();
    let cdb = Client::cdb10(0x2a, 300, 4);
    let itt = c.itt + 1;
    let sealed = session
        .seal(&bind(0, itt, &cdb), BytesMut::from(&plain[..1124]))
        .unwrap();
    let edtl = sealed.len() as u32;
    let (status, residual, _) = c.command(cdb, edtl, sealed).await;
    assert_eq!((status, residual), (0, -924), "GOOD, overflow 2048 - 1124");

    // Read the 4 blocks back whole: 2 written, 2 still zero.
    let cdb = Client::cdb10(0x28, 300, 4);
    let itt = c.itt + 1;
    let edtl = session.sealed_len(2048).unwrap() as u32;
    let (status, residual, got) = c.command(cdb, edtl, Bytes::new()).await;
    assert_eq!((status, residual), (0, 0));
    let opened = session
        .open(&bind(0, itt, &cdb), BytesMut::from(&got[..]))
        .unwrap();
    assert_eq!(
        &opened[..1024],
        &plain[..1024],
        "the whole blocks EDTL covered"
    );
    assert!(opened[1024..].iter().all(|b| *b == 0), "nothing past them");
    t.shutdown().await.unwrap();
}

/// Issue 32: a sealed WRITE(10) of 1 block whose EDTL seals 2 blocks writes the one block
/// and reports an underflow of 512 plaintext bytes, as a plain session does.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn accepts_a_sealed_write_underflow_and_reports_it_in_plaintext_bytes() {
    let t = start(SealPolicy::Required).await;
    let mut c = Client::connect(t.addrs[0]).await;
    let session = c.login(Some(Cipher::Aes256Gcm)).await.unwrap().unwrap();
    let plain = payload();
    let cdb = Client::cdb10(0x2a, 400, 1);
    let itt = c.itt + 1;
    let sealed = session
        .seal(&bind(0, itt, &cdb), BytesMut::from(&plain[..1024]))
        .unwrap();
    let edtl = sealed.len() as u32;
    let (status, residual, _) = c.command(cdb, edtl, sealed).await;
    assert_eq!((status, residual), (0, 512), "GOOD, underflow 1024 - 512");
    t.shutdown().await.unwrap();
}

/// Issue 32: a sealed READ(10) of 2 blocks whose EDTL seals 200 bytes gets those 200 bytes,
/// sealed so they open (the plaintext is cut before sealing, never the sealed data after),
/// and an overflow of 824 plaintext bytes. Before, the target sealed all 1024 bytes and cut
/// the sealed data to EDTL: nothing the initiator could open.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn accepts_a_sealed_read_overflow_cut_in_plaintext_before_sealing() {
    let t = start(SealPolicy::Required).await;
    let mut c = Client::connect(t.addrs[0]).await;
    let session = c.login(Some(Cipher::Aes256Gcm)).await.unwrap().unwrap();
    let plain = payload();
    let cdb = Client::cdb10(0x2a, 500, 2);
    let itt = c.itt + 1;
    let sealed = session
        .seal(&bind(0, itt, &cdb), BytesMut::from(&plain[..1024]))
        .unwrap();
    let edtl = sealed.len() as u32;
    assert_eq!(c.command(cdb, edtl, sealed).await.0, 0);

    let cdb = Client::cdb10(0x28, 500, 2);
    let itt = c.itt + 1;
    let edtl = session.sealed_len(200).unwrap() as u32;
    let (status, residual, got) = c.command(cdb, edtl, Bytes::new()).await;
    assert_eq!((status, residual), (0, -824), "GOOD, overflow 1024 - 200");
    let opened = session
        .open(&bind(0, itt, &cdb), BytesMut::from(&got[..]))
        .expect("the Data-In opens");
    assert_eq!(&opened[..], &plain[..200]);
    t.shutdown().await.unwrap();
}

/// The binding both sides compute for a command's data (docs/seal.md §4).
fn bind(lun: u64, itt: u32, cdb: &[u8]) -> ipsan_seal::Binding {
    ipsan_seal::Binding::of_command(lun, itt, cdb[0], ipsan_scsi::cdb::extent(cdb))
}

/// Issue 28: a sealed session of two connections. Each connection runs its own Seal login
/// (its own CPace, keys and counters): data written sealed under the first connection's keys
/// reads back sealed under the second's, and neither key opens the other's data. A connection
/// that tries to join the sealed session without Seal (its ISID and TSIH are in clear in every
/// login header, so anyone on the path has them) is refused: 0x0201, it proved less than the
/// session did (MaxConnections 3, so the refusal is the authentication's, not the limit's).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn accepts_a_second_sealed_connection_with_its_own_keys_and_refuses_a_plain_one() {
    let t = start(SealPolicy::Allowed).await;
    let mut a = Client::connect(t.addrs[0]).await;
    a.extra = "MaxConnections=3\0";
    let sa = a.login(Some(Cipher::Aes256Gcm)).await.unwrap().unwrap();
    assert_ne!(a.tsih, 0);
    let mut b = Client::connect(t.addrs[0]).await;
    (b.tsih, b.cid) = (a.tsih, 1);
    let sb = b.login(Some(Cipher::Aes256Gcm)).await.unwrap().unwrap();
    // The target adds the connection right after its login response: wait for it (bounded).
    let mut n = 0;
    for _ in 0..200 {
        n = t.registry().sessions()[0].connections;
        if n == 2 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(n, 2, "one session of two connections");

    let mut plain_conn = Client::connect(t.addrs[0]).await;
    (plain_conn.tsih, plain_conn.cid) = (a.tsih, 2);
    assert_eq!(
        plain_conn.login(None).await.unwrap_err(),
        (2, 1),
        "a plaintext connection into a sealed session"
    );

    let plain = payload();
    let itt = a.itt + 1;
    let cdb = Client::cdb10(0x2a, 96, 16);
    let mut buf = BytesMut::with_capacity(sa.sealed_len(plain.len()).unwrap());
    buf.extend_from_slice(&plain);
    let sealed = sa.seal(&bind(0, itt, &cdb), buf).unwrap();
    assert_eq!(a.write(96, sealed).await, (0, 0, 0, 0), "written over a");

    // One CmdSN window: b goes on where a stopped.
    b.cmd_sn = a.cmd_sn;
    b.itt = a.itt + 10;
    let edtl = sb.sealed_len(plain.len()).unwrap() as u32;
    let itt = b.itt + 1;
    let got = b.read(96, 16, edtl).await;
    let cdb = Client::cdb10(0x28, 96, 16);
    assert!(
        sa.open(&bind(0, itt, &cdb), BytesMut::from(&got[..]))
            .is_err(),
        "a's keys open b's data"
    );
    let opened = sb
        .open(&bind(0, itt, &cdb), BytesMut::from(&got[..]))
        .unwrap();
    assert_eq!(&opened[..], &plain[..], "read back over b what a wrote");
    assert!(!contains(&b.seen, MARKER), "no plaintext on the wire");
    t.shutdown().await.unwrap();
}

/// Issue 28: every connection of a session seals alike (a command held on one connection may
/// be sized while another's PDU is handled, and sealed sizes depend on the cipher and chunk
/// size): a sealed connection joining a plaintext session is refused (0x0200).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rejects_a_sealed_connection_joining_a_plaintext_session() {
    let t = start(SealPolicy::Allowed).await;
    let mut a = Client::connect(t.addrs[0]).await;
    a.extra = "MaxConnections=2\0";
    assert!(a.login(None).await.unwrap().is_none());
    assert_ne!(a.tsih, 0);
    let mut b = Client::connect(t.addrs[0]).await;
    (b.tsih, b.cid) = (a.tsih, 1);
    assert_eq!(b.login(Some(Cipher::Aes256Gcm)).await.unwrap_err(), (2, 0));
    let mut c = Client::connect(t.addrs[0]).await;
    (c.tsih, c.cid) = (a.tsih, 1);
    assert!(
        c.login(None).await.unwrap().is_none(),
        "a plaintext one joins"
    );
    t.shutdown().await.unwrap();
}

/// Issue 28: whether a session is full is said only to a connection that authenticated. The
/// ISID, TSIH and initiator name are in clear in every login header, so an attacker on the
/// path has them; joining a full session (MaxConnections=1, its one connection open) without
/// the secret must answer exactly as joining a session that does not exist, not 0x0206 "too
/// many connections" ahead of Seal's proof. The session's own initiator, proving the secret,
/// still hears 0x0206, and the session goes on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rejects_an_unauthenticated_join_to_a_full_session_exactly_as_one_to_no_session() {
    let t = start(SealPolicy::Required).await;
    let addr = t.addrs[0];
    let mut a = Client::connect(addr).await;
    a.login(Some(Cipher::Aes256Gcm)).await.unwrap().unwrap();
    let tsih = a.tsih;
    assert_ne!(tsih, 0);

    // The attacker: no secret, so no Seal offer (a raw login straight to full feature phase).
    let mut to_full = Client::connect(addr).await;
    (to_full.tsih, to_full.cid) = (tsih, 1);
    let full = to_full.login(None).await.unwrap_err();
    let mut to_none = Client::connect(addr).await;
    let missing = if tsih == u16::MAX { 1 } else { tsih + 1 };
    (to_none.tsih, to_none.cid) = (missing, 1);
    let none = to_none.login(None).await.unwrap_err();
    assert_eq!(
        full, none,
        "an unauthenticated join tells a full session from no session"
    );
    assert_ne!(full, (2, 6), "0x0206 before authentication");

    // Proving the secret, the session's initiator learns the session is full.
    let mut b = Client::connect(addr).await;
    (b.tsih, b.cid) = (tsih, 1);
    assert_eq!(
        b.login(Some(Cipher::Aes256Gcm)).await.unwrap_err(),
        (2, 6),
        "an authenticated join to a full session: too many connections"
    );
    assert_eq!(t.registry().sessions().len(), 1);
    assert_eq!(t.registry().sessions()[0].connections, 1);
    t.shutdown().await.unwrap();
}
