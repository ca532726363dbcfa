//! Seal at the iSCSI level (issue 8, security): (key, nonce) pairs never repeat across a
//! reconnect and a session reinstatement, and a session whose counters approach their limit is
//! asked to log out (AsyncEvent 1) and, if it reaches the limit, fails the command and loses
//! the connection. ipsan's initiator and target in-process, a recording relay on loopback.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use common::{bounded, config, seal_target};
use ipsan_initiator::seal::SealRequest;
use ipsan_initiator::{Error, IscsiUrl, LoginOptions, Session, SessionConfig};
use ipsan_seal::{Cipher, Psk, SealPolicy};
use ipsan_target::ServerHandle;
use iscsi_wire::{Codec, Header};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

const IQN: &str = "iqn.2026-11.org.ipsan:seal-nonces";
const SECRET: &[u8] = b"seal-nonces-pre-shared-secret-0123456789";

async fn start(counter_limit: Option<u64>) -> ServerHandle {
    seal_target(IQN, SECRET, SealPolicy::Required, counter_limit).await
}

/// The initiator→target bytes of every connection through the relay, one entry each.
type Recorded = Arc<Mutex<Vec<Vec<u8>>>>;

async fn relay(to: std::net::SocketAddr, rec: Recorded) -> std::net::SocketAddr {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((a, _)) = l.accept().await {
            let b = TcpStream::connect(to).await.unwrap();
            let idx = {
                let mut r = rec.lock().unwrap();
                r.push(Vec::new());
                r.len() - 1
            };
            let (mut ar, mut aw) = a.into_split();
            let (mut br, mut bw) = b.into_split();
            let rec = rec.clone();
            tokio::spawn(async move {
                let mut buf = vec![0u8; 65536];
                while let Ok(n) = ar.read(&mut buf).await {
                    if n == 0 {
                        break;
                    }
                    rec.lock().unwrap()[idx].extend_from_slice(&buf[..n]);
                    if bw.write_all(&buf[..n]).await.is_err() {
                        break;
                    }
                }
                let _ = bw.shutdown().await;
            });
            tokio::spawn(async move {
                let mut buf = vec![0u8; 65536];
                while let Ok(n) = br.read(&mut buf).await {
                    if n == 0 {
                        break;
                    }
                    if aw.write_all(&buf[..n]).await.is_err() {
                        break;
                    }
                }
                let _ = aw.shutdown().await;
            });
        }
    });
    addr
}

fn sealed_config(isid: Option<[u8; 6]>) -> SessionConfig {
    let req = SealRequest {
        ciphers: vec![Cipher::Aes256Gcm],
        chunk: ipsan_seal::DEFAULT_CHUNK,
        psk: Psk::new(SECRET.to_vec()).unwrap(),
        pool: None,
    };
    SessionConfig {
        extension: Some(req.factory()),
        ..config(LoginOptions {
            isid,
            ..LoginOptions::default()
        })
    }
}

/// The sealed data-out of every write command on one recorded connection (immediate data and
/// Data-Out reassembled by offset), in command order. The tests negotiate no digests.
fn sealed_writes(stream: &[u8]) -> Vec<Vec<u8>> {
    let codec = Codec {
        max_recv_data_segment_length: 16 << 20,
        ..Codec::default()
    };
    let mut buf = BytesMut::from(stream);
    let mut order = Vec::new();
    let mut data: std::collections::HashMap<u32, Vec<u8>> = Default::default();
    while let Some(pdu) = codec.decode(&mut buf).unwrap() {
        match &pdu.header {
            Header::ScsiCommand(c) if c.write => {
                order.push(c.itt);
                let mut d = vec![0u8; c.expected_data_transfer_length as usize];
                d[..pdu.data.len()].copy_from_slice(&pdu.data);
                data.insert(c.itt, d);
            }
            Header::DataOut(o) => {
                let d = data.get_mut(&o.itt).unwrap();
                let at = o.buffer_offset as usize;
                d[at..at + pdu.data.len()].copy_from_slice(&pdu.data);
            }
            _ => {}
        }
    }
    order
        .into_iter()
        .map(|itt| data.remove(&itt).unwrap())
        .collect()
}

