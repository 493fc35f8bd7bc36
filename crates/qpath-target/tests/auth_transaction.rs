//! DH-HMAC-CHAP on one target connection, driven byte by byte by a scripted
//! host (the in-process loopback): ATR in the Connect response, AUTH_REQUIRED
//! before the transaction, the transaction itself over in-capsule Authentication
//! Send and R2T-less Authentication Receive, Failure1 and a closed queue on a
//! wrong response, the Diffie-Hellman steps handed to the connection's driver (answered
//! when their result comes back, the queue serving its other commands meanwhile), and the
//! fuzzer's seeds reaching the same state machine.

#![allow(clippy::cast_possible_truncation)] // the shared loopback harness (support/) casts test sizes

mod support;

use std::sync::Arc;

use nvme::auth::dhchap::{self, ResponseInput, Role};
use nvme::auth::{AuthCmd, CONNECT_AUTHREQ_ATR, Challenge, DhGroup, HashId, Message, Negotiate, Reply, Secret};
use nvme::fabrics::{PropertyCmd, prop};
use nvme::tcp::Digests;
use nvme::{Cntlid, Status};
use qpath_target::auth::HostAuth;
use qpath_target::registry::TargetState;
use support::{HOSTNQN, HeldOffload, Host, NQN, target};

const KEY: &str = "DHHC-1:01:ia6zGodOr4SEG0Zzaw398rpY0wqipUWj4jWjUh4HWUz6aQ2n:";

fn auth_target(group: DhGroup) -> Arc<TargetState> {
    let t = target();
    let mut a = HostAuth::new(Secret::parse(KEY).unwrap(), None);
    a.dhgroup = group;
    t.subsystem(NQN).unwrap().set_host_auth(HOSTNQN, Some(a));
    t
}

/// Sends a command with `m` in its capsule, without waiting for its completion.
fn send_only(h: &mut Host, m: &Message) -> nvme::Cid {
    let b = m.encode();
    let cid = h.cid();
    let mut sqe = AuthCmd::dhchap(u32::try_from(b.len()).unwrap()).send_sqe(cid);
    sqe.set_sgl(nvme::SglDescriptor::in_capsule(u32::try_from(b.len()).unwrap()));
    h.command(&sqe, &b);
    cid
}

fn send(h: &mut Host, m: &Message) -> Status {
    let cid = send_only(h, m);
    h.completion(cid).0.status
}

fn receive(h: &mut Host) -> Message {
    let cid = h.cid();
    h.command(&AuthCmd::dhchap(4096).receive_sqe(cid), &[]);
    let (cqe, data) = h.completion(cid);
    assert_eq!(cqe.status, Status::SUCCESS);
    assert_eq!(data.len(), 4096, "AL bytes, zero-padded");
    Message::decode(&data).unwrap()
}

fn connect_admin(h: &mut Host) -> u32 {
    h.icreq(Digests::default());
    let c = h.connect(0, Cntlid::DYNAMIC, NQN, HOSTNQN, 31);
    assert_eq!(c.status, Status::SUCCESS);
    c.dw0
}

fn reply_to(c: &Challenge, tamper: bool) -> (Reply, Option<Vec<u8>>) {
    let hash = HashId::from_id(c.hash_id).unwrap();
    let group = DhGroup::from_id(c.dh_group).unwrap();
    let (dhv, ks) = match nvme::auth::ffdhe::DhKeyPair::generate(group).unwrap() {
        Some(k) => (k.public().to_vec(), Some(k.shared_secret(&c.dhv).unwrap())),
        None => (vec![], None),
    };
    let key = Secret::parse(KEY).unwrap().transformed(HOSTNQN);
    let ca = dhchap::challenge(hash, ks.as_deref(), &c.c1);
    let mut r1 = dhchap::response(
        Role::Host,
        &ResponseInput { hash, key: &key, challenge: &ca, seqnum: c.seqnum, tid: c.tid, hostnqn: HOSTNQN, subnqn: NQN },
    );
    if tamper {
        r1[3] ^= 0x80;
    }
    (Reply { tid: c.tid, r1, c2: None, seqnum: 0, dhv }, ks)
}

