//! A negotiated Seal session: seals what this side sends and opens what it receives, in place.

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use bytes::{Bytes, BytesMut};

use crate::buffers::BufferPool;
use crate::cipher::{ChunkKey, Cipher};
use crate::compress::{self, Compression};
use crate::error::{OpenError, SealError};
use crate::frame::{aad, Binding, Direction, Framing, AAD_LEN, COUNTER_LEN};
use crate::kdf::BadTag;
use crate::replay::ReplayWindow;

pub use crate::frame::Role;

mod compressed;

/// Counters, for logs and the lab. All events, no secrets.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SealStats {
    /// Chunks sealed.
    pub sealed_chunks: u64,
    /// Chunks opened successfully.
    pub opened_chunks: u64,
    /// Commands rejected because a tag did not verify.
    pub auth_failures: u64,
    /// Commands rejected by the anti-replay window.
    pub replays: u64,
}

#[derive(Default)]
struct Counters {
    sealed: AtomicU64,
    opened: AtomicU64,
    auth_failures: AtomicU64,
    replays: AtomicU64,
}

/// One side of a negotiated Seal session (built by [`crate::SealOffer`] or
/// [`crate::SealPending`]). `Sync`: share it in an `Arc` between the network task and the
/// [`crate::CryptoPool`]. `Debug` shows the cipher and counters, never key material.
pub struct SealSession {
    framing: Framing,
    role: Role,
    send_key: ChunkKey,
    recv_key: ChunkKey,
    /// Next unused send counter. Never decreases; a chunk's counter is used once.
    next_counter: AtomicU64,
    /// Counters at or beyond this are refused (u64::MAX normally; lower in tests).
    counter_limit: u64,
    /// One past the highest counter opened so far: the peer's send counter as seen here.
    recv_high: AtomicU64,
    window: Mutex<ReplayWindow>,
    stats: Counters,
    /// `K("record")`: the root of the per-PDU record keys (docs/seal.md §4a), bound to the
    /// whole login transcript by [`SealSession::record_layer`].
    record_root: zeroize::Zeroizing<[u8; 32]>,
    /// Buffers of sealed transfers that have been sent, for the next ones (§8 *Cost*).
    buffers: Arc<BufferPool>,
    /// Chunks compressed before sealing (`X-org.ipsan.Compression`, docs/seal.md §4b).
    compression: Compression,
}

impl fmt::Debug for SealSession {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SealSession")
            .field("cipher", &self.framing.cipher)
            .field("chunk_size", &self.framing.chunk_size)
            .field("role", &self.role)
            .field("compression", &self.compression)
            .field("keys", &"<redacted>")
            .field("stats", &self.stats())
            .finish()
    }
}

/// A sealing plan for one command: counters are reserved, chunks can be sealed independently
/// (in parallel) with [`SealSession::seal_chunk`].
#[derive(Clone, Copy, Debug)]
pub(crate) struct Plan {
    pub base: u64,
    pub count: u32,
    pub plain_len: u32,
}

impl SealSession {
    pub(crate) fn new(
        framing: Framing,
        role: Role,
        i2t: ChunkKey,
        t2i: ChunkKey,
        record_root: zeroize::Zeroizing<[u8; 32]>,
    ) -> Self {
        let (send_key, recv_key) = match role {
            Role::Initiator => (i2t, t2i),
            Role::Target => (t2i, i2t),
        };
        Self {
            framing,
            role,
            send_key,
            recv_key,
            next_counter: AtomicU64::new(0),
            counter_limit: u64::MAX,
            recv_high: AtomicU64::new(0),
            window: Mutex::new(ReplayWindow::new()),
            stats: Counters::default(),
            record_root,
            buffers: Arc::default(),
            compression: Compression::None,
        }
    }

    /// The same session with chunks compressed by `compression` (set by the negotiation when
    /// both ends asked, docs/seal.md §4b; both sides must agree).
    #[must_use]
    pub fn with_compression(mut self, compression: Compression) -> Self {
        self.compression = compression;
        self
    }

    /// How chunks are compressed in this session.
    pub fn compression(&self) -> Compression {
        self.compression
    }

