//! NVMe/TCP PDUs (NVMe/TCP Transport Specification 1.0 §3.6.2).
//!
//! Every PDU starts with the 8-byte common header (CH, §3.6.2.1): PDU-Type, FLAGS, HLEN (the
//! header length, CH included), PDO (the offset of the data from the start of the PDU, 0 when
//! there is none) and PLEN (the whole PDU on the wire, little-endian). After the HLEN-byte header
//! comes a 4-byte header digest (HDGST) when FLAGS.HDGSTF is set, padding up to PDO (aligned to
//! the receiver's PDA, `(PDA + 1) * 4` bytes), the data, and a 4-byte data digest (DDGST) when
//! FLAGS.DDGSTF is set. All multi-byte fields are little-endian.
//!
//! [`Codec::frame`] looks only at the common header (so a huge PLEN is refused before anything is
//! buffered); [`Codec::decode`] then checks the digests and every field.

use bytes::{BufMut, Bytes, BytesMut};

pub use crate::codes::PduType;
use crate::digest::{crc32c, to_wire};
use crate::entry::{Cqe, Sqe, CQE_LEN, SQE_LEN};
use crate::error::{Fes, WireError};
use crate::{CH_LEN, DIGEST_LEN};

/// FLAGS bit 0, HDGSTF: the PDU carries a header digest (§3.6.2.1).
pub const FLAG_HDGSTF: u8 = 0x01;
/// FLAGS bit 1, DDGSTF: the PDU carries a data digest.
pub const FLAG_DDGSTF: u8 = 0x02;
/// FLAGS bit 2, LAST_PDU: the last H2CData/C2HData PDU of a transfer (§3.6.2.8, §3.6.2.9).
pub const FLAG_LAST_PDU: u8 = 0x04;
/// FLAGS bit 3, SUCCESS: C2HData only; the command completed and no CapsuleResp follows
/// (§3.6.2.9). Requires LAST_PDU.
pub const FLAG_SUCCESS: u8 = 0x08;

/// ICReq/ICResp PFV: the only version NVMe/TCP 1.0 defines.
pub const PFV_1_0: u16 = 0;
/// Largest HPDA/CPDA: values above 31 are reserved (§3.6.2.2, §3.6.2.3).
pub const MAX_PDA: u8 = 31;
/// Smallest MAXH2CDATA a controller may announce (§3.6.2.3): 4 KiB, a multiple of four.
pub const MIN_MAXH2CDATA: u32 = 4096;
/// A termination request carries at most this many bytes of the PDU header in error, so its
/// PLEN is at most 24 + 128 = 152 (§3.6.2.4).
pub const MAX_TERM_DATA: usize = 128;

// What the codec knows of each PDU type; the type is `crate::codes::PduType`, below the errors
// that name it.
impl PduType {
    /// The type for a wire value; `None` for reserved types (08h, 0Ah and above).
    #[must_use]
    pub fn from_u8(v: u8) -> Option<Self> {
        Some(match v {
            0x00 => Self::IcReq,
            0x01 => Self::IcResp,
            0x02 => Self::H2cTermReq,
            0x03 => Self::C2hTermReq,
            0x04 => Self::CapsuleCmd,
            0x05 => Self::CapsuleResp,
            0x06 => Self::H2cData,
            0x07 => Self::C2hData,
            0x09 => Self::R2t,
            _ => return None,
        })
    }

    /// HLEN, fixed per type (§3.6.2.2-§3.6.2.10).
    #[must_use]
    pub const fn hlen(self) -> usize {
        match self {
            Self::IcReq | Self::IcResp => 128,
            Self::CapsuleCmd => CH_LEN + SQE_LEN,
            Self::CapsuleResp => CH_LEN + CQE_LEN,
            Self::H2cTermReq | Self::C2hTermReq | Self::H2cData | Self::C2hData | Self::R2t => 24,
        }
    }

    /// The FLAGS bits this type may carry; every other bit is reserved.
    #[must_use]
    pub const fn allowed_flags(self) -> u8 {
        match self {
            Self::IcReq | Self::IcResp | Self::H2cTermReq | Self::C2hTermReq => 0,
            Self::CapsuleResp | Self::R2t => FLAG_HDGSTF,
            Self::CapsuleCmd => FLAG_HDGSTF | FLAG_DDGSTF,
            Self::H2cData => FLAG_HDGSTF | FLAG_DDGSTF | FLAG_LAST_PDU,
            Self::C2hData => FLAG_HDGSTF | FLAG_DDGSTF | FLAG_LAST_PDU | FLAG_SUCCESS,
        }
    }

