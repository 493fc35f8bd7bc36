#!/usr/bin/env python3
"""The differential conformance suite's judge: compares what the same nvme-cli commands
answered from Linux nvmet and from qpath target (tests/vm/guest/conformance.sh wrote each
command's output and exit status to SHARE/{nvmet,qpath}/NAME.{out,rc}).

    tests/vm/conformance.py [--kernel RELEASE] [--markdown FILE] SHARE

Every command gets a verdict, and every field of the structures nvme-cli decodes (Identify,
log pages, reservation reports): the same answer, or a difference one of the rules below
explains (with its reason), or an unexplained difference, which fails the run. The rules
are the documentation of where qpath deliberately differs from nvmet: fields that name the
implementation, limits each chooses, places where qpath follows the specification where
nvmet does not, and commands qpath implements that nvmet lacks (there qpath must succeed).
Prints the table (command, field, nvmet, qpath, verdict); exit 0 when nothing is
unexplained, 1 otherwise, 2 on bad input.
"""

import argparse
import json
import os
import re
import sys

# ---- verdict kinds -------------------------------------------------------------------------
SAME = "same"
EXPLAINED = "explained"
MORE = "qpath does more"
SKIP = "not compared"
DIFFERS = "UNEXPLAINED"


class Rule:
    """A documented difference. `kind` is EXPLAINED, MORE or SKIP; `check(nvmet, qpath)`
    (optional) must hold for the rule to apply, so a rule never hides a regression."""

    def __init__(self, kind, reason, check=None, kernels=None):
        self.kind, self.reason, self.check, self.kernels = kind, reason, check, kernels

    def applies(self, kmajor, a, b):
        if self.kernels and not self.kernels(kmajor):
            return False
        return self.check is None or bool(self.check(a, b))


def bits_superset(a, b):
    """qpath's bitmask has every bit nvmet's has."""
    try:
        return int(b) & int(a) == int(a)
    except (TypeError, ValueError):
        return False


def ident(reason="names the implementation (serial, model, firmware, NQN, IEEE OUI)"):
    return Rule(SKIP, reason)


def status_pair(nvmet_sc, qpath_sc):
    return lambda a, b: a.code == nvmet_sc and b.code == qpath_sc


def nvmet_lacks(a, b):
    """nvmet refuses the command as unsupported and qpath executes it."""
    return a.code in (0x001, 0x002, 0x109) and b.ok


# Identify Controller fields (nvme-cli's JSON names).
ID_CTRL = {
    "sn": ident(), "mn": ident(), "fr": ident(), "subnqn": ident(), "ieee": ident(),
    "vid": ident(), "ssvid": ident(), "cntlid": ident("controller ids are allocated per target"),
    "fguid": ident(),
    "ver": Rule(EXPLAINED, "the NVMe version each implementation reports (qpath: 2.0)"),
    "mdts": Rule(EXPLAINED, "transfer size limit: nvmet none (0), qpath a bounded one (its buffer pool)",
                 lambda a, b: int(b) > 0),
    "ioccsz": Rule(EXPLAINED, "in-capsule data size each target chooses (nvmet 16 KiB, qpath 8 KiB)"),
    "elpe": Rule(EXPLAINED, "error log entries kept (nvmet 128, qpath 64)", lambda a, b: int(b) > 0),
    "anagrpmax": Rule(EXPLAINED, "ANA groups each target offers (nvmet 128, qpath 32)", lambda a, b: int(b) > 0),
    "nanagrpid": Rule(EXPLAINED, "ANA groups each target offers (nvmet 128, qpath 32)", lambda a, b: int(b) > 0),
    "endgidmax": Rule(EXPLAINED, "nvmet reports one endurance group per namespace; qpath reports none"),
    "psds[0].max_power": Rule(SKIP, "a software target's power state is nominal"),
    "psds[0].entry_lat": Rule(SKIP, "a software target's power state is nominal"),
    "psds[0].exit_lat": Rule(SKIP, "a software target's power state is nominal"),
    "sgls": Rule(MORE, "qpath also sets bit 21 (Transport SGL Data Block, what NVMe/TCP uses for data "
                 "outside the capsule)", bits_superset),
    "oncs": Rule(MORE, "qpath implements more optional NVM commands (Compare, Verify, Copy...)", bits_superset),
    "fuses": Rule(MORE, "qpath implements fused Compare and Write", bits_superset),
    "ocfs": Rule(MORE, "qpath implements Copy (source range format 0)", bits_superset),
    "lpa": Rule(MORE, "qpath offers more log page attributes", bits_superset),
    "oaes": Rule(MORE, "qpath sends more asynchronous events", bits_superset),
    "oacs": Rule(MORE, "qpath implements more optional admin commands", bits_superset),
    "maxcmd": Rule(EXPLAINED, "outstanding commands per queue each target allows", lambda a, b: int(b) > 0),
    "nn": Rule(EXPLAINED, "namespaces per subsystem each target allows", lambda a, b: int(b) > 0),
    "mnan": Rule(EXPLAINED, "namespaces per subsystem each target allows", lambda a, b: int(b) > 0),
    "kas": Rule(EXPLAINED, "keep-alive granularity"),
    "nwpc": Rule(MORE, "qpath also offers Write Protect Until Power Cycle (what a read-only namespace of its "
                 "configuration is)", bits_superset),
}

