//! nvme-tls's target against its own host over loopback TCP: which keys and identities key a
//! connection, which are refused, and what a relay on the path can and cannot do.
#![allow(clippy::unwrap_used, clippy::expect_used)]

#[allow(dead_code)]
mod common;

use std::time::Duration;

use common::{relay_records, H, S};
use nvme_proto::psk::{ConfiguredPsk, Derivation, IdentityVersion, PskHash, PskStore, TlsPsk};
use nvme_tls::{accept, connect, connect_with, Accepted, TlsError};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;
use tokio::time::timeout;

const T: Duration = Duration::from_secs(10);

fn key(hash: PskHash, fill: u8) -> ConfiguredPsk {
    ConfiguredPsk::new(Some(hash), &vec![fill; hash.key_len()]).unwrap()
}

/// A target that accepts one connection with `store`, then echoes one 5-byte message.
async fn target(store: PskStore) -> (u16, JoinHandle<Result<Accepted<TcpStream>, TlsError>>) {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = l.local_addr().unwrap().port();
    let task = tokio::spawn(async move {
        let (s, _) = l.accept().await.unwrap();
        let mut acc = accept(s, &store).await?;
        let mut buf = [0u8; 5];
        if acc.stream.read_exact(&mut buf).await.is_ok() {
            let _ = acc.stream.write_all(&buf).await;
            let _ = acc.stream.flush().await;
        }
        Ok(acc)
    });
    (port, task)
}

async fn echo_through(
    port: u16,
    identity: &nvme_proto::psk::PskIdentity,
    psk: &TlsPsk,
) -> Result<(), TlsError> {
    let s = TcpStream::connect(("127.0.0.1", port)).await.unwrap();
    let mut tls = timeout(T, connect_with(s, identity, psk)).await.unwrap()?;
    tls.write_all(b"hello").await.unwrap();
    let mut buf = [0u8; 5];
    tls.read_exact(&mut buf).await.unwrap();
    assert_eq!(&buf, b"hello");
    Ok(())
}

#[tokio::test]
async fn accepts_every_identity_form_with_its_cipher_suite() {
    for hash in [PskHash::Sha256, PskHash::Sha384] {
        for version in [IdentityVersion::V0, IdentityVersion::V1] {
            for derivation in Derivation::ALL {
                let k = key(hash, 0x42);
                let mut store = PskStore::new();
                store.insert_with(H, S, k.clone(), derivation);
                let (port, task) = target(store).await;
                let (id, psk) = k.tls_psk(H, S, version, derivation);
                echo_through(port, &id, &psk).await.unwrap();
                let acc = timeout(T, task).await.unwrap().unwrap().unwrap();
                assert_eq!(acc.identity, id);
                assert_eq!(acc.identity.hostnqn, H);
                assert_eq!(acc.identity.subnqn, S);
                assert_eq!(acc.derivation, derivation);
                assert_eq!(
                    nvme_tls::cipher_name(&acc.stream),
                    Some(hash.cipher_suite()),
                    "{hash:?} {version:?} {derivation:?}"
                );
                assert_eq!(acc.stream.ssl().version_str(), "TLSv1.3");
            }
        }
    }
}

#[tokio::test]
async fn connect_offers_what_linux_targets_look_up() {
    // The default: a version 0 identity and libnvme's derivation (nvme check-tls-key --insert).
    let k = key(PskHash::Sha256, 7);
    let mut store = PskStore::new();
    store.insert(H, S, k.clone());
    let (port, task) = target(store).await;
    let s = TcpStream::connect(("127.0.0.1", port)).await.unwrap();
    let mut tls = timeout(T, connect(s, H, S, &k)).await.unwrap().unwrap();
    tls.write_all(b"12345").await.unwrap();
    let mut buf = [0u8; 5];
    tls.read_exact(&mut buf).await.unwrap();
    let acc = timeout(T, task).await.unwrap().unwrap().unwrap();
    assert_eq!(acc.identity.to_string(), format!("NVMe0R01 {H} {S}"));
    assert_eq!(acc.derivation, Derivation::Libnvme);
}

#[tokio::test]
async fn rejects_a_host_holding_another_key() {
    let mut store = PskStore::new();
    store.insert(H, S, key(PskHash::Sha256, 1));
    let (port, task) = target(store).await;
    // Same identity (version 0 carries no digest), other key: the binder does not verify.
    let (id, psk) = key(PskHash::Sha256, 2).tls_psk(H, S, IdentityVersion::V0, Derivation::Libnvme);
    assert!(matches!(
        echo_through(port, &id, &psk).await,
        Err(TlsError::Handshake(_))
    ));
    assert!(matches!(
        timeout(T, task).await.unwrap().unwrap(),
        Err(TlsError::Handshake(_))
    ));
}

