//! Submission Queue Entry: the 64-byte command (NVMe 2.0 §4.2).
//!
//! [`Sqe`] keeps the raw bytes and offers typed accessors, so a command read
//! from the wire is never re-serialised differently from what arrived, and
//! building one is a handful of stores. Builders for the commands qpath sends
//! live beside the accessors.

use crate::ids::{Cid, Nsid};
use crate::opcode::{admin, fctype, io};
use crate::sgl::SglDescriptor;
use crate::wire::{get_u8, get_u16, get_u32, get_u64, put_u8, put_u16, put_u32, put_u64};

/// Size of a submission queue entry.
pub const SQE_SIZE: usize = 64;

/// A 64-byte submission queue entry.
#[derive(Clone, Copy, PartialEq, Eq)]
#[repr(C, align(8))]
pub struct Sqe(pub [u8; SQE_SIZE]);

const _: () = assert!(core::mem::size_of::<Sqe>() == SQE_SIZE);

impl Default for Sqe {
    fn default() -> Self {
        Sqe([0; SQE_SIZE])
    }
}

impl core::fmt::Debug for Sqe {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("Sqe")
            .field("opcode", &format_args!("{:#04x}", self.opcode()))
            .field("cid", &self.cid().0)
            .field("nsid", &self.nsid().0)
            .field("cdw10", &format_args!("{:#x}", self.cdw(10)))
            .field("cdw11", &format_args!("{:#x}", self.cdw(11)))
            .field("cdw12", &format_args!("{:#x}", self.cdw(12)))
            .field("sgl", &self.sgl())
            .finish()
    }
}

/// Flags byte bits 7:6: PSDT = 01b selects SGLs for the data pointer, which NVMe-oF requires.
pub const PSDT_SGL: u8 = 0x40;

impl Sqe {
    /// Builds an SQE from the first 64 bytes of `b` (zero-filled if `b` is shorter).
    pub fn from_bytes(b: &[u8]) -> Sqe {
        let mut s = Sqe::default();
        let n = b.len().min(SQE_SIZE);
        s.0[..n].copy_from_slice(&b[..n]);
        s
    }

    /// A zeroed command with this opcode, PSDT=SGL and no data.
    pub fn new(opcode: u8) -> Sqe {
        let mut s = Sqe::default();
        s.set_opcode(opcode);
        s.0[1] = PSDT_SGL;
        s.set_sgl(SglDescriptor::transport(0));
        s
    }

    /// Opcode (CDW0 bits 7:0).
    pub fn opcode(&self) -> u8 {
        self.0[0]
    }
    /// Sets the opcode.
    pub fn set_opcode(&mut self, v: u8) {
        self.0[0] = v;
    }
    /// Flags byte: FUSE (1:0) and PSDT (7:6).
    pub fn flags(&self) -> u8 {
        self.0[1]
    }
    /// Fused operation bits ([`crate::opcode::fuse`]).
    pub fn fuse(&self) -> u8 {
        self.0[1] & 3
    }
    /// Sets the fused operation bits ([`crate::opcode::fuse`]).
    pub fn set_fuse(&mut self, fuse: u8) {
        self.0[1] = (self.0[1] & !3) | (fuse & 3);
    }
    /// PRP or SGL for Data Transfer.
    pub fn psdt(&self) -> u8 {
        self.0[1] >> 6
    }
    /// Command identifier.
    pub fn cid(&self) -> Cid {
        Cid(get_u16(&self.0, 2))
    }
    /// Sets the command identifier.
    pub fn set_cid(&mut self, cid: Cid) {
        put_u16(&mut self.0, 2, cid.0);
    }
    /// Namespace identifier.
    pub fn nsid(&self) -> Nsid {
        Nsid(get_u32(&self.0, 4))
    }
    /// Sets the namespace identifier.
    pub fn set_nsid(&mut self, nsid: Nsid) {
        put_u32(&mut self.0, 4, nsid.0);
    }
    /// Fabrics command type (byte 4; only meaningful when the opcode is 0x7F).
    pub fn fctype(&self) -> u8 {
        get_u8(&self.0, 4)
    }
    /// Whether this is a Fabrics command.
    pub fn is_fabrics(&self) -> bool {
        self.opcode() == admin::FABRICS
    }
    /// Command dword `n` (0..=15); out of range reads 0.
    pub fn cdw(&self, n: usize) -> u32 {
        get_u32(&self.0, n * 4)
    }
    /// Sets command dword `n` (2..=15; 0 and 1 have their own setters).
    pub fn set_cdw(&mut self, n: usize, v: u32) {
        if (2..16).contains(&n) {
            put_u32(&mut self.0, n * 4, v);
        }
    }
    /// Metadata pointer.
    pub fn mptr(&self) -> u64 {
        get_u64(&self.0, 16)
    }
    /// The data pointer as an SGL descriptor.
    pub fn sgl(&self) -> SglDescriptor {
        SglDescriptor::decode(&self.0[24..40])
    }
    /// Sets the data pointer's SGL descriptor (and PSDT = SGL).
    pub fn set_sgl(&mut self, d: SglDescriptor) {
        self.0[1] = (self.0[1] & 0x3f) | PSDT_SGL;
        d.encode(&mut self.0[24..40]);
    }

