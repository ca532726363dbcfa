//! The full feature phase as one sans-IO engine for both roles (RFC 7143 §4–§11), in the
//! shape of quinn-proto's `Connection`: inputs are `handle_pdu(now, pdu)`,
//! `handle_timeout(now)` and the role's methods; outputs are `poll_transmit()` (PDUs with
//! their sequence numbers stamped at the moment they leave), `poll_timeout()` and
//! `poll_event()`. No sockets, no clock, no locks: the tokio drivers in `ipsan-target` and
//! `ipsan-initiator` move the bytes and pass the time in. The initiator's driver talks to a
//! [`session::Session`], which owns the current [`initiator::Connection`].
//!
//! # Layout
//! - [`target`]: the target's connection: CmdSN window admission, the task table, R2T
//!   generation, Data-In segmentation and status, residuals, task management with data in
//!   flight, NOP-In pings, text, logout. [`target::session`]: a target session of several
//!   connections (MaxConnections > 1): one CmdSN window over them, commands from any connection
//!   run in CmdSN order, StatSN and task allegiance per connection, connections joining (TSIH
//!   login), reinstated (same CID) and logged out one at a time. At ErrorRecoveryLevel 1 a
//!   connection answers SNACK from the completed tasks it keeps until their status is
//!   acknowledged; at level 2 a failed connection's tasks stay in the session for TASK REASSIGN
//!   (`target/recovery.rs`, `target/session/orphans.rs`). One concern per file: `target.rs`
//!   the types, the connection's state, its inputs and outputs; `target/write.rs` a SCSI
//!   Command and its data-out (R2T, Data-Out); `target/status.rs` Data-In and status;
//!   `target/tmf.rs` task management; `target/requests.rs` NOP-Out, Text, Logout;
//!   `target/sealed.rs` a Seal session's sizing of a command; `target/tests.rs`.
//! - [`initiator`]: the initiator's connection: the CmdSN window as seen from the initiator,
//!   command submission with immediate and unsolicited data, R2T checking and answering,
//!   Data-In reassembly, task management, command timeouts (ABORT TASK, then LOGICAL UNIT
//!   RESET, then the connection), NOP-Out keepalive, logout. One concern per file:
//!   `initiator.rs` the types, the connection's state, its inputs and outputs;
//!   `initiator/write.rs` submission, the SCSI Command, R2T and Data-Out; `initiator/read.rs`
//!   Data-In and the SCSI Response; `initiator/tmf.rs` task management, timeouts, logout;
//!   `initiator/recovery.rs` ErrorRecoveryLevel 2's moved tasks and TASK REASSIGN;
//!   `initiator/tests.rs`.
//! - [`session`]: the initiator's session above its connection: the task table that outlives
//!   one connection (each task's CDB, LUN and data as `Bytes`), ITTs unique across the
//!   session's connections, and session recovery's reissue policy (RFC 7143 §6.3.5: which
//!   commands in flight at a loss go again on the next connection, [`session::Config::idempotent`],
//!   and what the others end with); it drives one [`initiator::Connection`] at a time.
//! - [`mcs`]: the initiator's session of several connections (MaxConnections > 1): one CmdSN
//!   window over them, each command on the connection with the fewest outstanding bytes (or
//!   in turn) when the window lets it go, ExpStatSN and task allegiance per connection,
//!   connections added (TSIH login) and logged out one at a time; ErrorRecoveryLevel 2's seam
//!   (a connection's tasks listed, a task moved whole to another connection).
//! - [`residual`]: the target's overflow and underflow rules (RFC 7143 §11.4.5.1): which
//!   bytes of an overflowing write are written (the CDB's transfer length rewritten), and the
//!   residual a status reports; every path of the target driver applies them from here.
//! - [`text`]: the target's answers to Text Requests: SendTargets from a [`text::Directory`]
//!   the driver implements, Reject / NotUnderstood for other keys.
//! - [`r2t`]: the target's bookkeeping of one write's data phase (R2TSN, DataSN, offsets,
//!   MaxOutstandingR2T, burst limits).
//! - This module: what both roles share: tags, errors typed by scope, sense bytes.
//!
//! Errors carry their scope (STYLE.md, h2): a task error ends one command (status and sense,
//! an abort, a Reject of its PDU), a [`ConnectionError`] ends the connection and says which
//! side ended it and why; nothing here is a free-form string.

