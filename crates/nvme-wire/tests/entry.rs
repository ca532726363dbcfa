//! Submission/completion queue entries and Fabrics commands: byte-exact vectors derived by hand
//! from NVMe Base 2.0 §4.2/§4.6 and NVMe over Fabrics 1.1 §3, round trips, and every
//! validation rule.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use nvme_wire::entry::{Cqe, Sgl, Sqe, Status, SQE_LEN};
use nvme_wire::fabrics::{
    Auth, Connect, ConnectData, ConnectResponse, FabricsCommand, FabricsKind, Property,
    PropertyGet, PropertySet, CNTLID_DYNAMIC,
};
use nvme_wire::WireError;

fn hex(s: &str) -> Vec<u8> {
    let s: String = s.chars().filter(|c| c.is_ascii_hexdigit()).collect();
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
        .collect()
}

fn sqe(b: &[u8]) -> Sqe {
    Sqe::from_bytes(b.try_into().unwrap())
}

fn status_of(e: &WireError) -> Status {
    e.status().unwrap_or_else(|| panic!("no status for {e}"))
}

#[test]
fn connect_sqe_matches_hand_vector() {
    // 7Fh Fabrics, flags 40h (SGL), CID 1, FCTYPE 01h, 19 reserved | SGL1 Transport Data
    // Block: address 0, length 1024, id 5Ah | RECFMT 0, QID 0 | SQSIZE 31, CATTR 0 |
    // KATO 30000 ms (7530h) | reserved.
    let want = hex(
        "7f 40 01 00 | 01 00 00 00 | 00 00 00 00 00 00 00 00 00 00 00 00 00 00 00 00 \
         | 00 00 00 00 00 00 00 00 | 00 04 00 00 | 00 00 00 | 5a \
         | 00 00 00 00 | 1f 00 00 00 | 30 75 00 00 | 00 00 00 00 00 00 00 00 00 00 00 00",
    );
    assert_eq!(want.len(), SQE_LEN);
    let cmd = FabricsCommand {
        cid: 1,
        flags: 0x40,
        sgl: Sgl::Transport { length: 1024 },
        kind: FabricsKind::Connect(Connect {
            recfmt: 0,
            qid: 0,
            sqsize: 31,
            cattr: 0,
            kato: 30_000,
        }),
    };
    assert_eq!(cmd.to_sqe().to_bytes().to_vec(), want);
    assert_eq!(FabricsCommand::decode(&sqe(&want)).unwrap(), cmd);
    sqe(&want).check_tcp(0).unwrap();
}

#[test]
fn property_get_and_set_sqes_match_hand_vectors() {
    // Property Get CAP: FCTYPE 04h | SGL1 transport, length 0 | ATTRIB 01h (8 bytes) |
    // OFFSET 0.
    let get = hex(
        "7f 40 02 00 | 04 00 00 00 | 00 00 00 00 00 00 00 00 00 00 00 00 00 00 00 00 \
         | 00 00 00 00 00 00 00 00 | 00 00 00 00 | 00 00 00 | 5a \
         | 01 00 00 00 | 00 00 00 00 | 00 00 00 00 00 00 00 00 00 00 00 00 00 00 00 00",
    );
    let cmd = FabricsCommand::decode(&sqe(&get)).unwrap();
    assert_eq!(
        cmd.kind,
        FabricsKind::PropertyGet(PropertyGet {
            size8: true,
            property: Property::Cap
        })
    );
    assert_eq!(cmd.to_sqe().to_bytes().to_vec(), get);
    // Property Set CC = 00460001h (EN, IOSQES 6, IOCQES 4): FCTYPE 00h | ATTRIB 0 |
    // OFFSET 14h | VALUE LE.
    let set = hex(
        "7f 40 03 00 | 00 00 00 00 | 00 00 00 00 00 00 00 00 00 00 00 00 00 00 00 00 \
         | 00 00 00 00 00 00 00 00 | 00 00 00 00 | 00 00 00 | 5a \
         | 00 00 00 00 | 14 00 00 00 | 01 00 46 00 00 00 00 00 | 00 00 00 00 00 00 00 00",
    );
    let cmd = FabricsCommand::decode(&sqe(&set)).unwrap();
    assert_eq!(
        cmd.kind,
        FabricsKind::PropertySet(PropertySet {
            size8: false,
            property: Property::Cc,
            value: 0x0046_0001
        })
    );
    assert_eq!(cmd.to_sqe().to_bytes().to_vec(), set);
    assert_eq!(Property::Cc.is_8_bytes(), Some(false));
    assert_eq!(Property::from_offset(0x1c), Property::Csts);
    assert_eq!(Property::Vs.offset(), 8);
}

