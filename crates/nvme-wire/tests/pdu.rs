//! NVMe/TCP PDU codec: byte-exact vectors derived by hand from the layouts of NVMe/TCP 1.0
//! §3.6.2, round trips of every PDU under every digest and alignment setting, and one
//! `rejects_*` test per validation rule (with the FES/FEI a termination request would carry).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use bytes::{Bytes, BytesMut};
use nvme_wire::entry::{Cqe, Sgl, Sqe, Status};
use nvme_wire::pdu::{
    C2hData, CapsuleCmd, CapsuleResp, Codec, H2cData, IcReq, IcResp, Pdu, R2t, TermReq,
};
use nvme_wire::{Fes, WireError};

/// Hex with spaces and `|` separators ignored.
fn hex(s: &str) -> Vec<u8> {
    let s: String = s.chars().filter(|c| c.is_ascii_hexdigit()).collect();
    assert_eq!(s.len() % 2, 0, "odd hex");
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
        .collect()
}

fn codec(hd: bool, dd: bool) -> Codec {
    Codec {
        header_digest: hd,
        data_digest: dd,
        ..Codec::new(1 << 20)
    }
}

fn enc(c: &Codec, p: &Pdu) -> Vec<u8> {
    c.to_bytes(p).unwrap().to_vec()
}

fn dec(c: &Codec, b: &[u8]) -> Result<Pdu, WireError> {
    c.decode(Bytes::copy_from_slice(b))
}

/// Asserts `b` is refused as a fatal invalid header field at FEI `offset`.
fn assert_invalid_at(c: &Codec, b: &[u8], offset: u32) {
    let e = dec(c, b).unwrap_err();
    assert_eq!(e.fes(), Some(Fes::InvalidHeaderField), "{e}");
    assert_eq!(e.fei(), offset, "{e}");
    assert!(!e.stream_intact());
}

fn sqe_write_in_capsule(cid: u16, len: u32) -> Sqe {
    let mut s = Sqe::new(
        0x01,
        cid,
        Sgl::InCapsule {
            offset: 0,
            length: len,
        },
    );
    s.nsid = 1;
    s
}

// ------------------------------------------------------------------------------ vectors

#[test]
fn icreq_matches_hand_vector() {
    // CH: type 00, flags 00, HLEN 80h (128), PDO 00, PLEN 128 LE | PFV 0000 | HPDA 00 |
    // DGST 03 (header + data digests) | MAXR2T 0 | 112 reserved zero bytes.
    let mut want = hex("00 00 80 00 | 80 00 00 00 | 00 00 | 00 | 03 | 00 00 00 00");
    want.resize(128, 0);
    let p = Pdu::IcReq(IcReq {
        pfv: 0,
        hpda: 0,
        hdgst: true,
        ddgst: true,
        maxr2t: 0,
    });
    let c = Codec::new(4096);
    assert_eq!(enc(&c, &p), want);
    assert_eq!(dec(&c, &want).unwrap(), p);
}

#[test]
fn icresp_matches_hand_vector() {
    // CH 01 00 80 00 | PLEN 128 | PFV 0 | CPDA 00 | DGST 01 | MAXH2CDATA 0x20000 LE.
    let mut want = hex("01 00 80 00 | 80 00 00 00 | 00 00 | 00 | 01 | 00 00 02 00");
    want.resize(128, 0);
    let p = Pdu::IcResp(IcResp {
        pfv: 0,
        cpda: 0,
        hdgst: true,
        ddgst: false,
        maxh2cdata: 0x20000,
    });
    // IC PDUs never carry digests, even on a codec that has them switched on.
    for c in [Codec::new(4096), codec(true, true)] {
        assert_eq!(enc(&c, &p), want);
        assert_eq!(dec(&c, &want).unwrap(), p);
    }
}

#[test]
fn capsule_resp_with_header_digest_matches_hand_vector() {
    // CH 05, FLAGS 01 (HDGSTF), HLEN 18h, PDO 0, PLEN 1Ch (24 + 4) | CQE: DW0 = CNTLID 1 with
    // AUTHREQ.ATR (bit 17) = 00020001h | DW1 0 | SQHD 1 | SQID 0 | CID 0Ah | status 0 |
    // HDGST = CRC32C of the 24 header bytes, LSB first (computed independently: a9 88 1e d3).
    let want = hex(
        "05 01 18 00 | 1c 00 00 00 | 01 00 02 00 | 00 00 00 00 | 01 00 | 00 00 | 0a 00 | 00 00 \
         | a9 88 1e d3",
    );
    let mut cqe = Cqe::new(10, Status::SUCCESS);
    cqe.dw0 = 0x0002_0001;
    cqe.sqhd = 1;
    let p = Pdu::CapsuleResp(CapsuleResp { cqe });
    let c = codec(true, true);
    assert_eq!(enc(&c, &p), want);
    assert_eq!(dec(&c, &want).unwrap(), p);
}

