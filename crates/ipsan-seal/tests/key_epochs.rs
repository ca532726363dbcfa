#![allow(clippy::unwrap_used, clippy::expect_used)]
//! Key epochs through negotiated sessions (docs/seal.md §4): a command whose chunks span an
//! epoch boundary seals and opens with every cipher, and no login agrees on a 3DES chunk too
//! large for one epoch (SP 800-67 Rev. 2: at most 2^20 blocks per key).

mod support;
use support::keys::{offer_answer, pair};

use bytes::BytesMut;
use ipsan_seal::negotiate::KEY_CHUNK;
use ipsan_seal::{Binding, Cipher, NegotiationError};

/// Chunks per key epoch, computed here independently of the crate: 2^20 blocks divided by
/// what one chunk costs (its 8-byte blocks, the IV block and a possible tail block).
fn epoch_chunks(chunk: u64) -> u64 {
    (1 << 20) / (chunk / 8 + 2)
}

/// Seals a 4-chunk command starting two chunks before counter `boundary` on each side and
/// opens it on the other.
fn round_trip_across(cipher: Cipher, chunk: u64, boundary: u64) {
    let (init, target) = pair(cipher, chunk as u32);
    let init = init.with_counter_range_for_test(boundary - 2, u64::MAX);
    let target = target.with_counter_range_for_test(boundary - 2, u64::MAX);
    let b = Binding {
        lun: 1,
        lba: 2048,
        blocks: 512,
        opcode: 0x2a,
        task_tag: 9,
    };
    let plain: Vec<u8> = (0..4 * chunk as usize).map(|i| (i % 251) as u8).collect();
    let sealed = init.seal(&b, BytesMut::from(&plain[..])).unwrap();
    assert_eq!(target.open(&b, BytesMut::from(&sealed[..])).unwrap(), plain);
    let sealed = target.seal(&b, BytesMut::from(&plain[..])).unwrap();
    assert_eq!(init.open(&b, BytesMut::from(&sealed[..])).unwrap(), plain);
    assert_eq!(
        init.counters_used(),
        (boundary + 2, boundary + 2),
        "{cipher}"
    );
}

#[test]
fn a_command_spanning_a_3des_epoch_boundary_round_trips_in_both_directions() {
    round_trip_across(Cipher::TripleDesCbcHmacSha1, 65536, epoch_chunks(65536));
}

#[test]
fn a_command_spanning_an_aead_epoch_boundary_round_trips_in_both_directions() {
    // 64 GiB per AEAD key: 2^20 chunks of 64 KiB, 2^22 of 16 KiB.
    round_trip_across(Cipher::Aes256Gcm, 65536, 1 << 20);
    round_trip_across(Cipher::ChaCha20Poly1305, 16384, 1 << 22);
}

#[test]
fn the_target_answers_at_most_one_epoch_per_3des_chunk() {
    let (o, p) = offer_answer(Cipher::TripleDesCbcHmacSha1, 16 << 20);
    assert_eq!(p.framing().chunk_size, 4 << 20);
    assert_eq!(Cipher::TripleDesCbcHmacSha1.max_chunk(), 4 << 20);
    let (i, confirm) = o.handle_answer(p.keys()).unwrap();
    let t = p.handle_confirm(&confirm).unwrap();
    assert_eq!((i.chunk_size(), t.chunk_size()), (4 << 20, 4 << 20));
    // The AEADs keep the general limit.
    assert_eq!(Cipher::Aes256Gcm.max_chunk(), 16 << 20);
}

#[test]
fn the_initiator_refuses_a_3des_chunk_larger_than_one_epoch() {
    let (o, p) = offer_answer(Cipher::TripleDesCbcHmacSha1, 16 << 20);
    // A target that ignores the limit answers 8 MiB.
    let keys: Vec<(String, String)> = p
        .keys()
        .iter()
        .map(|(k, v)| {
            if k == KEY_CHUNK {
                (k.clone(), (8u32 << 20).to_string())
            } else {
                (k.clone(), v.clone())
            }
        })
        .collect();
    let e = o.handle_answer(&keys).unwrap_err();
    assert!(
        matches!(e, NegotiationError::Malformed { key, .. } if key == KEY_CHUNK),
        "{e:?}"
    );
}