    /// The largest PLEN this type can have: fixed for the PDUs without data (header and
    /// digest; a termination request's 152 bytes), the receiver's `max_pdu_len` for those
    /// carrying data.
    #[must_use]
    pub const fn max_plen(self, max_pdu_len: u32) -> u32 {
        match self {
            Self::IcReq | Self::IcResp => 128,
            Self::H2cTermReq | Self::C2hTermReq => 24 + MAX_TERM_DATA as u32,
            Self::CapsuleResp | Self::R2t => self.hlen() as u32 + DIGEST_LEN as u32,
            Self::CapsuleCmd | Self::H2cData | Self::C2hData => max_pdu_len,
        }
    }

    /// Whether the type carries a header digest once header digests are enabled: all but the
    /// connection set-up and termination PDUs, which are exchanged before (or regardless of)
    /// the negotiation (§3.6.1).
    #[must_use]
    pub const fn digested(self) -> bool {
        !matches!(
            self,
            Self::IcReq | Self::IcResp | Self::H2cTermReq | Self::C2hTermReq
        )
    }
}

/// The common header, CH (§3.6.2.1), as read off the wire.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CommonHeader {
    pub pdu_type: u8,
    pub flags: u8,
    pub hlen: u8,
    pub pdo: u8,
    pub plen: u32,
}

impl CommonHeader {
    /// Reads the first eight bytes of `buf` (which must hold at least [`CH_LEN`]).
    #[must_use]
    pub fn parse(buf: &[u8; CH_LEN]) -> Self {
        Self {
            pdu_type: buf[0],
            flags: buf[1],
            hlen: buf[2],
            pdo: buf[3],
            plen: u32::from_le_bytes([buf[4], buf[5], buf[6], buf[7]]),
        }
    }
}

/// ICReq, the host's first PDU on a connection (§3.6.2.2).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IcReq {
    /// PDU Format Version, [`PFV_1_0`].
    pub pfv: u16,
    /// Host PDU Data Alignment: the controller aligns C2H data to `(hpda + 1) * 4` bytes.
    pub hpda: u8,
    /// DGST bit 0: the host asks for header digests.
    pub hdgst: bool,
    /// DGST bit 1: the host asks for data digests.
    pub ddgst: bool,
    /// MAXR2T: outstanding R2Ts per command the host supports, 0's based.
    pub maxr2t: u32,
}

/// ICResp, the controller's answer (§3.6.2.3).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IcResp {
    pub pfv: u16,
    /// Controller PDU Data Alignment: the host aligns H2C data to `(cpda + 1) * 4` bytes.
    pub cpda: u8,
    /// DGST bit 0: header digests are enabled on the connection.
    pub hdgst: bool,
    /// DGST bit 1: data digests are enabled.
    pub ddgst: bool,
    /// MAXH2CDATA: the most data one H2CData PDU may carry, ≥ 4096 and a multiple of 4.
    pub maxh2cdata: u32,
}

/// H2CTermReq / C2HTermReq (§3.6.2.4, §3.6.2.5): a fatal error, the connection ends.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TermReq {
    pub fes: Fes,
    /// Fatal Error Information (the offending field's offset for FES 01h and 06h).
    pub fei: u32,
    /// The header of the PDU in error, at most [`MAX_TERM_DATA`] bytes.
    pub data: Bytes,
}

impl TermReq {
    /// The termination request for a fatal `error` found in the PDU whose header is `header`
    /// (truncated to [`MAX_TERM_DATA`] bytes); `None` when the error is not fatal.
    #[must_use]
    pub fn for_error(error: &WireError, header: &[u8]) -> Option<Self> {
        Some(Self {
            fes: error.fes()?,
            fei: error.fei(),
            data: Bytes::copy_from_slice(&header[..header.len().min(MAX_TERM_DATA)]),
        })
    }
}

