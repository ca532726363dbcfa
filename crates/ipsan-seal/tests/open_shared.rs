#![allow(clippy::unwrap_used, clippy::expect_used)]
//! Opening a sealed transfer that shares its buffer (immediate data: a slice of the receive
//! buffer the next PDUs go into): `CryptoPool::open_shared` opens it out of place into a
//! buffer of the session's (`SealSession::open_copy`), or in place when its holder has it to
//! itself, with every check `open` makes.

mod support;
use std::sync::Arc;

use bytes::{Bytes, BytesMut};
use ipsan_seal::{Binding, Cipher, CryptoPool, OpenError};
use support::keys::pair;

fn binding(task_tag: u32) -> Binding {
    Binding {
        lun: 0x0001_0000_0000_0000,
        lba: 4096,
        blocks: 128,
        opcode: 0x2a,
        task_tag,
    }
}

fn block_on<F: std::future::Future>(f: F) -> F::Output {
    tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap()
        .block_on(f)
}

/// `sealed` as the receive buffer holds it: a slice of a larger buffer, other bytes around it.
fn shared(sealed: &[u8]) -> (Bytes, Bytes) {
    let mut rx = BytesMut::from(&[0xeeu8; 100][..]);
    rx.extend_from_slice(sealed);
    rx.extend_from_slice(&[0xdd; 300]);
    let rx = rx.freeze();
    (rx.slice(100..100 + sealed.len()), rx)
}

#[test]
fn a_shared_transfer_opens_out_of_place_and_its_buffer_is_left_as_it_was() {
    // Sizes up to `Cipher::inline_max` (opened out of place on the caller's thread) and past it
    // (copied and opened on the workers), around chunk boundaries, every cipher; reused
    // buffers (each plaintext dropped before the next open) hold nothing of the last one.
    for cipher in Cipher::ALL {
        let chunk = 16 * 1024;
        let (init, target) = pair(cipher, chunk as u32);
        let target = Arc::new(target);
        let pool = CryptoPool::new(2).unwrap();
        for (k, n) in [
            1,
            chunk - 1,
            chunk,
            3 * chunk + 5,
            64 * 1024,
            64 * 1024 + 1,
            300_000,
        ]
        .into_iter()
        .enumerate()
        {
            for round in 0..2u32 {
                let b = binding(k as u32 * 10 + round);
                let data: Vec<u8> = (0..n)
                    .map(|j| (j * 29 + k + round as usize) as u8)
                    .collect();
                let sealed = init.seal_copy(&b, &data).unwrap();
                let (slice, rx) = shared(&sealed);
                let before = rx.clone();
                let opened = block_on(pool.open_shared(&target, b, slice)).unwrap();
                assert_eq!(&opened[..], &data[..], "{cipher} n={n} round={round}");
                assert_eq!(rx, before);
                assert_eq!(
                    &rx[100..100 + sealed.len()],
                    &sealed[..],
                    "ciphertext changed"
                );
                let inside = rx.as_ptr_range();
                assert!(
                    !inside.contains(&opened.as_ptr()),
                    "opened inside the shared buffer"
                );
            }
        }
        assert_eq!(target.stats().auth_failures, 0);
    }
}

#[test]
fn a_transfer_its_holder_has_to_itself_is_opened_in_place() {
    let (init, target) = pair(Cipher::Aes256Gcm, 65536);
    let target = Arc::new(target);
    let pool = CryptoPool::new(2).unwrap();
    let b = binding(1);
    let data = vec![0x3cu8; 65536];
    let sealed = Bytes::from(init.seal_copy(&b, &data).unwrap().to_vec());
    let at = sealed.as_ptr();
    let opened = block_on(pool.open_shared(&target, b, sealed)).unwrap();
    assert_eq!(&opened[..], &data[..]);
    assert_eq!(opened.as_ptr(), at, "a unique buffer is opened where it is");
}

#[test]
fn a_shared_transfer_is_verified_before_it_is_used_and_never_twice() {
    for cipher in [
        Cipher::Aes256Gcm,
        Cipher::ChaCha20Poly1305,
        Cipher::TripleDesCbcHmacSha1,
    ] {
        let (init, target) = pair(cipher, 4096);
        let target = Arc::new(target);
        let pool = CryptoPool::new(2).unwrap();
        let b = binding(7);
        let data: Vec<u8> = (0..20_000u32).map(|j| (j * 3) as u8).collect();
        let sealed = init.seal_copy(&b, &data).unwrap();
        for at in [0, 4096 * 3 + 17, 19_999, sealed.len() - 1] {
            let mut bad = sealed.to_vec();
            bad[at] ^= 0x10;
            let (slice, _rx) = shared(&bad);
            let e = block_on(pool.open_shared(&target, b, slice)).unwrap_err();
            assert!(
                matches!(
                    e,
                    OpenError::Authentication { .. } | OpenError::Replay { .. }
                ),
                "{cipher}: flip at {at} gave {e:?}"
            );
        }
        // Another command's binding does not open it either.
        let (slice, _rx) = shared(&sealed);
        let moved = Binding { lba: 8192, ..b };
        assert!(block_on(pool.open_shared(&target, moved, slice)).is_err());
        assert!(target.stats().auth_failures >= 5, "{cipher}");
        // The failures spent no counter: the genuine transfer opens once, then is a replay.
        let (slice, _rx) = shared(&sealed);
        let opened = block_on(pool.open_shared(&target, b, slice.clone())).unwrap();
        assert_eq!(&opened[..], &data[..]);
        assert!(matches!(
            block_on(pool.open_shared(&target, b, slice)),
            Err(OpenError::Replay { .. })
        ));
        assert_eq!(target.stats().replays, 1);
    }
}
