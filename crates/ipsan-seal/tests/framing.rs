#![allow(clippy::unwrap_used, clippy::expect_used)]
//! Seal/open of whole commands: round trips, tamper, replay and relocation rejection, the pool.

mod support;
use std::sync::Arc;

use bytes::BytesMut;
use ipsan_seal::{Binding, Cipher, CryptoPool, OpenError, SealError};
use proptest::prelude::*;
use support::keys::pair;

const PROTECTING: [Cipher; 3] = [
    Cipher::Aes256Gcm,
    Cipher::ChaCha20Poly1305,
    Cipher::TripleDesCbcHmacSha1,
];

fn write_binding() -> Binding {
    Binding {
        lun: 0x0001_0000_0000_0000,
        lba: 2048,
        blocks: 8,
        opcode: 0x2a,
        task_tag: 17,
    }
}

fn buf(data: &[u8]) -> BytesMut {
    BytesMut::from(data)
}

fn cipher_strategy() -> impl Strategy<Value = Cipher> {
    prop::sample::select(Cipher::ALL.to_vec())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn seal_then_open_returns_the_plaintext(
        cipher in cipher_strategy(),
        data in prop::collection::vec(any::<u8>(), 0..5000),
        chunk_blocks in 1u32..4,
    ) {
        let (init, target) = pair(cipher, chunk_blocks * 512);
        let b = write_binding();
        let sealed = init.seal(&b, buf(&data)).unwrap();
        prop_assert_eq!(sealed.len(), init.sealed_len(data.len()).unwrap());
        prop_assert_eq!(target.plain_len(sealed.len()), Some(data.len()));
        let opened = target.open(&b, buf(&sealed)).unwrap();
        prop_assert_eq!(&opened[..], &data[..]);
    }

    #[test]
    fn any_bit_flip_is_rejected(
        cipher in prop::sample::select(PROTECTING.to_vec()),
        data in prop::collection::vec(any::<u8>(), 1..3000),
        pos in any::<prop::sample::Index>(),
        bit in 0u8..8,
    ) {
        let (init, target) = pair(cipher, 1024);
        let b = write_binding();
        let sealed = init.seal(&b, buf(&data)).unwrap();
        let mut bad = buf(&sealed);
        let i = pos.index(bad.len());
        bad[i] ^= 1 << bit;
        let r = target.open(&b, bad);
        prop_assert!(
            matches!(r, Err(OpenError::Authentication { .. }) | Err(OpenError::Replay { .. })),
            "flip at {} of {} accepted: {:?}", i, sealed.len(), r.map(|_| ())
        );
        // The untouched original still opens: a rejected attempt does not burn its counters.
        prop_assert_eq!(&target.open(&b, buf(&sealed)).unwrap()[..], &data[..]);
    }
}

#[test]
fn rejects_a_replayed_command() {
    for cipher in PROTECTING {
        let (init, target) = pair(cipher, 4096);
        let b = write_binding();
        let sealed = init.seal(&b, buf(&[0x5a; 4096])).unwrap();
        target.open(&b, buf(&sealed)).unwrap();
        let e = target.open(&b, buf(&sealed)).unwrap_err();
        assert!(
            matches!(e, OpenError::Replay { counter: 0 }),
            "{cipher}: {e}"
        );
        assert_eq!(target.stats().replays, 1);
    }
}

#[test]
fn rejects_data_relocated_to_another_lun_block_command_or_task() {
    for cipher in PROTECTING {
        let (init, target) = pair(cipher, 4096);
        let b = write_binding();
        let sealed = init.seal(&b, buf(&[1u8; 4096])).unwrap();
        let moved = [
            Binding { lun: 0, ..b },
            Binding {
                lba: b.lba + 8,
                ..b
            },
            Binding { blocks: 9, ..b },
            Binding { opcode: 0x8a, ..b },
            Binding { task_tag: 18, ..b },
        ];
        for m in moved {
            let e = target.open(&m, buf(&sealed)).unwrap_err();
            assert!(
                matches!(e, OpenError::Authentication { chunk: 0 }),
                "{cipher} {m:?}: {e}"
            );
        }
        assert_eq!(target.stats().auth_failures, 5);
        // And the genuine binding still opens.
        target.open(&b, buf(&sealed)).unwrap();
    }
}

