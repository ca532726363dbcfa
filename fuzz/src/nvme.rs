//! NVMe/TCP: the PDU codec ([`nvme_pdu`]) and the controller ([`nvme_controller`]).

use bytes::{Bytes, BytesMut};

use super::Input;

/// Frames NVMe/TCP PDUs out of arbitrary bytes with digests, PDA and PLEN limit chosen by the
/// first byte; see the module table for the properties.
pub fn nvme_pdu(data: &[u8]) {
    use nvme_wire::fabrics::{ConnectData, FabricsCommand, CONNECT_DATA_LEN, OPCODE_FABRICS};
    use nvme_wire::pdu::{Codec, Pdu, TermReq};
    let Some((&sel, stream)) = data.split_first() else {
        return;
    };
    let pda = [0u8, 1, 3, 31][usize::from(sel >> 2 & 3)];
    let codec = Codec {
        header_digest: sel & 1 != 0,
        data_digest: sel & 2 != 0,
        rx_pda: pda,
        tx_pda: pda,
        max_pdu_len: match sel >> 4 & 3 {
            0 => 128,
            1 => 8192,
            2 => 65_536 + 256,
            _ => 1 << 24,
        },
    };
    let mut buf = BytesMut::from(stream);
    // Each round consumes a whole PDU or stops, so this is bounded by the input length.
    loop {
        let before = buf.len();
        let framed = codec.frame(&buf);
        match codec.decode_from(&mut buf) {
            Ok(None) => {
                assert_eq!(buf.len(), before, "an incomplete PDU consumed bytes");
                let needed = codec.needed(&buf).expect("framed before");
                assert!(needed > 0, "a whole PDU was left undecoded");
                break;
            }
            Ok(Some(pdu)) => {
                let used = before - buf.len();
                assert_eq!(framed, Ok(Some(used)), "consumed other than PLEN");
                // Data PDUs within the configured limit, the others within their fixed ones.
                assert!(used as u64 <= u64::from(codec.max_pdu_len.max(152)));
                // What decodes re-encodes to the very same bytes.
                let original = &stream[stream.len() - before..][..used];
                let again = codec.to_bytes(&pdu).expect("a decoded PDU encodes");
                assert_eq!(&again[..], original, "re-encoding differs: {pdu:?}");
                if let Pdu::CapsuleCmd(c) = &pdu {
                    let _ = c.sqe.check_tcp(c.data.len());
                    if c.sqe.opcode == OPCODE_FABRICS {
                        if let Ok(f) = FabricsCommand::decode(&c.sqe) {
                            assert_eq!(f.to_sqe(), c.sqe, "Fabrics command round trip");
                        }
                        if c.data.len() == CONNECT_DATA_LEN {
                            if let Ok(d) = ConnectData::decode(&c.data) {
                                let b = d.encode().expect("decoded Connect data encodes");
                                assert_eq!(&b[..], &c.data[..], "Connect data round trip");
                            }
                        }
                    }
                }
            }
            Err(e) => {
                // A fatal error carries a termination request that itself round-trips.
                if let Some(fes) = e.fes() {
                    let header = &stream[stream.len() - before..];
                    let t = TermReq::for_error(&e, &header[..header.len().min(200)])
                        .expect("fatal errors have a termination request");
                    assert_eq!(t.fes, fes);
                    let w = codec
                        .to_bytes(&Pdu::C2hTermReq(t.clone()))
                        .expect("encodes");
                    assert_eq!(codec.decode(w).expect("decodes"), Pdu::C2hTermReq(t));
                    break;
                }
                assert!(
                    e.status().is_some(),
                    "non-fatal error without a status: {e}"
                );
                assert!(
                    buf.len() < before,
                    "a non-fatal error did not consume the PDU"
                );
            }
        }
    }
}