/// (ciphertext, first counter) of one sealed transfer of `plain` bytes.
fn split(sealed: &[u8], plain: usize) -> (Vec<u8>, u64) {
    let ct = sealed[..plain].to_vec();
    let counter = u64::from_be_bytes(sealed[plain..plain + 8].try_into().unwrap());
    (ct, counter)
}

#[test]
fn nonces_never_repeat_across_reconnect_and_reinstatement() {
    bounded(60, async {
        let h = start(None).await;
        let rec: Recorded = Arc::default();
        let via = relay(h.addrs[0], rec.clone()).await;
        let url = IscsiUrl::parse(&format!("iscsi://{via}/{IQN}/0")).unwrap();
        let plain = Bytes::from(vec![0x42u8; 8192]);
        let isid_a = [0x80, 0x11, 0x22, 0x33, 0x44, 0x01];
        let isid_b = [0x80, 0x11, 0x22, 0x33, 0x44, 0x02];

        // Session 1: the same plaintext to the same LBA twice.
        let s1 = Session::open(&url, &sealed_config(Some(isid_a)))
            .await
            .unwrap();
        s1.write(8, plain.clone()).await.unwrap();
        s1.write(8, plain.clone()).await.unwrap();
        s1.logout().await.unwrap();
        // Session 2: a reconnect (new login, other ISID).
        let s2 = Session::open(&url, &sealed_config(Some(isid_b)))
            .await
            .unwrap();
        s2.write(8, plain.clone()).await.unwrap();
        // Session 3: reinstates session 2 (same initiator, ISID and target, RFC 7143 §6.3.5)
        // while it is still logged in.
        let s3 = Session::open(&url, &sealed_config(Some(isid_b)))
            .await
            .unwrap();
        s3.write(8, plain.clone()).await.unwrap();
        assert_eq!(&s3.read(8, 16).await.unwrap()[..], &plain[..]);
        until(|| s2.failure().is_some(), "session 2 to be reinstated").await;
        s3.logout().await.unwrap();

        let conns = rec.lock().unwrap().clone();
        assert_eq!(conns.len(), 3, "three connections through the relay");
        let writes: Vec<(Vec<u8>, u64)> = conns
            .iter()
            .flat_map(|c| sealed_writes(c))
            .map(|s| {
                assert_eq!(s.len(), 8192 + 8 + 16, "one sealed 8 KiB chunk");
                split(&s, 8192)
            })
            .collect();
        assert_eq!(writes.len(), 4);
        // Within a session the counter moves on; each session starts again at the same
        // counter, so only fresh keys keep the (key, nonce) pairs apart...
        let counters: Vec<u64> = writes.iter().map(|w| w.1).collect();
        assert_ne!(counters[0], counters[1], "counter reused within a session");
        assert_eq!(
            (counters[0], counters[2], counters[3]),
            (0, 0, 0),
            "each session starts at counter 0: {counters:?}"
        );
        // ...and they do: the same plaintext at the same counter gives different ciphertext.
        // GCM's ciphertext is the plaintext XOR a keystream fixed by (key, nonce) alone, so
        // equal ciphertext here would be exactly a repeated (key, nonce) pair.
        for i in 0..writes.len() {
            assert_ne!(&writes[i].0[..], &plain[..], "write {i} not encrypted");
            for j in i + 1..writes.len() {
                assert_ne!(
                    writes[i].0, writes[j].0,
                    "writes {i} and {j}: same keystream (key, nonce reused)"
                );
            }
        }
        h.shutdown().await.unwrap();
    });
}