ID_NS = {
    "nguid": Rule(EXPLAINED, "qpath derives stable NGUID/EUI-64 from the NQN and NSID; nvmet sets none unless configured"),
    "eui64": Rule(EXPLAINED, "qpath derives stable NGUID/EUI-64 from the NQN and NSID; nvmet sets none unless configured"),
    "endgid": Rule(EXPLAINED, "nvmet reports one endurance group per namespace; qpath reports none"),
    "rescap": Rule(MORE, "nvmet in Linux before 6.13 has no reservations (RESCAP 0); qpath has them",
                   bits_superset, kernels=lambda k: k < (6, 13)),
    "dlfeat": Rule(MORE, "qpath promises that deallocated blocks read as zeros where its backend guarantees it "
                   "(the dsm-*-zeros checks below prove it); nvmet's file backend promises nothing",
                   lambda a, b: int(a) == 0),
    "mssrl": Rule(MORE, "Copy limits (qpath implements Copy)"),
    "mcl": Rule(MORE, "Copy limits (qpath implements Copy)"),
    "msrc": Rule(MORE, "Copy limits (qpath implements Copy)"),
}

SMART = {
    "data_units_read": Rule(EXPLAINED, "qpath counts I/O on every backend; nvmet only on block devices"),
    "data_units_written": Rule(EXPLAINED, "qpath counts I/O on every backend; nvmet only on block devices"),
    "host_read_commands": Rule(EXPLAINED, "qpath counts I/O on every backend; nvmet only on block devices"),
    "host_write_commands": Rule(EXPLAINED, "qpath counts I/O on every backend; nvmet only on block devices"),
    "power_on_hours": Rule(EXPLAINED, "hours since each target started"),
    "avail_spare": Rule(EXPLAINED, "qpath reports its whole spare left (nothing wears) above a 10% threshold; "
                        "nvmet reports 0 and 0", lambda a, b: int(b) == 100),
    "spare_thresh": Rule(EXPLAINED, "as avail_spare", lambda a, b: int(b) == 10),
    "media_errors": Rule(EXPLAINED, "qpath counts its backend's failures; nvmet counts none for file namespaces"),
    "num_err_log_entries": Rule(SKIP, "each target's own error history"),
    "controller_busy_time": Rule(EXPLAINED, "qpath measures busy time; nvmet reports 0"),
}

FIELD_RULES = {
    "id-ctrl": ID_CTRL,
    "id-ns": ID_NS,
    "id-ns-2": ID_NS,
    "smart-log": SMART,
    "smart-log-ns1": SMART,
    "smart-log-after": SMART,
    "error-log": {"*": Rule(SKIP, "each target logs its own failures (qpath's entries are checked by its own tests)")},
    "error-log-after": {"*": Rule(SKIP, "each target logs its own failures (qpath's entries are checked by its own tests)")},
    "resv-report": {"regctlext[0].hostid": Rule(SKIP, "the guest's host id")},
    "resv-report-after": {},
}

# Whole-command rules: the status differs and the rule says why.
SPEC_LBA = Rule(EXPLAINED, "an LBA beyond the namespace: qpath answers LBA Out of Range (NVM Command Set "
                "§3.3.3.2), nvmet's file backend Capacity Exceeded (its ENOSPC mapping)",
                status_pair(0x081, 0x080))
