//! Unit tests of the framed transport: what the writer frames the reader reads back, codec
//! switches, hand-over mode, segments received in place (plain and sealed, across dropped
//! reads), and refusals (a Seal head that does not verify, a wrong header digest).

use super::*;
use iscsi_wire::header::NopOut;

#[tokio::test]
async fn accepts_what_the_writer_framed_back_in_order() {
    let (a, b) = tokio::io::duplex(1 << 20);
    let mut w = FrameWriter::new(a);
    for i in 1..=3u32 {
        let nop = NopOut {
            itt: i,
            ..NopOut::default()
        };
        w.push(Pdu::new(nop, Bytes::from(vec![i as u8; 4000])))
            .unwrap();
    }
    w.flush().await.unwrap();
    w.shutdown().await.unwrap();
    let mut r = FrameReader::new(b);
    for i in 1..=3u32 {
        let p = r.next().await.unwrap().unwrap().unwrap();
        assert_eq!(p.header.itt(), i);
        assert_eq!(&p.data[..], &vec![i as u8; 4000][..]);
    }
    assert!(
        r.next().await.unwrap().is_none(),
        "a clean close after them"
    );
}

/// The initiator's use: one reader and writer from the login on, the codec switched to
/// the negotiated digests after the last login PDU. A full feature phase PDU that came in
/// the same segment as the login response is still in the reader's buffer and decodes
/// under the new codec.
#[tokio::test]
async fn accepts_a_pdu_buffered_past_the_login_under_the_switched_codec() {
    let (a, b) = tokio::io::duplex(1 << 20);
    let mut w = FrameWriter::new(a);
    let nop = |itt| NopOut {
        itt,
        ..NopOut::default()
    };
    w.push(Pdu::new(nop(1), Bytes::from_static(b"login")))
        .unwrap();
    let digests = Codec {
        header_digest: true,
        data_digest: true,
        ..Codec::default()
    };
    w.codec = digests.clone();
    w.push(Pdu::new(nop(2), Bytes::from(vec![7u8; 5000])))
        .unwrap();
    // Both in one write: the reader's first read takes both.
    w.flush().await.unwrap();
    w.shutdown().await.unwrap();
    let mut r = FrameReader::new(b);
    let first = r.next().await.unwrap().unwrap().unwrap();
    assert_eq!(first.header.itt(), 1);
    r.codec = digests;
    let second = r.next().await.unwrap().unwrap().unwrap();
    assert_eq!(second.header.itt(), 2);
    assert_eq!(&second.data[..], &[7u8; 5000][..]);
    assert!(r.next().await.unwrap().is_none());
}

/// Hand-over mode: a long data segment is the only holder of its receive buffer (it can
/// become a READ's data without a copy), a short one is not moved out, a recycled buffer
/// is received into next, and bytes received past the long PDU are not lost. Without the
/// mode the segment shares the buffer (the target's reader: nothing changes there).
#[tokio::test]
async fn accepts_a_long_segment_handed_over_whole_in_hand_over_mode() {
    for mode in [true, false] {
        let (a, b) = tokio::io::duplex(1 << 20);
        let mut w = FrameWriter::new(a);
        let long = Bytes::from(vec![9u8; HAND_OVER_MIN]);
        let nop = |itt| NopOut {
            itt,
            ..NopOut::default()
        };
        // The long PDU and a short one in one read: the short one is carried over.
        w.push(Pdu::new(nop(1), long.clone())).unwrap();
        w.push(Pdu::new(nop(2), Bytes::from(vec![3u8; 100])))
            .unwrap();
        w.flush().await.unwrap();
        let mut r = FrameReader::new(b);
        // Past the login's 8 KiB default, as a full feature phase negotiates.
        r.codec.max_recv_data_segment_length = 256 * 1024;
        r.hand_over(mode);
        let first = r.next().await.unwrap().unwrap().unwrap();
        assert_eq!(first.header.itt(), 1);
        w.push(Pdu::new(nop(3), long.clone())).unwrap();
        w.flush().await.unwrap();
        w.shutdown().await.unwrap();
        let second = r.next().await.unwrap().unwrap().unwrap();
        assert_eq!(
            (second.header.itt(), &second.data[..]),
            (2, &[3u8; 100][..])
        );
        let owned = first.data.try_into_mut();
        assert_eq!(owned.is_ok(), mode, "hand-over {mode}");
        if let Ok(buf) = owned {
            assert_eq!(&buf[..], &long[..]);
            r.recycle(buf);
            assert!(r.spare.is_some(), "a buffer of the reader's size is kept");
        }
        let third = r.next().await.unwrap().unwrap().unwrap();
        assert_eq!((third.header.itt(), &third.data[..]), (3, &long[..]));
        assert!(r.next().await.unwrap().is_none());
    }
}

