//! NBD wire values and the byte layouts of replies (the NBD protocol document,
//! `doc/proto.md` of the nbd project: "Newstyle negotiation", "Transmission", "Values").
//! Everything on the wire is big-endian.

/// `NBDMAGIC`: the first 8 bytes a server sends.
pub const NBDMAGIC: u64 = 0x4e42_444d_4147_4943;
/// `IHAVEOPT`: the server's newstyle magic, and the magic of every client option.
pub const IHAVEOPT: u64 = 0x4948_4156_454f_5054;
/// Magic of every option reply (fixed newstyle).
pub const OPT_REPLY_MAGIC: u64 = 0x0003_e889_0455_65a9;
/// `NBD_REQUEST_MAGIC`.
pub const REQUEST_MAGIC: u32 = 0x2560_9513;
/// `NBD_SIMPLE_REPLY_MAGIC`.
pub const SIMPLE_REPLY_MAGIC: u32 = 0x6744_6698;
/// `NBD_STRUCTURED_REPLY_MAGIC`.
pub const STRUCTURED_REPLY_MAGIC: u32 = 0x668e_33ef;

/// Bytes of a request header (magic, flags, type, cookie, offset, length).
pub const REQUEST_LEN: usize = 28;
/// Bytes of a simple reply header.
pub const SIMPLE_REPLY_LEN: usize = 16;
/// Bytes of a structured reply chunk header.
pub const CHUNK_HEADER_LEN: usize = 20;
/// Bytes of an option header after its magic (option, length).
pub const OPTION_HEADER_LEN: usize = 16;

/// Handshake flags (server, 16 bits).
pub mod handshake_flags {
    /// `NBD_FLAG_FIXED_NEWSTYLE`.
    pub const FIXED_NEWSTYLE: u16 = 1 << 0;
    /// `NBD_FLAG_NO_ZEROES`.
    pub const NO_ZEROES: u16 = 1 << 1;
}

/// Client flags (32 bits).
pub mod client_flags {
    /// `NBD_FLAG_C_FIXED_NEWSTYLE`.
    pub const FIXED_NEWSTYLE: u32 = 1 << 0;
    /// `NBD_FLAG_C_NO_ZEROES`.
    pub const NO_ZEROES: u32 = 1 << 1;
}

/// Transmission flags (16 bits).
pub mod flags {
    /// `NBD_FLAG_HAS_FLAGS`: always set.
    pub const HAS_FLAGS: u16 = 1 << 0;
    /// `NBD_FLAG_READ_ONLY`.
    pub const READ_ONLY: u16 = 1 << 1;
    /// `NBD_FLAG_SEND_FLUSH`.
    pub const SEND_FLUSH: u16 = 1 << 2;
    /// `NBD_FLAG_SEND_FUA`.
    pub const SEND_FUA: u16 = 1 << 3;
    /// `NBD_FLAG_ROTATIONAL`.
    pub const ROTATIONAL: u16 = 1 << 4;
    /// `NBD_FLAG_SEND_TRIM`.
    pub const SEND_TRIM: u16 = 1 << 5;
    /// `NBD_FLAG_SEND_WRITE_ZEROES`.
    pub const SEND_WRITE_ZEROES: u16 = 1 << 6;
    /// `NBD_FLAG_SEND_DF`.
    pub const SEND_DF: u16 = 1 << 7;
    /// `NBD_FLAG_CAN_MULTI_CONN`.
    pub const CAN_MULTI_CONN: u16 = 1 << 8;
    /// `NBD_FLAG_SEND_CACHE`.
    pub const SEND_CACHE: u16 = 1 << 10;
    /// `NBD_FLAG_SEND_FAST_ZERO`.
    pub const SEND_FAST_ZERO: u16 = 1 << 11;
}

/// Option types.
pub mod opt {
    /// `NBD_OPT_EXPORT_NAME`.
    pub const EXPORT_NAME: u32 = 1;
    /// `NBD_OPT_ABORT`.
    pub const ABORT: u32 = 2;
    /// `NBD_OPT_LIST`.
    pub const LIST: u32 = 3;
    /// `NBD_OPT_STARTTLS`.
    pub const STARTTLS: u32 = 5;
    /// `NBD_OPT_INFO`.
    pub const INFO: u32 = 6;
    /// `NBD_OPT_GO`.
    pub const GO: u32 = 7;
    /// `NBD_OPT_STRUCTURED_REPLY`.
    pub const STRUCTURED_REPLY: u32 = 8;
    /// `NBD_OPT_LIST_META_CONTEXT`.
    pub const LIST_META_CONTEXT: u32 = 9;
    /// `NBD_OPT_SET_META_CONTEXT`.
    pub const SET_META_CONTEXT: u32 = 10;
}

