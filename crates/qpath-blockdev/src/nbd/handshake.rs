//! The server side of NBD's fixed newstyle negotiation, sans I/O: bytes in, bytes out.
//!
//! ```text
//!   S: NBDMAGIC IHAVEOPT flags(FIXED_NEWSTYLE|NO_ZEROES)       (Handshake::new)
//!   C: client flags                                            State::ClientFlags
//!   C: IHAVEOPT option length                                  State::OptionHeader
//!   C: option data (at most OPTION_DATA_MAX; longer is drained  State::OptionData / Drain
//!      and refused with ERR_TOO_BIG)
//!   S: option replies ... until EXPORT_NAME, or GO answered ACK  -> Outcome::Transmission
//!      or ABORT answered ACK                                    -> Outcome::Closed
//! ```
//!
//! One export is served: `Export::name`, which the empty (default) name also selects.
//! Supported options: EXPORT_NAME, ABORT, LIST, INFO, GO, STRUCTURED_REPLY,
//! LIST_META_CONTEXT and SET_META_CONTEXT (no metadata context is offered: both answer with
//! an empty list, so a client never sends BLOCK_STATUS). STARTTLS and anything else are
//! refused with ERR_UNSUP; a malformed option with ERR_INVALID (NBD protocol, "Option
//! types"). A client that sends unknown client flags, more than `OPTIONS_MAX` options or a
//! wrong magic is disconnected (hard disconnect), as the protocol allows.

use super::wire::{
    IHAVEOPT, NBDMAGIC, OPTION_HEADER_LEN, STRING_MAX, be16, be32, be64, client_flags, handshake_flags, info, opt,
    option_reply, rep,
};

/// Largest option payload read into memory; longer options are drained and refused.
/// An export name is at most 4096 bytes, so GO/INFO with every info request fits.
pub const OPTION_DATA_MAX: usize = STRING_MAX + 4 + 2 + 2 * 64;
/// Options one client may send before it is disconnected.
pub const OPTIONS_MAX: u32 = 256;
/// Metadata context queries one option may carry.
pub const META_QUERIES_MAX: u32 = 64;

/// What the server tells clients about its one export.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Export {
    /// The export's name (the empty name selects it too).
    pub name: String,
    /// A description for humans (`NBD_INFO_DESCRIPTION`), may be empty.
    pub description: String,
    /// Size in bytes.
    pub size: u64,
    /// Transmission flags (`wire::flags`), `HAS_FLAGS` included.
    pub flags: u16,
    /// Minimum block size: requests must be aligned to it (the namespace's block size).
    pub block_min: u32,
    /// Preferred block size.
    pub block_preferred: u32,
    /// Largest payload of one request.
    pub payload_max: u32,
}

/// What the negotiation settled.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Negotiated {
    /// Structured replies are on (`NBD_OPT_STRUCTURED_REPLY` acknowledged).
    pub structured: bool,
    /// The client entered transmission with `NBD_OPT_GO` having asked for
    /// `NBD_INFO_BLOCK_SIZE`: it promised to honour the size constraints.
    pub block_size_agreed: bool,
}

/// Why a negotiation ended without transmission.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Closed {
    /// The client sent `NBD_OPT_ABORT` (a soft disconnect).
    Aborted,
    /// The client broke the protocol; the reason, for the log.
    Protocol(String),
}

/// Where the negotiation is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// Still negotiating: feed more bytes.
    Negotiating,
    /// Transmission starts with the next byte after what [`Handshake::feed`] consumed.
    Transmission(Negotiated),
    /// Send what [`Handshake::output`] holds, then close the connection.
    Closed(Closed),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum State {
    /// Waiting for the 4 bytes of client flags.
    ClientFlags,
    /// Waiting for an option header (magic, option, length).
    OptionHeader,
    /// Reading `len` bytes of option `opt`.
    OptionData { opt: u32, len: usize },
    /// Skipping `left` bytes of an option too long to read, then refusing it.
    Drain { opt: u32, left: u64 },
    /// Done: see `outcome`.
    Done,
}

/// The negotiation of one connection.
#[derive(Debug)]
pub struct Handshake {
    export: Export,
    state: State,
    outcome: Outcome,
    /// Bytes of the field being assembled (client flags, an option header or its data).
    buf: Vec<u8>,
    out: Vec<u8>,
    no_zeroes: bool,
    structured: bool,
    options: u32,
}