/// Placement (issue 27): a Data-In whose segment is not yet whole in the reader's buffer
/// is received into the buffer the caller lends, every byte in order and nothing past
/// the segment's end (the PDU after it is read as usual); two Data-In of one READ land
/// back to back in the caller's one allocation. With digests nothing is placed (a digest
/// covers bytes that would be spread over two buffers) and the same bytes come as PDUs.
#[tokio::test]
async fn accepts_a_data_in_segment_received_in_place_into_a_lent_buffer() {
    const LEN: usize = 40_000;
    let byte = |i: usize| (i % 251) as u8;
    for digests in [false, true] {
        // A pipe much smaller than a segment: the reader sees a BHS long before its data.
        let (a, b) = tokio::io::duplex(4096);
        let codec = Codec {
            header_digest: digests,
            data_digest: digests,
            max_recv_data_segment_length: 256 * 1024,
        };
        let mut w = FrameWriter::new(a);
        w.codec = codec.clone();
        let sender = tokio::spawn(async move {
            for n in 0..2u32 {
                let h = DataIn {
                    final_: n == 1,
                    itt: 7,
                    data_sn: n,
                    buffer_offset: n * LEN as u32,
                    ..DataIn::default()
                };
                let data: Vec<u8> = (0..LEN).map(|i| byte(n as usize * LEN + i)).collect();
                w.push(Pdu::new(h, Bytes::from(data))).unwrap();
            }
            let nop = NopOut {
                itt: 9,
                ..NopOut::default()
            };
            w.push(Pdu::new(nop, Bytes::from(vec![3u8; 100]))).unwrap();
            w.flush().await.unwrap();
            w.shutdown().await.unwrap();
        });
        let mut r = FrameReader::new(b);
        r.codec = codec;
        r.hand_over(true);
        let mut dest = BytesMut::with_capacity(2 * LEN);
        let dest_at = dest.as_ptr();
        let mut placed = 0;
        let mut lent = 0;
        let mut whole = Vec::new();
        loop {
            let got = r
                .next_placing(|h, len| {
                    lent += 1;
                    assert_eq!((h.itt, h.buffer_offset as usize), (7, dest.len()));
                    assert_eq!(len, LEN);
                    let at = dest.len();
                    Some(dest.split_off(at))
                })
                .await
                .unwrap();
            match got {
                None => break,
                Some(Received::Placed { pdu, data }) => {
                    placed += 1;
                    assert!(pdu.data.is_empty());
                    assert_eq!(data.len(), LEN);
                    dest.unsplit(data);
                }
                Some(Received::Pdu(pdu)) => {
                    let pdu = pdu.unwrap();
                    if pdu.header.itt() == 7 {
                        dest.extend_from_slice(&pdu.data);
                    }
                    whole.push((pdu.header.itt(), pdu.data.len()));
                }
            }
        }
        sender.await.unwrap();
        let want: Vec<u8> = (0..2 * LEN).map(byte).collect();
        assert!(
            dest[..] == want[..],
            "digests {digests}: bytes out of place"
        );
        if digests {
            assert_eq!((lent, placed), (0, 0), "placed despite digests");
            assert_eq!(whole, [(7, LEN), (7, LEN), (9, 100)]);
        } else {
            assert_eq!((lent, placed), (2, 2));
            assert_eq!(dest.as_ptr(), dest_at, "one allocation, no copy");
            assert_eq!(whole, [(9, 100)], "the PDU after them as usual");
        }
    }
}

