//! The OpenSSL calls for TLS 1.3 external PSKs that the `openssl` crate does not wrap
//! (OpenSSL 3.0's `ssl.h`, present since 1.1.1), the read buffer length, `SSL_has_pending` and
//! `SSL_key_update`, and the two callbacks that hand OpenSSL a session built from a
//! [`TlsPsk`]. The only `unsafe` of the crate.
#![allow(unsafe_code)]

use std::ffi::{c_int, c_uchar};

use foreign_types::ForeignTypeRef;
use nvme_proto::psk::{PskHash, TlsPsk};
use openssl::ssl::{SslContextBuilder, SslRef};
use openssl_sys::{EVP_MD, SSL, SSL_CIPHER, SSL_CTX, SSL_SESSION};

type FindSessionCb = unsafe extern "C" fn(
    ssl: *mut SSL,
    identity: *const c_uchar,
    identity_len: usize,
    sess: *mut *mut SSL_SESSION,
) -> c_int;

type UseSessionCb = unsafe extern "C" fn(
    ssl: *mut SSL,
    md: *const EVP_MD,
    id: *mut *const c_uchar,
    idlen: *mut usize,
    sess: *mut *mut SSL_SESSION,
) -> c_int;

extern "C" {
    fn SSL_CTX_set_psk_find_session_callback(ctx: *mut SSL_CTX, cb: Option<FindSessionCb>);
    fn SSL_set_psk_use_session_callback(s: *mut SSL, cb: Option<UseSessionCb>);
    fn SSL_SESSION_new() -> *mut SSL_SESSION;
    fn SSL_SESSION_set1_master_key(
        sess: *mut SSL_SESSION,
        key: *const c_uchar,
        len: usize,
    ) -> c_int;
    fn SSL_CIPHER_find(ssl: *mut SSL, ptr: *const c_uchar) -> *const SSL_CIPHER;
    fn SSL_SESSION_set_cipher(s: *mut SSL_SESSION, cipher: *const SSL_CIPHER) -> c_int;
    fn SSL_SESSION_set_protocol_version(s: *mut SSL_SESSION, version: c_int) -> c_int;
    fn SSL_CTX_set_default_read_buffer_len(ctx: *mut SSL_CTX, len: usize);
    fn SSL_has_pending(s: *const SSL) -> c_int;
    fn SSL_key_update(s: *mut SSL, updatetype: c_int) -> c_int;
}

/// A TLS 1.3 session holding `psk` as its resumption secret with the cipher suite of its hash
/// (how OpenSSL takes an external PSK), or null when OpenSSL refuses.
fn psk_session(ssl: *mut SSL, psk: &TlsPsk) -> *mut SSL_SESSION {
    // IANA cipher suite values: TLS_AES_128_GCM_SHA256 = 0x1301, TLS_AES_256_GCM_SHA384 = 0x1302.
    let id: [c_uchar; 2] = match psk.hash() {
        PskHash::Sha256 => [0x13, 0x01],
        PskHash::Sha384 => [0x13, 0x02],
    };
    let key = psk.expose();
    // SAFETY: `ssl` is the live SSL OpenSSL passed to the callback we are called from; `id` is
    // two readable bytes (SSL_CIPHER_find reads exactly two). SSL_SESSION_new returns an owned
    // session or null (checked); set1_master_key copies `key.len()` bytes from a slice of that
    // length (at most 48, within TLS13_MAX_RESUMPTION_PSK_LENGTH) and OpenSSL cleanses its copy
    // when the session is freed. On any failure the session we own is freed once and null is
    // returned; on success ownership passes to the caller (OpenSSL, see the callbacks).
    unsafe {
        let cipher = SSL_CIPHER_find(ssl, id.as_ptr());
        if cipher.is_null() {
            return std::ptr::null_mut();
        }
        let sess = SSL_SESSION_new();
        if sess.is_null() {
            return sess;
        }
        if SSL_SESSION_set1_master_key(sess, key.as_ptr(), key.len()) != 1
            || SSL_SESSION_set_cipher(sess, cipher) != 1
            || SSL_SESSION_set_protocol_version(sess, openssl_sys::TLS1_3_VERSION) != 1
        {
            openssl_sys::SSL_SESSION_free(sess);
            return std::ptr::null_mut();
        }
        sess
    }
}

/// OpenSSL's `SSL_psk_find_session_cb_func` (target): 1 with `*sess` set keys the handshake
/// with that PSK, 1 with `*sess` null declines the identity, 0 aborts.
unsafe extern "C" fn find_session_trampoline(
    ssl: *mut SSL,
    identity: *const c_uchar,
    identity_len: usize,
    sess: *mut *mut SSL_SESSION,
) -> c_int {
    if ssl.is_null() || sess.is_null() {
        return 0;
    }
    // SAFETY: OpenSSL passes its live SSL (non-null, checked) and an identity of
    // `identity_len` bytes that stays valid during the call; `sess` is a writable out pointer
    // (non-null, checked). `SslRef::from_ptr_mut` borrows the SSL for this call only, and no
    // other reference to it exists while OpenSSL is inside the handshake that called us.
    unsafe {
        *sess = std::ptr::null_mut();
        let identity: &[u8] = if identity.is_null() || identity_len == 0 {
            &[]
        } else {
            std::slice::from_raw_parts(identity, identity_len)
        };
        let ssl_ref = SslRef::from_ptr_mut(ssl);
        if let Some(psk) = super::find_session(ssl_ref, identity) {
            *sess = psk_session(ssl, &psk);
        }
    }
    1
}

