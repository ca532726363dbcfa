//! Framing PDUs out of a byte stream and writing them back (RFC 7143 §11.2).
//!
//! A PDU on the wire is: the 48-byte BHS, `TotalAHSLength * 4` bytes of Additional Header
//! Segments, a 4-byte header digest if negotiated, the data segment padded to a multiple of four,
//! and a 4-byte data digest if negotiated and the data segment is not empty.

use bytes::{BufMut, Bytes, BytesMut};

use crate::digest::{crc32c, crc32c_append, to_wire};
use crate::{pad4, Header, WireError, BHS_LEN};

/// The largest DataSegmentLength the 24-bit field can express (RFC 7143 §11.2.1.5).
pub const MAX_DATA_SEGMENT_LENGTH: usize = (1 << 24) - 1;

/// One whole PDU: a parsed header, its raw AHS bytes, and its data segment without padding.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Pdu {
    pub header: Header,
    /// Additional Header Segments, already a multiple of 4 bytes (RFC 7143 §11.2.2).
    pub ahs: Bytes,
    pub data: Bytes,
    raw: [u8; BHS_LEN],
}

impl Pdu {
    /// A PDU with no AHS.
    #[must_use]
    pub fn new(header: impl Into<Header>, data: Bytes) -> Self {
        Self {
            header: header.into(),
            ahs: Bytes::new(),
            data,
            raw: [0; BHS_LEN],
        }
    }

    /// A PDU with an AHS (whose length must be a multiple of four; the encoder pads it).
    #[must_use]
    pub fn with_ahs(header: impl Into<Header>, ahs: Bytes, data: Bytes) -> Self {
        Self {
            header: header.into(),
            ahs,
            data,
            raw: [0; BHS_LEN],
        }
    }

    /// A PDU whose data segment was received apart from its BHS (straight into a buffer of
    /// its own, issue 27): `raw` is the BHS `header` was parsed from, as
    /// [`Pdu::raw_bhs`] gives it for a PDU [`Frame::decode`] made. No AHS.
    #[must_use]
    pub fn received(header: Header, raw: [u8; BHS_LEN], data: Bytes) -> Self {
        Self {
            header,
            ahs: Bytes::new(),
            data,
            raw,
        }
    }

    /// The BHS exactly as received (all zeros for a PDU built locally): what a Reject carries
    /// back to the initiator (RFC 7143 §11.17).
    #[must_use]
    pub fn raw_bhs(&self) -> &[u8; BHS_LEN] {
        &self.raw
    }
}

/// One whole PDU taken off the stream by [`Codec::frame`] and not yet interpreted: its BHS,
/// AHS and data segment as raw bytes (slices of the receive buffer, not copies) and its
/// digests unchecked. [`Frame::decode`] checks the digests and parses the header.
#[derive(Clone, Debug)]
pub struct Frame {
    raw: [u8; BHS_LEN],
    /// The whole PDU: BHS, AHS, header digest, padded data, data digest.
    bytes: Bytes,
    ahs_len: usize,
    header_digest: bool,
    data_start: usize,
    dsl: usize,
    data_digest: bool,
}

impl Frame {
    /// The BHS exactly as received.
    #[must_use]
    pub fn bhs(&self) -> &[u8; BHS_LEN] {
        &self.raw
    }

    /// The Additional Header Segments, `TotalAHSLength * 4` bytes (RFC 7143 §11.2.2).
    #[must_use]
    pub fn ahs(&self) -> &[u8] {
        &self.bytes[BHS_LEN..BHS_LEN + self.ahs_len]
    }

    /// The data segment without padding or digest.
    #[must_use]
    pub fn data(&self) -> &[u8] {
        &self.bytes[self.data_start..self.data_start + self.dsl]
    }

    /// Checks the header and data digests (RFC 7143 §13.1) and parses the header into a
    /// [`Pdu`]. On error the frame is gone from the stream: a digest or field error leaves
    /// the stream in step ([`WireError::stream_intact`]), a header digest error does not.
    pub fn decode(self) -> Result<Pdu, WireError> {
        let ahs_len = self.ahs_len;
        self.decode_with_ahs(ahs_len)
    }

