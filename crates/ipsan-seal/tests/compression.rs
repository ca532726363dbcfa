#![allow(clippy::unwrap_used, clippy::expect_used)]
//! Compression negotiated at login (`X-org.ipsan.Compression`, docs/seal.md §4b): off unless
//! both ends ask, bound by the key confirmations, and the compressed transfers of a negotiated
//! pair through the crypto pool.

mod support;
use std::sync::Arc;

use bytes::BytesMut;
use ipsan_seal::negotiate::KEY_COMPRESSION;
use ipsan_seal::{
    AnswerOutcome, Binding, Cipher, Compression, CryptoPool, NegotiationError, SealAnswer,
    SealOffer, SealPolicy, SealSession, TargetSealConfig,
};
use support::keys::{ids, psk, SECRET};

fn config(compress: bool) -> TargetSealConfig {
    TargetSealConfig {
        policy: SealPolicy::Allowed,
        compress,
        ..TargetSealConfig::default()
    }
}

fn offer(compress: bool) -> SealOffer {
    SealOffer::new(vec![Cipher::Aes256Gcm], 65536, psk(SECRET), ids())
        .unwrap()
        .with_compression(compress)
}

/// Offer, answer (with the answer's keys passed through `edit`), confirm.
fn negotiate_edited(
    initiator_asks: bool,
    target_agrees: bool,
    edit: impl FnOnce(&mut Vec<(String, String)>),
) -> Result<(SealSession, SealSession), NegotiationError> {
    let o = offer(initiator_asks);
    let AnswerOutcome::Pending(p) =
        SealAnswer::handle_offer(&config(target_agrees), &o.keys(), &ids(), |_| {
            Some(psk(SECRET))
        })
        .unwrap()
    else {
        panic!("target did not agree to Seal")
    };
    let mut answer = p.keys().to_vec();
    edit(&mut answer);
    let (i, confirm) = o.handle_answer(&answer)?;
    let t = p.handle_confirm(&confirm)?;
    Ok((i, t))
}

fn negotiate(initiator_asks: bool, target_agrees: bool) -> (SealSession, SealSession) {
    negotiate_edited(initiator_asks, target_agrees, |_| {}).unwrap()
}

fn answer_of(initiator_asks: bool, target_agrees: bool) -> Option<String> {
    let o = offer(initiator_asks);
    let AnswerOutcome::Pending(p) =
        SealAnswer::handle_offer(&config(target_agrees), &o.keys(), &ids(), |_| {
            Some(psk(SECRET))
        })
        .unwrap()
    else {
        panic!()
    };
    p.keys()
        .iter()
        .find(|(k, _)| k == KEY_COMPRESSION)
        .map(|(_, v)| v.clone())
}

#[test]
fn accepts_compression_only_when_both_ends_ask() {
    let (i, t) = negotiate(true, true);
    assert_eq!(
        (i.compression(), t.compression()),
        (Compression::Lz4, Compression::Lz4)
    );
    assert_eq!(answer_of(true, true).as_deref(), Some("lz4"));
    // The initiator asks, the target is not configured to: `none`, both off.
    let (i, t) = negotiate(true, false);
    assert_eq!(
        (i.compression(), t.compression()),
        (Compression::None, Compression::None)
    );
    assert_eq!(answer_of(true, false).as_deref(), Some("none"));
    // The target would, the initiator does not ask: the key is never sent, both off.
    let (i, t) = negotiate(false, true);
    assert_eq!(
        (i.compression(), t.compression()),
        (Compression::None, Compression::None)
    );
    assert_eq!(answer_of(false, true), None);
    assert!(!offer(false)
        .keys()
        .iter()
        .any(|(k, _)| k == KEY_COMPRESSION));
    assert!(offer(true)
        .keys()
        .contains(&(KEY_COMPRESSION.to_owned(), "lz4,none".to_owned())));
}

#[test]
fn rejects_an_answer_that_turns_on_compression_nobody_offered() {
    // A target (or relay) answering `lz4` to an initiator that did not offer it.
    let r = negotiate_edited(false, false, |a| {
        a.push((KEY_COMPRESSION.to_owned(), "lz4".to_owned()));
    });
    assert!(
        matches!(
            r,
            Err(NegotiationError::Malformed {
                key: KEY_COMPRESSION,
                ..
            })
        ),
        "{r:?}"
    );
    // An unknown codec.
    let r = negotiate_edited(true, true, |a| {
        for kv in a.iter_mut().filter(|(k, _)| k == KEY_COMPRESSION) {
            kv.1 = "zstd".to_owned();
        }
    });
    assert!(
        matches!(r, Err(NegotiationError::Malformed { .. })),
        "{r:?}"
    );
}

