//! Seal end to end through iSCSI: ipsan's initiator and target, in-process, with a loopback
//! relay between them that records every byte on the wire (issue 5's evidence).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::sync::{Arc, Mutex};

use bytes::Bytes;
use common::{bounded, config, seal_target};
use ipsan_initiator::seal::SealRequest;
use ipsan_initiator::{Error, IscsiUrl, LoginOptions, Session, SessionConfig};
use ipsan_seal::{Cipher, CryptoPool, Psk, SealPolicy};
use ipsan_target::ServerHandle;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

const IQN: &str = "iqn.2026-11.org.ipsan:seal-e2e";
const SECRET: &[u8] = b"seal-e2e-pre-shared-secret-0123456789";
const MARKER: &[u8] = b"<<ipsan-plaintext-marker-must-never-cross-the-wire>>";

async fn start(policy: SealPolicy) -> ServerHandle {
    seal_target(IQN, SECRET, policy, None).await
}

/// What crossed the relay, in both directions; `flip_at` flips one byte of the
/// initiator→target stream at that offset.
#[derive(Default)]
struct Wire {
    bytes: Vec<u8>,
    flip_at: Option<usize>,
}

async fn relay(to: std::net::SocketAddr, wire: Arc<Mutex<Wire>>) -> std::net::SocketAddr {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((a, _)) = l.accept().await {
            let b = TcpStream::connect(to).await.unwrap();
            let (mut ar, mut aw) = a.into_split();
            let (mut br, mut bw) = b.into_split();
            let w1 = wire.clone();
            tokio::spawn(async move {
                let mut buf = vec![0u8; 65536];
                let mut sent = 0usize;
                while let Ok(n) = ar.read(&mut buf).await {
                    if n == 0 {
                        break;
                    }
                    {
                        let mut w = w1.lock().unwrap();
                        if let Some(at) = w.flip_at {
                            if (sent..sent + n).contains(&at) {
                                buf[at - sent] ^= 0x01;
                                w.flip_at = None;
                            }
                        }
                        w.bytes.extend_from_slice(&buf[..n]);
                    }
                    sent += n;
                    if bw.write_all(&buf[..n]).await.is_err() {
                        break;
                    }
                }
            });
            let w2 = wire.clone();
            tokio::spawn(async move {
                let mut buf = vec![0u8; 65536];
                while let Ok(n) = br.read(&mut buf).await {
                    if n == 0 {
                        break;
                    }
                    w2.lock().unwrap().bytes.extend_from_slice(&buf[..n]);
                    if aw.write_all(&buf[..n]).await.is_err() {
                        break;
                    }
                }
            });
        }
    });
    addr
}

fn sealed_config(cipher: Cipher, secret: &[u8], pipeline: bool) -> SessionConfig {
    let req = SealRequest {
        ciphers: vec![cipher],
        chunk: ipsan_seal::DEFAULT_CHUNK,
        psk: Psk::new(secret.to_vec()).unwrap(),
        pool: pipeline.then(|| Arc::new(CryptoPool::new(2).unwrap())),
    };
    SessionConfig {
        extension: Some(req.factory()),
        ..config(LoginOptions::default())
    }
}

fn data_with_marker(len: usize) -> Bytes {
    let mut d: Vec<u8> = (0..len).map(|i| (i % 253) as u8).collect();
    for at in (0..len.saturating_sub(MARKER.len())).step_by(4096) {
        d[at..at + MARKER.len()].copy_from_slice(MARKER);
    }
    Bytes::from(d)
}

fn contains(hay: &[u8], needle: &[u8]) -> bool {
    hay.windows(needle.len()).any(|w| w == needle)
}

#[test]
fn sealed_session_hides_data_on_the_wire_and_reads_it_back() {
    bounded(60, async {
        let h = start(SealPolicy::Required).await;
        let wire = Arc::new(Mutex::new(Wire::default()));
        let via = relay(h.addrs[0], wire.clone()).await;
        let url = IscsiUrl::parse(&format!("iscsi://{via}/{IQN}/0")).unwrap();
        for (cipher, pipeline) in [(Cipher::Aes256Gcm, true), (Cipher::ChaCha20Poly1305, false)] {
            let s = Session::open(&url, &sealed_config(cipher, SECRET, pipeline))
                .await
                .unwrap();
            let data = data_with_marker(256 * 1024);
            s.write(100, data.clone()).await.unwrap();
            let back = s.read(100, 512).await.unwrap();
            assert_eq!(
                &back[..],
                &data[..],
                "{cipher:?}: read back what was written"
            );
            s.logout().await.unwrap();
        }
        let seen = std::mem::take(&mut wire.lock().unwrap().bytes);
        assert!(seen.len() > 2 * 256 * 1024, "the relay saw the traffic");
        assert!(!contains(&seen, MARKER), "plaintext crossed the wire");
        h.shutdown().await.unwrap();
    });
}

