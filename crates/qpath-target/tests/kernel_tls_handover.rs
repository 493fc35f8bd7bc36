//! A TLS connection's records handed to kernel TLS (`tls::kernel`), without the kernel: the
//! test plays the socket. The handover waits for the records that came with the host's
//! Finished to be opened; after it the queue speaks plain PDUs (the kernel would seal
//! them), still bound to the channel's identity, and `list_queues` says so. A kernel that
//! refuses the keys leaves the user-space records; one that takes half of them closes the
//! connection; a port with `tls_offload = "off"` never asks.

#![allow(clippy::cast_possible_truncation)] // the shared test host's data sizes are small

mod support;

use std::sync::Arc;

use nvme::tcp::{Digests, Header, IcReq};
use nvme::{Cntlid, Status};
use qpath_target::registry::TargetState;
use qpath_target::subsystem::HostAccess;
use qpath_target::tls::{HostTlsKey, TlsMode, TlsOffload};
use support::{HOSTNQN, Host, NQN, target};
use tls::kernel::InstallError;
use tls::psk::{ConfiguredPsk, Derivation, IdentityVersion, PskHash};
use uring::SendMsg;

/// A target whose port 1 requires TLS with `offload`, the host's key in the subsystem; a
/// host connection on it and the host's client channel.
fn tls_pair(offload: TlsOffload) -> (Arc<TargetState>, Host, tls::Channel) {
    let t = target();
    let port = t.port(1).unwrap();
    port.tls.set(TlsMode::Required);
    port.tls.set_offload(offload);
    let key = ConfiguredPsk::generate(PskHash::Sha256).unwrap();
    t.subsystem(NQN).unwrap().set_host_tls_key(HOSTNQN, Some(HostTlsKey { key: key.clone(), file: None }));
    let h = Host::new(&t, 1);
    let r = key.retained(HOSTNQN, Derivation::Standard);
    let id = r.identity(IdentityVersion::V1, HOSTNQN, NQN);
    let psk = r.tls_psk(&id).unwrap();
    let c = tls::Channel::client(&tls::ClientConfig::shared().unwrap(), id, psk).unwrap();
    (t, h, c)
}

/// Runs the handshake; the host's Finished and its ICReq record reach the target in one
/// segment, as a fast host sends them.
fn handshake_with_icreq(h: &mut Host, c: &mut tls::Channel) {
    let hello = c.take_send(|| None).unwrap().unwrap();
    assert_eq!(h.feed_only(&hello.to_vec()), hello.len());
    c.on_send_done(hello, Ok(()));
    assert!(h.read_one_batch(), "the server's flight");
    tls::channel::feed(c, &std::mem::take(&mut h.inbox));
    assert!(c.is_open());
    let mut icreq = SendMsg::new();
    icreq.push_bytes(&IcReq { pfv: 0, hpda: 0, digests: Digests::default(), maxr2t: 0 }.encode());
    let mut pending = Some(icreq);
    let msg = c.take_send(|| pending.take()).unwrap().unwrap();
    let wire = msg.to_vec();
    c.on_send_done(msg, Ok(()));
    assert_eq!(h.feed_only(&wire), wire.len());
}

fn secure_channel(t: &TargetState) -> Option<String> {
    t.queues().into_iter().find(|q| q.port == 1).and_then(|q| q.secure_channel)
}

/// The host's decoder after a plain ICResp.
fn expect_plain_icresp(h: &mut Host) {
    match h.expect().header {
        Header::IcResp(_) => {}
        other => panic!("expected a plain ICResp, got {other:?}"),
    }
    h.established(Digests::default());
}