pub mod initiator;
pub mod mcs;
pub mod r2t;
pub mod residual;
pub mod session;
pub mod target;
pub mod text;

use std::collections::{HashMap, HashSet};
use std::hash::{BuildHasher, Hasher};

use iscsi_wire::header::RejectReason;
use iscsi_wire::{Opcode, RESERVED_TAG};

/// Hands out Initiator or Target Transfer Tags: never the reserved 0xffffffff (RFC 7143
/// §11.2.1.8, §11.8.3), never 0, wrapping after 0xfffffffe. One allocator per connection and
/// kind, so no code path can invent its own tag arithmetic.
#[derive(Clone, Debug)]
pub struct TagAllocator {
    next: u32,
}

impl Default for TagAllocator {
    fn default() -> Self {
        Self { next: 1 }
    }
}

impl TagAllocator {
    /// An allocator whose first tag is `first` (0 and the reserved tag are skipped).
    #[must_use]
    pub fn starting_at(first: u32) -> Self {
        let mut a = Self { next: first };
        a.skip_reserved();
        a
    }

    fn skip_reserved(&mut self) {
        if self.next == RESERVED_TAG || self.next == 0 {
            self.next = 1;
        }
    }

    /// The tag [`TagAllocator::next_tag`] hands out next, without taking it.
    #[must_use]
    pub fn peek(&self) -> u32 {
        if self.next == RESERVED_TAG || self.next == 0 {
            1
        } else {
            self.next
        }
    }

    /// The next tag.
    pub fn next_tag(&mut self) -> u32 {
        self.skip_reserved();
        let t = self.next;
        self.next = self.next.wrapping_add(1);
        self.skip_reserved();
        t
    }
}

/// Hashes task tags that this side hands out itself ([`TagAllocator`]: the initiator's ITTs):
/// one multiply instead of SipHash. A table keyed by them holds only tags we chose, so a peer
/// cannot fill it with colliding keys (a peer's tags may be *looked up*, which costs a probe,
/// never an entry). Tables keyed by the peer's tags (the target's tasks by the initiator's
/// ITTs) use [`PeerTags`], keyed.
#[derive(Clone, Copy, Debug, Default)]
pub struct OwnTags;

/// The hasher of [`OwnTags`].
#[derive(Clone, Copy, Debug, Default)]
pub struct OwnTagHasher(u64);

impl BuildHasher for OwnTags {
    type Hasher = OwnTagHasher;
    fn build_hasher(&self) -> OwnTagHasher {
        OwnTagHasher(0)
    }
}

/// 2^64 ÷ φ, odd: consecutive tags land far apart in both the low bits (bucket) and the
/// high bits (hashbrown's control byte).
const GOLDEN: u64 = 0x9e37_79b9_7f4a_7c15;

impl Hasher for OwnTagHasher {
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0.rotate_left(8) ^ u64::from(b)).wrapping_mul(GOLDEN);
        }
    }

    fn write_u32(&mut self, n: u32) {
        self.0 = (self.0 ^ u64::from(n)).wrapping_mul(GOLDEN);
    }

    fn finish(&self) -> u64 {
        // The product's low bits depend only on the tag's low bits; fold the well-mixed high
        // half in.
        self.0 ^ (self.0 >> 32)
    }
}

/// A table keyed by tags this side allocated (see [`OwnTags`]).
pub type OwnTagMap<V> = HashMap<u32, V, OwnTags>;
/// A set of tags this side allocated (see [`OwnTags`]).
pub type OwnTagSet = HashSet<u32, OwnTags>;

/// Hashes task tags the *peer* chose (the target's tasks by the initiator's ITTs, RFC 7143
/// §11.2.1.8): a folded multiply keyed by two random words drawn per table, about ten
/// instructions where the standard hasher (SipHash-1-3) takes ~110 per lookup (a second,
/// unkeyed folded multiply in `finish` spreads the keyed one's result over every bit).
///
/// Why this is safe against a peer that picks colliding tags (HashDoS), two arguments each
/// enough on its own:
/// - **The key is secret and the function keyed**: `h = lo ^ hi` of the 128-bit product
///   `(tag ^ k0) * k1` (k1 odd), both words random per table ([`PeerTags::new`]) and never
///   shown (`Debug` prints neither), folded once more through a multiply. hashbrown takes the
///   bucket from the hash's low bits and the control byte from its top 7: every bit depends
///   on the whole tag and on both keys, so which tags collide differs per table and the
///   peer, who sees no hash value, cannot choose them (the construction of foldhash and
///   ahash's fallback: a keyed folded multiply, then another).
/// - **The tables are small and bounded** whatever the keys: the target's task table holds at
///   most the CmdSN window's non-immediate tasks plus [`target::MAX_IMMEDIATE_TASKS`]
///   immediate ones per connection (`target.rs`, `Connection::tasks`, says why each kind is
///   bounded; `target/tests.rs` floods it), so even tags that all collided would cost a probe
///   over at most that many entries, not a growing chain.
#[derive(Clone, Copy)]
pub struct PeerTags {
    k0: u64,
    k1: u64,
}

