//! Writes the seed corpus (`fuzz/corpus/<target>/`) from real PDUs, CDBs and sealed data built
//! with the project's own encoders, so the seeds stay valid as the codecs evolve.
//!
//! Run from `fuzz/`: `cargo run --example gen_corpus`.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;

use bytes::{Bytes, BytesMut};
use iscsi_wire::header::*;
use iscsi_wire::{Codec, Header, Pdu};

fn write(target: &str, name: &str, bytes: &[u8]) {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("corpus")
        .join(target);
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join(name), bytes).unwrap();
}

fn enc(codec: &Codec, pdus: &[Pdu]) -> Vec<u8> {
    let mut out = BytesMut::new();
    for p in pdus {
        codec.encode(p, &mut out).unwrap();
    }
    out.to_vec()
}

fn login(csg: Stage, nsg: Stage, transit: bool, text: &str, cmd_sn: u32) -> Pdu {
    Pdu::new(
        LoginRequest {
            transit,
            continue_: false,
            csg,
            nsg,
            version_max: 0,
            version_min: 0,
            isid: [0x80, 0, 0, 0, 0, 1],
            tsih: 0,
            itt: 1,
            cid: 0,
            cmd_sn,
            exp_stat_sn: 0,
        },
        Bytes::from(text.replace(';', "\0")),
    )
}

fn login_resp(csg: Stage, nsg: Stage, transit: bool, continue_: bool, text: &str) -> Pdu {
    Pdu::new(
        LoginResponse {
            transit,
            continue_,
            csg,
            nsg,
            version_max: 0,
            version_active: 0,
            isid: [0x80, 0, 0, 0, 0, 1],
            tsih: 1,
            itt: 0,
            stat_sn: 1,
            exp_cmd_sn: 1,
            max_cmd_sn: 64,
            status_class: 0,
            status_detail: 0,
        },
        Bytes::from(text.replace(';', "\0")),
    )
}

fn scsi(cdb: [u8; 16], write: bool, edtl: u32, data: &[u8]) -> Pdu {
    Pdu::new(
        ScsiCommand {
            immediate: false,
            final_: true,
            read: !write && edtl > 0,
            write,
            attr: TaskAttr::SIMPLE,
            lun: 0,
            itt: 5,
            expected_data_transfer_length: edtl,
            cmd_sn: 2,
            exp_stat_sn: 1,
            cdb,
        },
        Bytes::copy_from_slice(data),
    )
}

