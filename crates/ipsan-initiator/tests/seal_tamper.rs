//! Issue 14's evidence: a PDU-aware tampering relay between ipsan's initiator and target
//! (in-process, loopback) attacks every kind of PDU of a sealed session in both directions —
//! flips header, CDB, status and sense bytes; injects forged PDUs (immediate WRITE SAME NDOB,
//! ABORT TASK, LUN RESET, SCSI Response GOOD, NOP-In, Logout Response...); drops, replays and
//! swaps PDUs. Every case must be detected (the target's forged-PDU counter or the initiator's
//! `Error::SealForgery`), nothing forged may act (the LUN, read back through a fresh sealed
//! session, holds what the genuine commands wrote, never the attacker's zeros), no operation
//! reports a silent success, and the target keeps serving another session throughout.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use common::{bounded, config, seal_request, seal_target};
use ipsan_initiator::{Error, IscsiUrl, LoginOptions, Session, SessionConfig};
use ipsan_seal::{Cipher, SealPolicy};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::OwnedWriteHalf;
use tokio::net::{TcpListener, TcpStream};

const IQN: &str = "iqn.2026-11.org.ipsan:seal-tamper";
const SECRET: &[u8] = b"seal-tamper-pre-shared-secret-0123456789";

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Dir {
    I2T,
    T2I,
}

/// What the relay does to the chosen PDU.
#[derive(Clone, Debug)]
enum Act {
    /// XOR 0x01 into the byte at this offset of the BHS (48..: the data segment after the AHS).
    Flip(usize),
    /// XOR 0x01 into the byte at this offset of the data segment (sense data, ...).
    FlipData(usize),
    Drop,
    Replay,
    /// Hold it and send the next PDU of the same direction first.
    Swap,
    /// Send this forged BHS first, same direction; `copy_tag`: with the Seal AHS of the last
    /// genuine PDU of that direction attached (a replayed tag), else bare. Bytes 24..28 (CmdSN)
    /// and 20..24 (referenced task tag) are copied from the chosen PDU when `fill` is set.
    Inject {
        bhs: [u8; 48],
        copy_tag: bool,
        fill: bool,
    },
    /// Drop the chosen SCSI Command and answer it to the initiator with a forged GOOD SCSI
    /// Response carrying its ITT (the "acknowledged write vanishes" attack).
    AnswerGood {
        copy_tag: bool,
    },
    /// Replace `from` by `to` (same length) in the PDU, if it occurs there; a PDU without it
    /// does not count as the chosen one.
    Edit {
        from: Vec<u8>,
        to: Vec<u8>,
    },
    /// Flip this byte of the final Login Response (T=1, NSG=3) only.
    FlipFinalLogin(usize),
}

#[derive(Clone, Debug)]
struct Rule {
    dir: Dir,
    opcode: u8,
    act: Act,
}

#[derive(Default)]
struct Shared {
    rule: Option<Rule>,
    fired: bool,
    last_tag: [Option<Vec<u8>>; 2],
}

fn frame_len(buf: &[u8]) -> Option<usize> {
    if buf.len() < 48 {
        return None;
    }
    let ahs = usize::from(buf[4]) * 4;
    let dsl = (usize::from(buf[5]) << 16) | (usize::from(buf[6]) << 8) | usize::from(buf[7]);
    let n = 48 + ahs + dsl.div_ceil(4) * 4;
    (buf.len() >= n).then_some(n)
}

/// The last AHS of a frame, if it is a 20-byte Seal AHS.
fn seal_ahs(f: &[u8]) -> Option<Vec<u8>> {
    let ahs = usize::from(f[4]) * 4;
    (ahs >= 20).then(|| f[48 + ahs - 20..48 + ahs].to_vec())
}

fn with_tag(bhs: [u8; 48], tag: Option<&Vec<u8>>) -> Vec<u8> {
    let mut f = bhs.to_vec();
    if let Some(t) = tag {
        f[4] = 5;
        f.extend_from_slice(t);
    }
    f
}

type Writer = Arc<tokio::sync::Mutex<OwnedWriteHalf>>;