#[test]
fn h2c_data_with_both_digests_matches_hand_vector() {
    // CH 06, FLAGS 07 (HDGSTF|DDGSTF|LAST_PDU), HLEN 18h, PDO 1Ch (24 + HDGST, PDA 0),
    // PLEN 28h (28 + 8 data + 4 DDGST) | CCCID 5 | TTAG 2 | DATAO 4096 | DATAL 8 | rsvd |
    // HDGST 0e fe 58 27 | data 01..08 | DDGST 81 1f 89 46 (CRC32C of the data only).
    let want = hex(
        "06 07 18 1c | 28 00 00 00 | 05 00 | 02 00 | 00 10 00 00 | 08 00 00 00 | 00 00 00 00 \
         | 0e fe 58 27 | 01 02 03 04 05 06 07 08 | 81 1f 89 46",
    );
    let p = Pdu::H2cData(H2cData {
        cccid: 5,
        ttag: 2,
        datao: 4096,
        last: true,
        data: Bytes::from_static(&[1, 2, 3, 4, 5, 6, 7, 8]),
    });
    let c = codec(true, true);
    assert_eq!(enc(&c, &p), want);
    assert_eq!(dec(&c, &want).unwrap(), p);
}

#[test]
fn c2h_data_aligned_to_hpda_matches_hand_vector() {
    // Host asked HPDA 3 (16-byte alignment): data starts at PDO 20h, after 8 zero pad bytes.
    // CH 07, FLAGS 0C (LAST_PDU|SUCCESS), HLEN 18h, PDO 20h, PLEN 24h | CCCID 3 | rsvd |
    // DATAO 0 | DATAL 4 | rsvd | pad | de ad be ef.
    let want = hex(
        "07 0c 18 20 | 24 00 00 00 | 03 00 | 00 00 | 00 00 00 00 | 04 00 00 00 | 00 00 00 00 \
         | 00 00 00 00 00 00 00 00 | de ad be ef",
    );
    let p = Pdu::C2hData(C2hData {
        cccid: 3,
        datao: 0,
        last: true,
        success: true,
        data: Bytes::from_static(&[0xde, 0xad, 0xbe, 0xef]),
    });
    let c = Codec {
        rx_pda: 3,
        tx_pda: 3,
        ..Codec::new(4096)
    };
    assert_eq!(enc(&c, &p), want);
    assert_eq!(dec(&c, &want).unwrap(), p);
    // The same bytes under PDA 0 have a PDO that is not the aligned offset after the header.
    assert_invalid_at(&Codec::new(4096), &want, 3);
}

#[test]
fn capsule_cmd_with_in_capsule_data_matches_hand_vector() {
    // CH 04 00 48h (8 + 64) PDO 48h, PLEN 4Ch | SQE: Write (01h), flags 40h (PSDT = SGL),
    // CID 7, NSID 1, CDW2-3 0, MPTR 0, SGL1 = Data Block/Offset: address 0, length 4, id 01h |
    // CDW10-15 0 | data ca fe ba be.
    let want = hex(
        "04 00 48 00 | 4c 00 00 00 | 01 40 07 00 | 01 00 00 00 | 00 00 00 00 00 00 00 00 \
         | 00 00 00 00 00 00 00 00 | 00 00 00 00 00 00 00 00 | 04 00 00 00 | 00 00 00 | 01 \
         | 00 00 00 00 00 00 00 00 00 00 00 00 00 00 00 00 00 00 00 00 00 00 00 00 | ca fe ba be",
    );
    // PDO is byte 3: fix it up from the 00 placeholder above (48h, right after the header).
    let mut want = want;
    want[3] = 0x48;
    let p = Pdu::CapsuleCmd(CapsuleCmd {
        sqe: sqe_write_in_capsule(7, 4),
        data: Bytes::from_static(&[0xca, 0xfe, 0xba, 0xbe]),
    });
    let c = Codec::new(8192);
    assert_eq!(enc(&c, &p), want);
    assert_eq!(dec(&c, &want).unwrap(), p);
}

