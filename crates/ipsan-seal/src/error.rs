//! Error types, one per scope (see DEVELOPERS.md "Errors are typed per scope").
//!
//! None of these carry key material, nonces' secret parts or plaintext: their `Display` is safe to
//! log and to put into a Login response's reason.

/// Sealing a command's data failed. These are local conditions (caller mistakes or an exhausted
/// session); nothing has been sent.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[non_exhaustive]
pub enum SealError {
    /// The per-direction nonce counter would pass its limit: the session must log out and log in
    /// again (fresh nonces, fresh keys). Nonces are never reused.
    #[error("seal: nonce counter exhausted; the session must re-login to re-key")]
    CounterExhausted,
    /// The sealed form of this transfer would not fit the 32-bit ExpectedDataTransferLength of
    /// RFC 7143 §11.3.
    #[error("seal: transfer of {0} bytes is too large to seal (sealed length must fit 32 bits)")]
    TooLarge(usize),
    /// The crypto pool has shut down.
    #[error("seal: crypto pool is shut down")]
    PoolClosed,
    /// A key could not be set up (a bug in the key schedule; never seen).
    #[error("seal: local key setup failed")]
    KeySetup,
}

/// A received PDU of a Seal session failed record protection (docs/seal.md §4a): it was
/// forged, altered, replayed, reordered or injected, a PDU before it was dropped, or the login
/// was altered (the record keys bind the whole login); or it verified but cannot be used
/// ([`Forgery::Unusable`]). Nothing of it may act: the receiver drops the connection without
/// an answer, the initiator fails every command in flight. Public values only.
#[derive(Debug, thiserror::Error, PartialEq, Eq, Clone)]
#[non_exhaustive]
pub enum Forgery {
    /// The PDU carries no Seal AHS (or TotalAHSLength does not frame one).
    #[error("seal: PDU #{counter} (opcode {opcode:#04x}) carries no record tag: injected or altered PDU")]
    Missing {
        /// The receive counter the PDU would have had.
        counter: u64,
        /// Its opcode (BHS byte 0).
        opcode: u8,
    },
    /// The record tag did not verify.
    #[error("seal: PDU #{counter} (opcode {opcode:#04x}) failed authentication: forged, altered, replayed, reordered or injected PDU, an earlier PDU dropped, or an altered login")]
    BadTag {
        /// The receive counter the PDU was checked under.
        counter: u64,
        /// Its opcode (BHS byte 0; itself unauthenticated).
        opcode: u8,
    },
    /// The receive counter is exhausted (2^64 PDUs).
    #[error("seal: record counter exhausted; the session must log in again")]
    Exhausted,
    /// An earlier PDU already failed: the connection must be closed.
    #[error("seal: record layer already failed on this connection")]
    AlreadyFailed,
    /// The PDU cannot be used: its framing failed before its tag could be checked (a
    /// DataSegmentLength over MaxRecvDataSegmentLength), or its tag verified and then a
    /// digest, its opcode or a header field did not (RFC 7143 §7.8, §11.17 would answer most
    /// of these with a Reject; a sealed connection answers nothing and drops the connection).
    #[error(
        "seal: PDU #{counter} (opcode {opcode:#04x}) refused, dropping the connection: {error}"
    )]
    Unusable {
        /// The receive counter the PDU was (or would have been) checked under.
        counter: u64,
        /// Its opcode (BHS byte 0).
        opcode: u8,
        /// What the codec found.
        error: iscsi_wire::WireError,
    },
}

/// Opening (authenticating and decrypting) a command's data failed. On any of these, no plaintext
/// is returned; the target answers the command with CHECK CONDITION and the sense data in
/// [`crate::sense`], the initiator fails the command. The session goes on.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[non_exhaustive]
pub enum OpenError {
    /// The sealed length cannot be the sealed form of any plaintext length.
    #[error("seal: sealed data of {0} bytes has an impossible length")]
    BadLength(usize),
    /// A chunk's tag did not verify: the data was modified, relocated (other LUN/LBA/command/
    /// chunk) or sealed under a different key.
    #[error("seal: chunk {chunk} failed authentication")]
    Authentication {
        /// Index of the first chunk that failed.
        chunk: u32,
    },
    /// The chunk counter was already accepted once (a replay) or lies behind the anti-replay
    /// window (RFC 4303 §3.4.3 style).
    #[error("seal: chunk counter {counter} replayed or outside the anti-replay window")]
    Replay {
        /// The offending explicit counter (public: it travels in clear on the wire).
        counter: u64,
    },
    /// The crypto pool has shut down.
    #[error("seal: crypto pool is shut down")]
    PoolClosed,
    /// The chunk counters run past this session's counter limit (or would wrap): the peer
    /// must log in again for fresh keys. Refused before any chunk is opened.
    #[error(
        "seal: chunk counter {counter} is past the session's counter limit; re-login required"
    )]
    CounterLimit {
        /// The first counter of the refused range (public: it travels in clear).
        counter: u64,
    },
    /// A compressed chunk's tag verified but it does not decompress to exactly its plaintext
    /// length (docs/seal.md §4b): a peer that holds the keys sent a malformed chunk or a
    /// decompression bomb. Nothing past the chunk's length was written.
    #[error("seal: chunk {chunk} does not decompress to its declared length")]
    Decompression {
        /// Index of the chunk.
        chunk: u32,
    },
}

