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
//! - [`host`]: the host role: [`host::HostQueue`], one NVMe/TCP connection (ICReq/ICResp,
//!   capsules with in-capsule data, R2T → H2CData, C2HData reassembly, digests, CIDs,
//!   termination); [`host::bringup`], the admin queue's bring-up (Connect, DH-HMAC-CHAP,
//!   CAP/VS, CC.EN, CSTS.RDY, Identify, Number of Queues), the Discovery log read and Keep
//!   Alive; [`host::authn`], one queue's DH-HMAC-CHAP as Authentication Send/Receive
//!   commands; [`host::cmd`], the commands a host sends and parsers of what comes back.
//! - [`idhash`]: the hash of the per-command maps keyed by CIDs, TTAGs and tags.
//! - [`psk`]: NVMe/TCP's TLS PSKs (TP 8011): the `NVMeTLSkey-1:` interchange format, the
//!   retained and TLS PSK derivations (RFC 8446's and libnvme's), PSK identities, and the
//!   target's key store the `nvme-tls` crate's handshake picks a key from.
//! - [`queue`]: the controller-role NVMe/TCP connection machine (ICReq/ICResp, command
//!   capsules and in-capsule data, R2T/H2CData, C2HData, digests, termination): PDUs in,
//!   [`Command`]s out; [`Completion`]s in, PDUs out.
#![forbid(unsafe_code)]

pub mod auth;
pub mod command;
pub mod controller;
pub mod host;
pub mod idhash;
pub mod psk;
pub mod queue;

pub use command::{Command, Completion};
