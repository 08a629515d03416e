"""A small OTLP/HTTP receiver for the trace tests: decodes each POST /v1/traces body as
an ExportTraceServiceRequest with the official protobuf definitions (opentelemetry-proto) and
appends every span to OUT as one JSON line:

  {"trace_id", "span_id", "parent_span_id" (hex, "" for a root), "name", "kind" (SERVER,
   CLIENT, ...), "attributes": {key: value}, "events": [name, ...], "status": (UNSET, OK,
   ERROR), "service": service.name}

and the decoded request, whole, in protobuf text form to OUT + ".raw" (what a test greps for
values that must never be exported). Answers 200 with an empty ExportTraceServiceResponse.
A POST /v1/metrics body is decoded as an ExportMetricsServiceRequest: each histogram data point
is a JSON line of OUT + ".metrics",

  {"name", "unit", "count", "sum", "attributes": {key: value}, "service": service.name}

and the request, whole, goes to OUT + ".raw" too.

Usage: otlp_receiver.py OUT     prints "listening PORT" on stdout once it listens on 127.0.0.1
"""

import http.server
import json
import sys
import threading

from google.protobuf import text_format
from opentelemetry.proto.collector.metrics.v1 import metrics_service_pb2
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2
from opentelemetry.proto.trace.v1 import trace_pb2

OUT = sys.argv[1]
LOCK = threading.Lock()


def value(v):
    kind = v.WhichOneof("value")
    if kind == "array_value":
        return [value(x) for x in v.array_value.values]
    if kind is None:
        return None
    return getattr(v, kind)


class Handler(http.server.BaseHTTPRequestHandler):
    def do_POST(self):
        body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
        if self.path.endswith("/v1/metrics"):
            self.metrics(body)
            return
        request = trace_service_pb2.ExportTraceServiceRequest()
        request.ParseFromString(body)
        lines = []
        for rs in request.resource_spans:
            resource = {a.key: value(a.value) for a in rs.resource.attributes}
            for ss in rs.scope_spans:
                for s in ss.spans:
                    lines.append(json.dumps({
                        "trace_id": s.trace_id.hex(),
                        "span_id": s.span_id.hex(),
                        "parent_span_id": s.parent_span_id.hex(),
                        "name": s.name,
                        "kind": trace_pb2.Span.SpanKind.Name(s.kind).replace("SPAN_KIND_", ""),
                        "attributes": {a.key: value(a.value) for a in s.attributes},
                        "events": [e.name for e in s.events],
                        "status": trace_pb2.Status.StatusCode.Name(s.status.code)
                        .replace("STATUS_CODE_", ""),
                        "service": resource.get("service.name"),
                    }))
        with LOCK:
            with open(OUT, "a") as f:
                f.writelines(line + "\n" for line in lines)
            with open(OUT + ".raw", "a") as f:
                f.write(text_format.MessageToString(request))
        self.answer(trace_service_pb2.ExportTraceServiceResponse().SerializeToString())

    def metrics(self, body):
        request = metrics_service_pb2.ExportMetricsServiceRequest()
        request.ParseFromString(body)
        lines = []
        for rm in request.resource_metrics:
            resource = {a.key: value(a.value) for a in rm.resource.attributes}
            for sm in rm.scope_metrics:
                for m in sm.metrics:
                    if m.WhichOneof("data") != "histogram":
                        continue
                    for p in m.histogram.data_points:
                        lines.append(json.dumps({
                            "name": m.name,
                            "unit": m.unit,
                            "count": p.count,
                            "sum": p.sum,
                            "attributes": {a.key: value(a.value) for a in p.attributes},
                            "service": resource.get("service.name"),
                        }))
        with LOCK:
            with open(OUT + ".metrics", "a") as f:
                f.writelines(line + "\n" for line in lines)
            with open(OUT + ".raw", "a") as f:
                f.write(text_format.MessageToString(request))
        self.answer(metrics_service_pb2.ExportMetricsServiceResponse().SerializeToString())

    def answer(self, answer):
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.send_header("Content-Length", str(len(answer)))
        self.end_headers()
        self.wfile.write(answer)

    def log_message(self, *args):
        pass


server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
print("listening", server.server_address[1], flush=True)
server.serve_forever()