impl Handshake {
    /// A negotiation for `export`; [`Handshake::output`] holds the server's greeting.
    pub fn new(export: Export) -> Handshake {
        let mut out = Vec::with_capacity(256);
        out.extend_from_slice(&NBDMAGIC.to_be_bytes());
        out.extend_from_slice(&IHAVEOPT.to_be_bytes());
        out.extend_from_slice(&(handshake_flags::FIXED_NEWSTYLE | handshake_flags::NO_ZEROES).to_be_bytes());
        Handshake {
            export,
            state: State::ClientFlags,
            outcome: Outcome::Negotiating,
            buf: Vec::with_capacity(64),
            out,
            no_zeroes: false,
            structured: false,
            options: 0,
        }
    }

    /// Bytes to send to the client; the caller drains them.
    pub fn output(&mut self) -> &mut Vec<u8> {
        &mut self.out
    }

    /// Where the negotiation is.
    pub fn outcome(&self) -> &Outcome {
        &self.outcome
    }

    /// Consumes client bytes; returns how many were used. Stops at the end of the
    /// negotiation: bytes after it belong to the transmission phase.
    pub fn feed(&mut self, mut data: &[u8]) -> usize {
        let total = data.len();
        while !data.is_empty() && self.state != State::Done {
            let used = self.step(data);
            data = &data[used..];
        }
        total - data.len()
    }

    /// Takes what the current state needs from `data`; returns how many bytes.
    fn step(&mut self, data: &[u8]) -> usize {
        match self.state {
            State::ClientFlags => self.fill(data, 4, |h, b| h.on_client_flags(be32(b, 0))),
            State::OptionHeader => self.fill(data, OPTION_HEADER_LEN, |h, b| h.on_option_header(b)),
            State::OptionData { opt, len } => self.fill(data, len, move |h, b| h.on_option(opt, b)),
            State::Drain { opt, left } => {
                let n = usize::try_from(left).unwrap_or(usize::MAX).min(data.len());
                let left = left - n as u64;
                if left == 0 {
                    self.reply(opt, rep::ERR_TOO_BIG, b"option too long");
                    self.state = State::OptionHeader;
                } else {
                    self.state = State::Drain { opt, left };
                }
                n
            }
            State::Done => 0,
        }
    }

    /// Collects `want` bytes in `buf`, then runs `then` on them.
    fn fill(&mut self, data: &[u8], want: usize, then: impl FnOnce(&mut Handshake, &[u8])) -> usize {
        let n = (want - self.buf.len()).min(data.len());
        self.buf.extend_from_slice(&data[..n]);
        if self.buf.len() == want {
            let b = std::mem::take(&mut self.buf);
            then(self, &b);
            self.buf = b;
            self.buf.clear();
        }
        n
    }

    fn close(&mut self, why: Closed) {
        self.state = State::Done;
        self.outcome = Outcome::Closed(why);
    }

    fn on_client_flags(&mut self, f: u32) {
        // NBD protocol, "Client flags": the server MUST drop the connection on an unknown
        // flag. A client without FIXED_NEWSTYLE is served as fixed newstyle anyway (allowed).
        if f & !(client_flags::FIXED_NEWSTYLE | client_flags::NO_ZEROES) != 0 {
            self.close(Closed::Protocol(format!("unknown client flags {f:#x}")));
            return;
        }
        self.no_zeroes = f & client_flags::NO_ZEROES != 0;
        self.state = State::OptionHeader;
    }

    fn on_option_header(&mut self, b: &[u8]) {
        if be64(b, 0) != IHAVEOPT {
            self.close(Closed::Protocol(format!("option magic {:#x} is not IHAVEOPT", be64(b, 0))));
            return;
        }
        self.options += 1;
        if self.options > OPTIONS_MAX {
            self.close(Closed::Protocol(format!("more than {OPTIONS_MAX} options")));
            return;
        }
        let (option, len) = (be32(b, 8), be32(b, 12));
        let len = usize::try_from(len).unwrap_or(usize::MAX);
        if len > OPTION_DATA_MAX {
            self.state = State::Drain { opt: option, left: len as u64 };
        } else if len == 0 {
            self.state = State::OptionHeader;
            self.on_option(option, &[]);
        } else {
            self.state = State::OptionData { opt: option, len };
        }
    }

    fn reply(&mut self, option: u32, kind: u32, payload: &[u8]) {
        option_reply(&mut self.out, option, kind, payload);
    }