/// A WRITE of `edtl` bytes with ITT 7 and CmdSN 1, the command the placing tests send.
fn write_command(edtl: u32) -> iscsi_wire::header::ScsiCommand {
    iscsi_wire::header::ScsiCommand {
        immediate: false,
        final_: true,
        read: false,
        write: true,
        attr: iscsi_wire::header::TaskAttr::SIMPLE,
        lun: 0,
        itt: 7,
        expected_data_transfer_length: edtl,
        cmd_sn: 1,
        exp_stat_sn: 1,
        cdb: [0; 16],
    }
}

/// The target's placing (issue 27): after a WRITE that leaves 80,000 bytes to come by
/// Data-Out, its two Data-Out PDUs are received into the write's one buffer, lent by the
/// caller, every byte in order; the PDU after them comes as usual. The target's reader
/// races the read against its timers: here a timer drops the placing read again and again
/// while a slow peer trickles the bytes in, and each next call goes on where the dropped
/// one stopped (nothing lost, nothing read twice).
#[tokio::test]
async fn accepts_data_out_placed_across_dropped_reads() {
    const LEN: usize = 40_000;
    let byte = |i: usize| (i % 241) as u8;
    let codec = Codec {
        max_recv_data_segment_length: 256 * 1024,
        ..Codec::default()
    };
    // The wire bytes, framed by the writer.
    let (a, mut b) = tokio::io::duplex(1 << 20);
    let mut w = FrameWriter::new(a);
    w.codec = codec.clone();
    let cmd = write_command(2 * LEN as u32);
    w.push(Pdu::new(cmd, Bytes::new())).unwrap();
    for n in 0..2u32 {
        let h = DataOut {
            final_: n == 1,
            lun: 0,
            itt: 7,
            ttt: 3,
            exp_stat_sn: 1,
            data_sn: n,
            buffer_offset: n * LEN as u32,
        };
        let data: Vec<u8> = (0..LEN).map(|i| byte(n as usize * LEN + i)).collect();
        w.push(Pdu::new(h, Bytes::from(data))).unwrap();
    }
    let nop = NopOut {
        itt: 9,
        ..NopOut::default()
    };
    w.push(Pdu::new(nop, Bytes::from(vec![3u8; 100]))).unwrap();
    w.flush().await.unwrap();
    w.shutdown().await.unwrap();
    let mut wire = Vec::new();
    b.read_to_end(&mut wire).await.unwrap();
    // A slow peer: 1,000 bytes a millisecond through a pipe of 4 KiB.
    let (mut tx, rx) = tokio::io::duplex(4096);
    let sender = tokio::spawn(async move {
        for piece in wire.chunks(1000) {
            tx.write_all(piece).await.unwrap();
            tokio::time::sleep(std::time::Duration::from_millis(1)).await;
        }
        tx.shutdown().await.unwrap();
    });
    let mut r = FrameReader::new(rx);
    r.codec = codec;
    let dest = std::cell::RefCell::new(BytesMut::with_capacity(2 * LEN));
    let dest_at = dest.borrow().as_ptr();
    let (mut lent, mut placed, mut dropped_mid_segment) = (0, 0, 0);
    let mut whole = Vec::new();
    loop {
        let got = tokio::select! {
            biased;
            got = r.next_placing_data_out(|h, len| {
                lent += 1;
                let mut d = dest.borrow_mut();
                assert_eq!((h.itt, h.buffer_offset as usize, len), (7, d.len(), LEN));
                let at = d.len();
                Some(d.split_off(at))
            }) => got.unwrap(),
            () = tokio::time::sleep(std::time::Duration::from_micros(700)) => {
                if r.placing.is_some() {
                    dropped_mid_segment += 1;
                }
                continue;
            }
        };
        match got {
            None => break,
            Some(Received::Placed { pdu, data }) => {
                placed += 1;
                assert!(pdu.data.is_empty());
                assert_eq!(data.len(), LEN);
                dest.borrow_mut().unsplit(data);
            }
            Some(Received::Pdu(pdu)) => {
                let pdu = pdu.unwrap();
                whole.push((pdu.header.opcode(), pdu.data.len()));
            }
        }
    }
    sender.await.unwrap();
    let want: Vec<u8> = (0..2 * LEN).map(byte).collect();
    let dest = dest.into_inner();
    assert!(dest[..] == want[..], "bytes out of place");
    assert_eq!((lent, placed), (2, 2));
    assert_eq!(dest.as_ptr(), dest_at, "one allocation, no copy");
    assert_eq!(
        whole,
        [(Opcode::SCSI_COMMAND, 0), (Opcode::NOP_OUT, 100)],
        "the PDUs around them as usual"
    );
    assert!(
        dropped_mid_segment > 0,
        "the test dropped no read in the middle of a segment"
    );
}

