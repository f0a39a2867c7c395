#!/usr/bin/env python3
"""Standalone self-check of examples/opcua-oven/oven.py.

Starts the oven as a subprocess on a free port, with a write log, a status
file and a control file in a temporary directory, and checks its behaviour
with real asyncua clients. Then starts it twice more: with
``--security basic256sha256`` (client certificate generated here) and with
``--security none --user/--password``. Prints ``ok: ...`` per check and
``selfcheck ok`` at the end; exits 0 only if every check passed.

Run with the peers' virtualenv (requirements.txt next to this file)::

    python crates/tether-cli/tests/peers/test_oven_selfcheck.py [path/to/oven.py]

The oven path defaults to $OVEN_PY, then to examples/opcua-oven/oven.py in the
repository holding this file.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from asyncua import Client, ua
from asyncua.crypto import cert_gen
from asyncua.crypto.security_policies import SecurityPolicyBasic256Sha256
from cryptography.x509.oid import ExtendedKeyUsageOID

NS_URI = "urn:tether:example:oven"
TAU_S = 1.0  # short time constant so the lag is visible quickly
WATCHDOG_MS = 500
USER, PASSWORD = "tether", "s3cret-pw"
CLIENT_URI = "urn:tether:oven-selfcheck:client"


class CheckFailed(Exception):
    pass


def check(cond: bool, what: str) -> None:
    if not cond:
        raise CheckFailed(what)


def ok(what: str) -> None:
    print(f"ok: {what}", flush=True)


def oven_path() -> Path:
    if len(sys.argv) > 1:
        return Path(sys.argv[1]).resolve()
    if os.environ.get("OVEN_PY"):
        return Path(os.environ["OVEN_PY"]).resolve()
    root = Path(__file__).resolve().parents[4]
    return root / "examples" / "opcua-oven" / "oven.py"


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Peer:
    """One oven subprocess and its files."""

    def __init__(self, tmp: Path, name: str, extra: list[str]) -> None:
        self.tmp = tmp
        self.name = name
        self.extra = extra
        self.log = tmp / f"{name}.log.jsonl"
        self.status = tmp / f"{name}.status.json"
        self.control = tmp / f"{name}.control.json"
        self.stderr = tmp / f"{name}.stderr"
        self.proc: subprocess.Popen | None = None
        self.port = 0

    @property
    def url(self) -> str:
        return f"opc.tcp://127.0.0.1:{self.port}"

    def start(self) -> None:
        line = ""
        for _ in range(3):
            port = free_port()
            cmd = [
                sys.executable, str(oven_path()),
                "--host", "127.0.0.1", "--port", str(port),
                "--log", str(self.log), "--control", str(self.control),
                "--status-file", str(self.status),
                "--watchdog-ms", str(WATCHDOG_MS), "--ambient", "20.0",
                "--tau-s", str(TAU_S), *self.extra,
            ]
            with open(self.stderr, "ab") as err:
                self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=err, text=True)
            line = self.proc.stdout.readline()  # blocks until ready or exit
            if line == f"ready {port}\n":
                self.port = port
                return
            self.proc.wait(timeout=5)  # port taken between probe and bind? retry
        raise CheckFailed(f"{self.name}: oven did not print 'ready <port>' (last: {line!r})")

    def set_control(self, cfg: dict | str) -> None:
        tmp = self.control.with_suffix(".tmp")
        tmp.write_text(cfg if isinstance(cfg, str) else json.dumps(cfg))
        os.replace(tmp, self.control)

    def read_status(self) -> dict:
        return json.loads(self.status.read_text())

    def log_lines(self) -> list[dict]:
        return [json.loads(x) for x in self.log.read_text().splitlines() if x.strip()]

    def stop(self) -> int:
        assert self.proc is not None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout=10)

    def finish(self) -> None:
        t0 = time.monotonic()
        rc = self.stop()
        check(rc == 0, f"{self.name}: oven exits 0 on SIGTERM (got {rc})")
        rest = self.proc.stdout.read()
        check(rest == "", f"{self.name}: nothing but the ready line on stdout (got {rest!r})")
        ok(f"{self.name}: SIGTERM -> exit 0 in {time.monotonic() - t0:.1f} s, "
           "stdout held only the ready line")


async def control(peer: Peer, cfg: dict) -> None:
    """Write the control file and wait until the oven has surely re-read it."""
    peer.set_control(cfg)
    await asyncio.sleep(0.2)


def make_client(url: str, timeout: float = 4.0) -> Client:
    # a long watchdog interval: asyncua's keep-alive probe would otherwise time
    # out (and reconnect) while the oven is made silent or slow on purpose
    return Client(url, timeout=timeout, watchdog_intervall=1000.0)


class Nodes:
    def __init__(self, c: Client, idx: int) -> None:
        self.c = c
        self.idx = idx
        n = lambda s: c.get_node(ua.NodeId(s, idx))  # noqa: E731
        self.oven = n("Oven")
        self.setpoint = n("Oven.Setpoint")
        self.temperature = n("Oven.Temperature")
        self.enabled = n("Oven.Enabled")
        self.door = n("Oven.DoorClosed")
        self.watchdog = n("Oven.Watchdog")
        self.stop_id = ua.NodeId("Oven.Stop", idx)

    async def stop(self):
        return await self.oven.call_method(self.stop_id)


async def connect(peer: Peer, url: str | None = None, timeout: float = 4.0) -> tuple[Client, Nodes]:
    c = make_client(url or peer.url, timeout)
    await c.connect()
    idx = await c.get_namespace_index(NS_URI)
    return c, Nodes(c, idx)


def dv(value, vtype: ua.VariantType) -> ua.DataValue:
    return ua.DataValue(ua.Variant(value, vtype))


async def write_status(node, value, vtype: ua.VariantType) -> str:
    """Write and return the status code name ('Good' or the Bad... name)."""
    try:
        await node.write_value(dv(value, vtype))
        return "Good"
    except ua.UaStatusCodeError as exc:
        return ua.StatusCode(exc.code).name


def writes_of(lines: list[dict], node: str) -> list[dict]:
    return [x for x in lines if x["kind"] == "write" and x["node"] == node]


# --------------------------------------------------------------------- checks
async def check_endpoints(peer: Peer) -> None:
    for url in (peer.url, peer.url + "/"):
        c = make_client(url)
        eps = await c.connect_and_get_server_endpoints()
        check(len(eps) == 1, f"one endpoint with --security none (got {len(eps)})")
        ep = eps[0]
        check(ep.EndpointUrl == peer.url, f"GetEndpoints({url}) -> {ep.EndpointUrl} == {peer.url}")
        check(ep.SecurityPolicyUri.endswith("#None") and ep.SecurityMode == ua.MessageSecurityMode.None_,
              f"security None endpoint: {ep.SecurityPolicyUri} {ep.SecurityMode}")
        check([t.TokenType for t in ep.UserIdentityTokens] == [ua.UserTokenType.Anonymous],
              f"anonymous token only: {ep.UserIdentityTokens}")
        async with make_client(url) as c2:
            idx = await c2.get_namespace_index(NS_URI)
            val = await c2.get_node(ua.NodeId("Oven.Setpoint", idx)).read_value()
            check(val == 20.0, f"Setpoint readable via {url} (got {val})")
    ok("connects with and without a trailing '/'; GetEndpoints returns the path-less URL")


async def check_basics(peer: Peer, n: Nodes) -> None:
    lines = peer.log_lines()
    check(any(x.get("event") == "started" for x in lines), "log has the started event")
    st = peer.read_status()
    check(st["values"] == {"Setpoint": 20.0, "Temperature": 20.0, "Enabled": False,
                           "DoorClosed": True, "Watchdog": 0}, f"initial status values: {st['values']}")
    ok("started, 'ready <port>' printed, status file present with initial values")

    check(n.idx >= 1, f"namespace {NS_URI} registered (index {n.idx})")
    expect = {
        n.setpoint: (20.0, ua.VariantType.Double),
        n.temperature: (20.0, ua.VariantType.Double),
        n.enabled: (False, ua.VariantType.Boolean),
        n.door: (True, ua.VariantType.Boolean),
        n.watchdog: (0, ua.VariantType.UInt32),
    }
    for node, (value, vtype) in expect.items():
        got = await node.read_data_value()
        check(got.StatusCode.is_good(), f"{node} read Good")
        check(got.Value.VariantType == vtype and got.Value.Value == value,
              f"{node} = {value} ({vtype.name}), got {got.Value}")
        dtype = await node.read_data_type_as_variant_type()
        check(dtype == vtype, f"{node} DataType {vtype.name} (got {dtype})")
    bname = await n.setpoint.read_browse_name()
    check(bname == ua.QualifiedName("Setpoint", n.idx), f"browse name {bname}")
    child = await n.c.nodes.objects.get_child([f"{n.idx}:Oven", f"{n.idx}:Setpoint"])
    check(child.nodeid == n.setpoint.nodeid, "Objects/Oven/Setpoint browses to Oven.Setpoint")
    ok(f"node ids resolve via the namespace URI (ns={n.idx}); initial values and types read back")


async def check_writes(peer: Peer, n: Nodes) -> None:
    check(await write_status(n.setpoint, 21.5, ua.VariantType.Double) == "Good", "write Setpoint 21.5")
    check(await n.setpoint.read_value() == 21.5, "Setpoint reads back 21.5")
    check(await write_status(n.watchdog, 7, ua.VariantType.UInt32) == "Good", "write Watchdog 7")
    check(await n.watchdog.read_value() == 7, "Watchdog reads back 7")
    check(await write_status(n.enabled, True, ua.VariantType.Boolean) == "Good", "write Enabled true")
    check(await n.enabled.read_value() is True, "Enabled reads back true")
    check(await write_status(n.enabled, False, ua.VariantType.Boolean) == "Good", "write Enabled false")
    check(await n.enabled.read_value() is False, "Enabled reads back false")
    lines = peer.log_lines()
    sp = writes_of(lines, "Oven.Setpoint")
    check(len(sp) == 1 and sp[0]["value"] == 21.5 and sp[0]["type"] == "Double" and sp[0]["status"] == "Good"
          and isinstance(sp[0]["t_ms"], float), f"Setpoint write logged exactly: {sp}")
    wd = writes_of(lines, "Oven.Watchdog")
    check(len(wd) == 1 and wd[0]["value"] == 7 and wd[0]["type"] == "UInt32", f"Watchdog write logged: {wd}")
    en = writes_of(lines, "Oven.Enabled")
    check([x["value"] for x in en] == [True, False] and all(x["type"] == "Boolean" for x in en),
          f"Enabled writes logged: {en}")
    i_on = lines.index(en[0])
    check(lines[i_on + 1].get("event") == "enabled" and lines[i_on + 1].get("by") == "write",
          "write line comes before its 'enabled' event")
    i_off = lines.index(en[1])
    check(lines[i_off + 1].get("event") == "disabled" and lines[i_off + 1].get("by") == "write",
          "write line comes before its 'disabled' event")
    await asyncio.sleep(0.25)
    vals = peer.read_status()["values"]
    check(vals["Setpoint"] == 21.5 and vals["Watchdog"] == 7 and vals["Enabled"] is False, f"status: {vals}")
    ok("writes of Setpoint, Watchdog, Enabled applied, read back, logged, in the status file")

    for node, value in ((n.temperature, 99.0), (n.door, False)):
        before = await node.read_value()
        got = await write_status(node, value, ua.VariantType.Double if node is n.temperature
                                 else ua.VariantType.Boolean)
        check(got in ("BadNotWritable", "BadUserAccessDenied"), f"write {node} refused (got {got})")
        check(await node.read_value() == before, f"{node} unchanged")
    refused = writes_of(peer.log_lines(), "Oven.Temperature")
    check(len(refused) == 1 and refused[0]["status"] in ("BadNotWritable", "BadUserAccessDenied"),
          f"refused Temperature write logged: {refused}")
    ok(f"Temperature and DoorClosed are read-only ({refused[0]['status']})")

    cases = [
        (n.setpoint, "Oven.Setpoint", 30, ua.VariantType.Int32),
        (n.setpoint, "Oven.Setpoint", 30.0, ua.VariantType.Float),
        (n.watchdog, "Oven.Watchdog", 8.0, ua.VariantType.Double),
        (n.watchdog, "Oven.Watchdog", 8, ua.VariantType.Int32),
        (n.enabled, "Oven.Enabled", 1, ua.VariantType.Int32),
    ]
    for node, name, value, vtype in cases:
        before = await node.read_value()
        got = await write_status(node, value, vtype)
        check(got == "BadTypeMismatch", f"{vtype.name} to {name} refused with BadTypeMismatch (got {got})")
        check(await node.read_value() == before, f"{name} unchanged after {vtype.name} write")
    lines = peer.log_lines()
    mism = [x for x in lines if x["kind"] == "write" and x["status"] == "BadTypeMismatch"]
    check([(x["node"], x["type"]) for x in mism] == [(c[1], c[3].name) for c in cases],
          f"type mismatches logged: {mism}")
    ok("Int32/Float to Setpoint, Double/Int32 to Watchdog, Int32 to Enabled: BadTypeMismatch, nothing changed")

    # several WriteValues in one request: one log line each
    params = ua.WriteParameters()
    for node, value, vtype in ((n.setpoint, 22.0, ua.VariantType.Double),
                               (n.temperature, 1.0, ua.VariantType.Double)):
        params.NodesToWrite.append(ua.WriteValue(NodeId=node.nodeid, AttributeId=ua.AttributeIds.Value,
                                                 Value=dv(value, vtype)))
    results = await n.c.uaclient.write(params)
    names = [r.name for r in results]
    check(names[0] == "Good" and names[1] in ("BadNotWritable", "BadUserAccessDenied"),
          f"multi-write results {names}")
    tail = [x for x in peer.log_lines() if x["kind"] == "write"][-2:]
    check([x["node"] for x in tail] == ["Oven.Setpoint", "Oven.Temperature"], f"multi-write logged: {tail}")
    check(await write_status(n.setpoint, 21.5, ua.VariantType.Double) == "Good", "restore Setpoint 21.5")
    ok("a Write with two WriteValues gets two results and two log lines")


async def check_watchdog(peer: Peer, n: Nodes) -> None:
    wd = await n.watchdog.read_value()
    temp0 = await n.temperature.read_value()
    check(await write_status(n.enabled, True, ua.VariantType.Boolean) == "Good", "enable")
    t_on = time.monotonic()
    temps = []
    while time.monotonic() - t_on < 1.6:
        wd += 1
        check(await write_status(n.watchdog, wd, ua.VariantType.UInt32) == "Good", "feed watchdog")
        t_last = time.monotonic()
        check(await n.enabled.read_value() is True,
              f"Enabled stays true while fed every 150 ms (cleared after {time.monotonic() - t_on:.2f} s)")
        temps.append(await n.temperature.read_value())
        await asyncio.sleep(0.15)
    check(all(b >= a for a, b in zip(temps, temps[1:])), f"Temperature never falls while heating: {temps}")
    check(temps[-1] <= 21.5, f"no overshoot: {temps}")
    # tau 1 s: 20 + 1.5 * (1 - exp(-1.6)) ~ 21.2
    check(20.8 <= temps[-1] <= 21.5, f"Temperature lags toward 21.5 (got {temps[-1]:.3f})")
    ok(f"Enabled stays on while Watchdog changes every 150 ms; Temperature {temp0:.2f} -> {temps[-1]:.2f}")

    while await n.enabled.read_value():
        check(time.monotonic() - t_last < 2.0, "watchdog clears Enabled within 2 s")
        await asyncio.sleep(0.01)
    dt = time.monotonic() - t_last
    check(0.45 <= dt <= 0.75, f"watchdog tripped {dt:.3f} s after the last feed")
    lines = peer.log_lines()
    last_feed = writes_of(lines, "Oven.Watchdog")[-1]
    trips = [x for x in lines if x.get("event") == "watchdog_trip"]
    check(len(trips) == 1, f"one watchdog_trip (got {len(trips)})")
    server_dt = trips[0]["t_ms"] - last_feed["t_ms"]
    check(495 <= server_dt <= 600, f"log: trip {server_dt:.0f} ms after the last Watchdog write")
    i = lines.index(trips[0])
    check(lines[i + 1].get("event") == "disabled" and lines[i + 1].get("by") == "watchdog",
          "watchdog_trip is followed by disabled by watchdog")
    ok(f"watchdog clears Enabled {dt * 1000:.0f} ms after the last change (log: {server_dt:.0f} ms)")

    # writing the same value is not a change; the timer starts at false->true
    check(await write_status(n.enabled, True, ua.VariantType.Boolean) == "Good", "re-enable")
    t_on = time.monotonic()
    while await n.enabled.read_value():
        check(await write_status(n.watchdog, wd, ua.VariantType.UInt32) == "Good", "same-value write")
        check(time.monotonic() - t_on < 2.0, "trips despite same-value writes")
        await asyncio.sleep(0.05)
    dt = time.monotonic() - t_on
    check(0.45 <= dt <= 0.75, f"tripped {dt:.3f} s after enabling despite same-value writes")
    ok(f"same-value Watchdog writes do not feed it; timer starts at enable (tripped after {dt * 1000:.0f} ms)")

    await asyncio.sleep(0.4)
    check(await n.temperature.read_value() < temps[-1], "Temperature falls toward ambient when disabled")


async def check_stop(peer: Peer, n: Nodes) -> None:
    check(await write_status(n.enabled, True, ua.VariantType.Boolean) == "Good", "enable")
    res = await n.stop()
    check(res is None, f"Stop() has no outputs (got {res!r})")
    check(await n.enabled.read_value() is False, "Stop() clears Enabled")
    lines = peer.log_lines()
    calls = [x for x in lines if x["kind"] == "call"]
    check(calls and calls[-1]["method"] == "Oven.Stop" and calls[-1]["status"] == "Good", f"call logged: {calls}")
    i = lines.index(calls[-1])
    check(lines[i + 1].get("event") == "disabled" and lines[i + 1].get("by") == "stop",
          f"call line then disabled by stop: {lines[i:i + 2]}")
    await n.stop()  # already disabled: Good, no event
    lines2 = peer.log_lines()
    check(lines2[-1]["kind"] == "call" and lines2[-1]["status"] == "Good", "Stop() while disabled is Good")
    ok("Stop() clears Enabled; logged as call, then disabled by stop")


async def check_door_and_status_codes(peer: Peer, n: Nodes) -> None:
    await control(peer, {"door": "open"})
    check(await n.door.read_value() is False, "DoorClosed false with door open")
    check(peer.read_status()["values"]["DoorClosed"] is False, "status DoorClosed false")
    await control(peer, {"door": "closed"})
    check(await n.door.read_value() is True, "DoorClosed true with door closed")
    events = [x["event"] for x in peer.log_lines() if x["kind"] == "event"]
    check(events.count("door_open") == 1 and events.count("door_closed") == 1, f"door events: {events}")
    ok("door via control file: DoorClosed false/true, door_open/door_closed logged")

    peer.set_control('{"door": "open"')  # truncated: not JSON
    await asyncio.sleep(0.2)
    check(await n.door.read_value() is True, "unparsable control file ignored")
    await control(peer, {"door": "ajar"})
    check(await n.door.read_value() is True, "control file with an invalid setting ignored")

    await control(peer, {"write_status": {"Oven.Setpoint": "BadDeviceFailure"},
                         "call_status": {"Oven.Stop": "BadDeviceFailure"}})
    got = await write_status(n.setpoint, 40.0, ua.VariantType.Double)
    check(got == "BadDeviceFailure", f"write_status answers BadDeviceFailure (got {got})")
    check(await n.setpoint.read_value() == 21.5, "Setpoint unchanged after forced status")
    check(await write_status(n.watchdog, 1234, ua.VariantType.UInt32) == "Good", "other nodes still writable")
    check(await write_status(n.enabled, True, ua.VariantType.Boolean) == "Good", "enable")
    try:
        await n.stop()
        check(False, "call_status makes Stop() fail")
    except ua.UaStatusCodeError as exc:
        check(ua.StatusCode(exc.code).name == "BadDeviceFailure", f"Stop() answered {exc}")
    check(await n.enabled.read_value() is True, "Stop() with call_status does nothing")
    check(await write_status(n.enabled, False, ua.VariantType.Boolean) == "Good", "disable")
    await control(peer, {})
    lines = peer.log_lines()
    forced = [x for x in writes_of(lines, "Oven.Setpoint") if x["value"] == 40.0]
    check(len(forced) == 1 and forced[0]["status"] == "BadDeviceFailure", f"forced write logged: {forced}")
    fcall = [x for x in lines if x["kind"] == "call"][-1]
    check(fcall["status"] == "BadDeviceFailure", f"forced call logged: {fcall}")
    ok("write_status / call_status answer BadDeviceFailure, change nothing, are logged")


async def check_delays(peer: Peer, n: Nodes, n2: Nodes) -> None:
    await control(peer, {"delay_ms": 300})
    t0 = time.monotonic()
    await n.setpoint.read_value()
    slow = time.monotonic() - t0
    await control(peer, {})
    t0 = time.monotonic()
    await n.setpoint.read_value()
    fast = time.monotonic() - t0
    check(slow >= 0.29 and fast < 0.1, f"delay_ms=300 slows answers ({slow:.3f} s vs {fast:.3f} s)")
    ok(f"delay_ms slows answers ({slow * 1000:.0f} ms vs {fast * 1000:.0f} ms)")

    await control(peer, {"write_delay_ms": {"Oven.Setpoint": 1500}})
    check(await write_status(n2.enabled, True, ua.VariantType.Boolean) == "Good", "enable (client 2)")
    t0 = time.monotonic()
    slow_write = asyncio.create_task(write_status(n.setpoint, 30.0, ua.VariantType.Double))
    await asyncio.sleep(0.1)
    check(await n2.setpoint.read_value() == 21.5, "delayed write not applied yet")
    t1 = time.monotonic()
    await n2.stop()
    stop_s = time.monotonic() - t1
    t1 = time.monotonic()
    await n.temperature.read_value()  # same client as the pending write
    same_s = time.monotonic() - t1
    check(not slow_write.done(), "Setpoint write still pending after Stop()")
    check(stop_s < 0.2, f"Stop() from client 2 answered in {stop_s * 1000:.0f} ms during the delayed write")
    check(same_s < 0.2, f"read on the writing client answered in {same_s * 1000:.0f} ms")
    check(await n2.enabled.read_value() is False, "Stop() applied at once")
    got = await slow_write
    write_s = time.monotonic() - t0
    check(got == "Good" and 1.45 <= write_s <= 2.0, f"delayed write Good after {write_s:.2f} s ({got})")
    check(await n.setpoint.read_value() == 30.0, "delayed write applied")
    await control(peer, {})
    check(await write_status(n.setpoint, 21.5, ua.VariantType.Double) == "Good", "restore")
    ok(f"write_delay_ms 1500 on Setpoint: write answered after {write_s:.2f} s, "
       f"Stop() from another client in {stop_s * 1000:.0f} ms, same-client read in {same_s * 1000:.0f} ms")


async def check_silent(peer: Peer, n: Nodes) -> None:
    quiet, qn = await connect(peer, timeout=0.5)
    await control(peer, {"silent": True})
    t0 = time.monotonic()
    try:
        await qn.setpoint.read_value()
        timed_out = False
    except (asyncio.TimeoutError, TimeoutError, ua.UaError, ConnectionError):
        timed_out = True
    waited = time.monotonic() - t0
    check(timed_out and waited >= 0.45, f"silent: read timed out after {waited:.2f} s")
    silent_write = asyncio.create_task(write_status(n.setpoint, 55.0, ua.VariantType.Double))
    await asyncio.sleep(0.3)
    check(not silent_write.done(), "silent: write not answered")
    await control(peer, {})
    check(await n.setpoint.read_value() == 21.5, "silent write never applied; service resumes after")
    silent_write.cancel()
    t0 = time.monotonic()
    check(await qn.setpoint.read_value() == 21.5, "silenced client served again")
    check(time.monotonic() - t0 < 0.3, "served at once after silent")
    await asyncio.wait_for(quiet.disconnect(), 3)
    lines = writes_of(peer.log_lines(), "Oven.Setpoint")
    held = [x for x in lines if x.get("silent")]
    check(len(held) == 1 and held[0]["value"] == 55.0 and held[0]["status"] is None,
          f"silent write logged as silent: {held}")
    ok("silent makes a read time out and holds writes; requests after it are served")


async def check_status(peer: Peer, n_clients: int) -> None:
    await asyncio.sleep(0.25)
    st = peer.read_status()
    lines = peer.log_lines()
    writes = [x for x in lines if x["kind"] == "write" and not x.get("silent")]
    calls = [x for x in lines if x["kind"] == "call" and not x.get("silent")]
    check(st["writes"] == len(writes), f"status writes {st['writes']} == {len(writes)} logged")
    check(st["calls"] == len(calls), f"status calls {st['calls']} == {len(calls)} logged")
    check(st["reads"] > 20, f"reads counted ({st['reads']})")
    check(st["sessions"] == n_clients, f"sessions {st['sessions']} == {n_clients}")
    check(isinstance(st["t_ms"], float), "t_ms float")
    ts = [x["t_ms"] for x in lines]
    check(ts == sorted(ts), "log in time order")
    ok(f"status: writes={st['writes']} calls={st['calls']} reads={st['reads']} sessions={st['sessions']}")


async def run_plain(peer: Peer) -> None:
    await check_endpoints(peer)
    c, n = await connect(peer)
    c2, n2 = await connect(peer)
    try:
        await check_basics(peer, n)
        await check_writes(peer, n)
        await check_watchdog(peer, n)
        await check_stop(peer, n)
        await check_door_and_status_codes(peer, n)
        await check_delays(peer, n, n2)
        await check_silent(peer, n)
        await check_status(peer, 2)
    finally:
        for cl in (c, c2):
            try:
                await asyncio.wait_for(cl.disconnect(), 3)
            except Exception:  # pylint: disable=broad-except
                pass


async def refused(make, what: str) -> str:
    c = make()
    try:
        await asyncio.wait_for(c.connect(), 6)
    except Exception as exc:  # pylint: disable=broad-except
        return f"{type(exc).__name__}"
    else:
        await c.disconnect()
        raise CheckFailed(f"{what}: connection was accepted")


async def client_cert(tmp: Path) -> tuple[Path, Path]:
    key, cert = tmp / "client_key.pem", tmp / "client_cert.der"
    await cert_gen.setup_self_signed_certificate(
        key, cert, CLIENT_URI, socket.gethostname(),
        [ExtendedKeyUsageOID.CLIENT_AUTH], {"organizationName": "Tether selfcheck"},
    )
    return cert, key


async def run_secure(peer: Peer, tmp: Path) -> None:
    pki = tmp / "pki"
    check((pki / "server_cert.der").is_file() and (pki / "server_key.pem").is_file(),
          "server certificate and key generated into --pki")
    eps = await make_client(peer.url).connect_and_get_server_endpoints()
    got = sorted((e.SecurityPolicyUri.rsplit("#", 1)[1], e.SecurityMode.name) for e in eps)
    check(got == [("Basic256Sha256", "Sign"), ("Basic256Sha256", "SignAndEncrypt")], f"endpoints {got}")
    check(all([t.TokenType for t in e.UserIdentityTokens] == [ua.UserTokenType.UserName] for e in eps),
          "user name token only")
    check(all(e.EndpointUrl == peer.url for e in eps), "endpoint URLs path-less")
    ok("basic256sha256: GetEndpoints over None lists Basic256Sha256 Sign + SignAndEncrypt, user name only")

    cert, key = await client_cert(tmp)

    async def secure_client(mode, user: str | None, password: str | None) -> Client:
        c = make_client(peer.url)
        c.application_uri = CLIENT_URI
        await c.set_security(SecurityPolicyBasic256Sha256, str(cert), str(key), mode=mode)
        if user is not None:
            c.set_user(user)
            c.set_password(password)
        return c

    for mode in (ua.MessageSecurityMode.SignAndEncrypt, ua.MessageSecurityMode.Sign):
        c = await secure_client(mode, USER, PASSWORD)
        async with c:
            idx = await c.get_namespace_index(NS_URI)
            sp = c.get_node(ua.NodeId("Oven.Setpoint", idx))
            value = 22.0 if mode == ua.MessageSecurityMode.Sign else 23.0
            await sp.write_value(dv(value, ua.VariantType.Double))
            check(await sp.read_value() == value, f"{mode.name}: write/read Setpoint")
        ok(f"Basic256Sha256 {mode.name} with client certificate + user/password: connect, write, read")

    clients = []

    async def make_secure(user, password):
        c = await secure_client(ua.MessageSecurityMode.SignAndEncrypt, user, password)
        clients.append(c)
        return c

    c_bad = await make_secure(USER, "wrong")
    why = await refused(lambda: c_bad, "wrong password")
    ok(f"wrong password refused ({why})")
    c_anon = await make_secure(None, None)
    why = await refused(lambda: c_anon, "anonymous")
    ok(f"anonymous refused ({why})")

    def none_client():
        c = make_client(peer.url)
        c.set_user(USER)
        c.set_password(PASSWORD)
        return c

    why = await refused(none_client, "session over a None channel")
    ok(f"session over a SecurityPolicy None channel refused ({why})")
    writes = writes_of(peer.log_lines(), "Oven.Setpoint")
    check([x["value"] for x in writes] == [23.0, 22.0], f"secure writes logged: {writes}")


async def run_none_user(peer: Peer) -> None:
    eps = await make_client(peer.url).connect_and_get_server_endpoints()
    check([t.TokenType for t in eps[0].UserIdentityTokens] == [ua.UserTokenType.UserName],
          "none + --user: user name token only")
    c = make_client(peer.url)
    c.set_user(USER)
    c.set_password(PASSWORD)
    async with c:
        idx = await c.get_namespace_index(NS_URI)
        check(await c.get_node(ua.NodeId("Oven.Enabled", idx)).read_value() is False, "read with user")
    why = await refused(lambda: make_client(peer.url), "anonymous")
    bad = make_client(peer.url)
    bad.set_user(USER)
    bad.set_password("nope")
    why2 = await refused(lambda: bad, "wrong password")
    ok(f"--security none --user: user/password accepted, anonymous ({why}) and wrong password ({why2}) refused")


async def main_async(tmp: Path, peers: list[Peer]) -> None:
    plain = Peer(tmp, "oven", [])
    peers.append(plain)
    plain.start()
    await run_plain(plain)
    plain.finish()

    secure = Peer(tmp, "oven-secure", ["--security", "basic256sha256", "--user", USER,
                                       "--password", PASSWORD, "--pki", str(tmp / "pki")])
    peers.append(secure)
    secure.start()
    await run_secure(secure, tmp)
    secure.finish()

    none_user = Peer(tmp, "oven-user", ["--user", USER, "--password", PASSWORD])
    peers.append(none_user)
    none_user.start()
    await run_none_user(none_user)
    none_user.finish()


def main() -> int:
    # the asyncua client logs expected failures (timeouts, refusals) loudly
    logging.basicConfig(stream=sys.stderr, level=logging.WARNING)
    logging.getLogger("asyncua").setLevel(logging.CRITICAL)
    t0 = time.monotonic()
    peers: list[Peer] = []
    with tempfile.TemporaryDirectory(prefix="oven-selfcheck-") as tmpdir:
        try:
            asyncio.run(main_async(Path(tmpdir), peers))
        except CheckFailed as exc:
            print(f"FAIL: {exc}", flush=True)
            for peer in peers:
                if peer.proc and peer.proc.poll() is None:
                    peer.stop()
                if peer.stderr.exists():
                    sys.stdout.write(f"--- {peer.name} stderr (tail) ---\n")
                    sys.stdout.write("".join(peer.stderr.read_text().splitlines(True)[-30:]))
            return 1
        finally:
            for peer in peers:
                if peer.proc and peer.proc.poll() is None:
                    peer.stop()
    print(f"selfcheck ok ({time.monotonic() - t0:.1f} s)", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
