//! The target's reservation state machine under arbitrary sequences of Register,
//! Acquire, Release, Report, Set Features (PTPL) and restarts from four hosts, keys drawn
//! from a small set so that they collide. After every step:
//! - each host is registered at most once; a reservation has a holder that is registered
//!   (all registrants hold an All Registrants one, exactly one holds any other);
//! - a command that failed changed nothing;
//! - every host's read and write verdicts on the I/O path (`check`, through a cache kept
//!   across steps) equal the specification's table applied to the state;
//! - the report agrees with the state;
//! - a restart brings back the state when persistence is on, nothing when it is off.

#![no_main]

use std::path::PathBuf;

use libfuzzer_sys::fuzz_target;
use nvme::Status;
use qpath_target::reservation::{AccessCache, Group, Reservations, Snapshot};

const HOSTS: [[u8; 16]; 4] = [[0x11; 16], [0x22; 16], [0x33; 16], [0x44; 16]];
const KEYS: [u64; 4] = [0, 1, 2, 0xffff_ffff_ffff_ffff];

fn hex(id: &[u8; 16]) -> String {
    id.iter().map(|b| format!("{b:02x}")).collect()
}

/// The specification's access table (NVMe Base 2.x, "Command Behavior in the Presence
/// of a Reservation"), written apart from the target's.
fn expected(s: &Snapshot, host: &[u8; 16], write: bool) -> bool {
    let me = s.registrants.iter().find(|r| r.hostid == hex(host));
    let (registered, holds) = (me.is_some(), me.is_some_and(|r| r.holds));
    match s.rtype {
        0 => true,
        _ if holds => true,
        1 => !write,
        2 => false,
        3 | 5 => !write || registered,
        4 | 6 => registered,
        _ => unreachable!("reservation type {}", s.rtype),
    }
}

fn invariants(r: &Reservations, caches: &mut [AccessCache; 4]) -> Snapshot {
    let s = r.snapshot();
    let mut ids: Vec<&str> = s.registrants.iter().map(|r| r.hostid.as_str()).collect();
    ids.sort_unstable();
    ids.dedup();
    assert_eq!(ids.len(), s.registrants.len(), "a host registered twice: {s:?}");
    let holders = s.registrants.iter().filter(|r| r.holds).count();
    match s.rtype {
        0 => assert_eq!(holders, 0, "a holder without a reservation: {s:?}"),
        5 | 6 => assert_eq!(holders, s.registrants.len(), "All Registrants: every registrant holds: {s:?}"),
        1..=4 => assert_eq!(holders, 1, "one holder: {s:?}"),
        t => panic!("reservation type {t}"),
    }
    for (h, cache) in HOSTS.iter().zip(caches.iter_mut()) {
        for write in [false, true] {
            let group = if write { Group::Write } else { Group::Read };
            let got = r.check(1, h, group, cache);
            let want = expected(&s, h, write);
            assert_eq!(got.is_ok(), want, "host {} write={write}: {got:?} under {s:?}", hex(h));
            if !want {
                assert_eq!(got, Err(Status::RESERVATION_CONFLICT));
            }
        }
    }
    let mut out = [0u8; 64 + 4 * 64];
    assert!(r.report(1, &mut out).is_success());
    assert_eq!(u32::from_le_bytes(out[0..4].try_into().unwrap()), s.generation);
    assert_eq!(out[4], s.rtype);
    assert_eq!(usize::from(u16::from_le_bytes([out[5], out[6]])), s.registrants.len());
    s
}

fn scratch() -> PathBuf {
    let base = if std::path::Path::new("/dev/shm").is_dir() { PathBuf::from("/dev/shm") } else { std::env::temp_dir() };
    let d = base.join(format!("qpath-fuzz-resv-{}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    d.join("ns1.resv")
}

fuzz_target!(|data: &[u8]| {
    let path = scratch();
    let _ = std::fs::remove_file(&path);
    let mut r = Reservations::persistent(&path).unwrap();
    let mut caches = [AccessCache::default(); 4];
    let mut state = invariants(&r, &mut caches);
    for op in data.chunks_exact(3) {
        let host = &HOSTS[usize::from(op[0] & 3)];
        let (k1, k2) = (KEYS[usize::from(op[1] & 3)], KEYS[usize::from((op[1] >> 2) & 3)]);
        let mut keys = [0u8; 16];
        keys[..8].copy_from_slice(&k1.to_le_bytes());
        keys[8..].copy_from_slice(&k2.to_le_bytes());
        // CDW10: the action (2:0), IEKEY (3), RTYPE (15:8, 0-7), CPTPL (31:30).
        let cdw10 = u32::from(op[2] & 0xf) | u32::from(op[1] >> 5) << 8 | u32::from(op[2] >> 6) << 30;
        let status = match (op[0] >> 2) % 6 {
            0 => r.register(host, cdw10, &keys),
            1 => r.acquire(host, cdw10, &keys),
            2 => r.release(host, cdw10, &keys),
            3 => r.set_ptpl(op[2] & 1 == 1),
            4 => {
                // A restart: what persists comes back, the rest is gone.
                let ptpl = r.ptpl();
                drop(r);
                r = Reservations::persistent(&path).unwrap();
                let back = r.snapshot();
                if ptpl {
                    assert_eq!(back, state, "persisted state differs after a restart");
                } else {
                    assert!(back.rtype == 0 && back.registrants.is_empty(), "PTPL off, yet {back:?} came back");
                }
                Status::SUCCESS
            }
            _ => {
                let mut out = [0u8; 64];
                r.report(u32::from(op[2] & 1), &mut out)
            }
        };
        let now = invariants(&r, &mut caches);
        if !status.is_success() {
            assert_eq!(now, state, "a failed command ({status}) changed the state");
        }
        state = now;
    }
    drop(r);
    let _ = std::fs::remove_file(&path);
});