async fn pump(
    mut from: tokio::net::tcp::OwnedReadHalf,
    to: Writer,
    back: Writer,
    dir: Dir,
    shared: Arc<Mutex<Shared>>,
) {
    let mut buf: Vec<u8> = Vec::new();
    let mut held: Option<Vec<u8>> = None;
    let mut chunk = vec![0u8; 65536];
    loop {
        let n = match from.read(&mut chunk).await {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        buf.extend_from_slice(&chunk[..n]);
        while let Some(len) = frame_len(&buf) {
            let mut f: Vec<u8> = buf.drain(..len).collect();
            let mut out: Vec<Vec<u8>> = Vec::new();
            let mut answer: Option<Vec<u8>> = None;
            {
                let mut s = shared.lock().unwrap();
                let idx = usize::from(dir == Dir::T2I);
                let hit = !s.fired
                    && s.rule.as_ref().is_some_and(|r| {
                        r.dir == dir
                            && r.opcode == f[0] & 0x3f
                            && match &r.act {
                                Act::Edit { from, .. } => {
                                    f.windows(from.len()).any(|w| w == from.as_slice())
                                }
                                Act::FlipFinalLogin(_) => f[1] & 0x83 == 0x83,
                                _ => true,
                            }
                    });
                let last = s.last_tag[idx].clone();
                if let Some(t) = seal_ahs(&f) {
                    s.last_tag[idx] = Some(t);
                }
                if let Some(h) = held.take() {
                    out.push(f.clone());
                    out.push(h);
                    f.clear();
                }
                if hit {
                    s.fired = true;
                    let act = s.rule.as_ref().unwrap().act.clone();
                    match act {
                        Act::Flip(at) => f[at] ^= 0x01,
                        Act::FlipData(at) => {
                            let ahs = usize::from(f[4]) * 4;
                            f[48 + ahs + at] ^= 0x01;
                        }
                        Act::Drop => f.clear(),
                        Act::Replay => out.push(f.clone()),
                        Act::Swap => {
                            held = Some(std::mem::take(&mut f));
                        }
                        Act::Inject {
                            mut bhs,
                            copy_tag,
                            fill,
                        } => {
                            if fill {
                                bhs[24..28].copy_from_slice(&f[24..28]);
                                bhs[20..24].copy_from_slice(&f[16..20]);
                            }
                            out.push(with_tag(bhs, if copy_tag { last.as_ref() } else { None }));
                        }
                        Act::FlipFinalLogin(at) => f[at] ^= 0x01,
                        Act::Edit { from, to } => {
                            if let Some(i) =
                                f.windows(from.len()).position(|w| w == from.as_slice())
                            {
                                f[i..i + to.len()].copy_from_slice(&to);
                            }
                        }
                        Act::AnswerGood { copy_tag } => {
                            let mut bhs = [0u8; 48];
                            bhs[0] = 0x21;
                            bhs[1] = 0x80;
                            bhs[16..20].copy_from_slice(&f[16..20]);
                            let t2i = s.last_tag[1].clone();
                            answer =
                                Some(with_tag(bhs, if copy_tag { t2i.as_ref() } else { None }));
                            f.clear();
                        }
                    }
                }
            }
            if !f.is_empty() {
                out.push(f);
            }
            if let Some(a) = answer {
                let _ = back.lock().await.write_all(&a).await;
            }
            let mut w = to.lock().await;
            for o in out {
                if w.write_all(&o).await.is_err() {
                    return;
                }
            }
        }
    }
    let _ = to.lock().await.shutdown().await;
}

async fn relay(to: std::net::SocketAddr, shared: Arc<Mutex<Shared>>) -> std::net::SocketAddr {
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
            tokio::spawn(pump(ar, bw.clone(), aw.clone(), Dir::I2T, shared.clone()));
            tokio::spawn(pump(br, aw, bw, Dir::T2I, shared.clone()));
        }
    });
    addr
}

