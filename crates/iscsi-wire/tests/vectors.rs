//! Byte-literal vectors for each PDU kind (hand-assembled from the RFC 7143 §11 field layouts),
#![allow(clippy::unwrap_used, clippy::expect_used)]
//! round trips, digests and framing edge cases.

use bytes::{Bytes, BytesMut};
use iscsi_wire::header::*;
use iscsi_wire::{Codec, Header, Opcode, Pdu, WireError, BHS_LEN};

/// Builds a BHS from (offset, bytes) patches over zeros.
fn bhs(patches: &[(usize, &[u8])]) -> [u8; BHS_LEN] {
    let mut b = [0u8; BHS_LEN];
    for (at, bytes) in patches {
        b[*at..*at + bytes.len()].copy_from_slice(bytes);
    }
    b
}

fn decode_one(codec: &Codec, wire: &[u8]) -> Pdu {
    let mut buf = BytesMut::from(wire);
    let pdu = codec.decode(&mut buf).unwrap().expect("whole PDU");
    assert!(buf.is_empty(), "trailing bytes left");
    pdu
}

fn encode(codec: &Codec, pdu: &Pdu) -> Vec<u8> {
    let mut out = BytesMut::new();
    codec.encode(pdu, &mut out).unwrap();
    out.to_vec()
}

#[test]
fn scsi_command_read10_vector() {
    // READ(10) of 8 blocks at LBA 0x1234, LUN 0, ITT 0x10, EDTL 4096, CmdSN 5, ExpStatSN 9.
    let wire = bhs(&[
        (0, &[0x01, 0xc1]), // opcode, F|R|SIMPLE
        (16, &[0, 0, 0, 0x10]),
        (20, &[0, 0, 0x10, 0]),
        (24, &[0, 0, 0, 5]),
        (28, &[0, 0, 0, 9]),
        (32, &[0x28, 0, 0, 0, 0x12, 0x34, 0, 0, 8, 0]),
    ]);
    let pdu = decode_one(&Codec::default(), &wire);
    let Header::ScsiCommand(c) = &pdu.header else {
        panic!("{:?}", pdu.header)
    };
    assert!(c.final_ && c.read && !c.write && !c.immediate);
    assert_eq!(c.attr, TaskAttr::SIMPLE);
    assert_eq!(
        (
            c.itt,
            c.expected_data_transfer_length,
            c.cmd_sn,
            c.exp_stat_sn
        ),
        (16, 4096, 5, 9)
    );
    assert_eq!(&c.cdb[..10], &[0x28, 0, 0, 0, 0x12, 0x34, 0, 0, 8, 0]);
    assert_eq!(encode(&Codec::default(), &pdu), wire.to_vec());
}

#[test]
fn scsi_command_with_immediate_data_vector() {
    let mut wire = bhs(&[
        (0, &[0x01, 0xa1]), // F|W|SIMPLE
        (5, &[0, 0, 5]),    // DataSegmentLength 5
        (8, &[0, 1, 0, 0, 0, 0, 0, 0]),
        (16, &[0xde, 0xad, 0xbe, 0xef]),
        (20, &[0, 0, 2, 0]),
        (32, &[0x2a]),
    ])
    .to_vec();
    wire.extend_from_slice(b"hello\0\0\0"); // data + 3 bytes padding
    let pdu = decode_one(&Codec::default(), &wire);
    assert_eq!(&pdu.data[..], b"hello");
    let Header::ScsiCommand(c) = &pdu.header else {
        panic!()
    };
    assert!(c.write && !c.read && c.final_);
    assert_eq!(c.lun, 0x0001_0000_0000_0000);
    assert_eq!(c.itt, 0xdead_beef);
    assert_eq!(encode(&Codec::default(), &pdu), wire);
}

