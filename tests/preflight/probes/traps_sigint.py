"""Probe: a script that ignores SIGINT and SIGTERM, starts a long `sleep` of its own,
listens on a TCP port, and runs long: what stays behind when its launcher is stopped.
Each rank tells the test it is running (and its port) by connecting to
PROBE_READY_PORT on localhost."""
import os
import signal
import socket
import subprocess
import time

import torch.distributed as dist

signal.signal(signal.SIGINT, lambda *a: print("ignoring SIGINT", flush=True))
signal.signal(signal.SIGTERM, lambda *a: print("ignoring SIGTERM", flush=True))
dist.init_process_group("gloo")
child = subprocess.Popen(["sleep", "300"])
server = socket.socket()
server.bind(("127.0.0.1", 0))
server.listen()
ready = os.environ.get("PROBE_READY_PORT")
if ready:
    with socket.create_connection(("127.0.0.1", int(ready))) as conn:
        conn.sendall(f"ready {server.getsockname()[1]}".encode())
for _ in range(3000):
    time.sleep(0.1)
