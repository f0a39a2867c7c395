"""A small OTLP receiver for the telemetry test (tests/telemetry.rs).

Usage: otlp_receiver.py OUT [--grpc]

Over HTTP (the default) it decodes each `POST /v1/traces` body with the
official protobuf definitions (opentelemetry-proto); with --grpc it serves
the official `TraceService` with grpcio and the generated service code of
the same package. Either way it appends one JSON line per span to OUT: its
ids (hex), parent id, name, kind, attributes and the resource's
service.name, and prints `PORT <n>` once listening on 127.0.0.1. An HTTP
body that does not decode is answered 400 and written as
{"undecodable": true} (grpcio refuses such a call itself).
"""

import json
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from opentelemetry.proto.collector.trace.v1 import trace_service_pb2


def value_of(any_value):
    which = any_value.WhichOneof("value")
    return getattr(any_value, which) if which else None


def span_lines(request):
    lines = []
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
    return lines


def append(path, lines):
    with open(path, "a", encoding="utf-8") as out:
        for line in lines:
            out.write(json.dumps(line) + "\n")


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
            lines = span_lines(request)
            status = 200
            answer = trace_service_pb2.ExportTraceServiceResponse().SerializeToString()
        append(self.out_path, lines)
        self.send_response(status)
        self.send_header("Content-Type", "application/x-protobuf")
        self.send_header("Content-Length", str(len(answer)))
        self.end_headers()
        self.wfile.write(answer)


def serve_grpc(out_path):
    from concurrent import futures

    import grpc
    from opentelemetry.proto.collector.trace.v1 import trace_service_pb2_grpc

    class Service(trace_service_pb2_grpc.TraceServiceServicer):
        def Export(self, request, context):
            append(out_path, span_lines(request))
            return trace_service_pb2.ExportTraceServiceResponse()

    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    trace_service_pb2_grpc.add_TraceServiceServicer_to_server(Service(), server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    print("PORT", port, flush=True)
    server.wait_for_termination()


def main():
    if "--grpc" in sys.argv[2:]:
        serve_grpc(sys.argv[1])
        return
    Receiver.out_path = sys.argv[1]
    server = ThreadingHTTPServer(("127.0.0.1", 0), Receiver)
    print("PORT", server.server_address[1], flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
