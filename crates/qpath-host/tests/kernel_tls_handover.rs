//! A TLS queue's records handed to kernel TLS (`tls::kernel`), without the kernel: the test
//! plays the socket and the controller. The handover waits until the client's Finished and
//! its sealed ICReq are sent and the ICResp record is opened; after it the Connect goes out
//! as a plain PDU (the kernel would seal it) and the queue's statistics say the kernel path.
//! Refused keys keep the user-space records; `tls_offload = off` never asks.

use std::sync::Arc;

use nvme::Cntlid;
use nvme::tcp::{Digests, IcResp};
use qpath_host::queue::{HostQueue, QueueConfig, QueueState};
use qpath_host::tls::HostTls;
use tls::kernel::{InstallError, Offload};
use tls::psk::{ConfiguredPsk, Derivation, Identity, PskHash, TlsPsk};
use tls::{Channel, PskLookup, ServerConfig};
use uring::SendMsg;

const HOST: &str = "nqn.2014-08.org.nvmexpress:uuid:0f0e0d0c-0b0a-0908-0706-050403020100";
const SUB: &str = "nqn.2026-11.io.qpath:ktls";

struct Store(ConfiguredPsk);
impl PskLookup for Store {
    fn lookup(&self, id: &Identity) -> Option<TlsPsk> {
        self.0.retained(&id.hostnqn, Derivation::Standard).tls_psk(id)
    }
}

/// A host I/O queue with a TLS key and `offload`, and the controller's channel; the
/// handshake done and the ICResp delivered through the user-space records.
fn after_icresp(offload: Offload) -> (HostQueue, Channel) {
    let key = ConfiguredPsk::generate(PskHash::Sha256).unwrap();
    let mut cfg = QueueConfig::io(1, 8, Cntlid(1), SUB, HOST, [0; 16]);
    cfg.tls = Some(HostTls::parse(&key.to_interchange()).unwrap().for_queue(HOST, SUB));
    cfg.tls_offload = offload;
    let mut q = HostQueue::new(cfg);
    let mut s = Channel::server(&ServerConfig::new(Arc::new(Store(key))).unwrap()).unwrap();
    // ClientHello; the server's flight; the Finished and the sealed ICReq.
    for _ in 0..4 {
        while let Some(m) = q.take_send() {
            assert!(q.kernel_tls_handover().is_none(), "a send in flight");
            tls::channel::feed(&mut s, &m.to_vec());
            q.on_send_done(m, Ok(()));
        }
        while let Ok(Some(m)) = s.take_send(|| None) {
            q.feed(&m.to_vec());
            s.on_send_done(m, Ok(()));
        }
    }
    let mut icreq = [0u8; 128];
    assert_eq!(s.read(&mut icreq), 128, "the ICReq, sealed by the host: {:?}", s.error());
    assert_eq!(q.state(), QueueState::AwaitIcResp);
    let mut resp = SendMsg::new();
    resp.push_bytes(&IcResp { pfv: 0, cpda: 0, digests: Digests::default(), maxh2cdata: 65536 }.encode());
    let mut pending = Some(resp);
    let m = s.take_send(|| pending.take()).unwrap().unwrap();
    q.feed(&m.to_vec());
    s.on_send_done(m, Ok(()));
    assert_eq!(q.state(), QueueState::AwaitConnect, "{:?}", q.error());
    (q, s)
}

#[test]
fn kernel_takes_the_records_after_the_icresp() {
    let (mut q, _s) = after_icresp(Offload::Auto);
    assert_eq!(q.secure_channel().as_deref(), Some("tls1.3-user TLS_AES_128_GCM_SHA256"));
    let h = q.kernel_tls_handover().expect("at a record boundary, nothing in flight");
    let at = std::mem::offset_of!(libc::tls12_crypto_info_aes_gcm_128, rec_seq);
    let seq = |b: &[u8]| u64::from_be_bytes(b[at..at + 8].try_into().unwrap());
    // The host sealed one record (its ICReq; the Finished is a handshake record) and
    // opened one (the ICResp).
    assert_eq!((seq(h.tx.as_bytes()), seq(h.rx.as_bytes())), (1, 1));
    q.kernel_tls_installed(Ok(()));
    assert!(q.kernel_tls());
    assert!(q.kernel_tls_handover().is_none(), "handed over once");
    assert_eq!(q.secure_channel().as_deref(), Some("tls1.3-kernel TLS_AES_128_GCM_SHA256"));
    // The Connect goes out plain: a command capsule PDU (type 0x04) with the Connect opcode.
    let m = q.take_send().expect("the Connect");
    let bytes = m.to_vec();
    assert_eq!(bytes[0], 0x04, "a plain CapsuleCmd PDU");
    assert_eq!(bytes[8], 0x7f, "Fabrics opcode");
    q.on_send_done(m, Ok(()));
}

#[test]
fn refused_keys_keep_the_user_space_records() {
    let (mut q, mut s) = after_icresp(Offload::Auto);
    assert!(q.kernel_tls_handover().is_some());
    q.kernel_tls_installed(Err(InstallError::NotTaken(std::io::Error::from_raw_os_error(libc::ENOENT))));
    assert!(!q.kernel_tls());
    assert!(q.kernel_tls_handover().is_none(), "not asked again");
    assert_eq!(q.secure_channel().as_deref(), Some("tls1.3-user TLS_AES_128_GCM_SHA256"));
    let m = q.take_send().expect("the Connect, sealed");
    tls::channel::feed(&mut s, &m.to_vec());
    let mut plain = [0u8; 2048];
    let n = s.read(&mut plain);
    assert!(n > 72 && plain[0] == 0x04, "the controller's channel opens the Connect: {:?}", s.error());
}

#[test]
fn half_taken_keys_fail_the_queue() {
    let (mut q, _s) = after_icresp(Offload::Auto);
    assert!(q.kernel_tls_handover().is_some());
    q.kernel_tls_installed(Err(InstallError::Half(std::io::Error::from_raw_os_error(libc::EINVAL))));
    assert_eq!(q.state(), QueueState::Failed);
    assert!(q.error().unwrap().contains("kernel TLS"), "{:?}", q.error());
}

#[test]
fn offload_off_never_hands_over() {
    let (q, _s) = after_icresp(Offload::Off);
    assert!(q.kernel_tls_handover().is_none());
    assert_eq!(q.secure_channel().as_deref(), Some("tls1.3-user TLS_AES_128_GCM_SHA256"));
}
