//! NVMe over TCP protocol logic without I/O (issue 30): the counterpart of `iscsi-proto` for
//! NVMe/TCP, on `nvme-wire`'s codec. Bytes and commands in, PDUs, completions and block
//! requests out, time passed in; the tokio drivers (`ipsan-target`'s NVMe listener, the
//! initiator's NVMe session) hold only sockets, timers and wake-ups.
//!
//! # Layout
//! - [`command`]: what the transport hands the controller and gets back — a [`Command`] (the
//!   SQE and all of its host-to-controller data) and a [`Completion`] (the CQE and the data the
//!   host reads). The seam between the queue (PDUs) and the controller (commands).
//! - [`controller`]: the controller role behind the queues — Fabrics Connect/Property/
//!   Authentication dispatch, admin and I/O commands, keep-alive, asynchronous events and the
//!   discovery controller; I/O leaves as block requests ([`controller::BlockRequest`]) and
//!   their results come back by tag.
//! - [`auth`]: DH-HMAC-CHAP in-band authentication (TP 8006) for both roles, sans-IO:
//!   `DHHC-1` secrets, the messages, the FFDHE groups, [`auth::ControllerAuth`] and
//!   [`auth::HostAuth`] (one per queue).
//! - [`psk`]: NVMe/TCP's TLS PSKs (TP 8011): the `NVMeTLSkey-1:` interchange format, the
//!   retained and TLS PSK derivations (RFC 8446's and libnvme's), PSK identities, and the
//!   target's key store the `nvme-tls` crate's handshake picks a key from.
#![forbid(unsafe_code)]

pub mod auth;
pub mod command;
pub mod controller;
pub mod psk;

pub use command::{Command, Completion};