NO_CMD = "nvmet has no {} command; qpath implements it"
def rules_of(name):
    """The rules for a command, most specific first (a name may have several: by kernel)."""
    return COMMAND_RULES.setdefault(name, [])


COMMAND_RULES = {
    "compare-same": Rule(MORE, NO_CMD.format("Compare"), nvmet_lacks),
    "compare-differs": Rule(MORE, NO_CMD.format("Compare") + " (a mismatch is Compare Failure)",
                            lambda a, b: a.code == 0x001 and b.code == 0x285),
    "verify": Rule(MORE, NO_CMD.format("Verify"), nvmet_lacks),
    "copy": Rule(MORE, NO_CMD.format("Copy"), nvmet_lacks),
    "compare-past-end": Rule(MORE, NO_CMD.format("Compare"), lambda a, b: a.code == 0x001 and b.code == 0x080),
    "verify-past-end": Rule(MORE, NO_CMD.format("Verify"), lambda a, b: a.code == 0x001 and b.code == 0x080),
    "copy-dest-past-end": Rule(MORE, NO_CMD.format("Copy"), lambda a, b: a.code == 0x001 and b.code == 0x080),
    "copy-source-past-end": Rule(MORE, NO_CMD.format("Copy"), lambda a, b: a.code == 0x001 and b.code == 0x080),
    "copy-too-many-ranges": Rule(MORE, NO_CMD.format("Copy") + "; more source ranges than MSRC allows is "
                                 "refused with Command Size Limit Exceeded (not sent where MSRC allows the "
                                 "128 ranges nvme-cli can send)",
                                 lambda a, b: a.code == 0x001 and (b.code == 0x183 or b.text.startswith("not sent"))),
    "fid-effects-log": Rule(MORE, "qpath serves the Feature Identifiers Supported and Effects page; this nvmet does "
                            "not", lambda a, b: a.code in (0x002, 0x109) and b.ok),
    "supported-log-pages-raw": Rule(MORE, "qpath serves the Supported Log Pages page; this nvmet does not",
                                    lambda a, b: a.code in (0x002, 0x109) and b.ok),
    "get-feature-0x07:value": Rule(EXPLAINED, "Number of Queues: nvmet reports its maximum, qpath the queues "
                                   "granted to this controller (NVMe Base §5.27.1.5)"),
    "get-feature-0x0c": Rule(EXPLAINED, "Autonomous Power State Transition (a PCIe power feature): neither "
                             "implements it; nvmet checks the data length first", status_pair(0x00f, 0x002)),
    "get-log-0x09": Rule(EXPLAINED, "nvmet offers the Endurance Group Information page (one group per "
                         "namespace, the LSI names it); qpath has no endurance groups", status_pair(0x00b, 0x109)),
    "read-past-end": SPEC_LBA,
    "read-straddles-end": SPEC_LBA,
    "write-past-end": SPEC_LBA,
    "write-zeroes-past-end": SPEC_LBA,
    "dsm-past-end": SPEC_LBA,
    "write-zeroes": Rule(MORE, "nvmet's file backend fails Write Zeroes where the file system lacks "
                         "FALLOC_FL_ZERO_RANGE (the guest's tmpfs); qpath falls back to writing zeros",
                         lambda a, b: not a.ok and b.ok),
    "write-zeroes-deac": Rule(MORE, "as write-zeroes", lambda a, b: not a.ok and b.ok),
    "write-zeroes-zeros": Rule(MORE, "nvmet's Write Zeroes failed (above); qpath's blocks read zeros",
                               lambda a, b: b.text.strip() == "match"),
    "write-zeroes-deac-zeros": Rule(MORE, "as write-zeroes-zeros", lambda a, b: b.text.strip() == "match"),
    "copy-dest": Rule(MORE, NO_CMD.format("Copy") + "; the destination holds the sources",
                      lambda a, b: b.text.strip() == "match"),
    "set-feature-0x0b-save": Rule(EXPLAINED, "Save with a feature that cannot be saved (ONCS bit 4 clear): "
                                  "qpath answers Feature Identifier Not Saveable (NVMe Base §5.27.1), nvmet "
                                  "ignores the Save bit", lambda a, b: a.ok and b.code == 0x10d),
    "get-log-odd-offset": Rule(EXPLAINED, "a log page offset that is not a multiple of 4: qpath answers "
                               "Invalid Field in Command (NVMe Base §5.16), nvmet Internal Error",
                               status_pair(0x006, 0x002)),
    "get-log-0x04": Rule(MORE, "nvmet reads only the whole 4 KiB Changed Namespace List; qpath also a part",
                         lambda a, b: a.code == 0x006 and b.ok),
    "get-log-0x00": Rule(MORE, "nvmet refuses a part of this page (Data SGL Length Invalid), or (before Linux "
                         "6.x) the page; qpath returns it", lambda a, b: a.code in (0x00f, 0x002) and b.ok),
    "get-log-0x05": Rule(MORE, "nvmet refuses a part of this page (Data SGL Length Invalid); qpath returns it",
                         lambda a, b: a.code == 0x00f and b.ok),
}
COMMAND_RULES = {k: [v] for k, v in COMMAND_RULES.items()}
# Log pages neither offers: nvmet answers Invalid Field, qpath Invalid Log Page (§5.16: "the
# log page indicated is invalid").
for lid in ["0x%02x" % i for i in range(0x100)]:
    rules_of("get-log-" + lid).append(Rule(
        EXPLAINED, "a log page neither offers: qpath answers Invalid Log Page (NVMe Base §5.16), nvmet "
        "Invalid Field in Command", status_pair(0x002, 0x109)))
