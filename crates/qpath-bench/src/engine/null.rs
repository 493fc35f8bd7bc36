//! fio's `null` engine: an asynchronous engine that completes every I/O at commit
//! without moving data. It measures the cost of the benchmark itself and exercises
//! the queue/commit/getevents path without hardware. Reads leave buffers untouched.

use std::collections::VecDeque;
use std::time::Duration;

use super::{Capabilities, Engine, EngineCtx, EngineFactory, FileInfo, Queued};
use crate::error::{Error, ErrorKind, Result};
use crate::io_u::{IoResult, IoU};

/// Factory for `ioengine=null`.
#[derive(Debug)]
pub struct NullFactory;

impl EngineFactory for NullFactory {
    fn name(&self) -> &str {
        "null"
    }

    fn create(&self, ctx: &EngineCtx<'_>) -> Result<Box<dyn Engine>> {
        let depth = usize::try_from(ctx.iodepth).unwrap_or(1);
        Ok(Box::new(Null {
            queued: VecDeque::with_capacity(depth),
            done: VecDeque::with_capacity(depth),
            reaped: VecDeque::with_capacity(depth),
        }))
    }
}

/// Units move queued -> done (at commit) -> reaped (at getevents) -> caller (event).
#[derive(Debug)]
struct Null {
    queued: VecDeque<IoU>,
    done: VecDeque<IoU>,
    reaped: VecDeque<IoU>,
}

impl Engine for Null {
    fn name(&self) -> &str {
        "null"
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities::default()
    }

    fn open(&mut self, ctx: &EngineCtx<'_>) -> Result<FileInfo> {
        let size = ctx
            .needed_size
            .ok_or_else(|| Error::new(ErrorKind::Option, "ioengine=null needs size= (there is no file to size it)"))?;
        Ok(FileInfo { size, block_size: 512 })
    }

    fn queue(&mut self, mut unit: IoU) -> Queued {
        unit.result = IoResult::Done { bytes: unit.len };
        self.queued.push_back(unit);
        Queued::Queued
    }

    fn commit(&mut self) -> Result<()> {
        self.done.extend(self.queued.drain(..));
        Ok(())
    }

    fn getevents(&mut self, min: usize, max: usize, _timeout: Option<Duration>) -> Result<usize> {
        // Everything committed is complete, so `min` is always met when it can be.
        assert!(self.reaped.is_empty(), "getevents called before the previous events were taken");
        let n = self.done.len().min(max.max(min));
        self.reaped.extend(self.done.drain(..n));
        Ok(n)
    }

    fn event(&mut self, index: usize) -> IoU {
        // Events are taken in order 0..n, so the front is always `index`.
        let _ = index;
        self.reaped.pop_front().expect("event() index within the last getevents count")
    }
}
