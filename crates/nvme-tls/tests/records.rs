//! nvme-tls's own TLS 1.3 record layer (after OpenSSL's handshake) against OpenSSL's record
//! layer on the other end, over real loopback TCP: the same bytes both ways with either key
//! hash, KeyUpdate started by either side and followed by the other, and what a relay on the
//! path can do to the records (replay, reorder, drop, cut the stream): each is refused with
//! nothing wrong delivered.
#![allow(clippy::unwrap_used, clippy::expect_used)]

#[allow(dead_code)]
mod common;

use std::io::IoSlice;

use common::{bytes, read_pattern, read_until_error, relay_records, Edit, H, RECORD, S, T};
use nvme_proto::psk::{ConfiguredPsk, Derivation, IdentityVersion, PskHash, PskStore};
use nvme_tls::{accept_using, connect_using, RecordLayer, TlsStream};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::time::timeout;

async fn tcp_pair() -> (TcpStream, TcpStream) {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let (c, a) = tokio::join!(TcpStream::connect(l.local_addr().unwrap()), l.accept());
    let c = c.unwrap();
    c.set_nodelay(true).unwrap();
    let (s, _) = a.unwrap();
    s.set_nodelay(true).unwrap();
    (c, s)
}

/// The handshake over a pair of streams with the record layers chosen: (host, target).
async fn tls_pair<C, T2>(
    c: C,
    s: T2,
    hash: PskHash,
    host_layer: RecordLayer,
    target_layer: RecordLayer,
) -> (TlsStream<C>, TlsStream<T2>)
where
    C: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    T2: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let key = ConfiguredPsk::new(Some(hash), &vec![7u8; hash.key_len()]).unwrap();
    let mut store = PskStore::new();
    store.insert(H, S, key.clone());
    let target = tokio::spawn(async move {
        accept_using(s, &store, target_layer)
            .await
            .map(|a| a.stream)
    });
    let (id, psk) = key.tls_psk(H, S, IdentityVersion::V0, Derivation::Libnvme);
    let host = timeout(T, connect_using(c, &id, &psk, host_layer))
        .await
        .unwrap()
        .unwrap();
    let target = timeout(T, target).await.unwrap().unwrap().unwrap();
    assert_eq!(host.record_layer(), host_layer);
    assert_eq!(target.record_layer(), target_layer);
    assert_eq!(nvme_tls::cipher_name(&host), Some(hash.cipher_suite()));
    (host, target)
}

/// Writes `len` pattern bytes in pieces of many sizes (vectored: small pieces share records,
/// large ones are sealed from their own buffers), then flushes.
async fn write_pattern<W: AsyncWrite + Unpin>(w: &mut W, len: usize, seed: u32) {
    let data = bytes(0, len, seed);
    let sizes = [1, 100, 4096 + 72, RECORD, 70_000, 3, 1 << 20, 24];
    let mut at = 0;
    let mut i = 0;
    while at < len {
        let a = sizes[i % sizes.len()].min(len - at);
        let b = sizes[(i + 3) % sizes.len()].min(len - at - a);
        let mut bufs = [
            IoSlice::new(&data[at..at + a]),
            IoSlice::new(&data[at + a..at + a + b]),
        ];
        let mut bufs = &mut bufs[..];
        let mut left = a + b;
        while left > 0 {
            let n = w.write_vectored(bufs).await.unwrap();
            assert!(n > 0);
            left -= n;
            IoSlice::advance_slices(&mut bufs, n);
        }
        at += a + b;
        i += 1;
    }
    w.flush().await.unwrap();
}