/// CapsuleCmd (§3.6.2.6): a submission queue entry and optional in-capsule data.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CapsuleCmd {
    pub sqe: Sqe,
    /// In-capsule data (empty when none; the SGL then points at the transport).
    pub data: Bytes,
}

/// CapsuleResp (§3.6.2.7): a completion queue entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CapsuleResp {
    pub cqe: Cqe,
}

/// H2CData (§3.6.2.8): write data the controller asked for with an R2T.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct H2cData {
    /// Command Capsule CID.
    pub cccid: u16,
    /// Transfer tag from the R2T.
    pub ttag: u16,
    /// DATAO: offset of `data` in the command's data.
    pub datao: u32,
    /// FLAGS.LAST_PDU: the last PDU for this R2T.
    pub last: bool,
    /// DATAL bytes, never empty.
    pub data: Bytes,
}

/// C2HData (§3.6.2.9): read data.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct C2hData {
    pub cccid: u16,
    pub datao: u32,
    /// FLAGS.LAST_PDU: the last data PDU of the command.
    pub last: bool,
    /// FLAGS.SUCCESS: the command succeeded and no CapsuleResp follows (requires `last`).
    pub success: bool,
    /// DATAL bytes, never empty.
    pub data: Bytes,
}

/// R2T (§3.6.2.10): the controller is ready for `r2tl` bytes of write data at `r2to`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct R2t {
    pub cccid: u16,
    pub ttag: u16,
    pub r2to: u32,
    pub r2tl: u32,
}

/// One decoded PDU.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Pdu {
    IcReq(IcReq),
    IcResp(IcResp),
    H2cTermReq(TermReq),
    C2hTermReq(TermReq),
    CapsuleCmd(CapsuleCmd),
    CapsuleResp(CapsuleResp),
    H2cData(H2cData),
    C2hData(C2hData),
    R2t(R2t),
}

impl Pdu {
    /// The PDU's type.
    #[must_use]
    pub fn pdu_type(&self) -> PduType {
        match self {
            Self::IcReq(_) => PduType::IcReq,
            Self::IcResp(_) => PduType::IcResp,
            Self::H2cTermReq(_) => PduType::H2cTermReq,
            Self::C2hTermReq(_) => PduType::C2hTermReq,
            Self::CapsuleCmd(_) => PduType::CapsuleCmd,
            Self::CapsuleResp(_) => PduType::CapsuleResp,
            Self::H2cData(_) => PduType::H2cData,
            Self::C2hData(_) => PduType::C2hData,
            Self::R2t(_) => PduType::R2t,
        }
    }

    /// The data the PDU carries after its header (empty for header-only PDUs).
    #[must_use]
    pub fn data(&self) -> &[u8] {
        match self {
            Self::CapsuleCmd(c) => &c.data,
            Self::H2cData(d) => &d.data,
            Self::C2hData(d) => &d.data,
            Self::H2cTermReq(t) | Self::C2hTermReq(t) => &t.data,
            _ => &[],
        }
    }
}

/// Per-connection codec settings. Before ICReq/ICResp both digests are off and both PDAs 0;
/// afterwards each side sets what ICResp enabled (§3.6.1, §3.6.2.2-§3.6.2.3).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Codec {
    /// Header digests enabled: every PDU but ICReq/ICResp/TermReq must carry one.
    pub header_digest: bool,
    /// Data digests enabled: every PDU with data must carry one.
    pub data_digest: bool,
    /// The PDA *we* announced (HPDA for a host, CPDA for a controller): received data must start
    /// at the smallest PDO ≥ header (+ digest) that is a multiple of `(rx_pda + 1) * 4`.
    pub rx_pda: u8,
    /// The PDA the peer announced: how we align the data we send.
    pub tx_pda: u8,
    /// Largest PLEN accepted for the PDUs that carry data (CapsuleCmd, H2CData, C2HData),
    /// digests and padding included (for a controller: the in-capsule data size or MAXH2CDATA
    /// plus headers, whichever is larger). The other PDUs have fixed limits
    /// ([`PduType::max_plen`]).
    pub max_pdu_len: u32,
}

fn le16(b: &[u8], at: usize) -> u16 {
    u16::from_le_bytes([b[at], b[at + 1]])
}

