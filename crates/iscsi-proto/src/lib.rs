//! iSCSI protocol logic without I/O (RFC 7143).
//!
//! # Layout
//! - [`params`]: the key table, negotiation result functions and the session's values in force.
//! - [`chap`]: CHAP for both sides (RFC 1994, RFC 7143 §12.1.3).
//! - [`login`]: the target's login state machine (RFC 7143 §6, §11.12–§11.13), from the first
//!   Login Request to full feature phase, and in [`login::originator`] the initiator's, both
//!   negotiating into [`params::SessionParams`] and both ending with the non-`Copy` proof of
//!   authentication ([`login::Authenticated`]) the full-feature phase is built from. One
//!   concern per file: `login.rs` the types both roles share and the target's machine,
//!   `login/security.rs` its first request and security stage (CHAP, relayed CHAP),
//!   `login/operational.rs` its operational keys; `login/originator.rs` the originator's
//!   machine, `originator/security.rs` and `originator/operational.rs` its two stages,
//!   `originator/exchange.rs` its PDUs.
//! - [`discovery`]: the originator's discovery session after login (SendTargets over Text
//!   Requests with continuation and TTT, then Logout; RFC 7143 §11.10–§11.15, Appendix D).
//!   The originator's login as PDUs is [`login::originator::LoginExchange`].
//! - [`engine`]: the full feature phase for both roles, and the initiator's session above its
//!   connection (task table, session recovery's reissue policy), sans-IO (see its `# Layout`).
//! - [`seq`]: serial number arithmetic and the command window (RFC 7143 §4.2.2, §4.2.2.1).

pub mod chap;
pub mod discovery;
pub mod engine;
pub mod login;
pub mod params;
pub mod secret_file;
pub mod seq;