#[test]
fn login_request_vector() {
    // T=1, CSG=0 (security), NSG=1 (operational), VersionMax=VersionMin=0,
    // ISID 0x400001370000, TSIH 0, CID 0, CmdSN 1 — an open-iscsi style first login PDU.
    let text = b"InitiatorName=iqn.a\0AuthMethod=None\0";
    let mut wire = bhs(&[
        (0, &[0x43, 0x81]),
        (5, &[0, 0, text.len() as u8]),
        (8, &[0x40, 0x00, 0x01, 0x37, 0x00, 0x00]),
        (24, &[0, 0, 0, 1]),
    ])
    .to_vec();
    wire.extend_from_slice(text);
    while wire.len() % 4 != 0 {
        wire.push(0);
    }
    let pdu = decode_one(&Codec::default(), &wire);
    let Header::LoginRequest(l) = &pdu.header else {
        panic!()
    };
    assert!(l.transit && !l.continue_);
    assert_eq!(
        (l.csg, l.nsg),
        (
            Stage::SECURITY_NEGOTIATION,
            Stage::LOGIN_OPERATIONAL_NEGOTIATION
        )
    );
    assert_eq!(l.isid, [0x40, 0, 1, 0x37, 0, 0]);
    assert_eq!(l.cmd_sn, 1);
    assert_eq!(iscsi_wire::text::parse(&pdu.data).unwrap().len(), 2);
    assert_eq!(encode(&Codec::default(), &pdu), wire);
}

#[test]
fn rejects_login_with_transit_and_continue() {
    let wire = bhs(&[(0, &[0x43, 0xc1])]);
    let mut buf = BytesMut::from(&wire[..]);
    let err = Codec::default().decode(&mut buf).unwrap_err();
    assert!(matches!(err, WireError::InvalidField { .. }), "{err:?}");
    assert!(err.stream_intact());
    assert_eq!(err.rejected_header(), Some(&wire));
}

#[test]
fn login_response_vector() {
    let wire = bhs(&[
        (0, &[0x23, 0x87, 0x00, 0x00]), // T, CSG=1, NSG=3
        (8, &[0x40, 0, 1, 0x37, 0, 0, 0x00, 0x05]),
        (16, &[0, 0, 0, 1]),
        (24, &[0, 0, 0, 7]),
        (28, &[0, 0, 0, 2]),
        (32, &[0, 0, 0, 0x81]),
        (36, &[0x02, 0x01]),
    ]);
    let pdu = decode_one(&Codec::default(), &wire);
    let Header::LoginResponse(l) = &pdu.header else {
        panic!()
    };
    assert_eq!(
        (l.csg, l.nsg),
        (
            Stage::LOGIN_OPERATIONAL_NEGOTIATION,
            Stage::FULL_FEATURE_PHASE
        )
    );
    assert_eq!(
        (l.tsih, l.stat_sn, l.exp_cmd_sn, l.max_cmd_sn),
        (5, 7, 2, 0x81)
    );
    assert_eq!((l.status_class, l.status_detail), (2, 1));
    assert_eq!(encode(&Codec::default(), &pdu), wire.to_vec());
}

#[test]
fn data_in_with_status_vector() {
    // Final Data-In with phase-collapsed GOOD status and an underflow residual of 512.
    let mut wire = bhs(&[
        (0, &[0x25, 0x83, 0x00, 0x00]),
        (5, &[0, 0, 4]),
        (16, &[0, 0, 0, 3]),
        (20, &[0xff, 0xff, 0xff, 0xff]),
        (24, &[0, 0, 0, 10]),
        (36, &[0, 0, 0, 2]),
        (40, &[0, 0, 0x20, 0]),
        (44, &[0, 0, 2, 0]),
    ])
    .to_vec();
    wire.extend_from_slice(&[1, 2, 3, 4]);
    let pdu = decode_one(&Codec::default(), &wire);
    let Header::DataIn(d) = &pdu.header else {
        panic!()
    };
    assert!(d.final_ && d.status_present && d.underflow && !d.overflow);
    assert_eq!(
        (d.data_sn, d.buffer_offset, d.residual_count, d.stat_sn),
        (2, 8192, 512, 10)
    );
    assert_eq!(encode(&Codec::default(), &pdu), wire);
}

