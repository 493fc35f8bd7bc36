//! One connection's life on a ring, the same for every driver of a sans-I/O stream (the
//! target's reactor, the host's completion context, user queue pairs): which of its
//! operations are in flight, whether it is closing, whether its in-flight operations
//! were cancelled, when it may be freed, and the [`Token`] that names each of its
//! operations — with a generation, so a completion of a connection that was freed and
//! whose slot was reused is told apart from the new one's.
//!
//! The life of a connection is a [`Life`]: `Open`, then `Closing` (no new receive or
//! send; its in-flight operations are cancelled once), then freed by its driver once
//! [`ConnOps::can_free`] says nothing of it is in flight. The driver keeps the socket
//! and the protocol state; this keeps the bookkeeping every driver had written itself.

/// What a ring operation of a connection is, in its [`Token`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum OpKind {
    /// A receive into the connection's buffer.
    Recv = 1,
    /// A send of a batch of the connection's bytes.
    Send = 2,
    /// A file operation on the connection's behalf (a namespace's read, write or sync).
    File = 3,
    /// An operation the driver's owner queued on the ring (not a connection's).
    User = 4,
}

impl OpKind {
    fn from_bits(v: u64) -> Option<OpKind> {
        Some(match v {
            1 => OpKind::Recv,
            2 => OpKind::Send,
            3 => OpKind::File,
            4 => OpKind::User,
            _ => return None,
        })
    }
}

/// A ring operation's `user_data`, typed: kind (4 bits), the connection's generation (12),
/// the connection's key in its driver's table (32) and a slot within the connection (16,
/// e.g. the request a file operation belongs to).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Token {
    /// What the operation is.
    pub kind: OpKind,
    /// The generation of the connection it belongs to (low 12 bits).
    pub generation: u16,
    /// The connection's key in its driver's table.
    pub key: u32,
    /// A slot within the connection.
    pub slot: u16,
}

/// Generations wrap at this many (12 bits in a token).
pub const GENERATION_MASK: u16 = 0xfff;

impl Token {
    /// The token as `user_data`.
    pub fn to_u64(self) -> u64 {
        ((self.kind as u64) << 60)
            | (u64::from(self.generation & GENERATION_MASK) << 48)
            | (u64::from(self.key) << 16)
            | u64::from(self.slot)
    }

    /// The token of `user_data`; `None` for a value no [`Token`] makes (the ring's own
    /// operations, or another user's).
    pub fn from_u64(v: u64) -> Option<Token> {
        let kind = OpKind::from_bits(v >> 60)?;
        Some(Token {
            kind,
            generation: u16::try_from((v >> 48) & u64::from(GENERATION_MASK)).ok()?,
            key: u32::try_from((v >> 16) & 0xffff_ffff).ok()?,
            slot: u16::try_from(v & 0xffff).ok()?,
        })
    }
}

/// Where a connection is in its life.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Life {
    /// Receives and sends may start.
    Open,
    /// Nothing new starts; `cancelled` once its in-flight operations were cancelled.
    Closing {
        /// Whether the in-flight operations were cancelled.
        cancelled: bool,
    },
}

/// The ring side of one connection (see the module documentation).
#[derive(Clone, Copy, Debug)]
pub struct ConnOps {
    generation: u16,
    key: u32,
    recv: bool,
    send: bool,
    life: Life,
}

impl ConnOps {
    /// A connection at `key` of its driver's table, of `generation` (its low 12 bits are
    /// kept: the driver bumps it for each connection it places at a key).
    pub fn new(key: u32, generation: u64) -> ConnOps {
        let generation = u16::try_from(generation & u64::from(GENERATION_MASK)).unwrap_or(0);
        ConnOps { generation, key, recv: false, send: false, life: Life::Open }
    }

    /// The token of an operation of this connection.
    pub fn token(&self, kind: OpKind, slot: u16) -> u64 {
        Token { kind, generation: self.generation, key: self.key, slot }.to_u64()
    }

    /// Whether `t` names an operation of this connection (not of one that had its key before).
    pub fn owns(&self, t: &Token) -> bool {
        t.key == self.key && t.generation == self.generation
    }

