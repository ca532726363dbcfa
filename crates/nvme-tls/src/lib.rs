//! TLS 1.3 with a configured PSK for NVMe/TCP (TP 8011; NVMe/TCP Transport 1.1 "Transport
//! Layer Security"), both roles, over any tokio stream. The keys and identities are
//! [`nvme_proto::psk`]'s (sans-IO); this crate only runs the handshake and carries the bytes.
//!
//! - Target: [`accept`] reads the host's ClientHello, looks the offered PSK identity up in a
//!   [`PskStore`] (host NQN, subsystem NQN → configured key; the TLS PSK derived for exactly
//!   that identity) and returns the stream with the identity it was keyed for, so the
//!   controller can check that Connect's host NQN and subsystem NQN are the identity's.
//! - Host: [`connect`] offers one identity for (host NQN, subsystem NQN) and its TLS PSK.
//!
//! What it negotiates is what Linux's `tlshd` (GnuTLS) does for NVMe: TLS 1.3 only, the
//! external PSK with `psk_dhe_ke` (an (EC)DHE key share as well, so the session keys are
//! forward secret), the cipher suite the PSK's hash fixes (TLS_AES_128_GCM_SHA256 for `01`
//! keys, TLS_AES_256_GCM_SHA384 for `02`), no certificates, and no session tickets (a ticket
//! sent after the handshake would reach a Linux host's kTLS socket as a handshake record it
//! cannot take).
//!
//! # Why OpenSSL
//! - **rustls** (0.23, and 0.24.0-dev.2, the newest in the registry on 2026-11-27) has no
//!   external (out-of-band) PSKs for TLS 1.3 — only resumption PSKs from its own tickets — so
//!   it cannot speak TP 8011 at all.
//! - **OpenSSL 3** (Debian 12's libssl3 3.0, maintained, the TLS library most NVMe/TCP
//!   stacks ship with, AES-GCM with AES-NI/VAES at memory speed) has TLS 1.3 external PSKs of
//!   either hash through `SSL_CTX_set_psk_find_session_callback` /
//!   `SSL_set_psk_use_session_callback`. Its older `psk_server_callback` path (the one the
//!   `openssl` crate wraps) is limited to SHA-256 in TLS 1.3, so `02` keys need the session
//!   callbacks: the four calls the crate does not wrap are declared here (`ffi`), everything
//!   else goes through the `openssl` crate's safe API.
//! - **GnuTLS** (what `tlshd` uses) has no maintained Rust binding.
//!
//! # Records
//! OpenSSL runs the handshake; the records after it are sealed and opened in user space by a
//! TLS 1.3 record layer of this crate (`records` module: RFC 8446 §5 and §7.3 on AWS-LC's
//! AES-GCM, keyed from the traffic secrets OpenSSL's key-log callback hands over, KeyUpdate
//! followed and answered), because OpenSSL's behind a BIO copied each byte twice more and
//! cost more than the cipher (docs/results/nvme-tls-records). The wire is the same TLS 1.3;
//! [`RecordLayer::OpenSsl`] keeps OpenSSL's record layer (the reference the tests hold ours
//! against). kTLS is not used: this machine's kernel has none, and OpenSSL's kTLS needs a
//! socket BIO. [`TlsStream`] is an `AsyncRead + AsyncWrite` with vectored writes that sends
//! a batch of records with one system call and reads a burst of records per call (`stream`
//! module: what it costs and why).
//!
//! Handshakes are not bounded in time here: callers wrap [`accept`]/[`connect`] in their own
//! timeout (a host that never finishes its ClientHello holds only its own task).

use std::sync::OnceLock;

use nvme_proto::psk::{
    ConfiguredPsk, Derivation, IdentityVersion, PskError, PskHash, PskIdentity, PskStore, TlsPsk,
};
use openssl::error::ErrorStack;
use openssl::ex_data::Index;
use openssl::ssl::{
    ClientHelloResponse, Ssl, SslContext, SslMethod, SslOptions, SslRef, SslVerifyMode, SslVersion,
};
use tokio::io::{AsyncRead, AsyncWrite};

mod ffi;
mod records;
mod stream;

use records::{KeyLog, Records};
pub use stream::TlsStream;
use stream::{Sealed, READ_BUFFER};

/// Which code seals and opens the records once OpenSSL's handshake is done.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum RecordLayer {
    /// This crate's TLS 1.3 record layer (`records`): no copies beyond the kernel's and the
    /// cipher's. What [`accept`], [`connect`] and [`connect_with`] use.
    #[default]
    Own,
    /// OpenSSL's record layer through `tokio-openssl` (the reference implementation).
    OpenSsl,
}