    fn on_option(&mut self, option: u32, data: &[u8]) {
        if self.state != State::Done {
            self.state = State::OptionHeader;
        }
        match option {
            opt::EXPORT_NAME => self.on_export_name(data),
            opt::ABORT => {
                // The server MUST reply with ACK; data is ignored.
                self.reply(option, rep::ACK, &[]);
                self.close(Closed::Aborted);
            }
            opt::LIST => {
                if !data.is_empty() {
                    self.reply(option, rep::ERR_INVALID, b"NBD_OPT_LIST takes no data");
                    return;
                }
                let name = self.export.name.clone();
                let mut p = Vec::with_capacity(4 + name.len());
                p.extend_from_slice(&u32::try_from(name.len()).unwrap_or(0).to_be_bytes());
                p.extend_from_slice(name.as_bytes());
                self.reply(option, rep::SERVER, &p);
                self.reply(option, rep::ACK, &[]);
            }
            opt::INFO | opt::GO => self.on_info_go(option, data),
            opt::STRUCTURED_REPLY => {
                if data.is_empty() {
                    self.structured = true;
                    self.reply(option, rep::ACK, &[]);
                } else {
                    self.reply(option, rep::ERR_INVALID, b"NBD_OPT_STRUCTURED_REPLY takes no data");
                }
            }
            opt::LIST_META_CONTEXT | opt::SET_META_CONTEXT => self.on_meta_context(option, data),
            _ => self.reply(option, rep::ERR_UNSUP, b"option not supported by this server"),
        }
    }

    fn name_matches(&self, name: &[u8]) -> bool {
        name.is_empty() || name == self.export.name.as_bytes()
    }

    fn on_export_name(&mut self, name: &[u8]) {
        if !self.name_matches(name) {
            // It cannot be refused with an error: the server MUST terminate the session.
            self.close(Closed::Protocol(format!(
                "NBD_OPT_EXPORT_NAME asked for export {:?}, which is not served",
                String::from_utf8_lossy(name)
            )));
            return;
        }
        self.out.extend_from_slice(&self.export.size.to_be_bytes());
        self.out.extend_from_slice(&self.transmission_flags().to_be_bytes());
        if !self.no_zeroes {
            self.out.extend_from_slice(&[0u8; 124]);
        }
        self.state = State::Done;
        self.outcome = Outcome::Transmission(Negotiated { structured: self.structured, block_size_agreed: false });
    }

    /// Transmission flags for this connection: DF only with structured replies.
    fn transmission_flags(&self) -> u16 {
        let df = super::wire::flags::SEND_DF;
        if self.structured { self.export.flags } else { self.export.flags & !df }
    }

    fn on_info_go(&mut self, option: u32, data: &[u8]) {
        // Data: u32 name length, name, u16 count, count x u16 info requests.
        if data.len() < 6 {
            self.reply(option, rep::ERR_INVALID, b"option data shorter than 6 bytes");
            return;
        }
        let name_len = be32(data, 0) as usize;
        if name_len > data.len() - 6 {
            self.reply(option, rep::ERR_INVALID, b"export name longer than the option");
            return;
        }
        let name = &data[4..4 + name_len];
        let count = usize::from(be16(data, 4 + name_len));
        let reqs = &data[6 + name_len..];
        if reqs.len() != 2 * count {
            self.reply(option, rep::ERR_INVALID, b"information request count does not match the option length");
            return;
        }
        if !self.name_matches(name) {
            self.reply(option, rep::ERR_UNKNOWN, b"no such export");
            return;
        }
        let wanted = |t: u16| reqs.chunks_exact(2).any(|c| be16(c, 0) == t);
        let block_size_asked = wanted(info::BLOCK_SIZE);
        let mut p = Vec::with_capacity(12);
        p.extend_from_slice(&info::EXPORT.to_be_bytes());
        p.extend_from_slice(&self.export.size.to_be_bytes());
        p.extend_from_slice(&self.transmission_flags().to_be_bytes());
        self.reply(option, rep::INFO, &p);
        // Sent whether asked or not: the server enforces a minimum block size (NBD protocol,
        // "Size constraints": it MUST send it when asked and SHOULD advertise it).
        p.clear();
        p.extend_from_slice(&info::BLOCK_SIZE.to_be_bytes());
        p.extend_from_slice(&self.export.block_min.to_be_bytes());
        p.extend_from_slice(&self.export.block_preferred.to_be_bytes());
        p.extend_from_slice(&self.export.payload_max.to_be_bytes());
        self.reply(option, rep::INFO, &p);
        if wanted(info::NAME) {
            p.clear();
            p.extend_from_slice(&info::NAME.to_be_bytes());
            p.extend_from_slice(self.export.name.as_bytes());
            self.reply(option, rep::INFO, &p);
        }
        if wanted(info::DESCRIPTION) && !self.export.description.is_empty() {
            p.clear();
            p.extend_from_slice(&info::DESCRIPTION.to_be_bytes());
            p.extend_from_slice(self.export.description.as_bytes());
            self.reply(option, rep::INFO, &p);
        }
        self.reply(option, rep::ACK, &[]);
        if option == opt::GO {
            self.state = State::Done;
            self.outcome =
                Outcome::Transmission(Negotiated { structured: self.structured, block_size_agreed: block_size_asked });
        }
    }