#[test]
fn r2t_matches_hand_vector() {
    // CH 09 00 18 00, PLEN 18h | CCCID 7 | TTAG 1 | R2TO 0 | R2TL 4096 | rsvd.
    let want =
        hex("09 00 18 00 | 18 00 00 00 | 07 00 | 01 00 | 00 00 00 00 | 00 10 00 00 | 00 00 00 00");
    let p = Pdu::R2t(R2t {
        cccid: 7,
        ttag: 1,
        r2to: 0,
        r2tl: 4096,
    });
    let c = Codec::new(4096);
    assert_eq!(enc(&c, &p), want);
    assert_eq!(dec(&c, &want).unwrap(), p);
}

#[test]
fn c2h_term_req_matches_hand_vector() {
    // CH 03 00 18 00, PLEN 20h (24 + 8) | FES 0001 (invalid header field) | FEI 2 (HLEN) |
    // 10 reserved | the first 8 bytes of the offending header.
    let want = hex(
        "03 00 18 00 | 20 00 00 00 | 01 00 | 02 00 00 00 | 00 00 00 00 00 00 00 00 00 00 \
         | 04 00 47 00 4c 00 00 00",
    );
    let p = Pdu::C2hTermReq(TermReq {
        fes: Fes::InvalidHeaderField,
        fei: 2,
        data: Bytes::from(hex("04 00 47 00 4c 00 00 00")),
    });
    // Termination requests never carry digests.
    let c = codec(true, true);
    assert_eq!(enc(&c, &p), want);
    assert_eq!(dec(&c, &want).unwrap(), p);
}

// --------------------------------------------------------------------------- round trips

fn every_pdu() -> Vec<Pdu> {
    let mut cqe = Cqe::new(0xbeef, Status::COMPARE_FAILURE);
    cqe.dnr = true;
    cqe.more = true;
    cqe.crd = 2;
    cqe.phase = true;
    cqe.dw1 = 0x1234_5678;
    vec![
        Pdu::IcReq(IcReq {
            pfv: 0,
            hpda: 31,
            hdgst: false,
            ddgst: true,
            maxr2t: 7,
        }),
        Pdu::IcResp(IcResp {
            pfv: 0,
            cpda: 1,
            hdgst: true,
            ddgst: true,
            maxh2cdata: 131_072,
        }),
        Pdu::H2cTermReq(TermReq {
            fes: Fes::HeaderDigestError,
            fei: 0,
            data: Bytes::new(),
        }),
        Pdu::C2hTermReq(TermReq {
            fes: Fes::UnsupportedParameter,
            fei: 10,
            data: Bytes::from(vec![0xab; 128]),
        }),
        Pdu::CapsuleCmd(CapsuleCmd {
            sqe: Sqe::new(0x02, 9, Sgl::Transport { length: 65536 }),
            data: Bytes::new(),
        }),
        Pdu::CapsuleCmd(CapsuleCmd {
            sqe: sqe_write_in_capsule(10, 1000),
            data: Bytes::from(vec![0x5a; 1000]),
        }),
        Pdu::CapsuleResp(CapsuleResp { cqe }),
        Pdu::H2cData(H2cData {
            cccid: 1,
            ttag: 0xffff,
            datao: 8192,
            last: false,
            data: Bytes::from(vec![7; 4097]),
        }),
        Pdu::C2hData(C2hData {
            cccid: 2,
            datao: 0,
            last: true,
            success: false,
            data: Bytes::from(vec![9; 3]),
        }),
        Pdu::R2t(R2t {
            cccid: 3,
            ttag: 4,
            r2to: 5,
            r2tl: 6,
        }),
    ]
}

#[test]
fn accepts_every_pdu_round_trip_under_every_digest_and_alignment() {
    for hd in [false, true] {
        for dd in [false, true] {
            for pda in [0u8, 1, 7, 31] {
                let c = Codec {
                    header_digest: hd,
                    data_digest: dd,
                    rx_pda: pda,
                    tx_pda: pda,
                    max_pdu_len: 1 << 20,
                };
                for p in every_pdu() {
                    let b = enc(&c, &p);
                    assert_eq!(c.frame(&b).unwrap(), Some(b.len()), "{p:?}");
                    assert_eq!(dec(&c, &b).unwrap(), p, "hd {hd} dd {dd} pda {pda}");
                    // PDO is a multiple of the alignment whenever there is data after a header.
                    let pdo = usize::from(b[3]);
                    if pdo != 0 {
                        assert_eq!(pdo % ((usize::from(pda) + 1) * 4), 0);
                        assert!(pdo >= usize::from(b[2]) + if hd { 4 } else { 0 });
                    }
                }
            }
        }
    }
}