/// Why a handshake did not produce a PSK-keyed TLS 1.3 stream. Texts hold no key material.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    /// OpenSSL could not be set up (allocation, a missing cipher).
    #[error("TLS setup failed: {0}")]
    Setup(#[from] ErrorStack),
    /// The host offered no identity this target has a key for (the first reason given).
    #[error("no TLS PSK for the host's identity: {0}")]
    NoKey(PskError),
    /// The peer offered no PSK identity at all.
    #[error("the peer offered no TLS PSK identity")]
    NoIdentity,
    /// The handshake failed: the peer used another key (the binder or Finished did not
    /// verify), another cipher suite, no PSK, or the connection broke.
    #[error("TLS handshake failed: {0}")]
    Handshake(String),
    /// The handshake completed without the external PSK (cannot happen with the settings
    /// here; checked so that a certificate handshake is never taken for a keyed one).
    #[error("TLS handshake completed without the PSK")]
    NotPsk,
    /// The record layer could not take over after the handshake (no secrets logged, an
    /// unexpected suite, bytes left inside OpenSSL).
    #[error("TLS record layer: {0}")]
    Records(String),
}

/// A target's accepted connection: the stream and the identity whose key it was keyed with.
#[derive(Debug)]
pub struct Accepted<S> {
    /// The TLS stream; NVMe/TCP PDUs flow through it.
    pub stream: TlsStream<S>,
    /// The host's PSK identity: its host NQN and subsystem NQN must be the ones Connect names.
    pub identity: PskIdentity,
    /// How the host derived its key (for logs: libnvme's or RFC 8446's).
    pub derivation: Derivation,
}

/// What the target's session callback found, kept on the `SSL` for the handshake's length.
struct ServerState {
    store: PskStore,
    chosen: Option<(PskIdentity, Derivation)>,
    refused: Option<PskError>,
    offered: bool,
}

/// The host's identity and key, kept on the `SSL` (OpenSSL reads the identity bytes after the
/// callback returns, so they must outlive it).
struct ClientState {
    identity: Vec<u8>,
    psk: TlsPsk,
}

fn keylog_index() -> Result<Index<Ssl, KeyLog>, ErrorStack> {
    static IDX: OnceLock<Index<Ssl, KeyLog>> = OnceLock::new();
    if let Some(i) = IDX.get() {
        return Ok(*i);
    }
    let i = Ssl::new_ex_index::<KeyLog>()?;
    Ok(*IDX.get_or_init(|| i))
}

fn server_index() -> Result<Index<Ssl, ServerState>, ErrorStack> {
    static IDX: OnceLock<Index<Ssl, ServerState>> = OnceLock::new();
    if let Some(i) = IDX.get() {
        return Ok(*i);
    }
    let i = Ssl::new_ex_index::<ServerState>()?;
    Ok(*IDX.get_or_init(|| i))
}

fn client_index() -> Result<Index<Ssl, ClientState>, ErrorStack> {
    static IDX: OnceLock<Index<Ssl, ClientState>> = OnceLock::new();
    if let Some(i) = IDX.get() {
        return Ok(*i);
    }
    let i = Ssl::new_ex_index::<ClientState>()?;
    Ok(*IDX.get_or_init(|| i))
}

fn ciphersuite(hash: PskHash) -> &'static str {
    hash.cipher_suite()
}

fn tls13_only(b: &mut openssl::ssl::SslContextBuilder) -> Result<(), ErrorStack> {
    b.set_min_proto_version(Some(SslVersion::TLS1_3))?;
    b.set_max_proto_version(Some(SslVersion::TLS1_3))?;
    // psk_dhe_ke only (OpenSSL's default; ALLOW_NO_DHE_KEX stays off), no tickets, no
    // renegotiation (none exists in TLS 1.3), no compression.
    b.set_options(SslOptions::NO_TICKET | SslOptions::NO_COMPRESSION);
    b.set_num_tickets(0)?;
    // No read-ahead: during the handshake OpenSSL reads exactly one record at a time, so it
    // holds none of the peer's first application records when the handshake ends and our
    // record layer takes over (with OpenSSL's record layer, reads are single records too:
    // the stream reads bursts of them).
    b.set_read_ahead(false);
    ffi::set_default_read_buffer_len(b, READ_BUFFER);
    // The application traffic secrets for our record layer, kept on the connection that asked
    // for them (`KeyLog` in its ex_data) and nowhere else.
    b.set_keylog_callback(|ssl, line| {
        if let Some(log) = keylog_index().ok().and_then(|i| ssl.ex_data(i)) {
            log.line(line);
        }
    });
    Ok(())
}