/// OpenSSL's `SSL_psk_use_session_cb_func` (host): sets the identity to offer and its session.
/// With one cipher suite configured, `md` (the hash after a HelloRetryRequest) is always that
/// suite's.
unsafe extern "C" fn use_session_trampoline(
    ssl: *mut SSL,
    _md: *const EVP_MD,
    id: *mut *const c_uchar,
    idlen: *mut usize,
    sess: *mut *mut SSL_SESSION,
) -> c_int {
    if ssl.is_null() || id.is_null() || idlen.is_null() || sess.is_null() {
        return 0;
    }
    // SAFETY: as above, OpenSSL's live SSL and writable out pointers (all non-null, checked).
    // The identity bytes handed back live in the SSL's ex_data (`ClientState`), which outlives
    // the handshake, as OpenSSL requires of `*id`.
    unsafe {
        *sess = std::ptr::null_mut();
        *id = std::ptr::null();
        *idlen = 0;
        let ssl_ref = SslRef::from_ptr_mut(ssl);
        let Some((identity, psk)) = super::use_session(ssl_ref) else {
            return 0;
        };
        let s = psk_session(ssl, psk);
        if s.is_null() {
            return 0;
        }
        *id = identity.as_ptr();
        *idlen = identity.len();
        *sess = s;
    }
    1
}

/// Installs the target's PSK lookup on a context.
pub(crate) fn set_find_session_callback(b: &mut SslContextBuilder) {
    // SAFETY: `b` owns a live SSL_CTX; the callback is a plain function with the signature
    // OpenSSL declares for SSL_psk_find_session_cb_func.
    unsafe { SSL_CTX_set_psk_find_session_callback(b.as_ptr(), Some(find_session_trampoline)) }
}

/// Installs the host's PSK on one connection.
pub(crate) fn set_use_session_callback(ssl: &mut SslRef) {
    // SAFETY: `ssl` is a live SSL; the callback is a plain function with the signature OpenSSL
    // declares for SSL_psk_use_session_cb_func.
    unsafe { SSL_set_psk_use_session_callback(ssl.as_ptr(), Some(use_session_trampoline)) }
}

/// Sets the size of the receive buffer OpenSSL reads ahead into.
pub(crate) fn set_default_read_buffer_len(b: &mut SslContextBuilder, len: usize) {
    // SAFETY: `b` owns a live SSL_CTX; the call only stores a length (OpenSSL ≥ 1.1.0).
    unsafe { SSL_CTX_set_default_read_buffer_len(b.as_ptr(), len) }
}

/// The body of extension `ext_type` in the ClientHello being processed, if the client sent it.
/// Only valid inside the client-hello callback, which is where it is called from.
pub(crate) fn client_hello_ext(ssl: &SslRef, ext_type: u32) -> Option<&[u8]> {
    let mut out: *const c_uchar = std::ptr::null();
    let mut len: usize = 0;
    // SAFETY: `ssl` is the live SSL of the running client-hello callback (the only time
    // OpenSSL keeps the ClientHello); the out pointers are valid locals. On success `out`
    // points at `len` bytes owned by the SSL, which outlive the returned borrow of `ssl`
    // within the callback.
    unsafe {
        if openssl_sys::SSL_client_hello_get0_ext(ssl.as_ptr(), ext_type, &mut out, &mut len) != 1
            || out.is_null()
        {
            return None;
        }
        Some(std::slice::from_raw_parts(out, len))
    }
}

/// Whether OpenSSL holds received bytes not yet handed out, processed or not (`SSL_has_pending`,
/// OpenSSL ≥ 1.1.0): none may be left when the record layer is taken over after the handshake.
pub(crate) fn has_pending(ssl: &SslRef) -> bool {
    // SAFETY: `ssl` is a live SSL; the call only reads its buffers' state.
    unsafe { SSL_has_pending(ssl.as_ptr()) == 1 }
}

/// Schedules a KeyUpdate (`SSL_key_update`, RFC 8446 §4.6.3) on OpenSSL's record layer: sent
/// with the next write; `request_peer` asks the peer to update its key too.
pub(crate) fn key_update(ssl: &SslRef, request_peer: bool) -> bool {
    // SAFETY: `ssl` is a live SSL whose handshake is complete (the caller's stream exists only
    // then); 1 = SSL_KEY_UPDATE_REQUESTED, 0 = SSL_KEY_UPDATE_NOT_REQUESTED.
    unsafe { SSL_key_update(ssl.as_ptr(), c_int::from(request_peer)) == 1 }
}