/// `encode_header`, then the data, then the digest it returned: the same bytes as `encode`,
/// for every PDU under every digest and alignment (what a sender writing the payload as its
/// own buffer relies on).
#[test]
fn accepts_header_data_and_digest_written_apart_as_the_same_pdu() {
    for hd in [false, true] {
        for dd in [false, true] {
            for pda in [0u8, 3, 31] {
                let c = Codec {
                    header_digest: hd,
                    data_digest: dd,
                    rx_pda: pda,
                    tx_pda: pda,
                    max_pdu_len: 1 << 20,
                };
                for p in every_pdu() {
                    let mut apart = BytesMut::new();
                    let digest = c.encode_header(&p, &mut apart).unwrap();
                    apart.extend_from_slice(p.data());
                    if let Some(d) = digest {
                        apart.extend_from_slice(&d);
                    }
                    assert_eq!(
                        &apart[..],
                        &enc(&c, &p)[..],
                        "hd {hd} dd {dd} pda {pda} {p:?}"
                    );
                }
            }
        }
    }
}

#[test]
fn accepts_a_stream_fed_one_byte_at_a_time() {
    let c = codec(true, true);
    let mut wire = BytesMut::new();
    for p in every_pdu() {
        c.encode(&p, &mut wire).unwrap();
    }
    let wire = wire.freeze();
    let mut buf = BytesMut::new();
    let mut got = Vec::new();
    for &b in wire.iter() {
        buf.extend_from_slice(&[b]);
        let before = buf.len();
        match c.decode_from(&mut buf).unwrap() {
            Some(p) => got.push(p),
            None => {
                assert_eq!(buf.len(), before, "an incomplete PDU consumed bytes");
                assert!(c.needed(&buf).unwrap() > 0);
            }
        }
    }
    assert!(buf.is_empty());
    assert_eq!(got, every_pdu());
}

#[test]
fn frame_reports_how_much_is_missing() {
    let c = Codec::new(4096);
    let b = enc(&c, &every_pdu()[0]);
    assert_eq!(c.frame(&b[..7]).unwrap(), None);
    assert_eq!(c.needed(&b[..3]).unwrap(), 5);
    assert_eq!(c.frame(&b[..8]).unwrap(), Some(128));
    assert_eq!(c.needed(&b[..100]).unwrap(), 28);
    assert_eq!(c.needed(&b).unwrap(), 0);
}

// ------------------------------------------------------------------------------ rejects

fn r2t_bytes() -> Vec<u8> {
    enc(&Codec::new(4096), &every_pdu()[9])
}

fn h2c_bytes(c: &Codec) -> Vec<u8> {
    enc(c, &every_pdu()[7])
}

#[test]
fn rejects_reserved_pdu_type() {
    let mut b = r2t_bytes();
    b[0] = 0x08;
    let e = Codec::new(4096).frame(&b).unwrap_err();
    assert_eq!((e.fes(), e.fei()), (Some(Fes::InvalidHeaderField), 0));
    b[0] = 0x0a;
    assert_invalid_at(&Codec::new(4096), &b, 0);
}

#[test]
fn rejects_hlen_other_than_the_types() {
    let mut b = r2t_bytes();
    b[2] = 0x1c;
    assert_invalid_at(&Codec::new(4096), &b, 2);
}

