"""A small OTLP/HTTP receiver for the telemetry test (tests/telemetry.rs).

Decodes each `POST /v1/traces` body with the official protobuf definitions
(opentelemetry-proto) and appends one JSON line per span to OUT: its ids
(hex), parent id, name, kind, attributes and the resource's service.name.
Prints `PORT <n>` once listening on 127.0.0.1. Anything that does not decode
is answered 400 and written as {"undecodable": true}.
"""

import json
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from opentelemetry.proto.collector.trace.v1 import trace_service_pb2


def value_of(any_value):
    which = any_value.WhichOneof("value")
    return getattr(any_value, which) if which else None


class Receiver(BaseHTTPRequestHandler):
    out_path = None

    def log_message(self, *args):
        pass

    def do_POST(self):
        length = int(self.headers.get("Content-Length", "0"))
        body = self.rfile.read(length)
        request = trace_service_pb2.ExportTraceServiceRequest()
        lines = []
        try:
            if self.path != "/v1/traces":
                raise ValueError("path " + self.path)
            if self.headers.get("Content-Type") != "application/x-protobuf":
                raise ValueError("content type " + str(self.headers.get("Content-Type")))
            request.ParseFromString(body)
        except Exception as e:  # noqa: BLE001 - any defect is the finding
            lines.append({"undecodable": True, "why": str(e)})
            status, answer = 400, b""
        else:
            for rs in request.resource_spans:
                resource = {a.key: value_of(a.value) for a in rs.resource.attributes}
                for ss in rs.scope_spans:
                    for span in ss.spans:
                        lines.append({
                            "service": resource.get("service.name"),
                            "trace_id": span.trace_id.hex(),
                            "span_id": span.span_id.hex(),
                            "parent_span_id": span.parent_span_id.hex(),
                            "name": span.name,
                            "kind": span.kind,
                            "attributes": {a.key: value_of(a.value) for a in span.attributes},
                        })
            status = 200
            answer = trace_service_pb2.ExportTraceServiceResponse().SerializeToString()
        with open(self.out_path, "a", encoding="utf-8") as out:
            for line in lines:
                out.write(json.dumps(line) + "\n")
        self.send_response(status)
        self.send_header("Content-Type", "application/x-protobuf")
        self.send_header("Content-Length", str(len(answer)))
        self.end_headers()
        self.wfile.write(answer)


def main():
    Receiver.out_path = sys.argv[1]
    server = ThreadingHTTPServer(("127.0.0.1", 0), Receiver)
    print("PORT", server.server_address[1], flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
