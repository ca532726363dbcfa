//! The carriers beneath the iSCSI session of the lower-layer baselines: each starts its
//! tunnel between the namespaces and returns the address the initiator connects to.

mod ipsec;
mod tls;
mod wireguard;

pub(super) use ipsec::ipsec;
pub(super) use tls::{tls, tls_cipher};
pub(super) use wireguard::wireguard;