impl PeerTags {
    /// Fresh random keys (the thread's CSPRNG): one draw per table, when an engine is made.
    #[must_use]
    pub fn new() -> Self {
        let [k0, k1]: [u64; 2] = rand::random();
        Self { k0, k1: k1 | 1 }
    }
}

impl Default for PeerTags {
    fn default() -> Self {
        Self::new()
    }
}

/// The keys are secret: `Debug` names the type only.
impl std::fmt::Debug for PeerTags {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("PeerTags(..)")
    }
}

/// The hasher of [`PeerTags`].
#[derive(Clone, Copy)]
pub struct PeerTagHasher {
    keys: PeerTags,
    h: u64,
}

impl std::fmt::Debug for PeerTagHasher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("PeerTagHasher(..)")
    }
}

impl BuildHasher for PeerTags {
    type Hasher = PeerTagHasher;
    fn build_hasher(&self) -> PeerTagHasher {
        PeerTagHasher { keys: *self, h: 0 }
    }
}

/// `lo ^ hi` of the 128-bit product `a * b`.
fn folded_multiply(a: u64, b: u64) -> u64 {
    let p = u128::from(a) * u128::from(b);
    (p as u64) ^ ((p >> 64) as u64)
}

impl PeerTagHasher {
    /// Folds a word in, keyed: `folded_multiply(h ^ word ^ k0, k1)`.
    fn mix(&mut self, word: u64) {
        self.h = folded_multiply(self.h ^ word ^ self.keys.k0, self.keys.k1);
    }
}

impl Hasher for PeerTagHasher {
    fn write(&mut self, bytes: &[u8]) {
        for chunk in bytes.chunks(8) {
            let mut w = [0u8; 8];
            w[..chunk.len()].copy_from_slice(chunk);
            self.mix(u64::from_le_bytes(w));
        }
    }

    fn write_u32(&mut self, n: u32) {
        self.mix(u64::from(n));
    }

    fn finish(&self) -> u64 {
        // A second round: after one, the product's low bits depend only on the word's low
        // bits (tags equal there would share `lo`'s low bits, and a bucket index takes them);
        // folding the whole first result through another multiply spreads every bit.
        folded_multiply(self.h, GOLDEN)
    }
}

/// A table keyed by tags the peer chose (see [`PeerTags`]).
pub type PeerTagMap<V> = HashMap<u32, V, PeerTags>;
/// A set of tags the peer chose (see [`PeerTags`]).
pub type PeerTagSet = HashSet<u32, PeerTags>;

/// Which side of the connection did something.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Side {
    Initiator,
    Target,
}