/// A sealed session's Data-In PDUs (AES-256-GCM record tags) and a NOP-In after them, as
/// a peer writes them, through a pipe much smaller than a segment; `flip`: XOR 1 into
/// byte `at` of PDU `n` on the wire first.
fn sealed_stream(len: usize, flip: Option<(usize, usize)>) -> tokio::io::DuplexStream {
    let (mut sealer, _) = ipsan_seal::record::pair_for_test(ipsan_seal::Cipher::Aes256Gcm, 7);
    let codec = Codec {
        max_recv_data_segment_length: 256 * 1024,
        ..Codec::default()
    };
    let mut pdus = Vec::new();
    for n in 0..2u32 {
        let h = DataIn {
            final_: n == 1,
            itt: 7,
            data_sn: n,
            buffer_offset: n * len as u32,
            ..DataIn::default()
        };
        let data: Vec<u8> = (0..len)
            .map(|i| ((n as usize * len + i) % 251) as u8)
            .collect();
        pdus.push(Pdu::new(h, Bytes::from(data)));
    }
    let nop = iscsi_wire::header::NopIn {
        itt: 9,
        ..iscsi_wire::header::NopIn::default()
    };
    pdus.push(Pdu::new(nop, Bytes::from(vec![3u8; 100])));
    let mut wire = Vec::new();
    for (n, mut pdu) in pdus.into_iter().enumerate() {
        sealer.protect(&mut pdu).unwrap();
        let mut one = BytesMut::new();
        codec.encode(&pdu, &mut one).unwrap();
        if let Some((_, at)) = flip.filter(|(k, _)| *k == n) {
            one[at] ^= 1;
        }
        wire.extend_from_slice(&one);
    }
    let (mut a, b) = tokio::io::duplex(4096);
    tokio::spawn(async move {
        let _ = a.write_all(&wire).await;
        let _ = a.shutdown().await;
    });
    b
}

fn sealed_reader(stream: tokio::io::DuplexStream) -> FrameReader<tokio::io::DuplexStream> {
    let (_, opener) = ipsan_seal::record::pair_for_test(ipsan_seal::Cipher::Aes256Gcm, 7);
    let mut r = FrameReader::new(stream);
    r.codec.max_recv_data_segment_length = 256 * 1024;
    r.record = Some(opener);
    r.hand_over(true);
    r
}