fn sealed(cipher: Cipher) -> SessionConfig {
    SessionConfig {
        extension: Some(seal_request(cipher, SECRET).factory()),
        // The keepalive NOP-Out is what exposes a dropped last PDU; keep it short.
        nop_interval: Some(Duration::from_millis(500)),
        command_timeout: Some(Duration::from_secs(5)),
        // The 1 MiB write must ask for R2Ts (the R2T cases tamper with them): FirstBurstLength
        // below it, as the default was before it grew to 16 MiB.
        ..config(LoginOptions {
            first_burst_length: 256 * 1024,
            ..LoginOptions::default()
        })
    }
}

/// What the genuine commands of a case leave on the LUN.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum After {
    /// The attacked write never executed: LBA 0.. still holds A.
    Old,
    /// The attacked write executed genuinely (only its answer was attacked): B.
    New,
    /// Either, depending on timing (never anything else).
    Either,
}

/// The operations run through the relay once the rule is armed.
#[derive(Clone, Copy, Debug)]
enum Op {
    Write,
    /// Two writes in flight at once (for swaps): B at 0 and B at 256.
    TwoWrites,
    /// A 1 MiB write: R2T and Data-Out.
    BigWrite,
    ReadBeyondEnd,
    /// READ of LBA 0..128 (Data-In).
    Read,
    LunReset,
    /// Only keepalives cross.
    Idle,
    Logout,
}

const A: u8 = 0xa1;
const B: u8 = 0xb2;

fn bhs(op: u8, f1: u8, itt: u32) -> [u8; 48] {
    let mut b = [0u8; 48];
    b[0] = op;
    b[1] = f1;
    b[16..20].copy_from_slice(&itt.to_be_bytes());
    b
}

fn write_same_ndob() -> [u8; 48] {
    // Immediate SCSI Command, F, simple; WRITE SAME(16) NDOB=1 over 16 MiB from LBA 0.
    let mut b = bhs(0x41, 0x81, 0x7777_0001);
    b[32] = 0x93;
    b[33] = 0x01;
    b[42..46].copy_from_slice(&32768u32.to_be_bytes());
    b
}

fn tmf(function: u8) -> [u8; 48] {
    let mut b = bhs(0x42, 0x80 | function, 0x7777_0002);
    b[20..24].copy_from_slice(&0xffff_ffffu32.to_be_bytes());
    b
}