    /// LIST/SET_META_CONTEXT: checked for syntax, answered with no context (none is offered).
    fn on_meta_context(&mut self, option: u32, data: &[u8]) {
        if !self.structured {
            self.reply(option, rep::ERR_INVALID, b"negotiate structured replies first");
            return;
        }
        if data.len() < 8 {
            self.reply(option, rep::ERR_INVALID, b"option data shorter than 8 bytes");
            return;
        }
        let name_len = be32(data, 0) as usize;
        if name_len > data.len() - 8 {
            self.reply(option, rep::ERR_INVALID, b"export name longer than the option");
            return;
        }
        let count = be32(data, 4 + name_len);
        if count > META_QUERIES_MAX {
            self.reply(option, rep::ERR_TOO_BIG, b"too many queries");
            return;
        }
        let mut at = 8 + name_len;
        for _ in 0..count {
            if data.len() - at < 4 {
                self.reply(option, rep::ERR_INVALID, b"query length past the end of the option");
                return;
            }
            let q = be32(data, at) as usize;
            at += 4;
            if q > data.len() - at {
                self.reply(option, rep::ERR_INVALID, b"query past the end of the option");
                return;
            }
            at += q;
        }
        if at != data.len() {
            self.reply(option, rep::ERR_INVALID, b"bytes after the last query");
            return;
        }
        if !self.name_matches(&data[4..4 + name_len]) {
            self.reply(option, rep::ERR_UNKNOWN, b"no such export");
            return;
        }
        self.reply(option, rep::ACK, &[]);
    }
}

#[cfg(test)]
#[allow(clippy::cast_possible_truncation)] // test inputs are small
mod tests {
    use super::super::wire::{OPT_REPLY_MAGIC, flags};
    use super::*;

    fn export() -> Export {
        Export {
            name: "vol".into(),
            description: "qpath head".into(),
            size: 1 << 30,
            flags: flags::HAS_FLAGS | flags::SEND_FLUSH | flags::SEND_TRIM | flags::SEND_DF,
            block_min: 512,
            block_preferred: 4096,
            payload_max: 32 << 20,
        }
    }

    fn option(o: u32, data: &[u8]) -> Vec<u8> {
        let mut v = IHAVEOPT.to_be_bytes().to_vec();
        v.extend_from_slice(&o.to_be_bytes());
        v.extend_from_slice(&(data.len() as u32).to_be_bytes());
        v.extend_from_slice(data);
        v
    }

    fn go_data(name: &str, infos: &[u16]) -> Vec<u8> {
        let mut d = (name.len() as u32).to_be_bytes().to_vec();
        d.extend_from_slice(name.as_bytes());
        d.extend_from_slice(&(infos.len() as u16).to_be_bytes());
        for i in infos {
            d.extend_from_slice(&i.to_be_bytes());
        }
        d
    }

    /// Option replies in `out`: (option, type, payload).
    fn replies(mut out: &[u8]) -> Vec<(u32, u32, Vec<u8>)> {
        let mut v = Vec::new();
        while out.len() >= 20 {
            assert_eq!(be64(out, 0), OPT_REPLY_MAGIC);
            let len = be32(out, 16) as usize;
            v.push((be32(out, 8), be32(out, 12), out[20..20 + len].to_vec()));
            out = &out[20 + len..];
        }
        assert!(out.is_empty(), "trailing bytes");
        v
    }

