#!/usr/bin/env python3
"""Simulated Modbus TCP heater (the example device of issue 18).

A single asyncio process that plays a small heater controller on Modbus TCP.
It is used by Tether's driver tests and can be run by hand to try the Modbus
driver without hardware. Built on pymodbus 3.16.1 (``SimDevice``/``SimData``
datastore API) and the standard library only.

Usage::

    heater.py --host 127.0.0.1 --port 5020 --unit 1 \\
        [--log FILE] [--control FILE] [--status-file FILE] \\
        [--watchdog-ms 1000] [--ambient 20.0] [--tau-s 10]

``--port 0`` picks a free port. Once the server listens, exactly one line
``ready <port>`` (the real port) is printed to stdout and flushed; nothing else
ever goes to stdout. Diagnostics go to stderr. SIGTERM or SIGINT stops the
server cleanly (exit status 0).

Point map (unit id ``--unit``, default 1)
-----------------------------------------
Every table has addresses 0..99. Any request touching an address >= 100 is
answered with exception 2 (illegal data address).

=================  =====  ==================================================
table              addr   meaning
=================  =====  ==================================================
holding register   0      setpoint, signed 16-bit two's complement, 0.1 degC
                          per count (215 = 21.5 degC, 0xFFCE = -50 = -5.0 degC).
                          Starts at 0.
holding register   10     watchdog register (see below). Starts at 0.
input register     0      measured temperature, signed 16-bit, 0.1 degC per
                          count, read-only. Starts at the ambient temperature.
coil               0      heater enabled (read/write). Starts at 0.
discrete input     0      lid closed when 1. Starts closed (1).
=================  =====  ==================================================

All other addresses in 0..99 are plain storage (writable holding registers and
coils, zero-valued input registers and discrete inputs).

Temperature: the measured temperature follows a first-order lag with time
constant ``--tau-s`` (default 10 s) toward the setpoint while coil 0 is set
and toward ``--ambient`` (default 20.0 degC) otherwise. It is recomputed every
10 ms and rounded to the nearest count when stored in input register 0.

Watchdog: while coil 0 is set, the heater clears coil 0 itself once holding
register 10 has kept the same value for ``--watchdog-ms`` ms (default 1000;
0 disables the watchdog). The time is measured from the later of (a) the last
write that changed the value of register 10 and (b) the moment coil 0 went
from 0 to 1. Writing the value register 10 already holds is not a change.
Checked every 10 ms.

Other unit ids: a request addressed to any unit id other than ``--unit``
(including 0) is not served as this device: it is answered with Modbus
exception 0x0B (gateway target device failed to respond), touches no point and
is not counted. Write requests to other units still appear in the write log,
with ``"exception": 11``.

Write log (``--log FILE``)
--------------------------
JSON lines appended to FILE, one line per event, flushed per line.
``t_ms`` is the wall-clock time in milliseconds since the epoch (float).

* every write request received (function codes 5, 6, 15, 16, 22, 23)::

    {"t_ms": ..., "kind": "write", "fc": 6, "table": "holding",
     "address": 0, "values": [215], "unit": 1}

  ``table`` is ``"coil"`` or ``"holding"``; ``address`` is the start address;
  ``values`` are the values as they were on the wire: bools for coils, raw
  unsigned 16-bit register values for registers (so -50 is logged as 65486).
  For mask write (fc 22) ``values`` is ``[and_mask, or_mask]``; for
  read/write multiple (fc 23) ``address``/``values`` are the write part.
  ``t_ms`` is the time the request arrived. If the request was answered with
  a Modbus exception, ``"exception": <code>`` is added. A write that arrived
  while the device was silent carries ``"silent": true`` (it was not applied
  and not answered).

* device events::

    {"t_ms": ..., "kind": "event", "event": "started"}
    {"t_ms": ..., "kind": "event", "event": "enabled", "by": "write"}
    {"t_ms": ..., "kind": "event", "event": "disabled", "by": "write"|"watchdog"}
    {"t_ms": ..., "kind": "event", "event": "watchdog_trip"}
    {"t_ms": ..., "kind": "event", "event": "lid_open"}
    {"t_ms": ..., "kind": "event", "event": "lid_closed"}

  ``enabled``/``disabled`` are logged whenever coil 0 changes value.
  A watchdog trip logs ``watchdog_trip`` followed by ``disabled`` (by
  ``watchdog``). A write's own line comes before the events it caused.

Status file (``--status-file FILE``)
------------------------------------
Rewritten atomically (write to a temporary file, then rename) every 100 ms
and at shutdown, so a test can look at the device without speaking Modbus::

    {"reads": {"coil": n, "discrete": n, "holding": n, "input": n},
     "registers": {"holding0": 215, "holding10": 7, "input0": 203,
                   "coil0": true, "discrete0": true},
     "writes": n, "temperature_c": 20.31, "t_ms": ...}

``reads`` counts read requests per table (fc 1, 2, 3, 4; fc 23 counts as a
holding read and a write), ``writes`` counts write requests; both only count
requests for this unit that the device processed (answered, possibly with an
exception), not those ignored while silent. ``holding0`` and ``input0`` are
signed (-50, not 65486); ``holding10`` is the raw unsigned value; coil0 and
discrete0 are booleans.

Control file (``--control FILE``)
---------------------------------
JSON, re-read every 50 ms; a missing file means all defaults; a file that
cannot be parsed is ignored (the previous settings stay, a warning goes to
stderr)::

    {"lid": "closed", "delay_ms": 0, "exception": {"holding:0": 4},
     "silent": false}

* ``lid``: ``"open"`` clears discrete input 0, ``"closed"`` sets it (logs
  ``lid_open``/``lid_closed`` when it changes).
* ``delay_ms``: every answer is delayed by this many ms (a slow device). The
  request is applied when the delay has passed, just before answering.
* ``exception``: ``{"<table>:<address>": code}`` with table ``holding`` or
  ``coil``; every write request whose range covers that point is answered
  with that Modbus exception code (1-8, 10, 11; e.g. 4 = server device
  failure) and changes nothing. The write is still logged, with
  ``"exception": code``. Reads are not affected.
* ``write_delay_ms``: ``{"<table>:<address>": ms}``; a write request whose
  start address is that point is answered (and applied) that many ms late,
  other requests are not slowed (a slow actuator beside a quick stop).
* ``silent``: while true the device answers nothing: requests arriving then
  are neither applied nor answered, ever (connections stay open, so the
  client's timeout fires). Requests arriving after silent is switched off
  are served normally.

pymodbus notes
--------------
Requests are dispatched by a small subclass of pymodbus' per-connection
handler (``_HeaterRequestHandler``) because pymodbus 3.16.1's own handler
(1) answers with the transaction id of the connection's *latest* request,
which mixes up answers once a request is delayed or held, (2) handles only
the first frame of a TCP segment that carries several, and (3) answers an
unknown unit id with exception 4 (a KeyError inside the simulator datastore).
pymodbus also stores bit tables in whole 16-bit words, so on its own it would
accept coil/discrete addresses up to 111; the handler answers exception 2
from address 100 on, like the register tables.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import math
import os
import signal
import sys
import time
from typing import Any

from pymodbus.constants import ExcCodes
from pymodbus.exceptions import ModbusIOException
from pymodbus.pdu import ExceptionResponse, ModbusPDU
from pymodbus.server import ModbusTcpServer
from pymodbus.server.requesthandler import ServerRequestHandler
from pymodbus.simulator import DataType, SimData, SimDevice
from pymodbus.transaction import TransactionManager


log = logging.getLogger("heater")

TABLE_SIZE = 100  # addresses 0..99 in every table

# function code -> table
READ_FC = {1: "coil", 2: "discrete", 3: "holding", 4: "input", 23: "holding"}
WRITE_FC = {5: "coil", 15: "coil", 6: "holding", 16: "holding", 22: "holding", 23: "holding"}
BIT_FC = {1, 2, 5, 15}

# table -> function code used for internal access through the datastore
TABLE_READ_FC = {"coil": 1, "discrete": 2, "holding": 3, "input": 4}


def now_ms() -> float:
    """Wall clock, ms since the epoch."""
    return time.time() * 1000.0


def to_signed(raw: int) -> int:
    """Unsigned 16-bit register value -> signed."""
    raw &= 0xFFFF
    return raw - 0x10000 if raw & 0x8000 else raw


def to_raw(value: int) -> int:
    """Signed value -> unsigned 16-bit register value (saturating)."""
    value = max(-32768, min(32767, value))
    return value & 0xFFFF


class Table:
    """Live view of one pymodbus simulator block.

    ``regs`` is the very list pymodbus keeps the block in (captured from the
    action hook), so changes made here are what the next request sees.
    For bit tables each list entry packs 16 bits, bit 0 first, and
    ``start`` is the block start in words (address // 16).
    """

    def __init__(self, name: str, start: int, regs: list[int]) -> None:
        self.name = name
        self.start = start
        self.regs = regs
        self.bits = name in ("coil", "discrete")

    def get(self, address: int) -> int:
        if self.bits:
            word = self.regs[address // 16 - self.start]
            return (word >> (address % 16)) & 1
        return self.regs[address - self.start]

    def set(self, address: int, value: int) -> None:
        if self.bits:
            idx = address // 16 - self.start
            mask = 1 << (address % 16)
            self.regs[idx] = (self.regs[idx] | mask) if value else (self.regs[idx] & ~mask)
        else:
            self.regs[address - self.start] = value & 0xFFFF


class Heater:
    """Device model, logging, control and status handling."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.unit: int = args.unit
        self.tables: dict[str, Table] = {}
        self._capture = False
        self.temp_c: float = args.ambient
        self.hr10_changed_at = time.monotonic()
        self.enabled_at = time.monotonic()
        self.reads = {"coil": 0, "discrete": 0, "holding": 0, "input": 0}
        self.writes = 0
        # control settings
        self.lid_closed = True
        self.delay_ms = 0.0
        self.write_delay: dict[tuple[str, int], float] = {}
        self.exceptions: dict[tuple[str, int], ExcCodes] = {}
        self.silent = False
        self._control_error: str | None = None
        self._control_text: str | None = None
        self.log_file = open(args.log, "a", encoding="utf-8") if args.log else None  # noqa: SIM115
        self.server: HeaterServer | None = None
        self.request_tasks: set[asyncio.Task] = set()

    # ----------------------------------------------------------- datastore
    def build_device(self) -> SimDevice:
        bits0 = [False] * TABLE_SIZE
        di = [True] + [False] * (TABLE_SIZE - 1)  # lid closed
        return SimDevice(
            id=self.unit,
            simdata=(
                [SimData(0, values=bits0, datatype=DataType.BITS)],
                [SimData(0, values=di, datatype=DataType.BITS)],
                [SimData(0, count=TABLE_SIZE, values=0, datatype=DataType.REGISTERS)],
                [SimData(0, count=TABLE_SIZE, values=0, datatype=DataType.REGISTERS)],
            ),
            action=self.action,
        )

    async def action(
        self,
        function_code: int,
        start_address: int,
        address: int,
        count: int,
        current_registers: list[int],
        set_values: list[int] | list[bool] | None,
    ) -> ExcCodes | None:
        """pymodbus action hook, called for every datastore access.

        Must not await: the handler relies on a datastore update running
        without yielding to other tasks.
        """
        del count  # for bit tables this is a word count, not a bit count
        if self._capture:
            name = READ_FC[function_code]
            self.tables[name] = Table(name, start_address, current_registers)
            return None
        if set_values is not None:
            table = WRITE_FC.get(function_code)
            for (t, point), code in self.exceptions.items():
                if t == table and address <= point < address + len(set_values):
                    return code
        return None

    async def capture_tables(self) -> None:
        """Get hold of pymodbus' block lists via one internal read per table."""
        assert self.server is not None
        self._capture = True
        try:
            for name, fc in TABLE_READ_FC.items():
                await self.server.async_getValues(self.unit, fc, 0, 1)
                if name not in self.tables:
                    raise RuntimeError(f"could not capture {name} table")
        finally:
            self._capture = False
        self.tables["input"].set(0, to_raw(round(self.temp_c * 10)))

    # ------------------------------------------------------------- logging
    def emit(self, record: dict[str, Any]) -> None:
        if self.log_file is None:
            return
        self.log_file.write(json.dumps(record, separators=(",", ":")) + "\n")
        self.log_file.flush()

    def event(self, name: str, **extra: Any) -> None:
        log.info("event %s %s", name, extra or "")
        self.emit({"t_ms": now_ms(), "kind": "event", "event": name, **extra})

    # -------------------------------------------------------- point access
    @property
    def coil0(self) -> int:
        return self.tables["coil"].get(0)

    @property
    def hr10(self) -> int:
        return self.tables["holding"].get(10)

    # ------------------------------------------------------ request handler
    def dispatch(self, pdu: ModbusPDU, addr: Any, handler: ServerRequestHandler) -> None:
        """Start handling one decoded request (called synchronously on receipt)."""
        arrived = now_ms()
        task = asyncio.get_running_loop().create_task(
            self.handle(pdu, addr, handler, arrived)
        )
        self.request_tasks.add(task)
        task.add_done_callback(self.request_tasks.discard)

    @staticmethod
    def write_record(pdu: ModbusPDU, arrived: float) -> dict[str, Any] | None:
        fc = pdu.function_code
        if fc not in WRITE_FC:
            return None
        if fc in (5, 15):
            address, values = pdu.address, [bool(b) for b in pdu.bits]
        elif fc in (6, 16):
            address, values = pdu.address, [int(r) for r in pdu.registers]
        elif fc == 22:
            address, values = pdu.address, [pdu.and_mask, pdu.or_mask]
        else:  # 23
            address, values = pdu.write_address, [int(r) for r in pdu.write_registers]
        return {
            "t_ms": arrived,
            "kind": "write",
            "fc": fc,
            "table": WRITE_FC[fc],
            "address": address,
            "values": values,
            "unit": pdu.dev_id,
        }

    @staticmethod
    def bit_range_ok(pdu: ModbusPDU) -> bool:
        """Bit tables: pymodbus rounds them up to 16-bit words; enforce 0..99."""
        fc = pdu.function_code
        if fc in (1, 2):
            count = pdu.count
        elif fc == 5:
            count = 1
        else:
            count = len(pdu.bits)
        return pdu.address + max(count, 1) <= TABLE_SIZE

    async def handle(
        self, pdu: ModbusPDU, addr: Any, handler: ServerRequestHandler, arrived: float
    ) -> None:
        record = self.write_record(pdu, arrived)
        if self.silent:
            if record is not None:
                record["silent"] = True
                self.emit(record)
            log.debug("silent: holding request fc=%s", pdu.function_code)
            await asyncio.Event().wait()  # never answered; cancelled at shutdown
            return
        delay = self.delay_ms
        if record is not None:
            delay += self.write_delay.get((record["table"], record["address"]), 0.0)
        if delay > 0:
            await asyncio.sleep(delay / 1000.0)
        fc = pdu.function_code
        response: ModbusPDU
        if pdu.dev_id != self.unit:
            response = ExceptionResponse(fc, ExcCodes.GATEWAY_NO_RESPONSE)
        elif fc in BIT_FC and not self.bit_range_ok(pdu):
            self.count(fc)
            response = ExceptionResponse(fc, ExcCodes.ILLEGAL_ADDRESS)
        else:
            self.count(fc)
            coil_before, hr10_before = self.coil0, self.hr10
            assert self.server is not None
            try:
                # no await inside can yield: the action hook never awaits
                response = await pdu.datastore_update(self.server.context, pdu.dev_id)
            except Exception:  # pylint: disable=broad-except
                log.exception("datastore failed on fc=%s", fc)
                response = ExceptionResponse(fc, ExcCodes.DEVICE_FAILURE)
            coil_after, hr10_after = self.coil0, self.hr10
            if record is not None:
                self.finish_record(record, response)
                record = None
            if hr10_after != hr10_before:
                self.hr10_changed_at = time.monotonic()
            if coil_after != coil_before:
                if coil_after:
                    self.enabled_at = time.monotonic()
                    self.event("enabled", by="write")
                else:
                    self.event("disabled", by="write")
        if record is not None:
            self.finish_record(record, response)
        if self.silent:  # went silent while this request was delayed
            await asyncio.Event().wait()
            return
        response.transaction_id = pdu.transaction_id
        response.dev_id = pdu.dev_id
        if not handler.transport or handler.transport.is_closing():
            return
        handler.server_send(response, addr)

    def count(self, fc: int) -> None:
        if fc in READ_FC:
            self.reads[READ_FC[fc]] += 1
        if fc in WRITE_FC:
            self.writes += 1

    def finish_record(self, record: dict[str, Any], response: ModbusPDU) -> None:
        if isinstance(response, ExceptionResponse):
            record["exception"] = int(response.exception_code)
        self.emit(record)

    # ---------------------------------------------------------- background
    async def simulate(self) -> None:
        """Temperature lag and watchdog, every 10 ms."""
        last = time.monotonic()
        while True:
            await asyncio.sleep(0.01)
            now = time.monotonic()
            dt, last = now - last, now
            coil = self.tables["coil"]
            enabled = coil.get(0)
            wd = self.args.watchdog_ms
            if enabled and wd > 0:
                since = max(self.hr10_changed_at, self.enabled_at)
                if (now - since) * 1000.0 >= wd:
                    coil.set(0, 0)
                    enabled = 0
                    self.event("watchdog_trip")
                    self.event("disabled", by="watchdog")
            if enabled:
                target = to_signed(self.tables["holding"].get(0)) / 10.0
            else:
                target = self.args.ambient
            tau = self.args.tau_s
            if tau > 0:
                self.temp_c += (target - self.temp_c) * (1.0 - math.exp(-dt / tau))
            else:
                self.temp_c = target
            self.tables["input"].set(0, to_raw(round(self.temp_c * 10)))

    def apply_control(self, cfg: dict[str, Any]) -> None:
        lid = cfg.get("lid", "closed")
        if lid not in ("open", "closed"):
            raise ValueError(f"lid must be 'open' or 'closed', not {lid!r}")
        delay = float(cfg.get("delay_ms", 0) or 0)
        silent = cfg.get("silent", False)
        if not isinstance(silent, bool):
            raise ValueError("silent must be true or false")
        exceptions: dict[tuple[str, int], ExcCodes] = {}
        for key, code in (cfg.get("exception") or {}).items():
            table, _, point = str(key).partition(":")
            if table not in ("holding", "coil") or not point.isdigit():
                raise ValueError(f"exception key {key!r} is not holding:N or coil:N")
            exceptions[(table, int(point))] = ExcCodes(int(code))
        write_delay: dict[tuple[str, int], float] = {}
        for key, ms in (cfg.get("write_delay_ms") or {}).items():
            table, _, point = str(key).partition(":")
            if table not in ("holding", "coil") or not point.isdigit():
                raise ValueError(f"write_delay_ms key {key!r} is not holding:N or coil:N")
            write_delay[(table, int(point))] = max(float(ms), 0.0)
        # all valid: apply
        self.write_delay = write_delay
        closed = lid == "closed"
        if closed != self.lid_closed:
            self.lid_closed = closed
            self.tables["discrete"].set(0, 1 if closed else 0)
            self.event("lid_closed" if closed else "lid_open")
        if silent != self.silent:
            log.info("silent %s", silent)
        self.delay_ms, self.silent, self.exceptions = max(delay, 0.0), silent, exceptions

    async def watch_control(self) -> None:
        path = self.args.control
        while True:
            try:
                with open(path, encoding="utf-8") as fh:
                    text = fh.read()
            except FileNotFoundError:
                text = "{}"
            except OSError as exc:
                text = None
                self.control_problem(f"cannot read {path}: {exc}")
            if text is not None and text != self._control_text:
                try:
                    cfg = json.loads(text)
                    if not isinstance(cfg, dict):
                        raise ValueError("control file must hold a JSON object")
                    self.apply_control(cfg)
                    self._control_text = text
                    self._control_error = None
                except ValueError as exc:  # JSONDecodeError is a ValueError
                    self.control_problem(f"ignoring control file {path}: {exc}")
            await asyncio.sleep(0.05)

    def control_problem(self, msg: str) -> None:
        if msg != self._control_error:
            log.warning("%s", msg)
            self._control_error = msg

    def status(self) -> dict[str, Any]:
        return {
            "reads": dict(self.reads),
            "registers": {
                "holding0": to_signed(self.tables["holding"].get(0)),
                "holding10": self.tables["holding"].get(10),
                "input0": to_signed(self.tables["input"].get(0)),
                "coil0": bool(self.tables["coil"].get(0)),
                "discrete0": bool(self.tables["discrete"].get(0)),
            },
            "writes": self.writes,
            "temperature_c": round(self.temp_c, 4),
            "t_ms": now_ms(),
        }

    def write_status(self) -> None:
        path = self.args.status_file
        tmp = f"{path}.tmp{os.getpid()}"
        with open(tmp, "w", encoding="utf-8") as fh:
            json.dump(self.status(), fh)
        os.replace(tmp, path)

    async def status_loop(self) -> None:
        while True:
            self.write_status()
            await asyncio.sleep(0.1)


class _HeaterRequestHandler(ServerRequestHandler):
    """Per-connection handler that hands every decoded frame to the Heater.

    Replaces ServerRequestHandler.callback_data/handle_request: each request
    keeps its own PDU (transaction id, unit id) even when answers are delayed
    or held, and all complete frames in one TCP segment are handled.
    """

    heater: Heater

    def callback_data(self, data: bytes, addr: tuple | None = None) -> int:
        used = 0
        while used < len(data):
            try:
                n = TransactionManager.callback_data(self, data[used:], addr)
            except ModbusIOException as exc:
                response = ExceptionResponse(
                    0x00 if exc.fcode is None else exc.fcode,
                    exception_code=ExcCodes.ILLEGAL_FUNCTION,
                    device_id=exc.dev_id,
                    transaction=exc.transaction_id,
                )
                if not self.heater.silent:
                    self.server_send(response, addr)
                return len(data)
            if n <= 0:
                break
            used += n
            if self.last_pdu:
                self.heater.dispatch(self.last_pdu, self.last_addr, self)
        return used


class HeaterServer(ModbusTcpServer):
    """ModbusTcpServer using _HeaterRequestHandler for its connections."""

    def __init__(self, heater: Heater, **kwargs: Any) -> None:
        self.heater = heater
        super().__init__(heater.build_device(), **kwargs)

    def callback_new_connection(self):
        handler = _HeaterRequestHandler(
            self, self.trace_packet, self.trace_pdu, self.trace_connect
        )
        handler.heater = self.heater
        return handler


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description="Simulated Modbus TCP heater (see the module docstring)."
    )
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=5020, help="0 picks a free port")
    p.add_argument("--unit", type=int, default=1, help="Modbus unit id (1-247)")
    p.add_argument("--log", help="append JSON-lines write/event log here")
    p.add_argument("--control", help="JSON control file, re-read every 50 ms")
    p.add_argument("--status-file", help="JSON status file, rewritten every 100 ms")
    p.add_argument("--watchdog-ms", type=float, default=1000.0, help="0 disables")
    p.add_argument("--ambient", type=float, default=20.0, help="degC")
    p.add_argument("--tau-s", type=float, default=10.0, help="time constant, s")
    p.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    args = p.parse_args(argv)
    if not 0 <= args.unit <= 255:
        p.error("--unit must be 0..255")
    return args


