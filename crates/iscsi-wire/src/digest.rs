//! CRC32C digests (RFC 7143 §13.1, polynomial 0x1EDC6F41), hardware-accelerated by the
//! `crc32c` crate where the CPU has SSE 4.2 or ARMv8 CRC.

/// CRC32C over `data`.
#[must_use]
pub fn crc32c(data: &[u8]) -> u32 {
    ::crc32c::crc32c(data)
}

/// CRC32C continued over several pieces, as for a data segment followed by its padding.
#[must_use]
pub fn crc32c_append(crc: u32, data: &[u8]) -> u32 {
    ::crc32c::crc32c_append(crc, data)
}

/// The four digest bytes as they appear on the wire: iSCSI sends the CRC least significant
/// byte first (RFC 7143 §13.1, and the examples of RFC 3720 Appendix B.4).
#[must_use]
pub fn to_wire(crc: u32) -> [u8; 4] {
    crc.to_le_bytes()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn matches_rfc3720_b4_vectors() {
        // RFC 3720 Appendix B.4 (carried into RFC 7143 by reference): 32 bytes of zeros,
        // 32 bytes of ones, an incrementing and a decrementing sequence.
        assert_eq!(to_wire(crc32c(&[0u8; 32])), [0xaa, 0x36, 0x91, 0x8a]);
        assert_eq!(to_wire(crc32c(&[0xffu8; 32])), [0x43, 0xab, 0xa8, 0x62]);
        let inc: Vec<u8> = (0u8..32).collect();
        assert_eq!(to_wire(crc32c(&inc)), [0x4e, 0x79, 0xdd, 0x46]);
        let dec: Vec<u8> = (0u8..32).rev().collect();
        assert_eq!(to_wire(crc32c(&dec)), [0x5c, 0xdb, 0x3f, 0x11]);
    }

    #[test]
    fn append_equals_whole() {
        let data: Vec<u8> = (0..1000u32).map(|i| (i * 7) as u8).collect();
        let (a, b) = data.split_at(333);
        assert_eq!(crc32c_append(crc32c(a), b), crc32c(&data));
    }
}
