"""DDP204 ddp-device-ids: beyond the fixtures."""

from tests.rules.lintsnippet import findings, lines

HEAD = ("import os\nimport torch\nimport torch.distributed as dist\n"
        "from torch.nn.parallel import DistributedDataParallel as DDP\n"
        "local_rank = int(os.environ['LOCAL_RANK'])\ndist.init_process_group('nccl')\n")


def test_message_names_the_model():
    src = HEAD + "model = build().to(local_rank)\nmodel = DDP(model)\n"
    (f,) = findings("DDP204", src)
    assert f.line == 8 and f.severity.name == "WARNING"
    assert "`model` is on a GPU" in f.message and "GPU 0" in f.message
    assert "device_ids=[local_rank]" in f.fix and "set_device" in f.fix


def test_ways_of_putting_the_model_on_a_gpu():
    for build in ("model = build().cuda(local_rank)\nmodel = DDP(model)",
                  "model = build()\nmodel.cuda(local_rank)\nmodel = DDP(model)",
                  "model = DDP(build().to(f'cuda:{local_rank}'))",
                  "def make():\n    net = build()\n    return net.cuda(local_rank)\nmodel = DDP(make())",
                  "model = build().to(local_rank).train()\nmodel = DDP(model, find_unused_parameters=True)"):
        assert len(lines("DDP204", HEAD + build + "\n")) == 1, build


def test_device_ids_in_any_form_silences():
    for wrap in ("DDP(model, device_ids=[local_rank])", "DDP(model, [local_rank])",
                 "DDP(model, device_ids=None)", "DDP(model, **ddp_kwargs)"):
        src = HEAD + f"model = build().cuda(local_rank)\nmodel = {wrap}\n"
        assert lines("DDP204", src) == [], wrap


def test_not_on_a_gpu_or_gpu_selected():
    assert lines("DDP204", HEAD + "model = DDP(build())\n") == []
    assert lines("DDP204", HEAD + "model = build().to(args.device)\nmodel = DDP(model)\n") == []
    src = HEAD + "torch.cuda.set_device(local_rank)\nmodel = DDP(build().cuda(local_rank))\n"
    assert lines("DDP204", src) == []
    src = ("import torch\nimport torch.distributed as dist\nfrom torch.nn.parallel import DistributedDataParallel\n"
           "dist.init_process_group('gloo')\nmodel = DistributedDataParallel(build().cuda())\n")
    assert lines("DDP204", src) == []


def test_bare_cuda_is_left_to_ddp503():
    src = HEAD + "model = DDP(build().cuda())\n"
    assert lines("DDP204", src) == []
    assert lines("DDP503", src) == [6]


def test_apex_ddp_is_not_judged():
    src = HEAD + "from apex.parallel import DistributedDataParallel as ApexDDP\n" \
                 "model = ApexDDP(build().cuda(local_rank))\n"
    assert lines("DDP204", src) == []