#[test]
fn transaction_opens_the_queue() {
    for group in [DhGroup::Null, DhGroup::Ffdhe2048] {
        let t = auth_target(group);
        let mut h = Host::new(&t, 1);
        let dw0 = connect_admin(&mut h);
        assert_ne!(dw0 & CONNECT_AUTHREQ_ATR, 0, "Connect asks for authentication (ATR)");
        // Nothing but the transaction before it succeeds, not even Property Get.
        let cid = h.cid();
        h.command(&PropertyCmd::get_sqe(cid, prop::CAP, true), &[]);
        assert_eq!(h.completion(cid).0.status, Status::AUTH_REQUIRED);
        // A Security Protocol other than DH-HMAC-CHAP's is an invalid field.
        let cid = h.cid();
        let mut bad = AuthCmd::dhchap(4096).receive_sqe(cid);
        bad.0[43] = 0xea;
        h.command(&bad, &[]);
        assert_eq!(h.completion(cid).0.status, Status::INVALID_FIELD);

        assert_eq!(send(&mut h, &Message::Negotiate(Negotiate::offer_all(7))), Status::SUCCESS);
        let Message::Challenge(c) = receive(&mut h) else { panic!("no challenge") };
        assert_eq!((c.tid, c.hash_id, c.dh_group), (7, HashId::Sha256.id(), group.id()));
        assert_eq!(c.dhv.len(), group.value_len());
        let (reply, _) = reply_to(&c, false);
        assert_eq!(send(&mut h, &Message::Reply(reply)), Status::SUCCESS);
        let Message::Success1(s) = receive(&mut h) else { panic!("no success1") };
        assert_eq!((s.hl, s.r2.is_none()), (32, true));
        // Open: Property Get works, and so does the rest of bring-up.
        assert_ne!(h.prop_get(prop::CAP, true), 0);
        assert!(!h.closed());
    }
}

#[test]
fn wrong_response_gets_failure1_and_closes() {
    let t = auth_target(DhGroup::Null);
    let mut h = Host::new(&t, 1);
    connect_admin(&mut h);
    send(&mut h, &Message::Negotiate(Negotiate::offer_all(1)));
    let Message::Challenge(c) = receive(&mut h) else { panic!() };
    let (reply, _) = reply_to(&c, true);
    send(&mut h, &Message::Reply(reply));
    let Message::Failure1(f) = receive(&mut h) else { panic!("no Failure1") };
    assert_eq!((f.tid, f.rescode, f.rescode_exp), (1, 1, nvme::auth::failure::FAILED));
    assert!(h.closed(), "the queue is refused");
    assert_eq!(h.conn.close_reason(), Some("in-band authentication failed"));
}