#[test]
fn kernel_takes_the_records_after_the_ones_read_with_the_finished() {
    let (t, mut h, mut c) = tls_pair(TlsOffload::Auto);
    handshake_with_icreq(&mut h, &mut c);
    assert_eq!(secure_channel(&t).as_deref(), Some("tls1.3-user TLS_AES_128_GCM_SHA256"));
    let handover = h.conn.kernel_tls_handover().expect("the ICReq record is opened: a record boundary");
    // The kernel's receive sequence starts after the ICReq's record (1), its send sequence
    // at the first record it seals (0: the ICResp waits, unsealed).
    let at = std::mem::offset_of!(libc::tls12_crypto_info_aes_gcm_128, rec_seq);
    let seq = |b: &[u8]| u64::from_be_bytes(b[at..at + 8].try_into().unwrap());
    assert_eq!((seq(handover.rx.as_bytes()), seq(handover.tx.as_bytes())), (1, 0));
    h.conn.kernel_tls_installed(Ok(()));
    assert!(h.conn.kernel_tls());
    assert!(h.conn.kernel_tls_handover().is_none(), "handed over once");
    assert_eq!(secure_channel(&t).as_deref(), Some("tls1.3-kernel TLS_AES_128_GCM_SHA256"));
    // From here the socket carries plain PDUs both ways (the kernel seals and opens them).
    h.pump();
    expect_plain_icresp(&mut h);
    // The Connect is still checked against the channel's identity (the other host may
    // connect to the subsystem, but not inside this host's channel).
    let other = "nqn.2014-08.org.nvmexpress:uuid:00000000-0000-4000-8000-000000000002";
    let s = t.subsystem(NQN).unwrap();
    s.set_access(HostAccess { allow_any: false, hosts: vec![HOSTNQN.to_string(), other.to_string()] });
    assert_eq!(h.connect(0, Cntlid(0xffff), NQN, other, 31).status, Status::CONNECT_INVALID_HOST);
    let (t2, mut h2, mut c2) = tls_pair(TlsOffload::Auto);
    handshake_with_icreq(&mut h2, &mut c2);
    assert!(h2.conn.kernel_tls_handover().is_some());
    h2.conn.kernel_tls_installed(Ok(()));
    h2.pump();
    expect_plain_icresp(&mut h2);
    assert_eq!(h2.connect(0, Cntlid(0xffff), NQN, HOSTNQN, 31).status, Status::SUCCESS);
    assert_eq!(secure_channel(&t2).as_deref(), Some("tls1.3-kernel TLS_AES_128_GCM_SHA256"));
}

/// A control record (an alert, a KeyUpdate) on a kernel-TLS socket fails the receive with
/// EIO: the connection closes and says why.
#[test]
fn a_control_record_on_a_kernel_tls_socket_closes_the_connection() {
    let (_t, mut h, mut c) = tls_pair(TlsOffload::Auto);
    handshake_with_icreq(&mut h, &mut c);
    h.conn.kernel_tls_handover().expect("a record boundary");
    h.conn.kernel_tls_installed(Ok(()));
    assert!(tls::kernel::control_record(&std::io::Error::from_raw_os_error(libc::EIO)));
    h.conn.kernel_tls_control_record();
    h.pump();
    assert!(h.closed());
    let why = h.conn.close_reason().unwrap_or_default().to_string();
    assert!(why.contains("TLS control record"), "{why}");
}

#[test]
fn refused_keys_leave_the_records_in_user_space() {
    let (t, mut h, mut c) = tls_pair(TlsOffload::Auto);
    handshake_with_icreq(&mut h, &mut c);
    assert!(h.conn.kernel_tls_handover().is_some());
    h.conn.kernel_tls_installed(Err(InstallError::NotTaken(std::io::Error::from_raw_os_error(libc::ENOENT))));
    assert!(!h.conn.kernel_tls());
    assert!(h.conn.kernel_tls_handover().is_none(), "not asked again");
    assert_eq!(secure_channel(&t).as_deref(), Some("tls1.3-user TLS_AES_128_GCM_SHA256"));
    // The ICResp comes sealed: the client's channel opens it.
    h.pump();
    tls::channel::feed(&mut c, &std::mem::take(&mut h.inbox));
    let mut plain = [0u8; 256];
    let n = c.read(&mut plain);
    assert_eq!(n, 128, "one ICResp, opened by the client: {:?}", c.error());
    assert_eq!(plain[0], 0x01, "ICResp PDU type");
}

#[test]
fn half_taken_keys_close_the_connection() {
    let (_t, mut h, mut c) = tls_pair(TlsOffload::Auto);
    handshake_with_icreq(&mut h, &mut c);
    assert!(h.conn.kernel_tls_handover().is_some());
    h.conn.kernel_tls_installed(Err(InstallError::Half(std::io::Error::from_raw_os_error(libc::EINVAL))));
    h.pump();
    assert!(h.closed(), "a socket the kernel half took serves neither path");
}

#[test]
fn offload_off_never_hands_over() {
    let (t, mut h, mut c) = tls_pair(TlsOffload::Off);
    handshake_with_icreq(&mut h, &mut c);
    assert!(h.conn.kernel_tls_handover().is_none());
    h.pump();
    assert!(h.conn.kernel_tls_handover().is_none());
    assert_eq!(secure_channel(&t).as_deref(), Some("tls1.3-user TLS_AES_128_GCM_SHA256"));
}
