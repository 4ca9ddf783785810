"""A stand-in OpenAI server for the benchmark tests: /health, /v1/models (one model,
"fake-model") and streamed chat completions of max_tokens " tok" chunks, with a final usage
chunk when the second argument is "usage".

    python fake_openai_server.py PORT usage|none
"""

import json
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

USAGE = sys.argv[2] == "usage"


class Handler(BaseHTTPRequestHandler):
    def log_message(self, *args):
        pass

    def _json(self, payload):
        body = json.dumps(payload).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self):
        if self.path == "/health":
            self._json({"status": "ok"})
        elif self.path == "/v1/models":
            self._json({"data": [{"id": "fake-model"}]})
        else:
            self.send_error(404)

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        assert body["model"] == "fake-model" and body["stream"] and body["temperature"] == 0.0
        n = body["max_tokens"]
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.end_headers()
        for _ in range(n):
            chunk = {"choices": [{"index": 0, "delta": {"content": " tok"}, "finish_reason": None}]}
            self.wfile.write(f"data: {json.dumps(chunk)}\n\n".encode())
        done = {"choices": [{"index": 0, "delta": {}, "finish_reason": "length"}]}
        self.wfile.write(f"data: {json.dumps(done)}\n\n".encode())
        if USAGE:
            usage = {"choices": [], "usage": {"prompt_tokens": 7, "completion_tokens": n, "total_tokens": n + 7}}
            self.wfile.write(f"data: {json.dumps(usage)}\n\n".encode())
        self.wfile.write(b"data: [DONE]\n\n")


ThreadingHTTPServer(("127.0.0.1", int(sys.argv[1])), Handler).serve_forever()
