#!/usr/bin/env python3
"""Standalone self-check of examples/modbus-heater/heater.py.

Starts the heater as a subprocess on a free port, with a write log, a status
file and a control file in a temporary directory, and checks its behaviour
with a real pymodbus AsyncModbusTcpClient (plus a raw socket for the framing
checks). Prints ``ok: ...`` per check and ``selfcheck ok`` at the end; exits 0
only if every check passed.

Run with the peers' virtualenv (requirements.txt next to this file)::

    python crates/tether-cli/tests/peers/test_heater_selfcheck.py [path/to/heater.py]

The heater path defaults to $HEATER_PY, then to examples/modbus-heater/heater.py
in the repository holding this file.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from pymodbus.client import AsyncModbusTcpClient

UNIT = 1
TAU_S = 1.0  # short time constant so the lag is visible quickly
WATCHDOG_MS = 1000


class CheckFailed(Exception):
    pass


def check(cond: bool, what: str) -> None:
    if not cond:
        raise CheckFailed(what)


def ok(what: str) -> None:
    print(f"ok: {what}", flush=True)


def heater_path() -> Path:
    if len(sys.argv) > 1:
        return Path(sys.argv[1]).resolve()
    if os.environ.get("HEATER_PY"):
        return Path(os.environ["HEATER_PY"]).resolve()
    root = Path(__file__).resolve().parents[4]
    return root / "examples" / "modbus-heater" / "heater.py"


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def signed(raw: int) -> int:
    return raw - 0x10000 if raw & 0x8000 else raw


class Peer:
    """The heater subprocess and its files."""

    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.log = tmp / "heater.log.jsonl"
        self.status = tmp / "heater.status.json"
        self.control = tmp / "heater.control.json"
        self.stderr = tmp / "heater.stderr"
        self.proc: subprocess.Popen | None = None
        self.port = 0

    def start(self) -> None:
        for _ in range(3):
            port = free_port()
            cmd = [
                sys.executable, str(heater_path()),
                "--host", "127.0.0.1", "--port", str(port), "--unit", str(UNIT),
                "--log", str(self.log), "--control", str(self.control),
                "--status-file", str(self.status),
                "--watchdog-ms", str(WATCHDOG_MS), "--ambient", "20.0",
                "--tau-s", str(TAU_S),
            ]
            with open(self.stderr, "ab") as err:
                self.proc = subprocess.Popen(
                    cmd, stdout=subprocess.PIPE, stderr=err, text=True
                )
            line = self.proc.stdout.readline()  # blocks until ready or exit
            if line == f"ready {port}\n":
                self.port = port
                return
            self.proc.wait(timeout=5)  # port taken between probe and bind? retry
        raise CheckFailed(f"heater did not print 'ready <port>' (last: {line!r})")

    def set_control(self, cfg: dict) -> None:
        tmp = self.control.with_suffix(".tmp")
        tmp.write_text(json.dumps(cfg))
        os.replace(tmp, self.control)

    def read_status(self) -> dict:
        return json.loads(self.status.read_text())

    def log_lines(self) -> list[dict]:
        return [json.loads(x) for x in self.log.read_text().splitlines() if x.strip()]

    def stop(self) -> int:
        assert self.proc is not None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout=5)


async def control(peer: Peer, cfg: dict) -> None:
    """Write the control file and wait until the heater has surely re-read it."""
    peer.set_control(cfg)
    await asyncio.sleep(0.2)


async def client(peer: Peer, timeout: float = 2.0) -> AsyncModbusTcpClient:
    c = AsyncModbusTcpClient("127.0.0.1", port=peer.port, timeout=timeout, retries=0)
    check(await c.connect(), "client connects")
    return c


async def read_hr(c, addr: int, count: int = 1) -> list[int]:
    rr = await c.read_holding_registers(addr, count=count, device_id=UNIT)
    check(not rr.isError(), f"read HR{addr} answered without exception ({rr})")
    return rr.registers


async def read_coil0(c) -> bool:
    rr = await c.read_coils(0, count=1, device_id=UNIT)
    check(not rr.isError(), f"read coil 0 ({rr})")
    return rr.bits[0]


async def read_ir0(c) -> int:
    rr = await c.read_input_registers(0, count=1, device_id=UNIT)
    check(not rr.isError(), f"read IR0 ({rr})")
    return signed(rr.registers[0])


def mbap_read_hr(tid: int, addr: int, unit: int = UNIT) -> bytes:
    return struct.pack(">HHHBBHH", tid, 0, 6, unit, 3, addr, 1)


async def read_frames(reader: asyncio.StreamReader, n: int, timeout: float) -> list[tuple[int, bytes]]:
    """Read n MBAP frames, return [(transaction id, pdu)]."""
    out = []
    for _ in range(n):
        head = await asyncio.wait_for(reader.readexactly(7), timeout)
        tid, _proto, length, _unit = struct.unpack(">HHHB", head)
        pdu = await asyncio.wait_for(reader.readexactly(length - 1), timeout)
        out.append((tid, pdu))
    return out


async def run_checks(peer: Peer) -> None:
    lines = peer.log_lines()
    check(any(x.get("event") == "started" for x in lines), "log has the started event")
    st = peer.read_status()
    check(st["registers"]["discrete0"] is True, "lid starts closed (status)")
    check(st["registers"]["input0"] == 200, f"IR0 starts at ambient 200 (got {st['registers']['input0']})")
    ok("started, 'ready <port>' printed, status file present")

    c = await client(peer)

    # --- setpoint round trip --------------------------------------------
    rr = await c.write_register(0, 215, device_id=UNIT)
    check(not rr.isError(), f"write HR0=215 ({rr})")
    check(await read_hr(c, 0) == [215], "HR0 reads back 215")
    ok("write HR0=215, read back 215")

    raw = (-50) & 0xFFFF
    rr = await c.write_register(0, raw, device_id=UNIT)
    check(not rr.isError(), f"write HR0=-50 ({rr})")
    got = (await read_hr(c, 0))[0]
    check(got == 0xFFCE and signed(got) == -50, f"HR0 reads back 0xFFCE (got {got:#06x})")
    await asyncio.sleep(0.25)
    check(peer.read_status()["registers"]["holding0"] == -50, "status holding0 == -50")
    rr = await c.write_register(0, 215, device_id=UNIT)
    check(not rr.isError(), "restore HR0=215")
    ok("setpoint -50 round-trips as two's complement 0xFFCE")

    # --- neighbours and limits ----------------------------------------------
    check(len(await read_hr(c, 0, 11)) == 11, "read HR0..10 in one request")
    rr = await c.read_holding_registers(99, count=1, device_id=UNIT)
    check(not rr.isError(), "HR99 exists")
    for what, rr in (
        ("HR100", await c.read_holding_registers(100, count=1, device_id=UNIT)),
        ("HR99..100", await c.read_holding_registers(99, count=2, device_id=UNIT)),
        ("IR100", await c.read_input_registers(100, count=1, device_id=UNIT)),
        ("coil 100", await c.read_coils(100, count=1, device_id=UNIT)),
        ("coil 99..100", await c.read_coils(99, count=2, device_id=UNIT)),
        ("DI100", await c.read_discrete_inputs(100, count=1, device_id=UNIT)),
        ("write coil 100", await c.write_coil(100, True, device_id=UNIT)),
    ):
        check(rr.isError() and rr.exception_code == 2, f"{what} answers IllegalAddress ({rr})")
    ok("addresses 0..99 served, 100 answers exception 2 in every table")

    rr = await c.read_holding_registers(0, count=1, device_id=UNIT + 1)
    check(rr.isError() and rr.exception_code == 11, f"other unit id answers exception 11 ({rr})")
    rr = await c.write_register(0, 999, device_id=UNIT + 1)
    check(rr.isError() and rr.exception_code == 11, f"write to other unit answers exception 11 ({rr})")
    check(await read_hr(c, 0) == [215], "write to other unit did not touch HR0")
    ok("requests for another unit id answer exception 11 and change nothing")

    # --- temperature lag while HR10 keeps changing (no watchdog trip) ---------
    ir_start = await read_ir0(c)
    check(ir_start == 200, f"IR0 at ambient before enabling (got {ir_start})")
    rr = await c.write_coil(0, True, device_id=UNIT)
    check(not rr.isError(), f"write coil 0 = 1 ({rr})")
    t_on = time.monotonic()
    hr10 = 0
    last_feed = 0.0
    samples = []
    while time.monotonic() - t_on < 2.6:
        if time.monotonic() - last_feed >= 0.3:
            hr10 += 1
            rr = await c.write_register(10, hr10, device_id=UNIT)
            check(not rr.isError(), "write HR10")
            last_feed = time.monotonic()
        check(await read_coil0(c), f"coil 0 stays set while HR10 changes every 300 ms "
              f"(cleared after {time.monotonic() - t_on:.2f} s)")
        samples.append((time.monotonic() - t_on, await read_ir0(c)))
        await asyncio.sleep(0.05)
    values = [v for _, v in samples]
    check(all(b >= a for a, b in zip(values, values[1:])), f"IR0 never falls while heating: {values}")
    check(max(values) <= 215, f"IR0 never overshoots 21.5: {values}")
    # first-order lag, tau = 1 s: 20 + 1.5 * (1 - exp(-t))
    t_end, v_end = samples[-1]
    check(212 <= v_end <= 215, f"IR0 close to 21.5 after {t_end:.1f} s (got {v_end})")
    at_half = [v for t, v in samples if 0.45 <= t <= 0.75]
    check(at_half and all(204 <= v <= 211 for v in at_half), f"IR0 ~20.7 after ~0.6 s (got {at_half})")
    ok(f"IR0 moves toward 21.5 after coil 0 is set ({values[0]} -> {v_end} in {t_end:.1f} s)")
    ok("coil 0 stays set while HR10 changes every 300 ms")

    # --- watchdog trips ~1 s after the last change of HR10 --------------------
    hr10 += 1
    rr = await c.write_register(10, hr10, device_id=UNIT)
    check(not rr.isError(), "last HR10 write")
    t_last = time.monotonic()
    while await read_coil0(c):
        check(time.monotonic() - t_last < 2.0, "watchdog clears coil 0 within 2 s")
        await asyncio.sleep(0.02)
    dt = time.monotonic() - t_last
    check(0.95 <= dt <= 1.3, f"watchdog tripped {dt:.3f} s after last HR10 change")
    lines = peer.log_lines()
    last_hr10 = [x for x in lines if x["kind"] == "write" and x["address"] == 10][-1]
    trip = [x for x in lines if x.get("event") == "watchdog_trip"]
    check(len(trip) == 1, f"one watchdog_trip event (got {len(trip)})")
    server_dt = trip[0]["t_ms"] - last_hr10["t_ms"]
    check(990 <= server_dt <= 1100, f"log: trip {server_dt:.0f} ms after last HR10 write")
    i = lines.index(trip[0])
    check(lines[i + 1].get("event") == "disabled" and lines[i + 1].get("by") == "watchdog",
          "watchdog_trip is followed by disabled by watchdog")
    ok(f"watchdog clears coil 0 {dt * 1000:.0f} ms after the last HR10 change "
       f"(log: {server_dt:.0f} ms)")

    # temperature falls back toward ambient once disabled
    await asyncio.sleep(0.5)
    check(await read_ir0(c) < v_end, "IR0 falls toward ambient when disabled")

    # --- timer restarts when coil 0 goes 0 -> 1 (HR10 unchanged for >1 s) -----
    rr = await c.write_coil(0, True, device_id=UNIT)
    check(not rr.isError(), "re-enable")
    t_on = time.monotonic()
    await asyncio.sleep(0.6)
    check(await read_coil0(c), "coil 0 not cleared at once after re-enabling (timer restarts)")
    while await read_coil0(c):
        check(time.monotonic() - t_on < 2.0, "watchdog trips after re-enable")
        await asyncio.sleep(0.02)
    dt = time.monotonic() - t_on
    check(0.95 <= dt <= 1.3, f"watchdog tripped {dt:.3f} s after coil 0 0->1")
    ok(f"watchdog timer restarts on coil 0 0->1 (tripped after {dt * 1000:.0f} ms)")

    # --- lid ------------------------------------------------------------------
    await control(peer, {"lid": "open"})
    rr = await c.read_discrete_inputs(0, count=1, device_id=UNIT)
    check(not rr.isError() and rr.bits[0] is False, f"DI0 = 0 with lid open ({rr})")
    check(peer.read_status()["registers"]["discrete0"] is False, "status discrete0 false")
    await control(peer, {"lid": "closed"})
    rr = await c.read_discrete_inputs(0, count=1, device_id=UNIT)
    check(not rr.isError() and rr.bits[0] is True, "DI0 = 1 with lid closed again")
    events = [x["event"] for x in peer.log_lines() if x["kind"] == "event"]
    check("lid_open" in events and "lid_closed" in events, "lid events logged")
    ok("lid open via control file reads DI0 = 0 (and 1 when closed again)")

    # --- configured exception on holding:0 -------------------------------------
    await control(peer, {"exception": {"holding:0": 4, "coil:0": 4}})
    rr = await c.write_register(0, 300, device_id=UNIT)
    check(rr.isError() and rr.exception_code == 4, f"write HR0 answers exception 4 ({rr})")
    rr = await c.write_registers(0, [301, 302], device_id=UNIT)
    check(rr.isError() and rr.exception_code == 4, f"fc16 over HR0 answers exception 4 ({rr})")
    rr = await c.write_coil(0, True, device_id=UNIT)
    check(rr.isError() and rr.exception_code == 4, f"write coil 0 answers exception 4 ({rr})")
    check(await read_hr(c, 0) == [215], "HR0 unchanged after exception")
    check(not await read_coil0(c), "coil 0 unchanged after exception")
    rr = await c.write_register(1, 7, device_id=UNIT)
    check(not rr.isError(), "HR1 still writable")
    await control(peer, {})
    w = [x for x in peer.log_lines() if x["kind"] == "write" and x["fc"] == 6 and x["values"] == [300]]
    check(len(w) == 1 and w[0].get("exception") == 4 and w[0]["address"] == 0,
          f"refused write logged with exception 4: {w}")
    ok("exception on holding:0 answers exception 4, HR0 stays 215, write logged with exception 4")

    # --- delay -----------------------------------------------------------------
    await control(peer, {"delay_ms": 400})
    t0 = time.monotonic()
    await read_hr(c, 0)
    slow = time.monotonic() - t0
    await control(peer, {})
    t0 = time.monotonic()
    await read_hr(c, 0)
    fast = time.monotonic() - t0
    check(slow >= 0.39 and fast < 0.1, f"delay_ms=400 slows answers ({slow:.3f} s vs {fast:.3f} s)")
    ok(f"delay_ms slows answers ({slow * 1000:.0f} ms vs {fast * 1000:.0f} ms)")

    # --- framing: two frames in one segment; delayed pipelined answers ----------
    reader, writer = await asyncio.open_connection("127.0.0.1", peer.port)
    writer.write(mbap_read_hr(101, 0) + mbap_read_hr(102, 1))
    await writer.drain()
    frames = await read_frames(reader, 2, 1.0)
    check([t for t, _ in frames] == [101, 102], f"both frames of one segment answered: {frames}")
    await control(peer, {"delay_ms": 300})
    writer.write(mbap_read_hr(201, 0))
    await writer.drain()
    await asyncio.sleep(0.05)
    writer.write(mbap_read_hr(202, 1))
    await writer.drain()
    frames = await read_frames(reader, 2, 2.0)
    check(sorted(t for t, _ in frames) == [201, 202], f"delayed answers keep their transaction ids: {frames}")
    by_tid = dict(frames)
    check(by_tid[201] == bytes([3, 2, 0, 215]) and by_tid[202] == bytes([3, 2, 0, 7]),
          f"delayed answers carry their own data: {frames}")
    await control(peer, {})
    ok("several frames per segment and delayed pipelined requests answered with their own ids")

    # --- silent ------------------------------------------------------------------
    await control(peer, {"silent": True})
    quiet = await client(peer, timeout=0.5)
    t0 = time.monotonic()
    try:
        rr = await quiet.read_holding_registers(0, count=1, device_id=UNIT)
        timed_out = False
    except Exception:  # pymodbus raises ModbusIOException on no answer
        timed_out = True
    waited = time.monotonic() - t0
    quiet.close()
    check(timed_out and waited >= 0.45, f"silent: read timed out after {waited:.2f} s")
    writer.write(mbap_read_hr(301, 0))
    await writer.drain()
    try:
        data = await asyncio.wait_for(reader.read(100), 0.6)
        check(False, f"silent device answered or closed: {data!r}")
    except asyncio.TimeoutError:
        pass  # no answer, connection still open
    await control(peer, {})
    writer.write(mbap_read_hr(302, 0))
    await writer.drain()
    frames = await read_frames(reader, 1, 1.0)
    check(frames[0][0] == 302, f"after silent: only the new request is answered: {frames}")
    try:
        extra = await asyncio.wait_for(reader.read(100), 0.3)
        check(False, f"held request answered late: {extra!r}")
    except asyncio.TimeoutError:
        pass
    writer.close()
    check(await read_hr(c, 0) == [215], "first client still served after silent ends")
    ok("silent makes a read time out, connection stays open, service resumes after")

    # --- log and status --------------------------------------------------------
    c.close()
    lines = peer.log_lines()
    writes = [x for x in lines if x["kind"] == "write"]
    keys = {"t_ms", "kind", "fc", "table", "address", "values", "unit"}
    for x in writes:
        check(keys <= set(x), f"write line has all fields: {x}")
        check(isinstance(x["t_ms"], float), f"t_ms is a float: {x}")
    first = writes[0]
    check((first["fc"], first["table"], first["address"], first["values"], first["unit"])
          == (6, "holding", 0, [215], UNIT), f"first write logged exactly: {first}")
    check(any(x["fc"] == 6 and x["values"] == [0xFFCE] for x in writes), "-50 logged as 65486")
    coil_w = [x for x in writes if x["table"] == "coil" and x["fc"] == 5]
    check(coil_w and coil_w[0]["values"] == [True], f"coil write logged with bools: {coil_w[:1]}")
    check(any(x["fc"] == 16 and x["values"] == [301, 302] and x.get("exception") == 4 for x in writes),
          "fc16 write logged with exception")
    other = [x for x in writes if x["unit"] != UNIT]
    check(len(other) == 1 and other[0].get("exception") == 11, f"other-unit write logged: {other}")
    enabled = [x for x in lines if x.get("event") == "enabled"]
    check(len(enabled) == 2 and all(x["by"] == "write" for x in enabled), f"enabled events: {enabled}")
    ts = [x["t_ms"] for x in lines]
    check(ts == sorted(ts) or all(b >= a - 5 for a, b in zip(ts, ts[1:])), "log roughly in time order")
    await asyncio.sleep(0.25)
    st = peer.read_status()
    served_writes = [x for x in writes if x["unit"] == UNIT and not x.get("silent")]
    check(st["writes"] == len(served_writes), f"status writes {st['writes']} == {len(served_writes)}")
    check(all(st["reads"][k] > 0 for k in ("coil", "discrete", "holding", "input")),
          f"reads counted per table: {st['reads']}")
    check(st["registers"]["holding0"] == 215 and st["registers"]["holding10"] == hr10,
          f"status registers: {st['registers']}")
    ok(f"log has {len(writes)} writes with correct fields; status {st['reads']} writes={st['writes']}")


async def main_async(peer: Peer) -> None:
    await run_checks(peer)


def main() -> int:
    # the pymodbus client logs expected timeouts (silent check) as errors
    logging.basicConfig(stream=sys.stderr, level=logging.WARNING)
    logging.getLogger("pymodbus").setLevel(logging.CRITICAL)
    with tempfile.TemporaryDirectory(prefix="heater-selfcheck-") as tmpdir:
        peer = Peer(Path(tmpdir))
        try:
            peer.start()
            asyncio.run(main_async(peer))
            rc = peer.stop()
            check(rc == 0, f"heater exits 0 on SIGTERM (got {rc})")
            rest = peer.proc.stdout.read()
            check(rest == "", f"nothing but the ready line on stdout (got {rest!r})")
            ok("SIGTERM: clean exit 0, stdout held only the ready line")
        except CheckFailed as exc:
            print(f"FAIL: {exc}", flush=True)
            if peer.proc and peer.proc.poll() is None:
                peer.stop()
            if peer.stderr.exists():
                sys.stdout.write("--- heater stderr (tail) ---\n")
                sys.stdout.write("".join(peer.stderr.read_text().splitlines(True)[-30:]))
            return 1
        except BaseException:
            if peer.proc and peer.proc.poll() is None:
                peer.stop()
            raise
    print("selfcheck ok", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