/// Our records and OpenSSL's understand each other, both ways at once, with SHA-256 (AES-128-GCM)
/// and SHA-384 (AES-256-GCM) keys: the keys, IVs and nonces are RFC 8446's, not only our own.
#[tokio::test]
async fn accepts_openssl_records_on_the_other_end_both_ways() {
    for hash in [PskHash::Sha256, PskHash::Sha384] {
        for (hl, tl) in [
            (RecordLayer::Own, RecordLayer::OpenSsl),
            (RecordLayer::OpenSsl, RecordLayer::Own),
            (RecordLayer::Own, RecordLayer::Own),
        ] {
            let (c, s) = tcp_pair().await;
            let (host, target) = tls_pair(c, s, hash, hl, tl).await;
            let (mut hr, mut hw) = tokio::io::split(host);
            let (mut tr, mut tw) = tokio::io::split(target);
            let len = 3 * (1 << 20) + 13;
            let up = tokio::spawn(async move { write_pattern(&mut hw, len, 1).await });
            let down = tokio::spawn(async move { write_pattern(&mut tw, len + 5, 2).await });
            let (_, _) = tokio::join!(
                read_pattern(&mut tr, len, 1),
                read_pattern(&mut hr, len + 5, 2)
            );
            timeout(T, up).await.unwrap().unwrap();
            timeout(T, down).await.unwrap().unwrap();
        }
    }
}

/// A KeyUpdate that asks for ours (RFC 8446 §4.6.3), from OpenSSL or from our own layer: the
/// receiver moves to the next key, answers with its own before its next data, and the sender
/// opens that data with the peer's next key. Three rounds, so the secrets chain.
#[tokio::test]
async fn follows_and_answers_a_key_update_the_peer_asks_for() {
    for hash in [PskHash::Sha256, PskHash::Sha384] {
        for tl in [RecordLayer::OpenSsl, RecordLayer::Own] {
            let (c, s) = tcp_pair().await;
            let (mut host, mut target) = tls_pair(c, s, hash, RecordLayer::Own, tl).await;
            for round in 1..=3u32 {
                target.key_update(true).unwrap();
                let w = tokio::spawn(async move {
                    write_pattern(&mut target, 5 * RECORD + 11, round).await;
                    target
                });
                read_pattern(&mut host, 5 * RECORD + 11, round).await;
                target = timeout(T, w).await.unwrap().unwrap();
                // Read side updated; the answer is sealed under the old key, then ours changes.
                assert_eq!(host.key_generations(), Some((round, round)));
                let w = tokio::spawn(async move {
                    write_pattern(&mut host, 3 * RECORD + 1, 100 + round).await;
                    host
                });
                read_pattern(&mut target, 3 * RECORD + 1, 100 + round).await;
                host = timeout(T, w).await.unwrap().unwrap();
                if tl == RecordLayer::Own {
                    assert_eq!(target.key_generations(), Some((round, round)));
                }
            }
        }
    }
}

/// A KeyUpdate we start, asking for the peer's: OpenSSL (and our layer) follow it, and their
/// answer moves our receiving key.
#[tokio::test]
async fn accepts_the_peers_answer_to_our_key_update() {
    for tl in [RecordLayer::OpenSsl, RecordLayer::Own] {
        let (c, s) = tcp_pair().await;
        let (mut host, mut target) = tls_pair(c, s, PskHash::Sha256, RecordLayer::Own, tl).await;
        host.key_update(true).unwrap();
        assert_eq!(host.key_generations(), Some((0, 1)));
        let w = tokio::spawn(async move {
            write_pattern(&mut host, 2 * RECORD + 9, 7).await;
            host
        });
        read_pattern(&mut target, 2 * RECORD + 9, 7).await;
        let mut host = timeout(T, w).await.unwrap().unwrap();
        let w = tokio::spawn(async move {
            write_pattern(&mut target, 2 * RECORD + 9, 8).await;
            target
        });
        read_pattern(&mut host, 2 * RECORD + 9, 8).await;
        timeout(T, w).await.unwrap().unwrap();
        assert_eq!(host.key_generations(), Some((1, 1)));
    }
}