/// Drives `nvme_proto::controller::Target` with arbitrary Connects, admin and I/O commands,
/// block results in any order (or never), namespace changes, disconnects and time; see the
/// module table for the properties.
pub fn nvme_controller(data: &[u8]) {
    use std::collections::HashMap;
    use std::time::{Duration, Instant};

    use nvme_proto::controller::{
        AllowedHosts, BlockError, BlockOp, Channel, DiscoveryEntry, NamespaceConfig, Queue,
        Submitted, SubsystemConfig, Target, TargetConfig, TlsPeer, DISCOVERY_NQN,
    };
    use nvme_proto::{Command, Completion};
    use nvme_wire::entry::{Sgl, Sqe, SQE_LEN};
    use nvme_wire::fabrics::{
        Connect, ConnectData, FabricsCommand, FabricsKind, Property, PropertySet, CNTLID_DYNAMIC,
    };

    const SUBNQN: &str = "nqn.2026-01.io.ipsan:fuzz";
    const HOSTNQN: &str = "nqn.2014-08.org.nvmexpress:uuid:fuzz";
    let ns = |nsid: u32, blocks: u64, shift: u32| NamespaceConfig {
        nsid,
        size: blocks << shift,
        block_size: 1 << shift,
        nguid: [nsid as u8; 16],
        uuid: [nsid as u8 ^ 0x80; 16],
        eui64: [0; 8],
        deallocate_zeroes: nsid % 2 == 1,
        read_only: nsid == 3,
        reservations: nsid == 1,
    };
    let disc = vec![DiscoveryEntry {
        subnqn: SUBNQN.into(),
        traddr: "127.0.0.1".into(),
        trsvcid: "4420".into(),
        ipv6: false,
        portid: 1,
        treq_secure_channel: 0,
        sectype: 0,
    }];
    let cfg = TargetConfig {
        subsystems: vec![SubsystemConfig {
            nqn: SUBNQN.into(),
            serial: "FUZZ".into(),
            model: "fuzz".into(),
            namespaces: vec![ns(1, 64, 9), ns(2, 16, 12)],
            hosts: AllowedHosts::Any,
            auth_required: false,
            volatile_write_cache: true,
        }],
        discovery: disc.clone(),
        max_io_queues: 4,
        queue_size: 32,
        in_capsule_data: 8192,
        max_transfer: 16384,
        ..TargetConfig::default()
    };
    let mut t = Target::new(cfg).expect("valid configuration");
    let mut sizes: HashMap<u32, u64> = HashMap::from([(1, 64 << 9), (2, 16 << 12)]);
    let mut now = Instant::now();
    let mut queues: Vec<Queue> = Vec::new();
    // Outstanding block requests: (queue index, tag, group id); groups: id → (cid, left).
    let mut pending: Vec<(usize, u64, u64, BlockOp)> = Vec::new();
    let mut groups: HashMap<u64, (u16, usize)> = HashMap::new();
    let mut next_group = 0u64;

    let connect = |qid: u16, sqsize: u16, kato: u32, subnqn: &str, hostnqn: &str, cntlid: u16| {
        let d = ConnectData {
            hostid: [7; 16],
            cntlid,
            subnqn: subnqn.into(),
            hostnqn: hostnqn.into(),
        }
        .encode()
        .expect("valid NQNs");
        let sqe = FabricsCommand {
            cid: 1,
            flags: nvme_wire::entry::PSDT_SGL,
            sgl: Sgl::InCapsule {
                offset: 0,
                length: d.len() as u32,
            },
            kind: FabricsKind::Connect(Connect {
                recfmt: 0,
                qid,
                sqsize,
                cattr: 0,
                kato,
            }),
        }
        .to_sqe();
        Command {
            sqe,
            data: Bytes::copy_from_slice(&d),
        }
    };
    let check = |cmd: &Command, c: &Completion| {
        assert_eq!(c.cqe.cid, cmd.sqe.cid, "completion for another command");
        assert!(
            c.data.len() <= cmd.sqe.sgl.length() as usize,
            "more data than the SGL describes"
        );
    };

    let mut input = Input(data);
    let flags = input.u8();
    if flags & 1 != 0 {
        // A host's bring-up, so the fuzzer starts where the I/O paths are.
        let subnqn = if flags & 2 != 0 {
            DISCOVERY_NQN
        } else {
            SUBNQN
        };
        if let Ok((mut admin, _)) = t.connect(
            &connect(0, 31, 10_000, subnqn, HOSTNQN, CNTLID_DYNAMIC),
            now,
        ) {
            let sqe = FabricsCommand {
                cid: 2,
                flags: nvme_wire::entry::PSDT_SGL,
                sgl: Sgl::Transport { length: 0 },
                kind: FabricsKind::PropertySet(PropertySet {
                    size8: false,
                    property: Property::Cc,
                    value: 6 << 16 | 4 << 20 | 1,
                }),
            }
            .to_sqe();
            let _ = t.submit(
                &mut admin,
                Command {
                    sqe,
                    data: Bytes::new(),
                },
                now,
            );
            let cntlid = admin.cntlid();
            queues.push(admin);
            if let Ok((q, _)) = t.connect(&connect(1, 31, 0, subnqn, HOSTNQN, cntlid), now) {
                queues.push(q);
            }
        }
    }

    let mut steps = 0;
    while !input.0.is_empty() && steps < 256 {
        steps += 1;
        let action = input.u8();
        match action % 8 {
            0 | 1 => {
                let raw = input.bytes(SQE_LEN);
                let mut b = [0u8; SQE_LEN];
                b[..raw.len()].copy_from_slice(raw);
                let mut sqe = Sqe::from_bytes(&b);
                let len = usize::from(input.u8()) * 16;
                let data = Bytes::copy_from_slice(input.bytes(len));
                if action & 0x80 != 0 {
                    // Make the command well-formed for the transport, so it reaches the
                    // controller's own checks.
                    sqe.flags = nvme_wire::entry::PSDT_SGL;
                    sqe.sgl = if data.is_empty() {
                        Sgl::Transport {
                            length: u32::from(input.u16()),
                        }
                    } else {
                        Sgl::InCapsule {
                            offset: 0,
                            length: data.len() as u32,
                        }
                    };
                }
                if queues.is_empty() {
                    continue;
                }
                let qi = usize::from(input.u8()) % queues.len();
                let cmd = Command { sqe, data };
                let q = &mut queues[qi];
                let admin = q.qid() == 0;
                let r = if admin || action & 0x40 != 0 {
                    t.submit(q, cmd.clone(), now)
                } else {
                    q.submit(cmd.clone(), now)
                };
                match r {
                    Submitted::Done(c) => check(&cmd, &c),
                    Submitted::Held => assert!(admin, "an I/O command held"),
                    Submitted::Block(reqs) => {
                        assert!(!admin, "block requests from the admin queue");
                        assert!(!reqs.is_empty());
                        let g = next_group;
                        next_group += 1;
                        groups.insert(g, (cmd.sqe.cid, reqs.len()));
                        for r in reqs {
                            let size = *sizes.get(&r.nsid).expect("a namespace that exists");
                            let (off, len) = match &r.op {
                                BlockOp::Read { offset, len }
                                | BlockOp::Discard { offset, len }
                                | BlockOp::WriteZeroes { offset, len } => (*offset, *len),
                                BlockOp::Write { offset, data, .. } => (*offset, data.len() as u64),
                                BlockOp::Flush | BlockOp::Reservation(_) => (0, 0),
                            };
                            assert!(
                                off.checked_add(len).is_some_and(|e| e <= size),
                                "{r:?} beyond {size}"
                            );
                            assert!(
                                !pending.iter().any(|p| p.0 == qi && p.1 == r.tag),
                                "tag reused while outstanding"
                            );
                            pending.push((qi, r.tag, g, r.op));
                        }
                    }
                }
            }
            2 => {
                let qid = input.u16() % 6;
                let sqsize = input.u16() % 40;
                let kato = u32::from(input.u16());
                let subnqn = [SUBNQN, DISCOVERY_NQN, "nqn.unknown"][usize::from(input.u8() % 3)];
                let hostnqn = [HOSTNQN, "nqn.other"][usize::from(input.u8() % 2)];
                let cntlid = match input.u8() % 3 {
                    0 => CNTLID_DYNAMIC,
                    1 => queues.first().map_or(1, Queue::cntlid),
                    _ => input.u16(),
                };
                let cmd = connect(qid, sqsize, kato, subnqn, hostnqn, cntlid);
                // Plain TCP, or TLS keyed for some host and subsystem (TP 8011).
                let tls = match input.u8() % 3 {
                    0 => None,
                    1 => Some((hostnqn, subnqn)),
                    _ => Some((
                        [HOSTNQN, "nqn.other"][usize::from(input.u8() % 2)],
                        [SUBNQN, DISCOVERY_NQN][usize::from(input.u8() % 2)],
                    )),
                };
                let channel = Channel {
                    tls: tls.map(|(h, s)| TlsPeer {
                        hostnqn: h.into(),
                        subnqn: s.into(),
                    }),
                };
                match t.connect_on(&cmd, now, &channel) {
                    Ok((q, c)) => {
                        check(&cmd, &c);
                        assert!(c.cqe.status.is_success());
                        if let Some((h, s)) = tls {
                            assert!(
                                h == hostnqn && s == subnqn,
                                "a TLS connection keyed for {h}/{s} connected as {hostnqn}/{subnqn}"
                            );
                        }
                        queues.push(q);
                    }
                    Err(c) => {
                        check(&cmd, &c);
                        assert!(!c.cqe.status.is_success());
                    }
                }
            }
            3 => {
                // Any first command, whole.
                let raw = input.bytes(SQE_LEN);
                let mut b = [0u8; SQE_LEN];
                b[..raw.len()].copy_from_slice(raw);
                let len = usize::from(input.u16() % 1100);
                let cmd = Command {
                    sqe: Sqe::from_bytes(&b),
                    data: Bytes::copy_from_slice(input.bytes(len)),
                };
                match t.connect(&cmd, now) {
                    Ok((q, c)) => {
                        check(&cmd, &c);
                        queues.push(q);
                    }
                    Err(c) => check(&cmd, &c),
                }
            }
            4 => {
                now += Duration::from_millis(u64::from(input.u16()) * 4);
                t.handle_timeout(now);
                if let Some(next) = t.poll_timeout() {
                    assert!(next > now, "a deadline left in the past");
                }
            }
            5 if !pending.is_empty() => {
                let i = usize::from(input.u8()) % pending.len();
                let (qi, tag, g, op) = pending.swap_remove(i);
                let how = input.u8();
                let result = match how % 4 {
                    0 => Err([
                        BlockError::Media,
                        BlockError::NoSpace,
                        BlockError::OutOfRange,
                        BlockError::ReadOnly,
                        BlockError::Internal,
                    ][usize::from(how / 4) % 5]),
                    1 => {
                        let n = usize::from(input.u8());
                        Ok(Bytes::copy_from_slice(input.bytes(n)))
                    }
                    _ => Ok(match &op {
                        BlockOp::Read { len, .. } => Bytes::from(vec![0u8; *len as usize]),
                        _ => Bytes::new(),
                    }),
                };
                let c = queues[qi].block_done(tag, result);
                let entry = groups.get_mut(&g).expect("group");
                entry.1 -= 1;
                if entry.1 == 0 {
                    let (cid, _) = groups.remove(&g).expect("group");
                    let c = c.expect("the last result completes the command");
                    assert_eq!(c.cqe.cid, cid);
                } else {
                    assert!(c.is_none(), "completed before its last block result");
                }
            }
            6 => {
                let mut list = Vec::new();
                for _ in 0..input.u8() % 4 {
                    let nsid = u32::from(input.u8() % 5);
                    let n = ns(
                        nsid,
                        u64::from(input.u8() % 64),
                        [9, 12][usize::from(input.u8() % 2)],
                    );
                    list.push(n);
                }
                if t.set_namespaces(SUBNQN, list.clone()).is_ok() {
                    // Requests already handed out refer to the old table; keep their sizes.
                    for n in &list {
                        let s = sizes.entry(n.nsid).or_insert(0);
                        *s = (*s).max(n.size);
                    }
                }
                if input.u8() % 2 == 0 {
                    t.set_discovery_entries(Vec::new());
                } else {
                    t.set_discovery_entries(disc.clone());
                }
            }
            7 if !queues.is_empty() => {
                let i = usize::from(input.u8()) % queues.len();
                // Its outstanding requests are abandoned with it, as a driver drops them.
                pending.retain(|p| p.0 != i);
                for p in &mut pending {
                    if p.0 > i {
                        p.0 -= 1;
                    }
                }
                let q = queues.remove(i);
                t.disconnect(&q);
            }
            _ => {}
        }
        while let Some(e) = t.poll_event() {
            if let nvme_proto::controller::Event::AdminCompletion { completion, .. } = e {
                assert!(completion.cqe.status.is_success());
            }
        }
    }
}
