//! CRC32C digests (NVMe/TCP 1.0 §3.6.1: HDGST over the PDU header, DDGST over the PDU data;
//! the Castagnoli polynomial 0x1EDC6F41 as iSCSI uses it), hardware-accelerated by the
//! `crc32c` crate where the CPU has SSE 4.2 or ARMv8 CRC.

/// CRC32C over `data`.
#[must_use]
pub fn crc32c(data: &[u8]) -> u32 {
    ::crc32c::crc32c(data)
}

/// The four digest bytes as they appear on the wire: least significant byte first, like every
/// other NVMe/TCP field (NVMe/TCP 1.0 §3.6.1; Linux and SPDK write it little-endian).
#[must_use]
pub fn to_wire(crc: u32) -> [u8; 4] {
    crc.to_le_bytes()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn matches_known_crc32c_vectors() {
        // The CRC32C check value ("123456789" -> 0xE3069283) and RFC 3720 Appendix B.4's
        // 32 zero bytes, whose digest iSCSI also writes LSB first.
        assert_eq!(crc32c(b"123456789"), 0xe306_9283);
        assert_eq!(to_wire(crc32c(&[0u8; 32])), [0xaa, 0x36, 0x91, 0x8a]);
    }
}
