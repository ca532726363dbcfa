//! Where the queue's received bytes go (`super::Queue`): how much the driver's next read
//! takes and into which room ([`Queue::prepare_recv`]), and which long write's data is read
//! into a buffer of its own ([`Queue::placement`], [`Queue::receive_placed`]), so a store can
//! keep it without a copy (issue 30).

use bytes::{Bytes, BytesMut};
use nvme_wire::entry::{Sgl, Sqe, SQE_LEN};
use nvme_wire::pdu::{PduType, FLAG_DDGSTF, MAX_PDA, MAX_TERM_DATA};
use nvme_wire::{CH_LEN, DIGEST_LEN};

use super::{
    is_host_to_controller, le16, le32, Phase, Queue, Slot, CAPSULE_ROOM, HEAD_MIN, LONG_PDU,
    PDU_OVERHEAD, RECV_CHUNK,
};

impl Queue {
    /// Makes room in `buf` for the driver's next read and returns how many bytes that read
    /// should take at most ([`RECV_CHUNK`], or the rest of a long PDU being received).
    ///
    /// A long PDU (an H2CData or a command capsule of `LONG_PDU` bytes or more) is read up
    /// to its end and no further, straight into the room behind its header,
    /// so after it `buf` is empty and the next read starts at the front of it again. Every
    /// other read takes up to [`RECV_CHUNK`] bytes plus the longest PDU the host may send now
    /// (an H2CData of MAXH2CDATA bytes while an R2T is out, else a capsule of the queue's
    /// in-capsule size: one whole PDU and the head of the next in one system call), with room
    /// behind them for all of a PDU that begins in them, so a PDU is never moved to make room
    /// for its rest: before,
    /// a read of 256 KiB that ended inside a 1 MiB H2CData left its first part to be copied
    /// to the front of the buffer by the next `reserve`, ~147 KB per 1 MiB write
    /// (docs/results/nvme-speed-9). What `reserve` still moves is a partial short PDU or
    /// header.
    ///
    /// While a PDU that would be placed may come ([`Queue::placement`]: an H2CData for an R2T
    /// out, or a long write's capsule after one came), reads stop at PDU heads instead: a
    /// read takes the rest of the PDU begun in `buf` (only up to its data when it is one to
    /// place) and the head of the next (its first `HEAD_MIN` bytes, or a capsule's header
    /// up to its data when capsules are placed), none of its data, so a long write's data is
    /// never read into `buf` (as iSCSI's target reads a head alone while a Data-Out may come).
    pub fn prepare_recv(&self, buf: &mut BytesMut) -> usize {
        let frame = self.codec.frame(buf);
        let heads = self.placeable > 0 || (self.long_capsules && self.places_capsules());
        let (room, limit) = if heads {
            let head = if self.placeable > 0 {
                HEAD_MIN
            } else {
                self.capsule_head()
            };
            let limit = match frame {
                Ok(Some(plen)) => {
                    let pdo = usize::from(buf[3]);
                    if buf.len() < pdo && self.placeable_head(buf, plen).is_some() {
                        pdo - buf.len()
                    } else {
                        plen.saturating_sub(buf.len()) + head
                    }
                }
                // No common header yet (every PDU is at least `HEAD_MIN` long), or a bad
                // one (`receive` reports it).
                _ => head.saturating_sub(buf.len()).max(1),
            };
            (limit, limit)
        } else {
            let rest = match frame {
                Ok(Some(plen)) if plen >= LONG_PDU => plen.saturating_sub(buf.len()),
                // No header yet, a bad one (`receive` reports it) or a short PDU.
                _ => 0,
            };
            if rest > 0 {
                (rest, rest)
            } else {
                let longest = self.longest_pdu();
                (RECV_CHUNK + 2 * longest, RECV_CHUNK + longest)
            }
        };
        if buf.capacity() - buf.len() < room {
            buf.reserve(room);
        }
        limit
    }

    /// When `buf` holds exactly the head of an H2CData up to its data (header, header digest,
    /// padding) that carries all of a transfer of at least [`QueueConfig::place_min`] bytes
    /// and no data digest: the length of its data. The driver then reads exactly that many
    /// bytes into a buffer of their own (a `BytesMut::with_capacity` of them) and hands it
    /// over with [`Queue::receive_placed`]: the command gets that buffer as its data, the
    /// whole of its allocation (issue 30: a RAM store keeps a 1 MiB write's buffer as its
    /// chunk instead of copying it). `None`: read on as [`Queue::prepare_recv`] says.
    ///
    /// A command capsule is placed the same way when it carries all of a write of at least
    /// `place_min` bytes as in-capsule data ([`Queue::places_capsules`]: the I/O queues'
    /// in-capsule size is at least `place_min`), so such a write needs no R2T round trip
    /// either.
    #[must_use]
    pub fn placement(&self, buf: &[u8]) -> Option<usize> {
        if self.phase != Phase::Ready || (self.placeable == 0 && !self.places_capsules()) {
            return None;
        }
        if buf.len() < CH_LEN || buf.len() != usize::from(buf[3]) {
            return None;
        }
        let plen = self.codec.frame(buf).ok()??;
        self.placeable_head(buf, plen)
    }

