"""Subscribes to a topic filter and appends every message the broker carries
to a file as a JSON line: {"t", "topic", "payload", "retain"}. Prints
"ready" on stdout once subscribed. Needs paho-mqtt 2.x."""

import json
import sys
import time

import paho.mqtt.client as mqtt

host, port, topic_filter, path = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
out = open(path, "a", buffering=1)


def on_connect(client, _u, _f, reason_code, _p):
    if not reason_code.is_failure:
        client.subscribe(topic_filter, qos=1)


def on_subscribe(_c, _u, _mid, _codes, _p):
    print("ready", flush=True)


def on_message(_c, _u, msg):
    try:
        payload = json.loads(msg.payload)
    except ValueError:
        payload = msg.payload.decode("utf-8", "replace")
    out.write(json.dumps({"t": time.time(), "topic": msg.topic, "payload": payload, "retain": msg.retain}) + "\n")


client = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id="tether-test-spy")
client.on_connect = on_connect
client.on_subscribe = on_subscribe
client.on_message = on_message
client.connect(host, port, keepalive=5)
client.loop_forever()
