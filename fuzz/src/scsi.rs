//! The SCSI layer: CDB decoding and the LU's answers (SPC-4, SBC-4): [`cdb_dispatch`].

use std::sync::Arc;

use super::Input;

/// Builds a fresh 1 MiB RAM LU and runs one CDB on it with as much Data-Out as the CDB asks
/// for (the target's contract); see the module table.
pub fn cdb_dispatch(data: &[u8]) {
    use ipsan_scsi::lu::{LuConfig, ScsiRequest};
    use ipsan_scsi::{DataDirection, LogicalUnit, NexusId};
    let mut inp = Input(data);
    let sel = inp.u8();
    let cdb_len = [6usize, 10, 12, 16, 32][usize::from(sel % 5)];
    let cdb = inp.bytes(cdb_len).to_vec();
    let payload = inp.rest();
    // Parse on its own must not panic.
    let _ = ipsan_scsi::cdb::parse(&cdb);
    let mut cfg = LuConfig::with_serial("fuzz0001");
    cfg.block_size = if sel & 0x80 != 0 { 4096 } else { 512 };
    cfg.write_cache = sel & 0x40 != 0;
    cfg.power_on_ua = false;
    let backend: Arc<dyn ipsan_scsi::Backend> =
        Arc::new(ipsan_scsi::backend::MemBackend::new(1 << 20));
    let Ok(lu) = LogicalUnit::new(backend, cfg) else {
        return;
    };
    let info = lu.command_info(&cdb);
    // The typed command agrees with the lenient readers Seal and the metrics use, and with
    // the one opcode table.
    if let Ok(info) = &info {
        assert_eq!(info.opcode, cdb[0]);
        assert_eq!(info.extent, ipsan_scsi::cdb::extent(&cdb), "Seal's extent");
        assert_eq!(ipsan_scsi::cdb::entry(cdb[0]), Some(info.op));
        assert_eq!(info.family(), ipsan_scsi::cdb::family(&cdb));
        assert!(info.data_out_len == 0 || info.direction == DataDirection::Write);
        assert!(info.data_in_len == 0 || info.direction == DataDirection::Read);
    }
    let need = match &info {
        Ok(info) if info.direction == DataDirection::Write => info.data_out_len,
        Ok(_) => 0,
        Err(_) => 0,
    };
    // The target refuses commands over 64 MiB before collecting data; a 1 MiB LU needs less.
    if need > 4 << 20 {
        return;
    }
    let mut data_out = vec![0u8; need as usize];
    if !payload.is_empty() {
        for (i, b) in data_out.iter_mut().enumerate() {
            *b = payload[i % payload.len()];
        }
    }
    let nexus = NexusId("iqn.2026-11.org.ipsan:fuzz,i,0x800000000001".into());
    let req = ScsiRequest {
        cdb: &cdb,
        data_out: &data_out,
        nexus: &nexus,
        lun: 0,
        tailroom: false,
    };
    // A command decoded once answers as one the LU parses itself (on a twin LU: the command
    // may change what it stores).
    if let (Ok(info), Ok(twin)) = (
        &info,
        LogicalUnit::new(
            Arc::new(ipsan_scsi::backend::MemBackend::new(1 << 20)),
            lu.config().clone(),
        ),
    ) {
        let decoded = twin.execute_decoded(&req, info);
        let parsed = lu.execute(&req);
        assert_eq!(decoded, parsed, "execute_decoded and execute differ");
        return check_answer(&cdb, Some(info), &parsed);
    }
    let resp = lu.execute(&req);
    check_answer(&cdb, info.as_ref().ok(), &resp);
}

/// What every answer of the LU to `cdb` must satisfy.
fn check_answer(
    cdb: &[u8],
    info: Option<&ipsan_scsi::CommandInfo>,
    resp: &ipsan_scsi::ScsiResponse,
) {
    use ipsan_scsi::ScsiStatus;
    assert_eq!(
        resp.status == ScsiStatus::CHECK_CONDITION,
        resp.sense.is_some(),
        "CHECK CONDITION iff sense"
    );
    if let Some(s) = &resp.sense {
        let fixed = s.to_fixed();
        assert!(fixed.len() >= 18 && fixed.len() <= 252);
    }
    // Data-In is bounded by the LU and by the CDB's transfer/allocation length field.
    assert!(resp.data_in.len() <= (1 << 20) + 64 * 1024);
    if resp.status != ScsiStatus::GOOD {
        return;
    }
    if let Some(info) = info {
        assert!(
            resp.data_in.len() as u64 <= info.data_in_len,
            "opcode {:#04x}: {} bytes of Data-In over the {} the typed command allows",
            cdb[0],
            resp.data_in.len(),
            info.data_in_len
        );
    }
    if let Some(alloc) = allocation_length(cdb) {
        assert!(
            resp.data_in.len() as u64 <= alloc,
            "opcode {:#04x}: {} bytes of Data-In over the {} the CDB allows",
            cdb[0],
            resp.data_in.len(),
            alloc
        );
    }
}

/// The allocation length of the data-in commands whose field sits at a fixed place (SPC-4).
fn allocation_length(cdb: &[u8]) -> Option<u64> {
    let be = |r: std::ops::Range<usize>| {
        cdb.get(r)
            .map(|b| b.iter().fold(0u64, |a, &x| a << 8 | u64::from(x)))
    };
    match *cdb.first()? {
        // INQUIRY, MODE SENSE(10), LOG SENSE, PERSISTENT RESERVE IN: 2 bytes at 3 / 7.
        0x12 => be(3..5),
        0x5a | 0x4d | 0x5e => be(7..9),
        // MODE SENSE(6), REQUEST SENSE: 1 byte at 4.
        0x1a | 0x03 => be(4..5),
        // REPORT LUNS: 4 bytes at 6.
        0xa0 => be(6..10),
        _ => None,
    }
}
