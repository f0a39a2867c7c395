#!/usr/bin/env python3
"""Simulated OPC UA oven (the example device of issue 18).

A single asyncio process that plays a small oven controller on OPC UA
(binary TCP). It is used by Tether's driver tests and can be run by hand to
try the OPC UA driver without hardware. Built on asyncua 2.1.0 (its
``Server``) and the standard library only (the server certificate is made
with asyncua's own ``asyncua.crypto.cert_gen`` helpers, which take
``cryptography`` objects; ``cryptography`` comes with asyncua).

Usage::

    oven.py --host 127.0.0.1 --port 4840 \\
        [--log FILE] [--control FILE] [--status-file FILE] \\
        [--watchdog-ms 2000] [--ambient 20.0] [--tau-s 30] \\
        [--security none|basic256sha256] [--user NAME --password PW] \\
        [--pki DIR] [-v]

The endpoint is ``opc.tcp://HOST:PORT`` with no path (clients may also use a
trailing ``/``; GetEndpoints answers with the host and port the client asked
for, path-less). ``--port 0`` picks a free port. Once the server listens,
exactly one line ``ready <port>`` (the real port) is printed to stdout and
flushed; nothing else ever goes to stdout. Diagnostics go to stderr (asyncua's
own logging only from WARNING up unless ``-v``). SIGTERM or SIGINT stops the
server cleanly (exit status 0). Exit status 2: could not listen or bad
options; 1: a background task failed.

Address space
-------------
Namespace URI ``urn:tether:example:oven`` (registered on the server; its
index is 2 with asyncua 2.1.0, but clients should resolve it by URI). The
object ``Oven`` (node id ``ns=<idx>;s=Oven``) sits under ``Objects``; every
node below has a string node id in that namespace and the browse name after
the dot (``ns=<idx>;s=Oven.Setpoint`` has browse name ``<idx>:Setpoint``):

=================  =======  ========  ==========================================
node id            type     access    meaning
=================  =======  ========  ==========================================
Oven.Setpoint      Double   rw        target temperature, degC. Starts at 20.0.
                                      Non-finite values are refused with
                                      BadOutOfRange.
Oven.Temperature   Double   r         measured temperature, degC. Starts at
                                      ``--ambient``.
Oven.Enabled       Boolean  rw        heating enabled. Starts false.
Oven.DoorClosed    Boolean  r         door closed. Starts true; changed only
                                      through the control file.
Oven.Watchdog      UInt32   rw        watchdog counter (see below). Starts 0.
Oven.Stop()        method   call      no input, no output arguments; clears
                                      Enabled. Call it on the object
                                      ``Oven`` (another object id answers
                                      BadMethodInvalid; input arguments answer
                                      BadTooManyArguments).
=================  =======  ========  ==========================================

Setpoint and Temperature carry an ``EngineeringUnits`` property (UNECE
``CEL``, degree Celsius).

Client writes of the Value attribute:

* the Variant type must be exactly the node's type (a Double, not a Float or
  an Int32, for Setpoint; a UInt32 for Watchdog; a Boolean for Enabled), and a
  scalar; anything else, including a null value, is refused with
  BadTypeMismatch and changes nothing. A non-empty IndexRange is refused with
  BadWriteNotSupported.
* Temperature and DoorClosed are read-only: writes are refused the way asyncua
  refuses them for a node without the CurrentWrite access bit, with
  BadUserAccessDenied.
* Writes of other attributes, and writes of nodes outside the oven, are left
  to asyncua (for a client they end in BadUserAccessDenied or
  BadNodeIdUnknown).

Temperature: follows a first-order lag with time constant ``--tau-s``
(default 30 s) toward Setpoint while Enabled is true and toward
``--ambient`` (default 20.0 degC) otherwise. Recomputed every 100 ms (not
rounded).

Watchdog: while Enabled is true, the oven clears Enabled itself once
``Oven.Watchdog`` has kept the same value for ``--watchdog-ms`` ms (default
2000; 0 disables the watchdog). The time is measured from the later of (a)
the last client write that changed the value of Watchdog and (b) the moment
Enabled went from false to true. Writing the value Watchdog already holds is
not a change. Checked every 10 ms.

Security and users
------------------
``--security none`` (default): one endpoint, SecurityPolicy None, mode None.
Without ``--user`` only anonymous sessions are accepted. With ``--user NAME
--password PW`` only that user name and password are accepted (anonymous is
refused with BadIdentityTokenRejected, a wrong password with
BadUserAccessDenied); the password then travels in plain text, since there is
no encryption.

``--security basic256sha256``: two endpoints, Basic256Sha256 with
SignAndEncrypt and with Sign; ``--user`` and ``--password`` are required and
are the only credentials accepted (anonymous refused). The server certificate
(``DIR/server_cert.der``, DER) and key (``DIR/server_key.pem``, PEM, no
passphrase) are taken from ``--pki DIR`` when both are there, otherwise
generated at start-up (self-signed, RSA 2048, valid one year, application URI
``urn:tether:example:oven:server``, subject alternative names: that URI, the
host name, ``localhost``, 127.0.0.1 and ``--host`` if it is an IP address).
Without ``--pki`` a temporary directory is used and removed at exit. Client
application certificates are accepted without any trust list or validation
(any certificate works, self-signed or expired): this is an example device,
not a hardened server. A SecurityPolicy None channel can still be opened for
discovery (GetEndpoints, FindServers, as OPC UA allows), but CreateSession,
ActivateSession and every session service on it are answered with
BadSecurityPolicyRejected.

Clients never get asyncua's "admin" role (remote admin is switched off), so
the access levels above always apply.

Write log (``--log FILE``)
--------------------------
JSON lines appended to FILE, one line per event, flushed per line. ``t_ms``
is the wall-clock time in milliseconds since the epoch (float).

* every client write of a Value attribute, one line per WriteValue in the
  request, at the moment it is applied (just before the answer)::

    {"t_ms": ..., "kind": "write", "node": "Oven.Setpoint", "value": 21.5,
     "type": "Double", "status": "Good"}

  ``node`` is ``Oven.<name>`` for the oven's nodes, else the node id string
  (``i=2259``, ``ns=3;s=Other``); ``value`` is the written value as JSON (non-finite floats
  as strings, byte strings as hex, other types as their string form; null when
  the DataValue holds no value), ``type`` the Variant type name (null when
  there is no value), ``status`` the name of the status code answered
  (``"Good"``, ``"BadTypeMismatch"``, ``"BadUserAccessDenied"``, ...).
  A write dropped because the oven was silent (never applied or answered)
  is logged when it is dropped (on arrival, or when its delay ends) with
  ``"status": null, "silent": true``.

* every client method call, one line per CallMethodRequest::

    {"t_ms": ..., "kind": "call", "method": "Oven.Stop", "status": "Good"}

  (``method`` as ``node`` above; calls held while silent get ``"status":
  null, "silent": true``).

* device events::

    {"t_ms": ..., "kind": "event", "event": "started", "port": 4840,
     "security": "none"}
    {"t_ms": ..., "kind": "event", "event": "enabled", "by": "write"}
    {"t_ms": ..., "kind": "event", "event": "disabled",
     "by": "write"|"stop"|"watchdog"}
    {"t_ms": ..., "kind": "event", "event": "watchdog_trip"}
    {"t_ms": ..., "kind": "event", "event": "door_open"}
    {"t_ms": ..., "kind": "event", "event": "door_closed"}

  ``enabled``/``disabled`` are logged whenever Enabled changes value (a
  Stop() while already disabled logs no event). A watchdog trip logs
  ``watchdog_trip`` followed by ``disabled`` (by ``watchdog``). A write's or
  call's own line comes before the events it caused. The oven's own updates
  (Temperature, Enabled cleared by the watchdog or Stop()) are not logged as
  writes.

Status file (``--status-file FILE``)
------------------------------------
Rewritten atomically (write to a temporary file, then rename) every 100 ms
and at shutdown, so a test can look at the device without speaking OPC UA::

    {"values": {"Setpoint": 21.5, "Temperature": 20.3, "Enabled": false,
                "DoorClosed": true, "Watchdog": 7},
     "writes": n, "calls": n, "reads": n, "sessions": n, "t_ms": ...}

``writes`` counts client WriteValues of a Value attribute that were processed
(answered, with any status; the same writes the log shows without
``silent``), ``calls`` client CallMethodRequests processed, ``reads`` client
Read requests (requests, not ReadValueIds) processed, including the ones
client libraries send for their own keep-alive. ``sessions`` is the number of
currently activated client sessions. ``Temperature`` is rounded to 4
decimals.

Control file (``--control FILE``)
---------------------------------
JSON, re-read every 50 ms; a missing file means all defaults; a file that
cannot be parsed or holds an invalid setting is ignored as a whole (the
previous settings stay, a warning goes to stderr)::

    {"door": "closed", "delay_ms": 0,
     "write_delay_ms": {"Oven.Setpoint": 500},
     "write_status": {"Oven.Setpoint": "BadDeviceFailure"},
     "call_status": {"Oven.Stop": "BadDeviceFailure"},
     "silent": false}

Node and method keys are named as in the log (``Oven.Setpoint``,
``Oven.Stop``); status codes by their OPC UA name (any name asyncua knows).

* ``door``: ``"open"`` clears DoorClosed, ``"closed"`` sets it (logs
  ``door_open``/``door_closed`` when it changes). There is no interlock: the
  door does not affect heating.
* ``delay_ms``: every answer to a service request (Read, Write, Call,
  Browse, CreateSession, ..., everything but Publish, which is parked until
  there is something to publish anyway) is delayed by this many ms (a slow
  device). The request is applied when the delay has passed, just before
  answering. Only the delayed request waits: other requests, on the same or
  on other connections, are served meanwhile (session set-up requests of one
  connection are handled in order).
* ``write_delay_ms``: a Write request containing a WriteValue for that node
  is answered, and applied, that many ms late (the largest of its nodes' delays,
  on top of ``delay_ms``). Nothing else is slowed: not other requests of the
  same client, not other sessions or connections (e.g. a Stop() from another
  client is answered at once while the write waits).
* ``write_status``: a client write of that node's Value is answered with that
  status code and changes nothing. It wins over every other check (access,
  type). Still logged (with that status) and counted.
* ``call_status``: a call of that method is answered with that status code
  (as the CallMethodResult's status) and does nothing. Logged and counted.
* ``silent``: while true the oven answers nothing: service requests arriving
  then are neither applied nor answered, ever (the connection stays open, so
  the client's request timeout fires). Requests arriving after silent is
  switched off are served normally. A request that was being delayed when
  silent was switched on is dropped as well. The secure-channel layer (Hello,
  OpenSecureChannel, CloseSecureChannel) is not silenced.

asyncua notes
-------------
asyncua 2.1.0 handles each connection with an ``OPCUAProtocol`` that feeds
messages one by one to a ``UaProcessor``; the processor awaits each service
before taking the next message. A delayed request would therefore hold up its
whole connection, and there is no per-request hook for delays or silence.
This module hooks three places (installed by ``install_hooks``):

1. ``asyncua.server.binary_server_asyncio.UaProcessor`` is replaced (module
   attribute, before the server starts) by ``OvenProcessor``, a subclass
   whose ``process_message`` (called after the secure channel has decoded and
   checked the message, in order) runs every session service request as its
   own asyncio task: it waits for ``delay_ms``/``write_delay_ms`` with
   ``asyncio.sleep`` (or forever while silent), then hands the request to
   asyncua's own ``UaProcessor.process_message``, which applies and answers
   it. Session set-up and discovery requests (CreateSession, ActivateSession,
   CloseSession, GetEndpoints, FindServers, RegisterServer*) stay in order on
   the connection. It also refuses sessions on a None channel in
   basic256sha256 mode, counts Read requests, drops answers for closed
   connections and cancels held requests when the connection goes.
2. ``iserver.attribute_service`` is replaced by ``OvenAttributeService``,
   whose ``write`` (called by ``InternalSession.write`` for client writes)
   implements the oven's writes itself: forced status, the type check,
   applying the value to the oven model and the address space, logging and
   events, with no ``await`` between check and apply. asyncua 2.1.0 does
   check the Variant type against the stored value (BadTypeMismatch), but the
   oven does not rely on it. Writes by the server's internal (admin) session
   go straight to asyncua; the oven's own updates bypass the attribute
   service altogether (``Server.write_attribute_value``).
3. ``iserver.method_service`` is replaced by ``OvenMethodService``, whose
   ``call`` applies ``call_status``, runs Stop() itself (so the call's log
   line precedes the ``disabled`` event) and logs every call; other methods
   go to asyncua's ``MethodService``.

The endpoint descriptions are built by asyncua before it binds the socket,
so with ``--port 0`` their URLs are fixed up after start with the real port
(``iserver.endpoints``). GetEndpoints and CreateSession then answer with the
host and port of the URL the client asked for (asyncua's default
``match_discovery_endpoint_url``), without a path.

Other asyncua behaviour worth knowing: a SecurityPolicy None channel can
always be opened, even when None is not among the endpoints (hence the
refusal in 1.); at shutdown asyncua waits up to a second for its
ServerStatus clock task, so the oven cancels that task (``iserver.time_task``)
first; building the standard address space makes start-up take 1-3 s.
asyncua's Python client probes the server every second with a 1 s timeout by
default (``watchdog_intervall``), so ``silent`` or ``delay_ms`` >= 1000 make
such clients reconnect unless they raise that interval.
"""