/// Option reply types.
pub mod rep {
    /// `NBD_REP_ACK`.
    pub const ACK: u32 = 1;
    /// `NBD_REP_SERVER`.
    pub const SERVER: u32 = 2;
    /// `NBD_REP_INFO`.
    pub const INFO: u32 = 3;
    /// `NBD_REP_ERR_UNSUP`.
    pub const ERR_UNSUP: u32 = (1 << 31) + 1;
    /// `NBD_REP_ERR_POLICY`.
    pub const ERR_POLICY: u32 = (1 << 31) + 2;
    /// `NBD_REP_ERR_INVALID`.
    pub const ERR_INVALID: u32 = (1 << 31) + 3;
    /// `NBD_REP_ERR_UNKNOWN`.
    pub const ERR_UNKNOWN: u32 = (1 << 31) + 6;
    /// `NBD_REP_ERR_TOO_BIG`.
    pub const ERR_TOO_BIG: u32 = (1 << 31) + 9;
}

/// `NBD_INFO_*` types.
pub mod info {
    /// `NBD_INFO_EXPORT`: size and transmission flags.
    pub const EXPORT: u16 = 0;
    /// `NBD_INFO_NAME`.
    pub const NAME: u16 = 1;
    /// `NBD_INFO_DESCRIPTION`.
    pub const DESCRIPTION: u16 = 2;
    /// `NBD_INFO_BLOCK_SIZE`.
    pub const BLOCK_SIZE: u16 = 3;
}

/// Request types.
pub mod cmd {
    /// `NBD_CMD_READ`.
    pub const READ: u16 = 0;
    /// `NBD_CMD_WRITE`.
    pub const WRITE: u16 = 1;
    /// `NBD_CMD_DISC`.
    pub const DISC: u16 = 2;
    /// `NBD_CMD_FLUSH`.
    pub const FLUSH: u16 = 3;
    /// `NBD_CMD_TRIM`.
    pub const TRIM: u16 = 4;
    /// `NBD_CMD_CACHE`.
    pub const CACHE: u16 = 5;
    /// `NBD_CMD_WRITE_ZEROES`.
    pub const WRITE_ZEROES: u16 = 6;
    /// `NBD_CMD_BLOCK_STATUS`.
    pub const BLOCK_STATUS: u16 = 7;
}

/// Command flags.
pub mod cmd_flags {
    /// `NBD_CMD_FLAG_FUA`.
    pub const FUA: u16 = 1 << 0;
    /// `NBD_CMD_FLAG_NO_HOLE`.
    pub const NO_HOLE: u16 = 1 << 1;
    /// `NBD_CMD_FLAG_DF`.
    pub const DF: u16 = 1 << 2;
    /// `NBD_CMD_FLAG_REQ_ONE`.
    pub const REQ_ONE: u16 = 1 << 3;
    /// `NBD_CMD_FLAG_FAST_ZERO`.
    pub const FAST_ZERO: u16 = 1 << 4;
}

/// Structured reply chunk types and flags.
pub mod chunk {
    /// `NBD_REPLY_FLAG_DONE`.
    pub const FLAG_DONE: u16 = 1 << 0;
    /// `NBD_REPLY_TYPE_NONE`.
    pub const NONE: u16 = 0;
    /// `NBD_REPLY_TYPE_OFFSET_DATA`.
    pub const OFFSET_DATA: u16 = 1;
    /// `NBD_REPLY_TYPE_ERROR`.
    pub const ERROR: u16 = (1 << 15) + 1;
}

/// Longest string the protocol allows (export names, error messages).
pub const STRING_MAX: usize = 4096;

/// A simple reply header: magic, error, cookie.
pub fn simple_reply(error: u32, cookie: u64) -> [u8; SIMPLE_REPLY_LEN] {
    let mut b = [0u8; SIMPLE_REPLY_LEN];
    b[0..4].copy_from_slice(&SIMPLE_REPLY_MAGIC.to_be_bytes());
    b[4..8].copy_from_slice(&error.to_be_bytes());
    b[8..16].copy_from_slice(&cookie.to_be_bytes());
    b
}