#[test]
fn r2t_vector() {
    let wire = bhs(&[
        (0, &[0x31, 0x80]),
        (16, &[0, 0, 0, 9]),
        (20, &[0, 0, 0, 0x42]),
        (36, &[0, 0, 0, 1]),
        (40, &[0, 1, 0, 0]),
        (44, &[0, 4, 0, 0]),
    ]);
    let pdu = decode_one(&Codec::default(), &wire);
    let Header::R2t(r) = &pdu.header else {
        panic!()
    };
    assert_eq!((r.itt, r.ttt, r.r2t_sn), (9, 0x42, 1));
    assert_eq!(
        (r.buffer_offset, r.desired_data_transfer_length),
        (65536, 262_144)
    );
    assert_eq!(encode(&Codec::default(), &pdu), wire.to_vec());
}

#[test]
fn data_out_vector() {
    let mut wire = bhs(&[
        (0, &[0x05, 0x80]),
        (5, &[0, 0, 8]),
        (16, &[0, 0, 0, 9]),
        (20, &[0, 0, 0, 0x42]),
        (28, &[0, 0, 0, 3]),
        (36, &[0, 0, 0, 4]),
        (40, &[0, 0, 0x80, 0]),
    ])
    .to_vec();
    wire.extend_from_slice(&[9; 8]);
    let pdu = decode_one(&Codec::default(), &wire);
    let Header::DataOut(d) = &pdu.header else {
        panic!()
    };
    assert!(d.final_);
    assert_eq!(
        (d.ttt, d.exp_stat_sn, d.data_sn, d.buffer_offset),
        (0x42, 3, 4, 32768)
    );
    assert_eq!(encode(&Codec::default(), &pdu), wire);
}

#[test]
fn scsi_response_with_sense_vector() {
    let sense = [
        0u8, 18, 0x70, 0, 0x05, 0, 0, 0, 0, 10, 0, 0, 0, 0, 0x20, 0, 0, 0, 0, 0,
    ];
    let mut wire = bhs(&[
        (0, &[0x21, 0x80, 0x00, 0x02]),
        (5, &[0, 0, sense.len() as u8]),
        (16, &[0, 0, 0, 4]),
        (24, &[0, 0, 0, 11]),
        (28, &[0, 0, 0, 5]),
        (32, &[0, 0, 0, 68]),
    ])
    .to_vec();
    wire.extend_from_slice(&sense);
    let pdu = decode_one(&Codec::default(), &wire);
    let Header::ScsiResponse(r) = &pdu.header else {
        panic!()
    };
    assert_eq!(
        (r.response, r.status, r.stat_sn, r.max_cmd_sn),
        (0, 2, 11, 68)
    );
    assert_eq!(encode(&Codec::default(), &pdu), wire);
}