    /// Whether command capsules that carry a long write are placed ([`Queue::placement`]):
    /// `place_min` is set, this queue's in-capsule size takes such a write and no data digest
    /// covers the data.
    fn places_capsules(&self) -> bool {
        self.cfg.place_min > 0
            && self.in_capsule >= self.cfg.place_min
            && self.seen_first
            && !self.codec.data_digest
    }

    /// A command capsule's bytes up to its data: the header, its digest and the padding to
    /// our CPDA.
    fn capsule_head(&self) -> usize {
        let hd = if self.codec.header_digest {
            DIGEST_LEN
        } else {
            0
        };
        let align = (usize::from(self.codec.rx_pda.min(MAX_PDA)) + 1) * 4;
        (PduType::CapsuleCmd.hlen() + hd).div_ceil(align) * align
    }

    /// [`Queue::placement`]'s test of the head at the front of `buf` (as much of it as is
    /// there, at least the common header; PLEN `plen`): the data's length when the PDU is one
    /// to place.
    fn placeable_head(&self, buf: &[u8], plen: usize) -> Option<usize> {
        let pdo = usize::from(buf[3]);
        if buf[1] & FLAG_DDGSTF != 0 || self.codec.data_digest || plen <= pdo {
            return None;
        }
        let datal = plen - pdo;
        if buf[0] == PduType::CapsuleCmd as u8 && self.places_capsules() {
            return self.placeable_capsule(buf, pdo, datal);
        }
        if buf[0] != PduType::H2cData as u8 || self.placeable == 0 || pdo < PduType::H2cData.hlen()
        {
            return None;
        }
        if buf.len() < PduType::H2cData.hlen() {
            // TTAG and DATAO not here yet: a transfer of this length may be one to place.
            return (datal >= self.cfg.place_min as usize).then_some(datal);
        }
        let (ttag, datao) = (le16(buf, 10), le32(buf, 12));
        let cid = self.ttags.get(&ttag)?;
        match self.slots.get(cid) {
            Some(Slot::Receiving(t))
                if t.placeable && t.failed.is_none() && datao == 0 && datal == t.len as usize =>
            {
                Some(datal)
            }
            _ => None,
        }
    }

    /// [`Queue::placeable_head`] for a command capsule with `datal` bytes of data at `pdo`:
    /// a write whose SGL is all of the in-capsule data, at least `place_min` bytes and no
    /// more than the in-capsule size (before its SQE is here, the length decides).
    fn placeable_capsule(&self, buf: &[u8], pdo: usize, datal: usize) -> Option<usize> {
        let hlen = PduType::CapsuleCmd.hlen();
        if pdo < hlen || datal < self.cfg.place_min as usize || datal > self.in_capsule as usize {
            return None;
        }
        let Some(raw) = buf.get(CH_LEN..hlen) else {
            return Some(datal);
        };
        let sqe = Sqe::from_bytes(raw.first_chunk::<{ SQE_LEN }>()?);
        let whole =
            matches!(sqe.sgl, Sgl::InCapsule { offset: 0, length } if length as usize == datal);
        (whole && is_host_to_controller(&sqe)).then_some(datal)
    }

    /// Receives the PDU (an H2CData or a command capsule) whose head is all of `buf`
    /// ([`Queue::placement`] said so) and whose data the driver read into `data`, a buffer of
    /// its own: handled as [`Queue::receive`] handles any such PDU, every check made, the data
    /// handed to the command as it is. Takes the head off `buf` (empty afterwards).
    pub fn receive_placed(&mut self, buf: &mut BytesMut, data: Bytes) {
        let head = buf.split().freeze();
        if self.phase == Phase::Closed {
            return;
        }
        let header = &head[..head.len().min(MAX_TERM_DATA)];
        match self.codec.decode_placed(&head, data) {
            Ok(pdu) => {
                if let Err((fes, fei, reason)) = self.on_pdu(pdu) {
                    self.terminate(fes, fei, reason, header);
                }
            }
            Err(e) => self.wire_error(&e, header),
        }
    }

    /// The longest PDU the host may send now (with its header, digests and padding): an
    /// H2CData of MAXH2CDATA while an R2T is out, else a capsule of the in-capsule size. A
    /// longer one (the codec's bound) is still received, only not without a move.
    ///
    /// Capsules count with at most [`CAPSULE_ROOM`] of data until one carried more: a
    /// connection that sends only short writes keeps a short receive buffer whatever the
    /// in-capsule size (the first longer capsule may be moved once to make room for its rest).
    fn longest_pdu(&self) -> usize {
        let in_capsule = if self.big_capsules {
            self.in_capsule
        } else {
            self.in_capsule.min(CAPSULE_ROOM)
        };
        let data = if self.r2t_active > 0 {
            self.cfg.maxh2cdata.max(in_capsule)
        } else {
            in_capsule
        };
        data as usize + PDU_OVERHEAD
    }
}