/// Seal negotiation during the operational stage of login failed (RFC 7143 §6, §13).
///
/// Every variant maps to a Login response status with [`NegotiationError::login_status`]. The
/// `Display` text says why (for the log line the target writes) without revealing any secret.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[non_exhaustive]
pub enum NegotiationError {
    /// Target policy is `seal = "required"` and the initiator did not offer Seal at all.
    #[error("seal: target policy is seal=required but initiator {initiator:?} did not offer X-org.ipsan.Seal")]
    RequiredNotOffered {
        /// The initiator's iSCSI name.
        initiator: String,
    },
    /// Target policy requires protection and no offered cipher is acceptable.
    #[error("seal: no acceptable cipher in initiator {initiator:?}'s offer {offered:?}")]
    NoCommonCipher {
        /// The initiator's iSCSI name.
        initiator: String,
        /// The offer as received.
        offered: String,
    },
    /// Target policy requires Seal and no pre-shared secret is configured for this initiator.
    #[error("seal: no pre-shared secret configured for initiator {initiator:?}")]
    NoSecret {
        /// The initiator's iSCSI name.
        initiator: String,
    },
    /// The peer's key-confirmation value did not verify: the two sides hold different pre-shared
    /// secrets, or a key of the negotiation was altered in transit.
    #[error("seal: key confirmation failed (wrong pre-shared secret or altered negotiation)")]
    ConfirmationFailed,
    /// The target did not agree to Seal (answered `Reject`, `NotUnderstood`, or nothing).
    #[error("seal: target did not agree to Seal (answered {0:?})")]
    NotAgreed(String),
    /// A Seal key is missing from the peer's text.
    #[error("seal: missing key {0}")]
    MissingKey(&'static str),
    /// A Seal key's value is malformed.
    #[error("seal: malformed value for {key}: {why}")]
    Malformed {
        /// The key.
        key: &'static str,
        /// What is wrong (never the value of a secret).
        why: &'static str,
    },
    /// The system random generator or a key setup failed locally.
    #[error("seal: local crypto failure (random generator or key setup)")]
    Crypto,
}

impl NegotiationError {
    /// Login response (Status-Class, Status-Detail) for this failure, RFC 7143 §11.13.5:
    /// authorization problems are 0x02/0x02 "Authorization failure", missing keys 0x02/0x07
    /// "Missing parameter", malformed values 0x02/0x00 "Initiator error", local failures
    /// 0x03/0x00 "Target error".
    pub fn login_status(&self) -> (u8, u8) {
        match self {
            Self::RequiredNotOffered { .. }
            | Self::NoCommonCipher { .. }
            | Self::NoSecret { .. }
            | Self::ConfirmationFailed
            | Self::NotAgreed(_) => (0x02, 0x02),
            Self::MissingKey(_) => (0x02, 0x07),
            Self::Malformed { .. } => (0x02, 0x00),
            Self::Crypto => (0x03, 0x00),
        }
    }
}

/// Reading a pre-shared secret failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SecretError {
    /// The file could not be read.
    #[error("seal: cannot read secret file {path}: {source}")]
    Io {
        /// The path.
        path: std::path::PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// The secret is shorter than [`crate::Psk::MIN_LEN`] bytes.
    #[error("seal: pre-shared secret is too short ({len} bytes; at least {min} required)")]
    TooShort {
        /// Its length (not its content).
        len: usize,
        /// The minimum.
        min: usize,
    },
    /// The system random number generator failed (generating a secret).
    #[error("seal: the system random number generator failed")]
    Random,
}