/// A structured reply chunk header: magic, flags, type, cookie, payload length.
pub fn chunk_header(flags: u16, kind: u16, cookie: u64, len: u32) -> [u8; CHUNK_HEADER_LEN] {
    let mut b = [0u8; CHUNK_HEADER_LEN];
    b[0..4].copy_from_slice(&STRUCTURED_REPLY_MAGIC.to_be_bytes());
    b[4..6].copy_from_slice(&flags.to_be_bytes());
    b[6..8].copy_from_slice(&kind.to_be_bytes());
    b[8..16].copy_from_slice(&cookie.to_be_bytes());
    b[16..20].copy_from_slice(&len.to_be_bytes());
    b
}

/// The header of a final `NBD_REPLY_TYPE_OFFSET_DATA` chunk carrying `len` data bytes read
/// at `offset`, the offset field included (28 bytes; the data follows).
pub fn offset_data_header(cookie: u64, offset: u64, len: u32) -> [u8; CHUNK_HEADER_LEN + 8] {
    let mut b = [0u8; CHUNK_HEADER_LEN + 8];
    b[..CHUNK_HEADER_LEN].copy_from_slice(&chunk_header(chunk::FLAG_DONE, chunk::OFFSET_DATA, cookie, len + 8));
    b[CHUNK_HEADER_LEN..].copy_from_slice(&offset.to_be_bytes());
    b
}

/// A final `NBD_REPLY_TYPE_ERROR` chunk with a message, appended to `out`.
pub fn error_chunk(out: &mut Vec<u8>, cookie: u64, error: u32, message: &str) {
    let msg = &message.as_bytes()[..message.len().min(STRING_MAX)];
    let msg_len = u16::try_from(msg.len()).unwrap_or(0);
    let len = 6 + u32::from(msg_len);
    out.extend_from_slice(&chunk_header(chunk::FLAG_DONE, chunk::ERROR, cookie, len));
    out.extend_from_slice(&error.to_be_bytes());
    out.extend_from_slice(&msg_len.to_be_bytes());
    out.extend_from_slice(&msg[..usize::from(msg_len)]);
}

/// An option reply header, appended to `out` (the payload follows).
pub fn option_reply(out: &mut Vec<u8>, option: u32, kind: u32, payload: &[u8]) {
    out.extend_from_slice(&OPT_REPLY_MAGIC.to_be_bytes());
    out.extend_from_slice(&option.to_be_bytes());
    out.extend_from_slice(&kind.to_be_bytes());
    out.extend_from_slice(&u32::try_from(payload.len()).unwrap_or(u32::MAX).to_be_bytes());
    out.extend_from_slice(payload);
}

/// Big-endian readers over a slice whose length the caller checked.
pub(crate) fn be16(b: &[u8], at: usize) -> u16 {
    u16::from_be_bytes([b[at], b[at + 1]])
}

pub(crate) fn be32(b: &[u8], at: usize) -> u32 {
    u32::from_be_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

pub(crate) fn be64(b: &[u8], at: usize) -> u64 {
    let mut v = [0u8; 8];
    v.copy_from_slice(&b[at..at + 8]);
    u64::from_be_bytes(v)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reply_layouts() {
        let s = simple_reply(5, 0x0102_0304_0506_0708);
        assert_eq!(s, [0x67, 0x44, 0x66, 0x98, 0, 0, 0, 5, 1, 2, 3, 4, 5, 6, 7, 8]);
        let h = offset_data_header(9, 4096, 512);
        assert_eq!(&h[0..4], &[0x66, 0x8e, 0x33, 0xef]);
        assert_eq!(be16(&h, 4), chunk::FLAG_DONE);
        assert_eq!(be16(&h, 6), chunk::OFFSET_DATA);
        assert_eq!(be64(&h, 8), 9);
        assert_eq!(be32(&h, 16), 520);
        assert_eq!(be64(&h, 20), 4096);
        let mut e = Vec::new();
        error_chunk(&mut e, 3, 22, "bad");
        assert_eq!(e.len(), 20 + 6 + 3);
        assert_eq!(be16(&e, 6), chunk::ERROR);
        assert_eq!(be32(&e, 16), 9);
        assert_eq!(be32(&e, 20), 22);
        assert_eq!(be16(&e, 24), 3);
        assert_eq!(&e[26..], b"bad");
    }
}