#[test]
fn rejects_plen_over_the_configured_maximum_from_the_common_header_alone() {
    // A hostile PLEN is refused from 8 bytes, before anything is buffered.
    let c = Codec::new(4096);
    let ch = hex("04 00 48 48 | ff ff ff ff");
    let e = c.frame(&ch).unwrap_err();
    assert!(matches!(e, WireError::PduTooLong { .. }), "{e}");
    assert_eq!((e.fes(), e.fei()), (Some(Fes::InvalidHeaderField), 4));
    // PDUs without data have fixed limits whatever the configured maximum: an ICReq of 129
    // bytes and a termination request of 153 are refused from their common header, a 152-byte
    // termination request is framed even by a receiver whose data PDUs are limited to 128.
    let tiny = Codec::new(128);
    assert!(tiny.frame(&hex("00 00 80 00 | 81 00 00 00")).is_err());
    assert!(tiny.frame(&hex("03 00 18 00 | 99 00 00 00")).is_err());
    assert_eq!(
        tiny.frame(&hex("03 00 18 00 | 98 00 00 00")).unwrap(),
        Some(152)
    );
    assert!(tiny.frame(&hex("05 00 18 00 | 1d 00 00 00")).is_err());
    // For H2CData it is more data than MAXH2CDATA: FES 05h.
    let ch = hex("06 00 18 18 | 01 10 00 00");
    let e = Codec::new(4096).frame(&ch).unwrap_err();
    assert_eq!(e.fes(), Some(Fes::R2tLimitExceeded));
}

#[test]
fn rejects_plen_shorter_than_the_header() {
    let mut b = r2t_bytes();
    b[4] = 0x10;
    let e = Codec::new(4096).frame(&b).unwrap_err();
    assert_eq!(e.fei(), 4);
    // ... or than the header and its digest.
    let c = codec(true, false);
    let mut b = enc(&c, &every_pdu()[9]);
    b[4] = 24;
    b.truncate(24);
    assert_invalid_at(&c, &b, 4);
}

#[test]
fn rejects_pdo_beyond_plen() {
    let mut b = r2t_bytes();
    b[3] = 0x20;
    let e = Codec::new(4096).frame(&b).unwrap_err();
    assert_eq!(e.fei(), 3);
}

#[test]
fn rejects_pdo_on_pdus_without_data() {
    let mut b = r2t_bytes();
    b[3] = 0x18;
    assert_invalid_at(&Codec::new(4096), &b, 3);
    let c = Codec::new(4096);
    let mut b = enc(&c, &every_pdu()[4]); // CapsuleCmd without data
    b[3] = 0x48;
    assert_invalid_at(&c, &b, 3);
    let mut b = enc(&c, &every_pdu()[3]); // C2HTermReq
    b[3] = 0x18;
    assert_invalid_at(&c, &b, 3);
}

#[test]
fn rejects_pdo_below_the_header_and_its_digest() {
    let c = codec(true, false);
    let mut b = h2c_bytes(&c);
    assert_eq!(b[3], 28);
    b[3] = 24; // points at the header digest
               // A peer would send a header digest over the header it sent: recompute it, so that the
               // PDO check (not the digest check) is what refuses the PDU.
    let d = nvme_wire::digest::crc32c(&b[..24]).to_le_bytes();
    b[24..28].copy_from_slice(&d);
    assert_invalid_at(&c, &b, 3);
}

#[test]
fn rejects_misaligned_pdo() {
    let c = Codec {
        rx_pda: 1,
        tx_pda: 0,
        ..Codec::new(1 << 20)
    };
    // Sent with PDA 0 (PDO 24) to a receiver that asked for 8-byte alignment: 24 is a
    // multiple of 8, so it passes; 72 + 4 bytes of a capsule does not exist without a digest,
    // so use a header digest to get PDO 28, which is not.
    let c_hd = Codec {
        header_digest: true,
        ..c.clone()
    };
    let b = enc(
        &Codec {
            header_digest: true,
            ..Codec::new(1 << 20)
        },
        &every_pdu()[7],
    );
    assert_eq!(b[3], 28);
    assert_invalid_at(&c_hd, &b, 3);
    assert!(dec(&c, &enc(&Codec::new(1 << 20), &every_pdu()[7])).is_ok());
}

#[test]
fn rejects_nonzero_padding_before_the_data() {
    let c = Codec {
        rx_pda: 3,
        tx_pda: 3,
        ..Codec::new(4096)
    };
    let mut b = enc(&c, &every_pdu()[8]);
    assert_eq!(b[3], 32);
    b[30] = 1;
    assert_invalid_at(&c, &b, 3);
}

#[test]
fn rejects_flags_reserved_for_the_type() {
    let c = Codec::new(1 << 20);
    // LAST_PDU on a CapsuleCmd, SUCCESS on H2CData, anything on ICReq, bit 4 on C2HData.
    for (i, flag) in [(5usize, 0x04u8), (7, 0x08), (0, 0x01), (8, 0x10)] {
        let mut b = enc(&c, &every_pdu()[i]);
        b[1] |= flag;
        assert_invalid_at(&c, &b, 1);
    }
}