/// Issue 27: in a sealed session a Data-In's segment is received in place too, once its
/// head (BHS + Seal AHS) verified: both segments land back to back in the caller's one
/// allocation, the Seal AHS is not in them, and the record counter advanced once per PDU
/// (the NOP-In after them verifies under the next counter and arrives as a PDU).
#[tokio::test]
async fn accepts_a_sealed_data_in_received_in_place_once_its_head_verifies() {
    const LEN: usize = 40_000;
    let mut r = sealed_reader(sealed_stream(LEN, None));
    let mut dest = BytesMut::with_capacity(2 * LEN);
    let dest_at = dest.as_ptr();
    let (mut lent, mut placed, mut whole) = (0, 0, Vec::new());
    loop {
        let got = r
            .next_placing(|h, len| {
                lent += 1;
                assert_eq!((h.itt, h.buffer_offset as usize, len), (7, dest.len(), LEN));
                let at = dest.len();
                Some(dest.split_off(at))
            })
            .await
            .unwrap();
        match got {
            None => break,
            Some(Received::Placed { pdu, data }) => {
                placed += 1;
                assert!(pdu.data.is_empty() && pdu.ahs.is_empty());
                dest.unsplit(data);
            }
            Some(Received::Pdu(pdu)) => {
                let pdu = pdu.unwrap();
                whole.push((pdu.header.itt(), pdu.data.len()));
            }
        }
    }
    let want: Vec<u8> = (0..2 * LEN).map(|i| (i % 251) as u8).collect();
    assert!(dest[..] == want[..], "bytes out of place");
    assert_eq!((lent, placed), (2, 2));
    assert_eq!(dest.as_ptr(), dest_at, "one allocation, no copy");
    assert_eq!(whole, [(9, 100)], "the NOP-In verified after them");
    assert_eq!(r.record.as_ref().unwrap().received(), 3);
}

/// A relay's edit of a placed Data-In's header (its buffer offset, its ITT, its Seal AHS)
/// fails its record tag before anything is lent for it: the read side errs with a forgery
/// and the caller was asked for the first, genuine PDU only.
#[tokio::test]
async fn rejects_an_altered_sealed_data_in_head_before_lending_for_it() {
    const LEN: usize = 40_000;
    // Byte 41 (buffer offset), 17 (ITT), 60 (the Seal AHS's tag).
    for at in [41, 17, 60] {
        let mut r = sealed_reader(sealed_stream(LEN, Some((1, at))));
        let mut dest = BytesMut::with_capacity(2 * LEN);
        let mut lent = 0;
        let err = loop {
            let got = r
                .next_placing(|_, _| {
                    lent += 1;
                    let at = dest.len();
                    Some(dest.split_off(at))
                })
                .await;
            match got {
                Ok(Some(Received::Placed { data, .. })) => dest.unsplit(data),
                Ok(other) => panic!("byte {at}: {other:?} instead of a forgery"),
                Err(e) => break e,
            }
        };
        assert!(forgery(&err).is_some(), "byte {at}: {err}");
        assert_eq!(lent, 1, "byte {at}: lent for the altered PDU");
        assert_eq!(dest.len(), LEN);
    }
}

/// The codec's errors on a plain connection reach the caller as a PDU error, not as an
/// I/O error (the initiator drops the connection on it; the target answers a Reject).
#[tokio::test]
async fn rejects_a_pdu_whose_header_digest_is_wrong_as_a_wire_error() {
    let (a, b) = tokio::io::duplex(1 << 20);
    let mut w = FrameWriter::new(a);
    // Sent without digests, read expecting them: the 4 bytes after the first BHS are
    // the start of its data, not its CRC32C (a second PDU so the stream is long enough).
    for _ in 0..2 {
        w.push(Pdu::new(NopOut::default(), Bytes::from(vec![1u8; 64])))
            .unwrap();
    }
    w.flush().await.unwrap();
    w.shutdown().await.unwrap();
    let mut r = FrameReader::new(b);
    r.codec.header_digest = true;
    let got = r.next().await.unwrap();
    assert!(matches!(got, Some(Err(_))), "{got:?}");
}