/// A rule of RFC 7143 the peer broke. Each names the PDU and field, never free text.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum Violation {
    #[error("{} for unknown ITT {itt:#x}", short_name(*opcode))]
    UnknownTask { opcode: Opcode, itt: u32 },
    #[error("{0:?} is not expected in full feature phase here")]
    UnexpectedPdu(Opcode),
    #[error("Data-In for a command without read data")]
    DataInWithoutRead,
    #[error("Data-In DataSN {got}, expected {expected}")]
    DataInSn { expected: u32, got: u32 },
    #[error("Data-In at offset {got}, expected {expected} (out of order or overlapping)")]
    DataInOffset { expected: u32, got: u32 },
    #[error("Data-In ends at {end}, past the {len} bytes expected")]
    DataInPastEnd { end: u64, len: u32 },
    #[error("GOOD status after {received} of {expected} bytes of Data-In")]
    ShortRead { received: u32, expected: u32 },
    #[error("R2T for a command without write data")]
    R2tWithoutWrite,
    #[error("R2T with the reserved Target Transfer Tag")]
    R2tReservedTag,
    #[error("R2T for {offset}+{len} outside the {total}-byte write")]
    R2tOutsideWrite { offset: u32, len: u32, total: u32 },
    #[error("R2T asks {len} bytes, over MaxBurstLength {max}")]
    R2tOverBurst { len: u32, max: u32 },
    #[error("R2TSN {got}, expected {expected}")]
    R2tSn { expected: u32, got: u32 },
    #[error("R2T beyond MaxOutstandingR2T {max}")]
    R2tOutstanding { max: u32 },
    #[error("R2T reuses Target Transfer Tag {ttt:#x} still outstanding")]
    R2tDuplicateTag { ttt: u32 },
    #[error("R2T asks again for bytes already requested ({offset}+{len})")]
    R2tOverlap { offset: u32, len: u32 },
    #[error("NOP-In pings faster than the answers leave ({queued} bytes queued)")]
    PingFlood { queued: usize },
    #[error("data phase: {0}")]
    DataPhase(r2t::DataError),
    /// More PDUs arrived on one connection of a multi-connection session, behind a command
    /// waiting for a CmdSN sent on another connection, than the target holds (RFC 7143
    /// §4.2.2.1: commands run in CmdSN order across the session's connections).
    #[error("{held} bytes held on this connection waiting for CmdSN {waiting_for}")]
    CmdSnGap { waiting_for: u32, held: usize },
}

/// The short name RFC 7143's text uses for a target PDU.
fn short_name(op: Opcode) -> &'static str {
    match op {
        Opcode::SCSI_DATA_IN => "Data-In",
        Opcode::R2T => "R2T",
        Opcode::SCSI_RESPONSE => "SCSI Response",
        Opcode::TASK_MGMT_RESPONSE => "Task Management Response",
        Opcode::LOGOUT_RESPONSE => "Logout Response",
        Opcode::NOP_IN => "NOP-In",
        _ => "PDU",
    }
}

/// Why a connection ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum CloseReason {
    /// A Logout Request and its response (RFC 7143 §11.14, §11.15).
    #[error("logged out")]
    Logout,
    /// Logged out because the target asked (AsyncEvent 1, §11.9.1).
    #[error("logged out at the target's request (AsyncEvent 1)")]
    LogoutRequested,
    /// The peer announced it drops the connection or the session (AsyncEvent 2/3).
    #[error("the target announced it drops the connection (async event {0})")]
    AsyncDrop(u8),
    /// A NOP ping went unanswered, and nothing else arrived either.
    #[error("keepalive failed: no NOP-In/NOP-Out answer to a ping within {0:?} (and nothing else from the peer)")]
    PingTimeout(std::time::Duration),
    /// The peer closed the TCP connection, or it broke.
    #[error("connection closed by the peer")]
    PeerClosed,
    /// A task management request went unanswered.
    #[error("task management request unanswered for {0:?}")]
    TaskManagementTimeout(std::time::Duration),
    /// A command timed out and the target refused both its ABORT TASK and the LOGICAL UNIT
    /// RESET that followed (§11.6.1 responses): its tasks cannot be trusted any more.
    #[error("the target refused to abort a timed-out command (task management response {}); LOGICAL UNIT RESET failed too (response {})", abort.0, reset.0)]
    AbortRefused {
        abort: iscsi_wire::header::TmfResponse,
        reset: iscsi_wire::header::TmfResponse,
    },
    /// TARGET COLD RESET ends every connection (§11.5.1).
    #[error("target cold reset")]
    ColdReset,
    /// The peer broke a rule that leaves the connection unusable.
    #[error("protocol violation: {0}")]
    Violation(Violation),
    /// A PDU could not be framed (header digest, bad length): the stream is out of sync.
    #[error("unrecoverable framing error")]
    Framing,
    /// The driver closed it (shutdown, session reinstatement, Seal counters exhausted, ...).
    #[error("closed by the application")]
    Local,
    /// ErrorRecoveryLevel 2 could not move a task of a failed connection: the target answered
    /// its TASK REASSIGN with this response (RFC 7143 §11.6.1), or had the command and lost
    /// it (Task does not exist for an acknowledged CmdSN, e.g. past DefaultTime2Retain).
    #[error("connection recovery failed: TASK REASSIGN answered {}", .0 .0)]
    ReassignRefused(iscsi_wire::header::TmfResponse),
    /// ErrorRecoveryLevel 2: the Logout removing the failed connection for recovery was
    /// answered with this response (RFC 7143 §11.15.1: 2 recovery not supported, 3 cleanup
    /// failed).
    #[error("connection recovery failed: Logout for recovery answered {0}")]
    RecoveryLogoutRefused(u8),
}