#[test]
fn flipped_byte_fails_the_write_and_keeps_old_data() {
    bounded(60, async {
        let h = start(SealPolicy::Allowed).await;
        let wire = Arc::new(Mutex::new(Wire::default()));
        let via = relay(h.addrs[0], wire.clone()).await;
        let url = IscsiUrl::parse(&format!("iscsi://{via}/{IQN}/0")).unwrap();
        let s = Session::open(&url, &sealed_config(Cipher::Aes256Gcm, SECRET, true))
            .await
            .unwrap();
        let old = Bytes::from(vec![0x5au8; 65536]);
        s.write(0, old.clone()).await.unwrap();
        // Flip a byte well inside the next write's data segment (past its 48-byte header).
        let at = wire.lock().unwrap().bytes.len() + 48 + 1000;
        wire.lock().unwrap().flip_at = Some(at);
        let err = s
            .write(0, Bytes::from(vec![0xa5u8; 65536]))
            .await
            .unwrap_err();
        match &err {
            Error::Scsi {
                status: 2,
                sense: Some(sense),
            } => {
                assert_eq!(
                    (sense.key.0, sense.asc, sense.ascq),
                    (0x0b, 0x74, 0x04),
                    "{err}"
                )
            }
            other => panic!("expected CHECK CONDITION, got {other}"),
        }
        // The session goes on and the LUN holds the old data.
        let back = s.read(0, 128).await.unwrap();
        assert_eq!(&back[..], &old[..]);
        s.logout().await.unwrap();
        h.shutdown().await.unwrap();
    });
}

#[test]
fn wrong_secret_and_plain_login_are_refused_where_required() {
    bounded(60, async {
        let h = start(SealPolicy::Required).await;
        let url = IscsiUrl::parse(&format!("iscsi://{}/{IQN}/0", h.addrs[0])).unwrap();
        let wrong = Session::open(
            &url,
            &sealed_config(
                Cipher::Aes256Gcm,
                b"a-different-secret-of-enough-length",
                true,
            ),
        )
        .await;
        assert!(wrong.is_err(), "wrong pre-shared secret admitted");
        let plain = Session::open(&url, &config(LoginOptions::default())).await;
        assert!(
            plain.is_err(),
            "plaintext login admitted under seal=required"
        );
        h.shutdown().await.unwrap();
    });
}

/// A 16-byte CDB field holding `bytes` (the rest zero).
fn cdb(bytes: &[u8]) -> [u8; 16] {
    let mut c = [0u8; 16];
    c[..bytes.len()].copy_from_slice(bytes);
    c
}