from __future__ import annotations

import argparse
import asyncio
import hmac
import ipaddress
import json
import logging
import math
import os
import shutil
import signal
import socket
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Awaitable, Callable
from urllib.parse import urlparse

import asyncua.server.binary_server_asyncio as binary_server_asyncio
from asyncua import Server, ua
from asyncua.crypto import cert_gen
from asyncua.crypto.permission_rules import User, UserRole
from asyncua.server.address_space import AttributeService, MethodService
from asyncua.server.uaprocessor import UaProcessor
from asyncua.server.user_managers import UserManager
from asyncua.ua.ua_binary import nodeid_from_binary, struct_from_binary
from cryptography import x509
from cryptography.hazmat.primitives.serialization import Encoding
from cryptography.x509.oid import ExtendedKeyUsageOID

log = logging.getLogger("oven")

NAMESPACE_URI = "urn:tether:example:oven"
APPLICATION_URI = "urn:tether:example:oven:server"
CERT_FILE = "server_cert.der"
KEY_FILE = "server_key.pem"

VT = ua.VariantType
# name -> (variant type, writable by clients)
VARIABLES: dict[str, tuple[ua.VariantType, bool]] = {
    "Setpoint": (VT.Double, True),
    "Temperature": (VT.Double, False),
    "Enabled": (VT.Boolean, True),
    "DoorClosed": (VT.Boolean, False),
    "Watchdog": (VT.UInt32, True),
}