fn le32(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

fn all_zero(b: &[u8]) -> bool {
    b.iter().all(|&x| x == 0)
}

/// The PDO for data after a header of `hlen` bytes (+ digest), aligned to `(pda + 1) * 4`.
fn data_offset(hlen: usize, hdgst: bool, pda: u8) -> usize {
    let start = hlen + if hdgst { DIGEST_LEN } else { 0 };
    let align = (usize::from(pda.min(MAX_PDA)) + 1) * 4;
    start.div_ceil(align) * align
}

impl Codec {
    /// A codec for the start of a connection (no digests, PDA 0) accepting PDUs up to
    /// `max_pdu_len` bytes.
    #[must_use]
    pub fn new(max_pdu_len: u32) -> Self {
        Self {
            header_digest: false,
            data_digest: false,
            rx_pda: 0,
            tx_pda: 0,
            max_pdu_len,
        }
    }

    /// Looks at the common header at the front of `buf`: `Ok(None)` while fewer than
    /// [`CH_LEN`] bytes are there, else the whole PDU's length (PLEN), which may be more than
    /// `buf` holds yet ([`Codec::needed`] says how many more). Checks the type, HLEN and the
    /// PLEN bounds so that a hostile PLEN is refused before anything is buffered.
    ///
    /// # Errors
    /// Invalid header field (type, HLEN, PLEN below the header) or [`WireError::PduTooLong`].
    pub fn frame(&self, buf: &[u8]) -> Result<Option<usize>, WireError> {
        let Some(ch) = buf.first_chunk::<CH_LEN>() else {
            return Ok(None);
        };
        let ch = CommonHeader::parse(ch);
        let bad = |offset, reason| WireError::InvalidHeaderField {
            pdu_type: ch.pdu_type,
            offset,
            reason,
        };
        let Some(ty) = PduType::from_u8(ch.pdu_type) else {
            return Err(bad(0, "reserved PDU type"));
        };
        if usize::from(ch.hlen) != ty.hlen() {
            return Err(bad(2, "HLEN does not match the PDU type"));
        }
        let max = ty.max_plen(self.max_pdu_len);
        if ch.plen > max {
            return Err(WireError::PduTooLong {
                pdu_type: ch.pdu_type,
                plen: u64::from(ch.plen),
                max,
            });
        }
        let plen = usize::try_from(ch.plen).map_err(|_| bad(4, "PLEN too large"))?;
        if plen < ty.hlen() {
            return Err(bad(4, "PLEN shorter than the header"));
        }
        if usize::from(ch.pdo) > plen {
            return Err(bad(3, "PDO beyond the PDU"));
        }
        Ok(Some(plen))
    }

    /// How many more bytes `buf` needs before it holds a whole PDU (0 when it does).
    ///
    /// # Errors
    /// As [`Codec::frame`].
    pub fn needed(&self, buf: &[u8]) -> Result<usize, WireError> {
        Ok(match self.frame(buf)? {
            None => CH_LEN - buf.len(),
            Some(plen) => plen.saturating_sub(buf.len()),
        })
    }

    /// Frames and decodes the PDU at the front of `buf`, taking its bytes off when it is
    /// whole. `Ok(None)` (nothing consumed) when more bytes are needed.
    ///
    /// # Errors
    /// A [`WireError`]; the PDU's bytes are consumed unless the error comes from the common
    /// header alone ([`Codec::frame`]), where the stream is not trusted any more anyway.
    pub fn decode_from(&self, buf: &mut BytesMut) -> Result<Option<Pdu>, WireError> {
        match self.frame(buf)? {
            Some(plen) if plen <= buf.len() => self.decode(buf.split_to(plen).freeze()).map(Some),
            _ => Ok(None),
        }
    }

    /// Decodes one whole PDU, exactly PLEN bytes.
    ///
    /// # Errors
    /// Any validation failure of §3.6.2: fatal ones name their FES ([`WireError::fes`]); a
    /// data digest mismatch is not fatal.
    pub fn decode(&self, pdu: Bytes) -> Result<Pdu, WireError> {
        let plen = self.frame(&pdu)?.ok_or(WireError::Length {
            what: "PDU common header",
            expected: CH_LEN,
            got: pdu.len(),
        })?;
        if plen != pdu.len() {
            return Err(WireError::Length {
                what: "PDU",
                expected: plen,
                got: pdu.len(),
            });
        }
        self.decode_parts(&pdu, plen, |r| pdu.slice(r))
    }

    /// Decodes a data PDU received in two places: `head`, its bytes up to PDO (header, header
    /// digest, padding), and `data`, all of its data, received into a buffer of its own (so a
    /// long write's data can reach a store as the whole of its allocation). Only an H2CData
    /// or a command capsule with data, without a data digest (the digest would follow the
    /// data); every check [`Codec::decode`] makes is made.
    ///
    /// # Errors
    /// As [`Codec::decode`]; [`WireError::Length`] when `head` and `data` are not such a PDU's
    /// two parts (another type, a data digest, `head` not ending at PDO, PLEN not their sum).
    pub fn decode_placed(&self, head: &[u8], data: Bytes) -> Result<Pdu, WireError> {
        let plen = self.frame(head)?.ok_or(WireError::Length {
            what: "placed PDU common header",
            expected: CH_LEN,
            got: head.len(),
        })?;
        let parts = |expected| WireError::Length {
            what: "placed PDU head (up to PDO)",
            expected,
            got: head.len(),
        };
        let ty = PduType::from_u8(head[0]);
        let hd = if head[1] & FLAG_HDGSTF != 0 {
            DIGEST_LEN
        } else {
            0
        };
        let pdo = usize::from(head[3]);
        let Some(hlen) = ty
            .filter(|t| matches!(t, PduType::H2cData | PduType::CapsuleCmd))
            .map(PduType::hlen)
        else {
            return Err(parts(0));
        };
        // Every index `decode_parts` makes into `head` lies below PDO then, and no data
        // digest is looked for past it.
        if head.len() != pdo || pdo < hlen + hd || head[1] & FLAG_DDGSTF != 0 || self.data_digest {
            return Err(parts(pdo));
        }
        if data.is_empty() || plen != pdo + data.len() {
            return Err(WireError::Length {
                what: "placed PDU data",
                expected: plen.saturating_sub(pdo),
                got: data.len(),
            });
        }
        self.decode_parts(head, plen, |_| data)
    }

    /// [`Codec::decode`]'s checks and decoding of a PDU of `plen` bytes whose bytes up to its
    /// data are `b` (all of it, or its head up to PDO with no data digest); `data` gives the
    /// data's bytes, the range `PDO..PLEN − DDGST`.
    fn decode_parts(
        &self,
        b: &[u8],
        plen: usize,
        data: impl FnOnce(std::ops::Range<usize>) -> Bytes,
    ) -> Result<Pdu, WireError> {
        let ty = PduType::from_u8(b[0]).ok_or(WireError::InvalidHeaderField {
            pdu_type: b[0],
            offset: 0,
            reason: "reserved PDU type",
        })?;
        let bad = |offset, reason| WireError::InvalidHeaderField {
            pdu_type: b[0],
            offset,
            reason,
        };
        let flags = b[1];
        let pdo = usize::from(b[3]);
        let hlen = ty.hlen();

        if flags & !ty.allowed_flags() != 0 {
            return Err(bad(1, "reserved flag set for this PDU type"));
        }
        // Header digest: present exactly when enabled (for the types that carry one), checked
        // before any other field is believed.
        let hdgst = flags & FLAG_HDGSTF != 0;
        if ty.digested() && hdgst != self.header_digest {
            return Err(bad(1, "HDGSTF does not match the negotiated header digest"));
        }
        let hd = if hdgst { DIGEST_LEN } else { 0 };
        if plen < hlen + hd {
            return Err(bad(4, "PLEN shorter than the header and its digest"));
        }
        if hdgst {
            let expected = crc32c(&b[..hlen]);
            let got = le32(b, hlen);
            if expected != got {
                return Err(WireError::HeaderDigest { expected, got });
            }
        }

        // Where the data is, if any.
        let ddgst = flags & FLAG_DDGSTF != 0;
        let dd = if ddgst { DIGEST_LEN } else { 0 };
        let data = match ty {
            PduType::IcReq | PduType::IcResp | PduType::CapsuleResp | PduType::R2t => {
                if pdo != 0 {
                    return Err(bad(3, "PDO must be 0 for a PDU without data"));
                }
                if plen != hlen + hd {
                    return Err(bad(4, "PLEN must equal the header length"));
                }
                Bytes::new()
            }
            PduType::H2cTermReq | PduType::C2hTermReq => {
                if pdo != 0 {
                    return Err(bad(3, "PDO must be 0 for a termination request"));
                }
                if plen - hlen > MAX_TERM_DATA {
                    return Err(bad(4, "termination request longer than 152 bytes"));
                }
                data(hlen..plen)
            }
            PduType::CapsuleCmd | PduType::H2cData | PduType::C2hData => {
                if plen == hlen + hd && ty == PduType::CapsuleCmd {
                    if pdo != 0 {
                        return Err(bad(3, "PDO must be 0 for a capsule without data"));
                    }
                    if ddgst {
                        return Err(bad(1, "DDGSTF set on a capsule without data"));
                    }
                    Bytes::new()
                } else {
                    if ddgst != self.data_digest {
                        return Err(bad(1, "DDGSTF does not match the negotiated data digest"));
                    }
                    if pdo != data_offset(hlen, hdgst, self.rx_pda) {
                        return Err(bad(3, "PDO is not the aligned offset after the header"));
                    }
                    if plen <= pdo + dd {
                        // Data PDUs carry at least one byte; a capsule without data has no PDO.
                        return Err(bad(4, "no data between PDO and PLEN"));
                    }
                    if !all_zero(&b[hlen + hd..pdo]) {
                        return Err(bad(3, "padding before the data is not zero"));
                    }
                    let end = plen - dd;
                    data(pdo..end)
                }
            }
        };
        if ty.digested() && !data.is_empty() && ddgst {
            let expected = crc32c(&data);
            let got = le32(b, plen - DIGEST_LEN);
            if expected != got {
                let cid = match ty {
                    PduType::CapsuleCmd => le16(b, CH_LEN + 2),
                    _ => le16(b, 8),
                };
                return Err(WireError::DataDigest {
                    pdu_type: ty,
                    cid,
                    expected,
                    got,
                });
            }
        }

        Ok(match ty {
            PduType::IcReq | PduType::IcResp => {
                let pfv = le16(b, 8);
                if pfv != PFV_1_0 {
                    return Err(WireError::UnsupportedParameter {
                        offset: 8,
                        reason: "PDU format version other than 1.0",
                    });
                }
                let pda = b[10];
                if pda > MAX_PDA {
                    return Err(WireError::UnsupportedParameter {
                        offset: 10,
                        reason: "PDA above 31",
                    });
                }
                let dgst = b[11];
                if dgst & !0x03 != 0 {
                    return Err(bad(11, "reserved DGST bit set"));
                }
                if !all_zero(&b[16..128]) {
                    return Err(bad(16, "reserved bytes not zero"));
                }
                let v = le32(b, 12);
                if ty == PduType::IcReq {
                    Pdu::IcReq(IcReq {
                        pfv,
                        hpda: pda,
                        hdgst: dgst & 1 != 0,
                        ddgst: dgst & 2 != 0,
                        maxr2t: v,
                    })
                } else {
                    if v < MIN_MAXH2CDATA || v % 4 != 0 {
                        return Err(WireError::UnsupportedParameter {
                            offset: 12,
                            reason: "MAXH2CDATA below 4096 or not a multiple of 4",
                        });
                    }
                    Pdu::IcResp(IcResp {
                        pfv,
                        cpda: pda,
                        hdgst: dgst & 1 != 0,
                        ddgst: dgst & 2 != 0,
                        maxh2cdata: v,
                    })
                }
            }
            PduType::H2cTermReq | PduType::C2hTermReq => {
                let fes = Fes::from_u16(le16(b, 8)).ok_or(bad(8, "reserved FES"))?;
                if !all_zero(&b[14..24]) {
                    return Err(bad(14, "reserved bytes not zero"));
                }
                let t = TermReq {
                    fes,
                    fei: le32(b, 10),
                    data,
                };
                if ty == PduType::H2cTermReq {
                    Pdu::H2cTermReq(t)
                } else {
                    Pdu::C2hTermReq(t)
                }
            }
            PduType::CapsuleCmd => {
                let sqe = b[CH_LEN..CH_LEN + SQE_LEN]
                    .first_chunk::<SQE_LEN>()
                    .map(Sqe::from_bytes)
                    .ok_or(bad(8, "short SQE"))?;
                Pdu::CapsuleCmd(CapsuleCmd { sqe, data })
            }
            PduType::CapsuleResp => {
                let cqe = b[CH_LEN..CH_LEN + CQE_LEN]
                    .first_chunk::<CQE_LEN>()
                    .map(Cqe::from_bytes)
                    .ok_or(bad(8, "short CQE"))?;
                Pdu::CapsuleResp(CapsuleResp { cqe })
            }
            PduType::H2cData | PduType::C2hData | PduType::R2t => {
                let cccid = le16(b, 8);
                let tag = le16(b, 10);
                let off = le32(b, 12);
                let len = le32(b, 16);
                if !all_zero(&b[20..24]) {
                    return Err(bad(20, "reserved bytes not zero"));
                }
                if ty == PduType::R2t {
                    if len == 0 {
                        return Err(bad(16, "R2TL is zero"));
                    }
                    Pdu::R2t(R2t {
                        cccid,
                        ttag: tag,
                        r2to: off,
                        r2tl: len,
                    })
                } else {
                    if len == 0 {
                        return Err(bad(16, "DATAL is zero"));
                    }
                    if usize::try_from(len).ok() != Some(data.len()) {
                        return Err(bad(16, "DATAL does not match PLEN"));
                    }
                    if ty == PduType::H2cData {
                        Pdu::H2cData(H2cData {
                            cccid,
                            ttag: tag,
                            datao: off,
                            last: flags & FLAG_LAST_PDU != 0,
                            data,
                        })
                    } else {
                        if tag != 0 {
                            return Err(bad(10, "reserved bytes not zero"));
                        }
                        let last = flags & FLAG_LAST_PDU != 0;
                        let success = flags & FLAG_SUCCESS != 0;
                        if success && !last {
                            return Err(bad(1, "SUCCESS without LAST_PDU"));
                        }
                        Pdu::C2hData(C2hData {
                            cccid,
                            datao: off,
                            last,
                            success,
                            data,
                        })
                    }
                }
            }
        })
    }

    /// Appends `pdu` to `dst` with this codec's digests and the peer's alignment.
    ///
    /// # Errors
    /// [`WireError::Length`] when the data does not fit the PDU (PLEN is 32 bits; a termination
    /// request carries at most 128 bytes) or H2CData/C2HData has none.
    pub fn encode(&self, pdu: &Pdu, dst: &mut BytesMut) -> Result<(), WireError> {
        // Header, padding and data digest: at most 128 + 4 + 128 + 4 bytes around the data.
        dst.reserve(pdu.data().len() + 264);
        let digest = self.encode_header(pdu, dst)?;
        dst.put_slice(pdu.data());
        if let Some(d) = digest {
            dst.put_slice(&d);
        }
        Ok(())
    }

    /// Appends everything of `pdu` that comes before its data to `dst`: the header, its
    /// digest and the alignment padding up to PDO. The PDU is then whole once its data
    /// ([`Pdu::data`]) and the returned data digest (when data digests are on and there is
    /// data) follow, so a sender can hand the payload to a vectored write as it is instead
    /// of copying it behind the header.
    ///
    /// # Errors
    /// As [`Codec::encode`].
    pub fn encode_header(
        &self,
        pdu: &Pdu,
        dst: &mut BytesMut,
    ) -> Result<Option<[u8; DIGEST_LEN]>, WireError> {
        let ty = pdu.pdu_type();
        let hlen = ty.hlen();
        let data = pdu.data();
        let hdgst = ty.digested() && self.header_digest;
        let ddgst = ty.digested() && self.data_digest && !data.is_empty();
        let hd = if hdgst { DIGEST_LEN } else { 0 };
        let dd = if ddgst { DIGEST_LEN } else { 0 };
        if data.is_empty() && matches!(ty, PduType::H2cData | PduType::C2hData) {
            return Err(WireError::Length {
                what: "H2CData/C2HData data (DATAL > 0)",
                expected: 1,
                got: 0,
            });
        }
        let pdo = match ty {
            PduType::CapsuleCmd | PduType::H2cData | PduType::C2hData if !data.is_empty() => {
                data_offset(hlen, hdgst, self.tx_pda)
            }
            PduType::H2cTermReq | PduType::C2hTermReq => {
                if data.len() > MAX_TERM_DATA {
                    return Err(WireError::Length {
                        what: "termination request data",
                        expected: MAX_TERM_DATA,
                        got: data.len(),
                    });
                }
                hlen
            }
            _ => hlen + hd,
        };
        let total = pdo + data.len() + dd;
        let plen = u32::try_from(total).map_err(|_| WireError::Length {
            what: "PDU",
            expected: u32::MAX as usize,
            got: total,
        })?;
        let mut flags = if hdgst { FLAG_HDGSTF } else { 0 } | if ddgst { FLAG_DDGSTF } else { 0 };
        let mut h = [0u8; 128];
        match pdu {
            Pdu::IcReq(r) => {
                h[8..10].copy_from_slice(&r.pfv.to_le_bytes());
                h[10] = r.hpda;
                h[11] = u8::from(r.hdgst) | u8::from(r.ddgst) << 1;
                h[12..16].copy_from_slice(&r.maxr2t.to_le_bytes());
            }
            Pdu::IcResp(r) => {
                h[8..10].copy_from_slice(&r.pfv.to_le_bytes());
                h[10] = r.cpda;
                h[11] = u8::from(r.hdgst) | u8::from(r.ddgst) << 1;
                h[12..16].copy_from_slice(&r.maxh2cdata.to_le_bytes());
            }
            Pdu::H2cTermReq(t) | Pdu::C2hTermReq(t) => {
                h[8..10].copy_from_slice(&(t.fes as u16).to_le_bytes());
                h[10..14].copy_from_slice(&t.fei.to_le_bytes());
            }
            Pdu::CapsuleCmd(c) => h[CH_LEN..CH_LEN + SQE_LEN].copy_from_slice(&c.sqe.to_bytes()),
            Pdu::CapsuleResp(r) => h[CH_LEN..CH_LEN + CQE_LEN].copy_from_slice(&r.cqe.to_bytes()),
            Pdu::H2cData(d) => {
                h[8..10].copy_from_slice(&d.cccid.to_le_bytes());
                h[10..12].copy_from_slice(&d.ttag.to_le_bytes());
                h[12..16].copy_from_slice(&d.datao.to_le_bytes());
                h[16..20].copy_from_slice(&(d.data.len() as u32).to_le_bytes());
                if d.last {
                    flags |= FLAG_LAST_PDU;
                }
            }
            Pdu::C2hData(d) => {
                h[8..10].copy_from_slice(&d.cccid.to_le_bytes());
                h[12..16].copy_from_slice(&d.datao.to_le_bytes());
                h[16..20].copy_from_slice(&(d.data.len() as u32).to_le_bytes());
                if d.last {
                    flags |= FLAG_LAST_PDU;
                }
                if d.success {
                    flags |= FLAG_SUCCESS;
                }
            }
            Pdu::R2t(r) => {
                h[8..10].copy_from_slice(&r.cccid.to_le_bytes());
                h[10..12].copy_from_slice(&r.ttag.to_le_bytes());
                h[12..16].copy_from_slice(&r.r2to.to_le_bytes());
                h[16..20].copy_from_slice(&r.r2tl.to_le_bytes());
            }
        }
        h[0] = ty as u8;
        h[1] = flags;
        h[2] = hlen as u8;
        h[3] = if data.is_empty() || matches!(ty, PduType::H2cTermReq | PduType::C2hTermReq) {
            0
        } else {
            pdo as u8
        };
        h[4..8].copy_from_slice(&plen.to_le_bytes());

        dst.reserve(pdo);
        dst.put_slice(&h[..hlen]);
        if hdgst {
            dst.put_slice(&to_wire(crc32c(&h[..hlen])));
        }
        dst.put_bytes(0, pdo - hlen - hd);
        Ok(ddgst.then(|| to_wire(crc32c(data))))
    }

    /// [`Codec::encode`] into a fresh buffer.
    ///
    /// # Errors
    /// As [`Codec::encode`].
    pub fn to_bytes(&self, pdu: &Pdu) -> Result<Bytes, WireError> {
        let mut out = BytesMut::new();
        self.encode(pdu, &mut out)?;
        Ok(out.freeze())
    }
}
