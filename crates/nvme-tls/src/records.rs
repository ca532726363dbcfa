//! TLS 1.3's record layer of our own, after OpenSSL's handshake (RFC 8446 §5, §7.3, §4.6.3).
//!
//! OpenSSL runs the handshake (PSK, key share, Finished) and hands over the two application
//! traffic secrets (`client_application_traffic_secret_0`, `server_application_traffic_secret_0`)
//! through its key-log callback; this module derives the record keys from them and seals and
//! opens the records itself with AWS-LC's AES-GCM (what `ipsan-seal` uses). Why: OpenSSL's
//! record layer behind a BIO copies every byte twice more than needed (the plaintext into its
//! write buffer and the sealed record out through the BIO; each opened record out of its read
//! buffer) and runs one `SSL_read`/`SSL_write` per 16 KiB record; here a record is sealed
//! straight from the caller's buffer into the send buffer and opened straight from the receive
//! buffer into the caller's (docs/results/nvme-tls-records).
//!
//! On the wire nothing changes: TLS 1.3 records (outer type application_data, legacy version
//! 0x0303, the inner content type after the plaintext), the keys and IVs of RFC 8446 §7.3
//! (`HKDF-Expand-Label(secret, "key", "", key_length)`, `"iv"`, 12 bytes; the secrets themselves
//! are *not* keys), the per-record nonce of §5.3 (the IV XOR the 64-bit sequence number, which
//! starts at 0 for each key and never wraps), and KeyUpdate (§4.6.3: the peer's is followed;
//! one with `update_requested` is answered before the next application data). No key update is
//! started on our own: Linux 6.12's kTLS host cannot take one (it fails the queue on any
//! non-data record), and OpenSSL's record layer did not start one either.
//!
//! Every record is opened (its tag verified) before a byte of it is delivered; a record that
//! does not open, a record out of order or replayed (its nonce is another's), a non-data record
//! type outside the encryption, an oversized record or an alert ends the stream with an error
//! that names no key material.

use std::fmt;
use std::io;
use std::pin::Pin;
use std::sync::Mutex;
use std::task::{Context, Poll};

use aws_lc_rs::aead::{
    self, Aad, LessSafeKey, Nonce, TlsProtocolId, TlsRecordSealingKey, UnboundKey, NONCE_LEN,
};
use aws_lc_rs::hkdf;
use openssl::ssl::SslRef;
use tokio::io::{AsyncRead, ReadBuf};
use zeroize::{Zeroize, Zeroizing};

/// TLS 1.3's content types (RFC 8446 §5.1).
const ALERT: u8 = 21;
const HANDSHAKE: u8 = 22;
const APPLICATION_DATA: u8 = 23;
/// Handshake message types after the handshake (RFC 8446 §4).
const NEW_SESSION_TICKET: u8 = 4;
const KEY_UPDATE: u8 = 24;
/// AES-GCM's tag.
const TAG: usize = 16;
/// A record's header: type, legacy version, length.
const HEADER: usize = 5;
/// The largest TLS 1.3 record's plaintext (RFC 8446 §5.1: 2^14 bytes).
pub(crate) const RECORD: usize = 16 * 1024;
/// The largest ciphertext a record may carry (RFC 8446 §5.2: 2^14 + 256).
const MAX_CIPHERTEXT: usize = RECORD + 256;
/// Post-handshake handshake bytes kept while a message is incomplete (a KeyUpdate is 5 bytes,
/// a NewSessionTicket a few hundred).
const MAX_HANDSHAKE: usize = 64 * 1024;

/// A traffic secret: zeroized on drop, never printed.
pub(crate) struct Secret(Zeroizing<Vec<u8>>);

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("<redacted>")
    }
}

/// What the key-log callback kept of one handshake: the two application traffic secrets.
#[derive(Default)]
pub(crate) struct KeyLog {
    secrets: Mutex<(Option<Secret>, Option<Secret>)>,
}