# Features nvmet does not answer (it supports only what Linux hosts use); qpath answers
# the mandatory ones (NVMe Base §5.27.1, Figure "Feature Identifiers": Arbitration, Power
# Management, Temperature Threshold, Write Atomicity Normal...) and Select 011b (supported
# capabilities) of every feature.
for f in ["0x%02x" % i for i in range(0x100)]:
    rules_of("get-feature-%s-supported" % f).append(Rule(
        MORE, "nvmet does not answer Select 011b (supported capabilities) for this feature; qpath does",
        lambda a, b: not a.ok and b.ok))
    rules_of("get-feature-" + f).append(Rule(
        MORE, "a feature this nvmet does not answer (mandatory ones among them); qpath answers it", nvmet_lacks))
    rules_of("set-feature-" + f).append(Rule(
        EXPLAINED, "setting a feature that is not changeable: qpath answers Feature Not Changeable "
        "(NVMe Base §5.27.1), nvmet Invalid Field in Command", status_pair(0x002, 0x10e)))
# Select 011b (supported capabilities): nvmet ignores Select and returns the current value;
# qpath returns the capabilities (bit 0 saveable, 1 namespace specific, 2 changeable).
for f in ["0x%02x" % i for i in range(0x100)]:
    rules_of("get-feature-%s-supported:value" % f).append(Rule(
        EXPLAINED, "Select 011b: nvmet returns the current value, qpath the capabilities (NVMe Base §5.27.1, "
        "Figure \"Get Features - Select\")",
        lambda a, b: re.search(r"capabilities (0x)?0*[0-7]$", b.summary()) is not None))

# Reservations: Linux nvmet has them since 6.13 (resv_enable); 6.1's nvmet has none.
OLD_NVMET = lambda k: k < (6, 13)
for name in ["resv-register", "resv-acquire", "resv-report", "resv-acquire-wrong-key", "resv-release",
             "resv-unregister", "resv-report-after", "get-feature-0x83", "get-feature-0x83-supported",
             "get-feature-0x82", "get-feature-0x82-supported", "set-feature-0x82", "resv-notif-log",
             "get-log-0x80"]:
    rules_of(name).append(Rule(MORE, "nvmet in Linux before 6.13 has no reservations; qpath has them",
                               lambda a, b: not a.ok and (b.ok or a.code == b.code or (a.code == 0x001 and b.code == 0x083)),
                               kernels=OLD_NVMET))


class Answer:
    """One command's answer from one target."""

    def __init__(self, text, rc):
        self.text, self.rc = text, rc
        m = re.search(r"NVMe status: ([^(]*)\(0x([0-9a-f]+)\)", text)
        # SCT and SC (bits 10:0 of the status field); the More and DNR bits apart.
        self.code = int(m.group(2), 16) & 0x7FF if m else None
        self.more = bool(int(m.group(2), 16) & 0x2000) if m else False
        self.name = m.group(1).split(":")[0].strip() if m else None
        self.ok = rc == 0
        self.json = None
        if self.ok:
            try:
                self.json = json.loads(text)
            except ValueError:
                pass

    def summary(self):
        if self.code is not None:
            return "%s (%03xh)" % (self.name, self.code)
        if not self.ok:
            first = self.text.strip().splitlines()[:1]
            return "exit %d: %s" % (self.rc, first[0][:60] if first else "")
        m = re.search(r"(Current value|Supported capabilities value):\s*(0x[0-9a-f]+|\d+)", self.text)
        if m:
            return "%s %s" % ("value" if m.group(1) == "Current value" else "capabilities", m.group(2))
        line = self.text.strip().splitlines()[:1]
        return line[0][:60] if line and self.json is None else "success"