    fn started(client_flags: u32) -> Handshake {
        let mut h = Handshake::new(export());
        let greet = std::mem::take(h.output());
        assert_eq!(greet.len(), 18);
        assert_eq!(be64(&greet, 0), NBDMAGIC);
        assert_eq!(be64(&greet, 8), IHAVEOPT);
        assert_eq!(be16(&greet, 16), 3);
        assert_eq!(h.feed(&client_flags.to_be_bytes()), 4);
        h
    }

    #[test]
    fn go_with_structured_replies_enters_transmission() {
        let mut h = started(3);
        let mut input = option(opt::STRUCTURED_REPLY, &[]);
        input.extend(option(opt::GO, &go_data("vol", &[info::BLOCK_SIZE, info::NAME, info::DESCRIPTION])));
        input.extend_from_slice(b"next"); // transmission bytes must not be consumed
        let used = h.feed(&input);
        assert_eq!(used, input.len() - 4);
        assert_eq!(h.outcome(), &Outcome::Transmission(Negotiated { structured: true, block_size_agreed: true }));
        let r = replies(h.output());
        assert_eq!(r[0], (opt::STRUCTURED_REPLY, rep::ACK, vec![]));
        let export_info = &r[1].2;
        assert_eq!((r[1].0, r[1].1), (opt::GO, rep::INFO));
        assert_eq!(be16(export_info, 0), info::EXPORT);
        assert_eq!(be64(export_info, 2), 1 << 30);
        assert_ne!(be16(export_info, 10) & flags::SEND_DF, 0, "DF offered with structured replies");
        assert_eq!(be16(&r[2].2, 0), info::BLOCK_SIZE);
        assert_eq!((be32(&r[2].2, 2), be32(&r[2].2, 6), be32(&r[2].2, 10)), (512, 4096, 32 << 20));
        assert_eq!(&r[3].2[2..], b"vol");
        assert_eq!(&r[4].2[2..], b"qpath head");
        assert_eq!(r[5], (opt::GO, rep::ACK, vec![]));
    }

    #[test]
    fn export_name_with_and_without_zeroes() {
        for (cflags, tail) in [(1u32, 124usize), (3, 0)] {
            let mut h = started(cflags);
            h.feed(&option(opt::EXPORT_NAME, b""));
            assert_eq!(h.outcome(), &Outcome::Transmission(Negotiated { structured: false, block_size_agreed: false }));
            let out = h.output();
            assert_eq!(out.len(), 10 + tail);
            assert_eq!(be64(out, 0), 1 << 30);
            assert_eq!(be16(out, 8) & flags::SEND_DF, 0, "no DF without structured replies");
        }
    }

    #[test]
    fn unknown_export_name_ends_the_session_and_go_says_unknown() {
        let mut h = started(1);
        h.feed(&option(opt::GO, &go_data("other", &[])));
        assert_eq!(h.outcome(), &Outcome::Negotiating);
        assert_eq!(replies(h.output()), vec![(opt::GO, rep::ERR_UNKNOWN, b"no such export".to_vec())]);
        h.output().clear();
        h.feed(&option(opt::EXPORT_NAME, b"other"));
        assert!(matches!(h.outcome(), Outcome::Closed(Closed::Protocol(_))));
    }

    #[test]
    fn malformed_options_get_err_invalid_and_negotiation_goes_on() {
        let mut h = started(1);
        let mut bad_count = go_data("vol", &[info::NAME]);
        bad_count.push(0); // one byte too many for the count
        let mut long_name = 100u32.to_be_bytes().to_vec();
        long_name.extend_from_slice(&[0, 0]);
        h.feed(&option(opt::GO, &bad_count));
        h.feed(&option(opt::INFO, &long_name));
        h.feed(&option(opt::GO, &[1, 2]));
        h.feed(&option(opt::LIST, b"x"));
        h.feed(&option(opt::STRUCTURED_REPLY, b"x"));
        h.feed(&option(opt::SET_META_CONTEXT, &go_data("vol", &[])));
        h.feed(&option(opt::STARTTLS, &[]));
        h.feed(&option(99, b"whatever"));
        let kinds: Vec<u32> = replies(h.output()).iter().map(|r| r.1).collect();
        assert_eq!(
            kinds,
            vec![
                rep::ERR_INVALID,
                rep::ERR_INVALID,
                rep::ERR_INVALID,
                rep::ERR_INVALID,
                rep::ERR_INVALID,
                rep::ERR_INVALID,
                rep::ERR_UNSUP,
                rep::ERR_UNSUP
            ]
        );
        assert_eq!(h.outcome(), &Outcome::Negotiating);
    }