#[test]
fn auth_send_sqe_matches_hand_vector() {
    // FCTYPE 05h | SGL1 in-capsule, offset 0, length 40h | byte 40 reserved, SPSP0 01h,
    // SPSP1 01h, SECP E9h | TL 40h.
    let want = hex(
        "7f 40 04 00 | 05 00 00 00 | 00 00 00 00 00 00 00 00 00 00 00 00 00 00 00 00 \
         | 00 00 00 00 00 00 00 00 | 40 00 00 00 | 00 00 00 | 01 \
         | 00 01 01 e9 | 40 00 00 00 | 00 00 00 00 00 00 00 00 00 00 00 00 00 00 00 00",
    );
    let cmd = FabricsCommand::decode(&sqe(&want)).unwrap();
    let auth = Auth {
        secp: 0xe9,
        spsp0: 1,
        spsp1: 1,
        len: 0x40,
    };
    assert_eq!(cmd.kind, FabricsKind::AuthSend(auth));
    assert_eq!(
        cmd.sgl,
        Sgl::InCapsule {
            offset: 0,
            length: 0x40
        }
    );
    assert_eq!(cmd.to_sqe().to_bytes().to_vec(), want);
    sqe(&want).check_tcp(0x40).unwrap();
    // Receive differs in FCTYPE only.
    let mut recv = want.clone();
    recv[4] = 0x06;
    assert_eq!(
        FabricsCommand::decode(&sqe(&recv)).unwrap().kind,
        FabricsKind::AuthReceive(auth)
    );
}

#[test]
fn cqe_status_bits_match_hand_vectors() {
    // Invalid Field with DNR: SC 02h in bits 8:1, SCT 0, DNR bit 15 -> 8004h.
    let mut c = Cqe::new(0x1234, Status::INVALID_FIELD);
    c.dnr = true;
    c.sqhd = 5;
    c.sqid = 1;
    let want = hex("00 00 00 00 | 00 00 00 00 | 05 00 | 01 00 | 34 12 | 04 80");
    assert_eq!(c.to_bytes().to_vec(), want);
    assert_eq!(Cqe::from_bytes(&want.clone().try_into().unwrap()), c);
    // Compare Failure: SCT 2 (bits 11:9), SC 85h -> 0400h | 010Ah = 050Ah; phase bit 0,
    // CRD 3 (bits 13:12), More (bit 14) -> 050Bh | 3000h | 4000h = 750Bh.
    let mut c = Cqe::new(0, Status::COMPARE_FAILURE);
    c.phase = true;
    c.crd = 3;
    c.more = true;
    assert_eq!(&c.to_bytes()[14..], &[0x0b, 0x75]);
    // Fabrics: Connect Invalid Host is SCT 1, SC 84h -> 0200h | 0108h = 0308h.
    let c = Cqe::new(0, Status::CONNECT_INVALID_HOST);
    assert_eq!(&c.to_bytes()[14..], &[0x08, 0x03]);
}

#[test]
fn accepts_sqe_and_cqe_round_trips_of_every_byte() {
    // Every byte value in every position survives from_bytes/to_bytes.
    for v in [0x00u8, 0x01, 0x5a, 0x80, 0xff] {
        for i in 0..SQE_LEN {
            let mut b = [0u8; SQE_LEN];
            b[i] = v;
            b[39] = v; // the SGL id: exercise known and unknown descriptors
            assert_eq!(Sqe::from_bytes(&b).to_bytes(), b, "byte {i} = {v:#x}");
        }
        for i in 0..16 {
            let mut b = [0u8; 16];
            b[i] = v;
            assert_eq!(Cqe::from_bytes(&b).to_bytes(), b);
        }
    }
}