fn server_context() -> Result<SslContext, ErrorStack> {
    static CTX: OnceLock<SslContext> = OnceLock::new();
    if let Some(c) = CTX.get() {
        return Ok(c.clone());
    }
    let mut b = SslContext::builder(SslMethod::tls_server())?;
    tls13_only(&mut b)?;
    b.set_ciphersuites(&format!(
        "{}:{}",
        ciphersuite(PskHash::Sha256),
        ciphersuite(PskHash::Sha384)
    ))?;
    ffi::set_find_session_callback(&mut b);
    b.set_client_hello_callback(|ssl, _alert| {
        if let Some(hash) = ffi::client_hello_ext(ssl, PRE_SHARED_KEY).and_then(offered_hash) {
            ssl.set_ciphersuites(ciphersuite(hash))?;
        }
        Ok(ClientHelloResponse::SUCCESS)
    });
    let ctx = b.build();
    Ok(CTX.get_or_init(|| ctx).clone())
}

/// The `pre_shared_key` extension's type (RFC 8446 §4.2).
const PRE_SHARED_KEY: u32 = 41;

/// The hash of the first NVMe identity in a ClientHello's `pre_shared_key` extension
/// (RFC 8446 §4.2.11: `identities<7..2^16-1>` of `opaque identity<1..2^16-1>; uint32 age`).
///
/// OpenSSL picks the cipher suite (by the client's order) before it looks at PSKs, and drops
/// a PSK whose hash is not the suite's: a host offering TLS_AES_256_GCM_SHA384 first with a
/// SHA-256 PSK would fail. Narrowing the suites to the identity's hash first avoids that.
fn offered_hash(ext: &[u8]) -> Option<PskHash> {
    let list_len = usize::from(u16::from_be_bytes([*ext.first()?, *ext.get(1)?]));
    let mut list = ext.get(2..2 + list_len)?;
    while list.len() >= 2 {
        let id_len = usize::from(u16::from_be_bytes([list[0], list[1]]));
        let id = list.get(2..2 + id_len)?;
        if let Ok(identity) = PskIdentity::parse(id) {
            return Some(identity.hash);
        }
        list = list.get(2 + id_len + 4..)?;
    }
    None
}

fn client_context(hash: PskHash) -> Result<SslContext, ErrorStack> {
    static CTX: [OnceLock<SslContext>; 2] = [OnceLock::new(), OnceLock::new()];
    let slot = &CTX[usize::from(hash == PskHash::Sha384)];
    if let Some(c) = slot.get() {
        return Ok(c.clone());
    }
    let mut b = SslContext::builder(SslMethod::tls_client())?;
    tls13_only(&mut b)?;
    b.set_ciphersuites(ciphersuite(hash))?;
    // No certificate is trusted: a server that answers with one instead of the PSK fails.
    b.set_verify(SslVerifyMode::PEER);
    let ctx = b.build();
    Ok(slot.get_or_init(|| ctx).clone())
}

/// The target's PSK lookup (OpenSSL's find-session callback, via [`ffi`]): `Ok(Some(psk))`
/// keys the handshake, `Ok(None)` declines this identity (the handshake then fails: there is
/// no certificate to fall back to).
fn find_session(ssl: &mut SslRef, identity: &[u8]) -> Option<TlsPsk> {
    let idx = server_index().ok()?;
    let state = ssl.ex_data_mut(idx)?;
    state.offered = true;
    match state.store.resolve(identity) {
        Ok(r) => {
            state.chosen = Some((r.identity, r.derivation));
            Some(r.psk)
        }
        Err(e) => {
            tracing::debug!(error = %e, "TLS PSK identity refused");
            state.refused.get_or_insert(e);
            None
        }
    }
}

/// The host's PSK (OpenSSL's use-session callback, via [`ffi`]).
fn use_session(ssl: &mut SslRef) -> Option<(&[u8], &TlsPsk)> {
    let idx = client_index().ok()?;
    let state = ssl.ex_data(idx)?;
    Some((state.identity.as_slice(), &state.psk))
}

/// Target role: the TLS 1.3 handshake on a new connection, keyed by the PSK `store` holds for
/// the identity the host offers.
pub async fn accept<S>(stream: S, store: &PskStore) -> Result<Accepted<S>, TlsError>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    accept_using(stream, store, RecordLayer::Own).await
}

