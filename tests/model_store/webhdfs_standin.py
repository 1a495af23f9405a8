"""A WebHDFS-protocol stand-in: serves a local directory over the WebHDFS REST API.

No real HDFS can run on the test machines (it needs a JVM and Hadoop), so the HDFS backend
is tested against this server instead: the same URLs, JSON bodies, RemoteException errors
and the namenode -> datanode 307 redirect on OPEN that a Hadoop 3 namenode gives, for the
read-only operations recserve uses (GETFILESTATUS, LISTSTATUS, OPEN with offset/length).

    python webhdfs_standin.py --root DIR --port PORT      # prints "ready" once listening
"""

from __future__ import annotations

import argparse
import json
import os
import stat
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, quote, unquote, urlsplit

PREFIX = "/webhdfs/v1"
DATANODE_FLAG = "datanode"


def _status(path: str, suffix: str) -> dict[str, object]:
    st = os.stat(path)
    is_dir = stat.S_ISDIR(st.st_mode)
    return {
        "accessTime": int(st.st_atime * 1000), "blockSize": 134217728, "childrenNum": len(os.listdir(path)) if is_dir else 0,
        "fileId": st.st_ino, "group": "supergroup", "length": 0 if is_dir else st.st_size,
        "modificationTime": int(st.st_mtime * 1000), "owner": "recserve", "pathSuffix": suffix,
        "permission": oct(st.st_mode & 0o777)[2:], "replication": 0 if is_dir else 3,
        "storagePolicy": 0, "type": "DIRECTORY" if is_dir else "FILE",
    }


class Handler(BaseHTTPRequestHandler):
    root = "."
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: object) -> None:  # quiet
        pass

    def _json(self, code: int, doc: object) -> None:
        body = json.dumps(doc).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _error(self, code: int, exception: str, message: str) -> None:
        java = {"FileNotFoundException": "java.io.FileNotFoundException"}.get(exception, f"java.lang.{exception}")
        self._json(code, {"RemoteException": {"exception": exception, "javaClassName": java, "message": message}})

    def do_GET(self) -> None:
        url = urlsplit(self.path)
        if not url.path.startswith(PREFIX):
            return self._error(404, "IllegalArgumentException", f"not a WebHDFS path: {url.path}")
        hdfs_path = "/" + unquote(url.path[len(PREFIX):]).lstrip("/")
        params = {k: v[-1] for k, v in parse_qs(url.query).items()}
        local = os.path.join(self.root, hdfs_path.lstrip("/"))
        op = params.get("op", "").upper()
        if not os.path.exists(local):
            return self._error(404, "FileNotFoundException", f"File does not exist: {hdfs_path}")
        if op == "GETFILESTATUS":
            return self._json(200, {"FileStatus": _status(local, "")})
        if op == "LISTSTATUS":
            if os.path.isdir(local):
                entries = [_status(os.path.join(local, n), n) for n in sorted(os.listdir(local))]
            else:
                entries = [_status(local, "")]
            return self._json(200, {"FileStatuses": {"FileStatus": entries}})
        if op == "OPEN":
            if os.path.isdir(local):
                return self._error(404, "FileNotFoundException", f"Path is not a file: {hdfs_path}")
            if DATANODE_FLAG not in params:
                host = self.headers.get("Host", f"127.0.0.1:{self.server.server_address[1]}")
                query = url.query + f"&{DATANODE_FLAG}=true"
                self.send_response(307)
                self.send_header("Location", f"http://{host}{PREFIX}{quote(hdfs_path)}?{query}")
                self.send_header("Content-Length", "0")
                self.end_headers()
                return None
            return self._open(local, int(params.get("offset", 0)), params.get("length"))
        return self._error(400, "IllegalArgumentException", f"Invalid value for webhdfs parameter \"op\": {op}")

    def _open(self, local: str, offset: int, length: str | None) -> None:
        with open(local, "rb") as f:
            f.seek(offset)
            data = f.read() if length is None else f.read(int(length))
        self.send_response(200)
        self.send_header("Content-Type", "application/octet-stream")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", required=True)
    parser.add_argument("--port", type=int, required=True)
    args = parser.parse_args(argv)
    Handler.root = os.path.abspath(args.root)
    server = ThreadingHTTPServer(("127.0.0.1", args.port), Handler)
    server.daemon_threads = True
    print("ready", flush=True)
    server.serve_forever()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
