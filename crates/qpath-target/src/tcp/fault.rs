//! Faults injected on a port (`set_port_fault`, [`crate::port::PortFaults`]) that act on
//! each command: a stuck opcode and an added latency. Failover and stall-detection tests
//! and `qpath lab mpath-delay` use them; production builds leave them out (the
//! `fault-injection` feature), so a command's path reads neither atomic.
//!
//! ```text
//!  exec_io ── injected_stall: opcode + 1 == stall_opcode ──► Stalled (never completes)
//!  finish_io ─ injected_delay: delay_us > 0 ──► Delayed, on the timers ──► respond
//! ```
//!
//! Both read the port's atomics on every command (relaxed loads of a line only the RPC
//! thread writes), so a fault set by RPC applies to the next command of every queue.

use std::cmp::Reverse;
use std::sync::atomic::Ordering;

use super::{ConnCtx, Connection, ReqState, Step};
use crate::range_lock::Hold;

impl Connection {
    /// Whether `slot`'s command is the port's stuck opcode: then it is left `Stalled`,
    /// never answered. A command that has started (a retry from the timers) goes on.
    pub(super) fn injected_stall(&mut self, slot: u16, ctx: &mut ConnCtx<'_>) -> bool {
        let stall = self.port.faults.stall_opcode.load(Ordering::Relaxed);
        let r = &self.reqs[usize::from(slot)];
        if stall != 0 && stall == u64::from(r.sqe.opcode()) + 1 && r.hold == Hold::None && r.step == Step::Idle {
            // Stalled, or (a refused change) already answered: it goes no further either way.
            let _stalled = self.req_to(slot, ReqState::Stalled, ctx);
            return true;
        }
        false
    }

    /// Whether the port adds latency: then `slot`'s completion, its command executed, is
    /// held on the timers until it is due.
    pub(super) fn injected_delay(&mut self, slot: u16, ctx: &mut ConnCtx<'_>) -> bool {
        let delay_us = self.port.faults.delay_us.load(Ordering::Relaxed);
        if delay_us == 0 {
            return false;
        }
        let due_ns = ctx.now_ns.saturating_add(delay_us.saturating_mul(1000));
        // Held, or (a refused change) already answered: not answered again here either way.
        if self.req_to(slot, ReqState::Delayed { due_ns }, ctx) {
            self.timers.push(Reverse((due_ns, slot)));
        }
        true
    }
}