impl KeyLog {
    /// Takes one line of OpenSSL's key log (`LABEL <client random> <secret>`, hex), keeping
    /// only the first application traffic secrets. The line is OpenSSL's buffer (cleansed by
    /// OpenSSL after the callback); nothing of it is logged.
    pub(crate) fn line(&self, line: &str) {
        let mut parts = line.split(' ');
        let (Some(label), Some(_random), Some(hex)) = (parts.next(), parts.next(), parts.next())
        else {
            return;
        };
        let client = match label {
            "CLIENT_TRAFFIC_SECRET_0" => true,
            "SERVER_TRAFFIC_SECRET_0" => false,
            _ => return,
        };
        let Some(secret) = unhex(hex) else { return };
        let Ok(mut s) = self.secrets.lock() else {
            return;
        };
        if client {
            s.0 = Some(secret);
        } else {
            s.1 = Some(secret);
        }
    }

    fn take(&self) -> (Option<Secret>, Option<Secret>) {
        match self.secrets.lock() {
            Ok(mut s) => (s.0.take(), s.1.take()),
            Err(_) => (None, None),
        }
    }
}

fn unhex(hex: &str) -> Option<Secret> {
    let hex = hex.as_bytes();
    if hex.len() % 2 != 0 || hex.len() > 2 * 64 {
        return None;
    }
    fn nibble(c: u8) -> Option<u8> {
        match c {
            b'0'..=b'9' => Some(c - b'0'),
            b'a'..=b'f' => Some(c - b'a' + 10),
            b'A'..=b'F' => Some(c - b'A' + 10),
            _ => None,
        }
    }
    let mut out = Zeroizing::new(Vec::with_capacity(hex.len() / 2));
    for pair in hex.chunks_exact(2) {
        out.push((nibble(pair[0])? << 4) | nibble(pair[1])?);
    }
    Some(Secret(out))
}

/// The cipher suite's AEAD and hash (RFC 8446 §B.4).
#[derive(Clone, Copy)]
struct Suite {
    aead: &'static aead::Algorithm,
    hkdf: hkdf::Algorithm,
    hash_len: usize,
}

impl Suite {
    fn of(name: &str) -> Option<Self> {
        match name {
            "TLS_AES_128_GCM_SHA256" => Some(Self {
                aead: &aead::AES_128_GCM,
                hkdf: hkdf::HKDF_SHA256,
                hash_len: 32,
            }),
            "TLS_AES_256_GCM_SHA384" => Some(Self {
                aead: &aead::AES_256_GCM,
                hkdf: hkdf::HKDF_SHA384,
                hash_len: 48,
            }),
            _ => None,
        }
    }
}

struct Len(usize);

impl hkdf::KeyType for Len {
    fn len(&self) -> usize {
        self.0
    }
}

/// `HKDF-Expand-Label(secret, label, "", out.len())` (RFC 8446 §7.1).
fn expand_label(suite: Suite, secret: &[u8], label: &[u8], out: &mut [u8]) -> io::Result<()> {
    let prk = hkdf::Prk::new_less_safe(suite.hkdf, secret);
    let len = u16::try_from(out.len()).map_err(|_| bad("HKDF length"))?;
    let len = len.to_be_bytes();
    let label_len = [u8::try_from(6 + label.len()).map_err(|_| bad("HKDF label"))?];
    let info: [&[u8]; 5] = [&len, &label_len, b"tls13 ", label, &[0]];
    prk.expand(&info, Len(out.len()))
        .and_then(|okm| okm.fill(out))
        .map_err(|_| bad("HKDF-Expand-Label failed"))
}

/// A traffic key's key and IV (RFC 8446 §7.3), and the next secret on KeyUpdate (§7.2).
fn traffic_keys(suite: Suite, secret: &[u8]) -> io::Result<(Zeroizing<Vec<u8>>, [u8; NONCE_LEN])> {
    let mut key = Zeroizing::new(vec![0u8; suite.aead.key_len()]);
    expand_label(suite, secret, b"key", &mut key)?;
    let mut iv = [0u8; NONCE_LEN];
    expand_label(suite, secret, b"iv", &mut iv)?;
    Ok((key, iv))
}