    /// [`Frame::decode`], with the PDU's AHS cut to its first `keep` bytes (the digests still
    /// cover all of it): what is left once record protection has checked and stripped the
    /// Seal AHS at the end (docs/seal.md §4a).
    pub fn decode_with_ahs(self, keep: usize) -> Result<Pdu, WireError> {
        let frame = self.bytes;
        let ahs_end = BHS_LEN + self.ahs_len;
        if self.header_digest {
            let expected = crc32c(&frame[..ahs_end]);
            let got = digest_at(&frame, ahs_end);
            if expected != got {
                return Err(WireError::HeaderDigest { expected, got });
            }
        }
        if self.data_digest {
            let padded_end = self.data_start + pad4(self.dsl);
            let expected = crc32c(&frame[self.data_start..padded_end]);
            if expected != digest_at(&frame, padded_end) {
                return Err(WireError::DataDigest {
                    bhs: Box::new(self.raw),
                    opcode: crate::Opcode(self.raw[0] & 0x3f),
                });
            }
        }
        let header = Header::parse(&self.raw)?;
        Ok(Pdu {
            header,
            ahs: frame.slice(BHS_LEN..BHS_LEN + keep.min(self.ahs_len)),
            data: frame.slice(self.data_start..self.data_start + self.dsl),
            raw: self.raw,
        })
    }
}

/// The four digest bytes at `at` (least significant byte first, RFC 7143 §13.1).
fn digest_at(frame: &[u8], at: usize) -> u32 {
    u32::from_le_bytes([frame[at], frame[at + 1], frame[at + 2], frame[at + 3]])
}

/// An outgoing PDU that cannot be encoded.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum EncodeError {
    #[error("data segment of {0} bytes does not fit DataSegmentLength (max 16 MiB - 1)")]
    DataTooLong(usize),
    #[error("AHS of {0} bytes is not a multiple of 4 or exceeds 1020 bytes")]
    BadAhs(usize),
}

/// Padding and data digest that follow a data segment on the wire; see [`Codec::encode_head`].
#[derive(Clone, Copy, Debug, Default)]
pub struct Trailer {
    buf: [u8; 7],
    len: u8,
}

impl Trailer {
    #[must_use]
    pub fn as_bytes(&self) -> &[u8] {
        &self.buf[..usize::from(self.len)]
    }
}

/// Frames and writes PDUs with the digests and limits negotiated for one connection.
///
/// Digests start after login completes (RFC 7143 §13.1: HeaderDigest/DataDigest take effect in
/// full feature phase), so a codec starts with both off; the runtime switches them on.
#[derive(Clone, Debug)]
pub struct Codec {
    pub header_digest: bool,
    pub data_digest: bool,
    /// The largest data segment this side accepts (its declared MaxRecvDataSegmentLength,
    /// RFC 7143 §13.12). Login PDUs use 8192 until the operational values are in force.
    pub max_recv_data_segment_length: u32,
}

impl Default for Codec {
    fn default() -> Self {
        Self {
            header_digest: false,
            data_digest: false,
            max_recv_data_segment_length: 8192,
        }
    }
}

impl Codec {
    /// Takes the next whole PDU off the front of `src`, or returns `Ok(None)` if more bytes are
    /// needed (an incomplete PDU is normal control flow, not an error). [`Codec::frame`], then
    /// [`Frame::decode`].
    ///
    /// Errors for which [`WireError::stream_intact`] is true consumed the bad PDU, so the caller
    /// can answer with a Reject and keep reading.
    pub fn decode(&self, src: &mut BytesMut) -> Result<Option<Pdu>, WireError> {
        match self.frame(src)? {
            Some(f) => f.decode().map(Some),
            None => Ok(None),
        }
    }

