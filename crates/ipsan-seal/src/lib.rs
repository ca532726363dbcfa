//! # ipsan-seal: authenticated encryption above the SCSI layer
//!
//! Seal encrypts and authenticates the *data* of SCSI commands in the layer above SCSI, as the
//! papers propose (000 Kamisaka et al., "Implementation and Evaluation of Secure and Optimized
//! IP-SAN Mechanism"; 001 "Performance Analysis of iSCSI Middleware Optimized for Encryption
//! Processing in a Long-Latency Environment"), so that sealing the next commands overlaps the
//! round trip of earlier ones. Unlike the papers (3DES, no integrity) it uses AEADs, binds every
//! chunk to its LUN, blocks and command, and rejects replays. The protocol is specified in
//! `docs/seal.md`.
//!
//! Everything here is sans-IO: no sockets, no runtime. The runtimes (`ipsan-target`,
//! `ipsan-initiator`) carry the login keys and the sealed bytes.
//!
//! # Layout
//! - `kdf`: what both cipher modules share below them: the HKDF every key comes from, a key
//!   epoch's key material, the IV length, the key-length and tag failures.
//! - [`cipher`]: the four ciphers and per-direction chunk keys (AWS-LC AEADs, legacy 3DES), and
//!   the largest chunk.
//! - `tdes`: 3DES-CBC + HMAC-SHA1-96 (legacy, for reproducing the papers).
//! - [`cpace`]: CPace (draft-irtf-cfrg-cpace, ristretto255/SHA-512), the PAKE the PSK enters.
//! - [`schedule`]: pre-shared secrets ([`Psk`]) and the HKDF-SHA256 key schedule over the
//!   CPace output.
//! - [`negotiate`]: the login keys, [`SealOffer`] (initiator) and [`SealAnswer`] /
//!   [`SealPending`] (target).
//! - [`frame`]: [`Role`], [`Direction`], [`Binding`] (a command's LUN, tag, opcode and the
//!   extent `ipsan_scsi::cdb::extent` reads from its CDB), the chunk layout and associated
//!   data, `sealed_len`/`plain_len`.
//! - `replay`: the anti-replay window.
//! - [`session`]: [`SealSession`], which seals and opens whole commands in place, and says
//!   which sealed lengths exist (`iscsi_proto::engine::target::SealedLengths`, the target
//!   engine's sizing of a sealed command).
//! - [`compress`]: compression before sealing (`X-org.ipsan.Compression`, LZ4 per chunk,
//!   framing version 2; the sealing and opening are in `session`).
//! - [`pool`]: [`CryptoPool`], worker threads whose futures the runtimes await.
//! - [`record`]: record protection, every PDU of a sealed session authenticated
//!   ([`RecordSealer`], [`RecordOpener`]), the framed read of both roles ([`read_pdu`]:
//!   verify, then decode), and the [`LoginTranscript`] the keys bind.
//! - [`sense`]: the SCSI sense data for a command whose data failed to open.
//!
//! Imports run one way: `kdf` at the bottom, then `tdes`, `cipher`, then `frame`, `schedule`,
//! `record`, `session`, `negotiate`; no two modules import each other.

mod buffers;
pub mod cipher;
pub mod compress;
pub mod cpace;
pub mod error;
pub mod frame;
mod kdf;
pub mod negotiate;
pub mod pool;
pub mod process;
pub mod record;
mod replay;
pub mod schedule;
pub mod session;
mod tdes;

#[cfg(test)]
mod kat;

pub use cipher::{Cipher, UnknownCipher};
pub use compress::Compression;
pub use error::{Forgery, NegotiationError, OpenError, SealError, SecretError};
pub use frame::{Binding, Direction, Framing};
pub use negotiate::{
    is_seal_key, AnswerOutcome, InitiatorNegotiation, PskLookup, SealAnswer, SealOffer,
    SealPending, SealPolicy, TargetNegotiation, TargetSealConfig, TextPairs, DEFAULT_CHUNK,
};
pub use pool::CryptoPool;
pub use record::{read_pdu, LoginTranscript, ReadError, RecordOpener, RecordSealer, VerifiedHead};
pub use replay::WINDOW as REPLAY_WINDOW;
pub use schedule::{Psk, SessionIds, TranscriptHash};
pub use session::{Role, SealSession, SealStats};

/// Sense data for a command whose sealed data failed to open (bad tag, replay, bad length).
///
/// The target ends such a WRITE with status CHECK CONDITION (0x02) and
/// sense key ABORTED COMMAND (0x0B), additional sense code 0x74 "SECURITY ERROR" with qualifier
/// 0x04 "CRYPTOGRAPHIC INTEGRITY VALIDATION FAILED" (SPC-4 Table D.2 / T10 ASC list). Nothing was
/// written. ABORTED COMMAND tells the initiator a retry may succeed (the corruption may have been
/// on the wire). An initiator that fails to open READ data reports the same code to its caller
/// and returns no data.
pub mod sense {
    /// SCSI status CHECK CONDITION.
    pub const STATUS: u8 = 0x02;
    /// Sense key ABORTED COMMAND.
    pub const SENSE_KEY: u8 = 0x0B;
    /// Additional sense code: SECURITY ERROR.
    pub const ASC: u8 = 0x74;
    /// Additional sense code qualifier: CRYPTOGRAPHIC INTEGRITY VALIDATION FAILED.
    pub const ASCQ: u8 = 0x04;
}