    // ---- NVM I/O commands (NVM Command Set 1.0 §3.2) ----

    /// Starting LBA (CDW10-11) of Read/Write/Write Zeroes/Compare/Verify.
    pub fn slba(&self) -> u64 {
        get_u64(&self.0, 40)
    }
    /// Number of logical blocks (CDW12 bits 15:0 are 0's based).
    pub fn nlb(&self) -> u32 {
        u32::from(get_u16(&self.0, 48)) + 1
    }
    /// Force Unit Access (CDW12 bit 30).
    pub fn fua(&self) -> bool {
        self.cdw(12) & (1 << 30) != 0
    }
    /// Limited Retry (CDW12 bit 31).
    pub fn limited_retry(&self) -> bool {
        self.cdw(12) & (1 << 31) != 0
    }
    /// Write Zeroes Deallocate bit (CDW12 bit 25).
    pub fn wz_deallocate(&self) -> bool {
        self.cdw(12) & (1 << 25) != 0
    }

    /// A Read or Write of `nlb` blocks at `slba`, with data of `len` bytes
    /// described as in-capsule or transport data.
    pub fn rw(opcode: u8, cid: Cid, nsid: Nsid, slba: u64, nlb: u32, sgl: SglDescriptor) -> Sqe {
        let mut s = Sqe::new(opcode);
        s.set_cid(cid);
        s.set_nsid(nsid);
        s.set_sgl(sgl);
        put_u64(&mut s.0, 40, slba);
        put_u32(&mut s.0, 48, nlb.saturating_sub(1) & 0xffff);
        s
    }

    /// Sets or clears FUA on a Read/Write.
    pub fn set_fua(&mut self, fua: bool) {
        let v = self.cdw(12);
        self.set_cdw(12, if fua { v | (1 << 30) } else { v & !(1 << 30) });
    }

    /// A Flush of `nsid`.
    pub fn flush(cid: Cid, nsid: Nsid) -> Sqe {
        let mut s = Sqe::new(io::FLUSH);
        s.set_cid(cid);
        s.set_nsid(nsid);
        s
    }

    /// A Write Zeroes of `nlb` blocks at `slba`, optionally deallocating.
    pub fn write_zeroes(cid: Cid, nsid: Nsid, slba: u64, nlb: u32, deallocate: bool) -> Sqe {
        let mut s = Sqe::new(io::WRITE_ZEROES);
        s.set_cid(cid);
        s.set_nsid(nsid);
        put_u64(&mut s.0, 40, slba);
        let mut cdw12 = nlb.saturating_sub(1) & 0xffff;
        if deallocate {
            cdw12 |= 1 << 25;
        }
        s.set_cdw(12, cdw12);
        s
    }