def flatten(x, path=""):
    if isinstance(x, dict):
        for k, v in x.items():
            yield from flatten(v, "%s.%s" % (path, k) if path else k)
    elif isinstance(x, list):
        for i, v in enumerate(x):
            yield from flatten(v, "%s[%d]" % (path, i))
    else:
        yield path, x


def normalize(name, doc):
    """Removes what only names the guest's device (nvmeN) from a decoded structure."""
    if name == "fw-log" and isinstance(doc, dict) and len(doc) == 1:
        return list(doc.values())[0]
    if isinstance(doc, dict):
        doc = {k: v for k, v in doc.items() if "NVMe device" not in k}
    return doc


def hexdump_bytes(text):
    """The bytes of nvme-cli's get-log hex dump ("0010: 01 00 ... \"....\"")."""
    out = bytearray()
    for line in text.splitlines():
        m = re.match(r"\s*([0-9a-f]{4,}):((?: [0-9a-f]{2})+)", line)
        if m:
            out += bytes(int(x, 16) for x in m.group(2).split())
    return bytes(out)


def dwords(data):
    return [int.from_bytes(data[i:i + 4], "little") for i in range(0, len(data) - 3, 4)]


# Commands Supported and Effects (LID 05h): 256 admin then 256 I/O dwords; bit 0 CSUPP.
EFFECTS_NAMES = {
    ("admin", 0x00): "Delete I/O SQ", ("admin", 0x01): "Create I/O SQ", ("admin", 0x02): "Get Log Page",
    ("admin", 0x04): "Delete I/O CQ", ("admin", 0x05): "Create I/O CQ", ("admin", 0x06): "Identify",
    ("admin", 0x08): "Abort", ("admin", 0x09): "Set Features", ("admin", 0x0a): "Get Features",
    ("admin", 0x0c): "Async Event Request", ("admin", 0x18): "Keep Alive", ("admin", 0x7f): "Fabrics",
    ("io", 0x00): "Flush", ("io", 0x01): "Write", ("io", 0x02): "Read", ("io", 0x04): "Write Uncorrectable",
    ("io", 0x05): "Compare", ("io", 0x08): "Write Zeroes", ("io", 0x09): "Dataset Management",
    ("io", 0x0c): "Verify", ("io", 0x0d): "Reservation Register", ("io", 0x0e): "Reservation Report",
    ("io", 0x11): "Reservation Acquire", ("io", 0x15): "Reservation Release", ("io", 0x19): "Copy",
}
# Where the effects of a command both support may differ, and why.
EFFECTS_RULES = {
    ("io", 0x09): "Dataset Management: qpath marks it as changing block contents (LBCC), since deallocated "
                  "blocks read as zeros there (DLFEAT 001b); nvmet does not",
    ("admin", 0x09): "Set Features: nvmet marks it as changing the controller capabilities (CCC); qpath does "
                     "not, since no feature it lets a host set changes them",
}


def effects_entries(data):
    d = dwords(data)
    out = {}
    for i, v in enumerate(d[:512]):
        if v & 1:
            out[("admin" if i < 256 else "io", i % 256)] = v
    return out


def judge_effects(name, a, b, kmajor, rows):
    ea, eb = effects_entries(hexdump_bytes(a.text)), effects_entries(hexdump_bytes(b.text))
    if not ea or not eb:
        rows.append((name, "entries", str(len(ea)), str(len(eb)), DIFFERS))
        return 1
    bad = 0
    for key in sorted(set(ea) | set(eb)):
        label = "%s %02xh %s" % (key[0], key[1], EFFECTS_NAMES.get(key, ""))
        va, vb = ea.get(key), eb.get(key)
        show = lambda v: "-" if v is None else "%08x" % v
        if va == vb:
            rows.append((name, label, show(va), show(vb), SAME))
        elif va is None:
            rows.append((name, label, show(va), show(vb), "%s: nvmet does not support it" % MORE))
        elif key in EFFECTS_RULES and vb is not None:
            rows.append((name, label, show(va), show(vb), "%s: %s" % (EXPLAINED, EFFECTS_RULES[key])))
        elif vb is not None and va == 0x1 and vb == 0x3 and key in (("io", 0x01), ("io", 0x08)):
            rows.append((name, label, show(va), show(vb), "%s: qpath marks a command that changes block contents "
                         "(LBCC), as Linux 7.x nvmet does; this older nvmet marks none" % EXPLAINED))
        else:
            rows.append((name, label, show(va), show(vb), DIFFERS))
            bad += 1
    return bad


