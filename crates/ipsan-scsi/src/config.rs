//! What a logical unit is configured as ([`LuConfig`], [`Limits`]) and what the SPC
//! handlers (`inquiry`, `mode`, `opcodes`) may read and change of the unit that calls them
//! ([`Unit`]). Below both: the handlers take a `&dyn Unit` instead of the `LogicalUnit` that
//! dispatches to them, so `lu` → handler is the only direction.

use crate::response::NexusId;
use crate::sense::Sense;

/// Static description of a logical unit.
#[derive(Clone, Debug)]
pub struct LuConfig {
    /// Logical block size: 512 or 4096.
    pub block_size: u32,
    /// T10 vendor identification (8 ASCII chars used), e.g. `IPSAN`.
    pub vendor: String,
    /// Product identification (16 chars used).
    pub product: String,
    /// Product revision level (4 chars used).
    pub revision: String,
    /// Unit serial number (VPD 80h), printable ASCII.
    pub serial: String,
    /// 16-byte NAA IEEE Registered Extended designator (VPD 83h); the top nibble is forced
    /// to 6h.
    pub device_id: [u8; 16],
    /// Advertise thin provisioning (LBPME, UNMAP, WRITE SAME with UNMAP) when the backend
    /// can deallocate.
    pub thin_provisioning: bool,
    /// Volatile write cache enabled (caching mode page WCE). With `false` every write is
    /// flushed before GOOD.
    pub write_cache: bool,
    /// Reject writes with DATA PROTECT / WRITE PROTECTED.
    pub read_only: bool,
    /// Extra designation descriptors for VPD 83h (complete descriptors, e.g. from
    /// [`crate::inquiry::target_port_designator`]) — the target adds port identifiers here.
    pub extra_designators: Vec<Vec<u8>>,
    /// Report POWER ON OCCURRED (29h/01h) to each I_T nexus on its first command (SAM-5).
    pub power_on_ua: bool,
    /// The RELATIVE TARGET PORT IDENTIFIER of the port commands arrive through: part of
    /// the I_T nexus reservations are kept for (two targets serving one shared image are two
    /// ports of one device).
    pub relative_port: u16,
}

impl LuConfig {
    /// Defaults for an LU with the given serial number: 512-byte blocks, vendor `IPSAN`,
    /// thin provisioning and write cache on, device id derived from the serial.
    pub fn with_serial(serial: &str) -> Self {
        Self {
            block_size: 512,
            vendor: "IPSAN".into(),
            product: "ipsan disk".into(),
            revision: "0001".into(),
            serial: serial.into(),
            device_id: device_id_from(serial.as_bytes()),
            thin_provisioning: true,
            write_cache: true,
            read_only: false,
            extra_designators: Vec::new(),
            power_on_ua: false,
            relative_port: 1,
        }
    }
}

/// Limits advertised in the Block Limits VPD page (SBC-4 §6.6.4) and enforced here.
#[derive(Clone, Copy, Debug)]
pub struct Limits {
    /// MAXIMUM TRANSFER LENGTH in blocks.
    pub max_transfer: u32,
    /// OPTIMAL TRANSFER LENGTH in blocks: see [`crate::lu::optimal_transfer`].
    pub opt_transfer: u32,
    /// MAXIMUM COMPARE AND WRITE LENGTH in blocks.
    pub max_compare_and_write: u8,
    /// MAXIMUM UNMAP LBA COUNT.
    pub max_unmap_lba: u32,
    /// MAXIMUM UNMAP BLOCK DESCRIPTOR COUNT.
    pub max_unmap_descriptors: u32,
    /// OPTIMAL UNMAP GRANULARITY in blocks.
    pub unmap_granularity: u32,
    /// MAXIMUM WRITE SAME LENGTH in blocks.
    pub max_write_same: u64,
    /// OPTIMAL TRANSFER LENGTH GRANULARITY in blocks.
    pub opt_granularity: u16,
}

/// A 16-byte NAA 6h (IEEE Registered Extended) identifier derived from `seed` with 128-bit
/// FNV-1a: stable for a given serial, not globally registered.
pub fn device_id_from(seed: &[u8]) -> [u8; 16] {
    let mut h: u128 = 0x6c62272e07bb014262b821756295c58d;
    for &b in seed {
        h ^= u128::from(b);
        h = h.wrapping_mul(0x0000000001000000000000000000013B);
    }
    let mut id = h.to_be_bytes();
    id[0] = 0x60 | (id[0] & 0x0F);
    id
}

/// What the SPC handlers read and change of the logical unit that calls them; `LogicalUnit`
/// implements it (`lu.rs`).
pub trait Unit {
    /// The unit's static description.
    fn config(&self) -> &LuConfig;
    /// The Block Limits it advertises and enforces.
    fn limits(&self) -> Limits;
    /// Whether the unit is thin provisioned (UNMAP, LBPRZ).
    fn thin(&self) -> bool;
    /// Capacity in logical blocks.
    fn num_blocks(&self) -> u64;
    /// Logical block size in bytes.
    fn block_size(&self) -> u32;
    /// The current WCE (caching mode page).
    fn write_cache(&self) -> bool;
    /// Whether reservations are refused (a shared store without a shared record).
    fn refuses_reservations(&self) -> bool;
    /// Sets WCE as MODE SELECT through `by` asks: flushes first when turning the cache off,
    /// then reports MODE PARAMETERS CHANGED to every other nexus (SPC-4 §6.9).
    fn change_write_cache(&self, wce: bool, by: &NexusId) -> Result<(), Sense>;
}