fn next_secret(suite: Suite, secret: &Secret) -> io::Result<Secret> {
    let mut next = Zeroizing::new(vec![0u8; suite.hash_len]);
    expand_label(suite, &secret.0, b"traffic upd", &mut next)?;
    Ok(Secret(next))
}

/// The per-record nonce: the IV XOR the sequence number (RFC 8446 §5.3); `None` once the
/// sequence number is used up (it must not wrap).
fn nonce(iv: &[u8; NONCE_LEN], seq: &mut u64) -> Option<Nonce> {
    let n = *seq;
    *seq = n.checked_add(1)?;
    let mut bytes = *iv;
    for (b, s) in bytes[NONCE_LEN - 8..].iter_mut().zip(n.to_be_bytes()) {
        *b ^= s;
    }
    Some(Nonce::assume_unique_for_key(bytes))
}

fn bad(what: &str) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, format!("TLS: {what}"))
}

fn header(len: usize) -> [u8; HEADER] {
    // `len` ≤ MAX_CIPHERTEXT, so it fits in 16 bits.
    let l = (len as u16).to_be_bytes();
    [APPLICATION_DATA, 3, 3, l[0], l[1]]
}

/// The sending half: the key, its IV and sequence number, and the secret the next key comes
/// from. AWS-LC's TLS 1.3 sealing key also refuses a nonce that does not increase.
struct Sealer {
    suite: Suite,
    key: TlsRecordSealingKey,
    iv: [u8; NONCE_LEN],
    seq: u64,
    secret: Secret,
    generation: u32,
}

impl Sealer {
    fn new(suite: Suite, secret: Secret, generation: u32) -> io::Result<Self> {
        let (key, iv) = traffic_keys(suite, &secret.0)?;
        let key = TlsRecordSealingKey::new(suite.aead, TlsProtocolId::TLS13, &key)
            .map_err(|_| bad("cannot make the sealing key"))?;
        Ok(Self {
            suite,
            key,
            iv,
            seq: 0,
            secret,
            generation,
        })
    }

    /// Seals one record of content type `ctype` holding `data` (≤ 16 KiB) onto `out`.
    fn seal(&mut self, out: &mut Vec<u8>, ctype: u8, data: &[u8]) -> io::Result<()> {
        debug_assert!(data.len() <= RECORD);
        let len = data.len() + 1 + TAG;
        let hdr = header(len);
        let nonce =
            nonce(&self.iv, &mut self.seq).ok_or_else(|| bad("sequence numbers used up"))?;
        let start = out.len();
        out.extend_from_slice(&hdr);
        out.resize(start + HEADER + len, 0);
        let (ct, extra) = out[start + HEADER..].split_at_mut(data.len());
        if self
            .key
            .seal_out_of_place_scatter(nonce, Aad::from(hdr), data, ct, &[ctype], extra)
            .is_err()
        {
            out.truncate(start);
            return Err(bad("sealing failed"));
        }
        Ok(())
    }

    /// Seals `data` as application data records of up to 16 KiB each.
    fn seal_data(&mut self, out: &mut Vec<u8>, data: &[u8]) -> io::Result<()> {
        for chunk in data.chunks(RECORD) {
            self.seal(out, APPLICATION_DATA, chunk)?;
        }
        Ok(())
    }

    /// Sends a KeyUpdate (under the current key) and moves to the next key (RFC 8446 §4.6.3).
    fn key_update(&mut self, out: &mut Vec<u8>, request_peer: bool) -> io::Result<()> {
        self.seal(
            out,
            HANDSHAKE,
            &[KEY_UPDATE, 0, 0, 1, u8::from(request_peer)],
        )?;
        let secret = next_secret(self.suite, &self.secret)?;
        *self = Self::new(self.suite, secret, self.generation + 1)?;
        Ok(())
    }
}

/// The receiving half.
struct Opener {
    suite: Suite,
    key: LessSafeKey,
    iv: [u8; NONCE_LEN],
    seq: u64,
    secret: Secret,
    generation: u32,
}