#[test]
fn nop_tmf_text_logout_reject_async_snack_round_trip() {
    let headers: Vec<Header> = vec![
        NopOut {
            immediate: true,
            lun: 0,
            itt: 1,
            ttt: 0xffff_ffff,
            cmd_sn: 2,
            exp_stat_sn: 3,
        }
        .into(),
        NopIn {
            itt: 0xffff_ffff,
            ttt: 5,
            stat_sn: 6,
            exp_cmd_sn: 7,
            max_cmd_sn: 8,
            lun: 0,
        }
        .into(),
        TaskMgmtRequest {
            immediate: true,
            function: TmfFunction::ABORT_TASK,
            lun: 0,
            itt: 10,
            referenced_task_tag: 4,
            cmd_sn: 5,
            exp_stat_sn: 6,
            ref_cmd_sn: 4,
            exp_data_sn: 0,
        }
        .into(),
        TaskMgmtResponse {
            response: TmfResponse::TASK_DOES_NOT_EXIST,
            itt: 10,
            stat_sn: 1,
            exp_cmd_sn: 2,
            max_cmd_sn: 3,
        }
        .into(),
        TextRequest {
            immediate: true,
            final_: true,
            continue_: false,
            lun: 0,
            itt: 2,
            ttt: 0xffff_ffff,
            cmd_sn: 1,
            exp_stat_sn: 1,
        }
        .into(),
        TextResponse {
            final_: false,
            continue_: true,
            lun: 0,
            itt: 2,
            ttt: 77,
            stat_sn: 1,
            exp_cmd_sn: 2,
            max_cmd_sn: 3,
        }
        .into(),
        LogoutRequest {
            immediate: true,
            reason: LogoutReason::CLOSE_SESSION,
            itt: 3,
            cid: 0,
            cmd_sn: 9,
            exp_stat_sn: 9,
        }
        .into(),
        LogoutResponse {
            response: 0,
            itt: 3,
            time2wait: 2,
            time2retain: 20,
            ..Default::default()
        }
        .into(),
        Reject {
            reason: RejectReason::PROTOCOL_ERROR,
            stat_sn: 4,
            ..Default::default()
        }
        .into(),
        AsyncMessage {
            async_event: 1,
            parameter1: 2,
            parameter2: 3,
            ..Default::default()
        }
        .into(),
        SnackRequest {
            snack_type: 1,
            lun: 0,
            itt: 1,
            ttt: 0,
            exp_stat_sn: 2,
            beg_run: 3,
            run_length: 4,
        }
        .into(),
    ];
    for codec in [
        Codec::default(),
        Codec {
            header_digest: true,
            data_digest: true,
            max_recv_data_segment_length: 8192,
        },
    ] {
        for h in &headers {
            let pdu = Pdu::new(h.clone(), Bytes::from_static(b"abcde"));
            let wire = encode(&codec, &pdu);
            let back = decode_one(&codec, &wire);
            assert_eq!(&back.header, h);
            assert_eq!(&back.data[..], b"abcde");
        }
    }
}

#[test]
fn tmf_request_bits() {
    let pdu = Pdu::new(
        TaskMgmtRequest {
            immediate: true,
            function: TmfFunction::LOGICAL_UNIT_RESET,
            lun: 0,
            itt: 1,
            referenced_task_tag: 0xffff_ffff,
            cmd_sn: 1,
            exp_stat_sn: 1,
            ref_cmd_sn: 0,
            exp_data_sn: 0,
        },
        Bytes::new(),
    );
    let wire = encode(&Codec::default(), &pdu);
    assert_eq!(&wire[..2], &[0x42, 0x85]);
}

#[test]
fn incomplete_input_is_not_an_error() {
    let pdu = Pdu::new(NopOut::default(), Bytes::from_static(b"xyz"));
    let wire = encode(&Codec::default(), &pdu);
    for cut in 0..wire.len() {
        let mut buf = BytesMut::from(&wire[..cut]);
        assert!(
            Codec::default().decode(&mut buf).unwrap().is_none(),
            "cut at {cut}"
        );
        assert_eq!(buf.len(), cut, "nothing consumed");
    }
}

#[test]
fn decodes_back_to_back_pdus() {
    let codec = Codec::default();
    let mut buf = BytesMut::new();
    for i in 0..5u32 {
        let pdu = Pdu::new(
            NopOut {
                itt: i,
                ..Default::default()
            },
            Bytes::from(vec![0; i as usize]),
        );
        codec.encode(&pdu, &mut buf).unwrap();
    }
    for i in 0..5u32 {
        let pdu = codec.decode(&mut buf).unwrap().unwrap();
        assert_eq!(pdu.header.itt(), i);
        assert_eq!(pdu.data.len(), i as usize);
    }
    assert!(buf.is_empty());
}

