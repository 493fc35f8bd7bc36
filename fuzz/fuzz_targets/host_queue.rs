//! The host's queue on arbitrary controller bytes: after the ICReq it sends,
//! it reads whatever the "controller" says, with commands of every direction
//! outstanding. Nothing may panic and buffers must come back.

#![no_main]

use libfuzzer_sys::fuzz_target;
use nvme::opcode::io;
use nvme::{Cid, Cntlid, Nsid, SglDescriptor, Sqe};
use qpath_host::queue::{DataDir, HostQueue, Io, QueueConfig};
use uring::IoBuf;

fuzz_target!(|data: &[u8]| {
    let Some((&sel, rest)) = data.split_first() else { return };
    let mut cfg = QueueConfig::io(1, 8, Cntlid(1), "nqn.2026-11.io.qpath:fuzz", "nqn.2014-08.org.nvmexpress:uuid:fuzz", [0; 16]);
    cfg.digests = nvme::tcp::Digests { header: sel & 1 != 0, data: sel & 2 != 0 };
    let mut q = HostQueue::new(cfg);
    if let Some(m) = q.take_send() {
        q.on_send_done(m, Ok(()));
    }
    // A valid ICResp and Connect response first when asked, so the fuzzer reaches the I/O states.
    if sel & 4 != 0 {
        let digests = nvme::tcp::Digests { header: sel & 1 != 0, data: sel & 2 != 0 };
        q.feed(&nvme::tcp::IcResp { pfv: 0, cpda: 0, digests, maxh2cdata: 65536 }.encode());
        let mut out = Vec::new();
        nvme::tcp::EncoderConfig { digests, data_align: 4 }.capsule_resp(&mut out, &nvme::Cqe::success(Cid(8)));
        q.feed(&out);
        let mut issued = 0u64;
        for (tag, (op, dir)) in [(io::READ, DataDir::FromController), (io::WRITE, DataDir::ToController), (io::FLUSH, DataDir::None)]
            .into_iter()
            .enumerate()
        {
            // The read is large enough for its payload to be received straight into its buffer.
            let len = match dir {
                DataDir::None => 0,
                DataDir::FromController => 32768,
                DataDir::ToController => 8192,
            };
            let sqe = Sqe::rw(op, Cid(0), Nsid(1), 0, 16, SglDescriptor::transport(len));
            let buf = (dir != DataDir::None).then(|| IoBuf::new(len as usize));
            if q.submit(u16::try_from(tag).unwrap(), Io { sqe, buf, len, dir, token: issued }).is_ok() {
                issued += 1;
            }
        }
    }
    q.feed(rest);
    while let Some(m) = q.take_send() {
        q.on_send_done(m, Ok(()));
    }
    q.abort_all(nvme::Status::HOST_PATH_ERROR);
    let done = q.completions().len();
    assert!(done <= 3);
});