#[test]
fn rejects_success_without_last_pdu() {
    let c = Codec::new(4096);
    let mut b = enc(&c, &every_pdu()[8]);
    b[1] = 0x08;
    assert_invalid_at(&c, &b, 1);
}

#[test]
fn rejects_header_digest_flag_that_does_not_match_the_negotiation() {
    // A PDU without HDGST on a connection that negotiated it, and the reverse.
    let b = r2t_bytes();
    assert_invalid_at(&codec(true, false), &b, 1);
    let with = enc(&codec(true, false), &every_pdu()[9]);
    assert_invalid_at(&Codec::new(4096), &with, 1);
}

#[test]
fn rejects_data_digest_flag_that_does_not_match_the_negotiation() {
    let plain = h2c_bytes(&Codec::new(1 << 20));
    assert_invalid_at(&codec(false, true), &plain, 1);
    let with = h2c_bytes(&codec(false, true));
    assert_invalid_at(&Codec::new(1 << 20), &with, 1);
}

#[test]
fn rejects_data_digest_flag_on_a_capsule_without_data() {
    let c = codec(false, true);
    let mut b = enc(&c, &every_pdu()[4]);
    b[1] |= 0x02;
    assert_invalid_at(&c, &b, 1);
}

#[test]
fn rejects_header_digest_mismatch_as_fatal() {
    let c = codec(true, true);
    let mut b = h2c_bytes(&c);
    b[12] ^= 0x01; // DATAO
    let e = dec(&c, &b).unwrap_err();
    assert!(matches!(e, WireError::HeaderDigest { .. }), "{e}");
    assert_eq!(e.fes(), Some(Fes::HeaderDigestError));
    assert!(!e.stream_intact());
}

#[test]
fn rejects_data_digest_mismatch_as_a_command_error_naming_the_command() {
    let c = codec(true, true);
    let mut b = h2c_bytes(&c);
    let n = b.len();
    b[n - 10] ^= 0x80; // a data byte
    let e = dec(&c, &b).unwrap_err();
    assert!(matches!(e, WireError::DataDigest { cid: 1, .. }), "{e}");
    assert!(e.stream_intact());
    assert_eq!(e.fes(), None);
    assert_eq!(e.status(), Some(Status::TRANSIENT_TRANSPORT_ERROR));
    // In a capsule the CID comes from the SQE.
    let mut b = enc(&c, &every_pdu()[5]);
    let n = b.len();
    b[n - 5] ^= 1;
    assert!(matches!(
        dec(&c, &b).unwrap_err(),
        WireError::DataDigest { cid: 10, .. }
    ));
}

#[test]
fn rejects_header_only_pdus_with_trailing_bytes() {
    let c = Codec::new(4096);
    for i in [0usize, 1, 6, 9] {
        let mut b = enc(&c, &every_pdu()[i]);
        b.extend_from_slice(&[0; 4]);
        let plen = u32::try_from(b.len()).unwrap();
        b[4..8].copy_from_slice(&plen.to_le_bytes());
        assert_invalid_at(&c, &b, 4);
    }
}

#[test]
fn rejects_datal_that_disagrees_with_plen_or_is_zero() {
    let c = Codec::new(1 << 20);
    let mut b = h2c_bytes(&c);
    b[16] ^= 1;
    assert_invalid_at(&c, &b, 16);
    // DATAL 0 with no data at all: refused whether PDO is 0 or points at PLEN.
    let mut b =
        hex("07 00 18 00 | 18 00 00 00 | 01 00 | 00 00 | 00 00 00 00 | 00 00 00 00 | 00 00 00 00");
    assert_invalid_at(&c, &b, 3);
    b[3] = 0x18;
    assert_invalid_at(&c, &b, 4);
    // DATAL 0 with four data bytes behind it.
    b[4] = 0x1c;
    b.extend_from_slice(&[1, 2, 3, 4]);
    assert_invalid_at(&c, &b, 16);
}