#[test]
fn rejects_chunks_swapped_within_a_command() {
    for cipher in PROTECTING {
        let (init, target) = pair(cipher, 512);
        let b = write_binding();
        let mut data = vec![0u8; 1024];
        data[512..].fill(0xff);
        let sealed = init.seal(&b, buf(&data)).unwrap();
        let mut swapped = buf(&sealed);
        let (first, second) = swapped[..1024].split_at_mut(512);
        first.swap_with_slice(second);
        let t = cipher.tag_len();
        let tags = &mut swapped[1024 + 8..];
        let (t0, t1) = tags.split_at_mut(t);
        t0.swap_with_slice(t1);
        assert!(
            matches!(
                target.open(&b, swapped),
                Err(OpenError::Authentication { .. })
            ),
            "{cipher}"
        );
    }
}

#[test]
fn rejects_data_reflected_back_in_the_other_direction() {
    for cipher in PROTECTING {
        let (init, target) = pair(cipher, 4096);
        let b = write_binding();
        // The target's READ data presented back to the target as WRITE data.
        let read = target.seal(&b, buf(&[9u8; 4096])).unwrap();
        assert!(target.open(&b, buf(&read)).is_err(), "{cipher}");
        // The initiator's WRITE data presented back to the initiator as READ data.
        let write = init.seal(&b, buf(&[9u8; 4096])).unwrap();
        assert!(init.open(&b, buf(&write)).is_err(), "{cipher}");
    }
}

#[test]
fn rejects_truncated_or_padded_transfers() {
    let (init, target) = pair(Cipher::Aes256Gcm, 4096);
    let b = write_binding();
    let sealed = init.seal(&b, buf(&[3u8; 8192])).unwrap();
    let short = buf(&sealed[..sealed.len() - 1]);
    assert!(target.open(&b, short).is_err());
    let mut long = buf(&sealed);
    long.extend_from_slice(&[0]);
    assert!(target.open(&b, long).is_err());
    // Dropping a whole chunk changes the plaintext length bound into every tag.
    let mut dropped = buf(&sealed[4096..8192]);
    dropped.extend_from_slice(&sealed[8192..8200]);
    dropped.extend_from_slice(&sealed[8200 + 16..]);
    assert!(target.open(&b, dropped).is_err());
}

#[test]
fn sealed_data_does_not_contain_the_plaintext() {
    for cipher in PROTECTING {
        let (init, _) = pair(cipher, 65536);
        let marker = b"MARKER-0123456789-SEAL-MUST-HIDE";
        let data: Vec<u8> = marker.iter().copied().cycle().take(65536).collect();
        let sealed = init.seal(&write_binding(), buf(&data)).unwrap();
        assert!(
            !sealed.windows(8).any(|w| w == &marker[..8]),
            "{cipher} leaked the marker"
        );
    }
}

#[test]
fn none_cipher_keeps_framing_but_exposes_data() {
    let (init, target) = pair(Cipher::None, 4096);
    let b = write_binding();
    let sealed = init.seal(&b, buf(&[4u8; 5000])).unwrap();
    assert_eq!(sealed.len(), 5000 + 8 + 2 * 16);
    assert_eq!(&sealed[..5000], &[4u8; 5000][..]);
    assert_eq!(
        &target.open(&b, buf(&sealed)).unwrap()[..],
        &[4u8; 5000][..]
    );
}

#[test]
fn refuses_to_seal_when_the_counter_would_wrap() {
    let (init, _) = pair(Cipher::Aes256Gcm, 4096);
    let init = init.with_counter_range_for_test(u64::MAX - 2, u64::MAX);
    let b = write_binding();
    init.seal(&b, buf(&[0u8; 8192])).unwrap(); // counters MAX-2, MAX-1
    assert_eq!(
        init.seal(&b, buf(&[0u8; 512])).unwrap_err(),
        SealError::CounterExhausted
    );
}

#[test]
fn counters_are_never_reused_across_commands() {
    let (init, _) = pair(Cipher::Aes256Gcm, 4096);
    let b = write_binding();
    let mut seen = std::collections::HashSet::new();
    for len in [1usize, 4096, 4097, 20000] {
        let s = init.seal(&b, buf(&vec![0u8; len])).unwrap();
        let n = init.plain_len(s.len()).unwrap();
        let base = u64::from_be_bytes(s[n..n + 8].try_into().unwrap());
        for c in base..base + n.div_ceil(4096) as u64 {
            assert!(seen.insert(c), "counter {c} reused");
        }
    }
}

fn block_on<F: std::future::Future>(f: F) -> F::Output {
    tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap()
        .block_on(f)
}