#[test]
fn connect_data_matches_hand_layout_and_round_trips() {
    let d = ConnectData {
        hostid: [0x11; 16],
        cntlid: CNTLID_DYNAMIC,
        subnqn: "nqn.2014-08.org.nvmexpress.discovery".into(),
        hostnqn: "nqn.2014-08.org.nvmexpress:uuid:1111".into(),
    };
    let b = d.encode().unwrap();
    assert_eq!(&b[..16], &[0x11; 16]);
    assert_eq!(&b[16..18], &[0xff, 0xff]);
    assert_eq!(&b[256..256 + 36], d.subnqn.as_bytes());
    assert_eq!(b[256 + 36], 0);
    assert_eq!(&b[512..512 + 36], d.hostnqn.as_bytes());
    assert!(b[768..].iter().all(|&x| x == 0));
    assert_eq!(ConnectData::decode(&b).unwrap(), d);
}

#[test]
fn accepts_connect_response_dw0_with_authreq() {
    let r = ConnectResponse {
        cntlid: 1,
        atr: true,
        ascr: false,
    };
    assert_eq!(r.dw0(), 0x0002_0001);
    assert_eq!(ConnectResponse::from_dw0(0x0006_0007).cntlid, 7);
    assert!(ConnectResponse::from_dw0(0x0006_0007).ascr);
}

#[test]
fn rejects_connect_data_that_is_malformed() {
    let good = ConnectData {
        hostid: [1; 16],
        cntlid: 1,
        subnqn: "nqn.a".into(),
        hostnqn: "nqn.b".into(),
    }
    .encode()
    .unwrap();
    let refused = |b: &[u8]| status_of(&ConnectData::decode(b).unwrap_err());
    // Wrong length.
    assert!(matches!(
        ConnectData::decode(&good[..1000]),
        Err(WireError::Length { .. })
    ));
    // No NUL in the SUBNQN field.
    let mut b = good;
    b[256..512].fill(b'a');
    assert_eq!(refused(&b), Status::CONNECT_INVALID_PARAMETERS);
    // Longer than 223 bytes.
    let mut b = good;
    b[512..512 + 224].fill(b'a');
    assert_eq!(refused(&b), Status::CONNECT_INVALID_PARAMETERS);
    // Empty.
    let mut b = good;
    b[256] = 0;
    b[257..261].fill(0);
    assert_eq!(refused(&b), Status::CONNECT_INVALID_PARAMETERS);
    // Bytes after the terminating NUL.
    let mut b = good;
    b[300] = b'x';
    assert_eq!(refused(&b), Status::CONNECT_INVALID_PARAMETERS);
    // Not UTF-8.
    let mut b = good;
    b[256] = 0xff;
    assert_eq!(refused(&b), Status::CONNECT_INVALID_PARAMETERS);
    // Reserved bytes.
    for at in [18usize, 255, 768, 1023] {
        let mut b = good;
        b[at] = 1;
        assert_eq!(refused(&b), Status::CONNECT_INVALID_PARAMETERS, "byte {at}");
    }
    // The encoder refuses what the decoder would.
    let too_long = ConnectData {
        hostid: [0; 16],
        cntlid: 0,
        subnqn: "a".repeat(224),
        hostnqn: "b".into(),
    };
    assert!(too_long.encode().is_err());
}

fn connect_sqe() -> Sqe {
    FabricsCommand {
        cid: 1,
        flags: 0x40,
        sgl: Sgl::Transport { length: 1024 },
        kind: FabricsKind::Connect(Connect {
            recfmt: 0,
            qid: 1,
            sqsize: 127,
            cattr: 0,
            kato: 0,
        }),
    }
    .to_sqe()
}