    /// A Dataset Management command over `nr` ranges (data: `nr` × 16-byte ranges),
    /// with the Attribute-Deallocate bit.
    pub fn dsm_deallocate(cid: Cid, nsid: Nsid, nr: u32, sgl: SglDescriptor) -> Sqe {
        let mut s = Sqe::new(io::DATASET_MANAGEMENT);
        s.set_cid(cid);
        s.set_nsid(nsid);
        s.set_sgl(sgl);
        s.set_cdw(10, nr.saturating_sub(1) & 0xff);
        s.set_cdw(11, 1 << 2);
        s
    }

    /// A Verify of `nlb` blocks at `slba` (no data: the controller only reads them).
    pub fn verify(cid: Cid, nsid: Nsid, slba: u64, nlb: u32) -> Sqe {
        Sqe::rw(io::VERIFY, cid, nsid, slba, nlb, SglDescriptor::transport(0))
    }

    /// A Copy to `sdlba` from `nr` format 0h source ranges (data: `nr` × 32 bytes, see
    /// [`crate::copy::SourceRange`]).
    pub fn copy(cid: Cid, nsid: Nsid, sdlba: u64, nr: u32, sgl: SglDescriptor) -> Sqe {
        let mut s = Sqe::new(io::COPY);
        s.set_cid(cid);
        s.set_nsid(nsid);
        s.set_sgl(sgl);
        put_u64(&mut s.0, 40, sdlba);
        s.set_cdw(12, nr.saturating_sub(1) & 0xff);
        s
    }
    /// Copy: Starting Destination LBA (CDW10-11).
    pub fn copy_sdlba(&self) -> u64 {
        self.slba()
    }
    /// Copy: number of source ranges (CDW12 bits 7:0, 0's based).
    pub fn copy_ranges(&self) -> u32 {
        (self.cdw(12) & 0xff) + 1
    }
    /// Copy: descriptor format of the source ranges (CDW12 bits 11:8).
    pub fn copy_format(&self) -> u8 {
        ((self.cdw(12) >> 8) & 0xf) as u8
    }

    // ---- Admin commands ----

    /// Identify with this CNS, controller id and NSID, reading `len` bytes.
    pub fn identify(cid: Cid, cns: u8, nsid: Nsid, cntid: u16, csi: u8) -> Sqe {
        let mut s = Sqe::new(admin::IDENTIFY);
        s.set_cid(cid);
        s.set_nsid(nsid);
        s.set_sgl(SglDescriptor::transport(4096));
        s.set_cdw(10, u32::from(cns) | (u32::from(cntid) << 16));
        s.set_cdw(11, u32::from(csi) << 24);
        s
    }

    /// Get Log Page of `len` bytes (a multiple of 4) at byte `offset`.
    pub fn get_log_page(cid: Cid, nsid: Nsid, lid: u8, lsp: u8, rae: bool, len: u32, offset: u64) -> Sqe {
        let mut s = Sqe::new(admin::GET_LOG_PAGE);
        s.set_cid(cid);
        s.set_nsid(nsid);
        s.set_sgl(SglDescriptor::transport(len));
        let numd = (len / 4).saturating_sub(1);
        s.set_cdw(10, u32::from(lid) | (u32::from(lsp & 0x7f) << 8) | (u32::from(rae) << 15) | ((numd & 0xffff) << 16));
        s.set_cdw(11, numd >> 16);
        s.set_cdw(12, (offset & 0xffff_ffff) as u32);
        s.set_cdw(13, (offset >> 32) as u32);
        s
    }

    /// Set Features `fid` with CDW11 `value`.
    pub fn set_features(cid: Cid, fid: u8, value: u32) -> Sqe {
        let mut s = Sqe::new(admin::SET_FEATURES);
        s.set_cid(cid);
        s.set_cdw(10, u32::from(fid));
        s.set_cdw(11, value);
        s
    }