    #[test]
    fn meta_context_answers_an_empty_list() {
        let mut h = started(1);
        h.feed(&option(opt::STRUCTURED_REPLY, &[]));
        let mut d = 3u32.to_be_bytes().to_vec();
        d.extend_from_slice(b"vol");
        d.extend_from_slice(&1u32.to_be_bytes());
        d.extend_from_slice(&15u32.to_be_bytes());
        d.extend_from_slice(b"base:allocation");
        h.feed(&option(opt::SET_META_CONTEXT, &d));
        let mut bad = d.clone();
        bad.truncate(bad.len() - 1);
        h.feed(&option(opt::LIST_META_CONTEXT, &bad));
        let r = replies(h.output());
        assert_eq!(r[1], (opt::SET_META_CONTEXT, rep::ACK, vec![]));
        assert_eq!(r[2].1, rep::ERR_INVALID);
    }

    #[test]
    fn list_and_abort() {
        let mut h = started(1);
        h.feed(&option(opt::LIST, &[]));
        h.feed(&option(opt::ABORT, &[]));
        assert_eq!(h.outcome(), &Outcome::Closed(Closed::Aborted));
        let r = replies(h.output());
        assert_eq!(r[0].1, rep::SERVER);
        assert_eq!(&r[0].2, &[0, 0, 0, 3, b'v', b'o', b'l']);
        assert_eq!(r[1].1, rep::ACK);
        assert_eq!(r[2], (opt::ABORT, rep::ACK, vec![]));
    }

    #[test]
    fn bad_magic_and_bad_client_flags_disconnect() {
        let h = started(1 << 5);
        assert!(matches!(h.outcome(), Outcome::Closed(Closed::Protocol(m)) if m.contains("client flags")));
        let mut h = started(1);
        let mut o = option(opt::LIST, &[]);
        o[0] ^= 1;
        h.feed(&o);
        assert!(matches!(h.outcome(), Outcome::Closed(Closed::Protocol(m)) if m.contains("IHAVEOPT")));
    }

    #[test]
    fn oversized_option_is_drained_and_refused_without_buffering() {
        let mut h = started(1);
        let mut hdr = IHAVEOPT.to_be_bytes().to_vec();
        hdr.extend_from_slice(&opt::GO.to_be_bytes());
        hdr.extend_from_slice(&(1u32 << 20).to_be_bytes());
        h.feed(&hdr);
        let chunk = vec![0u8; 64 << 10];
        for _ in 0..16 {
            assert_eq!(h.feed(&chunk), chunk.len());
            assert!(h.buf.capacity() <= OPTION_DATA_MAX.max(64), "nothing of it is kept");
        }
        assert_eq!(replies(h.output()), vec![(opt::GO, rep::ERR_TOO_BIG, b"option too long".to_vec())]);
        h.output().clear();
        h.feed(&option(opt::EXPORT_NAME, b"vol"));
        assert!(matches!(h.outcome(), Outcome::Transmission(_)));
    }

    #[test]
    fn too_many_options_disconnect() {
        let mut h = started(1);
        for _ in 0..OPTIONS_MAX {
            h.feed(&option(opt::STARTTLS, &[]));
        }
        assert_eq!(h.outcome(), &Outcome::Negotiating);
        h.feed(&option(opt::STARTTLS, &[]));
        assert!(matches!(h.outcome(), Outcome::Closed(Closed::Protocol(_))));
    }

    #[test]
    fn byte_by_byte_equals_all_at_once() {
        let mut input = 3u32.to_be_bytes().to_vec();
        input.extend(option(opt::STRUCTURED_REPLY, &[]));
        input.extend(option(opt::INFO, &go_data("", &[info::BLOCK_SIZE])));
        input.extend(option(opt::GO, &go_data("vol", &[])));
        let mut a = Handshake::new(export());
        a.feed(&input);
        let mut b = Handshake::new(export());
        for byte in &input {
            b.feed(std::slice::from_ref(byte));
        }
        assert_eq!(a.output(), b.output());
        assert_eq!(a.outcome(), b.outcome());
        assert!(matches!(a.outcome(), Outcome::Transmission(n) if n.structured && !n.block_size_agreed));
    }
}
