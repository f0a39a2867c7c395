#!/usr/bin/env python3
"""A simulated dosing pump speaking the protocol of examples/mqtt-pump.

Topics under lab/pump-1/ (change with --prefix):
  cmd    (in)  {"command_id", "op": "dose", "volume_ml", "rate_ml_min", "lease_ms"}
               {"command_id", "op": "stop"}
  ack    (out) {"command_id", "status": "accepted"|"done"|"rejected"|"stopped", "reason"?}
  state  (out, retained) {"running", "dispensed_ml", "door": "closed"|"open"}, every 100 ms
  lease  (in)  {"command_id"}: a running dose stops by itself when none came for lease_ms

Simulator controls (never reachable over MQTT): SIGUSR1 opens the door,
SIGUSR2 closes it. Test options: --log FILE writes every received message as
a JSON line; --ignore-commands logs commands but never acts on or answers
them (a device whose acknowledgement never comes); --time-scale N runs the
dosing clock N times faster.

Needs paho-mqtt 2.x: pip install paho-mqtt
"""

import argparse
import json
import signal
import sys
import threading
import time

import paho.mqtt.client as mqtt

TICK_S = 0.02
STATE_EVERY_S = 0.1


class Pump:
    def __init__(self, args):
        self.args = args
        self.lock = threading.Lock()
        self.door = args.door
        self.door_request = None  # set by SIGUSR1/SIGUSR2, applied by the main loop
        self.running = None  # dict: command_id, volume_ml, rate, lease_s, lease_at
        self.dispensed_ml = 0.0
        self.log = open(args.log, "a", buffering=1) if args.log else None
        self.client = mqtt.Client(
            mqtt.CallbackAPIVersion.VERSION2,
            client_id=args.client_id,
            protocol=mqtt.MQTTv311,
        )
        self.client.on_connect = self.on_connect
        self.client.on_message = self.on_message

    def topic(self, name):
        return self.args.prefix + name

    def publish(self, name, payload, retain=False):
        self.client.publish(self.topic(name), json.dumps(payload), qos=1, retain=retain)

    def ack(self, command_id, status, reason=None):
        body = {"command_id": command_id, "status": status}
        if reason is not None:
            body["reason"] = reason
        self.publish("ack", body)

    def on_connect(self, client, _userdata, _flags, reason_code, _props):
        if reason_code.is_failure:
            return
        client.subscribe([(self.topic("cmd"), 1), (self.topic("lease"), 1)])
        self.publish_state()

    def on_message(self, _client, _userdata, msg):
        try:
            payload = json.loads(msg.payload)
        except ValueError:
            payload = None
        if self.log:
            self.log.write(json.dumps({"t": time.time(), "topic": msg.topic, "payload": payload,
                                       "raw": None if payload is not None else msg.payload.decode("utf-8", "replace")}) + "\n")
        if not isinstance(payload, dict):
            return
        with self.lock:
            if msg.topic == self.topic("lease"):
                if self.running and payload.get("command_id") == self.running["command_id"]:
                    self.running["lease_at"] = time.monotonic()
            elif msg.topic == self.topic("cmd") and not self.args.ignore_commands:
                self.command(payload)

    def command(self, p):
        cid = p.get("command_id")
        if not isinstance(cid, str):
            return
        op = p.get("op")
        if op == "stop":
            if self.running:
                stopped = self.running["command_id"]
                self.running = None
                self.ack(stopped, "stopped", "stop")
                self.publish_state()
            return
        if op != "dose":
            self.ack(cid, "rejected", "unknown_op")
            return
        vol, rate, lease_ms = p.get("volume_ml"), p.get("rate_ml_min"), p.get("lease_ms")
        if not all(isinstance(x, (int, float)) and not isinstance(x, bool) and x > 0 for x in (vol, rate, lease_ms)):
            self.ack(cid, "rejected", "bad_request")
        elif self.door != "closed":
            self.ack(cid, "rejected", "door_open")
        elif self.running:
            self.ack(cid, "rejected", "busy")
        else:
            self.running = {"command_id": cid, "volume_ml": float(vol), "rate": float(rate),
                            "lease_s": lease_ms / 1000.0, "lease_at": time.monotonic()}
            self.dispensed_ml = 0.0
            self.ack(cid, "accepted")
            self.publish_state()

    def publish_state(self):
        self.publish("state", {"running": self.running is not None,
                               "dispensed_ml": round(self.dispensed_ml, 6), "door": self.door}, retain=True)

    def tick(self, dt):
        with self.lock:
            r = self.running
            if not r:
                return
            if time.monotonic() - r["lease_at"] > r["lease_s"]:
                self.running = None
                self.ack(r["command_id"], "stopped", "lease_expired")
                self.publish_state()
                return
            self.dispensed_ml += r["rate"] / 60.0 * dt * self.args.time_scale
            if self.dispensed_ml >= r["volume_ml"]:
                self.dispensed_ml = r["volume_ml"]
                self.running = None
                self.ack(r["command_id"], "done")
                self.publish_state()

    def set_door(self, state):
        with self.lock:
            self.door = state
            self.publish_state()

    def request_door(self, state):
        # Called from a signal handler, which runs on the main thread
        # between two bytecodes, possibly while that thread holds the lock:
        # taking it here could deadlock, so the main loop applies it.
        self.door_request = state

    def run(self):
        self.client.connect(self.args.host, self.args.port, keepalive=5)
        self.client.loop_start()
        last, last_state = time.monotonic(), 0.0
        while True:
            time.sleep(TICK_S)
            door, self.door_request = self.door_request, None
            if door is not None:
                self.set_door(door)
            now = time.monotonic()
            self.tick(now - last)
            last = now
            if now - last_state >= STATE_EVERY_S:
                with self.lock:
                    self.publish_state()
                last_state = now


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=1883)
    ap.add_argument("--prefix", default="lab/pump-1/")
    ap.add_argument("--client-id", default="pump-1")
    ap.add_argument("--door", choices=["closed", "open"], default="closed")
    ap.add_argument("--log", help="append every received message to this file as a JSON line")
    ap.add_argument("--ignore-commands", action="store_true", help="never act on or acknowledge a command")
    ap.add_argument("--time-scale", type=float, default=1.0, help="dosing clock speed-up (tests)")
    args = ap.parse_args()
    pump = Pump(args)
    signal.signal(signal.SIGUSR1, lambda *_: pump.request_door("open"))
    signal.signal(signal.SIGUSR2, lambda *_: pump.request_door("closed"))
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    print(f"pump: broker {args.host}:{args.port}, topics {args.prefix}*", file=sys.stderr, flush=True)
    pump.run()


if __name__ == "__main__":
    main()
