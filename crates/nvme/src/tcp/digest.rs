//! NVMe/TCP digests: CRC32C, initial value all ones, final value inverted,
//! stored little-endian (NVMe/TCP 1.0 §3.6.2.4). The `crc32c` crate uses the
//! SSE4.2 / ARMv8 CRC instructions when present.

/// The CRC32C of no bytes: where [`crc32c_append`] starts a digest over data that
/// arrives in pieces (a constant, not a call per PDU).
pub const CRC32C_EMPTY: u32 = 0;

/// CRC32C of `data` as NVMe/TCP stores it.
#[inline]
pub fn crc32c(data: &[u8]) -> u32 {
    ::crc32c::crc32c(data)
}

/// Extends a running CRC32C (as returned by [`crc32c`]) with more data, for
/// digests over data that arrives in pieces.
#[inline]
pub fn crc32c_append(crc: u32, data: &[u8]) -> u32 {
    ::crc32c::crc32c_append(crc, data)
}

/// The 4 digest bytes for `data`.
#[inline]
pub fn digest_bytes(data: &[u8]) -> [u8; 4] {
    crc32c(data).to_le_bytes()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn known_vectors() {
        // RFC 3720 B.4: 32 bytes of zeros -> 0x8a9136aa; "123456789" -> 0xe3069283.
        assert_eq!(crc32c(&[0u8; 32]), 0x8a91_36aa);
        assert_eq!(crc32c(b"123456789"), 0xe306_9283);
        assert_eq!(crc32c_append(crc32c(b"1234"), b"56789"), 0xe306_9283);
        assert_eq!(crc32c(&[]), CRC32C_EMPTY);
        assert_eq!(crc32c_append(CRC32C_EMPTY, b"123456789"), 0xe306_9283);
    }
}