/// [`accept`] with the record layer chosen.
pub async fn accept_using<S>(
    stream: S,
    store: &PskStore,
    layer: RecordLayer,
) -> Result<Accepted<S>, TlsError>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    let ctx = server_context()?;
    let mut ssl = Ssl::new(&ctx)?;
    if layer == RecordLayer::Own {
        ssl.set_ex_data(keylog_index()?, KeyLog::default());
    }
    ssl.set_ex_data(
        server_index()?,
        ServerState {
            store: store.clone(),
            chosen: None,
            refused: None,
            offered: false,
        },
    );
    let mut tls = TlsStream::from_ssl(tokio_openssl::SslStream::new(ssl, Sealed::new(stream))?);
    let done = tls.handshake(|s, cx| s.poll_accept(cx)).await;
    let state = tls.ssl().ex_data(server_index()?);
    let (chosen, refused, offered) = match state {
        Some(s) => (s.chosen.clone(), s.refused.clone(), s.offered),
        None => (None, None, false),
    };
    if let Err(e) = done {
        return Err(match (refused, offered) {
            (Some(r), _) if chosen.is_none() => TlsError::NoKey(r),
            (_, false) => TlsError::NoIdentity,
            _ => TlsError::Handshake(e),
        });
    }
    let (identity, derivation) = chosen.ok_or(TlsError::NotPsk)?;
    if !tls.ssl().session_reused() {
        return Err(TlsError::NotPsk);
    }
    take_over(&mut tls, layer)?;
    Ok(Accepted {
        stream: tls,
        identity,
        derivation,
    })
}

/// Host role: the TLS 1.3 handshake offering `key`'s identity for (`hostnqn`, `subnqn`) in the
/// form Linux targets configured with `nvme check-tls-key --insert` look up: a version 0
/// identity (`NVMe0R0H <hostnqn> <subnqn>`) and libnvme's derivation. Use [`connect_with`]
/// for the others.
pub async fn connect<S>(
    stream: S,
    hostnqn: &str,
    subnqn: &str,
    key: &ConfiguredPsk,
) -> Result<TlsStream<S>, TlsError>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    let (identity, psk) = key.tls_psk(hostnqn, subnqn, IdentityVersion::V0, Derivation::Libnvme);
    connect_with(stream, &identity, &psk).await
}

/// Host role with an explicit identity and TLS PSK (from [`ConfiguredPsk::tls_psk`] with the
/// identity version and derivation the target expects, or a key read from a keyring).
pub async fn connect_with<S>(
    stream: S,
    identity: &PskIdentity,
    psk: &TlsPsk,
) -> Result<TlsStream<S>, TlsError>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    connect_using(stream, identity, psk, RecordLayer::Own).await
}

/// [`connect_with`] with the record layer chosen.
pub async fn connect_using<S>(
    stream: S,
    identity: &PskIdentity,
    psk: &TlsPsk,
    layer: RecordLayer,
) -> Result<TlsStream<S>, TlsError>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    let ctx = client_context(psk.hash())?;
    let mut ssl = Ssl::new(&ctx)?;
    if layer == RecordLayer::Own {
        ssl.set_ex_data(keylog_index()?, KeyLog::default());
    }
    ssl.set_ex_data(
        client_index()?,
        ClientState {
            identity: identity.to_string().into_bytes(),
            psk: psk.clone(),
        },
    );
    ffi::set_use_session_callback(&mut ssl);
    let mut tls = TlsStream::from_ssl(tokio_openssl::SslStream::new(ssl, Sealed::new(stream))?);
    tls.handshake(|s, cx| s.poll_connect(cx))
        .await
        .map_err(TlsError::Handshake)?;
    if !tls.ssl().session_reused() {
        return Err(TlsError::NotPsk);
    }
    take_over(&mut tls, layer)?;
    Ok(tls)
}

/// Hands the records to our record layer, with the secrets the key log kept (which leave
/// the `SSL`: its ex_data is emptied).
fn take_over<S>(tls: &mut TlsStream<S>, layer: RecordLayer) -> Result<(), TlsError> {
    if layer != RecordLayer::Own {
        return Ok(());
    }
    let idx = keylog_index()?;
    let log = tls
        .ssl()
        .ex_data(idx)
        .ok_or_else(|| TlsError::Records("no key log".into()))?;
    let records = Records::after_handshake(tls.ssl(), log, READ_BUFFER)
        .map_err(|e| TlsError::Records(e.to_string()))?;
    tls.set_records(records);
    Ok(())
}

/// The negotiated cipher suite's name (for logs and tests).
pub fn cipher_name<S>(stream: &TlsStream<S>) -> Option<&'static str> {
    stream
        .ssl()
        .current_cipher()
        .map(|c| c.standard_name().unwrap_or(c.name()))
}
