#!/bin/bash
# tests/package/inside.sh — run by tests/package/run.sh inside the clean Debian system, as
# root, with the package at /root/qpath.deb. MODE=boot: systemd runs (systemctl, the
# journal); MODE=chroot: no systemd, the target is started by hand. Prints one "ok:" or
# "FAIL:" line per check and "PASS" at the end when none failed. Every command is bounded.
set -u
export PATH=/usr/sbin:/usr/bin:/sbin:/bin LC_ALL=C
FAILED=0
NQN=nqn.2026-11.io.qpath:default
SOCK=/run/qpath/qpath.sock

# t WHAT CMD...: CMD must succeed within 60 s.
t() {
  local what=$1 out
  shift
  if out=$(timeout 60 "$@" 2>&1); then
    echo "ok: $what"
  else
    echo "FAIL: $what ($*)"
    echo "$out" | tail -20 | sed 's/^/      /'
    FAILED=1
  fi
}
# c WHAT 'SHELL CONDITION': the condition must hold.
c() {
  if timeout 60 bash -c "$2" > /dev/null 2>&1; then echo "ok: $1"; else
    echo "FAIL: $1 ($2)"
    FAILED=1
  fi
}
# w WHAT SECONDS 'SHELL CONDITION': the condition must come to hold within SECONDS.
w() {
  local end=$((SECONDS + $2))
  until timeout 10 bash -c "$3" > /dev/null 2>&1; do
    if [ $SECONDS -ge $end ]; then
      echo "FAIL: $1 (not within $2 s: $3)"
      FAILED=1
      return
    fi
    sleep 0.5
  done
  echo "ok: $1"
}
# The files of the system, outside what changes by itself (logs, caches, dpkg's and
# systemd's state, this test's own files).
files() {
  find / -xdev \( -path /proc -o -path /sys -o -path /dev -o -path /run -o -path /tmp -o -path /root \
    -o -path /var/log -o -path /var/cache -o -path /var/tmp -o -path /var/lib/dpkg -o -path /var/lib/systemd \
    -o -path /var/lib/apt \) -prune -o -print | sort
}

echo "mode: $MODE"
files > /root/files-before.txt

# ---- install -----------------------------------------------------------------------------
t "dpkg -i installs the package" dpkg -i /root/qpath.deb
UNIT=$(ls /lib/systemd/system/qpath-target.service /usr/lib/systemd/system/qpath-target.service 2> /dev/null | head -1)
c "the unit is installed" "[ -n '$UNIT' ]"
HUNIT=$(ls /lib/systemd/system/qpath-host.service /usr/lib/systemd/system/qpath-host.service 2> /dev/null | head -1)
c "the host's unit is installed" "[ -n '$HUNIT' ]"
for f in /usr/bin/qpath /etc/qpath/target.toml /etc/qpath/host.toml /etc/default/qpath-target /usr/share/man/man1/qpath.1.gz \
  /usr/share/man/man1/qpath-target.1.gz /usr/share/bash-completion/completions/qpath \
  /usr/share/zsh/vendor-completions/_qpath /usr/share/fish/vendor_completions.d/qpath.fish \
  /usr/share/doc/qpath/copyright /usr/share/doc/qpath/README.md /usr/share/doc/qpath/examples/target.toml; do
  c "installed: $f" "[ -s $f ]"
done
c "/var/lib/qpath exists, mode 750" "[ \"\$(stat -c %a /var/lib/qpath)\" = 750 ]"
c "the configuration files are conffiles" \
  "dpkg-query -W -f='\${Conffiles}' qpath | grep -q '/etc/qpath/target.toml ' && dpkg-query -W -f='\${Conffiles}' qpath | grep -q '/etc/default/qpath-target '"
c "/etc/qpath/host.toml is a conffile" "dpkg-query -W -f='\${Conffiles}' qpath | grep -q '/etc/qpath/host.toml '"
c "qpath --version names its commit" "qpath --version | grep -q 'commit'"
c "the shipped host configuration checks and lists no device" \
  "qpath host --config /etc/qpath/host.toml --check | grep -q 'configuration OK, 0 device(s)'"
c "the shipped configuration checks" "qpath target --config /etc/qpath/target.toml --check"
c "the shipped configuration listens on loopback only" "! grep -E '^addr' /etc/qpath/target.toml | grep -v '\"127\\.0\\.0\\.1:'"