#[test]
fn rejects_data_segment_over_limit_before_buffering_it() {
    // A header claiming 16 MiB of data must be refused from the header alone.
    let wire = bhs(&[(0, &[0x01, 0x80]), (5, &[0xff, 0xff, 0xff])]);
    let mut buf = BytesMut::from(&wire[..]);
    let err = Codec::default().decode(&mut buf).unwrap_err();
    assert!(matches!(
        err,
        WireError::DataSegmentTooLong {
            len: 0xff_ffff,
            max: 8192,
            ..
        }
    ));
    assert!(!err.stream_intact());
    assert!(
        buf.capacity() < 1 << 20,
        "no buffer sized by the length field"
    );
}

#[test]
fn rejects_unknown_opcode_and_consumes_it() {
    let mut wire = bhs(&[(0, &[0x1c, 0x80]), (5, &[0, 0, 2])]).to_vec();
    wire.extend_from_slice(&[1, 2, 0, 0]);
    wire.extend_from_slice(&encode(
        &Codec::default(),
        &Pdu::new(NopOut::default(), Bytes::new()),
    ));
    let mut buf = BytesMut::from(&wire[..]);
    let err = Codec::default().decode(&mut buf).unwrap_err();
    assert!(matches!(
        err,
        WireError::UnsupportedOpcode {
            opcode: Opcode(0x1c),
            ..
        }
    ));
    assert!(err.stream_intact());
    // The next PDU is still readable.
    let next = Codec::default().decode(&mut buf).unwrap().unwrap();
    assert!(matches!(next.header, Header::NopOut(_)));
}

#[test]
fn detects_header_digest_corruption() {
    let codec = Codec {
        header_digest: true,
        data_digest: false,
        max_recv_data_segment_length: 8192,
    };
    let mut wire = encode(
        &codec,
        &Pdu::new(
            NopOut {
                itt: 5,
                ..Default::default()
            },
            Bytes::new(),
        ),
    );
    wire[20] ^= 1;
    let mut buf = BytesMut::from(&wire[..]);
    let err = codec.decode(&mut buf).unwrap_err();
    assert!(matches!(err, WireError::HeaderDigest { .. }));
    assert!(!err.stream_intact());
}

#[test]
fn detects_data_digest_corruption_and_keeps_stream() {
    let codec = Codec {
        header_digest: true,
        data_digest: true,
        max_recv_data_segment_length: 8192,
    };
    let pdu = Pdu::new(
        DataOut {
            itt: 1,
            ttt: 2,
            final_: true,
            ..dummy_data_out()
        },
        Bytes::from_static(b"12345"),
    );
    let mut wire = encode(&codec, &pdu);
    // 48 BHS + 4 HD, then data.
    wire[52] ^= 0x80;
    wire.extend_from_slice(&encode(&codec, &pdu));
    let mut buf = BytesMut::from(&wire[..]);
    let err = codec.decode(&mut buf).unwrap_err();
    assert!(matches!(err, WireError::DataDigest { .. }));
    assert!(err.stream_intact());
    assert_eq!(
        codec.decode(&mut buf).unwrap().unwrap(),
        pdu_without_raw(&codec, &pdu)
    );
}

