"""Probe: a DataLoader whose worker processes block forever on their first sample."""
import threading

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, Dataset


class Stuck(Dataset):
    def __len__(self):
        return 8

    def __getitem__(self, index):
        threading.Event().wait()  # never set
        return torch.zeros(1)


if __name__ == "__main__":
    dist.init_process_group("gloo")
    for batch in DataLoader(Stuck(), batch_size=2, num_workers=2):
        pass
    dist.destroy_process_group()