if [ "$MODE" = boot ]; then
  # ---- the service, as systemd runs it -----------------------------------------------------
  c "installed but not enabled" "[ \"\$(systemctl is-enabled qpath-target)\" = disabled ]"
  c "installed but not started" "! systemctl is-active --quiet qpath-target"
  t "systemd-analyze verify accepts the unit" systemd-analyze verify --man=no "$UNIT"
  t "systemctl start returns once the target is ready (Type=notify)" systemctl start qpath-target
  c "STATUS names what it serves" \
    "systemctl show -p StatusText --value qpath-target | grep -qx 'serving 1 subsystem (1 namespace) on 127.0.0.1:4420, 127.0.0.1:4421'"
  t "discovery answers on 4420" bash -c "qpath discover -a 127.0.0.1 -s 4420 | grep -q $NQN"
  t "a host connects and sees namespace 1 (I/O queues over io_uring, under the unit's filters)" \
    bash -c "qpath connect -a 127.0.0.1 -s 4420 -n $NQN | grep -qE 'nsid +1 +268435456 bytes'"
  t "the RPC socket answers in /run/qpath" qpath rpc --socket $SOCK get_target
  t "a file namespace in /var/lib/qpath is created over RPC" \
    qpath rpc --socket $SOCK add_namespace nqn=$NQN backend=file path=/var/lib/qpath/vol2.img size=16M
  c "its image is there, 16 MiB" "[ \"\$(stat -c %s /var/lib/qpath/vol2.img)\" = 16777216 ]"
  c "--persist saved the change to /etc/qpath/target.toml (writable through the sandbox)" \
    "grep -q /var/lib/qpath/vol2.img /etc/qpath/target.toml && [ -f /etc/qpath/target.toml.bak ]"
  c "the journal has the target's log" \
    "journalctl -u qpath-target --no-pager | grep -q 'persisting every change to /etc/qpath/target.toml'"
  cat >> /etc/qpath/target.toml << 'TOML'

[[subsystem]]
nqn = "nqn.2026-11.io.qpath:reloaded"
allow_any_host = true

[[subsystem.namespace]]
backend = "ram"
size = "16M"
TOML
  t "systemctl reload" systemctl reload qpath-target
  w "a reload applies the edited file and says so in STATUS" 30 \
    "systemctl show -p StatusText --value qpath-target | grep -q '^serving 2 subsystems (3 namespaces) on .*; reloaded: 1 change(s) applied, 0 refused'"
  c "the reloaded subsystem is discovered" "qpath discover -a 127.0.0.1 -s 4420 | grep -q nqn.2026-11.io.qpath:reloaded"
  pid=$(systemctl show -p MainPID --value qpath-target)
  t "kill -9 of the target" bash -c "kill -9 $pid"
  w "Restart=on-failure brings it back, ready" 60 \
    "systemctl is-active --quiet qpath-target && [ \"\$(systemctl show -p MainPID --value qpath-target)\" != $pid ] && systemctl show -p StatusText --value qpath-target | grep -q '^serving 2 subsystems (3 namespaces)'"
  c "what was saved is served after the restart (the file namespace, nsid 2)" \
    "qpath connect -a 127.0.0.1 -s 4420 -n $NQN | grep -qE 'nsid +2 +16777216 bytes'"
  sed -i 's|^QPATH_TARGET_OPTS=""$|QPATH_TARGET_OPTS="--metrics 127.0.0.1:9420"|' /etc/default/qpath-target
  t "systemctl restart, with options from /etc/default/qpath-target" systemctl restart qpath-target
  c "those options apply: metrics on 127.0.0.1:9420" \
    "exec 3<>/dev/tcp/127.0.0.1/9420 && printf 'GET /metrics HTTP/1.0\r\n\r\n' >&3 && timeout 5 cat <&3 | grep -q '^qpath_target_'"
  t "systemctl stop" systemctl stop qpath-target
  c "stopped cleanly" "! systemctl is-failed --quiet qpath-target && journalctl -u qpath-target --no-pager | grep -q 'shutting down'"
  cp /etc/qpath/target.toml /root/target.toml.good
  printf '[[port]]\nid = 1\naddr = "127.0.0.1:notaport"\n' > /etc/qpath/target.toml
  c "systemctl start fails on a configuration that does not start" "! systemctl start qpath-target"
  c "the journal says why, naming the address" "journalctl -u qpath-target --no-pager | grep -q '127.0.0.1:notaport'"
  systemctl stop qpath-target
  systemctl reset-failed qpath-target 2> /dev/null
  cp /root/target.toml.good /etc/qpath/target.toml
  systemd-analyze security --no-pager qpath-target 2> /dev/null | tail -1 | sed 's/^/info: /'

  # ---- the host service: ublk devices from /etc/qpath/host.toml ----------------------------
  HSOCK=/run/qpath-host/qpath-host.sock
  c "the host service: installed but not enabled" "[ \"\$(systemctl is-enabled qpath-host)\" = disabled ]"
  c "the host service: installed but not started" "! systemctl is-active --quiet qpath-host"
  t "systemd-analyze verify accepts the host's unit" systemd-analyze verify --man=no "$HUNIT"
  t "systemctl start qpath-host returns once it is ready (Type=notify), with the empty configuration" \
    systemctl start qpath-host
  c "its STATUS: no device" "systemctl show -p StatusText --value qpath-host | grep -qx 'serving 0 ublk device(s)'"
  t "its control socket answers ublk_list in /run/qpath-host" bash -c "qpath rpc --socket $HSOCK ublk_list | grep -qx '\[\]'"
  t "qpath ublk list finds the service's socket by itself" qpath ublk list
  # This container has no ublk driver: a configured device fails by name, the service goes on.
  t "the target, for the host's device" systemctl start qpath-target
  cat >> /etc/qpath/host.toml << TOML