fn cases() -> Vec<(&'static str, Rule, Op, After)> {
    use Act::*;
    use Dir::*;
    let r = |dir, opcode, act| Rule { dir, opcode, act };
    let inject = |b, copy_tag| Inject {
        bhs: b,
        copy_tag,
        fill: true,
    };
    vec![
        // ---- initiator -> target ----
        (
            "flip WRITE CDB LBA",
            r(I2T, 0x01, Flip(32 + 5)),
            Op::Write,
            After::Old,
        ),
        (
            "flip WRITE opcode in CDB",
            r(I2T, 0x01, Flip(32)),
            Op::Write,
            After::Old,
        ),
        (
            "flip SCSI Command header (ITT)",
            r(I2T, 0x01, Flip(19)),
            Op::Write,
            After::Old,
        ),
        (
            "flip SCSI Command EDTL",
            r(I2T, 0x01, Flip(23)),
            Op::Write,
            After::Old,
        ),
        (
            "flip Data-Out header (offset)",
            r(I2T, 0x05, Flip(42)),
            Op::BigWrite,
            After::Old,
        ),
        (
            "flip NOP-Out header",
            r(I2T, 0x00, Flip(19)),
            Op::Idle,
            After::Old,
        ),
        (
            "flip TMF function (LUN RESET)",
            r(I2T, 0x02, Flip(1)),
            Op::LunReset,
            After::Old,
        ),
        (
            "flip Logout Request",
            r(I2T, 0x06, Flip(1)),
            Op::Logout,
            After::Old,
        ),
        ("drop WRITE", r(I2T, 0x01, Drop), Op::Write, After::Old),
        (
            "drop Data-Out",
            r(I2T, 0x05, Drop),
            Op::BigWrite,
            After::Old,
        ),
        ("replay WRITE", r(I2T, 0x01, Replay), Op::Write, After::New),
        (
            "swap two WRITEs",
            r(I2T, 0x01, Swap),
            Op::TwoWrites,
            After::Old,
        ),
        (
            "inject WRITE SAME NDOB, bare",
            r(I2T, 0x01, inject(write_same_ndob(), false)),
            Op::Write,
            After::Old,
        ),
        (
            "inject WRITE SAME NDOB, replayed tag",
            r(I2T, 0x01, inject(write_same_ndob(), true)),
            Op::Write,
            After::Old,
        ),
        (
            "inject ABORT TASK",
            r(I2T, 0x01, inject(tmf(1), false)),
            Op::Write,
            After::Old,
        ),
        (
            "inject LUN RESET",
            r(I2T, 0x01, inject(tmf(5), true)),
            Op::Write,
            After::Old,
        ),
        (
            "inject NOP-Out",
            r(I2T, 0x01, inject(bhs(0x40, 0x80, 0x7777_0003), false)),
            Op::Write,
            After::Old,
        ),
        (
            "inject Logout Request",
            r(I2T, 0x01, inject(bhs(0x46, 0x80, 0x7777_0004), true)),
            Op::Write,
            After::Old,
        ),
        // ---- target -> initiator ----
        (
            "flip SCSI Response status",
            r(T2I, 0x21, Flip(3)),
            Op::Write,
            After::New,
        ),
        (
            "flip SCSI Response header (StatSN)",
            r(T2I, 0x21, Flip(27)),
            Op::Write,
            After::New,
        ),
        (
            "flip sense data",
            r(T2I, 0x21, FlipData(2 + 2)),
            Op::ReadBeyondEnd,
            After::Old,
        ),
        (
            "flip Data-In header (offset)",
            r(T2I, 0x25, Flip(43)),
            Op::Read,
            After::Old,
        ),
        ("drop Data-In", r(T2I, 0x25, Drop), Op::Read, After::Old),
        (
            "flip R2T header (desired length)",
            r(T2I, 0x31, Flip(47)),
            Op::BigWrite,
            After::Old,
        ),
        (
            "flip NOP-In header",
            r(T2I, 0x20, Flip(27)),
            Op::Idle,
            After::Old,
        ),
        (
            "flip TMF Response",
            r(T2I, 0x22, Flip(2)),
            Op::LunReset,
            After::Old,
        ),
        (
            "flip Logout Response",
            r(T2I, 0x26, Flip(2)),
            Op::Logout,
            After::Old,
        ),
        (
            "drop SCSI Response",
            r(T2I, 0x21, Drop),
            Op::Write,
            After::New,
        ),
        (
            "replay SCSI Response",
            r(T2I, 0x21, Replay),
            Op::TwoWrites,
            After::Either,
        ),
        (
            "swap two SCSI Responses",
            r(T2I, 0x21, Swap),
            Op::TwoWrites,
            After::Either,
        ),
        (
            "forged GOOD for a dropped WRITE, bare",
            r(I2T, 0x01, AnswerGood { copy_tag: false }),
            Op::Write,
            After::Old,
        ),
        (
            "forged GOOD for a dropped WRITE, replayed tag",
            r(I2T, 0x01, AnswerGood { copy_tag: true }),
            Op::Write,
            After::Old,
        ),
        (
            "inject NOP-In",
            r(
                T2I,
                0x21,
                Inject {
                    bhs: bhs(0x20, 0x80, 0xffff_ffff),
                    copy_tag: false,
                    fill: false,
                },
            ),
            Op::Write,
            After::New,
        ),
        (
            "inject Logout Response",
            r(
                T2I,
                0x21,
                Inject {
                    bhs: bhs(0x26, 0x80, 0),
                    copy_tag: true,
                    fill: false,
                },
            ),
            Op::Write,
            After::New,
        ),
        (
            "inject SCSI Response GOOD",
            r(
                T2I,
                0x21,
                Inject {
                    bhs: bhs(0x21, 0x80, 1),
                    copy_tag: true,
                    fill: false,
                },
            ),
            Op::Write,
            After::New,
        ),
    ]
}

fn unit_attention(e: &Error) -> bool {
    e.sense()
        .is_some_and(|s| s.key == ipsan_initiator::scsi::SenseKey::UNIT_ATTENTION)
}