# Log pages nvmet supports and qpath does not, and why.
LOG_PAGE_RULES = {
    0x09: "Endurance Group Information: nvmet reports one endurance group per namespace; qpath has none",
    0x16: "Rotational Media Information: nvmet's page for namespaces on rotational disks",
}


def judge_supported_logs(name, a, b, kmajor, rows):
    la = {i for i, v in enumerate(dwords(hexdump_bytes(a.text))[:256]) if v & 1}
    lb = {i for i, v in enumerate(dwords(hexdump_bytes(b.text))[:256]) if v & 1}
    if not lb:
        rows.append((name, "log pages", " ".join("%02xh" % i for i in sorted(la)), "none", DIFFERS))
        return 1
    bad = 0
    for lid in sorted(la | lb):
        va, vb = ("yes" if lid in la else "no"), ("yes" if lid in lb else "no")
        if va == vb:
            verdict = SAME
        elif lid in lb:
            verdict = "%s: qpath offers it too" % MORE
        elif lid in LOG_PAGE_RULES:
            verdict = "%s: %s" % (EXPLAINED, LOG_PAGE_RULES[lid])
        else:
            verdict = DIFFERS
            bad += 1
        rows.append((name, "LID %02xh" % lid, va, vb, verdict))
    return bad


def ns_desc_types(doc):
    return sorted(d.get("type") for d in doc.get("ns-descs", []))


def first_rule(name, kmajor, a, b):
    for r in COMMAND_RULES.get(name, []):
        if r.applies(kmajor, a, b):
            return r
    return None


def judge_command(name, a, b, kmajor, rows):
    """Appends the rows for one command; returns the number of unexplained differences."""
    bad = 0
    same_status = (a.ok and b.ok) or (a.code is not None and a.code == b.code) or (
        not a.ok and not b.ok and a.code is None and b.code is None and a.text.strip() == b.text.strip())
    if not same_status:
        rule = first_rule(name, kmajor, a, b)
        if rule:
            rows.append((name, "status", a.summary(), b.summary(), "%s: %s" % (rule.kind, rule.reason)))
        else:
            rows.append((name, "status", a.summary(), b.summary(), DIFFERS))
            bad += 1
        return bad
    # Same status. Errors: the More bit says whether an Error Information entry exists.
    if not a.ok:
        verdict = SAME
        if a.more and not b.more:
            verdict = DIFFERS + " (More bit: nvmet 1, qpath 0: qpath logged no Error Information entry)"
            bad += 1
        elif b.more and not a.more:
            verdict = EXPLAINED + ": qpath logs every failed command in its Error Information log and says so " \
                "(More); nvmet logs fewer (e.g. reservation conflicts)"
        rows.append((name, "status", a.summary(), b.summary(), verdict))
        return bad
    # Both succeeded: compare what they returned.
    if name == "effects-log":
        return judge_effects(name, a, b, kmajor, rows)
    if name == "supported-log-pages-raw":
        return judge_supported_logs(name, a, b, kmajor, rows)
    if a.json is not None and b.json is not None:
        return bad + judge_fields(name, normalize(name, a.json), normalize(name, b.json), kmajor, rows)
    sa, sb = a.summary(), b.summary()
    if name.startswith(("dsm-", "write-", "read-data", "copy-", "compare-")) and a.text.strip() != b.text.strip():
        # a read-back note of the guest: "match" or "mismatch (...)"
        rule = first_rule(name, kmajor, a, b)
        if rule:
            rows.append((name, "read back", a.text.strip()[:40], b.text.strip()[:40], "%s: %s" % (rule.kind, rule.reason)))
        else:
            rows.append((name, "read back", a.text.strip()[:40], b.text.strip()[:40], DIFFERS))
            bad += 1
        return bad
    if sa != sb and ("value" in sa or "capabilities" in sa):
        rule = first_rule(name + ":value", kmajor, a, b)
        if rule:
            rows.append((name, "value", sa, sb, "%s: %s" % (rule.kind, rule.reason)))
        else:
            rows.append((name, "value", sa, sb, DIFFERS))
            bad += 1
        return bad
    rows.append((name, "status", sa, sb, SAME))
    return bad


