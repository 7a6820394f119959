"""Probe: rank 1 leaves with os._exit(0) while rank 0 goes on to a collective that
now waits for it forever: rank 1 ended, rank 0 is the one waiting."""
import os

import torch
import torch.distributed as dist

dist.init_process_group("gloo")
dist.barrier()
if dist.get_rank() == 1:
    os._exit(0)
t = torch.ones(1)
dist.all_reduce(t)
dist.destroy_process_group()