impl Opener {
    fn new(suite: Suite, secret: Secret, generation: u32) -> io::Result<Self> {
        let (key, iv) = traffic_keys(suite, &secret.0)?;
        let key =
            UnboundKey::new(suite.aead, &key).map_err(|_| bad("cannot make the opening key"))?;
        Ok(Self {
            suite,
            key: LessSafeKey::new(key),
            iv,
            seq: 0,
            secret,
            generation,
        })
    }

    fn next_nonce(&mut self) -> io::Result<Nonce> {
        nonce(&self.iv, &mut self.seq).ok_or_else(|| bad("sequence numbers used up"))
    }

    fn update(&mut self) -> io::Result<()> {
        let secret = next_secret(self.suite, &self.secret)?;
        *self = Self::new(self.suite, secret, self.generation + 1)?;
        Ok(())
    }
}

/// The inner plaintext's content type and the content's length: the last non-zero byte,
/// after the zero padding (RFC 8446 §5.4).
fn inner_type(plain: &[u8]) -> io::Result<(u8, usize)> {
    match plain.iter().rposition(|&b| b != 0) {
        Some(i) => Ok((plain[i], i)),
        None => Err(bad("a record without a content type")),
    }
}

/// Both directions of an established connection's records.
pub(crate) struct Records {
    tx: Sealer,
    rx: Opener,
    client: bool,
    /// Received bytes: `rbuf[rstart..rend]` not yet opened.
    rbuf: Vec<u8>,
    rstart: usize,
    rend: usize,
    /// Plaintext opened in place in `rbuf` that the caller's buffer had no room for.
    plain: (usize, usize),
    /// An incomplete post-handshake message.
    hs: Vec<u8>,
    /// close_notify received: reads end.
    closed: bool,
    /// A read failed: every later read fails too (the sequence is lost).
    failed: bool,
    /// A read error met after plaintext was delivered: the next read's answer.
    read_err: Option<io::Error>,
}

impl fmt::Debug for Records {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Records")
            .field("tx_generation", &self.tx.generation)
            .field("rx_generation", &self.rx.generation)
            .finish_non_exhaustive()
    }
}

impl Records {
    /// The records of the connection `ssl` has just completed the handshake of, with the
    /// secrets its key log kept. Fails if OpenSSL holds received bytes it has not handed
    /// over (it reads record by record during the handshake, so it holds none) or if the
    /// secrets or the suite are missing.
    pub(crate) fn after_handshake(
        ssl: &SslRef,
        log: &KeyLog,
        read_buffer: usize,
    ) -> io::Result<Self> {
        if ssl.pending() != 0 || crate::ffi::has_pending(ssl) {
            return Err(bad(
                "data buffered inside OpenSSL at the end of the handshake",
            ));
        }
        let name = ssl
            .current_cipher()
            .and_then(|c| c.standard_name())
            .unwrap_or("");
        let suite = Suite::of(name).ok_or_else(|| bad("unexpected cipher suite"))?;
        let client = !ssl.is_server();
        let (c, s) = log.take();
        let (Some(c), Some(s)) = (c, s) else {
            return Err(bad("the traffic secrets were not logged"));
        };
        let (tx, rx) = if client { (c, s) } else { (s, c) };
        Ok(Self {
            tx: Sealer::new(suite, tx, 0)?,
            rx: Opener::new(suite, rx, 0)?,
            client,
            rbuf: vec![0; read_buffer.max(HEADER + MAX_CIPHERTEXT)],
            rstart: 0,
            rend: 0,
            plain: (0, 0),
            hs: Vec::new(),
            closed: false,
            failed: false,
            read_err: None,
        })
    }

    /// How many times each direction's key was updated (receive, send).
    pub(crate) fn generations(&self) -> (u32, u32) {
        (self.rx.generation, self.tx.generation)
    }

    /// Seals `data` as application data onto `out`.
    pub(crate) fn seal_data(&mut self, out: &mut Vec<u8>, data: &[u8]) -> io::Result<()> {
        self.tx.seal_data(out, data)
    }

    /// Seals a KeyUpdate onto `out` and switches to the next sending key.
    pub(crate) fn key_update(&mut self, out: &mut Vec<u8>, request_peer: bool) -> io::Result<()> {
        self.tx.key_update(out, request_peer)
    }