    /// Get Features `fid` (current value).
    pub fn get_features(cid: Cid, fid: u8) -> Sqe {
        let mut s = Sqe::new(admin::GET_FEATURES);
        s.set_cid(cid);
        s.set_cdw(10, u32::from(fid));
        s
    }

    /// Keep Alive.
    pub fn keep_alive(cid: Cid) -> Sqe {
        let mut s = Sqe::new(admin::KEEP_ALIVE);
        s.set_cid(cid);
        s
    }

    /// Asynchronous Event Request.
    pub fn async_event_request(cid: Cid) -> Sqe {
        let mut s = Sqe::new(admin::ASYNC_EVENT_REQUEST);
        s.set_cid(cid);
        s
    }

    /// A Fabrics command of type `fctype`.
    pub fn fabrics(cid: Cid, fctype: u8) -> Sqe {
        let mut s = Sqe::new(admin::FABRICS);
        s.set_cid(cid);
        put_u8(&mut s.0, 4, fctype);
        s
    }

    /// Whether this command is a Fabrics Connect.
    pub fn is_connect(&self) -> bool {
        self.is_fabrics() && self.fctype() == fctype::CONNECT
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sgl::SglKind;

    #[test]
    fn read_command_layout() {
        let s = Sqe::rw(io::READ, Cid(7), Nsid(1), 0x1234, 8, SglDescriptor::transport(4096));
        assert_eq!(s.opcode(), 0x02);
        assert_eq!(s.flags(), PSDT_SGL);
        assert_eq!(s.cid(), Cid(7));
        assert_eq!(s.nsid(), Nsid(1));
        assert_eq!(s.slba(), 0x1234);
        assert_eq!(s.nlb(), 8);
        assert_eq!(s.cdw(12), 7);
        assert_eq!(s.sgl().kind(), SglKind::Transport);
        assert_eq!(s.sgl().length, 4096);
        assert_eq!(s.0[39], 0x5a);
    }

    #[test]
    fn fused_and_copy_fields() {
        let mut s = Sqe::rw(io::COMPARE, Cid(2), Nsid(1), 16, 8, SglDescriptor::in_capsule(4096));
        s.set_fuse(crate::opcode::fuse::FIRST);
        assert_eq!((s.fuse(), s.psdt()), (1, 1), "FUSE beside PSDT");
        s.set_fuse(crate::opcode::fuse::SECOND);
        assert_eq!(s.flags(), PSDT_SGL | 2);
        // libnvme nvme_copy: cdw10/11 = sdlba, cdw12 = (nr - 1) | format << 8 | fua << 30.
        let mut c = Sqe::copy(Cid(3), Nsid(1), 0x1_0000_0002, 3, SglDescriptor::in_capsule(96));
        assert_eq!((c.cdw(10), c.cdw(11), c.cdw(12)), (2, 1, 2));
        assert_eq!((c.copy_sdlba(), c.copy_ranges(), c.copy_format()), (0x1_0000_0002, 3, 0));
        c.set_cdw(12, c.cdw(12) | (1 << 8) | (1 << 30));
        assert_eq!((c.copy_format(), c.fua()), (1, true));
        let v = Sqe::verify(Cid(4), Nsid(1), 7, 65536);
        assert_eq!((v.opcode(), v.slba(), v.nlb(), v.sgl().length), (io::VERIFY, 7, 65536, 0));
    }

    #[test]
    fn get_log_page_dwords() {
        let s = Sqe::get_log_page(Cid(1), Nsid(0), 0x0c, 0, true, 4096, 8192);
        assert_eq!(s.cdw(10) & 0xff, 0x0c);
        assert_eq!(s.cdw(10) >> 16, 1023);
        assert!(s.cdw(10) & (1 << 15) != 0);
        assert_eq!(s.cdw(12), 8192);
    }
}