def judge_fields(name, ja, jb, kmajor, rows):
    bad = 0
    if name.startswith("ns-descs"):
        ta, tb = ns_desc_types(ja), ns_desc_types(jb)
        if set(ta) <= set(tb):
            verdict = SAME if ta == tb else "%s: qpath also reports %s" % (MORE, ", ".join(sorted(set(tb) - set(ta))))
            rows.append((name, "descriptor types", " ".join(ta), " ".join(tb), verdict))
            rows.append((name, "values", "", "", "%s: UUIDs and NGUIDs name each namespace" % SKIP))
            return 0
        rows.append((name, "descriptor types", " ".join(ta), " ".join(tb), DIFFERS))
        return 1
    fa, fb = dict(flatten(ja)), dict(flatten(jb))
    rules = FIELD_RULES.get(name, {})
    equal = 0
    for key in sorted(set(fa) | set(fb)):
        va, vb = fa.get(key), fb.get(key)
        if va == vb:
            equal += 1
            continue
        rule = rules.get(key) or rules.get("*")
        if rule and rule.applies(kmajor, va, vb):
            verdict = "%s: %s" % (rule.kind, rule.reason)
        else:
            verdict = DIFFERS
            bad += 1
        rows.append((name, key, str(va), str(vb), verdict))
    rows.append((name, "(%d other fields)" % equal, "", "", SAME))
    return bad


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("share")
    ap.add_argument("--kernel", default="", help="the guest's kernel release (rules that depend on it)")
    ap.add_argument("--markdown", help="also write the table here")
    args = ap.parse_args()
    m = re.match(r"(\d+)\.(\d+)", args.kernel)
    kmajor = (int(m.group(1)), int(m.group(2))) if m else (99, 0)
    dirs = [os.path.join(args.share, t) for t in ("nvmet", "qpath")]
    for d in dirs:
        if not os.path.isdir(d):
            print("conformance: no results in %s" % d, file=sys.stderr)
            return 2
    names = sorted(f[:-3] for f in os.listdir(dirs[0]) if f.endswith(".rc"))
    if not names:
        print("conformance: no commands in %s" % dirs[0], file=sys.stderr)
        return 2
    rows, bad, missing = [], 0, []
    for name in names:
        try:
            ans = []
            for d in dirs:
                with open(os.path.join(d, name + ".rc")) as f:
                    rc = int(f.read().strip() or "255")
                with open(os.path.join(d, name + ".out"), errors="replace") as f:
                    ans.append(Answer(f.read(), rc))
        except OSError:
            missing.append(name)
            continue
        bad += judge_command(name, ans[0], ans[1], kmajor, rows)
    for name in missing:
        rows.append((name, "status", "ran", "did not run", DIFFERS))
        bad += 1
    width = [max(len(r[i]) for r in rows + [("command", "field", "nvmet", "qpath", "verdict")]) for i in range(4)]
    lines = ["| command | field | nvmet | qpath | verdict |", "| --- | --- | --- | --- | --- |"]
    for r in rows:
        lines.append("| %s |" % " | ".join(c.replace("|", "/") for c in r))
        print("%-*s  %-*s  %-*s  %-*s  %s" % (width[0], r[0], width[1], r[1], width[2], r[2][:width[2]],
                                             width[3], r[3][:width[3]], r[4]))
    counts = {}
    for r in rows:
        counts[r[4].split(":")[0].split(" (")[0]] = counts.get(r[4].split(":")[0].split(" (")[0], 0) + 1
    summary = "conformance (Linux %s nvmet vs qpath): %d commands, %s" % (
        args.kernel or "?", len(names), ", ".join("%s %d" % kv for kv in sorted(counts.items())))
    print(summary)
    if args.markdown:
        with open(args.markdown, "w") as f:
            f.write("# %s\n\n" % summary)
            f.write("\n".join(lines) + "\n")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