    /// Seals close_notify onto `out` (RFC 8446 §6.1).
    pub(crate) fn close_notify(&mut self, out: &mut Vec<u8>) -> io::Result<()> {
        self.tx.seal(out, ALERT, &[1, 0])
    }

    /// Opens records from `io` into `buf` until it is full or no whole record is left to read;
    /// records this side must answer (a KeyUpdate) are sealed onto `out`.
    pub(crate) fn poll_read<R: AsyncRead + Unpin>(
        &mut self,
        io: &mut R,
        out: &mut Vec<u8>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        if let Some(e) = self.read_err.take() {
            return Poll::Ready(Err(e));
        }
        if self.failed {
            return Poll::Ready(Err(bad("the connection failed earlier")));
        }
        let start = buf.filled().len();
        match self.read_inner(io, out, cx, buf) {
            Poll::Ready(Err(e)) => {
                self.failed = true;
                if buf.filled().len() == start {
                    Poll::Ready(Err(e))
                } else {
                    self.read_err = Some(e);
                    Poll::Ready(Ok(()))
                }
            }
            p => p,
        }
    }

    fn read_inner<R: AsyncRead + Unpin>(
        &mut self,
        io: &mut R,
        out: &mut Vec<u8>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let start = buf.filled().len();
        loop {
            if self.plain.0 < self.plain.1 {
                let n = (self.plain.1 - self.plain.0).min(buf.remaining());
                buf.put_slice(&self.rbuf[self.plain.0..self.plain.0 + n]);
                self.plain.0 += n;
            }
            if buf.remaining() == 0 || self.closed {
                return Poll::Ready(Ok(()));
            }
            if self.next_record(out, buf)? {
                continue;
            }
            // No whole record left: read more, making room for the rest of a partial one.
            if self.rstart > 0 && self.rbuf.len() - self.rend < HEADER + MAX_CIPHERTEXT {
                self.rbuf.copy_within(self.rstart..self.rend, 0);
                self.rend -= self.rstart;
                self.rstart = 0;
            }
            let mut rb = ReadBuf::new(&mut self.rbuf[self.rend..]);
            match Pin::new(&mut *io).poll_read(cx, &mut rb) {
                Poll::Pending if buf.filled().len() == start => return Poll::Pending,
                Poll::Pending => return Poll::Ready(Ok(())),
                Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
                Poll::Ready(Ok(())) => {
                    let n = rb.filled().len();
                    if n == 0 {
                        if buf.filled().len() > start {
                            return Poll::Ready(Ok(()));
                        }
                        let what = if self.rend > self.rstart {
                            "TLS: the connection ended inside a record"
                        } else {
                            "TLS: the connection ended without close_notify"
                        };
                        return Poll::Ready(Err(io::Error::new(
                            io::ErrorKind::UnexpectedEof,
                            what,
                        )));
                    }
                    self.rend += n;
                }
            }
        }
    }

