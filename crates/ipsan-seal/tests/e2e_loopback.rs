#![allow(clippy::unwrap_used, clippy::expect_used)]
//! End to end over loopback TCP through a relay that records the wire: sealed data never shows
//! its plaintext there, reads return it intact, and a flipped byte fails the write without
//! touching the LUN. Uses the toy block protocol in `support/blockproto.rs` (not iSCSI).

mod support;
use std::sync::Arc;
use std::time::Duration;

use bytes::BytesMut;
use ipsan_seal::{sense, Cipher, CryptoPool};
use support::blockproto::{self as bp, Client, Sealing, BLOCK};
use support::keys::pair;

const LUN: usize = 4 << 20;
const MARKER: &[u8] = b"<<SEAL-TEST-MARKER-7f3a>>";

fn marked(len: usize) -> Vec<u8> {
    MARKER.iter().copied().cycle().take(len).collect()
}

fn sealing(cipher: Cipher) -> (Sealing, Sealing) {
    let (i, t) = pair(cipher, 65536);
    let pool = Arc::new(CryptoPool::new(2).unwrap());
    (
        Sealing {
            session: Arc::new(i),
            pool: Arc::clone(&pool),
            pipeline: true,
        },
        Sealing {
            session: Arc::new(t),
            pool,
            pipeline: true,
        },
    )
}

async fn bounded<F: std::future::Future>(f: F) -> F::Output {
    tokio::time::timeout(Duration::from_secs(60), f)
        .await
        .expect("test timed out")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn marker_never_appears_on_the_wire_and_reads_back_intact() {
    bounded(async {
        for cipher in [
            Cipher::Aes256Gcm,
            Cipher::ChaCha20Poly1305,
            Cipher::TripleDesCbcHmacSha1,
        ] {
            let (ci, ct) = sealing(cipher);
            let (server, _lun) = bp::serve(Some(ct), LUN).await;
            let relay = bp::relay(server, None).await;
            let client = Client::connect(relay.addr, Some(ci)).await;
            let data = marked(1 << 20);
            let r = client.write(64, BytesMut::from(&data[..])).await;
            assert_eq!(r.status, 0, "{cipher}");
            let back = client.read(64, ((1 << 20) / BLOCK) as u32).await.unwrap();
            assert_eq!(&back[..], &data[..], "{cipher}");
            // Give the relay a moment to record the last bytes it forwarded.
            tokio::time::sleep(Duration::from_millis(50)).await;
            let up = relay.client_to_server.lock().unwrap().clone();
            let down = relay.server_to_client.lock().unwrap().clone();
            assert!(
                up.len() > 1 << 20 && down.len() > 1 << 20,
                "{cipher}: relay saw the data"
            );
            assert!(
                !bp::contains(&up, MARKER),
                "{cipher}: marker on the wire (write)"
            );
            assert!(
                !bp::contains(&down, MARKER),
                "{cipher}: marker on the wire (read)"
            );
        }
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plain_session_shows_the_marker_so_the_relay_check_can_fail() {
    bounded(async {
        let (server, _lun) = bp::serve(None, LUN).await;
        let relay = bp::relay(server, None).await;
        let client = Client::connect(relay.addr, None).await;
        let r = client.write(0, BytesMut::from(&marked(65536)[..])).await;
        assert_eq!(r.status, 0);
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(bp::contains(
            &relay.client_to_server.lock().unwrap(),
            MARKER
        ));
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn flipped_byte_fails_the_write_and_leaves_the_lun_unchanged() {
    bounded(async {
        let (ci, ct) = sealing(Cipher::Aes256Gcm);
        let target_session = Arc::clone(&ct.session);
        let (server, lun) = bp::serve(Some(ct), LUN).await;
        let io = 65536;
        // Request frame = 21-byte header + sealed payload. The first write passes untouched;
        // flip a byte in the middle of the second write's ciphertext.
        let first_frame = 21 + target_session.sealed_len(io).unwrap();
        let relay = bp::relay(server, Some(first_frame + 21 + 1000)).await;
        let client = Client::connect(relay.addr, Some(ci)).await;

        let old = vec![0xAAu8; io];
        let r = client.write(8, BytesMut::from(&old[..])).await;
        assert_eq!(r.status, 0);

        let r = client.write(8, BytesMut::from(&vec![0x55u8; io][..])).await;
        assert_eq!(r.status, sense::STATUS, "tampered write must fail");
        assert_eq!(r.sense, (sense::SENSE_KEY, sense::ASC, sense::ASCQ));
        assert_eq!(target_session.stats().auth_failures, 1);
        assert_eq!(&lun.lock().unwrap()[8 * BLOCK..8 * BLOCK + io], &old[..]);

        // The session goes on: the LUN still holds the old data and new writes work.
        let back = client.read(8, (io / BLOCK) as u32).await.unwrap();
        assert_eq!(&back[..], &old[..]);
        let r = client.write(8, BytesMut::from(&vec![0x77u8; io][..])).await;
        assert_eq!(r.status, 0);
        assert!(lun.lock().unwrap()[8 * BLOCK..8 * BLOCK + io]
            .iter()
            .all(|&b| b == 0x77));
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pipelined_sequential_write_and_read_round_trip_at_depth_16() {
    bounded(async {
        for pipeline in [true, false] {
            let (mut ci, mut ct) = sealing(Cipher::Aes256Gcm);
            ci.pipeline = pipeline;
            ct.pipeline = pipeline;
            let (server, _lun) = bp::serve(Some(ct), LUN).await;
            let client = Client::connect(server, Some(ci)).await;
            let depth = if pipeline { 16 } else { 1 };
            bp::sequential_write(&client, LUN, 256 << 10, depth, 0x3c).await;
            bp::sequential_read(&client, LUN, 256 << 10, depth, 0x3c).await;
        }
    })
    .await;
}