#[tokio::test]
async fn rejects_a_host_deriving_by_the_other_label_form_with_a_version_0_identity() {
    // The interop trap: same configured key, the host derives by RFC 8446, the target by
    // libnvme's (its default for version 0 identities): the keys differ and TLS says so.
    let k = key(PskHash::Sha256, 9);
    let mut store = PskStore::new();
    store.insert(H, S, k.clone());
    let (port, task) = target(store).await;
    let (id, psk) = k.tls_psk(H, S, IdentityVersion::V0, Derivation::Rfc8446);
    assert!(echo_through(port, &id, &psk).await.is_err());
    assert!(timeout(T, task).await.unwrap().unwrap().is_err());
}

#[tokio::test]
async fn rejects_unknown_hosts_and_subsystems_before_any_key_is_tried() {
    let k = key(PskHash::Sha256, 3);
    for (host, sub) in [
        ("nqn.2014-08.org.example:intruder", S),
        (H, "nqn.2026-11.org.example:other"),
    ] {
        let mut store = PskStore::new();
        store.insert(H, S, k.clone());
        let (port, task) = target(store).await;
        let (id, psk) = k.tls_psk(host, sub, IdentityVersion::V0, Derivation::Libnvme);
        assert!(echo_through(port, &id, &psk).await.is_err());
        let err = timeout(T, task).await.unwrap().unwrap().unwrap_err();
        assert!(
            matches!(
                err,
                TlsError::NoKey(nvme_proto::psk::PskError::UnknownHost { .. })
            ),
            "{err}"
        );
    }
}

#[tokio::test]
async fn rejects_a_version_1_identity_whose_digest_is_not_the_keys() {
    let mut store = PskStore::new();
    store.insert(H, S, key(PskHash::Sha384, 4));
    let (port, task) = target(store).await;
    let (id, psk) = key(PskHash::Sha384, 5).tls_psk(H, S, IdentityVersion::V1, Derivation::Libnvme);
    assert!(echo_through(port, &id, &psk).await.is_err());
    let err = timeout(T, task).await.unwrap().unwrap().unwrap_err();
    assert!(
        matches!(
            err,
            TlsError::NoKey(nvme_proto::psk::PskError::DigestMismatch)
        ),
        "{err}"
    );
}

#[tokio::test]
async fn rejects_a_plaintext_nvme_client_on_a_tls_port() {
    let mut store = PskStore::new();
    store.insert(H, S, key(PskHash::Sha256, 6));
    let (port, task) = target(store).await;
    let mut s = TcpStream::connect(("127.0.0.1", port)).await.unwrap();
    // An ICReq (type 0, HLEN 128, PLEN 128) instead of a ClientHello.
    let mut icreq = vec![0u8; 128];
    icreq[2] = 128;
    icreq[4] = 128;
    s.write_all(&icreq).await.unwrap();
    assert!(timeout(T, task).await.unwrap().unwrap().is_err());
}

/// A relay between host and target that flips one bit of the first application record it
/// forwards from the host: the target reads an error, never altered bytes.
#[tokio::test]
async fn rejects_records_a_relay_altered_in_flight() {
    let k = key(PskHash::Sha256, 8);
    let mut store = PskStore::new();
    store.insert(H, S, k.clone());
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = l.local_addr().unwrap().port();
    let target = tokio::spawn(async move {
        let (s, _) = l.accept().await.unwrap();
        let mut acc = accept(s, &store).await.unwrap();
        let mut buf = [0u8; 5];
        acc.stream.read_exact(&mut buf).await.map(|_| buf)
    });
    // The relay: copies both ways; in the host → target direction it counts TLS records and
    // flips a bit in the last byte of the first application-data record after the handshake
    // (the client's Finished is the only other record the client sends after its hello).
    let rl = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let rport = rl.local_addr().unwrap().port();
    let relay = tokio::spawn(async move {
        let (host, _) = rl.accept().await.unwrap();
        let tgt = TcpStream::connect(("127.0.0.1", port)).await.unwrap();
        relay_records(host, tgt, |n, mut rec, _| {
            // Record 1 is the client's Finished (encrypted, type 23 outside); 2 is data.
            if n == 2 {
                *rec.last_mut().unwrap() ^= 1;
            }
            vec![rec]
        })
        .await;
    });
    let s = TcpStream::connect(("127.0.0.1", rport)).await.unwrap();
    let (id, psk) = k.tls_psk(H, S, IdentityVersion::V0, Derivation::Libnvme);
    let mut tls = timeout(T, connect_with(s, &id, &psk))
        .await
        .unwrap()
        .unwrap();
    tls.write_all(b"write").await.unwrap();
    tls.flush().await.unwrap();
    let got = timeout(T, target).await.unwrap().unwrap();
    assert!(got.is_err(), "the target read {got:?}");
    relay.abort();
}