    /// The record layer of this session's connection (docs/seal.md §4a): a sealer for the
    /// PDUs this side sends and an opener for the PDUs it receives, with keys bound to
    /// `transcript`, the hash of every Login PDU of the login, the final response included.
    /// Both sides must call it once, when full feature phase starts; PDU counters start at 0.
    pub fn record_layer(
        &self,
        transcript: &crate::schedule::TranscriptHash,
    ) -> Result<
        (crate::record::RecordSealer, crate::record::RecordOpener),
        crate::error::NegotiationError,
    > {
        crate::record::layer(
            self.framing.cipher,
            self.role,
            &self.record_root,
            transcript,
        )
    }

    /// Test hook: move the send counter *forward* to `next` (never backward, so no counter can
    /// be used twice) and refuse counters at or beyond `limit` (only ever lowered).
    #[doc(hidden)]
    pub fn with_counter_range_for_test(mut self, next: u64, limit: u64) -> Self {
        let current = *self.next_counter.get_mut();
        self.next_counter = AtomicU64::new(next.max(current));
        self.counter_limit = limit.min(self.counter_limit);
        self
    }

    /// The negotiated cipher.
    pub fn cipher(&self) -> Cipher {
        self.framing.cipher
    }

    /// The negotiated chunk size in bytes.
    pub fn chunk_size(&self) -> u32 {
        self.framing.chunk_size
    }

    /// Cipher and chunk size.
    pub fn framing(&self) -> Framing {
        self.framing
    }

    /// This side's role.
    pub fn role(&self) -> Role {
        self.role
    }

    /// The direction this side seals.
    pub fn send_direction(&self) -> Direction {
        match self.role {
            Role::Initiator => Direction::InitiatorToTarget,
            Role::Target => Direction::TargetToInitiator,
        }
    }

    /// The direction this side opens.
    pub fn recv_direction(&self) -> Direction {
        match self.role {
            Role::Initiator => Direction::TargetToInitiator,
            Role::Target => Direction::InitiatorToTarget,
        }
    }

    /// Bytes on the wire for `plain` bytes of command data: use it as ExpectedDataTransferLength.
    /// `None` if too large for iSCSI's 32-bit lengths. With compression it is the longest
    /// form (every chunk stored raw, [`compress::max_wire_len`]): what a read asks for; a
    /// compressed write's EDTL is the length of its sealed transfer.
    pub fn sealed_len(&self, plain: usize) -> Option<usize> {
        let s = if self.compression.is_on() {
            compress::max_wire_len(&self.framing, plain)
        } else {
            self.framing.sealed_len(plain)
        };
        s.filter(|&s| u32::try_from(s).is_ok())
    }

    /// Plaintext bytes carried by a sealed transfer of `sealed` bytes, if that length is valid.
    /// With compression: the plaintext length whose longest form is `sealed` (a read's EDTL);
    /// a compressed transfer's own length says nothing of its plaintext, which its header
    /// carries.
    pub fn plain_len(&self, sealed: usize) -> Option<usize> {
        if self.compression.is_on() {
            compress::plain_len_of_max(&self.framing, sealed)
        } else {
            self.framing.plain_len(sealed)
        }
    }

    /// Whether a sealed transfer of `sealed` bytes (a write's EDTL) can be valid: a sealed
    /// length of some plaintext, or with compression any length from the shortest transfer up.
    pub fn accepts_wire_len(&self, sealed: usize) -> bool {
        if self.compression.is_on() {
            sealed == 0
                || (sealed >= compress::min_wire_len(&self.framing)
                    && u32::try_from(sealed).is_ok())
        } else {
            self.plain_len(sealed).is_some()
        }
    }

    /// Whether a command of `plain` bytes is sealed or opened on the caller's thread by
    /// [`crate::CryptoPool`] (small commands: [`Cipher::inline_max`]), so it never waits for a
    /// worker.
    pub fn crypto_inline(&self, plain: usize) -> bool {
        plain <= self.framing.cipher.inline_max()
    }

    /// [`Self::crypto_inline`] for a sealed transfer of `sealed` bytes as it travels (what a
    /// receiver opens, or an EDTL): `false` when that is no valid sealed length.
    pub fn crypto_inline_sealed(&self, sealed: usize) -> bool {
        self.plain_len(sealed)
            .is_some_and(|plain| self.crypto_inline(plain))
    }