/// Issue 13: the initiator once bound Seal's data to an extent of its own that knew only
/// READ/WRITE(10/16), so every other data-out command bound to LBA 0, 0 blocks while the target
/// bound the CDB's real extent, and the target refused to open the data. Each command below
/// must now be accepted and leave the blocks it addresses as the read back shows.
#[test]
fn accepts_sealed_writes_of_every_cdb_form_through_session_command() {
    use ipsan_initiator::DataDir;
    bounded(60, async {
        let h = start(SealPolicy::Required).await;
        let url = IscsiUrl::parse(&format!("iscsi://{}/{IQN}/0", h.addrs[0])).unwrap();
        let s = Session::open(&url, &sealed_config(Cipher::Aes256Gcm, SECRET, false))
            .await
            .unwrap();
        let block = 512usize;
        let fill = |b: u8, blocks: usize| Bytes::from(vec![b; blocks * block]);
        let cases: Vec<(&str, [u8; 16], Bytes, u64, Bytes)> = vec![
            // WRITE(6): LBA 10, 2 blocks.
            (
                "WRITE(6)",
                cdb(&[0x0a, 0, 0, 10, 2, 0]),
                fill(0x11, 2),
                10,
                fill(0x11, 2),
            ),
            // WRITE(12): LBA 20, 3 blocks.
            (
                "WRITE(12)",
                cdb(&[0xaa, 0, 0, 0, 0, 20, 0, 0, 0, 3, 0, 0]),
                fill(0x22, 3),
                20,
                fill(0x22, 3),
            ),
            // WRITE AND VERIFY(10): LBA 30, 2 blocks.
            (
                "WRITE AND VERIFY(10)",
                cdb(&[0x2e, 0, 0, 0, 0, 30, 0, 0, 2, 0]),
                fill(0x33, 2),
                30,
                fill(0x33, 2),
            ),
            // WRITE AND VERIFY(16): LBA 40, 2 blocks.
            (
                "WRITE AND VERIFY(16)",
                cdb(&[0x8e, 0, 0, 0, 0, 0, 0, 0, 0, 40, 0, 0, 0, 2, 0, 0]),
                fill(0x44, 2),
                40,
                fill(0x44, 2),
            ),
            // WRITE SAME(10): one block of data replicated over LBA 50..54.
            (
                "WRITE SAME(10)",
                cdb(&[0x41, 0, 0, 0, 0, 50, 0, 0, 4, 0]),
                fill(0x55, 1),
                50,
                fill(0x55, 4),
            ),
            // WRITE SAME(16): LBA 60..63.
            (
                "WRITE SAME(16)",
                cdb(&[0x93, 0, 0, 0, 0, 0, 0, 0, 0, 60, 0, 0, 0, 3, 0, 0]),
                fill(0x66, 1),
                60,
                fill(0x66, 3),
            ),
            // COMPARE AND WRITE: LBA 10's 0x11 block (written above) becomes 0x77.
            (
                "COMPARE AND WRITE",
                cdb(&[0x89, 0, 0, 0, 0, 0, 0, 0, 0, 10, 0, 0, 0, 1, 0, 0]),
                Bytes::from([vec![0x11u8; block], vec![0x77u8; block]].concat()),
                10,
                fill(0x77, 1),
            ),
        ];
        for (name, c, data, lba, want) in cases {
            s.command(c, DataDir::Write(data))
                .await
                .unwrap_or_else(|e| panic!("{name}: {e}"));
            let back = s.read(lba, (want.len() / block) as u32).await.unwrap();
            assert_eq!(
                &back[..],
                &want[..],
                "{name}: the blocks hold what was sent"
            );
        }
        s.logout().await.unwrap();
        h.shutdown().await.unwrap();
    });
}

/// Issue 28: sealed 256 KiB writes at 1 Gbit/s and 64 ms were capped at 21–27 MB/s whatever
/// the connections. Seal's tags make a 256 KiB write's data longer than 256 KiB, and the
/// initiator offered FirstBurstLength 256 KiB, so each such write waited one round trip for an
/// R2T asking for its last bytes (one R2T per write). With the default login now the whole
/// write goes unsolicited (RFC 7143 §13.14): the target sends no R2T at all.
#[test]
fn accepts_sealed_256kib_writes_without_an_r2t_round_trip() {
    bounded(60, async {
        let h = start(SealPolicy::Required).await;
        let url = IscsiUrl::parse(&format!("iscsi://{}/{IQN}/0", h.addrs[0])).unwrap();
        let s = Session::open(&url, &sealed_config(Cipher::Aes256Gcm, SECRET, true))
            .await
            .unwrap();
        let data = data_with_marker(256 * 1024);
        for k in 0..8u64 {
            s.write(k * 512, data.clone()).await.unwrap();
        }
        assert_eq!(&s.read(7 * 512, 512).await.unwrap()[..], &data[..]);
        let sessions = h.registry().sessions();
        assert_eq!(sessions.len(), 1);
        let st = &sessions[0].stats;
        assert_eq!(st.io.counts().write_commands, 8, "{:?}", st.io.counts());
        assert_eq!(
            st.r2ts.load(std::sync::atomic::Ordering::Relaxed),
            0,
            "a sealed 256 KiB write waited for an R2T"
        );
        s.logout().await.unwrap();
        h.shutdown().await.unwrap();
    });
}