fn main() {
    let plain = Codec::default();
    let ini = "InitiatorName=iqn.2026-11.org.ipsan:fuzz-ini";
    let open_t = ipsan_fuzz::OPEN_TARGET;
    let chap_t = ipsan_fuzz::CHAP_TARGET;

    // ---- login_sm: whole login conversations, one file each.
    let direct = login(
        Stage::LOGIN_OPERATIONAL_NEGOTIATION,
        Stage::FULL_FEATURE_PHASE,
        true,
        &format!("{ini};TargetName={open_t};SessionType=Normal;MaxRecvDataSegmentLength=65536;HeaderDigest=CRC32C,None;DataDigest=None;ImmediateData=Yes;InitialR2T=No;MaxBurstLength=1048576;FirstBurstLength=262144;"),
        1,
    );
    write(
        "login_sm",
        "open-direct",
        &enc(&plain, std::slice::from_ref(&direct)),
    );
    let sec = login(
        Stage::SECURITY_NEGOTIATION,
        Stage::LOGIN_OPERATIONAL_NEGOTIATION,
        true,
        &format!("{ini};TargetName={open_t};SessionType=Normal;AuthMethod=None;"),
        1,
    );
    let op = login(
        Stage::LOGIN_OPERATIONAL_NEGOTIATION,
        Stage::FULL_FEATURE_PHASE,
        true,
        "MaxRecvDataSegmentLength=8192;ErrorRecoveryLevel=0;",
        1,
    );
    write(
        "login_sm",
        "open-two-stage",
        &enc(&plain, &[sec, op.clone()]),
    );
    let chap1 = login(
        Stage::SECURITY_NEGOTIATION,
        Stage::SECURITY_NEGOTIATION,
        false,
        &format!("{ini};TargetName={chap_t};SessionType=Normal;AuthMethod=CHAP,None;"),
        1,
    );
    let chap2 = login(
        Stage::SECURITY_NEGOTIATION,
        Stage::SECURITY_NEGOTIATION,
        false,
        "CHAP_A=7,6,5;",
        1,
    );
    let chap3 = login(
        Stage::SECURITY_NEGOTIATION,
        Stage::LOGIN_OPERATIONAL_NEGOTIATION,
        true,
        "CHAP_N=fuzz;CHAP_R=0x00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff;",
        1,
    );
    write(
        "login_sm",
        "chap-wrong-response",
        &enc(
            &plain,
            &[chap1.clone(), chap2.clone(), chap3.clone(), op.clone()],
        ),
    );
    let disc = login(
        Stage::SECURITY_NEGOTIATION,
        Stage::LOGIN_OPERATIONAL_NEGOTIATION,
        true,
        &format!("{ini};SessionType=Discovery;AuthMethod=None;"),
        1,
    );
    write(
        "login_sm",
        "discovery-noauth",
        &enc(&plain, &[disc, op.clone()]),
    );
    write(
        "login_sm",
        "out-of-order",
        &enc(&plain, &[op.clone(), chap2, chap1]),
    );

    // ---- initiator_login: selector byte (CHAP | digests | discovery), then the target's
    // Login Responses for a whole login.
    let ok_op = "MaxRecvDataSegmentLength=65536;HeaderDigest=None;DataDigest=None;MaxBurstLength=1048576;FirstBurstLength=262144;InitialR2T=Yes;ImmediateData=Yes;";
    let conv = |sel: u8, resps: &[Pdu]| {
        let mut v = vec![sel];
        v.extend(enc(&plain, resps));
        v
    };
    let sec_none = login_resp(
        Stage::SECURITY_NEGOTIATION,
        Stage::LOGIN_OPERATIONAL_NEGOTIATION,
        true,
        false,
        "AuthMethod=None;",
    );
    let op_done = login_resp(
        Stage::LOGIN_OPERATIONAL_NEGOTIATION,
        Stage::FULL_FEATURE_PHASE,
        true,
        false,
        ok_op,
    );
    write(
        "initiator_login",
        "plain",
        &conv(0, &[sec_none.clone(), op_done.clone()]),
    );
    write(
        "initiator_login",
        "discovery",
        &conv(0x10, &[sec_none.clone(), op_done.clone()]),
    );
    let op_digests = login_resp(
        Stage::LOGIN_OPERATIONAL_NEGOTIATION,
        Stage::FULL_FEATURE_PHASE,
        true,
        false,
        "MaxRecvDataSegmentLength=65536;HeaderDigest=CRC32C;DataDigest=CRC32C;",
    );
    write(
        "initiator_login",
        "digests",
        &conv(0x0c, &[sec_none.clone(), op_digests]),
    );
    let chap = [
        login_resp(Stage::SECURITY_NEGOTIATION, Stage::SECURITY_NEGOTIATION, false, false, "AuthMethod=CHAP;"),
        login_resp(
            Stage::SECURITY_NEGOTIATION,
            Stage::SECURITY_NEGOTIATION,
            false,
            false,
            "CHAP_A=7;CHAP_I=17;CHAP_C=0x00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff;",
        ),
        login_resp(Stage::SECURITY_NEGOTIATION, Stage::LOGIN_OPERATIONAL_NEGOTIATION, true, false, ""),
        op_done.clone(),
    ];
    write("initiator_login", "chap", &conv(1, &chap));
    write("initiator_login", "chap-mutual", &conv(2, &chap));
    let (a, b) = ok_op.split_at(40);
    let cont = [
        sec_none,
        login_resp(
            Stage::LOGIN_OPERATIONAL_NEGOTIATION,
            Stage::FULL_FEATURE_PHASE,
            false,
            true,
            a,
        ),
        login_resp(
            Stage::LOGIN_OPERATIONAL_NEGOTIATION,
            Stage::FULL_FEATURE_PHASE,
            true,
            false,
            b,
        ),
    ];
    write("initiator_login", "continued", &conv(0, &cont));
    write(
        "initiator_login",
        "refused",
        &conv(
            0,
            &[{
                let mut p = login_resp(
                    Stage::SECURITY_NEGOTIATION,
                    Stage::SECURITY_NEGOTIATION,
                    false,
                    false,
                    "",
                );
                if let Header::LoginResponse(h) = &mut p.header {
                    h.status_class = 2;
                    h.status_detail = 1;
                }
                p
            }],
        ),
    );

    // ---- pdu_decode: first byte selects digests/limit; then a PDU stream.
    let mut ahs = vec![0u8, 17, 1, 0];
    ahs.extend_from_slice(&[0x7f; 16]);
    let ahs = Bytes::from(ahs);
    let mut cdb = [0u8; 16];
    cdb[0] = 0x8a;
    cdb[13] = 1;
    let w16 = scsi(cdb, true, 512, &[0xa5; 512]);
    let mut r10 = [0u8; 16];
    r10[0] = 0x28;
    r10[8] = 8;
    let rd = scsi(r10, false, 4096, &[]);
    let data_out = Pdu::new(
        DataOut {
            final_: true,
            lun: 0,
            itt: 5,
            ttt: 1,
            exp_stat_sn: 1,
            data_sn: 0,
            buffer_offset: 512,
        },
        Bytes::from_static(&[0x5a; 100]),
    );
    let nop = Pdu::new(
        NopOut {
            immediate: true,
            lun: 0,
            itt: 9,
            ttt: iscsi_wire::RESERVED_TAG,
            cmd_sn: 3,
            exp_stat_sn: 1,
        },
        Bytes::from_static(b"ping"),
    );
    let text = Pdu::new(
        TextRequest {
            immediate: false,
            final_: true,
            continue_: false,
            lun: 0,
            itt: 10,
            ttt: iscsi_wire::RESERVED_TAG,
            cmd_sn: 3,
            exp_stat_sn: 1,
        },
        Bytes::from_static(b"SendTargets=All\0"),
    );
    let with_ahs = Pdu::with_ahs(
        ScsiCommand {
            immediate: false,
            final_: true,
            read: true,
            write: false,
            attr: TaskAttr::SIMPLE,
            lun: 0,
            itt: 6,
            expected_data_transfer_length: 36,
            cmd_sn: 4,
            exp_stat_sn: 1,
            cdb: [0x12, 0, 0, 0, 36, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0],
        },
        ahs,
        Bytes::new(),
    );
    let logout = Pdu::new(
        LogoutRequest {
            immediate: true,
            reason: LogoutReason::CLOSE_SESSION,
            itt: 11,
            cid: 0,
            cmd_sn: 5,
            exp_stat_sn: 1,
        },
        Bytes::new(),
    );
    let stream = [direct, w16, rd, data_out, nop, text, with_ahs, logout];
    for (sel, name) in [(1u8 << 2, "plain"), (3 | 2 << 2, "digests")] {
        let codec = Codec {
            header_digest: sel & 1 != 0,
            data_digest: sel & 2 != 0,
            max_recv_data_segment_length: 262_144,
        };
        let mut v = vec![sel];
        v.extend(enc(&codec, &stream));
        write("pdu_decode", &format!("stream-{name}"), &v);
    }

    // ---- text_negotiate: operational keys as initiators send them.
    write("text_negotiate", "operational", b"HeaderDigest=CRC32C,None\0DataDigest=None\0MaxRecvDataSegmentLength=262144\0MaxBurstLength=16776192\0FirstBurstLength=262144\0ImmediateData=Yes\0InitialR2T=No\0MaxOutstandingR2T=8\0ErrorRecoveryLevel=0\0DefaultTime2Wait=2\0DefaultTime2Retain=0\0IFMarker=No\0OFMarker=No\0DataPDUInOrder=Yes\0DataSequenceInOrder=Yes\0");
    write("text_negotiate", "security", b"InitiatorName=iqn.2026-11.org.ipsan:x\0TargetName=iqn.2026-11.org.ipsan:y\0SessionType=Normal\0AuthMethod=CHAP,None\0CHAP_A=8,7,5\0X-org.ipsan.seal=aes256gcm\0");
    write("text_negotiate", "hex-and-odd", b"MaxBurstLength=0x1000\0FirstBurstLength=0x10000000\0MaxRecvDataSegmentLength=511\0HeaderDigest=\0");

    // ---- cdb_dispatch: selector byte (len index | block size | cache), CDB, payload.
    let cdbs: &[(&str, u8, &[u8], &[u8])] = &[
        ("inquiry", 0, &[0x12, 0, 0, 0, 0xff, 0], &[]),
        ("inquiry-vpd83", 0, &[0x12, 1, 0x83, 0, 0xff, 0], &[]),
        ("read10", 1, &[0x28, 0, 0, 0, 0, 8, 0, 0, 4, 0], &[]),
        (
            "write16-fua",
            3,
            &[0x8a, 8, 0, 0, 0, 0, 0, 0, 0, 16, 0, 0, 0, 2, 0, 0],
            &[0xde, 0xad],
        ),
        ("sync-cache10", 1, &[0x35, 0, 0, 0, 0, 0, 0, 0, 0, 0], &[]),
        (
            "report-luns",
            2,
            &[0xa0, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0],
            &[],
        ),
        (
            "mode-sense10",
            1,
            &[0x5a, 0, 0x3f, 0, 0, 0, 0, 0x10, 0, 0],
            &[],
        ),
        (
            "unmap",
            1,
            &[0x42, 0, 0, 0, 0, 0, 0, 0, 24, 0],
            &[
                0, 22, 0, 16, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 8, 0, 0, 0, 0,
            ],
        ),
        (
            "write-same16",
            3,
            &[0x93, 8, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 64, 0, 0],
            &[0x11],
        ),
        (
            "read-capacity16",
            3,
            &[0x9e, 0x10, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 32, 0, 0],
            &[],
        ),
        (
            "caw",
            3,
            &[0x89, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0],
            &[0],
        ),
        ("pr-in", 1, &[0x5e, 0, 0, 0, 0, 0, 0, 0, 64, 0], &[]),
    ];
    for (name, sel, cdb, payload) in cdbs {
        let mut v = vec![*sel];
        v.extend_from_slice(cdb);
        v.extend_from_slice(payload);
        write("cdb_dispatch", name, &v);
    }

    // ---- seal_open: selector, binding (lun, lba, blocks, itt), mode, offset, body.
    let (init, _t) = ipsan_fuzz::seal_pair(ipsan_seal::Cipher::Aes256Gcm, 512).unwrap();
    let b = ipsan_seal::Binding {
        lun: 0,
        lba: 8,
        blocks: 2,
        opcode: 0x8a,
        task_tag: 77,
    };
    let sealed = init.seal(&b, BytesMut::from(&[0x42u8; 1024][..])).unwrap();
    for mode in 0u8..4 {
        let mut v = vec![0u8, 0, 0, 0, 0, 8, 2, 0, 0, 0, 77, mode, 0, 100];
        v.extend_from_slice(&sealed);
        write("seal_open", &format!("sealed-mode{mode}"), &v);
    }

    // ---- seal_record: selector, mode, offset, then PDUs (BHS, data length, data).
    let pdus: Vec<[u8; 48]> = [0x01u8, 0x05, 0x21, 0x20, 0x25]
        .iter()
        .map(|&op| {
            let mut b = [0u8; 48];
            b[0] = op;
            b[1] = 0x80;
            b[16..20].copy_from_slice(&7u32.to_be_bytes());
            b
        })
        .collect();
    for mode in 0u8..5 {
        let mut v = vec![mode % 3, mode, 0, 3];
        for b in &pdus {
            v.extend_from_slice(b);
            v.push(20);
            v.extend_from_slice(&[0x5a; 20]);
        }
        write("seal_record", &format!("stream-mode{mode}"), &v);
    }

    // ---- seal_login: a real initiator offer (another secret) and a confirmation to the
    // target; the genuine answer, one edit of it, and a made-up answer to the initiator.
    {
        use ipsan_seal::{Cipher, Psk, SealOffer, SessionIds};
        let ids = SessionIds {
            initiator_name: "iqn.2026-11.org.ipsan:fuzz-i".into(),
            target_name: "iqn.2026-11.org.ipsan:fuzz-t".into(),
            isid: [0x80, 0, 0, 0, 0, 1],
        };
        let o = SealOffer::new(
            vec![Cipher::Aes256Gcm, Cipher::ChaCha20Poly1305],
            65536,
            Psk::new(b"a guess of the pre-shared secret".to_vec()).unwrap(),
            ids,
        )
        .unwrap();
        let text = |keys: &[(String, String)]| -> Vec<u8> {
            keys.iter()
                .flat_map(|(k, v)| format!("{k}={v}\0").into_bytes())
                .collect()
        };
        for (name, sel) in [("target-allowed", 2u8), ("target-required", 4)] {
            let mut v = vec![sel];
            v.extend_from_slice(&text(&o.keys()));
            v.push(0xff);
            v.extend_from_slice(
                format!("X-org.ipsan.SealConfirm=0x{}\0", "00".repeat(32)).as_bytes(),
            );
            write("seal_login", name, &v);
        }
        let mut identity = vec![2u8];
        identity.extend_from_slice(&text(&o.keys()).into_iter().collect::<Vec<u8>>());
        let share = format!("X-org.ipsan.SealShare=0x{}", "00".repeat(32));
        let mut t = String::from_utf8(identity[1..].to_vec()).unwrap();
        let start = t.find("X-org.ipsan.SealShare=").unwrap();
        t.replace_range(start..start + share.len(), &share);
        identity.truncate(1);
        identity.extend_from_slice(t.as_bytes());
        write("seal_login", "target-identity-share", &identity);
        write("seal_login", "initiator-genuine", &[1]);
        write("seal_login", "initiator-one-edit", &[3, 0, 40, b'1']);
        let mut made_up = vec![9u8];
        made_up.extend_from_slice(b"X-org.ipsan.Seal=aes-256-gcm\0X-org.ipsan.SealChunk=65536\0");
        write("seal_login", "initiator-made-up", &made_up);
    }

    // ---- wan_model: Aiken et al.'s pathologies (2.7 % loss, 2 % reorder, 0.02 % corruption)
    // with a rate limit and a queue, then a packet train.
    let mut v = vec![
        1u8, // Bernoulli
        7,   // p ≈ 2.7 %
        100, // queue 101 packets
        0x03, 0xe8, // 10 ms delay
        0x00, 0x64, // 100 us jitter
        10,   // reorder ≈ 2 %
        0x03, 0xe8, // 1 ms gap
        0,    // corrupt (rare via fuzzing)
        1,    // duplicate
        0, 0x98, 0x96, 0x80, // 10 Mbyte/s
        0, 0, 0, 42, // seed
    ];
    for i in 0..200u16 {
        v.push((i % 7) as u8);
        v.extend_from_slice(&(1400 + i % 100).to_be_bytes());
        v.push(i as u8);
    }
    write("wan_model", "aiken-train", &v);
    write(
        "wan_model",
        "gilbert",
        &[
            2, 5, 60, 255, 10, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 0, 40, 3, 0,
            40, 4,
        ],
    );
    println!("corpus written under {}/corpus", env!("CARGO_MANIFEST_DIR"));
}