    /// Whether [`crate::CryptoPool`] seals (`seal`) or opens (`open`) a command of `plain`
    /// bytes *in place* on the caller's thread: a small command ([`Self::crypto_inline`]), or
    /// any command under `none`, whose in-place seal only writes its zero tags and whose open
    /// checks no tag: there is no per-byte work to hand to a worker, only the hand-off itself
    /// (a queue, a worker's wake-up, the waiting task's wake-up; issue 27). Every check of the
    /// framing (length, counters, anti-replay window) runs as on the pool. A sealed *copy*
    /// ([`crate::CryptoPool::seal_copy`]) copies every byte, so `none` follows
    /// [`Self::crypto_inline`] there.
    pub fn crypto_inline_in_place(&self, plain: usize) -> bool {
        self.crypto_inline(plain) || !self.framing.cipher.protects()
    }

    /// [`Self::crypto_inline_in_place`] for a sealed transfer of `sealed` bytes as it
    /// travels: `false` when that is no valid sealed length (the pool's path refuses it).
    pub fn crypto_inline_in_place_sealed(&self, sealed: usize) -> bool {
        self.plain_len(sealed)
            .is_some_and(|plain| self.crypto_inline_in_place(plain))
    }

    /// A snapshot of the counters.
    pub fn stats(&self) -> SealStats {
        SealStats {
            sealed_chunks: self.stats.sealed.load(Ordering::Relaxed),
            opened_chunks: self.stats.opened.load(Ordering::Relaxed),
            auth_failures: self.stats.auth_failures.load(Ordering::Relaxed),
            replays: self.stats.replays.load(Ordering::Relaxed),
        }
    }

