#![allow(clippy::unwrap_used, clippy::expect_used)]
//! The counter limit on the receiving side and the re-key high-water mark (issue 8): a peer
//! that seals past the limit, or with counters that would wrap, is refused before any chunk is
//! opened, and `rekey_due` fires at 7/8 of the counter space in either direction.

mod support;

use bytes::BytesMut;
use ipsan_seal::{Binding, Cipher, OpenError};
use support::keys::pair;

fn binding() -> Binding {
    Binding {
        lun: 0,
        lba: 64,
        blocks: 8,
        opcode: 0x2a,
        task_tag: 5,
    }
}

#[test]
fn rejects_a_range_past_the_receivers_limit_without_opening_it() {
    let (init, target) = pair(Cipher::Aes256Gcm, 4096);
    let target = target.with_counter_range_for_test(0, 3);
    let b = binding();
    // Counters 0, 1: within the limit.
    let s = init.seal(&b, BytesMut::from(&[7u8; 8192][..])).unwrap();
    target.open(&b, BytesMut::from(&s[..])).unwrap();
    // Counters 2, 3: the range ends at 4 > 3.
    let s = init.seal(&b, BytesMut::from(&[7u8; 8192][..])).unwrap();
    let e = target.open(&b, BytesMut::from(&s[..])).unwrap_err();
    assert_eq!(e, OpenError::CounterLimit { counter: 2 });
    assert_eq!(
        target.stats().opened_chunks,
        2,
        "nothing of the refused range opened"
    );
}

#[test]
fn rejects_counters_that_would_wrap() {
    let (init, target) = pair(Cipher::ChaCha20Poly1305, 4096);
    let init = init.with_counter_range_for_test(u64::MAX - 2, u64::MAX);
    let b = binding();
    let mut s = BytesMut::from(&init.seal(&b, BytesMut::from(&[1u8; 8192][..])).unwrap()[..]);
    // The trailer's counter rewritten so the range would run past u64::MAX.
    let n = init.plain_len(s.len()).unwrap();
    s[n..n + 8].copy_from_slice(&u64::MAX.to_be_bytes());
    assert_eq!(
        target.open(&b, s).unwrap_err(),
        OpenError::CounterLimit { counter: u64::MAX }
    );
}

#[test]
fn rekey_is_due_at_seven_eighths_in_either_direction() {
    let (init, target) = pair(Cipher::Aes256Gcm, 512);
    let init = init.with_counter_range_for_test(0, 64);
    let target = target.with_counter_range_for_test(0, 64);
    assert_eq!(init.rekey_mark(), 56);
    let b = binding();
    // 55 chunks sent and opened: not yet.
    let s = init.seal(&b, BytesMut::from(&[0u8; 55 * 512][..])).unwrap();
    target.open(&b, BytesMut::from(&s[..])).unwrap();
    assert_eq!(init.counters_used(), (55, 0));
    assert_eq!(target.counters_used(), (0, 55));
    assert!(!init.rekey_due() && !target.rekey_due());
    // One more: the sender sees its own counter, the receiver the peer's.
    let s = init.seal(&b, BytesMut::from(&[0u8; 512][..])).unwrap();
    assert!(init.rekey_due(), "sender side");
    assert!(!target.rekey_due(), "not before it opened it");
    target.open(&b, BytesMut::from(&s[..])).unwrap();
    assert!(target.rekey_due(), "receiver side");
    // Unlowered sessions are nowhere near it.
    let (i, t) = pair(Cipher::Aes256Gcm, 512);
    assert!(!i.rekey_due() && !t.rekey_due());
    assert_eq!(i.counter_limit(), u64::MAX);
}
