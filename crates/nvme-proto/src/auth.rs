//! In-band authentication, DH-HMAC-CHAP (TP 8006, in NVMe Base 2.0 as "DH-HMAC-CHAP
//! protocol"), for both roles, without I/O.
//!
//! A transaction runs on one queue, after Connect answered AUTHREQ.ATR, through Fabrics
//! Authentication Send (host → controller) and Authentication Receive (controller → host)
//! commands carrying the [`message`]s:
//!
//! ```text
//! host                                    controller
//!  Auth Send    AUTH_Negotiate       →     picks hash and DH group
//!  Auth Receive DH-HMAC-CHAP_Challenge ←   T_ID, S1, C1, g^y
//!  Auth Send    DH-HMAC-CHAP_Reply   →     R1 (+ S2, C2 when bidirectional), g^x
//!  Auth Receive DH-HMAC-CHAP_Success1 ←    (R2 when bidirectional)   or AUTH_Failure1
//!  Auth Send    DH-HMAC-CHAP_Success2 →    (bidirectional only)      or AUTH_Failure2
//! ```
//!
//! - [`ControllerAuth`] is the controller's side of one queue: it takes each Authentication
//!   Send's data ([`ControllerAuth::auth_send`]), answers each Authentication Receive
//!   ([`ControllerAuth::auth_receive`]) and ends [`Succeeded`](AuthState::Succeeded) or
//!   [`Failed`](AuthState::Failed) with the reason.
//! - [`HostAuth`] is the host's side of one queue: [`HostAuth::start`] gives the Negotiate to
//!   send, [`HostAuth::receive`] takes each Authentication Receive's data and says what to send
//!   next ([`HostStep`]).
//!
//! Computations are Linux's (`drivers/nvme/common/auth.c`, `host/auth.c`, `target/auth.c`),
//! checked against Linux's target in `tests/auth_linux.rs`: responses
//! `HMAC(K, C || le32(S) || le16(T_ID) || 00h || "HostHost" || NQNh || 00h || NQNc)` (and
//! `"Controller" || NQNc || 00h || NQNh` for the controller), `K` the [`DhchapSecret`]
//! transformed with the answering side's NQN, `C` augmented with the DH session key when a
//! group is used ([`dh`]). Responses are compared in constant time; challenges, sequence
//! numbers and DH keys are fresh from the OS RNG for every transaction; secrets are zeroized
//! and never printed.
//!
//! Secure channel concatenation (TP 8006's optional SC_C: a TLS PSK generated from the
//! session key) is not implemented: a Negotiate asking for it gets Failure1 "secure channel
//! concatenation mismatch", and this host never asks. TLS with a configured PSK is `psk`'s.
#![allow(clippy::module_name_repetitions)]

pub mod dh;
mod ffdhe;
pub mod hash;
pub mod message;
pub mod secret;

mod controller;
mod host;

pub use controller::ControllerAuth;
pub use dh::DhGroup;
pub use hash::HashId;
pub use host::{HostAuth, HostStep};
pub use message::{FailureReason, Message, MessageError};
pub use secret::{DhchapSecret, SecretError};

use nvme_wire::fabrics::{Auth, SECP_NVME_AUTH, SPSP_DHCHAP};
use nvme_wire::Status;

/// The allocation length a host gives its Authentication Receive commands: room for the
/// largest message (a Challenge with SHA-512 and ffdhe8192 is 1104 bytes); Linux's host uses
/// the same 4 KiB.
pub const RECEIVE_ALLOC_LEN: u32 = 4096;

/// What one side requires and accepts, shared by every queue of a host/controller pair.
#[derive(Debug, Clone)]
pub struct AuthConfig {
    /// The host's secret (`dhchap_secret`): the host proves it, the controller checks it.
    pub host_secret: DhchapSecret,
    /// The controller's secret (`dhchap_ctrl_secret`): with it the host asks for (and the
    /// controller can answer) bidirectional authentication.
    pub ctrl_secret: Option<DhchapSecret>,
    /// Hashes accepted, in order of preference (the controller picks its first one the host
    /// offers; the host offers these).
    pub hashes: Vec<HashId>,
    /// DH groups accepted, in order of preference.
    pub dh_groups: Vec<DhGroup>,
}