/// The target's placing of a write's immediate data (issue 27): a WRITE with 40,000 bytes
/// of immediate data whose head came alone is received into the buffer the caller lent for
/// the whole write, and comes back as a PDU (its BHS as on the wire) whose data is that
/// buffer; its Data-Out after it is placed right behind it. A slow peer trickles the bytes.
#[tokio::test]
async fn accepts_a_write_commands_immediate_data_placed_in_a_lent_buffer() {
    const LEN: usize = 40_000;
    let byte = |i: usize| (i % 239) as u8;
    let codec = Codec {
        max_recv_data_segment_length: 256 * 1024,
        ..Codec::default()
    };
    let (a, mut b) = tokio::io::duplex(1 << 20);
    let mut w = FrameWriter::new(a);
    w.codec = codec.clone();
    let cmd = write_command(2 * LEN as u32);
    let first: Vec<u8> = (0..LEN).map(byte).collect();
    w.push(Pdu::new(cmd.clone(), Bytes::from(first))).unwrap();
    let h = DataOut {
        final_: true,
        lun: 0,
        itt: 7,
        ttt: 3,
        exp_stat_sn: 1,
        data_sn: 0,
        buffer_offset: LEN as u32,
    };
    let second: Vec<u8> = (LEN..2 * LEN).map(byte).collect();
    w.push(Pdu::new(h, Bytes::from(second))).unwrap();
    w.flush().await.unwrap();
    w.shutdown().await.unwrap();
    let mut wire = Vec::new();
    b.read_to_end(&mut wire).await.unwrap();
    let bhs: [u8; BHS_LEN] = wire[..BHS_LEN].try_into().unwrap();
    let (mut tx, rx) = tokio::io::duplex(4096);
    let sender = tokio::spawn(async move {
        for piece in wire.chunks(1000) {
            tx.write_all(piece).await.unwrap();
            tokio::time::sleep(std::time::Duration::from_millis(1)).await;
        }
        tx.shutdown().await.unwrap();
    });
    let mut r = FrameReader::new(rx);
    r.codec = codec;
    r.head_first();
    let mut dest = Some(BytesMut::with_capacity(2 * LEN));
    let dest_at = dest.as_ref().unwrap().as_ptr();
    let mut whole: Option<BytesMut> = None;
    let mut lent = Vec::new();
    loop {
        let got = r
            .next_placing_writes(|h, len| {
                lent.push((h.opcode(), len));
                match h {
                    Header::ScsiCommand(_) => dest.take(),
                    Header::DataOut(_) => {
                        let w = whole.as_mut()?;
                        let at = w.len();
                        Some(w.split_off(at))
                    }
                    _ => None,
                }
            })
            .await
            .unwrap();
        match got {
            None => break,
            Some(Received::Pdu(pdu)) => {
                let pdu = pdu.unwrap();
                assert_eq!(pdu.header, Header::ScsiCommand(cmd.clone()));
                assert_eq!(pdu.raw_bhs(), &bhs, "the BHS as received");
                assert_eq!(pdu.data.as_ptr(), dest_at, "received in the lent buffer");
                whole = Some(pdu.data.try_into_mut().unwrap());
            }
            Some(Received::Placed { data, .. }) => whole.as_mut().unwrap().unsplit(data),
        }
    }
    sender.await.unwrap();
    let want: Vec<u8> = (0..2 * LEN).map(byte).collect();
    let whole = whole.unwrap();
    assert!(whole[..] == want[..], "bytes out of place");
    assert_eq!(whole.as_ptr(), dest_at, "one buffer, no copy");
    assert_eq!(
        lent,
        [(Opcode::SCSI_COMMAND, LEN), (Opcode::SCSI_DATA_OUT, LEN)]
    );
}