[[ublk]]
name = "pkgtest"
paths = ["127.0.0.1:4420"]
subnqn = "$NQN"
TOML
  t "systemctl reload qpath-host (the edited host.toml)" systemctl reload qpath-host
  w "the configured device fails by name (no ublk_drv here), in ublk_list" 30 \
    "qpath rpc --socket $HSOCK ublk_list | tr -d ' \n' | grep -q '\"error\":\"[^\"]*ublk[^\"]*\",\"name\":\"pkgtest\"'"
  c "STATUS says one configured device was not created" \
    "systemctl show -p StatusText --value qpath-host | grep -q '1 configured device(s) not created'"
  c "the journal names it and why" "journalctl -u qpath-host --no-pager | grep -q 'configured device not created'"
  c "the service is still up" "systemctl is-active --quiet qpath-host"
  t "systemctl restart qpath-host with a device that cannot be created: it starts, ready" systemctl restart qpath-host
  c "after the restart: up, the device named as not created" \
    "systemctl is-active --quiet qpath-host && qpath rpc --socket $HSOCK ublk_list | grep -q pkgtest"
  c "qpath ublk add through the service (fails here: no ublk_drv) is kept in host.toml by --persist" \
    "! qpath ublk add --name added -a 127.0.0.1 -s 4420 -n $NQN && grep -q 'name = \"added\"' /etc/qpath/host.toml && [ -f /etc/qpath/host.toml.bak ]"
  t "qpath ublk del --name takes it out of host.toml" qpath ublk del --name added
  c "host.toml no longer lists it" "! grep -q 'name = \"added\"' /etc/qpath/host.toml"
  t "systemctl stop qpath-host" systemctl stop qpath-host
  c "the host stopped cleanly" "! systemctl is-failed --quiet qpath-host"
  systemctl stop qpath-target
  systemd-analyze security --no-pager qpath-host 2> /dev/null | tail -1 | sed 's/^/info: host: /'
  if [ $FAILED != 0 ]; then
    echo "the service's journal:"
    journalctl -u qpath-target --no-pager -n 40 | sed 's/^/      /'
    echo "the host service's journal:"
    journalctl -u qpath-host --no-pager -n 40 | sed 's/^/      /'
  fi
else
  # ---- no systemd: the binary on the shipped configuration, by hand ------------------------
  p1=$((20000 + RANDOM % 20000))
  p2=$((p1 + 1))
  SOCK=/root/qpath.sock
  timeout 120 qpath target --config /etc/qpath/target.toml --persist --rpc-socket $SOCK \
    --listen 127.0.0.1:$p1 --listen 127.0.0.1:$p2 > /root/target.log 2>&1 &
  tpid=$!
  w "qpath target serves the shipped configuration" 30 "qpath rpc --socket $SOCK get_target"
  t "discovery answers" bash -c "qpath discover -a 127.0.0.1 -s $p1 | grep -q $NQN"
  t "a file namespace in /var/lib/qpath is created over RPC" \
    qpath rpc --socket $SOCK add_namespace nqn=$NQN backend=file path=/var/lib/qpath/vol2.img size=16M
  kill -TERM $tpid
  wait $tpid
  c "it stopped on SIGTERM" "grep -q 'shutting down' /root/target.log"
fi

# ---- remove, purge -------------------------------------------------------------------------
if [ "$MODE" = boot ]; then
  t "systemctl start, before a removal" systemctl start qpath-target
fi
t "dpkg -r removes the package" dpkg -r qpath
if [ "$MODE" = boot ]; then
  c "dpkg -r stopped the running service" "! systemctl is-active --quiet qpath-target"
fi
c "the binary and the units are gone" "[ ! -e /usr/bin/qpath ] && [ ! -e '$UNIT' ] && [ ! -e '$HUNIT' ]"
c "dpkg -r keeps the configuration (conffiles)" "[ -f /etc/qpath/target.toml ] && [ -f /etc/qpath/host.toml ] && [ -f /etc/default/qpath-target ]"
c "dpkg -r keeps the namespace's image" "[ -f /var/lib/qpath/vol2.img ]"
t "dpkg --purge purges it" dpkg --purge qpath
c "dpkg --purge removes /etc/qpath and /etc/default/qpath-target" "[ ! -e /etc/qpath ] && [ ! -e /etc/default/qpath-target ]"
c "dpkg --purge keeps the namespace's image (data is never removed)" "[ -f /var/lib/qpath/vol2.img ]"
files > /root/files-after.txt
left=$(comm -13 /root/files-before.txt /root/files-after.txt | grep -v -x -e /var/lib/qpath -e /var/lib/qpath/vol2.img)
gone=$(comm -23 /root/files-before.txt /root/files-after.txt)
if [ -z "$left" ] && [ -z "$gone" ]; then
  echo "ok: after the purge the system is as before, but for /var/lib/qpath/vol2.img"
else
  echo "FAIL: after the purge, left: ${left:-none}; missing: ${gone:-none}"
  FAILED=1
fi

[ $FAILED = 0 ] && echo PASS
exit 0
