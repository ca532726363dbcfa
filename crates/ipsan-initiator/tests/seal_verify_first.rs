//! Issue 31 item 3's evidence: on a sealed connection no byte of a PDU is interpreted beyond
//! framing before its record tag verifies, and every failure drops the connection in both
//! roles (docs/seal.md §4a). A relay on the path (the one of `seal_tamper.rs`, taught the
//! CRC32C digests) injects what the codec used to act on before the record check: a bare BHS
//! with an undefined opcode, and PDUs with a bad data digest carrying a victim's ITT. The
//! control case shows a plain session keeps RFC 7143's answer (a Reject, §11.17).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use common::{bounded, config, seal_target};
use ipsan_initiator::login::DigestChoice;
use ipsan_initiator::seal::SealRequest;
use ipsan_initiator::{Error, IscsiUrl, LoginOptions, Session, SessionConfig};
use ipsan_seal::{Cipher, CryptoPool, Forgery, Psk, SealPolicy};
use iscsi_wire::digest::{crc32c, to_wire};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::OwnedWriteHalf;
use tokio::net::{TcpListener, TcpStream};

const IQN: &str = "iqn.2026-11.org.ipsan:seal-verify-first";
const SECRET: &[u8] = b"seal-verify-first-pre-shared-secret-0123";
const A: u8 = 0xa1;
const B: u8 = 0xb2;
/// Reject's opcode (RFC 7143 §11.17).
const REJECT: u8 = 0x3f;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Dir {
    I2T,
    T2I,
}

/// The relay's one attack: next to the first full-feature PDU of `opcode` going `dir`, send
/// `bhs` + `data` the same way, bare (no Seal AHS), framed with the negotiated digests: a
/// correct header digest, and a data digest that is wrong when `bad_data_digest` is set.
#[derive(Clone, Debug)]
struct Inject {
    dir: Dir,
    opcode: u8,
    /// Before the chosen PDU (else right after it).
    before: bool,
    bhs: [u8; 48],
    data: Vec<u8>,
    bad_data_digest: bool,
    /// Copy the chosen PDU's ITT (bytes 16..20) into the injected one.
    victim_itt: bool,
}

#[derive(Default)]
struct State {
    /// The digests the session negotiates (the relay frames with them after the login).
    header_digest: bool,
    data_digest: bool,
    rule: Option<Inject>,
    fired: bool,
    /// Opcodes of the target's PDUs the relay forwarded after the injection.
    t2i_after: Vec<u8>,
    /// End of stream seen on each side, in order: which side closed first.
    eofs: Vec<Dir>,
}

fn frame_len(buf: &[u8], hd: bool, dd: bool) -> Option<usize> {
    if buf.len() < 48 {
        return None;
    }
    let ahs = usize::from(buf[4]) * 4;
    let dsl = (usize::from(buf[5]) << 16) | (usize::from(buf[6]) << 8) | usize::from(buf[7]);
    let n =
        48 + ahs + if hd { 4 } else { 0 } + dsl.div_ceil(4) * 4 + if dd && dsl > 0 { 4 } else { 0 };
    (buf.len() >= n).then_some(n)
}

/// A whole PDU as a peer with these digests would frame it (RFC 7143 §11.2, §13.1).
fn wire(mut bhs: [u8; 48], data: &[u8], hd: bool, dd: bool, bad_dd: bool) -> Vec<u8> {
    let dsl = data.len();
    bhs[5] = (dsl >> 16) as u8;
    bhs[6] = (dsl >> 8) as u8;
    bhs[7] = dsl as u8;
    let mut f = bhs.to_vec();
    if hd {
        f.extend_from_slice(&to_wire(crc32c(&bhs)));
    }
    let start = f.len();
    f.extend_from_slice(data);
    f.resize(start + dsl.div_ceil(4) * 4, 0);
    if dd && dsl > 0 {
        let crc = crc32c(&f[start..]) ^ if bad_dd { 0x5a5a_5a5a } else { 0 };
        f.extend_from_slice(&to_wire(crc));
    }
    f
}

type Writer = Arc<tokio::sync::Mutex<OwnedWriteHalf>>;

