"""Probe: every rank ends with os._exit(0) after its work (no destroy, no return)."""
import os

import torch
import torch.distributed as dist

dist.init_process_group("gloo")
t = torch.ones(1)
dist.all_reduce(t)
os._exit(0)