    /// Opens the next whole record in `rbuf`, if there is one: application data goes to
    /// `buf` (or stays in `rbuf` when `buf` has no room for the whole record), the rest is
    /// handled here. `Ok(false)`: no whole record yet.
    fn next_record(&mut self, out: &mut Vec<u8>, buf: &mut ReadBuf<'_>) -> io::Result<bool> {
        let avail = &self.rbuf[self.rstart..self.rend];
        if avail.len() < HEADER {
            return Ok(false);
        }
        let hdr = [avail[0], avail[1], avail[2], avail[3], avail[4]];
        // After the handshake every record is protected and says application_data outside
        // (RFC 8446 §5.2); legacy_record_version is ignored (§5.1).
        if hdr[0] != APPLICATION_DATA {
            return Err(bad("an unprotected record after the handshake"));
        }
        let len = usize::from(u16::from_be_bytes([hdr[3], hdr[4]]));
        if len > MAX_CIPHERTEXT {
            return Err(bad("record overflow"));
        }
        if len < TAG + 1 {
            return Err(bad("a record too short to hold a tag and a content type"));
        }
        if avail.len() < HEADER + len {
            return Ok(false);
        }
        let body = self.rstart + HEADER..self.rstart + HEADER + len;
        self.rstart = body.end;
        let nonce = self.rx.next_nonce()?;
        let ct_len = len - TAG;
        let (ctype, content) = if buf.remaining() >= ct_len {
            // Straight into the caller's buffer: opened (verified) before it counts as read.
            let dst = &mut buf.initialize_unfilled_to(ct_len)[..ct_len];
            let (ct, tag) = self.rbuf[body].split_at(ct_len);
            if self
                .rx
                .key
                .open_separate_gather(nonce, Aad::from(hdr), ct, tag, dst)
                .is_err()
            {
                dst.zeroize();
                return Err(bad("a record did not open (bad_record_mac)"));
            }
            let (ctype, n) = inner_type(dst)?;
            if ctype == APPLICATION_DATA {
                self.data_allowed()?;
                buf.advance(n);
                return Ok(true);
            }
            (ctype, dst[..n].to_vec())
        } else {
            let at = body.start;
            let plain = self
                .rx
                .key
                .open_in_place(nonce, Aad::from(hdr), &mut self.rbuf[body])
                .map_err(|_| bad("a record did not open (bad_record_mac)"))?;
            let (ctype, n) = inner_type(plain)?;
            if ctype == APPLICATION_DATA {
                self.data_allowed()?;
                self.plain = (at, at + n);
                return Ok(true);
            }
            (ctype, plain[..n].to_vec())
        };
        self.control(ctype, &content, out)?;
        Ok(true)
    }

    /// Handshake messages must not be interleaved with other record types (RFC 8446 §5.1).
    fn data_allowed(&self) -> io::Result<()> {
        if self.hs.is_empty() {
            Ok(())
        } else {
            Err(bad("application data inside a handshake message"))
        }
    }

    /// A record that is not application data: an alert or post-handshake messages.
    fn control(&mut self, ctype: u8, content: &[u8], out: &mut Vec<u8>) -> io::Result<()> {
        match ctype {
            ALERT => {
                if content.len() != 2 || !self.hs.is_empty() {
                    return Err(bad("a malformed alert"));
                }
                if content[1] == 0 {
                    self.closed = true;
                    return Ok(());
                }
                Err(io::Error::new(
                    io::ErrorKind::ConnectionAborted,
                    format!("TLS: the peer sent alert {}", content[1]),
                ))
            }
            HANDSHAKE => {
                if content.is_empty() {
                    return Err(bad("an empty handshake record"));
                }
                if self.hs.len() + content.len() > MAX_HANDSHAKE {
                    return Err(bad("a post-handshake message too long"));
                }
                self.hs.extend_from_slice(content);
                self.handshake_messages(out)
            }
            _ => Err(bad("an unexpected record type")),
        }
    }

    fn handshake_messages(&mut self, out: &mut Vec<u8>) -> io::Result<()> {
        while self.hs.len() >= 4 {
            let mlen = u32::from_be_bytes([0, self.hs[1], self.hs[2], self.hs[3]]) as usize;
            if self.hs.len() < 4 + mlen {
                return Ok(());
            }
            let kind = self.hs[0];
            let whole = 4 + mlen;
            match kind {
                KEY_UPDATE => {
                    // A key change must end its record (RFC 8446 §5.1).
                    if mlen != 1 || self.hs.len() != whole {
                        return Err(bad("a malformed KeyUpdate"));
                    }
                    let requested = match self.hs[4] {
                        0 => false,
                        1 => true,
                        _ => return Err(bad("a malformed KeyUpdate")),
                    };
                    self.rx.update()?;
                    if requested {
                        // Answered before the next application data: it is queued now.
                        self.tx.key_update(out, false)?;
                    }
                }
                // A client may ignore the tickets a server sends (we never resume).
                NEW_SESSION_TICKET if self.client => {}
                _ => return Err(bad("an unexpected post-handshake message")),
            }
            self.hs.drain(..whole);
        }
        Ok(())
    }
}