async fn until(mut f: impl FnMut() -> bool, what: &str) {
    for _ in 0..100 {
        if f() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("timed out waiting for {what}");
}

fn chunk(fill: u8) -> Bytes {
    Bytes::from(vec![fill; ipsan_seal::DEFAULT_CHUNK as usize])
}

/// 64 KiB = 128 blocks of 512 bytes: one Seal chunk.
const CHUNK_BLOCKS: u64 = ipsan_seal::DEFAULT_CHUNK as u64 / 512;

#[test]
fn target_asks_for_logout_past_the_rekey_mark_and_a_new_session_rekeys() {
    bounded(60, async {
        // Limit 16 counters per direction: the re-key mark is 14.
        let h = start(Some(16)).await;
        let url = IscsiUrl::parse(&format!("iscsi://{}/{IQN}/0", h.addrs[0])).unwrap();
        let s = Session::open(&url, &sealed_config(None)).await.unwrap();
        for i in 0..13u8 {
            s.write(u64::from(i) * CHUNK_BLOCKS, chunk(i))
                .await
                .unwrap();
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert!(!s.logout_requested(), "13 counters: below the mark");
        // The 14th chunk the target opens reaches the mark: the write completes, then the
        // target sends AsyncEvent 1.
        s.write(13 * CHUNK_BLOCKS, chunk(13)).await.unwrap();
        until(|| s.logout_requested(), "AsyncEvent 1").await;
        // New commands are refused without being sent; the session logs itself out.
        match s.write(14 * CHUNK_BLOCKS, chunk(14)).await {
            Err(Error::LogoutRequested) => {}
            other => panic!("expected LogoutRequested, got {other:?}"),
        }
        until(|| s.failure().is_some(), "the logout").await;
        assert!(
            s.failure().unwrap().contains("target's request"),
            "{:?}",
            s.failure()
        );
        // A new login derives fresh keys with counters from 0: everything written is there.
        let n = Session::open(&url, &sealed_config(None)).await.unwrap();
        for i in [0u8, 7, 13] {
            let back = n.read(u64::from(i) * CHUNK_BLOCKS, 128).await.unwrap();
            assert_eq!(&back[..], &chunk(i)[..], "chunk {i}");
        }
        let refused = n.read(14 * CHUNK_BLOCKS, 128).await.unwrap();
        assert!(
            refused.iter().all(|&b| b == 0),
            "the refused write was never sent"
        );
        n.logout().await.unwrap();
        h.shutdown().await.unwrap();
    });
}

fn assert_counter_limit_failure(r: Result<(), Error>) {
    match r {
        Err(Error::Scsi {
            status: 2,
            sense: Some(s),
        }) => assert_eq!(
            (s.key.0, s.asc, s.ascq),
            (0x0b, 0x74, 0x00),
            "ABORTED COMMAND / SECURITY ERROR"
        ),
        other => panic!("expected CHECK CONDITION at the counter limit, got {other:?}"),
    }
}

#[test]
fn a_command_that_reaches_the_counter_limit_fails_and_the_connection_closes() {
    bounded(60, async {
        let h = start(Some(16)).await;
        let url = IscsiUrl::parse(&format!("iscsi://{}/{IQN}/0", h.addrs[0])).unwrap();
        let ten = Bytes::from(vec![0x77u8; 10 * ipsan_seal::DEFAULT_CHUNK as usize]);

        // Initiator→target: 10 chunks, then 10 more would end at counter 20 > 16.
        let s = Session::open(&url, &sealed_config(None)).await.unwrap();
        s.write(0, ten.clone()).await.unwrap();
        assert_counter_limit_failure(s.write(2048, ten.clone()).await);
        until(|| s.failure().is_some(), "the connection to close").await;
        assert!(matches!(s.read(0, 1).await, Err(Error::ConnectionLost(_))));

        // Target→initiator: READ CAPACITY at open used counter 0; 10 chunks, then 10 more.
        let s = Session::open(&url, &sealed_config(None)).await.unwrap();
        let back = s.read(0, 1280).await.unwrap();
        assert_eq!(&back[..], &ten[..], "the first write is intact");
        let r = s.read(0, 1280).await.map(|_| ());
        assert_counter_limit_failure(r);
        until(|| s.failure().is_some(), "the connection to close").await;

        // Nothing of the refused write reached the LUN.
        let s = Session::open(&url, &sealed_config(None)).await.unwrap();
        let back = s.read(2048, 128).await.unwrap();
        assert!(back.iter().all(|&b| b == 0), "refused write left no data");
        s.logout().await.unwrap();
        h.shutdown().await.unwrap();
    });
}
