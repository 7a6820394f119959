"""Probe: the script starts a background `sleep` (its own session) and returns."""
import subprocess

import torch.distributed as dist

dist.init_process_group("gloo")
subprocess.Popen(["sleep", "300"], start_new_session=True)
dist.barrier()
dist.destroy_process_group()