#[test]
fn pool_seal_and_open_match_the_session_and_run_chunks_in_parallel() {
    for cipher in Cipher::ALL {
        let (init, target) = pair(cipher, 4096);
        let (init, target) = (Arc::new(init), Arc::new(target));
        let pool = CryptoPool::new(2).unwrap();
        let b = write_binding();
        let data: Vec<u8> = (0..100_000u32).map(|i| (i * 7) as u8).collect();
        // Pool seal, session open.
        let sealed = block_on(pool.seal(&init, b, buf(&data))).unwrap();
        assert_eq!(&target.open(&b, buf(&sealed)).unwrap()[..], &data[..]);
        // Session seal, pool open.
        let sealed = init.seal(&b, buf(&data)).unwrap();
        let opened = block_on(pool.open(&target, b, buf(&sealed))).unwrap();
        assert_eq!(&opened[..], &data[..]);
        // Many commands queued before any is awaited (pre-sealing), opened out of order.
        let futs: Vec<_> = (0..8)
            .map(|i| pool.seal(&init, Binding { task_tag: i, ..b }, buf(&data)))
            .collect();
        let sealed: Vec<_> = futs.into_iter().map(|f| block_on(f).unwrap()).collect();
        for (i, s) in sealed.iter().enumerate().rev() {
            let bi = Binding {
                task_tag: i as u32,
                ..b
            };
            let opened = block_on(pool.open(&target, bi, buf(s))).unwrap();
            assert_eq!(&opened[..], &data[..]);
        }
    }
}

#[test]
fn seal_copy_leaves_the_plaintext_and_opens_for_every_size_and_pool_width() {
    // Sizes around chunk boundaries; pools of 1-4 workers, idle (the command is split across
    // workers) and saturated (one job per command); every way of sealing opens every way.
    let chunk = 1024usize;
    for cipher in Cipher::ALL {
        let (init, target) = pair(cipher, chunk as u32);
        let (init, target) = (Arc::new(init), Arc::new(target));
        for workers in 1..=4 {
            let pool = CryptoPool::new(workers).unwrap();
            // Commands up to `Cipher::inline_max` are sealed on the caller's thread; the
            // larger ones take the pool's split and single-job paths.
            for (i, n) in [
                1,
                chunk - 1,
                chunk,
                chunk + 1,
                5 * chunk + 3,
                16 * chunk,
                80 * chunk + 7,
            ]
            .into_iter()
            .enumerate()
            {
                let data: Vec<u8> = (0..n).map(|j| (j * 31 + i) as u8).collect();
                let plain = bytes::Bytes::from(data.clone());
                let b = Binding {
                    task_tag: (workers * 100 + i) as u32,
                    ..write_binding()
                };
                let inline = init.seal_copy(&b, &plain).unwrap();
                assert_eq!(inline.len(), init.sealed_len(n).unwrap());
                assert_eq!(&plain[..], &data[..], "seal_copy must not touch its input");
                // Saturate the pool with queued commands so the next one is a single job.
                let queued: Vec<_> = (0..2 * workers)
                    .map(|k| {
                        let bk = Binding {
                            task_tag: 1_000_000 + k as u32,
                            ..b
                        };
                        pool.seal_copy(&init, bk, plain.clone())
                    })
                    .collect();
                let busy = block_on(pool.seal_copy(&init, b, plain.clone())).unwrap();
                for f in queued {
                    block_on(f).unwrap();
                }
                // An idle pool splits the command across its workers.
                let idle = block_on(pool.seal_copy(&init, b, plain.clone())).unwrap();
                for sealed in [inline, busy, idle] {
                    let opened = block_on(pool.open(&target, b, buf(&sealed))).unwrap();
                    assert_eq!(&opened[..], &data[..], "{cipher} workers={workers} n={n}");
                }
            }
        }
    }
}

