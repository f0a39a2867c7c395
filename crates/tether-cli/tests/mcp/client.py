"""Drives a real Tether endpoint with the official MCP Python SDK.

Run by `crates/tether-cli/tests/mcp.rs` against the `tether` binary under
test; any failed check exits non-zero with a message on stderr.

    client.py --transport stdio --bin PATH --state-dir DIR --mode legacy|auto SCENARIO
    client.py --transport http --url URL [--token T] --mode legacy|auto SCENARIO
    client.py --transport bridge --bin PATH --url URL [--token T] --mode legacy|auto SCENARIO
        (`tether mcp --endpoint URL`: stdio MCP bridged to a running endpoint)

Scenarios:
    governed   list tools and resources, read, write, an out-of-limit action
               (refused, nothing dispatched), the e-stop, a command refused after it
    motion     a long motion reports progress; cancelling the call stops the arm
    estop_during_motion
               the e-stop is answered while a motion runs, and the motion ends cancelled
    no_token   connecting without a bearer token is refused (HTTP only)
    held_to_console
               a held call (stdio, with --config naming a holding policy and a
               console_url) is answered as held, naming the approval, its reason
               and quorum; a host that supports URL elicitation is sent the
               console's page for that approval (also through the bridge,
               against `tether serve --config` with the same config)
    endpoint_lost
               (bridge, with --kill-pid of the endpoint) the endpoint dies
               mid-session: a tool call and the e-stop answer an error at once
    endpoint_restarted
               (bridge, with --signal PATH) the endpoint restarts mid-session;
               the next call completes in a new MCP session
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import time

import anyio
from mcp import Client, StdioServerParameters
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client

THERMO = "thermostat-1"
ARM = "arm-1"
# Routes a model must never reach (CORE-083/084: reset, permits, approvals).
NEVER_LISTED = re.compile(r"reset|permit|approv|safe_place|grant", re.IGNORECASE)


class CheckFailed(Exception):
    pass


def check(cond: bool, what: str, got: object = None) -> None:
    if not cond:
        raise CheckFailed(f"{what}; got: {got!r}")


def text_of(result) -> str:
    return "\n".join(getattr(c, "text", "") for c in result.content)


def client_for(args: argparse.Namespace, token: str | None, **extra) -> Client:
    if args.transport == "bridge":
        # `tether mcp --endpoint URL`: stdio here, a running endpoint there.
        env = {"TETHER_LOG": "warn"}
        if token:
            env["TETHER_TOKEN"] = token
        params = StdioServerParameters(command=args.bin, args=["mcp", "--endpoint", args.url], env=env)
        return Client(params, mode=args.mode, read_timeout_seconds=30, **extra)
    if args.transport == "stdio":
        params = StdioServerParameters(
            command=args.bin,
            args=["mcp", "--state-dir", args.state_dir],
            env={"TETHER_LOG": "warn"},
        )
        return Client(params, mode=args.mode, read_timeout_seconds=30)
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    http = create_mcp_http_client(headers=headers)
    return Client(streamable_http_client(args.url, http_client=http), mode=args.mode, read_timeout_seconds=30)


async def tools_by_name(client: Client) -> dict:
    listed = await client.list_tools()
    return {t.name: t for t in listed.tools}


async def read_state(client: Client, device: str) -> dict:
    result = await client.call_tool(f"{device}__read", {})
    check(not result.is_error, f"reading {device} succeeds", text_of(result))
    return result.structured_content


async def check_catalogue(client: Client) -> None:
    tools = await tools_by_name(client)
    check("estop" in tools, "the estop tool is listed", sorted(tools))
    for name in tools:
        check(not NEVER_LISTED.search(name), "no reset, permit or approval tool is listed", name)
    read = tools[f"{THERMO}__read"].annotations
    check(read is not None and read.read_only_hint is True, "a read is readOnlyHint", read)
    setpoint = tools[f"{THERMO}__setpoint"]
    check(setpoint.annotations.destructive_hint is True, "an action is destructiveHint", setpoint.annotations)
    check("90" in (setpoint.description or ""), "the description prints the limit", setpoint.description)
    check("degC" in (setpoint.description or ""), "the description prints the unit", setpoint.description)
    check(
        "target_temperature" in json.dumps(setpoint.input_schema),
        "the input schema is the binding's",
        setpoint.input_schema,
    )
    move = tools[f"{ARM}__move_to"]
    check(move.annotations.destructive_hint is True, "a motion is destructiveHint", move.annotations)


async def check_resources(client: Client) -> None:
    listed = await client.list_resources()
    uris = {str(r.uri) for r in listed.resources}
    uri = f"tether://devices/{THERMO}/reference.json"
    check(uri in uris, "the reference file is a resource", sorted(uris))
    got = await client.read_resource(uri)
    reference = json.loads(got.contents[0].text)
    check(isinstance(reference, dict) and reference.get("bindings"), "reference.json has bindings", reference)
    md = await client.read_resource(f"tether://devices/{THERMO}/reference.md")
    check("thermostat-1" in md.contents[0].text, "reference.md names the device", md.contents[0].text[:200])


async def governed(args: argparse.Namespace) -> None:
    async with client_for(args, args.token) as client:
        version = client.protocol_version
        await check_catalogue(client)
        await check_resources(client)

        before = await read_state(client, THERMO)
        check(before["revision"] == 0, "a fresh state starts at revision 0", before)

        wrote = await client.call_tool(f"{THERMO}__configure", {"setpoint": 40})
        check(not wrote.is_error, "the write completes", text_of(wrote))
        check(wrote.structured_content["status"] == "completed", "the write receipt is completed", wrote.structured_content)

        acted = await client.call_tool(f"{THERMO}__setpoint", {"target_temperature": 30})
        check(not acted.is_error, "an in-limit action completes", text_of(acted))
        after_ok = await read_state(client, THERMO)
        check(after_ok["state"]["setpoint"] == 30, "the action changed the setpoint", after_ok)

        refused = await client.call_tool(f"{THERMO}__setpoint", {"target_temperature": 400})
        text = text_of(refused)
        check(refused.is_error is True, "an out-of-limit action is an error result", text)
        for needle in ("MHS.SAFETY.ENVELOPE_VIOLATION", "target_temperature", "400", "90", "degC"):
            check(needle in text, f"the refusal names {needle}", text)
        check(refused.structured_content["status"] == "rejected", "the receipt is rejected", refused.structured_content)
        after_refusal = await read_state(client, THERMO)
        check(
            after_refusal["revision"] == after_ok["revision"],
            "nothing was dispatched: the revision did not advance",
            (after_ok["revision"], after_refusal["revision"]),
        )
        check(after_refusal["state"]["setpoint"] == 30, "the old setpoint stands", after_refusal)

        stopped = await client.call_tool("estop", {"device_id": THERMO, "reason": "mcp e2e"})
        check(not stopped.is_error, "the e-stop completes", text_of(stopped))

        latched = await client.call_tool(f"{THERMO}__setpoint", {"target_temperature": 25})
        text = text_of(latched)
        check(latched.is_error is True, "a command after the e-stop is an error result", text)
        check("MHS.SAFETY.ESTOP_ENGAGED" in text, "the refusal names the latch", text)

        tools = await tools_by_name(client)
        check("estop" in tools, "the estop tool is still listed while latched", sorted(tools))
        again = await client.call_tool("estop", {})
        check(not again.is_error, "the e-stop is served while latched", text_of(again))
    print(f"governed ok ({args.transport}, {args.mode}, protocol {version})")


async def start_long_motion(client: Client, tg, results: dict, progress: list) -> anyio.Event:
    """Starts base 0 -> 3.0 rad at 0.5 rad/s (six seconds of real motion) in `tg`;
    the event fires once the endpoint has reported progress twice, so the
    motion is known to be running (no guess at how long admission takes)."""
    running = anyio.Event()

    async def on_progress(value: float, total: float | None, message: str | None) -> None:
        progress.append(value)
        if len(progress) >= 2:
            running.set()

    async def call() -> None:
        results["move"] = await client.call_tool(
            f"{ARM}__move_to", {"joints": [3.0, 0, 0, 0, 0, 0], "speed": 0.5}, progress_callback=on_progress
        )

    tg.start_soon(call)
    return running


async def wait_arm_still(client: Client) -> dict:
    deadline = time.monotonic() + 5
    state = await read_state(client, ARM)
    while state["state"]["moving"] and time.monotonic() < deadline:
        await anyio.sleep(0.1)
        state = await read_state(client, ARM)
    return state


async def motion(args: argparse.Namespace) -> None:
    results: dict = {}
    progress: list[float] = []
    async with client_for(args, args.token) as client:
        async with anyio.create_task_group() as tg:
            running = await start_long_motion(client, tg, results, progress)
            with anyio.fail_after(20):
                await running.wait()
            # Abandoning the call is the cancellation: the SDK sends
            # notifications/cancelled (stdio, 2025-11-25 HTTP) or aborts the POST (2026-07-28 HTTP).
            tg.cancel_scope.cancel()
        check("move" not in results, "the motion was still running when the call was cancelled", results)
        state = await wait_arm_still(client)
        check(not state["state"]["moving"], "cancelling the call stopped the arm", state)
        base = state["state"]["positions"][0]
        check(0 < base < 2.5, "the arm stopped short of its target", state)
    print(f"motion ok ({args.transport}, {args.mode}): {len(progress)} progress reports, stopped at {base:.2f} rad")


async def estop_during_motion(args: argparse.Namespace) -> None:
    results: dict = {}
    progress: list[float] = []
    async with client_for(args, args.token) as client:
        async with anyio.create_task_group() as tg:
            running = await start_long_motion(client, tg, results, progress)
            with anyio.fail_after(20):
                await running.wait()
            # Served while the motion's call is still open on the same connection.
            stopped = await client.call_tool("estop", {"device_id": ARM, "reason": "mcp e2e: stop the motion"})
        check(not stopped.is_error, "the e-stop completes", text_of(stopped))
        moved = results["move"]
        check(moved.is_error is True, "the interrupted motion is an error result", text_of(moved))
        check(moved.structured_content["status"] == "cancelled", "the motion ended cancelled", moved.structured_content)
        state = await wait_arm_still(client)
        check(not state["state"]["moving"], "the arm is not moving after the e-stop", state)
        check(state["state"]["positions"][0] < 2.5, "the arm stopped short of its target", state)
    print(f"estop_during_motion ok ({args.transport}, {args.mode})")


async def no_token(args: argparse.Namespace) -> None:
    try:
        async with client_for(args, None) as client:
            await client.list_tools()
    except Exception as e:  # the SDK's error type differs by mode; any refusal will do
        print(f"no_token ok ({args.mode}): refused with {type(e).__name__}")
        return
    raise CheckFailed("a client without a bearer token was served")


async def held_to_console(args: argparse.Namespace) -> None:
    asked: list = []
    got = anyio.Event()

    async def on_elicit(context, params):
        asked.append(params)
        got.set()
        from mcp import types
        return types.ElicitResult(action="accept")

    if args.transport == "bridge":
        opened = client_for(args, args.token, elicitation_callback=on_elicit)
    else:
        params = StdioServerParameters(
            command=args.bin,
            args=["mcp", "--config", args.config, "--state-dir", args.state_dir],
            env={"TETHER_LOG": "warn", "TETHER_TOKEN": args.token},
        )
        opened = Client(params, mode=args.mode, read_timeout_seconds=30, elicitation_callback=on_elicit)
    async with opened as client:
        result = await client.call_tool("thermostat-1__setpoint", {"target_temperature": 72.5})
        check(result.is_error, "a hot setpoint is held", text_of(result))
        text = text_of(result)
        approval = result.structured_content["error"]["details"]["approval_id"]
        check(approval in text and "a person must approve" in text, "the text names the approval", text)
        check("setpoints above 60 degC need two operators" in text, "the text names the reason", text)
        check("It needs 2 operators" in text, "the text names the quorum", text)
        with anyio.fail_after(10):
            await got.wait()
        p = asked[0]
        url = getattr(p, "url", None)
        check(getattr(p, "mode", None) == "url" and url is not None, "a URL elicitation", p)
        check(url == f"http://127.0.0.1:7878/console/approvals#{approval}", "the approval's console page", url)
    print(f"held_to_console ok ({args.mode}): {url}")


async def endpoint_lost(args: argparse.Namespace) -> None:
    """Through the bridge: the endpoint is killed mid-session; a tool call and
    the e-stop then answer at once with an error saying so (never a hang)."""
    import os
    import signal

    async with client_for(args, args.token) as client:
        tools = await tools_by_name(client)
        check(f"{THERMO}__setpoint" in tools, "the endpoint's tools are listed through the bridge", sorted(tools))
        os.kill(int(args.kill_pid), signal.SIGKILL)
        with anyio.fail_after(20):
            call = await client.call_tool(f"{THERMO}__setpoint", {"target_temperature": 22})
        text = text_of(call)
        check(call.is_error is True, "a call to a lost endpoint is an error result", text)
        check("did not answer" in text and args.url in text, "the error names the endpoint", text)
        with anyio.fail_after(20):
            stop = await client.call_tool("estop", {})
        text = text_of(stop)
        check(stop.is_error is True, "an undeliverable e-stop is an error result", text)
        check("E-STOP NOT DELIVERED" in text and "hardware e-stop" in text, "it says the stop was not delivered", text)
    print(f"endpoint_lost ok ({args.mode})")


async def endpoint_restarted(args: argparse.Namespace) -> None:
    """Through the bridge (2025-11-25, MCP sessions): the endpoint restarts
    mid-session (the test kills it and starts another on the same address
    when SIGNAL.ready appears, then writes SIGNAL.restarted); the next call
    completes in a new session the bridge made."""
    import os

    async with client_for(args, args.token) as client:
        before = await read_state(client, THERMO)
        open(args.signal + ".ready", "w").close()
        deadline = time.monotonic() + 30
        while not os.path.exists(args.signal + ".restarted"):
            check(time.monotonic() < deadline, "the endpoint was restarted within 30 s")
            await anyio.sleep(0.1)
        acted = await client.call_tool(f"{THERMO}__setpoint", {"target_temperature": 31})
        check(not acted.is_error, "a call after the restart completes", text_of(acted))
        after = await read_state(client, THERMO)
        check(after["state"]["setpoint"] == 31, "the restarted endpoint ran it", (before, after))
    print(f"endpoint_restarted ok ({args.mode})")


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("scenario", choices=["governed", "motion", "estop_during_motion", "no_token", "held_to_console", "endpoint_lost", "endpoint_restarted"])
    parser.add_argument("--transport", choices=["stdio", "http", "bridge"], required=True)
    parser.add_argument("--mode", choices=["legacy", "auto"], required=True)
    parser.add_argument("--bin")
    parser.add_argument("--state-dir")
    parser.add_argument("--url")
    parser.add_argument("--token")
    parser.add_argument("--config")
    parser.add_argument("--kill-pid")
    parser.add_argument("--signal")
    args = parser.parse_args()
    scenario = {
        "governed": governed,
        "motion": motion,
        "estop_during_motion": estop_during_motion,
        "no_token": no_token,
        "held_to_console": held_to_console,
        "endpoint_lost": endpoint_lost,
        "endpoint_restarted": endpoint_restarted,
    }[args.scenario]
    async def bounded() -> None:
        # Every wait is bounded: a hung endpoint fails the test, never stalls it.
        with anyio.fail_after(60):
            await scenario(args)

    try:
        anyio.run(bounded)
    except CheckFailed as e:
        print(f"CHECK FAILED ({args.scenario}, {args.transport}, {args.mode}): {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