    /// Takes the next whole PDU off the front of `src` without interpreting it: only the
    /// lengths that find its end are read (TotalAHSLength, DataSegmentLength; RFC 7143
    /// §11.2.1), no digest is checked and no field is parsed. `Ok(None)`: more bytes are needed.
    ///
    /// The one error, [`WireError::DataSegmentTooLong`], is checked before any buffer is sized
    /// by the length field; it consumes nothing and ends the connection. A sealed connection
    /// verifies the frame's record tag before [`Frame::decode`] (docs/seal.md §4a).
    pub fn frame(&self, src: &mut BytesMut) -> Result<Option<Frame>, WireError> {
        if src.len() < BHS_LEN {
            src.reserve(BHS_LEN - src.len());
            return Ok(None);
        }
        let mut raw = [0u8; BHS_LEN];
        raw.copy_from_slice(&src[..BHS_LEN]);
        let ahs_len = usize::from(raw[4]) * 4;
        let dsl = (usize::from(raw[5]) << 16) | (usize::from(raw[6]) << 8) | usize::from(raw[7]);
        if dsl > self.max_recv_data_segment_length as usize {
            // Checked before any buffer is sized by the length field.
            return Err(WireError::DataSegmentTooLong {
                bhs: Box::new(raw),
                len: dsl as u32,
                max: self.max_recv_data_segment_length,
            });
        }
        let hd = if self.header_digest { 4 } else { 0 };
        let dd = if self.data_digest && dsl > 0 { 4 } else { 0 };
        let data_start = BHS_LEN + ahs_len + hd;
        let total = data_start + pad4(dsl) + dd;
        if src.len() < total {
            src.reserve(total - src.len());
            return Ok(None);
        }
        Ok(Some(Frame {
            raw,
            bytes: src.split_to(total).freeze(),
            ahs_len,
            header_digest: self.header_digest,
            data_start,
            dsl,
            data_digest: dd != 0,
        }))
    }

    /// Writes the BHS, AHS and header digest of `pdu` to `dst` and returns the trailer
    /// (padding and data digest) to send after `pdu.data`. Lets a runtime send the payload with
    /// vectored I/O straight from its `Bytes` instead of copying it.
    pub fn encode_head(&self, pdu: &Pdu, dst: &mut BytesMut) -> Result<Trailer, EncodeError> {
        let dsl = pdu.data.len();
        if dsl > MAX_DATA_SEGMENT_LENGTH {
            return Err(EncodeError::DataTooLong(dsl));
        }
        let ahs_len = pdu.ahs.len();
        if ahs_len % 4 != 0 || ahs_len > 255 * 4 {
            return Err(EncodeError::BadAhs(ahs_len));
        }
        let mut bhs = [0u8; BHS_LEN];
        pdu.header.write(&mut bhs);
        bhs[4] = (ahs_len / 4) as u8;
        bhs[5] = (dsl >> 16) as u8;
        bhs[6] = (dsl >> 8) as u8;
        bhs[7] = dsl as u8;
        dst.reserve(BHS_LEN + ahs_len + 4);
        let start = dst.len();
        dst.put_slice(&bhs);
        dst.put_slice(&pdu.ahs);
        if self.header_digest {
            let crc = crc32c(&dst[start..]);
            dst.put_slice(&to_wire(crc));
        }
        let mut trailer = Trailer::default();
        let pad = pad4(dsl) - dsl;
        trailer.len = pad as u8;
        if self.data_digest && dsl > 0 {
            let crc = crc32c_append(crc32c(&pdu.data), &[0u8; 3][..pad]);
            trailer.buf[pad..pad + 4].copy_from_slice(&to_wire(crc));
            trailer.len += 4;
        }
        Ok(trailer)
    }

    /// Writes the whole PDU to `dst` (copying the data segment).
    pub fn encode(&self, pdu: &Pdu, dst: &mut BytesMut) -> Result<(), EncodeError> {
        let trailer = self.encode_head(pdu, dst)?;
        dst.reserve(pdu.data.len() + trailer.as_bytes().len());
        dst.put_slice(&pdu.data);
        dst.put_slice(trailer.as_bytes());
        Ok(())
    }
}