async def amain(args: argparse.Namespace) -> int:
    heater = Heater(args)
    server = HeaterServer(heater, address=(args.host, args.port))
    heater.server = server
    await heater.capture_tables()

    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)

    try:
        await server.serve_forever(background=True)
    except RuntimeError as exc:  # pymodbus: "Could not start listen, ..."
        log.error("cannot listen on %s:%s: %s", args.host, args.port, exc)
        return 2
    port = server.transport.sockets[0].getsockname()[1]
    heater.event("started", port=port, unit=args.unit)

    tasks = [loop.create_task(heater.simulate())]
    if args.control:
        tasks.append(loop.create_task(heater.watch_control()))
    if args.status_file:
        heater.write_status()
        tasks.append(loop.create_task(heater.status_loop()))

    sys.stdout.write(f"ready {port}\n")
    sys.stdout.flush()
    log.info("heater listening on %s:%s unit %s", args.host, port, args.unit)

    stopper = loop.create_task(stop.wait())
    done, _ = await asyncio.wait([stopper, *tasks], return_when=asyncio.FIRST_COMPLETED)
    failed = [t for t in done if t is not stopper and t.exception()]
    log.info("shutting down")
    await server.shutdown()
    for t in [stopper, *tasks, *heater.request_tasks]:
        t.cancel()
    await asyncio.gather(stopper, *tasks, *heater.request_tasks, return_exceptions=True)
    if args.status_file:
        heater.write_status()
    if heater.log_file:
        heater.log_file.close()
    for t in failed:
        log.error("background task failed", exc_info=t.exception())
    return 1 if failed else 0


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(
        stream=sys.stderr,
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="heater %(levelname)s %(name)s: %(message)s",
    )
    if not args.verbose:
        logging.getLogger("pymodbus").setLevel(logging.WARNING)
    return asyncio.run(amain(args))


if __name__ == "__main__":
    sys.exit(main())