/// The end of a connection: who ended it and why.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[error("connection ended by the {by:?}: {reason}")]
pub struct ConnectionError {
    pub by: Side,
    pub reason: CloseReason,
}

/// Why the peer's Reject names this PDU (RFC 7143 §11.17.1), as a typed value.
pub type Rejection = RejectReason;

/// Fixed-format sense data (SPC-4 §4.5.3) with this key, ASC and ASCQ.
#[must_use]
pub fn fixed_sense(key: u8, asc: u8, ascq: u8) -> bytes::Bytes {
    let mut s = [0u8; 18];
    s[0] = 0x70;
    s[2] = key & 0x0f;
    s[7] = 10;
    s[12] = asc;
    s[13] = ascq;
    bytes::Bytes::copy_from_slice(&s)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tag_allocator_never_hands_out_the_reserved_tag_or_zero() {
        let mut a = TagAllocator::starting_at(RESERVED_TAG - 2);
        let tags: Vec<u32> = (0..4).map(|_| a.next_tag()).collect();
        assert_eq!(tags, vec![RESERVED_TAG - 2, RESERVED_TAG - 1, 1, 2]);
        let mut a = TagAllocator::starting_at(RESERVED_TAG);
        assert_eq!(a.next_tag(), 1);
        let mut a = TagAllocator::starting_at(0);
        assert_eq!(a.next_tag(), 1);
    }

    /// 4096 hashes spread over 4096 buckets (their low 12 bits) as a random function's would
    /// (~63 % used), and over the 128 control bytes hashbrown takes from their top 7 bits.
    fn assert_spreads(hashes: impl Iterator<Item = u64>) {
        let mut buckets = HashSet::new();
        let mut control = [0u32; 128];
        for h in hashes {
            buckets.insert(h & 4095);
            control[(h >> 57) as usize] += 1;
        }
        assert!(
            buckets.len() > 2500,
            "{} of 4096 buckets used",
            buckets.len()
        );
        let max = control.iter().copied().max().unwrap_or(0);
        assert!(
            max <= 3 * 4096 / 128,
            "a control byte value taken {max} times of 4096"
        );
    }

    /// hashbrown picks the bucket from the hash's low bits and a control byte from its top 7:
    /// consecutive tags (what [`TagAllocator`] hands out) must spread over both, or a table of
    /// in-flight tasks degrades to linear probing. An identity hash fails the second check.
    #[test]
    fn own_tag_hashes_of_consecutive_tags_spread_over_buckets_and_control_bytes() {
        assert_spreads((1..=4096u32).map(|t| OwnTags.hash_one(t)));
        // And the map works with it.
        let mut m: OwnTagMap<u32> = OwnTagMap::default();
        for t in 1..=1000u32 {
            m.insert(t, t * 2);
        }
        assert!((1..=1000u32).all(|t| m.remove(&t) == Some(t * 2)) && m.is_empty());
    }

    /// A peer's tags chosen to collide in the bits a bucket index takes (equal low 16 bits)
    /// spread over buckets and control bytes under [`PeerTags`] as random ones would, and two
    /// tables hash alike tags differently (their keys are drawn each).
    #[test]
    fn peer_tag_hashes_of_tags_equal_in_their_low_bits_spread_and_differ_per_table() {
        let (a, b) = (PeerTags::new(), PeerTags::new());
        let tags = || (0..4096u32).map(|k| (k << 16) | 0x5a5a);
        assert_spreads(tags().map(|t| a.hash_one(t)));
        let same = tags()
            .filter(|&t| a.hash_one(t) & 4095 == b.hash_one(t) & 4095)
            .count();
        // Independent keys agree on a 12-bit bucket about once in 4096.
        assert!(
            same < 16,
            "{same} of 4096 tags in the same bucket in both tables"
        );
        assert_eq!(
            format!("{a:?}"),
            "PeerTags(..)",
            "the keys stay out of Debug"
        );
        let mut m: PeerTagMap<u32> = PeerTagMap::default();
        for t in 1..=1000u32 {
            m.insert(t << 20, t);
        }
        assert!((1..=1000u32).all(|t| m.remove(&(t << 20)) == Some(t)) && m.is_empty());
    }
}