# UNECE code "CEL" as OPC UA EUInformation UnitId
CELSIUS = ua.EUInformation(
    NamespaceUri="http://www.opcfoundation.org/UA/units/un/cefact",
    UnitId=4408652,
    DisplayName=ua.LocalizedText("°C"),
    Description=ua.LocalizedText("degree Celsius"),
)


def _req(name: str) -> ua.NodeId:
    return ua.NodeId(getattr(ua.ObjectIds, f"{name}Request_Encoding_DefaultBinary"))


READ_REQUEST = _req("Read")
WRITE_REQUEST = _req("Write")
CALL_REQUEST = _req("Call")
PUBLISH_REQUEST = _req("Publish")
DISCOVERY_REQUESTS = {_req("GetEndpoints"), _req("FindServers")}
# handled in order on their connection (not as separate tasks)
IN_ORDER_REQUESTS = DISCOVERY_REQUESTS | {
    _req(n)
    for n in (
        "CreateSession", "ActivateSession", "CloseSession", "RegisterServer",
        "RegisterServer2", "CloseSecureChannel",
    )
}


def now_ms() -> float:
    """Wall clock, ms since the epoch."""
    return time.time() * 1000.0


def code_status(code: int) -> ua.StatusCode:
    return ua.StatusCode(code)