/// A relay between host and target that forwards the host's records, letting `edit` change
/// the list of records after the `n`-th encrypted one (1 = the host's Finished).
async fn relayed_pair(
    edit: Edit,
    target_layer: RecordLayer,
) -> (
    TlsStream<TcpStream>,
    TlsStream<TcpStream>,
    tokio::task::JoinHandle<()>,
) {
    let (c, relay_host) = tcp_pair().await;
    let (relay_tgt, s) = tcp_pair().await;
    let relay = tokio::spawn(relay_records(relay_host, relay_tgt, edit));
    let (host, target) = tls_pair(c, s, PskHash::Sha256, RecordLayer::OpenSsl, target_layer).await;
    (host, target, relay)
}

/// Sends 8 full records from the host (OpenSSL's layer) and reads at the target (ours) until
/// an error or the end: what was delivered and how it ended.
async fn attack(edit: Edit) -> (Vec<u8>, Option<std::io::Error>) {
    let (mut host, mut target, relay) = relayed_pair(edit, RecordLayer::Own).await;
    let w = tokio::spawn(async move {
        let _ = host.write_all(&bytes(0, 8 * RECORD, 9)).await;
        let _ = host.flush().await;
        host
    });
    let (got, err) = read_until_error(&mut target, 20 * RECORD).await;
    assert!(
        got == bytes(0, got.len(), 9),
        "bytes that were not sent were delivered"
    );
    drop(timeout(T, w).await);
    relay.abort();
    (got, err)
}

/// A record sent again by the relay (data record 3 twice) does not open under the next
/// sequence number: refused after the records before it.
#[tokio::test]
async fn rejects_a_record_a_relay_replays() {
    let (got, err) = attack(|n, rec, _| {
        if n == 4 {
            vec![rec.clone(), rec]
        } else {
            vec![rec]
        }
    })
    .await;
    assert!(err.is_some(), "the replayed record was taken");
    assert_eq!(got.len(), 3 * RECORD);
}

/// Two records swapped by the relay: the first of them is refused.
#[tokio::test]
async fn rejects_records_a_relay_reorders() {
    let (got, err) = attack(|n, rec, held| match n {
        3 => {
            held.push(rec);
            vec![]
        }
        4 => {
            let first = held.pop().unwrap();
            vec![rec, first]
        }
        _ => vec![rec],
    })
    .await;
    assert!(err.is_some(), "the reordered records were taken");
    assert_eq!(got.len(), RECORD);
}

/// A record the relay drops: the next one is refused.
#[tokio::test]
async fn rejects_a_stream_a_relay_dropped_a_record_from() {
    let (got, err) = attack(|n, rec, _| if n == 5 { Vec::new() } else { vec![rec] }).await;
    // `Vec::new()` in the list would end the connection; no list at all drops the record.
    assert!(err.is_some(), "the record after the dropped one was taken");
    assert_eq!(got.len(), 3 * RECORD);
}

/// The relay cuts the stream between records: an error (no close_notify), not an end.
#[tokio::test]
async fn rejects_a_stream_cut_without_close_notify() {
    let (got, err) = attack(|n, rec, _| if n == 6 { vec![Vec::new()] } else { vec![rec] }).await;
    let err = err.expect("a cut stream read as a clean end");
    assert_eq!(err.kind(), std::io::ErrorKind::UnexpectedEof);
    assert_eq!(got.len(), 4 * RECORD);
}

/// close_notify (our shutdown) ends the peer's reads cleanly after all the data, to either
/// record layer.
#[tokio::test]
async fn accepts_close_notify_as_the_end_after_all_data() {
    for tl in [RecordLayer::OpenSsl, RecordLayer::Own] {
        let (c, s) = tcp_pair().await;
        let (mut host, mut target) = tls_pair(c, s, PskHash::Sha256, RecordLayer::Own, tl).await;
        let w = tokio::spawn(async move {
            write_pattern(&mut host, 4 * RECORD + 3, 11).await;
            host.shutdown().await.unwrap();
        });
        let mut got = Vec::new();
        timeout(T, target.read_to_end(&mut got))
            .await
            .unwrap()
            .unwrap();
        assert!(got == bytes(0, 4 * RECORD + 3, 11));
        timeout(T, w).await.unwrap().unwrap();
    }
}