/// A read on the bystander session; a genuine LUN RESET (the "flip TMF Response" case)
/// leaves it a UNIT ATTENTION first (SAM-5 §5.13), which is retried.
async fn read(s: &Session, lba: u64, blocks: u32) -> bytes::BytesMut {
    for _ in 0..3 {
        match s.read(lba, blocks).await {
            Err(e) if unit_attention(&e) => continue,
            r => return r.unwrap(),
        }
    }
    panic!("unit attention three times")
}

async fn write(s: &Session, lba: u64, data: Bytes) {
    for _ in 0..3 {
        match s.write(lba, data.clone()).await {
            Err(e) if unit_attention(&e) => continue,
            r => return r.unwrap(),
        }
    }
    panic!("unit attention three times")
}

async fn run_op(s: &Session, op: Op) -> Vec<Result<(), Error>> {
    let b = Bytes::from(vec![B; 65536]);
    match op {
        Op::Write => vec![s.write(0, b).await],
        Op::TwoWrites => {
            let (x, y) = tokio::join!(s.write(0, b.clone()), s.write(256, b));
            vec![x, y]
        }
        Op::BigWrite => vec![s.write(0, Bytes::from(vec![B; 1 << 20])).await],
        Op::ReadBeyondEnd => vec![s.read(1 << 40, 8).await.map(|_| ())],
        Op::Read => vec![s.read(0, 128).await.map(|_| ())],
        Op::LunReset => vec![s.lun_reset().await],
        Op::Idle => {
            tokio::time::sleep(Duration::from_millis(1500)).await;
            vec![]
        }
        Op::Logout => vec![],
    }
}