def status_from_name(name: Any) -> ua.StatusCode:
    code = getattr(ua.StatusCodes, name, None) if isinstance(name, str) else None
    if not isinstance(code, int):
        raise ValueError(f"unknown status code name {name!r}")
    return ua.StatusCode(code)


def jsonable(value: Any) -> Any:
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else str(value)
    if isinstance(value, (list, tuple)):
        return [jsonable(v) for v in value]
    if isinstance(value, (bytes, bytearray)):
        return bytes(value).hex()
    return str(value)


class Oven:
    """Device model, logging, control and status handling."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.values: dict[str, Any] = {
            "Setpoint": 20.0,
            "Temperature": float(args.ambient),
            "Enabled": False,
            "DoorClosed": True,
            "Watchdog": 0,
        }
        self.watchdog_changed_at = time.monotonic()
        self.enabled_at = time.monotonic()
        self.writes = 0
        self.calls = 0
        self.reads = 0
        # control settings
        self.delay_ms = 0.0
        self.write_delay: dict[str, float] = {}
        self.write_status: dict[str, ua.StatusCode] = {}
        self.call_status: dict[str, ua.StatusCode] = {}
        self.silent = False
        self._control_error: str | None = None
        self._control_text: str | None = None
        self.log_file = open(args.log, "a", encoding="utf-8") if args.log else None  # noqa: SIM115
        self.server: Server | None = None
        self.ns = 0
        self.oven_id = ua.NodeId()
        self.stop_id = ua.NodeId()
        self.ids: dict[str, ua.NodeId] = {}  # "Setpoint" -> node id
        self.names: dict[ua.NodeId, str] = {}  # node id -> "Oven.Setpoint"
        self.secure_only = args.security == "basic256sha256"

    # -------------------------------------------------------- address space
    async def build(self, server: Server) -> None:
        self.server = server
        self.ns = ns = await server.register_namespace(NAMESPACE_URI)
        self.oven_id = ua.NodeId("Oven", ns)
        oven = await server.nodes.objects.add_object(self.oven_id, ua.QualifiedName("Oven", ns))
        for name, (vtype, writable) in VARIABLES.items():
            nodeid = ua.NodeId(f"Oven.{name}", ns)
            var = await oven.add_variable(
                nodeid, ua.QualifiedName(name, ns), ua.Variant(self.values[name], vtype)
            )
            if writable:
                await var.set_writable()
            if vtype == VT.Double:
                await var.add_property(
                    ua.NodeId(f"Oven.{name}.EngineeringUnits", ns),
                    ua.QualifiedName("EngineeringUnits", 0),
                    CELSIUS,
                )
            self.ids[name] = nodeid
            self.names[nodeid] = f"Oven.{name}"
        self.stop_id = ua.NodeId("Oven.Stop", ns)
        await oven.add_method(self.stop_id, ua.QualifiedName("Stop", ns), self._stop_method, [], [])
        self.names[self.stop_id] = "Oven.Stop"

    async def _stop_method(self, parent: ua.NodeId) -> None:
        """asyncua method callback; client calls never get here (OvenMethodService)."""
        del parent
        await self.stop_oven("stop")

    def label(self, nodeid: ua.NodeId) -> str:
        return self.names.get(nodeid) or nodeid.to_string()

    async def mirror(self, name: str) -> None:
        """Copy the model value of one variable into the address space.

        asyncua assigns the value before its first await (subscriptions are
        notified after), so reads see the new value as soon as this starts.
        """
        assert self.server is not None
        now = datetime.now(timezone.utc)
        dv = ua.DataValue(
            ua.Variant(self.values[name], VARIABLES[name][0]),
            SourceTimestamp=now,
            ServerTimestamp=now,
        )
        await self.server.write_attribute_value(self.ids[name], dv)

    # ------------------------------------------------------------- logging
    def emit(self, record: dict[str, Any]) -> None:
        if self.log_file is None:
            return
        self.log_file.write(json.dumps(record, separators=(",", ":")) + "\n")
        self.log_file.flush()

    def event(self, name: str, **extra: Any) -> None:
        log.info("event %s %s", name, extra or "")
        self.emit({"t_ms": now_ms(), "kind": "event", "event": name, **extra})

    def write_record(self, wv: ua.WriteValue, st: ua.StatusCode | None) -> dict[str, Any]:
        variant = wv.Value.Value if wv.Value is not None else None
        record = {
            "t_ms": now_ms(),
            "kind": "write",
            "node": self.label(wv.NodeId),
            "value": jsonable(variant.Value) if variant is not None else None,
            "type": variant.VariantType.name if variant is not None else None,
            "status": st.name if st is not None else None,
        }
        if st is None:
            record["silent"] = True
        return record

    def call_record(self, method: ua.CallMethodRequest, st: ua.StatusCode | None) -> dict[str, Any]:
        record = {
            "t_ms": now_ms(),
            "kind": "call",
            "method": self.label(method.MethodId),
            "status": st.name if st is not None else None,
        }
        if st is None:
            record["silent"] = True
        return record

    def log_silent(self, typeid: ua.NodeId, params: Any) -> None:
        """Log the writes/calls of a request that is dropped because of silent."""
        if typeid == WRITE_REQUEST and params is not None:
            for wv in params.NodesToWrite:
                if wv.AttributeId == ua.AttributeIds.Value:
                    self.emit(self.write_record(wv, None))
        elif typeid == CALL_REQUEST and params is not None:
            for m in params.MethodsToCall:
                self.emit(self.call_record(m, None))

    # -------------------------------------------------------- client writes
    def check_write(self, name: str, wv: ua.WriteValue) -> ua.StatusCode:
        vtype, _ = VARIABLES[name]
        variant = wv.Value.Value if wv.Value is not None else None
        if wv.IndexRange:
            return code_status(ua.StatusCodes.BadWriteNotSupported)
        if (
            variant is None
            or variant.VariantType != vtype
            or variant.Value is None
            or isinstance(variant.Value, (list, tuple))
            or variant.Dimensions
        ):
            return code_status(ua.StatusCodes.BadTypeMismatch)
        if vtype == VT.Double and not math.isfinite(variant.Value):
            return code_status(ua.StatusCodes.BadOutOfRange)
        return code_status(ua.StatusCodes.Good)

    def apply(self, name: str, value: Any, by: str) -> None:
        """Change one model value (synchronously) and log the events it causes."""
        old = self.values[name]
        self.values[name] = value
        if value == old:
            return
        if name == "Watchdog":
            self.watchdog_changed_at = time.monotonic()
        elif name == "Enabled":
            if value:
                self.enabled_at = time.monotonic()
                self.event("enabled", by=by)
            else:
                self.event("disabled", by=by)
        elif name == "DoorClosed":
            self.event("door_closed" if value else "door_open")

    async def client_write(
        self,
        wv: ua.WriteValue,
        fallback: Callable[[ua.WriteValue], Awaitable[ua.StatusCode]],
    ) -> ua.StatusCode:
        if wv.AttributeId != ua.AttributeIds.Value:
            return await fallback(wv)  # not an oven write: asyncua decides, not logged
        label = self.label(wv.NodeId)
        name = label[5:] if wv.NodeId in self.names and label.startswith("Oven.") else None
        self.writes += 1
        forced = self.write_status.get(label)
        if forced is not None:
            self.emit(self.write_record(wv, forced))
            return forced
        if name in VARIABLES and VARIABLES[name][1]:
            st = self.check_write(name, wv)
            self.emit(self.write_record(wv, st))
            if st.is_good():
                # no await between the checks above and this point
                self.apply(name, wv.Value.Value.Value, "write")
                await self.mirror(name)
            return st
        st = await fallback(wv)  # read-only oven nodes, foreign nodes
        self.emit(self.write_record(wv, st))
        return st

    # --------------------------------------------------------- client calls
    async def client_call(
        self,
        method: ua.CallMethodRequest,
        fallback: Callable[[ua.CallMethodRequest], Awaitable[ua.CallMethodResult]],
    ) -> ua.CallMethodResult:
        self.calls += 1
        label = self.label(method.MethodId)
        forced = self.call_status.get(label)
        if forced is not None:
            self.emit(self.call_record(method, forced))
            return ua.CallMethodResult(StatusCode=forced)
        if method.MethodId == self.stop_id:
            if method.ObjectId != self.oven_id:
                st = code_status(ua.StatusCodes.BadMethodInvalid)
            elif method.InputArguments:
                st = code_status(ua.StatusCodes.BadTooManyArguments)
            else:
                st = code_status(ua.StatusCodes.Good)
            self.emit(self.call_record(method, st))
            if st.is_good():
                await self.stop_oven("stop")
            return ua.CallMethodResult(StatusCode=st)
        result = await fallback(method)
        self.emit(self.call_record(method, result.StatusCode))
        return result

    async def stop_oven(self, by: str) -> None:
        if self.values["Enabled"]:
            self.apply("Enabled", False, by)
            await self.mirror("Enabled")

    # ---------------------------------------------------------- background
    async def simulate(self) -> None:
        """Temperature lag, every 100 ms."""
        last = time.monotonic()
        while True:
            await asyncio.sleep(0.1)
            now = time.monotonic()
            dt, last = now - last, now
            target = self.values["Setpoint"] if self.values["Enabled"] else self.args.ambient
            temp = self.values["Temperature"]
            tau = self.args.tau_s
            if tau > 0:
                temp += (target - temp) * (1.0 - math.exp(-dt / tau))
            else:
                temp = float(target)
            self.values["Temperature"] = float(temp)
            await self.mirror("Temperature")

    async def watchdog(self) -> None:
        """Clear Enabled when Watchdog stops changing, checked every 10 ms."""
        wd = self.args.watchdog_ms
        while True:
            await asyncio.sleep(0.01)
            if wd <= 0 or not self.values["Enabled"]:
                continue
            since = max(self.watchdog_changed_at, self.enabled_at)
            if (time.monotonic() - since) * 1000.0 >= wd:
                self.event("watchdog_trip")
                await self.stop_oven("watchdog")

    def write_delay_for(self, params: Any) -> float:
        if params is None or not self.write_delay:
            return 0.0
        delays = [self.write_delay.get(self.label(wv.NodeId), 0.0) for wv in params.NodesToWrite]
        return max(delays, default=0.0)

    async def apply_control(self, cfg: dict[str, Any]) -> None:
        door = cfg.get("door", "closed")
        if door not in ("open", "closed"):
            raise ValueError(f"door must be 'open' or 'closed', not {door!r}")
        delay = cfg.get("delay_ms", 0) or 0
        if isinstance(delay, bool) or not isinstance(delay, (int, float)):
            raise ValueError("delay_ms must be a number")
        silent = cfg.get("silent", False)
        if not isinstance(silent, bool):
            raise ValueError("silent must be true or false")

        def mapping(key: str) -> dict[str, Any]:
            value = cfg.get(key) or {}
            if not isinstance(value, dict):
                raise ValueError(f"{key} must be an object")
            return value

        write_delay: dict[str, float] = {}
        for node, ms in mapping("write_delay_ms").items():
            if isinstance(ms, bool) or not isinstance(ms, (int, float)):
                raise ValueError(f"write_delay_ms[{node!r}] must be a number")
            write_delay[str(node)] = max(float(ms), 0.0)
        write_status = {str(k): status_from_name(v) for k, v in mapping("write_status").items()}
        call_status = {str(k): status_from_name(v) for k, v in mapping("call_status").items()}
        # all valid: apply
        self.delay_ms = max(float(delay), 0.0)
        self.write_delay = write_delay
        self.write_status = write_status
        self.call_status = call_status
        if silent != self.silent:
            log.info("silent %s", silent)
        self.silent = silent
        closed = door == "closed"
        if closed != self.values["DoorClosed"]:
            self.apply("DoorClosed", closed, "control")
            await self.mirror("DoorClosed")

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
                    await self.apply_control(cfg)
                    self._control_text = text
                    self._control_error = None
                except ValueError as exc:  # JSONDecodeError is a ValueError
                    self.control_problem(f"ignoring control file {path}: {exc}")
            await asyncio.sleep(0.05)

    def control_problem(self, msg: str) -> None:
        if msg != self._control_error:
            log.warning("%s", msg)
            self._control_error = msg

    def sessions(self) -> int:
        assert self.server is not None
        registry = getattr(self.server.iserver, "_external_sessions", {})
        return sum(1 for s in list(registry.values()) if s.is_activated())

    def status(self) -> dict[str, Any]:
        values = dict(self.values)
        values["Temperature"] = round(values["Temperature"], 4)
        return {
            "values": values,
            "writes": self.writes,
            "calls": self.calls,
            "reads": self.reads,
            "sessions": self.sessions(),
            "t_ms": now_ms(),
        }

    def write_status_file(self) -> None:
        path = self.args.status_file
        tmp = f"{path}.tmp{os.getpid()}"
        with open(tmp, "w", encoding="utf-8") as fh:
            json.dump(self.status(), fh)
        os.replace(tmp, path)

    async def status_loop(self) -> None:
        while True:
            self.write_status_file()
            await asyncio.sleep(0.1)


# ---------------------------------------------------------------- asyncua hooks
class OvenProcessor(UaProcessor):
    """Per-connection processor: runs each service request as its own task.

    See "asyncua notes" in the module docstring.
    """

    oven: Oven  # set by install_hooks

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._tasks: set[asyncio.Task] = set()

    def send_response(self, requesthandle, seqhdr, response, msgtype=ua.MessageType.SecureMessage):
        if self._transport.is_closing():
            return  # connection gone while the request was delayed
        super().send_response(requesthandle, seqhdr, response, msgtype)

    def _fault(self, body: Any, seqhdr: Any, code: int) -> None:
        buf = body.copy()
        nodeid_from_binary(buf)
        requesthdr = struct_from_binary(ua.RequestHeader, buf)
        response = ua.ServiceFault()
        response.ResponseHeader.ServiceResult = code_status(code)
        self.send_response(requesthdr.RequestHandle, seqhdr, response)

    @staticmethod
    def _peek(typeid: ua.NodeId, body: Any) -> Any:
        """Decode the parameters of a Write or Call request without consuming body."""
        if typeid not in (WRITE_REQUEST, CALL_REQUEST):
            return None
        buf = body.copy()
        nodeid_from_binary(buf)
        struct_from_binary(ua.RequestHeader, buf)
        cls = ua.WriteParameters if typeid == WRITE_REQUEST else ua.CallParameters
        return struct_from_binary(cls, buf)

    async def process_message(self, seqhdr, body):
        oven = self.oven
        typeid = nodeid_from_binary(body.copy())
        if (
            oven.secure_only
            and typeid not in DISCOVERY_REQUESTS
            and self._connection.security_policy.Mode == ua.MessageSecurityMode.None_
        ):
            log.warning("refusing %s on a SecurityPolicy None channel", typeid.to_string())
            self._fault(body, seqhdr, ua.StatusCodes.BadSecurityPolicyRejected)
            return True
        if typeid in IN_ORDER_REQUESTS:
            if oven.silent:
                return True  # never answered
            if oven.delay_ms > 0:
                await asyncio.sleep(oven.delay_ms / 1000.0)
                if oven.silent:
                    return True
            return await super().process_message(seqhdr, body)
        task = asyncio.get_running_loop().create_task(self._serve(typeid, seqhdr, body))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return True

    async def _serve(self, typeid: ua.NodeId, seqhdr: Any, body: Any) -> None:
        oven = self.oven
        try:
            params = self._peek(typeid, body)
        except Exception:  # pylint: disable=broad-except
            params = None  # asyncua will answer the decoding error itself
        if not oven.silent:
            delay = 0.0 if typeid == PUBLISH_REQUEST else oven.delay_ms
            if typeid == WRITE_REQUEST:
                delay += oven.write_delay_for(params)
            if delay > 0:
                await asyncio.sleep(delay / 1000.0)
        if oven.silent:
            oven.log_silent(typeid, params)
            log.debug("silent: holding request %s", typeid.to_string())
            await asyncio.Event().wait()  # never answered; cancelled with the connection
            return
        if typeid == READ_REQUEST:
            oven.reads += 1
        try:
            keep = await super().process_message(seqhdr, body)
        except Exception:  # pylint: disable=broad-except
            log.exception("processing request %s failed", typeid.to_string())
            return
        if keep is False and not self._transport.is_closing():
            self._transport.close()

    async def close(self):
        for task in list(self._tasks):
            task.cancel()
        await super().close()


class OvenAttributeService(AttributeService):
    """asyncua attribute service whose client writes go through the Oven."""

    def __init__(self, aspace: Any, oven: Oven) -> None:
        super().__init__(aspace)
        self.oven = oven

    async def write(
        self, params: ua.WriteParameters, user: User = User(role=UserRole.Admin)
    ) -> list[ua.StatusCode]:
        if user.role == UserRole.Admin:  # the server's own internal session
            return await super().write(params, user)

        async def one(wv: ua.WriteValue) -> ua.StatusCode:
            single = ua.WriteParameters(NodesToWrite=[wv])
            return (await AttributeService.write(self, single, user))[0]

        return [await self.oven.client_write(wv, one) for wv in params.NodesToWrite]


class OvenMethodService(MethodService):
    """asyncua method service whose calls go through the Oven."""

    def __init__(self, aspace: Any, oven: Oven) -> None:
        super().__init__(aspace)
        self.oven = oven

    async def call(self, methods: list[ua.CallMethodRequest]) -> list[ua.CallMethodResult]:
        return [await self.oven.client_call(m, self._call) for m in methods]


class OvenUserManager(UserManager):
    """Anonymous only (no --user), or exactly the one configured user."""

    def __init__(self, user: str | None, password: str | None) -> None:
        self.user = user
        self.password = password

    def get_user(self, iserver, username=None, password=None, certificate=None):
        del iserver, certificate
        if self.user is None:
            return User(role=UserRole.User)
        if (
            username is not None
            and password is not None
            and hmac.compare_digest(str(username).encode(), self.user.encode())
            and hmac.compare_digest(str(password).encode(), (self.password or "").encode())
        ):
            return User(role=UserRole.User, name=username)
        log.warning("refused user %r (wrong user name or password)", username)
        return None


def install_hooks(server: Server, oven: Oven) -> None:
    iserver = server.iserver
    iserver.attribute_service = OvenAttributeService(iserver.aspace, oven)
    old = iserver.method_service
    iserver.method_service = OvenMethodService(iserver.aspace, oven)
    old.stop()
    OvenProcessor.oven = oven
    binary_server_asyncio.UaProcessor = OvenProcessor


# ------------------------------------------------------------------ security
def ensure_certificate(pki: Path, host: str) -> tuple[Path, Path]:
    """Server certificate and key in pki (generated unless both exist)."""
    pki.mkdir(parents=True, exist_ok=True)
    cert_path, key_path = pki / CERT_FILE, pki / KEY_FILE
    if cert_path.is_file() and key_path.is_file():
        log.info("using server certificate %s", cert_path)
        return cert_path, key_path
    key = cert_gen.generate_private_key()
    hostname = socket.gethostname()
    names: list[x509.GeneralName] = [
        x509.UniformResourceIdentifier(APPLICATION_URI),
        x509.DNSName(hostname),
    ]
    if hostname != "localhost":
        names.append(x509.DNSName("localhost"))
    ips = {"127.0.0.1"}
    try:
        ips.add(str(ipaddress.ip_address(host)))
    except ValueError:
        if host not in (hostname, "localhost"):
            names.append(x509.DNSName(host))
    names += [x509.IPAddress(ipaddress.ip_address(ip)) for ip in sorted(ips)]
    cert = cert_gen.generate_self_signed_app_certificate(
        key,
        "Tether example oven",
        {"organizationName": "Tether example"},
        names,
        extended=[ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH],
        days=365,
    )
    key_path.write_bytes(cert_gen.dump_private_key_as_pem(key))
    os.chmod(key_path, 0o600)
    cert_path.write_bytes(cert.public_bytes(Encoding.DER))
    log.info("generated server certificate %s", cert_path)
    return cert_path, key_path


def url_host(host: str) -> str:
    return f"[{host}]" if ":" in host else host


async def make_server(args: argparse.Namespace, oven: Oven) -> Server:
    server = Server(user_manager=OvenUserManager(args.user, args.password))
    await server.init()
    server.set_server_name("Tether example oven")
    await server.set_application_uri(APPLICATION_URI)
    server.allow_remote_admin(False)
    server.set_endpoint(f"opc.tcp://{url_host(args.host)}:{args.port}{args.endpoint_path}")
    if args.security == "basic256sha256":
        cert_path, key_path = ensure_certificate(Path(args.pki), args.host)
        await server.load_certificate(str(cert_path))
        await server.load_private_key(str(key_path))
        server.set_security_policy(
            [
                ua.SecurityPolicyType.Basic256Sha256_SignAndEncrypt,
                ua.SecurityPolicyType.Basic256Sha256_Sign,
            ]
        )
    else:
        server.set_security_policy([ua.SecurityPolicyType.NoSecurity])
    if args.user is not None:
        server.set_identity_tokens([ua.UserNameIdentityToken])
    else:
        server.set_identity_tokens([ua.AnonymousIdentityToken])
    await oven.build(server)
    install_hooks(server, oven)
    return server


def bound_port(server: Server) -> int:
    bserver = server.bserver
    assert bserver is not None
    if bserver.port:
        return int(bserver.port)
    sockets = bserver._server.sockets if bserver._server else []  # noqa: SLF001
    return int(sockets[0].getsockname()[1])


def fix_endpoint_urls(server: Server, host: str, port: int, path: str = "") -> str:
    url = f"opc.tcp://{url_host(host)}:{port}{path}"
    server.endpoint = urlparse(url)
    for edp in server.iserver.endpoints:
        edp.EndpointUrl = url
        edp.Server.DiscoveryUrls = [url]
    return url


# ------------------------------------------------------------------ main
def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description="Simulated OPC UA oven (see the module docstring)."
    )
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=4840, help="0 picks a free port")
    p.add_argument("--log", help="append JSON-lines write/event log here")
    p.add_argument("--control", help="JSON control file, re-read every 50 ms")
    p.add_argument("--status-file", help="JSON status file, rewritten every 100 ms")
    p.add_argument("--watchdog-ms", type=float, default=2000.0, help="0 disables")
    p.add_argument("--ambient", type=float, default=20.0, help="degC")
    p.add_argument("--tau-s", type=float, default=30.0, help="time constant, s")
    p.add_argument("--security", choices=("none", "basic256sha256"), default="none")
    p.add_argument("--user", help="required user name (needs --password)")
    p.add_argument("--password", help="password of --user")
    p.add_argument("--pki", help="directory for the server certificate/key "
                   "(basic256sha256; default: a temporary directory)")
    p.add_argument("--endpoint-path", default="",
                   help="a path the server advertises in its endpoint URLs "
                   "(e.g. /freeopcua/server/); default none")
    p.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    args = p.parse_args(argv)
    if args.endpoint_path and not args.endpoint_path.startswith("/"):
        p.error("--endpoint-path starts with /")
    if (args.user is None) != (args.password is None):
        p.error("--user and --password go together")
    if args.security == "basic256sha256" and args.user is None:
        p.error("--security basic256sha256 requires --user and --password")
    if not 0 <= args.port <= 65535:
        p.error("--port must be 0..65535")
    return args


async def amain(args: argparse.Namespace) -> int:
    temp_pki = None
    if args.security == "basic256sha256" and not args.pki:
        temp_pki = args.pki = tempfile.mkdtemp(prefix="oven-pki-")
    oven = Oven(args)
    try:
        return await run(args, oven)
    finally:
        if oven.log_file:
            oven.log_file.close()
        if temp_pki:
            shutil.rmtree(temp_pki, ignore_errors=True)


async def run(args: argparse.Namespace, oven: Oven) -> int:
    server = await make_server(args, oven)
    try:
        await server.start()
    except OSError as exc:
        log.error("cannot listen on %s:%s: %s", args.host, args.port, exc)
        return 2
    port = bound_port(server)
    url = fix_endpoint_urls(server, args.host, port, args.endpoint_path)

    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)

    oven.event("started", port=port, security=args.security)
    tasks = [loop.create_task(oven.simulate()), loop.create_task(oven.watchdog())]
    if args.control:
        tasks.append(loop.create_task(oven.watch_control()))
    if args.status_file:
        oven.write_status_file()
        tasks.append(loop.create_task(oven.status_loop()))

    sys.stdout.write(f"ready {port}\n")
    sys.stdout.flush()
    log.info("oven listening on %s (security %s)", url, args.security)

    stopper = loop.create_task(stop.wait())
    done, _ = await asyncio.wait([stopper, *tasks], return_when=asyncio.FIRST_COMPLETED)
    failed = [t for t in done if t is not stopper and t.exception()]
    log.info("shutting down")
    for t in [stopper, *tasks]:
        t.cancel()
    await asyncio.gather(stopper, *tasks, return_exceptions=True)
    clock = server.iserver.time_task
    if clock is not None:
        # asyncua would wait for up to a second for its clock task to wake up
        clock.cancel()
        await asyncio.gather(clock, return_exceptions=True)
        server.iserver.time_task = None
    try:
        await server.stop()
    except Exception:  # pylint: disable=broad-except
        log.exception("error while stopping the server")
    if args.status_file:
        oven.write_status_file()
    for t in failed:
        log.error("background task failed", exc_info=t.exception())
    return 1 if failed else 0


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(
        stream=sys.stderr,
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="oven %(levelname)s %(name)s: %(message)s",
    )
    if not args.verbose:
        logging.getLogger("asyncua").setLevel(logging.WARNING)
    return asyncio.run(amain(args))


if __name__ == "__main__":
    sys.exit(main())