#[test]
fn small_commands_are_sealed_and_opened_on_the_callers_thread_even_when_workers_are_busy() {
    use std::future::Future;
    use std::task::{Context, Poll, Waker};
    fn first_poll<F: Future>(f: F) -> Poll<F::Output> {
        std::pin::pin!(f).poll(&mut Context::from_waker(Waker::noop()))
    }
    let pool = CryptoPool::new(1).unwrap();
    // Keeps the one worker busy for a while: 3DES runs at tens of MB/s.
    let (slow, _) = pair(Cipher::TripleDesCbcHmacSha1, 65536);
    let slow = Arc::new(slow);
    for cipher in [Cipher::Aes256Gcm, Cipher::ChaCha20Poly1305, Cipher::None] {
        let (init, target) = pair(cipher, 4096);
        let (init, target) = (Arc::new(init), Arc::new(target));
        let n = cipher.inline_max();
        assert!(n >= 4096, "{cipher}: small commands should run inline");
        let busy = pool.seal(&slow, write_binding(), buf(&vec![0u8; 4 << 20]));
        let data: Vec<u8> = (0..n).map(|j| (j * 13) as u8).collect();
        let b = write_binding();
        // Ready at the first poll: sealed here, not queued behind the busy worker.
        let Poll::Ready(sealed) = first_poll(pool.seal(&init, b, buf(&data))) else {
            panic!("{cipher}: a {n}-byte seal waited for the worker");
        };
        let sealed = sealed.unwrap();
        let Poll::Ready(copy) = first_poll(pool.seal_copy(&init, b, data.clone().into())) else {
            panic!("{cipher}: a {n}-byte seal_copy waited for the worker");
        };
        let copy = copy.unwrap();
        // Counters were reserved in call order; both open, each exactly once.
        for s in [&sealed, &copy] {
            let Poll::Ready(opened) = first_poll(pool.open(&target, b, buf(s))) else {
                panic!("{cipher}: a {n}-byte open waited for the worker");
            };
            assert_eq!(&opened.unwrap()[..], &data[..]);
        }
        if cipher.protects() {
            let replayed = first_poll(pool.open(&target, b, buf(&sealed)));
            assert!(
                matches!(replayed, Poll::Ready(Err(OpenError::Replay { .. }))),
                "{cipher}: {replayed:?}"
            );
            // Tampered inline: rejected, counted, nothing returned.
            let fresh = init.seal(&b, buf(&data)).unwrap();
            let mut bad = buf(&fresh);
            bad[n / 2] ^= 1;
            let before = target.stats().auth_failures;
            let r = first_poll(pool.open(&target, b, bad));
            assert!(
                matches!(r, Poll::Ready(Err(OpenError::Authentication { .. }))),
                "{cipher}: {r:?}"
            );
            assert_eq!(target.stats().auth_failures, before + 1);
        }
        // One byte over: the pool's path, still correct.
        let big: Vec<u8> = (0..=n).map(|j| (j * 5) as u8).collect();
        let sealed = block_on(pool.seal(&init, b, buf(&big))).unwrap();
        assert_eq!(
            &block_on(pool.open(&target, b, buf(&sealed))).unwrap()[..],
            &big[..]
        );
        block_on(busy).unwrap();
    }
}

/// `none` does no per-byte work in place (its seal writes zero tags, its open checks no tag),
/// so a command of any size is sealed and opened in place on the caller's thread: no hand-off
/// to a worker and no wake-up for nothing (issue 27). Its framing checks stay: a replayed or
/// mis-sized transfer is still refused, inline.
#[test]
fn none_seals_and_opens_in_place_on_the_callers_thread_at_any_size_and_still_refuses_replays() {
    use std::future::Future;
    use std::task::{Context, Poll, Waker};
    fn first_poll<F: Future>(f: F) -> Poll<F::Output> {
        std::pin::pin!(f).poll(&mut Context::from_waker(Waker::noop()))
    }
    let pool = CryptoPool::new(1).unwrap();
    // Keeps the one worker busy: anything queued behind it is not ready at its first poll.
    let (slow, _) = pair(Cipher::TripleDesCbcHmacSha1, 65536);
    let busy = pool.seal(&Arc::new(slow), write_binding(), buf(&vec![0u8; 4 << 20]));
    let (init, target) = pair(Cipher::None, 65536);
    let (init, target) = (Arc::new(init), Arc::new(target));
    let b = write_binding();
    let data: Vec<u8> = (0..(4usize << 20) + 3).map(|j| (j * 7) as u8).collect();
    let Poll::Ready(sealed) = first_poll(pool.seal(&init, b, buf(&data))) else {
        panic!("a 4 MiB `none` seal waited for the worker");
    };
    let sealed = sealed.unwrap();
    assert_eq!(sealed.len(), init.sealed_len(data.len()).unwrap());
    let Poll::Ready(opened) = first_poll(pool.open(&target, b, buf(&sealed))) else {
        panic!("a 4 MiB `none` open waited for the worker");
    };
    assert_eq!(&opened.unwrap()[..], &data[..]);
    let replayed = first_poll(pool.open(&target, b, buf(&sealed)));
    assert!(
        matches!(replayed, Poll::Ready(Err(OpenError::Replay { .. }))),
        "{replayed:?}"
    );
    assert_eq!(target.stats().replays, 1);
    // 9 bytes: shorter than any sealed form (8-byte counter and a 16-byte tag at least).
    let cut = first_poll(pool.open(&target, b, buf(&sealed[..9])));
    assert!(
        matches!(cut, Poll::Ready(Err(OpenError::BadLength(9)))),
        "{cut:?}"
    );
    // A sealed copy copies every byte: it stays on the pool (and still opens).
    let copy = block_on(pool.seal_copy(&init, b, data.clone().into())).unwrap();
    assert_eq!(
        &block_on(pool.open(&target, b, buf(&copy))).unwrap()[..],
        &data[..]
    );
    block_on(busy).unwrap();
}