async fn pump(
    mut from: tokio::net::tcp::OwnedReadHalf,
    to: Writer,
    dir: Dir,
    st: Arc<Mutex<State>>,
    ffp: Arc<AtomicBool>,
) {
    let mut buf: Vec<u8> = Vec::new();
    let mut chunk = vec![0u8; 65536];
    loop {
        let n = match from.read(&mut chunk).await {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        buf.extend_from_slice(&chunk[..n]);
        loop {
            let mut out: Vec<Vec<u8>> = Vec::new();
            {
                let mut s = st.lock().unwrap();
                // Digests start with the full feature phase (RFC 7143 §13.1).
                let on = ffp.load(Ordering::SeqCst);
                let (hd, dd) = (on && s.header_digest, on && s.data_digest);
                let Some(len) = frame_len(&buf, hd, dd) else {
                    break;
                };
                let f: Vec<u8> = buf.drain(..len).collect();
                if dir == Dir::T2I && f[0] & 0x3f == 0x23 && f[1] & 0x83 == 0x83 {
                    // The final Login Response: the next PDUs carry the digests.
                    ffp.store(true, Ordering::SeqCst);
                }
                if dir == Dir::T2I && s.fired {
                    s.t2i_after.push(f[0] & 0x3f);
                }
                let hit = on
                    && !s.fired
                    && s.rule
                        .as_ref()
                        .is_some_and(|r| r.dir == dir && r.opcode == f[0] & 0x3f);
                if hit {
                    s.fired = true;
                    let r = s.rule.clone().unwrap();
                    let mut bhs = r.bhs;
                    if r.victim_itt {
                        bhs[16..20].copy_from_slice(&f[16..20]);
                    }
                    let forged = wire(bhs, &r.data, hd, dd, r.bad_data_digest);
                    if r.before {
                        out.push(forged);
                        out.push(f);
                    } else {
                        out.push(f);
                        out.push(forged);
                    }
                } else {
                    out.push(f);
                }
            }
            let mut w = to.lock().await;
            for o in out {
                if w.write_all(&o).await.is_err() {
                    return;
                }
            }
        }
    }
    st.lock().unwrap().eofs.push(dir);
    let _ = to.lock().await.shutdown().await;
}

async fn relay(to: std::net::SocketAddr, st: Arc<Mutex<State>>) -> std::net::SocketAddr {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((a, _)) = l.accept().await {
            let Ok(b) = TcpStream::connect(to).await else {
                continue;
            };
            let (ar, aw) = a.into_split();
            let (br, bw) = b.into_split();
            let (aw, bw): (Writer, Writer) = (
                Arc::new(tokio::sync::Mutex::new(aw)),
                Arc::new(tokio::sync::Mutex::new(bw)),
            );
            let ffp = Arc::new(AtomicBool::new(false));
            tokio::spawn(pump(ar, bw, Dir::I2T, st.clone(), ffp.clone()));
            tokio::spawn(pump(br, aw, Dir::T2I, st.clone(), ffp));
        }
    });
    addr
}

fn sealed(digests: DigestChoice) -> SessionConfig {
    let req = SealRequest {
        ciphers: vec![Cipher::Aes256Gcm],
        chunk: ipsan_seal::DEFAULT_CHUNK,
        psk: Psk::new(SECRET.to_vec()).unwrap(),
        pool: Some(Arc::new(CryptoPool::new(1).unwrap())),
    };
    let mut cfg = SessionConfig {
        extension: Some(req.factory()),
        command_timeout: Some(Duration::from_secs(5)),
        ..config(LoginOptions::default())
    };
    cfg.login.digest = digests;
    cfg
}

fn bhs(op: u8, f1: u8, itt: u32) -> [u8; 48] {
    let mut b = [0u8; 48];
    b[0] = op;
    b[1] = f1;
    b[16..20].copy_from_slice(&itt.to_be_bytes());
    b
}

/// Immediate SCSI Command, F, simple: WRITE SAME(16) NDOB=1 over 16 MiB from LBA 0 (zeros).
fn write_same_ndob() -> [u8; 48] {
    let mut b = bhs(0x41, 0x81, 0x7777_0001);
    b[32] = 0x93;
    b[33] = 0x01;
    b[42..46].copy_from_slice(&32768u32.to_be_bytes());
    b
}

