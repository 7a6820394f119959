"""DDP405 collective-state-dict-in-rank-branch: beyond the fixtures."""

from tests.rules.lintsnippet import findings, lines

FSDP_HEAD = """\
import torch
import torch.distributed as dist
from torch.distributed.fsdp import FullyShardedDataParallel, ShardingStrategy, StateDictType
dist.init_process_group("nccl")
rank = dist.get_rank()
"""


def test_message_names_the_call_the_guard_and_the_fix():
    src = FSDP_HEAD + """\
model = FullyShardedDataParallel(net).cuda()
if rank == 0:
    torch.save(model.state_dict(), "m.pt")
"""
    (f,) = findings("DDP405", src)
    assert f.line == 8 and f.severity.name == "ERROR"
    assert "`model.state_dict()`" in f.message and "only rank 0" in f.message and "(FSDP)" in f.message
    assert "`if rank == 0:`" in f.message and "hangs" in f.message
    assert "state_dict_type" in f.fix and "torch.save" in f.fix


def test_fsdp_settings_that_do_not_communicate():
    src = FSDP_HEAD + """\
a = FullyShardedDataParallel(net, sharding_strategy=ShardingStrategy.NO_SHARD, use_orig_params=True)
b = FullyShardedDataParallel(net)
if rank == 0:
    sa = a.state_dict()
    with FullyShardedDataParallel.state_dict_type(b, StateDictType.LOCAL_STATE_DICT):
        sb = b.state_dict()
    sc = b.state_dict()
"""
    assert lines("DDP405", src) == [12]


def test_deepspeed_engines_by_how_they_are_made():
    src = """\
import deepspeed
import torch.distributed as dist

class Trainer:
    def __init__(self, args, net):
        self.engine, self.opt, _, _ = deepspeed.initialize(args=args, model=net)

    def save(self, tag):
        if dist.get_rank() == 0:
            self.engine.save_checkpoint("ckpt", tag=tag)

def main(args, net):
    engine = deepspeed.initialize(args=args, model=net)[0]
    other = build_engine(args)
    if dist.get_rank() == 0:
        engine.save_checkpoint("ckpt")
        other.save_checkpoint("ckpt")
"""
    assert lines("DDP405", src) == [10, 16]


def test_dcp_state_dict_needs_fsdp_or_a_full_gather():
    src = """\
import torch.distributed as dist
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
from torch.distributed.fsdp import fully_shard
from torch.nn.parallel import DistributedDataParallel as DDP
dist.init_process_group("nccl")
sharded = fully_shard(build())
ddp = DDP(build())
if dist.get_rank() == 0:
    a = get_model_state_dict(sharded)
    b = get_model_state_dict(sharded, options=StateDictOptions(full_state_dict=True))
    c = get_model_state_dict(ddp, options=StateDictOptions(full_state_dict=True))
    d = get_model_state_dict(unknown_model, options=StateDictOptions(full_state_dict=True))
"""
    assert lines("DDP405", src) == [10]


def test_dcp_save_without_the_group_and_decorated_functions():
    src = """\
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from pytorch_lightning.utilities import rank_zero_only
dist.init_process_group("nccl")

@rank_zero_only
def save(sd):
    dcp.save(sd, checkpoint_id="a")

save(state)
if dist.get_rank() == 0:
    dcp.save(state, checkpoint_id="b", use_collectives=False)
    dcp.save(state, checkpoint_id="c", no_dist=True)
    dcp.save(state, checkpoint_id="d", use_collectives=flag)
"""
    assert lines("DDP405", src) == [8]


def test_a_helper_is_judged_by_the_model_it_is_given():
    src = FSDP_HEAD + """\
from torch.nn.parallel import DistributedDataParallel as DDP

def save_weights(m, path):
    torch.save(m.state_dict(), path)

def main():
    fsdp_model = FullyShardedDataParallel(net)
    ddp_model = DDP(net)
    save_weights(fsdp_model, "every_rank_ok.pt")
    if rank == 0:
        save_weights(ddp_model, "plain.pt")
        save_weights(fsdp_model, "hang.pt")
main()
"""
    (f,) = findings("DDP405", src)
    assert f.line == 17
    assert "`save_weights(...)`" in f.message and "`m.state_dict()`" in f.message
    assert "on every rank" in f.fix


def test_fsdp_values_followed_through_builders_and_attributes():
    src = FSDP_HEAD + """\
def wrap(net, cfg):
    return FullyShardedDataParallel(net, device_id=cfg.device)

class Trainer:
    def __init__(self, net, cfg):
        self.model = wrap(net, cfg)
        self.plain = net

    def checkpoint(self, path):
        if dist.get_rank() == 0:
            torch.save(self.model.state_dict(), path)
            torch.save(self.plain.state_dict(), path + ".plain")
"""
    assert lines("DDP405", src) == [16]


def test_a_deepspeed_engine_returned_by_a_builder():
    src = """\
import deepspeed
import torch.distributed as dist

def build_engine(args, net):
    engine, optimizer, _, scheduler = deepspeed.initialize(args=args, model=net, model_parameters=net.parameters())
    return engine

def main(args, net):
    engine = build_engine(args, net)
    for step in range(args.steps):
        engine.step()
        if dist.get_rank() == 0 and step % 1000 == 0:
            engine.save_checkpoint(args.out)
"""
    assert lines("DDP405", src) == [13]


def test_summon_full_params_under_a_guard():
    src = FSDP_HEAD + """\
model = FullyShardedDataParallel(net)
if rank == 0:
    with FullyShardedDataParallel.summon_full_params(model, writeback=False):
        weights = {k: v.clone() for k, v in model.named_parameters()}
with FullyShardedDataParallel.summon_full_params(model, writeback=False, rank0_only=True, offload_to_cpu=True):
    if rank == 0:
        torch.save({k: v for k, v in model.named_parameters()}, "full.pt")
"""
    assert lines("DDP405", src) == [8]