impl AuthConfig {
    /// Every hash (SHA-256 first) and every group (ffdhe2048 first, then the larger ones, NULL
    /// last), as Linux's host offers them.
    #[must_use]
    pub fn new(host_secret: DhchapSecret, ctrl_secret: Option<DhchapSecret>) -> Self {
        Self {
            host_secret,
            ctrl_secret,
            hashes: HashId::ALL.to_vec(),
            dh_groups: vec![
                DhGroup::Ffdhe2048,
                DhGroup::Ffdhe3072,
                DhGroup::Ffdhe4096,
                DhGroup::Ffdhe6144,
                DhGroup::Ffdhe8192,
                DhGroup::Null,
            ],
        }
    }
}

/// Where a queue's authentication stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AuthState {
    /// No transaction finished yet (or one is running).
    InProgress,
    /// The last transaction succeeded with this hash and group; `bidirectional` when the
    /// controller proved itself too.
    Succeeded {
        hash: HashId,
        dh_group: DhGroup,
        bidirectional: bool,
    },
    /// The last transaction failed.
    Failed(AuthFailure),
}

/// Why a transaction failed: the explanation, and whether this side detected it (`local`)
/// or the peer reported it in a Failure message. Never holds secret material.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("DH-HMAC-CHAP {}: {reason}", if *.local { "failed" } else { "refused by the peer" })]
pub struct AuthFailure {
    pub reason: FailureReason,
    pub local: bool,
}

/// An Authentication Send/Receive the controller completes with an error status rather than
/// a protocol message (the transaction's state is unchanged).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum AuthCommandError {
    /// SECP is not E9h or SPSP0/SPSP1 not 01h (Invalid Field in Command).
    #[error(
        "not a DH-HMAC-CHAP security protocol (SECP {secp:#04x}, SPSP {spsp0:#04x}/{spsp1:#04x})"
    )]
    Protocol { secp: u8, spsp0: u8, spsp1: u8 },
    /// Transfer or allocation length 0 (Invalid Field in Command).
    #[error("authentication transfer length is zero")]
    ZeroLength,
    /// The Authentication Receive's allocation length is shorter than the message
    /// (Invalid Field in Command; the host may ask again with more).
    #[error("allocation length {alloc} is shorter than the {needed}-byte message")]
    AllocationTooSmall { alloc: u32, needed: usize },
}

impl AuthCommandError {
    /// The completion status to answer the command with.
    #[must_use]
    pub fn status(self) -> Status {
        Status::INVALID_FIELD
    }
}

/// Checks an Authentication Send/Receive's SECP, SPSP0/1 and length (what Linux's target
/// checks before looking at the data).
///
/// # Errors
/// [`AuthCommandError::Protocol`] or [`AuthCommandError::ZeroLength`].
pub fn check_command(auth: &Auth) -> Result<(), AuthCommandError> {
    if auth.secp != SECP_NVME_AUTH || auth.spsp0 != SPSP_DHCHAP || auth.spsp1 != SPSP_DHCHAP {
        return Err(AuthCommandError::Protocol {
            secp: auth.secp,
            spsp0: auth.spsp0,
            spsp1: auth.spsp1,
        });
    }
    if auth.len == 0 {
        return Err(AuthCommandError::ZeroLength);
    }
    Ok(())
}

/// A nonzero random sequence number (TP 8006: 0 in a Reply means "not bidirectional").
fn fresh_seqnum(rng: &mut impl rand::RngCore) -> u32 {
    loop {
        let s = rng.next_u32();
        if s != 0 {
            return s;
        }
    }
}

/// A fresh random challenge of `len` bytes.
fn fresh_challenge(rng: &mut impl rand::RngCore, len: usize) -> Vec<u8> {
    let mut c = vec![0u8; len];
    rng.fill_bytes(&mut c);
    c
}
