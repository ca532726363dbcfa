//! The iSCSI PDU codec (RFC 7143 §11.2): [`pdu_decode`].

use bytes::BytesMut;

/// Frames PDUs out of arbitrary bytes with each digest setting and a limit chosen by the first
/// byte; see the module table for the properties.
pub fn pdu_decode(data: &[u8]) {
    use iscsi_wire::Codec;
    let Some((&sel, stream)) = data.split_first() else {
        return;
    };
    let codec = Codec {
        header_digest: sel & 1 != 0,
        data_digest: sel & 2 != 0,
        max_recv_data_segment_length: match sel >> 2 & 3 {
            0 => 512,
            1 => 8192,
            2 => 262_144,
            _ => 16_777_215,
        },
    };
    let mut buf = BytesMut::from(stream);
    // Each round consumes at least one PDU or stops, so this is bounded by the input length.
    loop {
        let before = buf.len();
        match codec.decode(&mut buf) {
            Ok(None) => {
                assert_eq!(buf.len(), before, "an incomplete PDU consumed bytes");
                break;
            }
            Ok(Some(pdu)) => {
                let used = before - buf.len();
                assert!(used >= iscsi_wire::BHS_LEN && used <= before);
                assert!(pdu.data.len() <= codec.max_recv_data_segment_length as usize);
                assert_eq!(pdu.ahs.len() % 4, 0);
                // Round trip: what we decoded encodes back to something that decodes the same.
                let mut out = BytesMut::new();
                let again = Codec {
                    max_recv_data_segment_length: 16_777_215,
                    ..codec.clone()
                };
                // Reserved or flag-dependent fields (a Data-In status without the S bit,
                // RFC 7143 §11.7.4) may be dropped on the way out, so the property is a fixed
                // point: what we write, read back and write again is byte-identical.
                if again.encode(&pdu, &mut out).is_ok() {
                    let first = out.clone();
                    let back = again
                        .decode(&mut out)
                        .expect("re-encoded PDU decodes")
                        .expect("re-encoded PDU is whole");
                    assert!(out.is_empty(), "re-encoded PDU fully consumed");
                    assert_eq!(back.header.opcode(), pdu.header.opcode());
                    assert_eq!(back.header.itt(), pdu.header.itt());
                    assert_eq!(back.ahs, pdu.ahs);
                    assert_eq!(back.data, pdu.data);
                    let mut second = BytesMut::new();
                    again.encode(&back, &mut second).expect("re-encodes");
                    assert_eq!(first, second, "encode/decode is not a fixed point");
                }
            }
            Err(e) => {
                if e.stream_intact() {
                    assert!(
                        buf.len() < before,
                        "an intact-stream error consumed the PDU"
                    );
                } else {
                    break;
                }
            }
        }
    }
}