    /// Reserves `count` fresh counters, or refuses if that would pass the limit.
    fn reserve(&self, count: u64) -> Result<u64, SealError> {
        let limit = self.counter_limit;
        self.next_counter
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |next| {
                next.checked_add(count).filter(|&end| end <= limit)
            })
            .map_err(|_| SealError::CounterExhausted)
    }

    pub(crate) fn plan(&self, plain: usize) -> Result<Option<Plan>, SealError> {
        if plain == 0 {
            return Ok(None);
        }
        self.sealed_len(plain).ok_or(SealError::TooLarge(plain))?;
        let plain_len = u32::try_from(plain).map_err(|_| SealError::TooLarge(plain))?;
        let count = self.framing.chunks(plain);
        let count32 = u32::try_from(count).map_err(|_| SealError::TooLarge(plain))?;
        let base = self.reserve(count as u64)?;
        Ok(Some(Plan {
            base,
            count: count32,
            plain_len,
        }))
    }

    /// Chunk `index`'s counter and associated data in direction `dir`.
    fn chunk_aad(
        &self,
        dir: Direction,
        b: &Binding,
        plan: Plan,
        index: u32,
    ) -> (u64, [u8; AAD_LEN]) {
        // `plan` comes from a reservation (send) or a range checked against the limit
        // (receive): base + index does not wrap.
        let counter = plan.base.wrapping_add(u64::from(index));
        let a = aad(
            self.framing.cipher,
            dir,
            b,
            plan.plain_len,
            index,
            plan.count,
            counter,
        );
        (counter, a)
    }

    /// Seals chunk `index` of a planned command in place; `tag` gets its tag.
    pub(crate) fn seal_chunk(
        &self,
        b: &Binding,
        plan: Plan,
        index: u32,
        data: &mut [u8],
        tag: &mut [u8],
    ) {
        let (counter, a) = self.chunk_aad(self.send_direction(), b, plan, index);
        self.send_key.seal(counter, &a, data, tag);
        self.stats.sealed.fetch_add(1, Ordering::Relaxed);
    }

    /// Seals `plaintext` (a whole command's data) in place and returns the sealed transfer of
    /// `sealed_len(plaintext.len())` bytes. The trailer is appended to the same buffer: allocate
    /// it with that capacity to avoid a reallocation.
    pub fn seal(&self, b: &Binding, mut buf: BytesMut) -> Result<Bytes, SealError> {
        if self.compression.is_on() {
            return self.seal_copy(b, &buf);
        }
        let n = buf.len();
        let Some(plan) = self.plan(n)? else {
            return Ok(buf.freeze());
        };
        let t = self.framing.cipher.tag_len();
        let chunk = self.framing.chunk_size as usize;
        buf.resize(n + COUNTER_LEN + plan.count as usize * t, 0);
        let (data, trailer) = buf.split_at_mut(n);
        trailer[..COUNTER_LEN].copy_from_slice(&plan.base.to_be_bytes());
        let tags = &mut trailer[COUNTER_LEN..];
        for (i, (d, tg)) in data
            .chunks_mut(chunk)
            .zip(tags.chunks_exact_mut(t))
            .enumerate()
        {
            self.seal_chunk(b, plan, i as u32, d, tg);
        }
        Ok(buf.freeze())
    }

    /// Whether sealing a transfer changes or moves its bytes (a cipher that encrypts, or
    /// compression), so a sender wants room past them to seal in place; `false` under `none`
    /// without compression, whose plaintext goes as it is ([`Self::none_trailer`]): a RAM
    /// store's own memory needs no buffer of its own then (issue 27).
    pub fn seals_in_buffer(&self) -> bool {
        self.framing.cipher.protects() || self.compression.is_on()
    }

    /// `none`'s sealed transfer without a copy (issue 27). Under `none` without compression
    /// the sealed form of `plain_len` bytes is those bytes unchanged followed by a trailer, the
    /// base counter and a zero tag per chunk (docs/seal.md §4): a sender whose plaintext is
    /// shared (a RAM store's own memory) sends the plaintext and this trailer back to back
    /// instead of copying both into one buffer. Reserves the command's counters as
    /// [`Self::seal`] does and returns the trailer (empty for no data); `None` for a cipher
    /// that changes the bytes, or with compression: seal as before. `None` too for a transfer
    /// small enough to seal on the caller's thread ([`Self::crypto_inline`]): the trailer
    /// travels in a Data-In PDU of its own, which costs a receiver more than copying up to
    /// 64 KiB into one sealed buffer does (64 KiB reads at depth 1: 0.96× the throughput and
    /// +4.2 % CPU per GB with the trailer, 62 reps, docs/results/refactor-ab).
    pub fn none_trailer(&self, plain_len: usize) -> Result<Option<Bytes>, SealError> {
        if self.framing.cipher.protects()
            || self.compression.is_on()
            || (plain_len > 0 && self.crypto_inline(plain_len))
        {
            return Ok(None);
        }
        let Some(plan) = self.plan(plain_len)? else {
            return Ok(Some(Bytes::new()));
        };
        let t = self.framing.cipher.tag_len();
        let mut trailer = BytesMut::zeroed(COUNTER_LEN + plan.count as usize * t);
        trailer[..COUNTER_LEN].copy_from_slice(&plan.base.to_be_bytes());
        self.stats
            .sealed
            .fetch_add(u64::from(plan.count), Ordering::Relaxed);
        Ok(Some(trailer.freeze()))
    }

    /// Seals a copy of `plaintext` and returns the sealed transfer; `plaintext` is left as it
    /// was (a caller that must keep its data, like an initiator that may retry a write).
    ///
    /// The AEADs encrypt straight from `plaintext` into the sealed buffer (out of place), chunk
    /// by chunk: one pass over memory instead of a whole-buffer copy and then another; `none`
    /// and 3DES copy a chunk and seal it while it is still in cache. Large transfers are sealed
    /// into a buffer this session has used before (no page faults, no zero-fill; see
    /// `buffers`), which comes back when the returned `Bytes` is dropped.
    pub fn seal_copy(&self, b: &Binding, plaintext: &[u8]) -> Result<Bytes, SealError> {
        let n = plaintext.len();
        let Some(plan) = self.plan(n)? else {
            return Ok(Bytes::new());
        };
        Ok(self.seal_copy_planned(b, plan, plaintext))
    }

    /// [`Self::seal_copy`] with counters already reserved by [`Self::plan`].
    pub(crate) fn seal_copy_planned(&self, b: &Binding, plan: Plan, plaintext: &[u8]) -> Bytes {
        if self.compression.is_on() {
            return self.seal_compressed(b, plan, plaintext);
        }
        let n = plaintext.len();
        let t = self.framing.cipher.tag_len();
        let mut buf = self.buffers.take(n + COUNTER_LEN + plan.count as usize * t);
        let (data, trailer) = buf.split_at_mut(n);
        let (counter, tags) = trailer.split_at_mut(COUNTER_LEN);
        counter.copy_from_slice(&plan.base.to_be_bytes());
        self.seal_chunks_into(b, plan, 0, plaintext, data, tags);
        self.buffers.freeze(buf)
    }

    /// A buffer for a sealed transfer of `len` bytes, reused when one is free (its contents
    /// are unspecified: every byte must be overwritten).
    pub(crate) fn take_buffer(&self, len: usize) -> BytesMut {
        self.buffers.take(len)
    }

    /// Freezes a transfer sealed into a buffer from [`Self::take_buffer`], which comes back to
    /// this session when the `Bytes` (and every slice of it) is dropped.
    pub(crate) fn freeze_sealed(&self, buf: BytesMut) -> Bytes {
        self.buffers.freeze(buf)
    }

    /// Seals `src`, chunks `first..` of a planned command, into `dst` (same length) and their
    /// tags into `tags`, chunk by chunk.
    pub(crate) fn seal_chunks_into(
        &self,
        b: &Binding,
        plan: Plan,
        first: u32,
        src: &[u8],
        dst: &mut [u8],
        tags: &mut [u8],
    ) {
        let t = self.framing.cipher.tag_len();
        let chunk = self.framing.chunk_size as usize;
        for (k, ((s, d), tag)) in src
            .chunks(chunk)
            .zip(dst.chunks_mut(chunk))
            .zip(tags.chunks_exact_mut(t))
            .enumerate()
        {
            let (counter, a) = self.chunk_aad(self.send_direction(), b, plan, first + k as u32);
            self.send_key.seal_into(counter, &a, s, d, tag);
            self.stats.sealed.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// The counter limit of both directions (`u64::MAX` unless lowered for a test).
    pub fn counter_limit(&self) -> u64 {
        self.counter_limit
    }

    /// Counters used so far: (next counter this side will seal with, one past the highest
    /// counter it has opened). Public values: counters travel in clear.
    pub fn counters_used(&self) -> (u64, u64) {
        (
            self.next_counter.load(Ordering::Relaxed),
            self.recv_high.load(Ordering::Relaxed),
        )
    }

    /// The key epochs in use (docs/seal.md §4 *Key epochs*): (the one this side seals with
    /// next, the one of the highest counter it has opened). Public values, like the counters;
    /// never the keys.
    pub fn key_epochs(&self) -> (u64, u64) {
        let per = match self.framing.cipher {
            Cipher::TripleDesCbcHmacSha1 => crate::tdes::epoch_chunks(self.framing.chunk_size),
            _ => crate::cipher::aead_epoch_chunks(self.framing.chunk_size),
        }
        .max(1);
        let (sent, received) = self.counters_used();
        (sent / per, received.saturating_sub(1) / per)
    }

    /// The high-water mark: 7/8 of the counter space. Past it the session should log out and
    /// in again for fresh keys before sealing or opening hits the hard limit (docs/seal.md).
    /// With 64-bit counters it is never reached in practice; a lowered limit (tests) or a
    /// future per-cipher volume limit makes it fire.
    pub fn rekey_mark(&self) -> u64 {
        self.counter_limit - self.counter_limit / 8
    }

    /// Whether either direction's counter has passed [`SealSession::rekey_mark`].
    pub fn rekey_due(&self) -> bool {
        let (sent, received) = self.counters_used();
        let mark = self.rekey_mark();
        sent >= mark || received >= mark
    }

    /// A received range `base .. base + count` must end within the limit and not wrap: the
    /// receiving side enforces the limit too, so a peer that ignores it gets refused.
    fn within_limit(&self, base: u64, count: u32) -> Result<(), OpenError> {
        match base.checked_add(u64::from(count)) {
            Some(end) if end <= self.counter_limit => Ok(()),
            _ => Err(OpenError::CounterLimit { counter: base }),
        }
    }

    /// Reads the trailer of a sealed transfer and checks the anti-replay window.
    pub(crate) fn open_plan(&self, b: &Binding, sealed: &[u8]) -> Result<Option<Plan>, OpenError> {
        let s = sealed.len();
        if s == 0 {
            return Ok(None);
        }
        let n = self.plain_len(s).ok_or(OpenError::BadLength(s))?;
        let plain_len = u32::try_from(n).map_err(|_| OpenError::BadLength(s))?;
        let count = u32::try_from(self.framing.chunks(n)).map_err(|_| OpenError::BadLength(s))?;
        let mut c = [0u8; COUNTER_LEN];
        c.copy_from_slice(&sealed[n..n + COUNTER_LEN]);
        let base = u64::from_be_bytes(c);
        let plan = Plan {
            base,
            count,
            plain_len,
        };
        self.check_received(b, plan).map(Some)
    }

    /// The counter limit and the anti-replay window for a received plan.
    pub(crate) fn check_received(&self, b: &Binding, plan: Plan) -> Result<Plan, OpenError> {
        let (base, count) = (plan.base, plan.count);
        if let Err(e) = self.within_limit(base, count) {
            self.report(b, &e);
            return Err(e);
        }
        let checked = self
            .lock_window()
            .check_range(base, u64::from(count))
            .map_err(|r| OpenError::Replay { counter: r.0 });
        if let Err(e) = checked {
            self.report(b, &e);
            return Err(e);
        }
        Ok(plan)
    }

    fn lock_window(&self) -> std::sync::MutexGuard<'_, ReplayWindow> {
        // The window has no invariant a panicking holder could break half-way (mark is
        // infallible), so a poisoned lock is still usable.
        self.window.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Verifies and decrypts chunk `index` in place.
    pub(crate) fn open_chunk(
        &self,
        b: &Binding,
        plan: Plan,
        index: u32,
        data: &mut [u8],
        tag: &[u8],
    ) -> Result<(), OpenError> {
        self.open_chunk_with(b, plan, index, |key, counter, aad| {
            key.open(counter, aad, data, tag)
        })
    }

    /// [`Self::open_chunk`] out of place: verifies chunk `index` where it lies (`src`) and
    /// decrypts it into `dst` (zeroed if it does not verify).
    pub(crate) fn open_chunk_into(
        &self,
        b: &Binding,
        plan: Plan,
        index: u32,
        (src, dst): (&[u8], &mut [u8]),
        tag: &[u8],
    ) -> Result<(), OpenError> {
        self.open_chunk_with(b, plan, index, |key, counter, aad| {
            key.open_into(counter, aad, src, dst, tag)
        })
    }

    /// Chunk `index`'s counter and AAD, the receiving key's `open`, the count.
    fn open_chunk_with(
        &self,
        b: &Binding,
        plan: Plan,
        index: u32,
        open: impl FnOnce(&ChunkKey, u64, &[u8]) -> Result<(), BadTag>,
    ) -> Result<(), OpenError> {
        let (counter, a) = self.chunk_aad(self.recv_direction(), b, plan, index);
        open(&self.recv_key, counter, &a)
            .map_err(|_| OpenError::Authentication { chunk: index })?;
        self.stats.opened.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    /// After every chunk verified: marks the counters, rejecting a concurrent replay.
    pub(crate) fn finish_open(&self, b: &Binding, plan: Plan) -> Result<(), OpenError> {
        let r = self
            .lock_window()
            .accept_range(plan.base, u64::from(plan.count))
            .map_err(|r| OpenError::Replay { counter: r.0 });
        match &r {
            Err(e) => self.report(b, e),
            Ok(()) => {
                let end = plan.base.saturating_add(u64::from(plan.count));
                self.recv_high.fetch_max(end, Ordering::Relaxed);
            }
        }
        r
    }

    /// Counts and logs a rejected command (no secrets: binding and counters are public).
    pub(crate) fn report(&self, b: &Binding, e: &OpenError) {
        match e {
            OpenError::Authentication { .. } => {
                self.stats.auth_failures.fetch_add(1, Ordering::Relaxed);
            }
            OpenError::Replay { .. } => {
                self.stats.replays.fetch_add(1, Ordering::Relaxed);
            }
            _ => {}
        }
        tracing::warn!(
            lun = b.lun,
            lba = b.lba,
            blocks = b.blocks,
            opcode = b.opcode,
            task_tag = b.task_tag,
            direction = ?self.recv_direction(),
            "seal: rejected command data: {e}"
        );
    }

    /// Authenticates and decrypts a sealed transfer in place and returns the plaintext (the same
    /// buffer, trailer truncated). On any error no plaintext is returned; the event is counted
    /// in [`SealStats`] and logged.
    pub fn open(&self, b: &Binding, mut buf: BytesMut) -> Result<Bytes, OpenError> {
        if self.compression.is_on() {
            return self.open_compressed(b, &mut buf);
        }
        let Some(plan) = self.open_plan(b, &buf)? else {
            return Ok(buf.freeze());
        };
        let n = plan.plain_len as usize;
        let t = self.framing.cipher.tag_len();
        let chunk = self.framing.chunk_size as usize;
        let (data, trailer) = buf.split_at_mut(n);
        let tags = &trailer[COUNTER_LEN..];
        for (i, (d, tg)) in data.chunks_mut(chunk).zip(tags.chunks_exact(t)).enumerate() {
            if let Err(e) = self.open_chunk(b, plan, i as u32, d, tg) {
                self.report(b, &e);
                return Err(e);
            }
        }
        self.finish_open(b, plan)?;
        buf.truncate(n);
        Ok(buf.freeze())
    }

    /// [`Self::open`] for a sealed transfer the caller cannot have to itself (a slice of a
    /// receive buffer that other PDUs share): each chunk is verified and decrypted from where
    /// it lies into a buffer this session has used before (out of place, `open_into`), not
    /// copied first and then opened. The same checks in the same order; the buffer comes
    /// back to the session when the returned `Bytes` is dropped. On any error no plaintext is
    /// returned (the chunk that failed is zeroed, the buffer freed).
    pub fn open_copy(&self, b: &Binding, sealed: &[u8]) -> Result<Bytes, OpenError> {
        if self.compression.is_on() {
            return self.open_compressed(b, &mut BytesMut::from(sealed));
        }
        let Some(plan) = self.open_plan(b, sealed)? else {
            return Ok(Bytes::new());
        };
        let n = plan.plain_len as usize;
        let (t, chunk) = (
            self.framing.cipher.tag_len(),
            self.framing.chunk_size as usize,
        );
        let (data, trailer) = sealed.split_at(n);
        let tags = trailer[COUNTER_LEN..].chunks_exact(t);
        let mut buf = self.buffers.take(n);
        for (i, ((s, d), tg)) in data
            .chunks(chunk)
            .zip(buf.chunks_mut(chunk))
            .zip(tags)
            .enumerate()
        {
            if let Err(e) = self.open_chunk_into(b, plan, i as u32, (s, d), tg) {
                self.report(b, &e);
                return Err(e);
            }
        }
        self.finish_open(b, plan)?;
        Ok(self.buffers.freeze(buf))
    }
}

/// The lengths the target engine's sizing rule asks of a sealed session
/// (`Sizing::sealed`: a write's EDTL is its sealed transfer's length, a read's the longest
/// form of its plaintext).
impl iscsi_proto::engine::target::SealedLengths for SealSession {
    fn accepts_write_len(&self, wire: usize) -> bool {
        self.accepts_wire_len(wire)
    }

    fn accepts_read_len(&self, wire: usize) -> bool {
        self.plain_len(wire).is_some()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cipher::IV_LEN;

    fn pair(cipher: Cipher) -> (SealSession, SealSession) {
        let key = |seed: u8| {
            ChunkKey::new(cipher, 65536, &vec![seed; cipher.key_len()], [seed; IV_LEN]).unwrap()
        };
        let f = Framing {
            cipher,
            chunk_size: 65536,
        };
        let root = || zeroize::Zeroizing::new([9u8; 32]);
        (
            SealSession::new(f, Role::Initiator, key(1), key(2), root()),
            SealSession::new(f, Role::Target, key(1), key(2), root()),
        )
    }

    /// Issue 27: `none`'s plaintext followed by its trailer is the very transfer a sealed copy
    /// makes (same bytes, same counters), and the receiver opens it; the plaintext itself is
    /// not touched, so a shared store's memory can be sent as it is. A cipher that changes
    /// the bytes has no such trailer.
    #[test]
    fn accepts_none_plaintext_and_its_trailer_as_the_sealed_transfer() {
        let (initiator, target) = pair(Cipher::None);
        let b = Binding::of_command(0, 5, 0x88, (0, 2100));
        let plain = Bytes::from((0..1_075_000u32).map(|i| i as u8).collect::<Vec<u8>>());
        let trailer = target.none_trailer(plain.len()).unwrap().unwrap();
        let mut wire = BytesMut::from(&plain[..]);
        wire.extend_from_slice(&trailer);
        assert_eq!(wire.len(), target.sealed_len(plain.len()).unwrap());
        // The same bytes a copy would have been sealed into, under the next counters.
        let copy = target.seal_copy(&b, &plain).unwrap();
        let base = u64::from_be_bytes(copy[plain.len()..plain.len() + 8].try_into().unwrap());
        assert_eq!(base, 17, "the trailer reserved counters 0..17 (17 chunks)");
        assert_eq!(&copy[..plain.len()], &wire[..plain.len()]);
        assert_eq!(&copy[plain.len() + 8..], &wire[plain.len() + 8..]);
        let opened = initiator.open(&b, wire).unwrap();
        assert_eq!(opened, plain);
        assert_eq!(target.none_trailer(0).unwrap().unwrap().len(), 0);
        // Up to what is sealed on the caller's thread a copy is cheaper than a PDU of its own.
        let inline = Cipher::None.inline_max();
        assert!(target.none_trailer(inline).unwrap().is_none());
        assert!(target.none_trailer(inline + 1).unwrap().is_some());
        let (_, aes) = pair(Cipher::Aes256Gcm);
        assert!(aes.none_trailer(4096).unwrap().is_none());
    }

    /// The target's sizing of a sealed command (`Sizing::sealed`, iscsi-proto) with a real
    /// session's lengths: a sealed EDTL collects the sealed bytes and keeps the plaintext as
    /// the transfer; an EDTL no plaintext seals to is refused, for writes and reads.
    #[test]
    fn accepts_sealed_edtls_and_rejects_others_in_the_target_sizing() {
        use iscsi_proto::engine::target::{Response, Sizing};
        let (_, target) = pair(Cipher::Aes256Gcm);
        let size = |need: u64, edtl: usize| {
            Sizing::<()> {
                need,
                ..Sizing::default()
            }
            .sealed(u32::try_from(edtl).unwrap(), &target)
        };
        let sealed = target.sealed_len(200_000).unwrap();
        let s = size(200_000, sealed);
        assert_eq!((s.need, s.transfer), (sealed as u64, Some(200_000)));
        assert!(s.early.is_none());
        let s = size(0, sealed);
        assert_eq!((s.need, s.transfer), (0, Some(0)));
        assert!(s.early.is_none());
        // Three whole chunks and one byte more: the tags leave no plaintext that seals to it.
        let gap = target.sealed_len(3 * 65536).unwrap() + 1;
        assert!(target.plain_len(gap).is_none());
        // INVALID FIELD IN COMMAND INFORMATION UNIT.
        let refused = Some(Response::check(0x05, 0x0e, 0x03));
        assert_eq!(size(200_000, gap).early, refused);
        assert_eq!(
            size(200_000, gap).need,
            gap as u64,
            "its data is collected first"
        );
        assert_eq!(size(0, gap).early, refused);
        let (_, lz4) = pair(Cipher::Aes256Gcm);
        let lz4 = lz4.with_compression(Compression::Lz4);
        let shrunk = target.sealed_len(200_000).unwrap() / 2;
        let s = Sizing::<()> {
            need: 200_000,
            ..Sizing::default()
        }
        .sealed(u32::try_from(shrunk).unwrap(), &lz4);
        assert!(
            s.early.is_none(),
            "a compressed write's EDTL is any length from the shortest up"
        );
        assert_eq!(s.transfer, Some(200_000));
    }
}
