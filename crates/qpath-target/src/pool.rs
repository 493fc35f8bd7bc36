//! Per-reactor data buffer pool.
//!
//! Buffers are page aligned (so the file backend can use O_DIRECT) and come
//! in power-of-two size classes from 4 KiB to the largest transfer. A buffer
//! returned to the pool is kept for reuse, so after warm-up the I/O path does
//! no allocation. The pool is owned by one reactor thread: no lock.
//! Outstanding bytes are capped; a request that cannot get a buffer waits in
//! its connection until one is returned. Kept (idle) bytes are capped too, at
//! the same number: a workload that moves from small to large transfers frees
//! small buffers beyond it instead of keeping every class's high-water mark, so
//! a reactor's buffers never hold more than twice the cap (plus in-capsule
//! data, which its queues bound).

use uring::IoBuf;

const MIN_SHIFT: u32 = 12;

/// A pool of page-aligned buffers in power-of-two classes.
#[derive(Debug)]
pub struct BufPool {
    classes: Vec<Vec<IoBuf>>,
    max_shift: u32,
    out_bytes: usize,
    cap_bytes: usize,
    /// Bytes of the buffers kept for reuse.
    cached_bytes: usize,
    /// Buffers allocated over the pool's life (for tests and stats).
    pub allocations: u64,
    /// Returned buffers freed because keeping them would pass the cap.
    pub released: u64,
}

impl BufPool {
    /// A pool for buffers up to `max_len` bytes, with at most `cap_bytes` handed out at once.
    pub fn new(max_len: usize, cap_bytes: usize) -> BufPool {
        let max_shift = max_len.next_power_of_two().trailing_zeros().max(MIN_SHIFT);
        BufPool {
            classes: (MIN_SHIFT..=max_shift).map(|_| Vec::new()).collect(),
            max_shift,
            out_bytes: 0,
            cap_bytes,
            cached_bytes: 0,
            allocations: 0,
            released: 0,
        }
    }

    fn class(&self, len: usize) -> Option<usize> {
        let shift = len.max(1).next_power_of_two().trailing_zeros().max(MIN_SHIFT);
        (shift <= self.max_shift).then(|| (shift - MIN_SHIFT) as usize)
    }

    /// A buffer with capacity ≥ `len` and length `len`, or `None` when the
    /// outstanding cap would be exceeded (the caller waits and retries).
    /// Larger-than-class requests get a one-off buffer (admin log pages).
    pub fn get(&mut self, len: usize) -> Option<IoBuf> {
        let cap = match self.class(len) {
            Some(c) => 4096usize << c,
            None => len.next_multiple_of(4096),
        };
        if self.out_bytes + cap > self.cap_bytes && self.out_bytes > 0 {
            return None;
        }
        Some(self.get_unbounded(len))
    }

    /// A buffer like [`BufPool::get`] that ignores the cap: for data already on the wire
    /// (in-capsule data), whose total its callers bound.
    pub fn get_unbounded(&mut self, len: usize) -> IoBuf {
        let cap = match self.class(len) {
            Some(c) => 4096usize << c,
            None => len.next_multiple_of(4096),
        };
        let mut buf = match self.class(len).and_then(|c| self.classes[c].pop()) {
            Some(b) => {
                self.cached_bytes -= b.capacity();
                b
            }
            None => {
                self.allocations += 1;
                IoBuf::new(cap)
            }
        };
        self.out_bytes += buf.capacity();
        buf.set_len(len);
        buf
    }

    /// Returns a buffer.
    pub fn put(&mut self, buf: IoBuf) {
        self.out_bytes = self.out_bytes.saturating_sub(buf.capacity());
        let cap = buf.capacity();
        if cap.is_power_of_two()
            && let Some(c) = self.class(cap)
            && 4096usize << c == cap
        {
            if self.cached_bytes + cap <= self.cap_bytes {
                self.cached_bytes += cap;
                self.classes[c].push(buf);
            } else {
                self.released += 1;
            }
        }
    }

    /// Bytes kept for reuse (at most the cap).
    pub fn cached(&self) -> usize {
        self.cached_bytes
    }

    /// Bytes handed out and not yet returned.
    pub fn outstanding(&self) -> usize {
        self.out_bytes
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reuses_and_caps() {
        let mut p = BufPool::new(1 << 20, 64 << 10);
        let a = p.get(4096).unwrap();
        assert_eq!(a.len(), 4096);
        assert_eq!(a.capacity(), 4096);
        let b = p.get(5000).unwrap();
        assert_eq!(b.capacity(), 8192);
        assert_eq!(b.len(), 5000);
        assert!(p.get(60 << 10).is_none(), "over the cap");
        let d = p.get_unbounded(60 << 10);
        assert_eq!(p.outstanding(), 4096 + 8192 + (64 << 10), "counted, though over the cap");
        p.put(a);
        p.put(b);
        p.put(d);
        assert_eq!(p.outstanding(), 0);
        assert_eq!(p.cached(), 4096 + 8192, "the 64 KiB buffer would pass the cap beside them: freed");
        assert_eq!(p.released, 1);
        let before = p.allocations;
        let c = p.get(100).unwrap();
        assert_eq!(p.allocations, before, "reused");
        p.put(c);
        let big = p.get(3 << 20).unwrap();
        assert_eq!(big.len(), 3 << 20);
        p.put(big);
    }

    #[test]
    fn kept_bytes_stay_under_the_cap_when_sizes_change() {
        let cap = 1 << 20;
        let mut p = BufPool::new(1 << 20, cap);
        // A burst of 4 KiB buffers up to the cap, all returned: all kept.
        let small: Vec<_> = (0..256).map(|_| p.get(4096).unwrap()).collect();
        small.into_iter().for_each(|b| p.put(b));
        assert_eq!(p.cached(), cap);
        // Then 256 KiB transfers: the pool has no buffer of that class and must allocate,
        // and what comes back no longer fits beside the kept 4 KiB ones.
        for _ in 0..3 {
            let big: Vec<_> = (0..4).map(|_| p.get(256 << 10).unwrap()).collect();
            big.into_iter().for_each(|b| p.put(b));
            assert!(p.cached() <= cap, "{} kept", p.cached());
        }
        assert!(p.released > 0, "buffers beyond the cap are freed");
        assert_eq!(p.outstanding(), 0);
        // Reuse still works for what is kept.
        let before = p.allocations;
        let b = p.get(4096).unwrap();
        assert_eq!(p.allocations, before);
        p.put(b);
    }
}