#[test]
fn rejects_a_capsule_whose_pdo_leaves_no_data() {
    // PDO set and DDGSTF set but PLEN ends right after the digest: no data at all. Accepting
    // it would also break the fuzz harness's property that a decoded PDU re-encodes to the same
    // bytes (it would come back as a capsule without data).
    let c = codec(false, true);
    let mut b = enc(&c, &every_pdu()[4]); // 72 bytes, no data
    b[1] |= 0x02;
    b[3] = 72;
    b.extend_from_slice(&nvme_wire::digest::crc32c(&[]).to_le_bytes());
    b[4] = 76;
    assert_invalid_at(&c, &b, 4);
}

#[test]
fn rejects_zero_r2tl() {
    let mut b = r2t_bytes();
    b[16..20].copy_from_slice(&[0; 4]);
    assert_invalid_at(&Codec::new(4096), &b, 16);
}

#[test]
fn rejects_nonzero_reserved_bytes() {
    let c = Codec::new(1 << 20);
    // (PDU index, byte, FEI): ICReq byte 127, ICReq DGST bit 2, TermReq byte 20, H2CData
    // byte 21, C2HData byte 10, R2T byte 23.
    for (i, at, fei) in [
        (0usize, 127usize, 16u32),
        (0, 11, 11),
        (3, 20, 14),
        (7, 21, 20),
        (8, 10, 10),
        (9, 23, 20),
    ] {
        let mut b = enc(&c, &every_pdu()[i]);
        b[at] |= 0x04;
        assert_invalid_at(&c, &b, fei);
    }
}

#[test]
fn rejects_unsupported_ic_parameters_with_fes_06() {
    let c = Codec::new(4096);
    let ic = enc(&c, &every_pdu()[1]);
    for (at, v, fei) in [(8usize, 1u8, 8u32), (10, 32, 10), (13, 0, 12)] {
        let mut b = ic.clone();
        b[at] = v;
        if at == 13 {
            // MAXH2CDATA 0x0000_0000.. below 4096
            b[12..16].copy_from_slice(&4092u32.to_le_bytes());
        }
        let e = dec(&c, &b).unwrap_err();
        assert_eq!(
            (e.fes(), e.fei()),
            (Some(Fes::UnsupportedParameter), fei),
            "{e}"
        );
    }
    let mut b = ic;
    b[12..16].copy_from_slice(&4098u32.to_le_bytes()); // not a multiple of 4
    assert_eq!(
        dec(&c, &b).unwrap_err().fes(),
        Some(Fes::UnsupportedParameter)
    );
}

#[test]
fn rejects_term_req_longer_than_152_bytes_or_with_reserved_fes() {
    let c = Codec::new(4096);
    let mut b = enc(&c, &every_pdu()[3]);
    assert_eq!(b.len(), 152);
    b.push(0);
    b[4] = 153;
    assert_invalid_at(&c, &b, 4);
    let mut b = enc(&c, &every_pdu()[2]);
    b[8] = 7;
    assert_invalid_at(&c, &b, 8);
    // And the encoder will not write one.
    let long = Pdu::H2cTermReq(TermReq {
        fes: Fes::PduSequenceError,
        fei: 0,
        data: Bytes::from(vec![0; 129]),
    });
    assert!(c.to_bytes(&long).is_err());
}

#[test]
fn accepts_term_req_built_from_an_error_with_its_fes_fei_and_header() {
    let c = Codec::new(4096);
    let mut b = r2t_bytes();
    b[2] = 0x1c;
    let e = dec(&c, &b).unwrap_err();
    let t = TermReq::for_error(&e, &b).unwrap();
    assert_eq!(
        (t.fes, t.fei, &t.data[..]),
        (Fes::InvalidHeaderField, 2, &b[..])
    );
    let w = enc(&c, &Pdu::C2hTermReq(t.clone()));
    assert_eq!(dec(&c, &w).unwrap(), Pdu::C2hTermReq(t));
    // A non-fatal error has no termination request.
    let dd = WireError::DataDigest {
        pdu_type: nvme_wire::PduType::H2cData,
        cid: 1,
        expected: 0,
        got: 1,
    };
    assert!(TermReq::for_error(&dd, &b).is_none());
}

#[test]
fn rejects_decode_of_a_buffer_that_is_not_one_whole_pdu() {
    let c = Codec::new(4096);
    let b = r2t_bytes();
    assert!(matches!(dec(&c, &b[..20]), Err(WireError::Length { .. })));
    let mut long = b.clone();
    long.push(0);
    assert!(matches!(dec(&c, &long), Err(WireError::Length { .. })));
}