#[test]
fn rejects_fabrics_commands_with_reserved_fields_or_unknown_types() {
    let base = connect_sqe().to_bytes();
    let refused = |b: &[u8]| status_of(&FabricsCommand::decode(&sqe(b)).unwrap_err());
    // Unknown FCTYPE (Disconnect is not handled yet; 0x02 is reserved).
    for t in [0x02u8, 0x08, 0x7f] {
        let mut b = base;
        b[4] = t;
        assert_eq!(refused(&b), Status::INVALID_OPCODE);
    }
    // Not a Fabrics command at all.
    let mut b = base;
    b[0] = 0x06;
    assert_eq!(refused(&b), Status::INVALID_OPCODE);
    // Reserved bytes 5..24, Connect's byte 47 and bytes 52..64.
    for at in [5usize, 23, 47, 52, 63] {
        let mut b = base;
        b[at] = 1;
        assert_eq!(refused(&b), Status::INVALID_FIELD, "byte {at}");
    }
    // Property Get with a reserved ATTRIB size (2) or bits, Property Set with bytes 56..64.
    let get = FabricsCommand {
        cid: 2,
        flags: 0x40,
        sgl: Sgl::Transport { length: 0 },
        kind: FabricsKind::PropertyGet(PropertyGet {
            size8: false,
            property: Property::Vs,
        }),
    }
    .to_sqe()
    .to_bytes();
    for (at, v) in [(40usize, 2u8), (40, 0x80), (41, 1), (48, 1)] {
        let mut b = get;
        b[at] = v;
        assert_eq!(refused(&b), Status::INVALID_FIELD, "byte {at}");
    }
    let mut b = get;
    b[4] = 0x00; // Property Set
    b[56] = 1;
    assert_eq!(refused(&b), Status::INVALID_FIELD);
    // Authentication: byte 40 reserved, bytes 48..64 reserved.
    let mut auth = get;
    auth[4] = 0x05;
    auth[40..44].copy_from_slice(&[0, 1, 1, 0xe9]);
    assert!(FabricsCommand::decode(&sqe(&auth)).is_ok());
    for at in [40usize, 48, 63] {
        let mut b = auth;
        b[at] = 1;
        assert_eq!(refused(&b), Status::INVALID_FIELD, "byte {at}");
    }
}

#[test]
fn rejects_commands_nvme_tcp_cannot_carry() {
    let invalid = |s: &Sqe, icd: usize| status_of(&s.check_tcp(icd).unwrap_err());
    // PRPs (PSDT 00b) and reserved flag bits.
    let mut s = connect_sqe();
    s.flags = 0x00;
    assert_eq!(invalid(&s, 0), Status::INVALID_FIELD);
    s.flags = 0x44;
    assert_eq!(invalid(&s, 0), Status::INVALID_FIELD);
    // Fused commands are not refused by the transport check.
    s.flags = 0x41;
    s.check_tcp(0).unwrap();
    // A keyed data block descriptor (type 4) is not an NVMe/TCP descriptor.
    let mut s = connect_sqe();
    let mut raw = [0u8; 16];
    raw[15] = 0x40;
    s.sgl = Sgl::Other(raw);
    assert_eq!(invalid(&s, 0), Status::SGL_DESCRIPTOR_TYPE_INVALID);
    // A transport descriptor with an address, or with reserved bytes, is not one either.
    let mut raw = Sgl::Transport { length: 8 }.to_bytes();
    raw[0] = 1;
    assert!(matches!(Sgl::from_bytes(&raw), Sgl::Other(_)));
    let mut raw = Sgl::InCapsule {
        offset: 0,
        length: 8,
    }
    .to_bytes();
    raw[13] = 1;
    assert!(matches!(Sgl::from_bytes(&raw), Sgl::Other(_)));
    // In-capsule data beyond what the capsule carries.
    let mut s = connect_sqe();
    s.sgl = Sgl::InCapsule {
        offset: 0,
        length: 4096,
    };
    assert_eq!(invalid(&s, 1024), Status::DATA_SGL_LENGTH_INVALID);
    s.sgl = Sgl::InCapsule {
        offset: 1024,
        length: 1,
    };
    assert_eq!(invalid(&s, 1024), Status::SGL_OFFSET_INVALID);
    s.sgl = Sgl::InCapsule {
        offset: u64::MAX,
        length: 2,
    };
    assert_eq!(invalid(&s, 1024), Status::SGL_OFFSET_INVALID);
    // In-capsule data with a transport descriptor.
    let s = connect_sqe();
    assert_eq!(invalid(&s, 16), Status::DATA_SGL_LENGTH_INVALID);
}