/// `Codec::frame` reads only the lengths (RFC 7143 §11.2.1): a PDU with an undefined opcode,
/// a bad header digest and a bad data digest is framed whole and handed out raw; the errors
/// come from `Frame::decode`, which also cuts the AHS to what the caller keeps.
#[test]
fn frames_without_checking_digests_or_opcode_and_decode_checks_them() {
    let codec = Codec {
        header_digest: true,
        data_digest: true,
        max_recv_data_segment_length: 8192,
    };
    let ahs = Bytes::from_static(&[0, 5, 1, 0, 1, 2, 3, 4]);
    let pdu = Pdu::with_ahs(NopOut::default(), ahs, Bytes::from_static(b"12345"));
    let good = encode(&codec, &pdu);
    let mut bad = good.clone();
    bad[0] = 0x3d; // undefined opcode, and the header digest no longer matches
    bad[48 + 8 + 4] ^= 1; // data byte: the data digest no longer matches
    let mut wire = bad.clone();
    wire.extend_from_slice(&good);
    let mut buf = BytesMut::from(&wire[..]);
    let f = codec.frame(&mut buf).unwrap().unwrap();
    assert_eq!(f.bhs()[..], bad[..48]);
    assert_eq!(f.ahs(), &bad[48..56]);
    assert_eq!(f.data(), &bad[60..65]);
    assert_eq!(buf.len(), good.len(), "the whole bad PDU was consumed");
    assert!(matches!(f.decode(), Err(WireError::HeaderDigest { .. })));
    let f = codec.frame(&mut buf).unwrap().unwrap();
    let p = f.clone().decode_with_ahs(4).unwrap();
    assert_eq!(&p.ahs[..], &[0, 5, 1, 0]);
    assert_eq!(f.decode().unwrap(), pdu_without_raw(&codec, &pdu));
    assert!(buf.is_empty());
    assert!(codec.frame(&mut buf).unwrap().is_none());
}

fn dummy_data_out() -> DataOut {
    DataOut {
        final_: false,
        lun: 0,
        itt: 0,
        ttt: 0,
        exp_stat_sn: 0,
        data_sn: 0,
        buffer_offset: 0,
    }
}

fn pdu_without_raw(codec: &Codec, pdu: &Pdu) -> Pdu {
    decode_one(codec, &encode(codec, pdu))
}

#[test]
fn digest_is_over_padded_data_lsb_first() {
    let codec = Codec {
        header_digest: false,
        data_digest: true,
        max_recv_data_segment_length: 8192,
    };
    let pdu = Pdu::new(NopOut::default(), Bytes::from_static(b"a"));
    let wire = encode(&codec, &pdu);
    assert_eq!(wire.len(), 48 + 4 + 4);
    let crc = iscsi_wire::digest::crc32c(&[b'a', 0, 0, 0]);
    assert_eq!(&wire[52..56], &crc.to_le_bytes());
}

#[test]
fn ahs_is_carried() {
    let ahs = Bytes::from_static(&[0, 5, 1, 0, 1, 2, 3, 4]); // extended CDB AHS, 4 bytes + pad
    let pdu = Pdu::with_ahs(NopOut::default(), ahs.clone(), Bytes::new());
    let wire = encode(&Codec::default(), &pdu);
    assert_eq!(wire[4], 2);
    assert_eq!(decode_one(&Codec::default(), &wire).ahs, ahs);
}

mod props {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn arbitrary_bytes_never_panic(data in proptest::collection::vec(any::<u8>(), 0..600)) {
            let codec = Codec { header_digest: data.first() == Some(&1), data_digest: true, max_recv_data_segment_length: 512 };
            let mut buf = BytesMut::from(&data[..]);
            while let Ok(Some(_)) = codec.decode(&mut buf) {}
        }

        #[test]
        fn data_out_round_trips(itt: u32, ttt: u32, sn: u32, off: u32, f: bool,
                                data in proptest::collection::vec(any::<u8>(), 0..300),
                                hd: bool, dd: bool) {
            let codec = Codec { header_digest: hd, data_digest: dd, max_recv_data_segment_length: 8192 };
            let h = DataOut { final_: f, lun: 0, itt, ttt, exp_stat_sn: sn, data_sn: sn ^ 1, buffer_offset: off };
            let pdu = Pdu::new(h.clone(), Bytes::from(data.clone()));
            let back = decode_one(&codec, &encode(&codec, &pdu));
            prop_assert_eq!(back.header, Header::DataOut(h));
            prop_assert_eq!(&back.data[..], &data[..]);
        }
    }
}