#[test]
fn every_tampered_pdu_in_either_direction_is_detected_and_nothing_forged_acts() {
    bounded(600, async {
        let h = seal_target(IQN, SECRET, SealPolicy::Required, None).await;
        let direct = IscsiUrl::parse(&format!("iscsi://{}/{IQN}/0", h.addrs[0])).unwrap();
        let shared = Arc::new(Mutex::new(Shared::default()));
        let via = relay(h.addrs[0], shared.clone()).await;
        let url = IscsiUrl::parse(&format!("iscsi://{via}/{IQN}/0")).unwrap();
        // Another session, straight to the target, must be served throughout.
        let other = Session::open(&direct, &sealed(Cipher::Aes256Gcm))
            .await
            .unwrap();
        let a = Bytes::from(vec![A; 1 << 20]);
        let mut report = Vec::new();
        for (name, rule, op, after) in cases() {
            eprintln!("case: {name}");
            write(&other, 0, a.clone()).await;
            write(&other, 256, Bytes::from(vec![A; 65536])).await;
            let forged_before = h.limit_stats().forged_pdus;
            {
                let mut sh = shared.lock().unwrap();
                *sh = Shared::default();
            }
            let s = Session::open(&url, &sealed(Cipher::Aes256Gcm))
                .await
                .unwrap();
            shared.lock().unwrap().rule = Some(rule.clone());
            let mut results = run_op(&s, op).await;
            if matches!(op, Op::Logout) {
                results.push(s.logout().await);
            } else {
                // A follow-up command (and the keepalive) exposes what the attack left.
                tokio::time::sleep(Duration::from_millis(700)).await;
                results.push(s.read(0, 8).await.map(|_| ()));
                drop(s);
            }
            assert!(
                shared.lock().unwrap().fired,
                "{name}: the relay never fired"
            );
            let forged_seen = results
                .iter()
                .any(|r| matches!(r, Err(Error::SealForgery(_))));
            // The target counts what it detects; give it a moment to notice a dropped tail.
            let mut target_seen = false;
            for _ in 0..40 {
                target_seen = h.limit_stats().forged_pdus > forged_before;
                if target_seen || forged_seen {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            assert!(
                forged_seen || target_seen,
                "{name}: not detected: {results:?}"
            );
            assert!(
                results.iter().any(Result::is_err),
                "{name}: every operation reported success: {results:?}"
            );
            match rule.dir {
                Dir::I2T if !matches!(rule.act, Act::AnswerGood { .. }) => {
                    assert!(target_seen, "{name}: the target did not count it")
                }
                _ => {}
            }
            // The LUN holds only what genuine commands wrote (verified by a sealed read).
            let back = read(&other, 0, 128).await;
            let at256 = read(&other, 256, 128).await;
            let old = back.iter().all(|&x| x == A);
            let new = back.iter().all(|&x| x == B);
            match after {
                After::Old => assert!(old, "{name}: LBA 0 changed"),
                After::New => assert!(new, "{name}: the genuine write is missing"),
                After::Either => assert!(old || new, "{name}: LBA 0 is neither A nor B"),
            }
            assert!(
                at256.iter().all(|&x| x == A || x == B),
                "{name}: LBA 256 holds foreign data"
            );
            report.push(format!(
                "{name}: detected by {}",
                if forged_seen { "initiator" } else { "target" }
            ));
        }
        // Nothing was zeroed anywhere in the first MiB by the injected WRITE SAME.
        let mib = read(&other, 0, 2048).await;
        assert!(mib.iter().all(|&x| x != 0), "the LUN was zeroed");
        eprintln!("{}", report.join("\n"));
        other.logout().await.unwrap();
        h.shutdown().await.unwrap();
    });
}

/// The whole login is bound (docs/seal.md §3): a relay that edits a login key other than
/// Seal's — in a request, in the target's answer, or in the final Login Response's header —
/// fails the login, or the first command before it executes.
#[test]
fn an_edited_login_key_fails_the_login_or_the_first_command() {
    bounded(120, async {
        let h = seal_target(IQN, SECRET, SealPolicy::Required, None).await;
        let shared = Arc::new(Mutex::new(Shared::default()));
        let via = relay(h.addrs[0], shared.clone()).await;
        let url = IscsiUrl::parse(&format!("iscsi://{via}/{IQN}/0")).unwrap();
        let edit = |dir, opcode, from: &str, to: &str| Rule {
            dir,
            opcode,
            act: Act::Edit {
                from: from.as_bytes().to_vec(),
                to: to.as_bytes().to_vec(),
            },
        };
        let cases = [
            // The initiator's offer of MaxBurstLength, raised on the way to the target.
            edit(
                Dir::I2T,
                0x03,
                "MaxBurstLength=16776192",
                "MaxBurstLength=16776193",
            ),
            edit(
                Dir::I2T,
                0x03,
                "MaxOutstandingR2T=16",
                "MaxOutstandingR2T=17",
            ),
            // The target's answer: MaxBurstLength lowered.
            edit(
                Dir::T2I,
                0x23,
                "MaxBurstLength=16776192",
                "MaxBurstLength=16776191",
            ),
            // The target's declared MaxRecvDataSegmentLength, shrunk.
            edit(
                Dir::T2I,
                0x23,
                "MaxRecvDataSegmentLength=262144",
                "MaxRecvDataSegmentLength=162144",
            ),
        ];
        for rule in cases {
            *shared.lock().unwrap() = Shared {
                rule: Some(rule.clone()),
                ..Shared::default()
            };
            let r = Session::open(&url, &sealed(Cipher::Aes256Gcm)).await;
            assert!(shared.lock().unwrap().fired, "{rule:?}: never fired");
            let e = r
                .err()
                .unwrap_or_else(|| panic!("{rule:?}: the login succeeded"));
            let bound = match &e {
                Error::LoginRefused {
                    class: 2,
                    detail: 2,
                    ..
                } => true,
                Error::Login(m) => m.contains("key confirmation failed"),
                _ => false,
            };
            assert!(bound, "{rule:?}: failed for another reason: {e}");
        }
        // Each refused login got the target's Seal answer without proving the secret: to the
        // target a failed guess, counted toward the lockout (docs/seal.md §2), which now covers
        // this name from here; the last case logs in under another name.
        assert!(
            h.limit_stats().auth_failures >= 4,
            "refused logins not counted"
        );
        let mut other = sealed(Cipher::Aes256Gcm);
        other.login.initiator_name.push_str("-final");
        // The final Login Response: flip MaxCmdSN (no confirmation follows it): the login
        // completes, the first command (READ CAPACITY) fails before it executes, the target
        // counts it.
        let before = h.limit_stats().forged_pdus;
        *shared.lock().unwrap() = Shared {
            rule: Some(Rule {
                dir: Dir::T2I,
                opcode: 0x23,
                act: Act::FlipFinalLogin(35),
            }),
            ..Shared::default()
        };
        let r = Session::open(&url, &other).await;
        assert!(shared.lock().unwrap().fired, "final response never seen");
        assert!(
            r.is_err(),
            "a session with an edited login response completed a command"
        );
        for _ in 0..50 {
            if h.limit_stats().forged_pdus > before {
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        assert!(
            h.limit_stats().forged_pdus > before,
            "the target did not detect it"
        );
        h.shutdown().await.unwrap();
    });
}

/// The control: the same relay wipes a LUN through a *plain* session (what issue 14 found
/// in sealed sessions before record protection), so the sealed cases above test a real attack.
#[test]
fn the_relay_wipes_a_lun_through_a_plain_session() {
    bounded(60, async {
        let h = seal_target(IQN, SECRET, SealPolicy::Allowed, None).await;
        let shared = Arc::new(Mutex::new(Shared::default()));
        let via = relay(h.addrs[0], shared.clone()).await;
        let url = IscsiUrl::parse(&format!("iscsi://{via}/{IQN}/0")).unwrap();
        let s = Session::open(&url, &config(LoginOptions::default()))
            .await
            .unwrap();
        s.write(256, Bytes::from(vec![A; 65536])).await.unwrap();
        shared.lock().unwrap().rule = Some(Rule {
            dir: Dir::I2T,
            opcode: 0x01,
            act: Act::Inject {
                bhs: write_same_ndob(),
                copy_tag: false,
                fill: true,
            },
        });
        let _ = s.write(0, Bytes::from(vec![B; 65536])).await;
        drop(s);
        let direct = IscsiUrl::parse(&format!("iscsi://{}/{IQN}/0", h.addrs[0])).unwrap();
        let check = Session::open(&direct, &config(LoginOptions::default()))
            .await
            .unwrap();
        let at256 = read(&check, 256, 128).await;
        assert!(at256.iter().all(|&x| x == 0), "the plain LUN was not wiped");
        check.logout().await.unwrap();
        h.shutdown().await.unwrap();
    });
}

#[test]
fn a_plain_session_through_the_relay_still_works() {
    bounded(60, async {
        let h = seal_target(IQN, SECRET, SealPolicy::Allowed, None).await;
        let shared = Arc::new(Mutex::new(Shared::default()));
        let via = relay(h.addrs[0], shared).await;
        let url = IscsiUrl::parse(&format!("iscsi://{via}/{IQN}/0")).unwrap();
        let s = Session::open(&url, &config(LoginOptions::default()))
            .await
            .unwrap();
        s.write(0, Bytes::from(vec![7u8; 65536])).await.unwrap();
        assert!(s.read(0, 128).await.unwrap().iter().all(|&x| x == 7));
        s.logout().await.unwrap();
        h.shutdown().await.unwrap();
    });
}

/// The header digest covers the Seal AHS like any AHS (RFC 7143 §11.2.1.2): a sealed session
/// with both CRC32C digests works end to end.
#[test]
fn a_sealed_session_with_digests_round_trips() {
    bounded(60, async {
        let h = seal_target(IQN, SECRET, SealPolicy::Required, None).await;
        let url = IscsiUrl::parse(&format!("iscsi://{}/{IQN}/0", h.addrs[0])).unwrap();
        let mut cfg = sealed(Cipher::Aes256Gcm);
        cfg.login.digest = ipsan_initiator::login::DigestChoice::Both;
        let s = Session::open(&url, &cfg).await.unwrap();
        assert!(s.params().header_digest && s.params().data_digest);
        s.write(0, Bytes::from(vec![9u8; 1 << 20])).await.unwrap();
        assert!(s.read(0, 2048).await.unwrap().iter().all(|&x| x == 9));
        s.lun_reset().await.unwrap();
        s.logout().await.unwrap();
        h.shutdown().await.unwrap();
    });
}