    /// Where it is in its life.
    pub fn life(&self) -> Life {
        self.life
    }

    /// Whether it is open.
    pub fn is_open(&self) -> bool {
        self.life == Life::Open
    }

    /// Whether a receive may start now (open, none in flight).
    pub fn may_recv(&self) -> bool {
        self.is_open() && !self.recv
    }

    /// Whether a send may start now (open, none in flight).
    pub fn may_send(&self) -> bool {
        self.is_open() && !self.send
    }

    /// A receive was queued on the ring.
    pub fn recv_started(&mut self) {
        debug_assert!(!self.recv, "two receives in flight");
        self.recv = true;
    }

    /// A send was queued on the ring.
    pub fn send_started(&mut self) {
        debug_assert!(!self.send, "two sends in flight");
        self.send = true;
    }

    /// Its receive completed.
    pub fn recv_done(&mut self) {
        self.recv = false;
    }

    /// Its send completed.
    pub fn send_done(&mut self) {
        self.send = false;
    }

    /// Whether a receive is in flight.
    pub fn recv_in_flight(&self) -> bool {
        self.recv
    }

    /// Whether a send is in flight.
    pub fn send_in_flight(&self) -> bool {
        self.send
    }

    /// Nothing new starts from now on (closing twice changes nothing).
    pub fn close(&mut self) {
        if self.life == Life::Open {
            self.life = Life::Closing { cancelled: false };
        }
    }

    /// Whether the caller must cancel its in-flight operations now (`Ring::cancel_fd`):
    /// true once, for a closing connection with something in flight.
    #[must_use = "the caller cancels the operations when this says so"]
    pub fn take_cancel(&mut self) -> bool {
        if self.life == (Life::Closing { cancelled: false }) && (self.recv || self.send) {
            self.life = Life::Closing { cancelled: true };
            return true;
        }
        false
    }

    /// Whether the driver may free it: closing, with no receive or send in flight (the
    /// driver adds what else it waits for, such as file operations).
    pub fn can_free(&self) -> bool {
        !self.is_open() && !self.recv && !self.send
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_round_trip_and_refuse_foreign_values() {
        let t = Token { kind: OpKind::File, generation: 0xabc, key: 0xdead_beef, slot: 0x1234 };
        assert_eq!(Token::from_u64(t.to_u64()), Some(t));
        // The generation keeps 12 bits.
        let wide = Token { generation: 0xfabc, ..t };
        assert_eq!(Token::from_u64(wide.to_u64()).map(|t| t.generation), Some(0xabc));
        assert_eq!(Token::from_u64(0), None);
        assert_eq!(Token::from_u64(u64::MAX), None);
    }

    #[test]
    fn a_reused_key_is_told_apart_by_generation() {
        let old = ConnOps::new(7, 1);
        let new = ConnOps::new(7, 2);
        let t = Token::from_u64(old.token(OpKind::Recv, 0)).unwrap();
        assert!(old.owns(&t));
        assert!(!new.owns(&t));
        // 4096 connections later the generation wraps: the same key and generation.
        assert!(ConnOps::new(7, 1 + 4096).owns(&t));
        assert!(!ConnOps::new(8, 1).owns(&t));
    }

    #[test]
    fn lifecycle() {
        let mut c = ConnOps::new(0, 0);
        assert!(c.may_recv() && c.may_send());
        c.recv_started();
        c.send_started();
        assert!(!c.may_recv() && !c.may_send());
        assert!(!c.take_cancel(), "an open connection is not cancelled");
        c.close();
        assert!(!c.may_recv() && !c.may_send(), "nothing new starts while closing");
        assert!(!c.can_free(), "a receive and a send are in flight");
        assert!(c.take_cancel(), "cancelled once");
        assert!(!c.take_cancel());
        c.close();
        assert_eq!(c.life(), Life::Closing { cancelled: true });
        c.recv_done();
        assert!(!c.can_free());
        c.send_done();
        assert!(c.can_free());
        // Closing with nothing in flight: nothing to cancel, free at once.
        let mut idle = ConnOps::new(1, 0);
        idle.close();
        assert!(!idle.take_cancel());
        assert!(idle.can_free());
    }
}