#[test]
fn pool_open_rejects_tampering_and_counts_it() {
    let (init, target) = pair(Cipher::Aes256Gcm, 4096);
    let (init, target) = (Arc::new(init), Arc::new(target));
    let pool = CryptoPool::new(2).unwrap();
    let b = write_binding();
    let sealed = init.seal(&b, buf(&[0x11; 40000])).unwrap();
    let mut bad = buf(&sealed);
    bad[30000] ^= 0x80;
    let e = block_on(pool.open(&target, b, bad)).unwrap_err();
    assert_eq!(e, OpenError::Authentication { chunk: 7 });
    assert_eq!(target.stats().auth_failures, 1);
    // A failed attempt does not consume the counters: the genuine data still opens once.
    block_on(pool.open(&target, b, buf(&sealed))).unwrap();
    assert!(matches!(
        block_on(pool.open(&target, b, buf(&sealed))),
        Err(OpenError::Replay { .. })
    ));
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn garbage_never_opens_and_never_panics(
        cipher in cipher_strategy(),
        junk in prop::collection::vec(any::<u8>(), 0..3000),
    ) {
        let (_, target) = pair(cipher, 512);
        let r = target.open(&write_binding(), buf(&junk));
        if junk.is_empty() {
            prop_assert!(r.unwrap().is_empty());
        } else if cipher.protects() {
            prop_assert!(r.is_err());
        }
    }
}

#[test]
fn counter_test_hook_cannot_rewind_the_counter() {
    let (init, _) = pair(Cipher::Aes256Gcm, 4096);
    let b = write_binding();
    let first = init.seal(&b, buf(&[0u8; 4096])).unwrap();
    let init = init.with_counter_range_for_test(0, u64::MAX);
    let second = init.seal(&b, buf(&[0u8; 4096])).unwrap();
    assert_ne!(first[4096..4104], second[4096..4104], "counter reused");
}

#[test]
fn accepts_transfers_sealed_into_a_reused_buffer_and_leaves_nothing_of_the_previous_one() {
    // Large sealed copies reuse the buffer of a transfer that has been dropped (sent); the new
    // transfer must overwrite every byte of it: it opens, and under `none` (whose sealed form
    // is exactly plaintext || counter || zero tags) no byte of the old transfer shows.
    let chunk = 64 * 1024;
    for cipher in Cipher::ALL {
        let (init, target) = pair(cipher, chunk as u32);
        let (init, target) = (Arc::new(init), Arc::new(target));
        let pool = CryptoPool::new(2).unwrap();
        let old = bytes::Bytes::from(vec![0xa5u8; 1 << 20]);
        let mut reused = 0;
        for (k, n) in [1usize << 20, (1 << 20) - 5000, 3 * chunk + 1, 1 << 20]
            .into_iter()
            .enumerate()
        {
            let b = Binding {
                task_tag: k as u32,
                ..write_binding()
            };
            let first = block_on(pool.seal_copy(&init, b, old.clone())).unwrap();
            let at = first.as_ptr();
            drop(first);
            let data: Vec<u8> = (0..n).map(|j| (j * 13 + k) as u8).collect();
            let plain = bytes::Bytes::from(data.clone());
            let b2 = Binding {
                task_tag: 100 + k as u32,
                ..b
            };
            let sealed = if k % 2 == 0 {
                block_on(pool.seal_copy(&init, b2, plain.clone())).unwrap()
            } else {
                init.seal_copy(&b2, &plain).unwrap()
            };
            reused += usize::from(sealed.as_ptr() == at);
            assert_eq!(sealed.len(), init.sealed_len(n).unwrap());
            if cipher == Cipher::None {
                assert_eq!(&sealed[..n], &data[..]);
                assert!(sealed[n + 8..].iter().all(|&x| x == 0), "stale tag bytes");
            }
            assert_eq!(&plain[..], &data[..], "seal_copy must not touch its input");
            let opened = target.open(&b2, buf(&sealed)).unwrap();
            assert_eq!(&opened[..], &data[..], "{cipher} n={n}");
        }
        assert!(
            reused >= 3,
            "{cipher}: buffers were reused {reused} of 4 times"
        );
    }
}