#[test]
fn rejects_a_relay_that_flips_the_compression_answer_in_a_bound_login() {
    // In a real login the answer is covered by the initiator's confirmation (the transcript
    // of every Login PDU): here the bound forms with transcripts that differ by the edit.
    use ipsan_seal::{Direction, LoginTranscript};
    let o = offer(true);
    let mut seen_by_target = LoginTranscript::new();
    let bhs = [0x03u8; 48];
    let pairs = |keys: &[(String, String)]| {
        keys.iter()
            .map(|(k, v)| format!("{k}={v}\0"))
            .collect::<String>()
    };
    seen_by_target.add(
        Direction::InitiatorToTarget,
        &bhs,
        &[],
        pairs(&o.keys()).as_bytes(),
    );
    let AnswerOutcome::Pending(p) = SealAnswer::handle_offer_bound(
        &config(true),
        &o.keys(),
        &ids(),
        |_| Some(psk(SECRET)),
        &seen_by_target.hash(),
    )
    .unwrap() else {
        panic!()
    };
    let genuine = p.keys().to_vec();
    let mut edited = genuine.clone();
    for kv in edited.iter_mut().filter(|(k, _)| k == KEY_COMPRESSION) {
        kv.1 = "none".to_owned();
    }
    let before = seen_by_target.hash();
    let mut seen_by_initiator = seen_by_target.clone();
    seen_by_initiator.add(
        Direction::TargetToInitiator,
        &bhs,
        &[],
        pairs(&edited).as_bytes(),
    );
    seen_by_target.add(
        Direction::TargetToInitiator,
        &bhs,
        &[],
        pairs(&genuine).as_bytes(),
    );
    let (i, confirm) = o
        .handle_answer_bound(&edited, &before, &seen_by_initiator.hash())
        .unwrap();
    assert_eq!(i.compression(), Compression::None, "the relay's edit took");
    // ... and the target refuses the initiator's confirmation: the login fails.
    assert_eq!(
        p.handle_confirm_bound(&confirm, &seen_by_target.hash())
            .err(),
        Some(NegotiationError::ConfirmationFailed)
    );
}

fn binding(itt: u32) -> Binding {
    Binding::of_command(0, itt, 0x2a, (u64::from(itt) * 2048, 2048))
}

#[tokio::test]
async fn accepts_compressed_transfers_through_the_pool_both_ways() {
    let (i, t) = negotiate(true, true);
    let (i, t) = (Arc::new(i), Arc::new(t));
    let pool = CryptoPool::new(2).unwrap();
    let mut zeros_and_text = vec![0u8; 512 << 10];
    zeros_and_text.extend(b"compressible source text; ".repeat(20_000));
    let mut x = 1u64;
    let noise: Vec<u8> = (0..(1 << 20))
        .map(|_| {
            x = x.wrapping_mul(6364136223846793005).wrapping_add(1);
            (x >> 56) as u8
        })
        .collect();
    for (itt, plain) in [zeros_and_text, noise.clone(), vec![5u8; 3000]]
        .into_iter()
        .enumerate()
    {
        let b = binding(itt as u32);
        // Initiator to target (a write), sealed as a copy.
        let wire = pool
            .seal_copy(&i, b, bytes::Bytes::from(plain.clone()))
            .await
            .unwrap();
        let back = pool.open(&t, b, BytesMut::from(&wire[..])).await.unwrap();
        assert_eq!(back, plain, "write {itt}");
        // The same write as a slice of a receive buffer other PDUs share (`open_shared`).
        let wire = pool
            .seal_copy(&i, b, bytes::Bytes::from(plain.clone()))
            .await
            .unwrap();
        let rx = bytes::Bytes::from([&[7u8; 64][..], &wire[..]].concat());
        let back = pool.open_shared(&t, b, rx.slice(64..)).await.unwrap();
        assert_eq!(back, plain, "shared write {itt}");
        // Target to initiator (a read), sealed from its own buffer.
        let wire = pool.seal(&t, b, BytesMut::from(&plain[..])).await.unwrap();
        assert!(wire.len() <= t.sealed_len(plain.len()).unwrap());
        let back = pool.open(&i, b, BytesMut::from(&wire[..])).await.unwrap();
        assert_eq!(back, plain, "read {itt}");
    }
    // Random data is stored raw: the wire is the plaintext plus the header, no more.
    let wire = pool
        .seal_copy(&i, binding(9), bytes::Bytes::from(noise.clone()))
        .await
        .unwrap();
    assert_eq!(Some(wire.len()), i.sealed_len(noise.len()));
    // Zeros shrink to a small fraction.
    let wire = pool
        .seal_copy(&i, binding(10), bytes::Bytes::from(vec![0u8; 1 << 20]))
        .await
        .unwrap();
    assert!(wire.len() < (1 << 20) / 50, "{}", wire.len());
}