/// Waits (bounded) until the relay saw both sides close; returns the side that closed first.
async fn first_close(st: &Mutex<State>) -> Option<Dir> {
    for _ in 0..50 {
        if let Some(d) = st.lock().unwrap().eofs.first() {
            return Some(*d);
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    None
}

/// What LBA 0..128 holds, read through a sealed session straight to the target.
async fn lba0(direct: &Session) -> Vec<u8> {
    direct.read(0, 128).await.unwrap().to_vec()
}

struct Setup {
    h: ipsan_target::ServerHandle,
    direct: Session,
    st: Arc<Mutex<State>>,
    via: IscsiUrl,
}

async fn setup(policy: SealPolicy, digests: DigestChoice) -> Setup {
    let h = seal_target(IQN, SECRET, policy, None).await;
    let direct = IscsiUrl::parse(&format!("iscsi://{}/{IQN}/0", h.addrs[0])).unwrap();
    let direct = Session::open(&direct, &sealed(DigestChoice::None))
        .await
        .unwrap();
    direct.write(0, Bytes::from(vec![A; 65536])).await.unwrap();
    let st = Arc::new(Mutex::new(State {
        header_digest: digests.header(),
        data_digest: digests.data(),
        ..State::default()
    }));
    let addr = relay(h.addrs[0], st.clone()).await;
    let via = IscsiUrl::parse(&format!("iscsi://{addr}/{IQN}/0")).unwrap();
    Setup { h, direct, st, via }
}

/// A bare 48-byte BHS with opcode 0x3d (undefined in RFC 7143 §11.2.1.2), slipped into a
/// sealed session toward the target just before a genuine WRITE: the target drops the
/// connection without a word (no Reject, nothing MACed comes back), counts a forged PDU, and
/// runs nothing after it (the WRITE behind it never lands). Before the fix the target
/// answered with a well-formed, MACed Reject and went on to run the WRITE.
#[test]
fn rejects_an_injected_unknown_opcode_by_dropping_the_sealed_connection_without_a_reject() {
    bounded(60, async {
        let Setup { h, direct, st, via } = setup(SealPolicy::Required, DigestChoice::None).await;
        let s = Session::open(&via, &sealed(DigestChoice::None))
            .await
            .unwrap();
        let forged_before = h.limit_stats().forged_pdus;
        st.lock().unwrap().rule = Some(Inject {
            dir: Dir::I2T,
            opcode: 0x01,
            before: true,
            bhs: bhs(0x3d, 0x80, 0x7777_0002),
            data: Vec::new(),
            bad_data_digest: false,
            victim_itt: false,
        });
        let r = s.write(0, Bytes::from(vec![B; 65536])).await;
        let first = first_close(&st).await;
        let (fired, after) = {
            let g = st.lock().unwrap();
            (g.fired, g.t2i_after.clone())
        };
        assert!(fired, "the relay never injected");
        assert!(
            !after.contains(&REJECT),
            "the target answered the injected PDU with a Reject: {after:02x?}"
        );
        assert_eq!(
            first,
            Some(Dir::T2I),
            "the target did not drop the connection"
        );
        assert!(
            r.is_err(),
            "the WRITE behind the injected PDU reported success"
        );
        assert!(
            h.limit_stats().forged_pdus > forged_before,
            "the target did not count the injected PDU"
        );
        assert!(
            lba0(&direct).await.iter().all(|&x| x == A),
            "the target ran the WRITE that followed the injected PDU"
        );
        drop(s);
        direct.logout().await.unwrap();
        h.shutdown().await.unwrap();
    });
}

/// With data digests on, a relay injects, right behind a victim's WRITE, a SCSI Command
/// carrying the victim's ITT (an immediate WRITE SAME that would zero the LUN) with a bad data
/// digest. The target drops the connection: no Reject (whose copy of the header named the
/// victim's ITT, so the initiator ended the victim as Rejected while the target still ran
/// it), the injected command runs nothing, and the victim fails as a lost connection, never
/// as Rejected.
#[test]
fn rejects_an_injected_bad_digest_pdu_with_a_victims_itt_toward_the_target() {
    bounded(60, async {
        let Setup { h, direct, st, via } = setup(SealPolicy::Required, DigestChoice::Both).await;
        let s = Session::open(&via, &sealed(DigestChoice::Both))
            .await
            .unwrap();
        assert!(s.params().header_digest && s.params().data_digest);
        let forged_before = h.limit_stats().forged_pdus;
        st.lock().unwrap().rule = Some(Inject {
            dir: Dir::I2T,
            opcode: 0x01,
            before: false,
            bhs: write_same_ndob(),
            data: vec![0; 4],
            bad_data_digest: true,
            victim_itt: true,
        });
        let r = s.write(0, Bytes::from(vec![B; 65536])).await;
        let first = first_close(&st).await;
        let (fired, after) = {
            let g = st.lock().unwrap();
            (g.fired, g.t2i_after.clone())
        };
        assert!(fired, "the relay never injected");
        assert!(
            !matches!(r, Err(Error::Rejected(_))),
            "the victim's WRITE was ended as Rejected: {r:?}"
        );
        assert!(
            !after.contains(&REJECT),
            "the target answered the injected PDU with a Reject: {after:02x?}"
        );
        assert_eq!(
            first,
            Some(Dir::T2I),
            "the target did not drop the connection"
        );
        // The victim may have run and been answered before the injected PDU was read (an honest
        // GOOD); it never ends as Rejected, and the injected zeros never run.
        assert!(
            h.limit_stats().forged_pdus > forged_before,
            "the target did not count the injected PDU"
        );
        let back = lba0(&direct).await;
        assert!(
            back.iter().all(|&x| x == A) || back.iter().all(|&x| x == B),
            "LBA 0 holds something no genuine command wrote"
        );
        assert!(
            r.is_err() || back.iter().all(|&x| x == B),
            "the victim's WRITE reported success but did not run"
        );
        drop(s);
        direct.logout().await.unwrap();
        h.shutdown().await.unwrap();
    });
}

/// The same toward the initiator: a SCSI Response GOOD with the victim's ITT and a bad data
/// digest, injected just before the genuine one. The initiator checks the record tag first:
/// it drops the connection as for any forged PDU (`Error::SealForgery`, the tag is missing),
/// not as a digest error of a PDU it had already parsed; the genuine WRITE ran.
#[test]
fn rejects_an_injected_bad_digest_response_with_a_victims_itt_toward_the_initiator() {
    bounded(60, async {
        let Setup { h, direct, st, via } = setup(SealPolicy::Required, DigestChoice::Both).await;
        let s = Session::open(&via, &sealed(DigestChoice::Both))
            .await
            .unwrap();
        st.lock().unwrap().rule = Some(Inject {
            dir: Dir::T2I,
            opcode: 0x21,
            before: true,
            bhs: bhs(0x21, 0x80, 0),
            data: vec![0, 2, 0x70, 0],
            bad_data_digest: true,
            victim_itt: true,
        });
        let r = s.write(0, Bytes::from(vec![B; 65536])).await;
        assert!(st.lock().unwrap().fired, "the relay never injected");
        assert!(
            matches!(
                r,
                Err(Error::SealForgery(Forgery::Missing { opcode: 0x21, .. }))
            ),
            "the initiator did not drop the connection for the unverified PDU: {r:?}"
        );
        assert_eq!(first_close(&st).await, Some(Dir::I2T));
        assert!(
            lba0(&direct).await.iter().all(|&x| x == B),
            "the genuine WRITE did not run"
        );
        drop(s);
        direct.logout().await.unwrap();
        h.shutdown().await.unwrap();
    });
}

/// With session recovery on, the initiator that dropped a connection for an injected
/// bad-digest Data-In (the victim READ's ITT) logs in again and sends the READ again
/// (RFC 7143 §6.3.5 reinstatement): the caller gets the genuine data, never the injected
/// bytes and never an error.
#[test]
fn accepts_the_reissued_read_after_dropping_a_connection_for_an_injected_data_in() {
    bounded(60, async {
        let Setup { h, direct, st, via } = setup(SealPolicy::Required, DigestChoice::Both).await;
        let cfg = SessionConfig {
            recovery_timeout: Some(Duration::from_secs(20)),
            ..sealed(DigestChoice::Both)
        };
        let s = Session::open(&via, &cfg).await.unwrap();
        let mut din = bhs(0x25, 0x00, 0);
        din[20..24].copy_from_slice(&0xffff_ffffu32.to_be_bytes());
        st.lock().unwrap().rule = Some(Inject {
            dir: Dir::T2I,
            opcode: 0x25,
            before: true,
            bhs: din,
            data: vec![0; 512],
            bad_data_digest: true,
            victim_itt: true,
        });
        let back = s.read(0, 128).await.unwrap();
        assert!(st.lock().unwrap().fired, "the relay never injected");
        assert!(
            back.iter().all(|&x| x == A),
            "the READ returned foreign data"
        );
        let rs = s.recovery_stats();
        assert_eq!(rs.connection_losses, 1, "{rs:?}");
        assert_eq!(rs.recoveries, 1, "{rs:?}");
        assert!(rs.commands_reissued >= 1, "{rs:?}");
        s.logout().await.unwrap();
        direct.logout().await.unwrap();
        h.shutdown().await.unwrap();
    });
}

/// The control: a plain (unsealed) session keeps RFC 7143's behaviour. The same bare 0x3d
/// BHS gets a Reject, reason Command not supported (§11.17.1), and the session goes on: the
/// WRITE behind it lands.
#[test]
fn a_plain_session_still_answers_an_unknown_opcode_with_a_reject() {
    bounded(60, async {
        let Setup { h, direct, st, via } = setup(SealPolicy::Allowed, DigestChoice::None).await;
        let s = Session::open(&via, &config(LoginOptions::default()))
            .await
            .unwrap();
        st.lock().unwrap().rule = Some(Inject {
            dir: Dir::I2T,
            opcode: 0x01,
            before: true,
            bhs: bhs(0x3d, 0x80, 0x7777_0002),
            data: Vec::new(),
            bad_data_digest: false,
            victim_itt: false,
        });
        s.write(0, Bytes::from(vec![B; 65536])).await.unwrap();
        s.read(0, 8).await.unwrap();
        let after = st.lock().unwrap().t2i_after.clone();
        assert!(after.contains(&REJECT), "no Reject: {after:02x?}");
        assert!(lba0(&direct).await.iter().all(|&x| x == B));
        s.logout().await.unwrap();
        direct.logout().await.unwrap();
        h.shutdown().await.unwrap();
    });
}
