//! A simulated TCP connection: two in-order byte pipes with a delay per segment.
//!
//! What a sender hands over is cut into segments at points the seed picks, each due a
//! little later than the one before (TCP keeps a connection's bytes in order; different
//! connections overtake one another freely). The receiver takes any prefix of the first
//! due segment, so every split of the byte stream can reach the protocol ends. A
//! direction can stall (bytes wait, nothing is lost) and a connection can reset (what is
//! in the pipes is lost; both ends learn of it).

use std::collections::VecDeque;

use crate::rng::Rng;

/// One direction of a connection.
#[derive(Debug, Default)]
pub struct Pipe {
    segs: VecDeque<(u64, Vec<u8>)>,
    last_due_ns: u64,
    /// Stalled until this time (a silent stall: nothing moves, nothing is lost).
    pub stalled_until_ns: u64,
    /// Bytes carried so far.
    pub bytes: u64,
    /// Flip one bit of the next bytes sent (a fault only injected where digests cover
    /// every byte a receiver acts on).
    pub corrupt_next: bool,
    /// Bits flipped so far.
    pub flips: u64,
}

impl Pipe {
    /// Queues `data` sent at `now_ns`.
    pub fn send(&mut self, data: &[u8], now_ns: u64, rng: &mut Rng) {
        let mut flipped;
        let mut rest = data;
        if self.corrupt_next && !data.is_empty() {
            self.corrupt_next = false;
            self.flips += 1;
            flipped = data.to_vec();
            let b = rng.index(flipped.len());
            flipped[b] ^= 1 << rng.below(8);
            rest = &flipped;
        }
        while !rest.is_empty() {
            let cut = if rest.len() > 1 && rng.chance(300_000) { 1 + rng.index(rest.len() - 1) } else { rest.len() };
            let latency = if rng.chance(10_000) { rng.range(1_000_000, 30_000_000) } else { rng.range(2_000, 40_000) };
            let due = (now_ns + latency).max(self.last_due_ns);
            self.last_due_ns = due;
            self.segs.push_back((due, rest[..cut].to_vec()));
            rest = &rest[cut..];
        }
    }

    /// Whether bytes can be received now.
    pub fn ready(&self, now_ns: u64) -> bool {
        now_ns >= self.stalled_until_ns && self.segs.front().is_some_and(|(due, _)| *due <= now_ns)
    }

    /// When bytes are next due (a stall included).
    pub fn next_due(&self) -> Option<u64> {
        self.segs.front().map(|(due, _)| (*due).max(self.stalled_until_ns))
    }

    /// Whether nothing is in flight.
    pub fn is_empty(&self) -> bool {
        self.segs.is_empty()
    }

    /// Copies up to `into.len()` bytes of the first due segment, cut where the seed says;
    /// how many.
    pub fn recv(&mut self, into: &mut [u8], rng: &mut Rng) -> usize {
        let Some((_, seg)) = self.segs.front_mut() else { return 0 };
        let mut n = seg.len().min(into.len());
        if n > 1 && rng.chance(250_000) {
            n = 1 + rng.index(n - 1);
        }
        into[..n].copy_from_slice(&seg[..n]);
        seg.drain(..n);
        if seg.is_empty() {
            self.segs.pop_front();
        }
        self.bytes += n as u64;
        n
    }

    /// A reset: what is in flight is lost.
    pub fn clear(&mut self) {
        self.segs.clear();
    }
}

/// Which end of a connection.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Dir {
    /// Host to target.
    ToTarget,
    /// Target to host.
    ToHost,
}

/// One simulated TCP connection between a host queue and a target connection.
#[derive(Debug, Default)]
pub struct Link {
    /// Host to target.
    pub to_target: Pipe,
    /// Target to host.
    pub to_host: Pipe,
    /// Reset, or closed by an end: no more bytes flow.
    pub down: bool,
    /// The target closed its end (FIN after its last bytes).
    pub target_closed: bool,
    /// The host closed its end.
    pub host_closed: bool,
}

impl Link {
    /// The pipe of direction `d`.
    pub fn pipe(&mut self, d: Dir) -> &mut Pipe {
        match d {
            Dir::ToTarget => &mut self.to_target,
            Dir::ToHost => &mut self.to_host,
        }
    }

    /// A reset: both pipes lose what they carry.
    pub fn reset(&mut self) {
        self.down = true;
        self.to_target.clear();
        self.to_host.clear();
    }
}
