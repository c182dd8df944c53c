"""A loopback stand-in for the parts of Grafana's HTTP API that `dynamiccl dashboards` uses.

It checks each request against Grafana's documented API (docs/sources/developers/http_api: folder.md,
dashboard.md, annotations.md, auth.md) and answers like Grafana: bearer-token auth (401 "Invalid API key"),
``GET /api/folders/:uid`` (404 when missing), ``POST /api/folders`` ({title, uid?, parentUid?}; 409 on a
duplicate uid), ``POST /api/dashboards/db`` ({dashboard{..., id: null for a new one}, folderUid?, overwrite?,
message?}; 412 on an existing uid without overwrite; 400 for an unknown folder), ``POST /api/annotations``
({text (required), time?, timeEnd?, tags?, dashboardUID?, dashboardId?, panelId?}). A request that breaks
the contract gets 400 and is recorded in ``violations``.
"""
from __future__ import annotations

import http.server
import json
import threading

ANNOTATION_KEYS = {"text": str, "time": int, "timeEnd": (int, type(None)), "tags": list,
                   "dashboardUID": str, "dashboardId": int, "panelId": (int, type(None))}


class FakeGrafana:
    def __init__(self, token: str = "glsa_test"):
        self.token = token
        self.folders: dict[str, dict] = {}
        self.dashboards: dict[str, dict] = {}
        self.annotations: list[dict] = []
        self.requests: list[tuple[str, str, dict | None]] = []
        self.violations: list[str] = []
        self.fail_annotations = 0          # answer the next N annotation POSTs with 500
        fake = self

        class H(http.server.BaseHTTPRequestHandler):
            def log_message(self, *a):
                pass

            def _send(self, code, body):
                data = json.dumps(body).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def _body(self):
                n = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(n) if n else b""
                if self.command == "POST":
                    if not (self.headers.get("Content-Type") or "").startswith("application/json"):
                        raise ValueError("Content-Type must be application/json")
                    return json.loads(raw)
                return None

            def _handle(self):
                try:
                    body = self._body()
                except ValueError as exc:
                    fake.violations.append(f"{self.command} {self.path}: {exc}")
                    return self._send(400, {"message": "bad request data"})
                fake.requests.append((self.command, self.path, body))
                if self.headers.get("Authorization") != f"Bearer {fake.token}":
                    return self._send(401, {"message": "Invalid API key"})
                try:
                    code, out = fake.route(self.command, self.path, body)
                except AssertionError as exc:
                    fake.violations.append(f"{self.command} {self.path}: {exc}")
                    return self._send(400, {"message": str(exc)})
                self._send(code, out)

            do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = _handle

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), H)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self._t = threading.Thread(target=self.server.serve_forever, daemon=True)

    def start(self) -> "FakeGrafana":
        self._t.start()
        return self

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    # -- the documented endpoints ---------------------------------------------------------------------
    def route(self, method: str, path: str, body):
        if method == "GET" and path == "/api/frontend/settings":
            return 200, {"buildInfo": {"version": "12.4.0"}}
        if method == "GET" and path.startswith("/api/folders/"):
            uid = path.rsplit("/", 1)[1]
            if uid in self.folders:
                return 200, self.folders[uid]
            return 404, {"message": "folder not found"}
        if method == "POST" and path == "/api/folders":
            assert isinstance(body, dict) and isinstance(body.get("title"), str) and body["title"], "title required"
            assert set(body) <= {"title", "uid", "parentUid", "description"}, f"unknown keys {sorted(body)}"
            uid = body.get("uid") or f"f{len(self.folders)}"
            if uid in self.folders:
                return 409, {"message": "a folder with the same uid already exists"}
            self.folders[uid] = {"id": len(self.folders) + 1, "uid": uid, "title": body["title"], "version": 1}
            return 200, self.folders[uid]
        if method == "POST" and path == "/api/dashboards/db":
            assert isinstance(body, dict) and isinstance(body.get("dashboard"), dict), "dashboard object required"
            assert set(body) <= {"dashboard", "folderUid", "folderId", "overwrite", "message"}, sorted(body)
            d = body["dashboard"]
            assert isinstance(d.get("title"), str) and d["title"], "dashboard.title required"
            assert d.get("id") is None, "dashboard.id must be null to create/overwrite by uid"
            uid = d.get("uid")
            assert isinstance(uid, str) and 0 < len(uid) <= 40, "dashboard.uid must be 1..40 characters"
            if body.get("folderUid") is not None and body["folderUid"] not in self.folders:
                return 400, {"message": "folder not found"}
            if uid in self.dashboards and not body.get("overwrite"):
                return 412, {"message": "The dashboard has been changed by someone else", "status": "version-mismatch"}
            version = self.dashboards.get(uid, {}).get("version", 0) + 1
            self.dashboards[uid] = {"dashboard": d, "folderUid": body.get("folderUid"), "version": version}
            slug = d["title"].lower().replace(" ", "-").replace("/", "")
            return 200, {"id": len(self.dashboards), "uid": uid, "url": f"/d/{uid}/{slug}", "status": "success",
                         "version": version, "slug": slug}
        if method == "POST" and path == "/api/annotations":
            assert isinstance(body, dict), "JSON object required"
            assert set(body) <= set(ANNOTATION_KEYS), f"unknown keys {sorted(set(body) - set(ANNOTATION_KEYS))}"
            assert isinstance(body.get("text"), str) and body["text"], "text required"
            for k, typ in ANNOTATION_KEYS.items():
                if k in body and body[k] is not None:
                    assert isinstance(body[k], typ), f"{k} has type {type(body[k]).__name__}"
            assert all(isinstance(t, str) for t in body.get("tags") or []), "tags must be strings"
            if body.get("timeEnd") is not None:
                assert body["timeEnd"] >= body.get("time", 0), "timeEnd before time"
            if self.fail_annotations:
                self.fail_annotations -= 1
                return 500, {"message": "Failed to save annotation"}
            self.annotations.append(body)
            return 200, {"message": "Annotation added", "id": len(self.annotations)}
        return 404, {"message": "Not found"}
