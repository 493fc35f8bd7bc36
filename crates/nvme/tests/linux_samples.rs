//! Decodes the ICReq and Fabrics Connect PDUs that real Linux hosts (6.1,
//! 6.12 and 7.2) sent to a listener (captured by vmlab's nvmetcp_sink.py),
//! and checks every field Linux fills in.

use nvme::fabrics::{ConnectCmd, ConnectData};
use nvme::tcp::{Decoded, Decoder, DecoderConfig, Digests, Header, Role};
use nvme::{Cntlid, QueueId, SglKind};

fn samples() -> Vec<(String, Vec<u8>, Vec<u8>)> {
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/data");
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir).expect("tests/data") {
        let path = entry.unwrap().path();
        if path.extension().and_then(|e| e.to_str()) != Some("hex") {
            continue;
        }
        let text = std::fs::read_to_string(&path).unwrap();
        let pdu = |name: &str| -> Vec<u8> {
            let line = text.lines().find(|l| l.starts_with(name)).unwrap_or_else(|| panic!("{name} in {path:?}"));
            let hex = line.split_whitespace().nth(1).unwrap();
            (0..hex.len()).step_by(2).map(|i| u8::from_str_radix(&hex[i..i + 2], 16).unwrap()).collect()
        };
        out.push((path.file_name().unwrap().to_string_lossy().into_owned(), pdu("icreq"), pdu("capsule")));
    }
    out.sort();
    assert_eq!(out.len(), 4, "one sample per captured kernel");
    out
}

#[test]
fn linux_icreq_and_connect_decode() {
    for (name, icreq, capsule) in samples() {
        let mut dec = Decoder::new(DecoderConfig::initial(Role::Controller));
        let Decoded::Pdu(ic) = dec.decode_header(&icreq).unwrap() else { panic!("{name}: icreq incomplete") };
        let Header::IcReq(r) = ic.header else { panic!("{name}: not an ICReq") };
        assert_eq!((r.pfv, r.hpda, r.maxr2t), (0, 0, 0), "{name}");
        assert_eq!(r.digests, Digests::default(), "{name}: captured without -g/-G");
        assert_eq!(ic.layout.plen, icreq.len());

        // Negotiated: no digests; the admin queue accepts 8 KiB of in-capsule data (NVME_TCP_ADMIN_CCSZ).
        dec.config.established = true;
        dec.config.max_in_capsule = 8192;
        let Decoded::Pdu(cmd) = dec.decode_header(&capsule).unwrap() else { panic!("{name}: capsule incomplete") };
        assert_eq!(cmd.layout.plen, capsule.len(), "{name}");
        assert_eq!(cmd.layout.data_len, 1024, "{name}");
        let Header::CapsuleCmd(sqe) = cmd.header else { panic!("{name}: not a capsule") };
        assert!(sqe.is_connect(), "{name}");
        assert_eq!(sqe.sgl().kind(), SglKind::InCapsule { offset: 0 }, "{name}");
        assert_eq!(sqe.sgl().length, 1024);
        let c = ConnectCmd::from_sqe(&sqe);
        assert_eq!(c.qid, QueueId::ADMIN, "{name}");
        assert_eq!(c.sqsize, 31, "{name}: NVME_AQ_DEPTH - 1");
        assert_eq!(c.kato_ms, 5000, "{name}: default 5 s keep-alive");
        assert!(!c.sqflow_disabled(), "{name}");
        let data = &capsule[cmd.layout.data_offset..cmd.layout.data_offset + cmd.layout.data_len];
        let d = ConnectData::decode(data).unwrap();
        assert_eq!(d.cntlid, Cntlid::DYNAMIC, "{name}");
        assert_eq!(d.subnqn, "nqn.2024-01.io.vmlab:host-sink", "{name}");
        assert!(d.hostnqn.starts_with("nqn.2014-08.org.nvmexpress:uuid:"), "{name}: {}", d.hostnqn);
        // hostid is the UUID in the host NQN.
        assert_eq!(d.hostnqn, nvme::nqn::uuid_hostnqn(&d.hostid), "{name}");
    }
}