#[test]
fn dh_steps_go_to_the_driver_and_hold_only_their_own_command() {
    let t = auth_target(DhGroup::Ffdhe2048);
    let mut h = Host::new(&t, 1);
    connect_admin(&mut h);
    // The first transaction with the steps run inline (a driver without workers).
    assert_eq!(send(&mut h, &Message::Negotiate(Negotiate::offer_all(1))), Status::SUCCESS);
    let Message::Challenge(c) = receive(&mut h) else { panic!("no challenge") };
    assert_eq!(send(&mut h, &Message::Reply(reply_to(&c, false).0)), Status::SUCCESS);
    assert!(matches!(receive(&mut h), Message::Success1(_)));

    // Re-authentication of the live queue through a driver that holds the steps.
    h.offload = Some(HeldOffload::default());
    let negotiate = send_only(&mut h, &Message::Negotiate(Negotiate::offer_all(2)));
    assert_eq!(h.offload.as_ref().unwrap().jobs.borrow().len(), 1, "the key pair is the driver's to make");
    assert!(h.recv().is_none(), "the Negotiate is not answered before its key pair exists");
    // Meanwhile the queue serves its other commands.
    assert_ne!(h.prop_get(prop::CAP, true), 0);
    assert_eq!(h.finish_offloaded(), 1);
    assert_eq!(h.completion(negotiate).0.status, Status::SUCCESS);
    let Message::Challenge(c) = receive(&mut h) else { panic!("no challenge") };
    assert_eq!((c.tid, c.dhv.len()), (2, DhGroup::Ffdhe2048.value_len()));
    let reply = send_only(&mut h, &Message::Reply(reply_to(&c, false).0));
    assert!(h.recv().is_none(), "the Reply is not answered before the shared secret exists");
    assert_eq!(h.finish_offloaded(), 1);
    assert_eq!(h.completion(reply).0.status, Status::SUCCESS);
    assert!(matches!(receive(&mut h), Message::Success1(_)), "the offloaded secret verifies R1");
    assert!(!h.closed());

    // A Send while a step is computed: the host is out of step. Both commands are
    // answered, the late result is dropped, and the host reads AUTH_Failure1.
    let first = send_only(&mut h, &Message::Negotiate(Negotiate::offer_all(3)));
    let second = send_only(&mut h, &Message::Negotiate(Negotiate::offer_all(3)));
    assert_eq!(h.completion(second).0.status, Status::SUCCESS);
    assert_eq!(h.finish_offloaded(), 1);
    assert_eq!(h.completion(first).0.status, Status::SUCCESS);
    let Message::Failure1(f) = receive(&mut h) else { panic!("no Failure1") };
    assert_eq!(f.rescode_exp, nvme::auth::failure::INCORRECT_MESSAGE);
    assert!(h.closed());
}

#[test]
fn no_auth_no_transaction() {
    // A host without keys: no ATR, and Authentication Send is not a command here.
    let t = target();
    let mut h = Host::new(&t, 1);
    assert_eq!(connect_admin(&mut h) & CONNECT_AUTHREQ_ATR, 0);
    let cid = h.cid();
    h.command(&AuthCmd::dhchap(4096).receive_sqe(cid), &[]);
    assert_eq!(h.completion(cid).0.status, Status::INVALID_OPCODE);
}

/// The connection fuzzer's seeds (fuzz/corpus/target_connection/auth-*) reach the transaction:
/// the first byte is the fuzzer's chunk size, the rest host bytes.
#[test]
fn fuzz_seeds_reach_the_state_machine() {
    for (seed, reason) in [
        (
            &include_bytes!("../../../fuzz/corpus/target_connection/auth-negotiate-reply")[..],
            "in-band authentication failed",
        ),
        (
            &include_bytes!("../../../fuzz/corpus/target_connection/auth-out-of-order")[..],
            "in-band authentication failed",
        ),
    ] {
        let t = target();
        // The fuzzer's subsystem and host (fuzz_targets/target_connection.rs).
        let s = t
            .add_subsystem(
                qpath_target::subsystem::Subsystem::new(
                    "nqn.2026-11.io.qpath:fuzz",
                    qpath_target::subsystem::SubsysKind::Nvm,
                    "FUZZ",
                    "qpath",
                    qpath_target::subsystem::HostAccess { allow_any: true, hosts: vec![] },
                    qpath_target::subsystem::SubsysLimits::default(),
                )
                .unwrap(),
            )
            .unwrap();
        s.set_host_auth(
            "nqn.2014-08.org.nvmexpress:uuid:00000000-0000-4000-8000-00000000a0a0",
            Some(HostAuth::new(Secret::parse(KEY).unwrap(), None)),
        );
        let mut h = Host::new(&t, 1);
        h.send(&seed[1..]);
        assert!(h.closed(), "seed did not end the transaction");
        assert_eq!(h.conn.close_reason(), Some(reason));
    }
}
